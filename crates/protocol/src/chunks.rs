//! Chunks handed over a queue, read as one byte stream.

use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

/// Reads the chunks `chunks` delivers, in order, as one stream: each chunk
/// is copied only into the reader's buffer, and the queue's end (every
/// sender gone) is the stream's end of file.
#[derive(Debug)]
pub struct ChunkReader {
    chunks: mpsc::Receiver<Vec<u8>>,
    /// The chunk being read, and how much of it has been.
    chunk: Vec<u8>,
    read: usize,
}

impl ChunkReader {
    /// A reader of what `chunks` delivers from now on.
    pub fn new(chunks: mpsc::Receiver<Vec<u8>>) -> ChunkReader {
        ChunkReader {
            chunks,
            chunk: Vec::new(),
            read: 0,
        }
    }
}

impl AsyncRead for ChunkReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let reader = self.get_mut();
        loop {
            if reader.read < reader.chunk.len() {
                let n = (reader.chunk.len() - reader.read).min(buf.remaining());
                buf.put_slice(&reader.chunk[reader.read..reader.read + n]);
                reader.read += n;
                return Poll::Ready(Ok(()));
            }
            match reader.chunks.poll_recv(cx) {
                Poll::Ready(Some(chunk)) => {
                    reader.chunk = chunk;
                    reader.read = 0;
                }
                // End of file: nothing filled.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn chunks_read_as_one_stream_in_order_and_end_with_the_queue() {
        let (tx, rx) = mpsc::channel(4);
        let mut reader = ChunkReader::new(rx);
        let sender = tokio::spawn(async move {
            for chunk in [b"ab".to_vec(), Vec::new(), b"cdefg".to_vec(), b"h".to_vec()] {
                tx.send(chunk).await.unwrap();
            }
        });
        // Reads smaller than a chunk take it a piece at a time.
        let mut first = [0u8; 3];
        reader.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"abc");
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"defgh");
        sender.await.unwrap();
    }
}
