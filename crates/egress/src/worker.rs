//! The egress path, confined: the proxy and resolver run in a worker
//! process of their own, as an unprivileged user, so a bug in what parses
//! sandbox traffic (TLS ClientHellos, HTTP heads, DNS queries) does not
//! hand out the daemon's root, its keys or its memory.
//!
//! The daemon (root) still binds each sandbox's listeners *inside* the
//! sandbox's network namespace (entering one takes privilege); it hands
//! the bound sockets to the worker over a `SOCK_SEQPACKET` socket pair
//! (`SCM_RIGHTS`), with the policy, and later policy changes and
//! detachments. The worker accepts, judges, resolves, connects and splices
//! exactly as the in-process path does, and reports every event back; the
//! daemon checks each one (a known sandbox, a known protocol and reason,
//! bounded strings) before it becomes an audit event or a metric, since a
//! compromised worker must not be able to grow the daemon's memory or
//! write what it likes.
//!
//! The daemon keeps the bound sockets and the current policies, so a
//! worker that dies is started again (after a growing pause) and given
//! every attachment again; connections made meanwhile wait in the
//! listeners' queues.
//!
//! Messages are JSON, one per datagram: [`ToWorker`] from the daemon,
//! [`FromWorker`] back.

use crate::{EgressError, EgressEvent, EgressLimits, Events};
use airlock_policy::NetworkPolicy;
use rustix::net::{
    recvmsg, sendmsg, socketpair, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage,
    RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags,
    SocketType,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest message either side sends (an attach with a policy of
/// `MAX_RULES` long names fits).
const MAX_MESSAGE: usize = 1 << 20;
/// Descriptors one attach carries at most (IPv4 and IPv6 proxy, resolver).
const MAX_FDS: usize = 4;
/// Longest a destination or rule from the worker may be.
const MAX_TEXT: usize = 256;

/// Every `reason` the egress path reports; anything else from a worker is
/// refused (a compromised worker must not mint metric labels).
pub const REASONS: &[&str] = &[
    "allowed",
    "bad_host",
    "sni_mismatch",
    "unresolvable",
    "rate_limited",
    "too_many_at_once",
    "policy_none",
    "always_denied",
    "not_allowlisted",
    "denylisted",
    "unnamed_not_allowlisted",
    "host_address_mismatch",
    "invalid_port",
    "host_address",
];

/// How to start the worker.
#[derive(Debug, Clone)]
pub struct WorkerSpawn {
    /// The program (the `airlock` binary).
    pub program: PathBuf,
    /// Its arguments (the hidden subcommand).
    pub args: Vec<OsString>,
    /// The unprivileged user and group it runs as.
    pub uid: u32,
    pub gid: u32,
}

/// What the worker needs to know before it is confined.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkerConfig {
    /// `name=ip` entries replacing the host's resolver (see `resolver`).
    pub hosts: Vec<String>,
    /// A resolver to ask instead of the host's configuration.
    pub dns: Option<SocketAddr>,
    /// The bounds of each sandbox's path.
    pub limits: EgressLimits,
}

/// From the daemon to the worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToWorker {
    /// Always the first message.
    Configure(WorkerConfig),
    /// Serve `sandbox` on the sockets this message carries: `tcp` proxy
    /// listeners, then the resolver's socket. Replaces an earlier attach.
    Attach {
        sandbox: String,
        tcp: usize,
        policy: NetworkPolicy,
    },
    /// Follow `policy` from now on.
    SetPolicy {
        sandbox: String,
        policy: NetworkPolicy,
    },
    /// Stop serving `sandbox`.
    Detach { sandbox: String },
}

/// From the worker to the daemon.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromWorker {
    /// Something the egress path did.
    Event {
        sandbox: String,
        protocol: String,
        destination: String,
        port: u16,
        allowed: bool,
        reason: String,
        rule: Option<String>,
    },
}

/// Errors of the channel between the daemon and the worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot make the channel to the egress worker")]
    Channel(#[source] std::io::Error),
    #[error("cannot start the egress worker {program}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot send to the egress worker")]
    Send(#[source] std::io::Error),
    #[error("cannot receive from the egress worker's channel")]
    Receive(#[source] std::io::Error),
    #[error("a message on the egress worker's channel is not valid")]
    BadMessage(#[source] serde_json::Error),
    #[error("the first message to the egress worker must configure it")]
    NotConfigured,
    #[error("the egress worker's channel closed")]
    Closed,
    #[error("the egress worker cannot be confined: {0}")]
    Confine(String),
    #[error("the egress worker cannot start its runtime")]
    Runtime(#[source] std::io::Error),
}

fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, WorkerError> {
    serde_json::to_vec(message).map_err(WorkerError::BadMessage)
}

/// Sends one message with `fds` attached (blocking).
fn send(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), WorkerError> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(WorkerError::Send(std::io::Error::other(
            "too many descriptors for one message",
        )));
    }
    loop {
        match sendmsg(
            socket,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(WorkerError::Send(e.into())),
        }
    }
}

/// Receives one message and the descriptors it carries (blocking).
fn receive(
    socket: BorrowedFd<'_>,
    buffer: &mut [u8],
) -> Result<(usize, Vec<OwnedFd>), WorkerError> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        match recvmsg(
            socket,
            &mut [IoSliceMut::new(buffer)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(received) => break received,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(WorkerError::Receive(e.into())),
        }
    };
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if received.bytes == 0 {
        return Err(WorkerError::Closed);
    }
    if received.flags.contains(ReturnFlags::TRUNC) || received.flags.contains(ReturnFlags::CTRUNC) {
        return Err(WorkerError::Receive(std::io::Error::other(
            "a message was larger than the channel takes",
        )));
    }
    Ok((received.bytes, fds))
}

// ------------------------------------------------------------------ daemon side

/// What the daemon keeps of one attachment, to give it to a new worker.
struct Attached {
    sockets: Vec<OwnedFd>,
    tcp: usize,
    policy: NetworkPolicy,
}

struct ClientState {
    /// The daemon's end of the channel to the running worker.
    socket: Option<Arc<OwnedFd>>,
    attached: HashMap<String, Attached>,
}

/// The daemon's side: starts the worker, keeps it running, tells it what
/// to serve, and turns what it reports into [`EgressEvent`]s.
pub(crate) struct Client {
    spawn: WorkerSpawn,
    config: WorkerConfig,
    events: Events,
    state: Mutex<ClientState>,
}

impl Client {
    /// Starts the worker and the thread that watches it.
    pub(crate) fn start(
        spawn: WorkerSpawn,
        config: WorkerConfig,
        events: Events,
    ) -> Result<Arc<Client>, WorkerError> {
        let client = Arc::new(Client {
            spawn,
            config,
            events,
            state: Mutex::new(ClientState {
                socket: None,
                attached: HashMap::new(),
            }),
        });
        let (socket, child) = client.launch()?;
        let watcher = Arc::clone(&client);
        std::thread::Builder::new()
            .name("egress-worker".into())
            .spawn(move || watcher.watch(socket, child))
            .map_err(|e| WorkerError::Spawn {
                program: client.spawn.program.clone(),
                source: e,
            })?;
        Ok(client)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ClientState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a worker, configures it and gives it every attachment.
    fn launch(&self) -> Result<(Arc<OwnedFd>, Child), WorkerError> {
        let (ours, theirs) = socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| WorkerError::Channel(e.into()))?;
        // Root may give a policy of any size room in one datagram.
        let _ = rustix::net::sockopt::set_socket_send_buffer_size_force(&ours, MAX_MESSAGE * 2);
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&ours, MAX_MESSAGE * 2);
        let child = Command::new(&self.spawn.program)
            .args(&self.spawn.args)
            .uid(self.spawn.uid)
            .gid(self.spawn.gid)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| WorkerError::Spawn {
                program: self.spawn.program.clone(),
                source,
            })?;
        let socket = Arc::new(ours);
        send(
            socket.as_fd(),
            &encode(&ToWorker::Configure(self.config.clone()))?,
            &[],
        )?;
        let mut state = self.state();
        for (sandbox, attached) in &state.attached {
            send_attach(&socket, sandbox, attached)?;
        }
        state.socket = Some(Arc::clone(&socket));
        Ok((socket, child))
    }

    /// Reads the worker's reports until it dies, then starts another,
    /// pausing longer after each quick death.
    fn watch(self: Arc<Self>, mut socket: Arc<OwnedFd>, mut child: Child) {
        let mut pause = Duration::from_millis(100);
        loop {
            let started = Instant::now();
            let ended = self.read_reports(&socket);
            let _ = child.kill();
            let status = child.wait();
            self.state().socket = None;
            tracing::error!("the egress worker stopped ({ended}; {status:?}); starting another");
            if started.elapsed() > Duration::from_secs(60) {
                pause = Duration::from_millis(100);
            }
            loop {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(30));
                match self.launch() {
                    Ok((next_socket, next_child)) => {
                        socket = next_socket;
                        child = next_child;
                        break;
                    }
                    Err(e) => tracing::error!("{}", crate::error_chain(&e)),
                }
            }
        }
    }

    fn read_reports(&self, socket: &OwnedFd) -> String {
        let mut buffer = vec![0u8; MAX_MESSAGE];
        loop {
            let (n, fds) = match receive(socket.as_fd(), &mut buffer) {
                Ok(received) => received,
                Err(e) => return crate::error_chain(&e),
            };
            drop(fds); // the worker sends none
            match serde_json::from_slice::<FromWorker>(&buffer[..n]) {
                Ok(report) => self.report(report),
                Err(e) => return format!("it sent a message that is not valid: {e}"),
            }
        }
    }

    /// Passes a worker's event on, if it names what the daemon knows.
    fn report(&self, report: FromWorker) {
        let FromWorker::Event {
            sandbox,
            protocol,
            destination,
            port,
            allowed,
            reason,
            rule,
        } = report;
        let protocol = match protocol.as_str() {
            "tcp" => "tcp",
            "dns" => "dns",
            _ => return,
        };
        let Some(reason) = REASONS.iter().copied().find(|r| *r == reason) else {
            return;
        };
        if !self.state().attached.contains_key(&sandbox) {
            return;
        }
        (self.events)(EgressEvent {
            sandbox,
            protocol,
            destination: destination.chars().take(MAX_TEXT).collect(),
            port,
            allowed,
            reason,
            rule: rule.map(|r| r.chars().take(MAX_TEXT).collect()),
        });
    }

    /// Sends `message` to the running worker, if there is one: one that is
    /// being started again gets every attachment as it starts.
    fn tell(&self, state: &ClientState, message: &ToWorker) {
        let Some(socket) = &state.socket else { return };
        let sent = encode(message).and_then(|bytes| send(socket.as_fd(), &bytes, &[]));
        if let Err(e) = sent {
            tracing::warn!("{}", crate::error_chain(&e));
        }
    }

    pub(crate) fn attach(
        &self,
        sandbox: &str,
        tcp: Vec<TcpListener>,
        dns: UdpSocket,
        policy: NetworkPolicy,
    ) -> Result<(), EgressError> {
        let count = tcp.len();
        let mut sockets: Vec<OwnedFd> = tcp.into_iter().map(OwnedFd::from).collect();
        sockets.push(OwnedFd::from(dns));
        let attached = Attached {
            sockets,
            tcp: count,
            policy,
        };
        let mut state = self.state();
        if let Some(socket) = &state.socket {
            send_attach(socket, sandbox, &attached)
                .map_err(|e| EgressError::Worker(Box::new(e)))?;
        }
        state.attached.insert(sandbox.to_owned(), attached);
        Ok(())
    }

    pub(crate) fn set_policy(&self, sandbox: &str, policy: NetworkPolicy) {
        let mut state = self.state();
        let message = ToWorker::SetPolicy {
            sandbox: sandbox.to_owned(),
            policy: policy.clone(),
        };
        if let Some(attached) = state.attached.get_mut(sandbox) {
            attached.policy = policy;
        }
        self.tell(&state, &message);
    }

    pub(crate) fn detach(&self, sandbox: &str) {
        let mut state = self.state();
        state.attached.remove(sandbox);
        self.tell(
            &state,
            &ToWorker::Detach {
                sandbox: sandbox.to_owned(),
            },
        );
    }
}

fn send_attach(socket: &OwnedFd, sandbox: &str, attached: &Attached) -> Result<(), WorkerError> {
    let bytes = encode(&ToWorker::Attach {
        sandbox: sandbox.to_owned(),
        tcp: attached.tcp,
        policy: attached.policy.clone(),
    })?;
    let fds: Vec<BorrowedFd<'_>> = attached.sockets.iter().map(AsFd::as_fd).collect();
    send(socket.as_fd(), &bytes, &fds)
}

// ------------------------------------------------------------------ worker side

/// The worker's main: reads its configuration from `channel`, builds its
/// resolver, calls `confine` (which must leave it unable to open files,
/// exec or gain privilege), then serves every attachment it is given until
/// the channel closes.
pub fn serve_worker(
    channel: OwnedFd,
    confine: impl FnOnce() -> Result<(), String>,
) -> Result<(), WorkerError> {
    let mut buffer = vec![0u8; MAX_MESSAGE];
    let (n, _) = receive(channel.as_fd(), &mut buffer)?;
    let ToWorker::Configure(config) =
        serde_json::from_slice(&buffer[..n]).map_err(WorkerError::BadMessage)?
    else {
        return Err(WorkerError::NotConfigured);
    };
    let resolver = match crate::resolver(&config.hosts, config.dns) {
        Ok(resolver) => resolver,
        Err(crate::ResolverError::System(e)) => {
            tracing::warn!("{e}; sandboxes will resolve no names");
            Arc::new(crate::HostsResolver::default())
        }
        Err(e) => return Err(WorkerError::Confine(e.to_string())),
    };
    confine().map_err(WorkerError::Confine)?;
    // Threads made from here on inherit the confinement.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("egress")
        .enable_all()
        .build()
        .map_err(WorkerError::Runtime)?;
    let channel = Arc::new(channel);
    let (reports, outbox) = std::sync::mpsc::sync_channel::<FromWorker>(4096);
    let sender = Arc::clone(&channel);
    std::thread::Builder::new()
        .name("egress-reports".into())
        .spawn(move || {
            for report in outbox {
                let sent = encode(&report).and_then(|bytes| send(sender.as_fd(), &bytes, &[]));
                if sent.is_err() {
                    break;
                }
            }
        })
        .map_err(WorkerError::Runtime)?;
    let events: Events = Arc::new(move |event: EgressEvent| {
        // A full queue drops the report: the daemon is behind, and a flood
        // is bounded by the path's own limits.
        let _ = reports.try_send(FromWorker::Event {
            sandbox: event.sandbox,
            protocol: event.protocol.to_owned(),
            destination: event.destination,
            port: event.port,
            allowed: event.allowed,
            reason: event.reason.to_owned(),
            rule: event.rule,
        });
    });
    let egress = crate::Egress::new(resolver, events).with_limits(config.limits);
    let mut serving: HashMap<String, crate::Attachment> = HashMap::new();
    loop {
        let (n, fds) = receive(channel.as_fd(), &mut buffer)?;
        let message: ToWorker =
            serde_json::from_slice(&buffer[..n]).map_err(WorkerError::BadMessage)?;
        match message {
            ToWorker::Configure(_) => {}
            ToWorker::Attach {
                sandbox,
                tcp,
                policy,
            } => {
                if fds.len() != tcp + 1 {
                    tracing::error!("an attach of {sandbox} carried {} sockets", fds.len());
                    continue;
                }
                let mut fds = fds;
                let dns = UdpSocket::from(fds.remove(tcp));
                let tcp = fds.into_iter().map(TcpListener::from).collect();
                let _guard = runtime.enter();
                match egress.serve(&sandbox, tcp, dns, policy) {
                    Ok(attachment) => {
                        serving.insert(sandbox, attachment);
                    }
                    Err(e) => tracing::error!("serving {sandbox}: {}", crate::error_chain(&e)),
                }
            }
            ToWorker::SetPolicy { sandbox, policy } => {
                if let Some(attachment) = serving.get(&sandbox) {
                    attachment.set_policy(policy);
                }
            }
            ToWorker::Detach { sandbox } => {
                let _guard = runtime.enter();
                serving.remove(&sandbox);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_policy::network::{DeniedRange, DenyReason};

    #[test]
    fn every_reason_the_path_gives_is_known() {
        for reason in [
            DenyReason::PolicyNone,
            DenyReason::AlwaysDenied(DeniedRange::Loopback),
            DenyReason::NotAllowlisted,
            DenyReason::Denylisted,
            DenyReason::UnnamedNotAllowlisted,
            DenyReason::HostAddressMismatch,
            DenyReason::InvalidPort,
            DenyReason::HostAddress,
        ] {
            assert!(REASONS.contains(&reason.code()), "{}", reason.code());
        }
    }

    #[test]
    fn messages_and_descriptors_cross_the_channel() {
        let (a, b) = socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        let message = ToWorker::Detach {
            sandbox: "sbx-1".into(),
        };
        send(a.as_fd(), &encode(&message).unwrap(), &[udp.as_fd()]).unwrap();
        let mut buffer = vec![0u8; 4096];
        let (n, fds) = receive(b.as_fd(), &mut buffer).unwrap();
        let back: ToWorker = serde_json::from_slice(&buffer[..n]).unwrap();
        assert!(matches!(back, ToWorker::Detach { sandbox } if sandbox == "sbx-1"));
        let received = UdpSocket::from(fds.into_iter().next().unwrap());
        assert_eq!(
            received.local_addr().unwrap().port(),
            port,
            "the same socket"
        );
        drop(a);
        assert!(matches!(
            receive(b.as_fd(), &mut buffer),
            Err(WorkerError::Closed)
        ));
    }

    #[test]
    fn a_policy_of_the_largest_size_fits_one_message() {
        let rules: Vec<String> = (0..airlock_policy::network::MAX_RULES)
            .map(|n| format!("{0}.{0}.{0}{n}.example.com", "a".repeat(58)))
            .collect();
        let policy: NetworkPolicy =
            serde_json::from_value(serde_json::json!({"mode": "allow", "rules": rules})).unwrap();
        let bytes = encode(&ToWorker::Attach {
            sandbox: "sbx-1".into(),
            tcp: 2,
            policy,
        })
        .unwrap();
        assert!(bytes.len() < MAX_MESSAGE, "{} bytes", bytes.len());
    }
}
