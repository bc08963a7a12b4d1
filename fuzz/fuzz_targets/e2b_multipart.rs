//! The e2b `/files` multipart reader: hostile bodies cut anywhere stay
//! within the reader's bounds and give no more than they hold; bodies we
//! build from parts come back as those parts, file names included.
#![no_main]

use airlock_api::e2b::sandbox::fuzzing::multipart;
use airlock_fuzz::{chunks, ready};
use libfuzzer_sys::arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;

/// Boundaries as clients make them (Python's httpx and urllib3, undici, curl).
const BOUNDARIES: [&str; 4] = [
    "XyZ",
    "a8f2b0c6e1d94f7b9e3c5d2a1f0e8b7c",
    "----WebKitFormBoundary7MA4YWxkTrZu0gW",
    "------------------------d74496d66958873e",
];

fn quoted(name: &str) -> String {
    name.replace('\\', "\\\\").replace('"', "\\\"")
}

fn body(boundary: &str, parts: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in parts {
        out.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{}\"\r\nContent-Type: application/octet-stream\r\n\r\n", quoted(name)).as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let boundary = BOUNDARIES[usize::from(mode >> 1) % BOUNDARIES.len()];
    let (cuts, data) = rest.split_at(rest.len().min(32));
    let mut u = Unstructured::new(cuts);
    if mode & 1 == 0 {
        // A hostile body: parts hold no more data than the body did.
        if let Ok(parts) = ready(multipart(chunks(&mut u, data), boundary)) {
            let held: usize = parts.iter().map(|(_, data)| data.len()).sum();
            assert!(held <= data.len());
        }
        return;
    }
    // Parts drawn from the data, as a client would send them.
    let mut u = Unstructured::new(data);
    let mut parts = Vec::new();
    let delimiter = format!("\r\n--{boundary}");
    while parts.len() < 8 && !u.is_empty() {
        let (Ok(name), Ok(content)) = (String::arbitrary(&mut u), Vec::<u8>::arbitrary(&mut u))
        else {
            break;
        };
        if name.chars().any(char::is_control) {
            return;
        }
        let mut tail = content.clone();
        tail.extend_from_slice(delimiter.as_bytes());
        if tail
            .windows(delimiter.len())
            .position(|w| w == delimiter.as_bytes())
            != Some(content.len())
        {
            return; // the data holds the delimiter: not something a client sends
        }
        parts.push((name, content));
    }
    let sent = body(boundary, &parts);
    let got = ready(multipart(
        chunks(&mut Unstructured::new(cuts), &sent),
        boundary,
    ))
    .expect("a body built from parts is read");
    let got: Vec<(String, Vec<u8>)> = got
        .into_iter()
        .map(|(name, data)| (name.expect("every part has a filename"), data))
        .collect();
    assert_eq!(got, parts);
});
