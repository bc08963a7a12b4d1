//! The e2b Connect envelope reader (client streams), fed in arbitrary
//! chunks, and the JSON messages inside.
#![no_main]

use airlock_api::e2b::sandbox::connect::{decode, EnvelopeReader, MAX_MESSAGE_BYTES};
use airlock_fuzz::chunks;
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

/// Every envelope the reader gives, fed `pieces` in turn, and whether it
/// refused the rest.
fn read(pieces: &[bytes::Bytes]) -> (Vec<(u8, Vec<u8>)>, bool) {
    let mut reader = EnvelopeReader::default();
    let mut out = Vec::new();
    for piece in pieces {
        reader.feed(piece);
        loop {
            match reader.next_envelope() {
                Ok(Some((flags, payload))) => out.push((flags, payload.to_vec())),
                Ok(None) => break,
                Err(_) => return (out, true),
            }
        }
    }
    (out, false)
}

fuzz_target!(|input: &[u8]| {
    let (cuts, data) = input.split_at(input.len().min(32));
    let mut u = Unstructured::new(cuts);
    let (whole, whole_refused) = read(&[bytes::Bytes::copy_from_slice(data)]);
    let (cut, cut_refused) = read(&chunks(&mut u, data));
    // Where the body is cut changes nothing.
    assert_eq!(whole, cut);
    assert_eq!(whole_refused, cut_refused);
    // The envelopes are the body's first bytes, each bounded.
    let mut rebuilt = Vec::new();
    for (flags, payload) in &whole {
        assert!(payload.len() <= MAX_MESSAGE_BYTES);
        rebuilt.push(*flags);
        rebuilt.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        rebuilt.extend_from_slice(payload);
        if let Ok(value) = decode::<serde_json::Value>(payload) {
            // What was read serializes and reads back (not always to the
            // same value: without serde_json's float_roundtrip a float may
            // move by an ulp, which no message of ours depends on).
            let text = serde_json::to_vec(&value).expect("a value serializes");
            assert!(
                decode::<serde_json::Value>(&text).is_ok(),
                "it does not parse again"
            );
        }
    }
    assert_eq!(&data[..rebuilt.len()], &rebuilt[..]);
});
