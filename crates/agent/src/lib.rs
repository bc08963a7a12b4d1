//! The in-sandbox agent: PID 1 of every sandbox.
//!
//! The agent serves the host over one byte stream using the framed protocol
//! of `airlock-protocol`: it starts processes and streams their output, feeds
//! their stdin, signals and reaps them, reads, writes and lists files, and
//! watches directories for changes.
//! It knows nothing of the host: every path it touches is a path inside the
//! sandbox, because the agent itself lives in the sandbox root.
//!
//! The one entry point is [`serve`]. It runs a single-threaded tokio runtime
//! (plus at most four blocking threads for file work,
//! since the sandbox has a pids limit) and returns when the host closes the
//! stream, after killing every process it started.
//!
//! # Behaviour worth knowing on the host side
//!
//! - Every request gets exactly one final event; `spawn` gets `started`,
//!   output chunks (at most 64 KiB each), then `exited` after all output.
//! - Output past `output_limit` is cut at exactly the cap and the read end of
//!   that pipe is closed, so the process gets `SIGPIPE`/`EPIPE` on its next
//!   write (`yes` ends instead of spinning); the exit status says which
//!   stream was truncated.
//! - After a process exits, its output is forwarded until the pipes reach
//!   EOF or stay silent for 100 ms (a backgrounded grandchild may hold them
//!   forever), then `exited` goes out.
//! - `write_stdin` is answered once its bytes are in the pipe: wait for that
//!   `done` before sending more to get backpressure on that process alone.
//! - Keepalives on id 0 are skipped while the outgoing queue is busy.
//! - `watch` is in place before the agent reads the next request, so a
//!   change made after the answer to any later request is reported. Each
//!   watch has its own inotify instance; at most 64 are open per session
//!   and a recursive watch covers at most 8192 directories. A rename within
//!   the watch is two `rename` events, old path then new path. Removing or
//!   moving the watched directory itself sends `remove`/`rename` of it and
//!   ends the watch with `not_found`; a kernel queue overflow ends it with
//!   `io`. `cancel`'s `done` follows the cancelled watch's final `done`.
//! - Extended attributes (protocol version 4) are only ever `user.*` ones
//!   under the prefix a request names. A `write_file` with some sets (or
//!   clears) them before truncating or writing, so one the filesystem
//!   refuses (`unsupported`, e.g. gVisor's gofer, which has none to
//!   clear) leaves the file as it was. Reads skip
//!   names or values that are not UTF-8 and stop at `MAX_XATTR_BYTES` per
//!   entry; a listing asks each filesystem once whether it has any.
//! - A watch asked for `entries` stats (and reads the attributes of) what
//!   each `create`, `write` and `chmod` names when it sends the event, so
//!   an entry shows the file as it is then, not as it was at the change.
//! - Closing the stream kills every process group the agent started and
//!   reaps them before [`serve`] returns; open watches end without a final
//!   event and their inotify descriptors are closed.
//!
//! # Module map
//!
//! - `session`: the read loop, request dispatch and shutdown.
//! - `outbox`: the single writer task and its bounded queue (backpressure).
//! - `process`: spawning, output pumps, stdin queues, signals, waits.
//! - `reaper`: `SIGCHLD` handling and `waitpid`.
//! - `privileges`: what a child does between `fork` and `exec`.
//! - `files`: file operations.
//! - `watch`: `watch` and `cancel` (inotify).
//! - `failure`: mapping of OS errors onto protocol error kinds.
//! - `sudo`: `sudo` granted by the agent, and the shim that asks for it.
//! - `restorable`: a host channel pumped by blocking threads, for a tier
//!   that checkpoints and restores the sandbox (gVisor).

mod failure;
mod files;
mod line_signals;
mod outbox;
mod privileges;
pub use privileges::narrow_bounding_set;
mod process;
mod reaper;
pub mod restorable;
mod session;
mod spawn;
pub mod sudo;
mod tunnel;
mod watch;

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// How the agent behaves; filled by the CLI.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Interval of `Event::Keepalive` frames on id 0. Zero disables them.
    pub keepalive: Duration,
    /// True inside a sandbox, where the agent is root of a user namespace:
    /// children switch uid/gid and capabilities per `Identity`, and files
    /// created for `Identity::User` are chowned to 1000:1000. False in tests:
    /// children run as the current user and `Identity` only picks the home.
    pub drop_privileges: bool,
    /// Home and default working directory of `Identity::User`
    /// (`/home/user` in a sandbox); relative file paths are joined to it.
    pub user_home: PathBuf,
    /// Home and default working directory of `Identity::Root` (`/root`).
    pub root_home: PathBuf,
    /// The abstract socket name on which to grant `sudo` ([`sudo`]), when
    /// the sandbox's image has it; `None`: no sudo.
    pub sudo_socket: Option<String>,
}

/// Why [`serve`] failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The tokio runtime could not be built.
    #[error("the agent could not start its async runtime")]
    Runtime(#[source] std::io::Error),
    /// The host stream could not be registered with the runtime.
    #[error("the agent could not set up the host channel")]
    Channel(#[source] std::io::Error),
    /// A signal listener (`SIGCHLD`, `SIGTERM`, `SIGINT`) could not be installed.
    #[error("the agent could not listen for signals")]
    Signals(#[source] std::io::Error),
    /// The host sent a frame over the size limits, so the stream is out of
    /// step and cannot be read further. The agent still killed its processes.
    #[error("the host sent a frame the agent cannot read, so the stream was dropped")]
    Protocol(#[source] airlock_protocol::FrameError),
}

/// The agent's stream to the host.
#[derive(Debug)]
pub enum Channel {
    /// A socket the agent reads and writes itself (the process and oci
    /// tiers).
    Socket(UnixStream),
    /// A channel served by blocking threads
    /// ([`restorable::through_threads`]; the gvisor tier).
    Threaded(restorable::Threaded),
}

impl From<UnixStream> for Channel {
    fn from(socket: UnixStream) -> Self {
        Channel::Socket(socket)
    }
}

impl From<restorable::Threaded> for Channel {
    fn from(threaded: restorable::Threaded) -> Self {
        Channel::Threaded(threaded)
    }
}

/// Serves requests on `channel` until the host closes it; then kills every
/// process it started and returns.
///
/// Returns `Ok` when the host closed the stream (or it failed with an I/O
/// error), or, when the agent is PID 1, after `SIGTERM`/`SIGINT` and a
/// graceful stop of all processes. Returns [`AgentError::Protocol`] when the
/// host sent an oversized frame (after the same cleanup).
pub fn serve(config: AgentConfig, channel: impl Into<Channel>) -> Result<(), AgentError> {
    let channel = channel.into();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .build()
        .map_err(AgentError::Runtime)?;
    let result = runtime.block_on(session::run(config, channel));
    // Blocking file work that is still running (the host left mid-request)
    // is not waited for past this.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Locks a mutex, ignoring poisoning: every critical section in the agent is
/// a few map operations that leave the data consistent even if a holder
/// panicked.
fn locked<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
