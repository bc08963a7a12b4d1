//! `connect`: TCP connections to ports on the sandbox's own loopback,
//! carried over the host stream (how a server an agent started inside is
//! reached from outside).
//!
//! Only loopback addresses are dialled, so a connection reaches nothing the
//! sandbox's own processes could not; the sandbox's network namespace (or
//! gVisor's netstack) is the one the agent lives in. Each connection runs
//! in a task of its own: the host's bytes arrive through a small queue
//! (the read loop waits when it is full, the backpressure the host sees),
//! the sandbox's go out through the [`Outbox`].

use crate::failure::Failure;
use crate::outbox::Outbox;
use airlock_protocol::{ErrorKind, Event};
use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// Connections one stream may hold open at once.
pub(crate) const MAX_OPEN: usize = 1024;
/// Chunks from the host queued per connection before the read loop waits.
const QUEUE: usize = 8;
/// Bytes read from the sandbox's end into one `stream_data`.
const CHUNK_BYTES: usize = 256 * 1024;
/// How long a connect may take (a full listen backlog drops SYNs).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the read loop hands a connection.
pub(crate) enum TunnelMsg {
    /// Bytes for the sandbox's end.
    Data(Vec<u8>),
    /// The host sends no more: half-close.
    End,
}

struct Open {
    /// `None` once the host ended its direction.
    data: Option<mpsc::Sender<TunnelMsg>>,
    /// Fired by a `cancel` with that request's id; closed once the
    /// connection's task has ended.
    cancel: oneshot::Sender<u64>,
}

/// The open connections of one stream, by request id.
#[derive(Default)]
pub(crate) struct Tunnels {
    open: HashMap<u64, Open>,
}

impl Tunnels {
    /// Opens a connection for request `id` to `port`.
    pub(crate) async fn connect(&mut self, outbox: &Outbox, id: u64, port: u16) {
        // Connections that ended are forgotten here, so the table holds
        // only live ones and a few just finished.
        self.open.retain(|_, open| !open.cancel.is_closed());
        let refused = if port == 0 {
            Some(Failure::invalid("port 0 cannot be connected to"))
        } else if self.open.contains_key(&id) {
            Some(Failure::invalid(format!(
                "a connection with id {id} is already open"
            )))
        } else if self.open.len() >= MAX_OPEN {
            Some(Failure::new(
                ErrorKind::Busy,
                format!("{MAX_OPEN} connections are open on this stream already"),
            ))
        } else {
            None
        };
        if let Some(failure) = refused {
            outbox.fail(id, failure).await;
            return;
        }
        let (data, queue) = mpsc::channel(QUEUE);
        let (cancel, cancelled) = oneshot::channel();
        self.open.insert(
            id,
            Open {
                data: Some(data),
                cancel,
            },
        );
        tokio::spawn(run(outbox.clone(), id, port, queue, cancelled));
    }

    /// Whether `id` is an open connection's.
    pub(crate) fn holds(&self, id: u64) -> bool {
        self.open.contains_key(&id)
    }

    /// Hands the host's bytes (or its end) to connection `id`. A connection
    /// that already ended drops them.
    pub(crate) async fn deliver(&mut self, id: u64, msg: TunnelMsg) {
        let Some(open) = self.open.get_mut(&id) else {
            return;
        };
        let end = matches!(msg, TunnelMsg::End);
        if let Some(data) = &open.data {
            let _ = data.send(msg).await;
        }
        if end {
            // Nothing more comes from the host for it; the task keeps the
            // other direction going on its own.
            open.data = None;
        }
    }

    /// Closes connection `target` for the `cancel` request `id`; false when
    /// no such connection is open.
    pub(crate) fn cancel(&mut self, id: u64, target: u64) -> bool {
        match self.open.remove(&target) {
            Some(open) => open.cancel.send(id).is_ok(),
            None => false,
        }
    }

    /// Drops every connection (the host is gone).
    pub(crate) fn close_all(&mut self) {
        self.open.clear();
    }
}

/// Connects to `port` on loopback, IPv4 first.
async fn dial(port: u16) -> Result<TcpStream, Failure> {
    let mut last = None;
    for ip in [Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()] {
        let addr = SocketAddr::new(ip, port);
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = Some(e),
            Err(_) => {
                return Err(Failure::new(
                    ErrorKind::Busy,
                    format!("port {port} did not accept the connection in time"),
                ))
            }
        }
    }
    let reason = last.map(|e| e.to_string()).unwrap_or_default();
    Err(Failure::new(
        ErrorKind::Refused,
        format!("nothing listens on port {port}: {reason}"),
    ))
}

/// One connection, from dial to its final event.
async fn run(
    outbox: Outbox,
    id: u64,
    port: u16,
    mut queue: mpsc::Receiver<TunnelMsg>,
    mut cancelled: oneshot::Receiver<u64>,
) {
    let stream = tokio::select! {
        dialled = dial(port) => dialled,
        cancel = &mut cancelled => {
            outbox.send(id, Event::Done).await;
            if let Ok(cancel) = cancel {
                outbox.send(cancel, Event::Done).await;
            }
            return;
        }
    };
    let stream = match stream {
        Ok(stream) => stream,
        Err(failure) => {
            outbox.fail(id, failure).await;
            return;
        }
    };
    if !outbox.send(id, Event::Connected).await {
        return;
    }
    let (mut reader, mut writer) = stream.into_split();
    // The host's bytes into the socket, until its end (or the socket's).
    let up = async {
        while let Some(msg) = queue.recv().await {
            match msg {
                TunnelMsg::Data(bytes) => {
                    if writer.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                TunnelMsg::End => break,
            }
        }
        let _ = writer.shutdown().await;
        // Whatever else the host sends is dropped from here on.
        drop(queue);
    };
    // The socket's bytes to the host; true at an orderly end of file.
    let down = async {
        loop {
            // Read straight into the frame's payload: no copy, no zeroing.
            let mut chunk = Vec::with_capacity(CHUNK_BYTES);
            match reader.read_buf(&mut chunk).await {
                Ok(0) => return outbox.send(id, Event::StreamEnd).await,
                Ok(_) => {
                    // Acknowledge at once, every time (the kernel leaves
                    // quick-ack mode on its own): a server that writes an
                    // answer's head and body apart under Nagle (Python's
                    // http.server) would otherwise wait out our delayed ACK,
                    // 40 ms, on every request of a kept-alive connection.
                    let _ = reader.as_ref().set_quickack(true);
                    if !outbox.send_payload(id, Event::StreamData, chunk).await {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
    };
    tokio::pin!(up);
    tokio::pin!(down);
    let (mut up_done, mut down_done) = (false, false);
    let cancel = loop {
        tokio::select! {
            () = &mut up, if !up_done => up_done = true,
            clean = &mut down, if !down_done => {
                down_done = true;
                // A reset (or a host gone) ends both directions.
                if !clean {
                    break None;
                }
            }
            cancel = &mut cancelled => break cancel.ok(),
        }
        if up_done && down_done {
            break None;
        }
    };
    outbox.send(id, Event::Done).await;
    if let Some(cancel) = cancel {
        outbox.send(cancel, Event::Done).await;
    }
}
