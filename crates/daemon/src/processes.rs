//! Running processes in a sandbox: exec, list, attach, stdin, signals.

use crate::audit::now_ms;
use crate::exec::{pump, Attached, ProcessHub, ProcessView, ENDED_KEPT};
use crate::metrics::{ExecOutcome, OutcomeLabel};
use crate::{closed, identity, Daemon, DaemonError, LiveSandbox};
use airlock_policy::RunAs;
use airlock_protocol::{Event, PtySize, Request, SpawnRequest};
use airlock_store::Stream;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// What to run.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    /// Program; looked up in PATH when it has no `/`.
    pub cmd: String,
    /// Arguments after the program.
    pub args: Vec<String>,
    /// Added to the sandbox's environment.
    pub env: BTreeMap<String, String>,
    /// Working directory; the user's home when absent.
    pub cwd: Option<String>,
    /// Who runs it; the sandbox's default when absent.
    pub user: Option<RunAs>,
    /// Kill it after this long.
    pub timeout_ms: Option<u64>,
    /// Whether its stdin is a pipe fed through the API.
    pub stdin: bool,
    /// Run it on a new terminal of this size instead of pipes: the terminal
    /// is its input (`write_stdin`) and its output, which the hub carries
    /// as stdout (see [`ProcessHub::pty`]).
    pub pty: Option<PtySize>,
    /// A name to find it by later; unique among the sandbox's running
    /// processes.
    pub tag: Option<String>,
}

impl Daemon {
    /// Starts a process. Returns once it runs, with a client attached to its
    /// output from the first byte.
    pub async fn exec(
        &self,
        id: &str,
        request: ExecRequest,
        request_id: &str,
    ) -> Result<(Arc<ProcessHub>, Attached), DaemonError> {
        let sandbox = self.running(id)?;
        if request.cmd.is_empty() || request.cmd.contains('\0') {
            return Err(DaemonError::BadInput(
                "cmd must be a non-empty string without NUL".into(),
            ));
        }
        if let Some(tag) = &request.tag {
            let table = sandbox.processes.lock().unwrap_or_else(|p| p.into_inner());
            if table
                .hubs
                .values()
                .any(|hub| hub.running() && hub.tag.as_ref() == Some(tag))
            {
                return Err(DaemonError::Conflict(format!(
                    "a running process already has the tag {tag}"
                )));
            }
        }
        let user = request.user.unwrap_or(sandbox.spec.user);
        let mut env = sandbox.spec.process_env(user);
        env.extend(request.env.clone());
        let limits = &sandbox.spec.limits;
        let requested_at = Instant::now();
        let mut events = sandbox
            .agent()
            .request(Request::Spawn(SpawnRequest {
                cmd: request.cmd.clone(),
                args: request.args.clone(),
                env,
                cwd: request.cwd.clone().or_else(|| sandbox.spec.cwd.clone()),
                user: identity(user),
                stdin: request.stdin,
                pty: request.pty,
                timeout_ms: request.timeout_ms,
                output_limit: limits.output_bytes,
                limits: crate::process_limits(limits),
            }))
            .await
            .map_err(closed(id))?;
        // Read while the agent forks: the new process cannot have run yet,
        // and the cgroup reads stay off the round trip.
        let backend = self.inner.tiers.get(sandbox.spec.tier).ok().cloned();
        let before = match &backend {
            Some(b) => b.usage(id).await.unwrap_or_default(),
            None => Default::default(),
        };
        let pid = match events.next().await.map_err(closed(id))? {
            Some(frame) => match frame.msg {
                Event::Started { pid } => pid,
                Event::Error { kind, message } => {
                    self.count_exec(ExecOutcome::error);
                    return Err(DaemonError::from_agent(kind, message));
                }
                other => {
                    return Err(DaemonError::Internal(format!(
                        "the agent answered a spawn with {other:?}"
                    )))
                }
            },
            None => return Err(DaemonError::NotRunning(id.to_owned())),
        };
        let hub = Arc::new(
            ProcessHub::new(
                pid,
                request.cmd.clone(),
                request.args.clone(),
                identity(user),
                now_ms(),
            )
            .described(
                request.tag.clone(),
                request.env.clone(),
                request.cwd.clone(),
            )
            .on_terminal(request.pty.is_some()),
        );
        let attached = hub.attach();
        {
            let mut table = sandbox.processes.lock().unwrap_or_else(|p| p.into_inner());
            table.hubs.insert(pid, Arc::clone(&hub));
        }
        self.inner.audit.record(
            Stream::Runtime,
            "exec.started",
            Some(id),
            Some(request_id),
            json!({"pid": pid, "cmd": request.cmd, "args": request.args, "user": identity(user)}),
        );
        let daemon = self.clone();
        let pumped = Arc::clone(&hub);
        let request_id = request_id.to_owned();
        tokio::spawn(async move {
            let sandbox_id = sandbox.id.clone();
            let oom_check = move || async move {
                match backend {
                    Some(b) => b
                        .usage(&sandbox_id)
                        .await
                        .is_some_and(|after| after.oom_kills > before.oom_kills),
                    None => false,
                }
            };
            let finished = pump(&pumped, events, requested_at, oom_check).await;
            let after = daemon.usage(&sandbox.id).await;
            daemon.exec_finished(&sandbox, &pumped, finished, before, after, &request_id);
        });
        Ok((hub, attached))
    }

    fn count_exec(&self, outcome: ExecOutcome) {
        self.inner
            .metrics
            .execs
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    fn exec_finished(
        &self,
        sandbox: &Arc<LiveSandbox>,
        hub: &Arc<ProcessHub>,
        finished: crate::exec::Finished,
        before: airlock_backend::Usage,
        after: Option<airlock_backend::Usage>,
        request_id: &str,
    ) {
        let id = sandbox.id.as_str();
        {
            let mut table = sandbox.processes.lock().unwrap_or_else(|p| p.into_inner());
            table.ended.push_back(hub.pid);
            while table.ended.len() > ENDED_KEPT {
                if let Some(old) = table.ended.pop_front() {
                    table.hubs.remove(&old);
                }
            }
        }
        match finished.exit {
            Some(exit) => {
                let outcome = if exit.timed_out {
                    ExecOutcome::timeout
                } else if exit.exit_code == Some(0) {
                    ExecOutcome::ok
                } else {
                    ExecOutcome::failed
                };
                self.count_exec(outcome);
                self.inner
                    .metrics
                    .exec_seconds
                    .observe(exit.duration_ms as f64 / 1000.0);
                self.inner.audit.record(
                    Stream::Runtime,
                    "exec.exited",
                    Some(id),
                    Some(request_id),
                    exit_detail(&exit),
                );
                if exit.oom {
                    self.inner.metrics.oom_kills.inc();
                    self.inner.audit.record(
                        Stream::Security,
                        "exec.oom",
                        Some(id),
                        Some(request_id),
                        json!({"pid": exit.pid, "memory_bytes": sandbox.spec.limits.memory_bytes}),
                    );
                }
                if exit.timed_out {
                    self.inner.audit.record(
                        Stream::Security,
                        "exec.timeout_kill",
                        Some(id),
                        Some(request_id),
                        json!({"pid": exit.pid, "duration_ms": exit.duration_ms}),
                    );
                }
            }
            None => {
                self.count_exec(ExecOutcome::error);
                self.inner.audit.record(
                    Stream::Runtime,
                    "exec.lost",
                    Some(id),
                    Some(request_id),
                    json!({"pid": hub.pid, "error": finished.error}),
                );
            }
        }
        if let Some(after) = after {
            if after.pids_limit_hits > before.pids_limit_hits {
                self.inner.audit.record(
                    Stream::Security,
                    "limit.pids",
                    Some(id),
                    Some(request_id),
                    json!({"pid": hub.pid, "limit": sandbox.spec.limits.pids,
                           "hits": after.pids_limit_hits - before.pids_limit_hits}),
                );
            }
        }
    }

    /// The processes the daemon started in `id` (running and recently
    /// ended), plus running ones it did not start or no longer follows.
    pub async fn processes(&self, id: &str) -> Result<Vec<ProcessView>, DaemonError> {
        let sandbox = self.running(id)?;
        let mut views: Vec<ProcessView> = {
            let table = sandbox.processes.lock().unwrap_or_else(|p| p.into_inner());
            table.hubs.values().map(|hub| hub.view()).collect()
        };
        let answer = self
            .final_answer(id, Request::ListProcesses, Vec::new())
            .await?;
        if let Event::Processes { processes } = answer {
            let kernels = sandbox.kernel_pids();
            for process in processes {
                if !views.iter().any(|v| v.pid == process.pid) && !kernels.contains(&process.pid) {
                    views.push(ProcessView {
                        pid: process.pid,
                        cmd: process.cmd,
                        args: process.args,
                        user: process.user,
                        running: true,
                        exit_code: None,
                        signal: None,
                        started_at: 0,
                        tag: None,
                        env: BTreeMap::new(),
                        cwd: None,
                    });
                }
            }
        }
        views.sort_by_key(|v| v.pid);
        Ok(views)
    }

    /// The hub of process `pid` in `id`.
    pub fn process(&self, id: &str, pid: u32) -> Result<Arc<ProcessHub>, DaemonError> {
        let sandbox = self.running(id)?;
        let table = sandbox.processes.lock().unwrap_or_else(|p| p.into_inner());
        table
            .hubs
            .get(&pid)
            .cloned()
            .ok_or_else(|| DaemonError::NotFound(format!("no process {pid} in {id}")))
    }

    /// The hub of the process tagged `tag` in `id`: the running one, else
    /// the most recent that ended.
    pub fn process_by_tag(&self, id: &str, tag: &str) -> Result<Arc<ProcessHub>, DaemonError> {
        let sandbox = self.running(id)?;
        let table = sandbox.processes.lock().unwrap_or_else(|p| p.into_inner());
        let mut tagged: Vec<&Arc<ProcessHub>> = table
            .hubs
            .values()
            .filter(|hub| hub.tag.as_deref() == Some(tag))
            .collect();
        tagged.sort_by_key(|hub| (hub.running(), hub.started_at));
        tagged
            .last()
            .map(|hub| Arc::clone(hub))
            .ok_or_else(|| DaemonError::NotFound(format!("no process tagged {tag} in {id}")))
    }

    /// Appends `data` to the stdin of `pid`.
    pub async fn write_stdin(&self, id: &str, pid: u32, data: Vec<u8>) -> Result<(), DaemonError> {
        self.done(id, Request::WriteStdin { pid }, data).await
    }

    /// Closes the stdin of `pid`.
    pub async fn close_stdin(&self, id: &str, pid: u32) -> Result<(), DaemonError> {
        self.done(id, Request::CloseStdin { pid }, Vec::new()).await
    }

    /// Sets the size of the terminal of `pid` (started with `pty`).
    pub async fn resize(
        &self,
        id: &str,
        pid: u32,
        cols: u16,
        rows: u16,
    ) -> Result<(), DaemonError> {
        self.done(id, Request::Resize { pid, cols, rows }, Vec::new())
            .await
    }

    /// Sends `signal` to the process group of `pid`.
    pub async fn signal(&self, id: &str, pid: u32, signal: i32) -> Result<(), DaemonError> {
        self.done(id, Request::Signal { pid, signal }, Vec::new())
            .await
    }
}

/// The detail of an `exec.exited` event: the exit as the API answers it,
/// less its false flags and absent fields (`"oom":false` and the like), so
/// the event a client's every exec writes is as small as it can be.
fn exit_detail(exit: &impl serde::Serialize) -> serde_json::Value {
    let mut detail = json!(exit);
    if let Some(fields) = detail.as_object_mut() {
        fields.retain(|_, value| !(value.is_null() || *value == serde_json::Value::Bool(false)));
    }
    detail
}

#[cfg(test)]
mod exit_detail_tests {
    use super::exit_detail;
    use serde_json::json;

    #[test]
    fn only_set_flags_and_present_fields_are_kept() {
        let exit = json!({"pid": 2, "exit_code": 0, "signal": null, "oom": false,
                          "timed_out": true, "duration_ms": 3, "stdout_truncated": false});
        assert_eq!(
            exit_detail(&exit),
            json!({"pid": 2, "exit_code": 0, "timed_out": true, "duration_ms": 3})
        );
    }
}
