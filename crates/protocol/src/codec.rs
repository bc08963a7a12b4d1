//! Frame encoding: `u32 header_len | u32 payload_len | header JSON | payload`.

use crate::Frame;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest header a peer accepts. Headers hold small JSON objects.
pub const MAX_HEADER_BYTES: usize = 1 << 20;
/// Largest payload in one frame; bulk data is split into chunks of at most this.
pub const MAX_PAYLOAD_BYTES: usize = 4 << 20;

/// A frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the peer closed the stream")]
    Closed,
    #[error("frame header of {0} bytes is over the limit")]
    HeaderTooLarge(usize),
    #[error("frame payload of {0} bytes is over the limit")]
    PayloadTooLarge(usize),
    #[error("frame header is not a valid message")]
    Decode(#[source] serde_json::Error),
    #[error("frame header could not be encoded")]
    Encode(#[source] serde_json::Error),
    #[error("stream I/O failed")]
    Io(#[from] std::io::Error),
}

#[derive(Serialize)]
struct HeaderOut<'a, M> {
    id: u64,
    msg: &'a M,
}

#[derive(Deserialize)]
struct HeaderIn<M> {
    id: u64,
    msg: M,
}

/// Encodes a frame into bytes (used by [`write_frame`] and by tests).
pub fn encode<M: Serialize>(frame: &Frame<M>) -> Result<Vec<u8>, FrameError> {
    let header = serde_json::to_vec(&HeaderOut {
        id: frame.id,
        msg: &frame.msg,
    })
    .map_err(FrameError::Encode)?;
    if header.len() > MAX_HEADER_BYTES {
        return Err(FrameError::HeaderTooLarge(header.len()));
    }
    if frame.payload.len() > MAX_PAYLOAD_BYTES {
        return Err(FrameError::PayloadTooLarge(frame.payload.len()));
    }
    let mut out = Vec::with_capacity(8 + header.len() + frame.payload.len());
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(&(frame.payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&frame.payload);
    Ok(out)
}

/// Writes one frame and flushes it.
pub async fn write_frame<W, M>(writer: &mut W, frame: &Frame<M>) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    M: Serialize,
{
    // One buffer, one write: a frame is never split across writes (a
    // split frame is the suspect of a resume losing its agent, see the
    // closing note of 2026-12-04).
    writer.write_all(&encode(frame)?).await?;
    writer.flush().await?;
    Ok(())
}

/// Reads the two lengths that open a frame and checks them against the
/// limits, before anything is allocated for them.
async fn read_lengths<R>(reader: &mut R) -> Result<([u8; 8], usize, usize), FrameError>
where
    R: AsyncRead + Unpin,
{
    let mut lengths = [0u8; 8];
    match reader.read_exact(&mut lengths).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let header_len = u32::from_be_bytes([lengths[0], lengths[1], lengths[2], lengths[3]]) as usize;
    let payload_len = u32::from_be_bytes([lengths[4], lengths[5], lengths[6], lengths[7]]) as usize;
    if header_len > MAX_HEADER_BYTES {
        return Err(FrameError::HeaderTooLarge(header_len));
    }
    if payload_len > MAX_PAYLOAD_BYTES {
        return Err(FrameError::PayloadTooLarge(payload_len));
    }
    Ok((lengths, header_len, payload_len))
}

/// Reads one whole frame as its encoded bytes, without decoding the header:
/// for relays that pass frames on intact (a torn frame would desynchronize
/// the stream for everything after it).
pub async fn read_frame_bytes<R>(reader: &mut R) -> Result<Vec<u8>, FrameError>
where
    R: AsyncRead + Unpin,
{
    let (lengths, header_len, payload_len) = read_lengths(reader).await?;
    let mut frame = vec![0u8; 8 + header_len + payload_len];
    frame[..8].copy_from_slice(&lengths);
    reader.read_exact(&mut frame[8..]).await?;
    Ok(frame)
}

/// Reads one frame. A clean end of stream before a frame starts is
/// [`FrameError::Closed`]; lengths over the limits are refused before any
/// allocation.
pub async fn read_frame<R, M>(reader: &mut R) -> Result<Frame<M>, FrameError>
where
    R: AsyncRead + Unpin,
    M: DeserializeOwned,
{
    let (_, header_len, payload_len) = read_lengths(reader).await?;
    let mut header = vec![0u8; header_len];
    reader.read_exact(&mut header).await?;
    let mut payload = vec![0u8; payload_len];
    reader.read_exact(&mut payload).await?;
    let parsed: HeaderIn<M> = serde_json::from_slice(&header).map_err(FrameError::Decode)?;
    Ok(Frame {
        id: parsed.id,
        msg: parsed.msg,
        payload,
    })
}
