//! The host's end of a `connect` (version 5): a TCP connection to a port
//! on a sandbox's loopback, carried over the agent stream, handed to the
//! caller as a plain byte stream.
//!
//! [`open`] asks the agent to connect and, once it has, returns one end of
//! an in-memory pipe; two tasks carry the other end's bytes to the agent
//! (`write_data`, `write_end` at its end of file) and the agent's
//! `stream_data` back. Dropping the stream ends the host's direction (the
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

use crate::{AgentClient, ClientError, ErrorKind, Event, Request};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{oneshot, Notify};

/// Bytes buffered in each direction of the pipe the caller holds.
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
) -> Result<DuplexStream, TunnelError> {
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
    let (caller, ours) = tokio::io::duplex(PIPE_BYTES);
    let (mut from_caller, mut to_caller) = tokio::io::split(ours);
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
                        // The caller is gone: close the connection.
                        Event::StreamData if to_caller.write_all(&frame.payload).await.is_err() => {
                            return false
                        }
                        Event::StreamEnd => {
                            let _ = to_caller.shutdown().await;
                        }
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
