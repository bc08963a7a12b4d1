//! Gzip-encoded e2b uploads, decoded as they stream in: any bytes, cut
//! anywhere, never make one step give more than its bound; what we gzip
//! comes back whole.
#![no_main]

use airlock_api::e2b::sandbox::fuzzing::gunzip;
use airlock_fuzz::{chunks, ready};
use flate2::write::GzEncoder;
use flate2::Compression;
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let (cuts, data) = rest.split_at(rest.len().min(16));
    let mut u = Unstructured::new(cuts);
    if mode & 1 == 0 {
        // Hostile bytes: an error or some output, never a panic.
        let _ = ready(gunzip(chunks(&mut u, data), 1 << 16));
        return;
    }
    // A round trip, in one member or two.
    let level = Compression::new(u32::from(mode >> 4) % 10);
    let mut packed = Vec::new();
    let split = data.len() / 2;
    let members: &[&[u8]] = if mode & 2 == 0 {
        &[data]
    } else {
        &[&data[..split], &data[split..]]
    };
    for member in members {
        let mut encoder = GzEncoder::new(Vec::new(), level);
        encoder.write_all(member).expect("writes to a Vec");
        packed.extend(encoder.finish().expect("finishes into a Vec"));
    }
    let (kept, total) =
        ready(gunzip(chunks(&mut u, &packed), usize::MAX)).expect("what we gzipped decodes");
    assert_eq!(total, data.len() as u64);
    assert_eq!(kept, data);
});
