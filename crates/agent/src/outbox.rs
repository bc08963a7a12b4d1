//! The way out: every event goes through one bounded queue to one writer task.
//!
//! The queue holds at most [`QUEUE_FRAMES`] frames (each at most 1 MiB of
//! payload), so when the host reads slowly the socket fills, the writer task
//! blocks, the queue fills, and whoever produces events (an output pump, a
//! file read) waits: memory stays bounded and the backpressure reaches the
//! producing process through its full pipe.

use crate::failure::Failure;
use airlock_protocol::{encode, ErrorKind, Event, Frame};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::mpsc;

/// Frames that may wait for the writer.
pub(crate) const QUEUE_FRAMES: usize = 32;

/// A handle to the writer task's queue; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Outbox {
    tx: mpsc::Sender<Frame<Event>>,
}

impl Outbox {
    /// A new queue; hand the receiver to [`write_loop`].
    pub(crate) fn new() -> (Outbox, mpsc::Receiver<Frame<Event>>) {
        let (tx, rx) = mpsc::channel(QUEUE_FRAMES);
        (Outbox { tx }, rx)
    }

    /// Queues an event without payload, waiting while the queue is full.
    /// Returns false when the writer is gone (the host left).
    pub(crate) async fn send(&self, id: u64, event: Event) -> bool {
        self.tx.send(Frame::new(id, event)).await.is_ok()
    }

    /// Queues an event with payload bytes.
    pub(crate) async fn send_payload(&self, id: u64, event: Event, payload: Vec<u8>) -> bool {
        self.tx
            .send(Frame::with_payload(id, event, payload))
            .await
            .is_ok()
    }

    /// Runs `before`, then queues an event, with nothing else queued or run
    /// on the agent's thread in between (a slot is reserved first). Returns
    /// false when the writer is gone; `before` runs either way.
    pub(crate) async fn send_after(&self, id: u64, event: Event, before: impl FnOnce()) -> bool {
        match self.tx.reserve().await {
            Ok(permit) => {
                before();
                permit.send(Frame::new(id, event));
                true
            }
            Err(_) => {
                before();
                false
            }
        }
    }

    /// Queues the final error of request `id`.
    pub(crate) async fn fail(&self, id: u64, failure: Failure) -> bool {
        self.send(id, failure.into_event()).await
    }

    /// Queues the final answer of request `id`: `ok` or the failure.
    pub(crate) async fn answer(&self, id: u64, result: Result<Event, Failure>) -> bool {
        match result {
            Ok(event) => self.send(id, event).await,
            Err(failure) => self.fail(id, failure).await,
        }
    }

    /// Queues a keepalive unless the queue is busy (then the stream is not
    /// idle and the keepalive is not needed).
    pub(crate) fn keepalive(&self) {
        let _ = self.tx.try_send(Frame::new(0, Event::Keepalive));
    }
}

/// Where the writer task puts encoded frames: the channel itself, or the
/// thread that writes it ([`crate::restorable`]).
#[derive(Debug)]
pub(crate) enum Sink {
    Socket(OwnedWriteHalf),
    Thread(mpsc::Sender<Vec<u8>>),
}

impl Sink {
    /// Puts one whole frame on its way; an error means the host is gone.
    async fn put(&mut self, frame: Vec<u8>) -> Result<(), ()> {
        match self {
            Sink::Socket(socket) => socket.write_all(&frame).await.map_err(drop),
            Sink::Thread(queue) => queue.send(frame).await.map_err(drop),
        }
    }
}

/// Writes queued frames to the host until the queue closes or the stream
/// fails. An answer too large for one frame (a huge directory listing) is
/// replaced by an error with the same id, so the request still ends. Each
/// frame goes out as one buffer (one write where the socket takes it).
pub(crate) async fn write_loop(mut sink: Sink, mut rx: mpsc::Receiver<Frame<Event>>) {
    while let Some(frame) = rx.recv().await {
        // Encoding happens before any byte is written, so the stream is
        // still in step when it fails.
        let bytes = match encode(&frame) {
            Ok(bytes) => bytes,
            Err(_) if frame.msg.is_final() => {
                let replacement = Frame::new(
                    frame.id,
                    Failure::new(ErrorKind::Io, "the answer is too large for one frame")
                        .into_event(),
                );
                match encode(&replacement) {
                    Ok(bytes) => bytes,
                    Err(_) => continue,
                }
            }
            Err(_) => continue,
        };
        if sink.put(bytes).await.is_err() {
            return;
        }
    }
}
