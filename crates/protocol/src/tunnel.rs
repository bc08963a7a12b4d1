//! The host's end of a `connect` (version 5): a TCP connection to a port
//! on a sandbox's loopback, carried over the agent stream, handed to the
//! caller as a plain byte stream.
//!
//! [`open`] asks the agent to connect and, once it has, returns a
//! [`TunnelStream`]; a task carries what the caller writes to the agent
//! (`write_data`, `write_end` at its end of file) and hands the agent's
//! `stream_data` payloads to the caller's reads as they came. Dropping the stream ends the host's direction (the
//! sandbox's end reads end of file, as from a closed socket); a stream
//! the caller no longer reads is cancelled at the agent, so nothing of it
//! outlives its last user. Each direction is bounded: a reader that does
//! not read holds up the agent stream, as every event does (see
//! [`crate::client`]).
//!
//! Each connection is entered in a [`Registry`] (one per sandbox), whose
//! [`Registry::close_all`] closes every one at the agent and waits until
//! the agent has: what a sandbox's pause does first, so no connection is
//! open inside while its memory is saved (gVisor's checkpoint fails on
//! one), and none is left half-open across it.

use crate::{AgentClient, ChunkReader, ClientError, ErrorKind, Event, Request};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::{mpsc, oneshot, Notify};

/// Bytes buffered in each direction for the caller.
const PIPE_BYTES: usize = 1024 * 1024;
/// Bytes carried in one `write_data` frame.
const CHUNK_BYTES: usize = 256 * 1024;
/// How long [`Registry::close_all`] waits for the agent to close them.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The open connections of one sandbox.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    inner: Arc<RegistryInner>,
}

#[derive(Debug, Default)]
struct RegistryInner {
    open: Mutex<Open>,
    closed: Notify,
}

#[derive(Debug, Default)]
struct Open {
    next: u64,
    /// Tasks of connections still running.
    running: usize,
    /// Tells each connection's task to close it.
    close: HashMap<u64, oneshot::Sender<()>>,
}

/// A connection's place in the registry; leaving it (the task ending)
/// takes it out.
struct Entry {
    registry: Registry,
    key: u64,
}

/// A connection's place in the registry for one carried outside the
/// agent ([`Registry::hold`]); dropping it takes it out.
pub struct Held {
    _entry: Entry,
    /// Fires when the registry closes its connections (an error: it was
    /// taken out first); its owner must then close the connection.
    pub closing: Option<oneshot::Receiver<()>>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("key", &self._entry.key)
            .finish()
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        {
            let mut open = self.registry.open();
            open.close.remove(&self.key);
            open.running -= 1;
        }
        self.registry.inner.closed.notify_waiters();
    }
}

impl Registry {
    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.inner
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn enter(&self) -> (Entry, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut open = self.open();
        open.next += 1;
        open.running += 1;
        let key = open.next;
        open.close.insert(key, tx);
        (
            Entry {
                registry: self.clone(),
                key,
            },
            rx,
        )
    }

    /// Enters a connection carried outside the agent (dialled directly on
    /// the sandbox's loopback by the host): [`Registry::close_all`] fires
    /// its [`Held::closing`], and waits until the `Held` is dropped.
    pub fn hold(&self) -> Held {
        let (entry, closing) = self.enter();
        Held {
            _entry: entry,
            closing: Some(closing),
        }
    }

    /// How many connections are open.
    pub fn len(&self) -> usize {
        self.open().running
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every open connection at the agent and waits (at most
    /// [`CLOSE_WAIT`]) until the agent has closed them all.
    pub async fn close_all(&self) {
        let senders: Vec<_> = self.open().close.drain().map(|(_, tx)| tx).collect();
        for tx in senders {
            let _ = tx.send(());
        }
        let settled = async {
            loop {
                let notified = self.inner.closed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.is_empty() {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(CLOSE_WAIT, settled).await;
    }
}

/// The caller's end of a connection: what the agent read from the socket,
/// in the chunks it came in (no copy but into the reader's buffer), and a
/// bounded pipe for what the caller writes. Dropping it closes the
/// connection; shutting down its writing is the socket's end of file.
#[derive(Debug)]
pub struct TunnelStream {
    down: ChunkReader,
    up: DuplexStream,
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.down).poll_read(cx, buf)
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.up).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.up).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.up).poll_shutdown(cx)
    }
}

/// A connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The agent predates `connect`.
    #[error("the sandbox's agent speaks protocol version {0}; forwarding ports needs version 5")]
    TooOld(u32),
    /// Nothing listens on the port.
    #[error("nothing listens on port {0} in the sandbox")]
    Refused(u16),
    /// The agent refused for another reason.
    #[error("{message}")]
    Agent { kind: ErrorKind, message: String },
    /// The agent stream is gone.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The version of the protocol that added `connect`.
pub const CONNECT_VERSION: u32 = 5;

/// Opens a connection to `port` on the sandbox's loopback and returns the
/// caller's end of it.
/// The connection is entered in `registry`.
pub async fn open(
    client: &AgentClient,
    registry: &Registry,
    port: u16,
) -> Result<TunnelStream, TunnelError> {
    if client.version() < CONNECT_VERSION {
        return Err(TunnelError::TooOld(client.version()));
    }
    let mut events = client.request(Request::Connect { port }).await?;
    match events.next().await? {
        Some(frame) if frame.msg == Event::Connected => {}
        Some(frame) => {
            return Err(match frame.msg {
                Event::Error {
                    kind: ErrorKind::Refused,
                    ..
                } => TunnelError::Refused(port),
                Event::Error { kind, message } => TunnelError::Agent { kind, message },
                other => TunnelError::Agent {
                    kind: ErrorKind::Io,
                    message: format!("the agent answered a connect with {other:?}"),
                },
            })
        }
        None => return Err(TunnelError::Client(ClientError::Closed)),
    }
    let id = events.id();
    let (caller_up, mut from_caller) = tokio::io::duplex(PIPE_BYTES);
    let (to_caller, caller_down) = mpsc::channel(PIPE_BYTES / CHUNK_BYTES);
    let mut to_caller = Some(to_caller);
    let caller = TunnelStream {
        down: ChunkReader::new(caller_down),
        up: caller_up,
    };
    let client = client.clone();
    let (entry, mut close) = registry.enter();
    tokio::spawn(async move {
        let _entry = entry;
        // The caller's bytes to the agent, until its end of file.
        let up = async {
            let mut buf = vec![0; CHUNK_BYTES];
            loop {
                match from_caller.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = client.send(id, Request::WriteEnd, Vec::new()).await;
                        return;
                    }
                    Ok(n) => {
                        let chunk = buf[..n].to_vec();
                        if client.send(id, Request::WriteData, chunk).await.is_err() {
                            return;
                        }
                    }
                }
            }
        };
        // The agent's bytes to the caller, until the final event.
        let down = async {
            loop {
                match events.next().await {
                    Ok(Some(frame)) => match frame.msg {
                        Event::StreamData => {
                            let sent = match &to_caller {
                                Some(tx) => tx.send(frame.payload).await.is_ok(),
                                None => true,
                            };
                            // The caller is gone: close the connection.
                            if !sent {
                                return false;
                            }
                        }
                        // The caller reads end of file.
                        Event::StreamEnd => to_caller = None,
                        _ => {}
                    },
                    Ok(None) | Err(_) => return true,
                }
            }
        };
        tokio::pin!(up);
        tokio::pin!(down);
        let mut up_done = false;
        loop {
            tokio::select! {
                () = &mut up, if !up_done => up_done = true,
                ended = &mut down => {
                    if !ended {
                        let _ = client.request(Request::Cancel { target: id }).await;
                    }
                    return;
                }
                // Closed by the registry: the agent closes the socket and
                // ends the stream, which `down` waits for.
                Ok(()) = &mut close => {
                    let _ = client.request(Request::Cancel { target: id }).await;
                    let _ = tokio::time::timeout(CLOSE_WAIT, &mut down).await;
                    return;
                }
            }
        }
    });
    Ok(caller)
}
