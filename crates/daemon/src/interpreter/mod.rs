//! The code interpreter: persistent interpreters ("kernels") inside a
//! sandbox, one per code context, that run cells and keep their state.
//!
//! A kernel is an ordinary process the agent starts in the sandbox, with
//! the sandbox's user, limits and filesystem: `python3 -c <python.py>` or
//! `node -e <javascript.js>`, both shipped inside this binary. It reads one
//! request per line on its stdin and writes the user's output and its own
//! messages (results, errors, the execution count, the end of an execution)
//! on its stdout and stderr; [`stream`] tells them apart. Nothing is
//! evaluated outside the sandbox: results are what the kernel printed.
//!
//! One execution runs at a time per context (others wait their turn, as in
//! Jupyter). A client that goes away mid-execution interrupts it (SIGINT);
//! a kernel that does not finish within [`INTERRUPT_GRACE`] after that is
//! killed and replaced on the next execution. A kernel that dies (the cell
//! called `os._exit`, the memory limit) ends its execution with a
//! `DeadKernelError` and is started afresh, without its state, next time.
//! Kernels end with their sandbox; they are not listed among its processes.

pub mod stream;

use crate::audit::now_ms;
use crate::{closed, identity, Daemon, DaemonError, LiveSandbox};
use airlock_policy::RunAs;
use airlock_protocol::{Event, Events, Request, SpawnRequest};
use airlock_store::Stream;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stream::{KernelMessage, Piece, StreamParser};
use tokio::sync::mpsc;

/// The Python kernel's source.
const PYTHON_KERNEL: &str = include_str!("python.py");
/// The JavaScript kernel's source.
const JAVASCRIPT_KERNEL: &str = include_str!("javascript.js");

/// How long an interrupted execution may take to finish before its kernel
/// is killed.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(3);
/// Code contexts one sandbox may have.
pub const MAX_CONTEXTS: usize = 32;
/// Bytes of code one execution may carry.
pub const MAX_CODE_BYTES: usize = 4 << 20;
/// Events buffered between a kernel and the client of its execution.
const EVENTS_QUEUED: usize = 256;

/// The language of a code context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Python,
    JavaScript,
}

impl Language {
    /// The language a client named; Python when it named none.
    pub fn parse(name: Option<&str>) -> Result<Language, DaemonError> {
        match name.map(|n| n.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("python") | Some("python3") => Ok(Language::Python),
            Some("javascript") | Some("js") | Some("node") => Ok(Language::JavaScript),
            Some(other) => Err(DaemonError::BadInput(format!(
                "the code interpreter runs python and javascript, not {other:?}"
            ))),
        }
    }

    /// The name clients see.
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::JavaScript => "javascript",
        }
    }

    /// The program and arguments that start a kernel marked with `nonce`.
    fn command(self, nonce: &str) -> (String, Vec<String>) {
        match self {
            Language::Python => (
                "python3".into(),
                vec!["-c".into(), PYTHON_KERNEL.into(), nonce.into()],
            ),
            Language::JavaScript => (
                "node".into(),
                vec!["-e".into(), JAVASCRIPT_KERNEL.into(), nonce.into()],
            ),
        }
    }
}

/// A code context as clients see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeContextView {
    pub id: String,
    pub language: Language,
    pub cwd: String,
}

/// What an execution produces, in order. The stream of events ends when
/// the execution does.
#[derive(Debug, Clone, PartialEq)]
pub enum CodeEvent {
    /// A line (or the part of one written so far) of standard output.
    Stdout(String),
    /// A line of standard error.
    Stderr(String),
    /// A value to show: the cell's own (`main`) or one it displayed.
    Result {
        main: bool,
        data: Map<String, Value>,
    },
    /// The cell raised, or its kernel died.
    Error {
        name: String,
        value: String,
        traceback: String,
    },
    /// The context's execution counter after this execution.
    ExecutionCount(u64),
}

/// One execution.
#[derive(Debug, Clone, Default)]
pub struct RunCode {
    pub code: String,
    /// The context to run in; the language's default context when absent.
    pub context: Option<String>,
    /// The language of the default context to run in (with no `context`).
    pub language: Option<String>,
    /// Set in the kernel's environment for this execution only.
    pub env: BTreeMap<String, String>,
}

/// The code contexts of one sandbox.
#[derive(Default)]
pub(crate) struct CodeContexts {
    contexts: Mutex<BTreeMap<String, Arc<CodeContext>>>,
}

impl CodeContexts {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<CodeContext>>> {
        self.contexts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pids of the kernels running now (hidden from process listings).
    pub(crate) fn kernel_pids(&self) -> Vec<u32> {
        self.lock()
            .values()
            .map(|c| c.pid.load(Ordering::Relaxed))
            .filter(|&pid| pid != 0)
            .collect()
    }
}

struct CodeContext {
    view: CodeContextView,
    /// Whether this is its language's default context.
    default: bool,
    user: RunAs,
    /// The kernel, held by the execution running now.
    kernel: Arc<tokio::sync::Mutex<Option<Kernel>>>,
    /// The running kernel's pid (0 when none), readable without waiting
    /// for the execution that holds `kernel`.
    pid: AtomicU32,
}

/// A running kernel and what its pump task forwards.
struct Kernel {
    pid: u32,
    items: mpsc::Receiver<Item>,
    /// Whether an execution reads `items`; the pump drops output otherwise.
    executing: Arc<AtomicBool>,
    /// Cleared by the pump when the kernel process is gone.
    alive: Arc<AtomicBool>,
}

/// What a kernel's pump forwards.
enum Item {
    Stdout(Piece),
    Stderr(Piece),
    /// The kernel is gone, and why.
    Gone(String),
}

impl Daemon {
    /// The code contexts of sandbox `id`.
    pub fn code_contexts(&self, id: &str) -> Result<Vec<CodeContextView>, DaemonError> {
        let sandbox = self.running(id)?;
        let contexts = sandbox.interpreters.lock();
        Ok(contexts.values().map(|c| c.view.clone()).collect())
    }

    /// Creates a code context and starts its kernel.
    pub async fn create_code_context(
        &self,
        id: &str,
        language: Option<&str>,
        cwd: Option<String>,
        request_id: &str,
    ) -> Result<CodeContextView, DaemonError> {
        let language = Language::parse(language)?;
        let context = self.new_context(id, language, cwd, false)?;
        if let Err(e) = self.ensure_kernel(id, &context).await {
            let sandbox = self.running(id)?;
            sandbox.interpreters.lock().remove(&context.view.id);
            return Err(e);
        }
        self.inner.audit.record(
            Stream::Runtime,
            "code.context_created",
            Some(id),
            Some(request_id),
            json!({"context": context.view.id, "language": language.name(), "cwd": context.view.cwd}),
        );
        Ok(context.view.clone())
    }

    /// Starts the default context of `language` ahead of its first
    /// execution, so that one does not wait for the interpreter to start.
    /// Meant to run in the background after a create; failures are left
    /// for the first execution to report.
    pub async fn prepare_code_context(&self, id: &str, language: Language) {
        if let Ok(context) = self.default_context(id, language) {
            let _ = self.ensure_kernel(id, &context).await;
        }
    }

    /// Removes a code context; its kernel is killed.
    pub async fn remove_code_context(&self, id: &str, context: &str) -> Result<(), DaemonError> {
        let sandbox = self.running(id)?;
        let removed = sandbox
            .interpreters
            .lock()
            .remove(context)
            .ok_or_else(|| no_context(context))?;
        self.kill_kernel(id, &removed).await;
        Ok(())
    }

    /// Replaces a context's kernel with a fresh one: its state is gone, an
    /// execution running in it ends with an error.
    pub async fn restart_code_context(&self, id: &str, context: &str) -> Result<(), DaemonError> {
        let context = self.context(id, context)?;
        self.kill_kernel(id, &context).await;
        {
            let mut kernel = context.kernel.lock().await;
            *kernel = None;
        }
        self.ensure_kernel(id, &context).await
    }

    /// Runs a cell. Returns once the kernel has the code, with the
    /// execution's events; dropping the receiver interrupts the execution.
    pub async fn run_code(
        &self,
        id: &str,
        run: RunCode,
        request_id: &str,
    ) -> Result<mpsc::Receiver<CodeEvent>, DaemonError> {
        if run.code.len() > MAX_CODE_BYTES {
            return Err(DaemonError::TooLarge(format!(
                "code is limited to {MAX_CODE_BYTES} bytes"
            )));
        }
        let context = match (&run.context, &run.language) {
            (Some(_), Some(_)) => {
                return Err(DaemonError::BadInput(
                    "give a context or a language, not both".into(),
                ))
            }
            (Some(context), None) => self.context(id, context)?,
            (None, language) => {
                let language = Language::parse(language.as_deref())?;
                self.default_context(id, language)?
            }
        };
        let mut guard = Arc::clone(&context.kernel).lock_owned().await;
        // A kernel that died between executions is replaced (with a new
        // execution count, as Jupyter's restarted kernels have).
        if guard
            .as_ref()
            .is_some_and(|k| !k.alive.load(Ordering::SeqCst))
        {
            *guard = None;
        }
        if guard.is_none() {
            *guard = Some(self.start_kernel(id, &context).await?);
        }
        let Some(kernel) = guard.as_mut() else {
            return Err(DaemonError::Internal("the kernel vanished".into()));
        };
        let mut line = serde_json::to_vec(&json!({"code": run.code, "env": run.env}))
            .map_err(|e| DaemonError::Internal(format!("cannot encode a cell: {e}")))?;
        line.push(b'\n');
        let pid = kernel.pid;
        kernel.executing.store(true, Ordering::SeqCst);
        if let Err(e) = self.write_stdin(id, pid, line).await {
            kernel.executing.store(false, Ordering::SeqCst);
            *guard = None;
            context.pid.store(0, Ordering::Relaxed);
            return Err(match e {
                DaemonError::NotRunning(_) => e,
                _ => DaemonError::Conflict(
                    "the context's interpreter stopped; run the code again to restart it".into(),
                ),
            });
        }
        self.inner.audit.record(
            Stream::Runtime,
            "code.executed",
            Some(id),
            Some(request_id),
            json!({"context": context.view.id, "bytes": run.code.len(), "at": now_ms()}),
        );
        let (events, receiver) = mpsc::channel(EVENTS_QUEUED);
        let daemon = self.clone();
        let sandbox_id = id.to_owned();
        tokio::spawn(async move {
            let gone = forward(&daemon, &sandbox_id, &mut guard, events).await;
            if gone {
                *guard = None;
                context.pid.store(0, Ordering::Relaxed);
            } else if let Some(kernel) = guard.as_ref() {
                kernel.executing.store(false, Ordering::SeqCst);
            }
        });
        Ok(receiver)
    }

    fn context(&self, id: &str, context: &str) -> Result<Arc<CodeContext>, DaemonError> {
        let sandbox = self.running(id)?;
        let contexts = sandbox.interpreters.lock();
        contexts
            .get(context)
            .cloned()
            .ok_or_else(|| no_context(context))
    }

    /// The default context of `language`, created on first use.
    fn default_context(
        &self,
        id: &str,
        language: Language,
    ) -> Result<Arc<CodeContext>, DaemonError> {
        let sandbox = self.running(id)?;
        let existing = sandbox
            .interpreters
            .lock()
            .values()
            .find(|c| c.default && c.view.language == language)
            .cloned();
        match existing {
            Some(context) => Ok(context),
            None => self.new_context(id, language, None, true),
        }
    }

    fn new_context(
        &self,
        id: &str,
        language: Language,
        cwd: Option<String>,
        default: bool,
    ) -> Result<Arc<CodeContext>, DaemonError> {
        let sandbox = self.running(id)?;
        let user = sandbox.spec.user;
        let cwd = match cwd.filter(|c| !c.is_empty()) {
            Some(cwd) if !cwd.starts_with('/') || cwd.contains('\0') => {
                return Err(DaemonError::BadInput(
                    "cwd must be an absolute path without NUL".into(),
                ))
            }
            Some(cwd) => cwd,
            None => sandbox
                .spec
                .cwd
                .clone()
                .unwrap_or_else(|| user.home().to_owned()),
        };
        let context_id = new_context_id()?;
        let context = Arc::new(CodeContext {
            view: CodeContextView {
                id: context_id.clone(),
                language,
                cwd,
            },
            default,
            user,
            kernel: Arc::new(tokio::sync::Mutex::new(None)),
            pid: AtomicU32::new(0),
        });
        let mut contexts = sandbox.interpreters.lock();
        if default {
            // Two first executions raced: keep the one that got here first.
            if let Some(existing) = contexts
                .values()
                .find(|c| c.default && c.view.language == language)
            {
                return Ok(Arc::clone(existing));
            }
        }
        if contexts.len() >= MAX_CONTEXTS {
            return Err(DaemonError::Conflict(format!(
                "a sandbox may have at most {MAX_CONTEXTS} code contexts; remove one first"
            )));
        }
        contexts.insert(context_id, Arc::clone(&context));
        Ok(context)
    }

    async fn ensure_kernel(&self, id: &str, context: &Arc<CodeContext>) -> Result<(), DaemonError> {
        let mut kernel = context.kernel.lock().await;
        if kernel.is_none() {
            *kernel = Some(self.start_kernel(id, context).await?);
        }
        Ok(())
    }

    async fn kill_kernel(&self, id: &str, context: &CodeContext) {
        let pid = context.pid.swap(0, Ordering::Relaxed);
        if pid != 0 {
            // Gone already is as good as killed.
            let _ = self.signal(id, pid, 9).await;
        }
    }

    async fn start_kernel(&self, id: &str, context: &CodeContext) -> Result<Kernel, DaemonError> {
        let sandbox = self.running(id)?;
        let nonce = airlock_store::new_secret("")
            .map_err(|e| DaemonError::Internal(format!("cannot draw a kernel nonce: {e}")))?;
        let language = context.view.language;
        let (cmd, args) = language.command(&nonce[..32]);
        let limits = &sandbox.spec.limits;
        let mut events = sandbox
            .agent()
            .request(Request::Spawn(SpawnRequest {
                cmd: cmd.clone(),
                args,
                env: sandbox.spec.process_env(context.user),
                cwd: Some(context.view.cwd.clone()),
                user: identity(context.user),
                stdin: true,
                pty: None,
                timeout_ms: None,
                // A kernel lives for many executions; each is bounded by
                // its client, not by a lifetime cap.
                output_limit: u64::MAX,
                limits: crate::process_limits(limits),
            }))
            .await
            .map_err(closed(id))?;
        let pid = match events.next().await.map_err(closed(id))? {
            Some(frame) => match frame.msg {
                Event::Started { pid } => pid,
                Event::Error { kind, message } => {
                    let missing = kind == airlock_protocol::ErrorKind::NotFound
                        && !message.contains(&context.view.cwd);
                    return Err(if missing {
                        missing_interpreter(language, &cmd)
                    } else {
                        DaemonError::from_agent(kind, message)
                    });
                }
                other => return Err(crate::unexpected(&other)),
            },
            None => return Err(DaemonError::NotRunning(id.to_owned())),
        };
        context.pid.store(pid, Ordering::Relaxed);
        let (items, receiver) = mpsc::channel(EVENTS_QUEUED);
        let executing = Arc::new(AtomicBool::new(false));
        let alive = Arc::new(AtomicBool::new(true));
        tokio::spawn(pump(
            events,
            StreamParser::new(&nonce[..32]),
            StreamParser::new(&nonce[..32]),
            items,
            Arc::clone(&executing),
            Arc::clone(&alive),
        ));
        Ok(Kernel {
            pid,
            items: receiver,
            executing,
            alive,
        })
    }
}

/// Reads a kernel's events from the agent for as long as it lives (the
/// agent connection must never wait on a stream nobody reads) and forwards
/// them while an execution is running.
async fn pump(
    mut events: Events,
    mut stdout: StreamParser,
    mut stderr: StreamParser,
    items: mpsc::Sender<Item>,
    executing: Arc<AtomicBool>,
    alive: Arc<AtomicBool>,
) {
    let gone = loop {
        let frame = match events.next().await {
            Ok(Some(frame)) => frame,
            Ok(None) | Err(_) => break "the sandbox went away".to_owned(),
        };
        let pieces: Vec<Item> = match frame.msg {
            Event::Stdout => stdout
                .push(&frame.payload)
                .into_iter()
                .map(Item::Stdout)
                .collect(),
            Event::Stderr => stderr
                .push(&frame.payload)
                .into_iter()
                .map(Item::Stderr)
                .collect(),
            Event::Exited(status) => {
                break match (status.code, status.signal) {
                    _ if status.oom => {
                        "the interpreter was killed: the sandbox ran out of memory".to_owned()
                    }
                    (Some(code), _) => format!("the interpreter exited with code {code}"),
                    (None, Some(signal)) => {
                        format!("the interpreter was killed by signal {signal}")
                    }
                    (None, None) => "the interpreter ended".to_owned(),
                }
            }
            Event::Error { message, .. } => break format!("the interpreter failed: {message}"),
            _ => Vec::new(),
        };
        // Between executions (a thread of the cell still printing) output
        // has no client and is dropped.
        if !executing.load(Ordering::SeqCst) {
            continue;
        }
        for item in pieces {
            // An error means the kernel was dropped (its context removed or
            // restarted); reading goes on so the agent is never held up.
            let _ = items.send(item).await;
        }
    };
    alive.store(false, Ordering::SeqCst);
    let _ = items.try_send(Item::Gone(gone));
}

/// Forwards one execution's items to its client until both of the
/// kernel's streams have ended it. Returns whether the kernel is gone.
async fn forward(
    daemon: &Daemon,
    id: &str,
    guard: &mut tokio::sync::OwnedMutexGuard<Option<Kernel>>,
    events: mpsc::Sender<CodeEvent>,
) -> bool {
    let Some(kernel) = guard.as_mut() else {
        return true;
    };
    let pid = kernel.pid;
    let mut ended = (false, false);
    let mut interrupted: Option<tokio::time::Instant> = None;
    while !(ended.0 && ended.1) {
        let item = tokio::select! {
            item = kernel.items.recv() => item,
            () = events.closed(), if interrupted.is_none() => {
                // The client went away: stop the cell, then drain.
                let _ = daemon.signal(id, pid, 2).await;
                interrupted = Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
                continue;
            }
            () = sleep_until(interrupted) => {
                let _ = daemon.signal(id, pid, 9).await;
                return true;
            }
        };
        let (from_stderr, piece) = match item {
            None | Some(Item::Gone(_)) => {
                let reason = match item {
                    Some(Item::Gone(reason)) => reason,
                    _ => "the interpreter ended".to_owned(),
                };
                let _ = events
                    .send(CodeEvent::Error {
                        name: "DeadKernelError".into(),
                        value: format!(
                            "{reason}; the next execution starts a new one, without this one's state"
                        ),
                        traceback: String::new(),
                    })
                    .await;
                return true;
            }
            Some(Item::Stdout(piece)) => (false, piece),
            Some(Item::Stderr(piece)) => (true, piece),
        };
        let event = match piece {
            Piece::Text(text) if from_stderr => CodeEvent::Stderr(text),
            Piece::Text(text) => CodeEvent::Stdout(text),
            Piece::Message(KernelMessage::End) => {
                if from_stderr {
                    ended.1 = true;
                } else {
                    ended.0 = true;
                }
                continue;
            }
            Piece::Message(KernelMessage::Count { n }) => CodeEvent::ExecutionCount(n),
            Piece::Message(KernelMessage::Result { main, data }) => {
                CodeEvent::Result { main, data }
            }
            Piece::Message(KernelMessage::Error {
                name,
                value,
                traceback,
            }) => CodeEvent::Error {
                name,
                value,
                traceback,
            },
        };
        // A client that left is not waited for; the kernel still is.
        let _ = events.send(event).await;
    }
    false
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The template lacks the program a language's kernel runs on.
fn missing_interpreter(language: Language, cmd: &str) -> DaemonError {
    DaemonError::BadInput(format!(
        "{} contexts need {cmd}, which this sandbox's template does not have",
        language.name()
    ))
}

fn no_context(context: &str) -> DaemonError {
    DaemonError::NotFound(format!("there is no code context {context}"))
}

/// A fresh context id, shaped like a UUID.
fn new_context_id() -> Result<String, DaemonError> {
    let hex = airlock_store::new_secret("")
        .map_err(|e| DaemonError::Internal(format!("cannot draw a context id: {e}")))?;
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

impl LiveSandbox {
    /// Pids of its code contexts' kernels.
    pub(crate) fn kernel_pids(&self) -> Vec<u32> {
        self.interpreters.kernel_pids()
    }
}
