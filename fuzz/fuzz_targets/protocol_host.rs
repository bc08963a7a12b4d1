//! The agent protocol as the host reads it from the agent: `Event` frames
//! (the client), and whole frames passed on undecoded (the supervisor's
//! relay), with a round trip through the encoder.
#![no_main]

use airlock_fuzz::ready;
use airlock_protocol::{encode, read_frame, read_frame_bytes, Event, Frame, FrameError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut relayed = data;
    let mut decoded = data;
    for _ in 0..64 {
        let before = relayed;
        let raw = ready(read_frame_bytes(&mut relayed));
        let event = ready(read_frame::<_, Event>(&mut decoded));
        let Ok(raw) = raw else {
            // What the relay refuses, the client refuses too.
            assert!(event.is_err());
            break;
        };
        // The relay passes a frame on exactly as it came.
        assert_eq!(raw, &before[..raw.len()]);
        assert_eq!(
            relayed.len(),
            decoded.len(),
            "the readers took different lengths"
        );
        match event {
            Ok(frame) => {
                let again = ready(read_frame::<_, Event>(&mut &raw[..]))
                    .expect("the relayed frame decodes");
                assert_eq!(again, frame);
                let bytes = encode(&frame).expect("a decoded event encodes");
                let round: Frame<Event> =
                    ready(read_frame(&mut &bytes[..])).expect("and decodes again");
                assert_eq!(round, frame);
            }
            // The client skips a frame it cannot decode and reads on.
            Err(FrameError::Decode(_)) => {}
            Err(e) => panic!("a frame the relay read whole fails otherwise: {e}"),
        }
    }
});
