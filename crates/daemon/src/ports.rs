//! Ports of a sandbox reached from outside: a TCP connection to a port a
//! process inside listens on, dialled on the sandbox's loopback directly
//! where its tier says how ([`airlock_backend::PortsPoint`]: the `process`
//! and `oci` tiers, whose loopback is in a network namespace of the host's
//! kernel), else carried by its agent (protocol version 5's `connect`;
//! gVisor's netstack holds its loopback). The dialects decide who may open
//! one and speak HTTP over it; the daemon only finds the running sandbox
//! and opens the connection on its loopback, never anywhere else.

use crate::{Daemon, DaemonError};
use airlock_backend::DialError;
use airlock_protocol::tunnel::{self, Held, TunnelError, TunnelStream};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a connect may take (a full listen backlog drops SYNs), as the
/// agent's.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to a port of a sandbox.
#[derive(Debug)]
pub enum PortStream {
    /// Carried by the sandbox's agent.
    Agent(TunnelStream),
    /// Dialled on the sandbox's loopback by the daemon.
    Direct(DirectStream),
}

/// A connection the daemon dialled on a sandbox's loopback, held in the
/// sandbox's connection registry (a pause closes it, as the agent's).
#[derive(Debug)]
pub struct DirectStream {
    tcp: tokio::net::TcpStream,
    _held: Held,
}

impl DirectStream {
    /// Wraps `std` (blocking, just dialled), entered as `held`: a task
    /// shuts the socket down when the registry closes its connections.
    fn new(std: std::net::TcpStream, mut held: Held) -> io::Result<DirectStream> {
        let _ = std.set_nodelay(true);
        let closer = std.try_clone()?;
        std.set_nonblocking(true)?;
        let tcp = tokio::net::TcpStream::from_std(std)?;
        if let Some(closing) = held.closing.take() {
            tokio::spawn(async move {
                if closing.await.is_ok() {
                    let _ = closer.shutdown(std::net::Shutdown::Both);
                }
            });
        }
        Ok(DirectStream { tcp, _held: held })
    }
}

impl AsyncRead for PortStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PortStream::Agent(s) => Pin::new(s).poll_read(cx, buf),
            PortStream::Direct(s) => {
                let before = buf.filled().len();
                let read = Pin::new(&mut s.tcp).poll_read(cx, buf);
                if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
                    // Acknowledge at once, every time, as the agent does: a
                    // server writing an answer's head and body apart under
                    // Nagle (Python's http.server) would otherwise wait out
                    // a delayed ACK, 40 ms, on every kept-alive request.
                    let _ = s.tcp.set_quickack(true);
                }
                read
            }
        }
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PortStream::Agent(s) => Pin::new(s).poll_write(cx, buf),
            PortStream::Direct(s) => Pin::new(&mut s.tcp).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PortStream::Agent(s) => Pin::new(s).poll_flush(cx),
            PortStream::Direct(s) => Pin::new(&mut s.tcp).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PortStream::Agent(s) => Pin::new(s).poll_shutdown(cx),
            PortStream::Direct(s) => Pin::new(&mut s.tcp).poll_shutdown(cx),
        }
    }
}

impl Daemon {
    /// A connection to `port` on the loopback of the running sandbox `id`,
    /// waking it first when it is paused and its lifecycle lets traffic
    /// wake it.
    pub async fn open_port(&self, id: &str, port: u16) -> Result<PortStream, DaemonError> {
        if port == 0 {
            return Err(DaemonError::BadInput("port 0 is not a port".into()));
        }
        self.reach_ports(id).await?;
        let sandbox = self.running(id)?;
        if let Some(point) = &sandbox.ports {
            let point = std::sync::Arc::clone(point);
            let dialled = tokio::task::spawn_blocking(move || point.dial(port, CONNECT_TIMEOUT))
                .await
                .map_err(|e| {
                    DaemonError::Internal(format!("the dial of a port did not finish: {e}"))
                })?;
            return match dialled {
                Ok(std) => DirectStream::new(std, sandbox.tunnels.hold())
                    .map(PortStream::Direct)
                    .map_err(|e| DaemonError::Internal(format!("a dialled port: {e}"))),
                Err(DialError::Refused { port }) => Err(DaemonError::PortClosed(format!(
                    "the sandbox {id} is running but nothing listens on port {port} inside it"
                ))),
                Err(DialError::Timeout { port }) => Err(DaemonError::Conflict(format!(
                    "port {port} of the sandbox {id} did not accept the connection in time"
                ))),
                Err(e) => Err(DaemonError::Internal(format!(
                    "port {port} of {id}: {}",
                    airlock_backend::error_chain(&e)
                ))),
            };
        }
        tunnel::open(sandbox.agent(), &sandbox.tunnels, port)
            .await
            .map(PortStream::Agent)
            .map_err(|e| match e {
                TunnelError::Refused(port) => DaemonError::PortClosed(format!(
                    "the sandbox {id} is running but nothing listens on port {port} inside it"
                )),
                TunnelError::TooOld(_) => DaemonError::Unsupported(format!(
                    "the sandbox {id} was started by an agent that cannot forward ports; \
                     create a new sandbox to reach its ports"
                )),
                TunnelError::Agent { kind, message } => DaemonError::from_agent(kind, message),
                TunnelError::Client(_) => DaemonError::NotRunning(id.to_owned()),
            })
    }
}

impl Daemon {
    /// Makes sure the sandbox `id` runs before traffic goes to its ports
    /// (a connection kept from earlier included): wakes it when it is
    /// paused and its lifecycle lets traffic wake it.
    pub async fn reach_ports(&self, id: &str) -> Result<(), DaemonError> {
        if self.is_paused(id) {
            self.wake(id).await;
        }
        self.running(id).map(|_| ())
    }
}

/// How a sandbox's ports are reached (from its spec).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAccess {
    /// They answer without a token.
    pub public: bool,
    /// The `Host` requests go in with (`${PORT}`: the port).
    pub host_mask: Option<String>,
}

impl Daemon {
    /// How sandbox `id` (running or paused) lets its ports be reached;
    /// `None` when there is no such sandbox (or it is dead).
    pub fn port_access(&self, id: &str) -> Option<PortAccess> {
        let of = |spec: &airlock_policy::SandboxSpec| PortAccess {
            public: spec.public_ports,
            host_mask: spec.port_host_mask.clone(),
        };
        if let Some(sandbox) = self.live_sandbox(id) {
            return Some(of(&sandbox.spec));
        }
        let row = self.with_store(|s| s.get_sandbox(id)).ok().flatten()?;
        if crate::sandboxes::state_of(&row).is_dead() {
            return None;
        }
        serde_json::from_str::<airlock_policy::SandboxSpec>(&row.spec_json)
            .ok()
            .map(|spec| of(&spec))
    }
}
