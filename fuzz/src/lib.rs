//! What the fuzz targets share: a way to run the readers' futures without a
//! runtime, and input generators (kept apart from the targets, as
//! wasmtime's fuzzing crate does).
#![forbid(unsafe_code)]

use bytes::Bytes;
use libfuzzer_sys::arbitrary::Unstructured;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Runs `future` to its end. The readers fuzzed here read slices and
/// iterators, which never wait: a future still pending after many polls
/// waits on input it already has, which is a bug.
pub fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1_000_000 {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
    }
    panic!("a reader of in-memory input is still pending after a million polls");
}

/// `data` cut into chunks of sizes drawn from `u` (1 to 4096 bytes), the
/// way a body arrives from the network.
pub fn chunks(u: &mut Unstructured<'_>, data: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let size = u.int_in_range(1..=4096usize).unwrap_or(rest.len());
        let (chunk, after) = rest.split_at(size.min(rest.len()));
        out.push(Bytes::copy_from_slice(chunk));
        rest = after;
    }
    out
}
