//! The egress path of sandboxes that may reach the network.
//!
//! A sandbox whose policy is not `none` lives in a network namespace that
//! the launcher prepared (`airlock_jail::net`): every TCP connection that
//! would leave it is redirected to `lo:15001`, every DNS datagram to
//! `127.0.0.1:53`, everything else is dropped. [`Egress::attach`] binds
//! the listeners for those two ports *inside* that namespace (from a
//! short-lived thread that enters it) and serves them from the daemon:
//!
//! - **DNS** ([`dns`]): a name the policy could allow is resolved on the
//!   host and answered with the addresses outside the always-denied set;
//!   any other name gets NXDOMAIN and is never forwarded anywhere, so a DNS
//!   tunnel carries nothing out.
//! - **TCP** ([`proxy`]): the original destination comes from
//!   `SO_ORIGINAL_DST`; a connection the policy allows by address (an IP
//!   rule, or `open`) is connected at once; otherwise the first bytes must
//!   name a host (TLS SNI, HTTP `Host`), which is canonicalised, resolved on
//!   the host (never trusting the address the sandbox chose), judged by
//!   `NetworkPolicy::decide` for the resolved address, and only then
//!   connected.
//!
//! Every refusal is reported through the [`Events`] callback (the daemon
//! turns it into a security audit event and a metric). The policy of an
//! attachment can be replaced while it runs; new connections and lookups
//! see the new one. Dropping the [`Attachment`] stops its tasks; the
//! namespace and its rules go with the sandbox, so no host state is left.
#![forbid(unsafe_code)]

pub mod dns;
pub mod limit;
pub mod proxy;
pub mod resolve;
pub mod worker;

use airlock_policy::NetworkPolicy;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio::task::JoinHandle;

pub use limit::EgressLimits;
pub use resolve::{resolver, HostsResolver, Resolve, ResolverError, SystemResolver};
pub use worker::{serve_worker, WorkerConfig, WorkerError, WorkerSpawn};

/// What the egress path reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressEvent {
    /// The sandbox it happened in.
    pub sandbox: String,
    /// `tcp` or `dns`.
    pub protocol: &'static str,
    /// The name or address the sandbox asked for.
    pub destination: String,
    /// The destination port (53 for DNS).
    pub port: u16,
    /// Whether it was let through.
    pub allowed: bool,
    /// Stable snake_case code of why (`not_allowlisted`, `always_denied`, …).
    pub reason: &'static str,
    /// The rule that decided, if one did.
    pub rule: Option<String>,
}

/// Receives the egress path's events.
pub type Events = Arc<dyn Fn(EgressEvent) + Send + Sync>;

/// Errors attaching the egress path to a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("cannot enter the sandbox's network namespace at {path}")]
    Enter {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot bind the egress listeners in the sandbox's network namespace")]
    Bind(#[source] std::io::Error),
    #[error("the egress worker cannot take the sandbox")]
    Worker(#[source] Box<WorkerError>),
}

/// `e` and its sources, as one line for the log.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The egress path, shared by every sandbox of a daemon: served from this
/// process, or confined in a worker process ([`Egress::confined`]).
#[derive(Clone)]
pub struct Egress {
    resolver: Arc<dyn Resolve>,
    events: Events,
    limits: EgressLimits,
    worker: Option<Arc<worker::Client>>,
}

/// The shared state of one sandbox's egress path.
pub(crate) struct Shared {
    pub sandbox: String,
    pub policy: RwLock<NetworkPolicy>,
    pub resolver: Arc<dyn Resolve>,
    pub events: Events,
    /// DNS queries: rate and lookups at once.
    pub dns: limit::Gate,
    /// Proxied connections: rate and open at once.
    pub connections: limit::Gate,
}

impl Shared {
    pub(crate) fn policy(&self) -> NetworkPolicy {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn report(&self, event: EgressEvent) {
        (self.events)(event);
    }

    /// Reports a refusal no rule made, with a stable `reason` code; the
    /// destination (whatever the sandbox sent) is cut to 256 characters.
    pub(crate) fn refuse(
        &self,
        protocol: &'static str,
        destination: &str,
        port: u16,
        reason: &'static str,
    ) {
        self.report(EgressEvent {
            sandbox: self.sandbox.clone(),
            protocol,
            destination: destination.chars().take(256).collect(),
            port,
            allowed: false,
            reason,
            rule: None,
        });
    }

    /// Reports a refusal by one of the path's bounds (see [`limit`]).
    pub(crate) fn limited(
        &self,
        protocol: &'static str,
        destination: &str,
        port: u16,
        refused: limit::Refused,
    ) {
        if refused.report() {
            let reason = match refused {
                limit::Refused::Rate { .. } => "rate_limited",
                limit::Refused::Busy { .. } => "too_many_at_once",
            };
            self.refuse(protocol, destination, port, reason);
        }
    }
}

/// The egress path of one sandbox; dropping it stops it.
pub struct Attachment {
    served: Served,
}

enum Served {
    /// By tasks of this process.
    Here {
        shared: Arc<Shared>,
        tasks: Vec<JoinHandle<()>>,
    },
    /// By the worker.
    Worker {
        client: Arc<worker::Client>,
        sandbox: String,
        policy: RwLock<NetworkPolicy>,
    },
}

impl Drop for Attachment {
    fn drop(&mut self) {
        match &self.served {
            Served::Here { tasks, .. } => {
                for task in tasks {
                    task.abort();
                }
            }
            Served::Worker {
                client, sandbox, ..
            } => client.detach(sandbox),
        }
    }
}

impl Attachment {
    /// The policy in force.
    pub fn policy(&self) -> NetworkPolicy {
        match &self.served {
            Served::Here { shared, .. } => shared.policy(),
            Served::Worker { policy, .. } => {
                policy.read().unwrap_or_else(|p| p.into_inner()).clone()
            }
        }
    }

    /// Replaces the policy; connections and lookups from now on follow it.
    pub fn set_policy(&self, policy: NetworkPolicy) {
        match &self.served {
            Served::Here { shared, .. } => {
                *shared.policy.write().unwrap_or_else(|p| p.into_inner()) = policy;
            }
            Served::Worker {
                client,
                sandbox,
                policy: kept,
            } => {
                client.set_policy(sandbox, policy.clone());
                *kept.write().unwrap_or_else(|p| p.into_inner()) = policy;
            }
        }
    }
}

impl Egress {
    /// An egress path served from this process, with the default
    /// [`EgressLimits`].
    pub fn new(resolver: Arc<dyn Resolve>, events: Events) -> Egress {
        Egress {
            resolver,
            events,
            limits: EgressLimits::default(),
            worker: None,
        }
    }

    /// The same path with other bounds per sandbox.
    pub fn with_limits(mut self, limits: EgressLimits) -> Egress {
        self.limits = limits;
        self
    }

    /// An egress path served by a confined worker process (see
    /// [`worker`]), started now and kept running; `events` gets what it
    /// reports.
    pub fn confined(
        spawn: WorkerSpawn,
        config: WorkerConfig,
        events: Events,
    ) -> Result<Egress, WorkerError> {
        let limits = config.limits;
        let client = worker::Client::start(spawn, config, Arc::clone(&events))?;
        Ok(Egress {
            resolver: Arc::new(HostsResolver::default()),
            events,
            limits,
            worker: Some(client),
        })
    }

    /// Serves the egress path of `sandbox`, whose network namespace is at
    /// `netns` (`/proc/<pid>/ns/net` of a process inside it). Must be
    /// called within a tokio runtime.
    pub fn attach(
        &self,
        sandbox: &str,
        netns: &Path,
        policy: NetworkPolicy,
    ) -> Result<Attachment, EgressError> {
        let (tcp, dns) = bind_inside(netns)?;
        match &self.worker {
            Some(client) => {
                client.attach(sandbox, tcp, dns, policy.clone())?;
                Ok(Attachment {
                    served: Served::Worker {
                        client: Arc::clone(client),
                        sandbox: sandbox.to_owned(),
                        policy: RwLock::new(policy),
                    },
                })
            }
            None => self.serve(sandbox, tcp, dns, policy),
        }
    }

    /// Serves `sandbox` from this process on listeners already bound in its
    /// namespace. Must be called within a tokio runtime.
    pub fn serve(
        &self,
        sandbox: &str,
        tcp: Vec<TcpListener>,
        dns: UdpSocket,
        policy: NetworkPolicy,
    ) -> Result<Attachment, EgressError> {
        let shared = Arc::new(Shared {
            sandbox: sandbox.to_owned(),
            policy: RwLock::new(policy),
            resolver: Arc::clone(&self.resolver),
            events: Arc::clone(&self.events),
            dns: limit::Gate::new(
                self.limits.dns_per_second,
                self.limits.dns_burst,
                self.limits.dns_in_flight,
            ),
            connections: limit::Gate::new(
                self.limits.connections_per_second,
                self.limits.connections_burst,
                self.limits.connections_open,
            ),
        });
        let mut tasks = Vec::new();
        for listener in tcp {
            listener.set_nonblocking(true).map_err(EgressError::Bind)?;
            let listener =
                tokio::net::TcpListener::from_std(listener).map_err(EgressError::Bind)?;
            tasks.push(tokio::spawn(proxy::serve(listener, Arc::clone(&shared))));
        }
        dns.set_nonblocking(true).map_err(EgressError::Bind)?;
        let dns = tokio::net::UdpSocket::from_std(dns).map_err(EgressError::Bind)?;
        tasks.push(tokio::spawn(dns::serve(dns, Arc::clone(&shared))));
        Ok(Attachment {
            served: Served::Here { shared, tasks },
        })
    }
}

/// Whether `ip` is an address of this host (in the daemon's network
/// namespace): binding a socket to an address succeeds only for local
/// ones, which is always current, unlike a list read at start.
pub fn is_host_address(ip: std::net::IpAddr) -> bool {
    if ip.is_unspecified() || ip.is_loopback() {
        return true;
    }
    UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Binds the proxy (IPv4 and, when the namespace has it, IPv6, and the
/// guest link's IPv6 address when it has one) and the
/// resolver inside the namespace at `netns`, from a thread that enters it
/// and ends: sockets keep the namespace they were made in.
fn bind_inside(netns: &Path) -> Result<(Vec<TcpListener>, UdpSocket), EgressError> {
    let path = netns.to_path_buf();
    let joined = std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<(Vec<TcpListener>, UdpSocket), EgressError> {
                let enter = |source| EgressError::Enter {
                    path: path.clone(),
                    source,
                };
                let namespace = std::fs::File::open(&path).map_err(enter)?;
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&namespace),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(|e| enter(e.into()))?;
                let port = airlock_jail::net::PROXY_PORT;
                let mut tcp = vec![TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
                    .map_err(EgressError::Bind)?];
                if let Ok(v6) =
                    TcpListener::bind(SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)))
                {
                    tcp.push(v6);
                }
                // The guest link's own address, where a guest kernel's
                // IPv6 connections are handed over (see
                // `airlock_jail::net::GuestLink`); only namespaces with a
                // guest link have it.
                let guest = airlock_jail::net::GUEST_GATEWAY_V6;
                if let Ok(v6) = TcpListener::bind(SocketAddr::from((guest, port))) {
                    tcp.push(v6);
                }
                let dns = UdpSocket::bind(SocketAddr::from((
                    [127, 0, 0, 1],
                    airlock_jail::net::DNS_PORT,
                )))
                .map_err(EgressError::Bind)?;
                for listener in &tcp {
                    listener.set_nonblocking(true).map_err(EgressError::Bind)?;
                }
                dns.set_nonblocking(true).map_err(EgressError::Bind)?;
                Ok((tcp, dns))
            })
            .join()
    });
    match joined {
        Ok(bound) => bound,
        Err(_) => Err(EgressError::Bind(std::io::Error::other(
            "the thread binding the egress listeners panicked",
        ))),
    }
}
