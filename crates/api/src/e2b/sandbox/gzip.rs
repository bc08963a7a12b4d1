//! Gzip-encoded upload bodies (`Content-Encoding: gzip`, which the SDKs
//! send with `files.write(..., gzip=True)`), decoded as they stream in.
//!
//! Decoding is bounded per step: compressed input is fed in slices of
//! [`SLICE`] bytes and each slice's output is handed on before the next, so
//! a small body that inflates enormously (a "zip bomb") costs at most
//! about a thousand times [`SLICE`] of memory at once, and the upload limit
//! counts the inflated bytes.

use bytes::Bytes;
use flate2::write::MultiGzDecoder;
use futures_util::{Stream, StreamExt};
use std::io::Write;

/// Compressed bytes decoded per step (deflate inflates at most ~1032:1).
const SLICE: usize = 8 << 10;

struct Gunzip<S> {
    input: S,
    /// `None` once the body ended or failed.
    decoder: Option<MultiGzDecoder<Vec<u8>>>,
    pending: Bytes,
}

/// The decoded bytes of a gzip `input`. A body that is not gzip, is cut
/// short or fails its checksum ends the stream with an error.
pub fn gunzip<S>(input: S) -> impl Stream<Item = Result<Bytes, String>>
where
    S: Stream<Item = Result<Bytes, String>> + Unpin,
{
    let state = Gunzip {
        input,
        decoder: Some(MultiGzDecoder::new(Vec::new())),
        pending: Bytes::new(),
    };
    futures_util::stream::unfold(state, |mut state| async move {
        loop {
            let decoder = state.decoder.as_mut()?;
            if !state.pending.is_empty() {
                let slice = state.pending.split_to(state.pending.len().min(SLICE));
                if let Err(e) = decoder.write_all(&slice) {
                    state.decoder = None;
                    return Some((Err(corrupt(&e)), state));
                }
                let out = std::mem::take(decoder.get_mut());
                if !out.is_empty() {
                    return Some((Ok(Bytes::from(out)), state));
                }
                continue;
            }
            match state.input.next().await {
                Some(Ok(chunk)) => state.pending = chunk,
                Some(Err(e)) => {
                    state.decoder = None;
                    return Some((Err(e), state));
                }
                None => {
                    let mut decoder = state.decoder.take()?;
                    let finished = decoder.try_finish();
                    let out = std::mem::take(decoder.get_mut());
                    return match finished {
                        Err(e) => Some((Err(corrupt(&e)), state)),
                        Ok(()) if !out.is_empty() => Some((Ok(Bytes::from(out)), state)),
                        Ok(()) => None,
                    };
                }
            }
        }
    })
}

/// Decodes `chunks` as an upload body does, for the fuzzer (`fuzz/`,
/// target `e2b_gzip`): the decoded bytes, up to `keep` of them, and the
/// total decoded, or the error. Panics if one step gives more than its
/// bound.
#[cfg(feature = "fuzzing")]
pub async fn fuzz_gunzip(chunks: Vec<Bytes>, keep: usize) -> Result<(Vec<u8>, u64), String> {
    let input = futures_util::stream::iter(chunks.into_iter().map(Ok));
    let mut stream = Box::pin(gunzip(input));
    let mut kept = Vec::new();
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        assert!(
            chunk.len() <= MAX_STEP,
            "a step gave {} bytes, over {MAX_STEP}",
            chunk.len()
        );
        total += chunk.len() as u64;
        let room = keep.saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok((kept, total))
}

/// The most one step of [`gunzip`] gives: what [`SLICE`] inflates to at
/// deflate's largest ratio, and some.
#[cfg(any(test, feature = "fuzzing"))]
const MAX_STEP: usize = 1100 * SLICE;

fn corrupt(e: &std::io::Error) -> String {
    format!("the gzip-encoded body cannot be decoded: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    async fn decode(chunks: Vec<Vec<u8>>) -> Result<Vec<u8>, String> {
        let input = futures_util::stream::iter(chunks.into_iter().map(|c| Ok(Bytes::from(c))));
        let mut out = Vec::new();
        let mut stream = Box::pin(gunzip(input));
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn decodes_in_any_chunking() {
        let data: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let packed = gzip(&data);
        assert_eq!(block_on(decode(vec![packed.clone()])).unwrap(), data);
        let bytewise = packed.chunks(7).map(<[u8]>::to_vec).collect();
        assert_eq!(block_on(decode(bytewise)).unwrap(), data);
        // Concatenated members are one body, as gzip(1) reads them.
        let mut two = gzip(b"one ");
        two.extend(gzip(b"two"));
        assert_eq!(block_on(decode(vec![two])).unwrap(), b"one two");
    }

    #[test]
    fn refuses_what_is_not_whole_gzip() {
        assert!(block_on(decode(vec![b"plain text, not gzip".to_vec()])).is_err());
        let packed = gzip(&[7u8; 100_000]);
        let cut = packed[..packed.len() - 6].to_vec();
        assert!(block_on(decode(vec![cut])).is_err());
        let mut flipped = packed.clone();
        let at = flipped.len() - 5;
        flipped[at] ^= 0xff;
        assert!(block_on(decode(vec![flipped])).is_err());
    }

    #[test]
    fn output_comes_in_bounded_steps() {
        let zeros = vec![0u8; 64 << 20];
        let packed = gzip(&zeros);
        let input = futures_util::stream::iter([Ok(Bytes::from(packed))]);
        let mut stream = Box::pin(gunzip(input));
        let mut total = 0;
        block_on(async {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.unwrap();
                assert!(chunk.len() <= MAX_STEP, "a step gave {} bytes", chunk.len());
                total += chunk.len();
            }
        });
        assert_eq!(total, zeros.len());
    }
}
