//! The agent protocol as the agent reads it from the host: frames decoded
//! as session.rs does (a frame of JSON, then a `Request` from it), and
//! straight into `Request`s, both with a round trip through the encoder.
#![no_main]

use airlock_fuzz::ready;
use airlock_protocol::{encode, read_frame, Frame, Request, MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES};
use libfuzzer_sys::fuzz_target;

fn lengths(bytes: &[u8]) -> (usize, usize) {
    let header = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let payload = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    (header, payload)
}

fuzz_target!(|data: &[u8]| {
    let mut unread = data;
    for _ in 0..64 {
        let before = unread;
        let Ok(frame) = ready(read_frame::<_, serde_json::Value>(&mut unread)) else {
            break;
        };
        let (header, payload) = lengths(before);
        assert!(header <= MAX_HEADER_BYTES && payload <= MAX_PAYLOAD_BYTES);
        assert_eq!(before.len() - unread.len(), 8 + header + payload);
        assert_eq!(frame.payload, &before[8 + header..8 + header + payload]);

        let direct = ready(read_frame::<_, Request>(&mut &before[..]));
        let via_value = serde_json::from_value::<Request>(frame.msg.clone());
        match (&direct, &via_value) {
            (Ok(direct), Ok(request)) => assert_eq!(&direct.msg, request),
            // The agent's two-step reading accepts what the direct one
            // does, and nothing it refuses.
            (Ok(_), Err(e)) => panic!("a request read directly fails through a value: {e}"),
            // The other way round happens, and is allowed: a value keeps
            // the last of duplicate keys (`{"op":"hello","op":"ping"}`),
            // which the direct read refuses (found by this target). The
            // host never sends duplicates; the agent's reading of them is
            // lenient, not ambiguous: one value, the last.
            (Err(_), Ok(_)) => {}
            (Err(_), Err(_)) => {}
        }
        if let Ok(request) = via_value {
            let again = Frame::with_payload(frame.id, request, frame.payload);
            let bytes = encode(&again).expect("a decoded request encodes");
            let decoded =
                ready(read_frame::<_, Request>(&mut &bytes[..])).expect("and decodes again");
            assert_eq!(decoded, again);
        }
    }
});
