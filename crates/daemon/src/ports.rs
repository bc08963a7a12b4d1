//! Ports of a sandbox reached from outside: a TCP connection to a port a
//! process inside listens on, carried by its agent (protocol version 5's
//! `connect`), on every tier alike. The dialects decide who may open one
//! and speak HTTP over it; the daemon only finds the running sandbox and
//! opens the connection on its loopback, never anywhere else.

use crate::{Daemon, DaemonError};
use airlock_protocol::tunnel::{self, TunnelError};
use tokio::io::DuplexStream;

impl Daemon {
    /// A connection to `port` on the loopback of the running sandbox `id`,
    /// waking it first when it is paused and its lifecycle lets traffic
    /// wake it.
    pub async fn open_port(&self, id: &str, port: u16) -> Result<DuplexStream, DaemonError> {
        if port == 0 {
            return Err(DaemonError::BadInput("port 0 is not a port".into()));
        }
        if self.is_paused(id) {
            self.wake(id).await;
        }
        let sandbox = self.running(id)?;
        tunnel::open(sandbox.agent(), port)
            .await
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
    /// Whether sandbox `id` (running or paused) lets its ports answer
    /// without a token; `None` when there is no such sandbox (or it is
    /// dead).
    pub fn ports_are_public(&self, id: &str) -> Option<bool> {
        if let Some(sandbox) = self.live_sandbox(id) {
            return Some(sandbox.spec.public_ports);
        }
        let row = self.with_store(|s| s.get_sandbox(id)).ok().flatten()?;
        if crate::sandboxes::state_of(&row).is_dead() {
            return None;
        }
        serde_json::from_str::<airlock_policy::SandboxSpec>(&row.spec_json)
            .ok()
            .map(|spec| spec.public_ports)
    }
}
