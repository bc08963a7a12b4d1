//! Ports of a sandbox reached from outside: a TCP connection to a port a
//! process inside listens on, carried by its agent (protocol version 5's
//! `connect`), on every tier alike. The dialects decide who may open one
//! and speak HTTP over it; the daemon only finds the running sandbox and
//! opens the connection on its loopback, never anywhere else.

use crate::{Daemon, DaemonError};
use airlock_protocol::tunnel::{self, TunnelError};

impl Daemon {
    /// A connection to `port` on the loopback of the running sandbox `id`,
    /// waking it first when it is paused and its lifecycle lets traffic
    /// wake it.
    pub async fn open_port(
        &self,
        id: &str,
        port: u16,
    ) -> Result<tunnel::TunnelStream, DaemonError> {
        if port == 0 {
            return Err(DaemonError::BadInput("port 0 is not a port".into()));
        }
        self.reach_ports(id).await?;
        let sandbox = self.running(id)?;
        tunnel::open(sandbox.agent(), &sandbox.tunnels, port)
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
