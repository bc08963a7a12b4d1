//! One session with the host: the read loop, request dispatch and shutdown.
//!
//! The read loop never waits for a process or a disk: requests that take
//! time run in tasks of their own and answer through the [`Outbox`]. It does
//! wait when the outbox is full (the host is not reading) or when an open
//! write's small queue is full (the disk is slower than the host), which is
//! the backpressure the host sees.

use crate::failure::Failure;
use crate::files::{Files, WriteMsg, WriteTarget};
use crate::outbox::{self, Outbox, Sink};
use crate::process::{Processes, WaitOutcome};
use crate::reaper::{self, Reaper};
use crate::tunnel::{TunnelMsg, Tunnels};
use crate::watch::{WatchOptions, Watches};
use crate::{AgentConfig, AgentError, Channel};
use airlock_protocol::{read_frame, Event, Frame, FrameError, Request, Versions};
use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use tokio::io::{AsyncRead, BufReader};
use tokio::net::unix::OwnedReadHalf;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;

/// Read buffer of the host stream.
const READ_BUFFER: usize = 64 * 1024;

/// An open `write_file`, by request id.
enum WriteSlot {
    /// Frames go to the write task.
    Open(mpsc::Sender<WriteMsg>),
    /// The write was refused at once; its frames are ignored until `write_end`.
    Refused,
}

/// Why the read loop stopped.
enum Stop {
    /// The host closed the stream or it failed.
    Closed,
    /// The host sent a frame that cannot be read; the stream is out of step.
    Corrupt(FrameError),
    /// PID 1 got SIGTERM or SIGINT.
    Terminated,
}

struct Session {
    outbox: Outbox,
    processes: Arc<Processes>,
    files: Files,
    writes: HashMap<u64, WriteSlot>,
    watches: Watches,
    tunnels: Tunnels,
}

/// Ignores SIGPIPE so a closed host stream or stdin pipe is an `EPIPE`
/// error, not the agent's death. (Rust binaries already do this at start;
/// the agent does not rely on it.)
fn ignore_sigpipe() {
    // SAFETY: installing SIG_IGN for SIGPIPE replaces no handler that Rust
    // code depends on and touches no memory of ours; children get the
    // default back from std before exec.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Waits for SIGTERM or SIGINT; never, when not PID 1.
async fn terminated(signals: &mut Option<(Signal, Signal)>) {
    match signals {
        Some((term, int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// Serves one stream; see [`crate::serve`].
pub(crate) async fn run(config: AgentConfig, channel: Channel) -> Result<(), AgentError> {
    let pid1 = std::process::id() == 1;
    if config.drop_privileges {
        // Sandboxed code (even its root) must not ptrace the agent or read
        // its /proc entries. Best effort: failure leaves the default.
        let _ =
            rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    }
    ignore_sigpipe();

    let (read_half, sink): (Box<dyn AsyncRead + Send + Unpin>, Sink) = match channel {
        Channel::Socket(socket) => {
            let (read_half, write_half) = tokio_halves(socket)?;
            (Box::new(read_half), Sink::Socket(write_half))
        }
        Channel::Threaded(threaded) => (Box::new(threaded.input), Sink::Thread(threaded.output)),
    };
    let sigchld = signal(SignalKind::child()).map_err(AgentError::Signals)?;
    let mut term_signals = if pid1 {
        Some((
            signal(SignalKind::terminate()).map_err(AgentError::Signals)?,
            signal(SignalKind::interrupt()).map_err(AgentError::Signals)?,
        ))
    } else {
        None
    };

    let config = Arc::new(config);
    let (outbox, queue) = Outbox::new();
    let writer = tokio::spawn(outbox::write_loop(sink, queue));
    let reaper = Arc::new(Reaper::new(pid1));
    let reaper_task = tokio::spawn(reaper::run(Arc::clone(&reaper), Some(sigchld)));
    let keepalive_task = (!config.keepalive.is_zero()).then(|| {
        let outbox = outbox.clone();
        let every = config.keepalive;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                outbox.keepalive();
            }
        })
    });

    // Before any command runs, so no process of the sandbox can take the
    // name first.
    let sudo = match &config.sudo_socket {
        Some(name) => crate::sudo::Sudo::listen(name, Arc::clone(&config), Arc::clone(&reaper))
            .ok()
            .map(|(sudo, listener)| {
                let task = tokio::spawn(Arc::clone(&sudo).serve(listener));
                (sudo, task)
            }),
        None => None,
    };

    let files = Files::new(config.user_home.clone(), config.drop_privileges);
    let mut session = Session {
        outbox: outbox.clone(),
        processes: Arc::new(Processes::new(
            Arc::clone(&config),
            outbox.clone(),
            Arc::clone(&reaper),
        )),
        files: files.clone(),
        writes: HashMap::new(),
        watches: Watches::new(files, outbox),
        tunnels: Tunnels::default(),
    };

    let mut reader = BufReader::with_capacity(READ_BUFFER, read_half);
    let stop = loop {
        let frame = tokio::select! {
            frame = read_frame::<_, serde_json::Value>(&mut reader) => frame,
            _ = terminated(&mut term_signals) => break Stop::Terminated,
        };
        match frame {
            Ok(frame) => session.dispatch(frame).await,
            Err(FrameError::Closed | FrameError::Io(_)) => break Stop::Closed,
            Err(error) => break Stop::Corrupt(error),
        }
    };

    // Open writes and watches end without an answer: the host is gone or
    // going. Every watch closes its inotify descriptor.
    session.writes.clear();
    session.watches.close_all();
    session.tunnels.close_all();
    if let Some((sudo, task)) = sudo {
        task.abort();
        sudo.kill_all();
    }
    match stop {
        Stop::Terminated => session.processes.terminate_all().await,
        Stop::Closed | Stop::Corrupt(_) => session.processes.kill_all().await,
    }
    if let Some(task) = keepalive_task {
        task.abort();
    }
    reaper_task.abort();
    writer.abort();
    match stop {
        Stop::Corrupt(error) => Err(AgentError::Protocol(error)),
        Stop::Closed | Stop::Terminated => Ok(()),
    }
}

/// `socket` as the runtime's, split into its two directions.
fn tokio_halves(
    socket: UnixStream,
) -> Result<(OwnedReadHalf, tokio::net::unix::OwnedWriteHalf), AgentError> {
    socket.set_nonblocking(true).map_err(AgentError::Channel)?;
    let stream = tokio::net::UnixStream::from_std(socket).map_err(AgentError::Channel)?;
    Ok(stream.into_split())
}

impl Session {
    /// Handles one frame. Returns quickly: slow work runs in tasks.
    async fn dispatch(&mut self, frame: Frame<serde_json::Value>) {
        let id = frame.id;
        let request: Request = match serde_json::from_value(frame.msg) {
            Ok(request) => request,
            Err(error) => {
                self.outbox
                    .fail(
                        id,
                        Failure::invalid(format!("the request is not valid: {error}")),
                    )
                    .await;
                return;
            }
        };
        let payload = frame.payload;
        match request {
            Request::Hello { version, oldest } => {
                // The newest version both speak; a host of version 1 offers
                // only its own.
                let offered = Versions::offered(version, oldest);
                let answer = match Versions::OURS.highest_common(offered) {
                    Some(version) => Ok(Event::Hello {
                        version,
                        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
                    }),
                    None => Err(Failure::new(
                        airlock_protocol::ErrorKind::UnsupportedVersion,
                        format!(
                            "the host speaks protocol version {offered}; \
                             this agent speaks {}",
                            Versions::OURS
                        ),
                    )),
                };
                self.outbox.answer(id, answer).await;
            }
            Request::Ping => {
                self.outbox.send(id, Event::Pong).await;
            }
            Request::Spawn(spawn) => self.processes.spawn(id, spawn),
            Request::WriteStdin { pid } => {
                if let Err(failure) = self.processes.write_stdin(id, pid, payload) {
                    self.outbox.fail(id, failure).await;
                }
            }
            Request::CloseStdin { pid } => {
                if let Err(failure) = self.processes.close_stdin(id, pid) {
                    self.outbox.fail(id, failure).await;
                }
            }
            Request::Resize { pid, cols, rows } => {
                let answer = self
                    .processes
                    .resize(pid, airlock_protocol::PtySize { cols, rows });
                self.outbox.answer(id, answer).await;
            }
            Request::Signal { pid, signal } => {
                let answer = self.processes.signal(pid, signal);
                self.outbox.answer(id, answer).await;
            }
            Request::ListProcesses => {
                let answer = self.processes.list();
                self.outbox.send(id, answer).await;
            }
            Request::Wait { pid } => match self.processes.wait(pid) {
                Ok(WaitOutcome::Ended(status)) => {
                    self.outbox.send(id, Event::Exited(status)).await;
                }
                Ok(WaitOutcome::Pending(rx)) => {
                    let outbox = self.outbox.clone();
                    tokio::spawn(async move {
                        if let Ok(status) = rx.await {
                            outbox.send(id, Event::Exited(status)).await;
                        }
                    });
                }
                Err(failure) => {
                    self.outbox.fail(id, failure).await;
                }
            },
            Request::ReadFile {
                path,
                offset,
                length,
            } => {
                let (files, outbox) = (self.files.clone(), self.outbox.clone());
                tokio::spawn(async move {
                    let answer = files.read(&outbox, id, &path, offset, length).await;
                    outbox.answer(id, answer).await;
                });
            }
            Request::WriteFile {
                path,
                mode,
                create_parents,
                append,
                owner,
                xattrs,
            } => {
                let target =
                    self.files
                        .write_target(&path, mode, create_parents, append, owner, xattrs);
                self.open_write(id, target).await
            }
            Request::Extract { dir } => self.open_extract(id, &dir).await,
            Request::WriteData if self.tunnels.holds(id) => {
                self.tunnels.deliver(id, TunnelMsg::Data(payload)).await
            }
            Request::WriteEnd if self.tunnels.holds(id) => {
                self.tunnels.deliver(id, TunnelMsg::End).await
            }
            Request::WriteData => match self.writes.get(&id) {
                Some(WriteSlot::Open(tx)) => {
                    // An error ends the task's interest; the frame is dropped.
                    let _ = tx.send(WriteMsg::Data(payload)).await;
                }
                Some(WriteSlot::Refused) => {}
                None => self.no_write(id).await,
            },
            Request::WriteEnd => match self.writes.remove(&id) {
                Some(WriteSlot::Open(tx)) => {
                    let _ = tx.send(WriteMsg::End).await;
                }
                Some(WriteSlot::Refused) => {}
                None => self.no_write(id).await,
            },
            Request::Stat { path, xattrs } => {
                self.file_task(
                    id,
                    move |files| async move { files.stat(&path, xattrs).await },
                )
            }
            Request::ListDir { path, depth } => self.file_task(id, move |files| async move {
                files.list_dir(&path, depth).await
            }),
            Request::ListDirPage {
                path,
                depth,
                after,
                limit,
            } => self.file_task(id, move |files| async move {
                files.list_dir_page(&path, depth, after, limit).await
            }),
            Request::ListDirStream {
                path,
                depth,
                limit,
                xattrs,
            } => {
                let (files, outbox) = (self.files.clone(), self.outbox.clone());
                tokio::spawn(async move {
                    let answer = files
                        .list_dir_stream(&outbox, id, &path, depth, limit, xattrs)
                        .await;
                    outbox.answer(id, answer).await;
                });
            }
            Request::MakeDir {
                path,
                parents,
                mode,
                owner,
            } => self.file_task(id, move |files| async move {
                files.make_dir(&path, parents, mode, owner).await
            }),
            Request::Remove { path, recursive } => self.file_task(id, move |files| async move {
                files.remove(&path, recursive).await
            }),
            Request::Rename { from, to } => {
                self.file_task(
                    id,
                    move |files| async move { files.rename(&from, &to).await },
                )
            }
            // Waits until the watch is in place, so requests after it see it.
            Request::Watch {
                path,
                recursive,
                entries,
                xattrs,
                local_only,
            } => {
                let options = WatchOptions {
                    recursive,
                    entries: entries.then_some(xattrs),
                    local_only,
                };
                self.watches.start(id, &path, options).await
            }
            Request::Cancel { target } => {
                if !self.tunnels.cancel(id, target) {
                    self.watches.cancel(id, target).await
                }
            }
            Request::Connect { port } => self.tunnels.connect(&self.outbox, id, port).await,
        }
    }

    /// Runs a file operation in a task and sends its answer.
    fn file_task<F, Fut>(&self, id: u64, work: F)
    where
        F: FnOnce(Files) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Event, Failure>> + Send + 'static,
    {
        let (files, outbox) = (self.files.clone(), self.outbox.clone());
        tokio::spawn(async move {
            let answer = work(files).await;
            outbox.answer(id, answer).await;
        });
    }

    async fn open_write(&mut self, id: u64, target: Result<WriteTarget, Failure>) {
        if self.writes.contains_key(&id) {
            self.outbox
                .fail(
                    id,
                    Failure::invalid(format!("a write with id {id} is already open")),
                )
                .await;
            return;
        }
        match target {
            Ok(target) => {
                let tx = self.files.start_write(self.outbox.clone(), id, target);
                self.writes.insert(id, WriteSlot::Open(tx));
            }
            Err(failure) => {
                self.writes.insert(id, WriteSlot::Refused);
                self.outbox.fail(id, failure).await;
            }
        }
    }

    async fn open_extract(&mut self, id: u64, dir: &str) {
        if self.writes.contains_key(&id) {
            self.outbox
                .fail(
                    id,
                    Failure::invalid(format!("a write with id {id} is already open")),
                )
                .await;
            return;
        }
        match self.files.start_extract(self.outbox.clone(), id, dir) {
            Ok(tx) => {
                self.writes.insert(id, WriteSlot::Open(tx));
            }
            Err(failure) => {
                self.writes.insert(id, WriteSlot::Refused);
                self.outbox.fail(id, failure).await;
            }
        }
    }

    async fn no_write(&self, id: u64) {
        self.outbox
            .fail(
                id,
                Failure::invalid(format!("no write_file is open with id {id}")),
            )
            .await;
    }
}
