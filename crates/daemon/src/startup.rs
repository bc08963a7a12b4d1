//! A template's start and ready commands (the e2b Template SDK's
//! `set_start_cmd(cmd, ready)`; `airlock_layers::ImageConfig::start_cmd`
//! and `ready_cmd`), run at every create from that template.
//!
//! e2b runs the start command once, at build time, and snapshots the VM
//! with it running; the process tier has no such snapshot, so each create
//! does the equivalent: the start command is started in the background
//! (`/bin/sh -c`, as the sandbox's default user, in its default working
//! directory), then the ready command is run every [`READY_INTERVAL`] until
//! it exits 0, and only then is the sandbox handed out. A ready command
//! that has not succeeded within the create's bound (the sandbox's
//! timeout, at most [`READY_MAX`]), or a start command that ends with an
//! error before it did, fails the create: the sandbox is torn down and the
//! error says which command, and shows its last output.
//!
//! With only a start command, the create answers once it is started; with
//! only a ready command, once that succeeds.

use crate::exec::Output;
use crate::processes::ExecRequest;
use crate::{Daemon, DaemonError};
use airlock_layers::ImageConfig;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Time between two runs of a ready command.
pub const READY_INTERVAL: Duration = Duration::from_millis(250);
/// Longest a create waits for a ready command (e2b's build waits as long).
pub const READY_MAX: Duration = Duration::from_secs(300);
/// Output of a failed command kept for the error, bytes (its tail).
const OUTPUT_TAIL: usize = 2048;
/// The tag of the start command's process (`process_by_tag` finds it).
pub const START_TAG: &str = "template-start";

/// What a create from a template runs before it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Startup {
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

impl Startup {
    /// The startup of a template's configuration; `None` when it has
    /// neither command.
    pub fn of(config: &ImageConfig) -> Option<Startup> {
        let nonempty = |c: &Option<String>| c.clone().filter(|c| !c.trim().is_empty());
        let startup = Startup {
            start_cmd: nonempty(&config.start_cmd),
            ready_cmd: nonempty(&config.ready_cmd),
        };
        (startup.start_cmd.is_some() || startup.ready_cmd.is_some()).then_some(startup)
    }
}

/// How one run of a command ended.
struct Ran {
    exit_code: Option<i32>,
    /// The tail of its stdout and stderr together.
    output: String,
}

/// The last [`OUTPUT_TAIL`] bytes of `bytes`, lossily decoded.
fn tail(bytes: &[u8]) -> String {
    let from = bytes.len().saturating_sub(OUTPUT_TAIL);
    String::from_utf8_lossy(&bytes[from..]).trim().to_owned()
}

fn shell(command: &str, timeout: Option<Duration>, tag: Option<&str>) -> ExecRequest {
    ExecRequest {
        cmd: "/bin/sh".into(),
        args: vec!["-c".into(), command.to_owned()],
        env: BTreeMap::new(),
        cwd: None,
        user: None,
        timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)),
        stdin: false,
        pty: None,
        tag: tag.map(str::to_owned),
    }
}

impl Daemon {
    /// Runs `startup` in the running sandbox `id` (see the module doc):
    /// `Ok` once it is ready, an error naming the command otherwise.
    /// `bound` is how long the create may wait (the sandbox's timeout).
    pub(crate) async fn run_startup(
        &self,
        id: &str,
        startup: &Startup,
        bound: Duration,
        request_id: &str,
    ) -> Result<(), DaemonError> {
        let deadline = Instant::now() + bound.min(READY_MAX);
        let start = match &startup.start_cmd {
            Some(command) => {
                let (hub, attached) = self
                    .exec(id, shell(command, None, Some(START_TAG)), request_id)
                    .await?;
                // Nobody reads it here: its output stays in the hub's replay.
                drop(attached);
                Some((command, hub))
            }
            None => None,
        };
        let Some(ready) = &startup.ready_cmd else {
            return Ok(());
        };
        let mut last: Option<Ran> = None;
        loop {
            if let Some((command, hub)) = &start {
                let view = hub.view();
                if !view.running && view.exit_code != Some(0) {
                    return Err(DaemonError::InSandbox(format!(
                        "the template's start command `{command}` ended ({}) before its ready command `{ready}` succeeded{}",
                        match (view.exit_code, view.signal) {
                            (Some(code), _) => format!("exit code {code}"),
                            (None, Some(signal)) => format!("signal {signal}"),
                            (None, None) => "lost".to_owned(),
                        },
                        self.start_output(hub)
                    )));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let detail = match &last {
                    Some(ran) => format!(
                        " (last exit code {}{})",
                        ran.exit_code
                            .map_or_else(|| "none".to_owned(), |c| c.to_string()),
                        if ran.output.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", ran.output)
                        }
                    ),
                    None => String::new(),
                };
                return Err(DaemonError::InSandbox(format!(
                    "the template's ready command `{ready}` did not succeed within {} s{detail}",
                    bound.min(READY_MAX).as_secs()
                )));
            }
            let ran = match self.run_once(id, ready, left, request_id).await {
                Ok(ran) => ran,
                // Its lifetime ended while it was not ready yet.
                Err(DaemonError::NotRunning(_)) => {
                    return Err(DaemonError::InSandbox(format!(
                        "the template's ready command `{ready}` did not succeed before the sandbox's timeout ({} s)",
                        bound.as_secs()
                    )))
                }
                Err(e) => return Err(e),
            };
            if ran.exit_code == Some(0) {
                return Ok(());
            }
            last = Some(ran);
            tokio::time::sleep(
                READY_INTERVAL.min(deadline.saturating_duration_since(Instant::now())),
            )
            .await;
        }
    }

    /// The start command's output so far, for an error (`: …`, or empty).
    fn start_output(&self, hub: &crate::ProcessHub) -> String {
        let mut bytes = Vec::new();
        for item in hub.attach().replay {
            if let Output::Stdout(b) | Output::Stderr(b) = item {
                bytes.extend_from_slice(&b);
            }
        }
        match tail(&bytes) {
            out if out.is_empty() => String::new(),
            out => format!(": {out}"),
        }
    }

    /// Runs `command` once, at most `timeout`, to its end.
    async fn run_once(
        &self,
        id: &str,
        command: &str,
        timeout: Duration,
        request_id: &str,
    ) -> Result<Ran, DaemonError> {
        let (_hub, mut attached) = self
            .exec(id, shell(command, Some(timeout), None), request_id)
            .await?;
        let mut output = Vec::new();
        while let Some(item) = attached.next().await {
            match item {
                Output::Stdout(b) | Output::Stderr(b) => {
                    output.extend_from_slice(&b);
                    if output.len() > 2 * OUTPUT_TAIL {
                        output.drain(..output.len() - OUTPUT_TAIL);
                    }
                }
                Output::Exited(exit) => {
                    return Ok(Ran {
                        exit_code: exit.exit_code,
                        output: tail(&output),
                    })
                }
                Output::Error { message, .. } => {
                    return Err(DaemonError::InSandbox(format!(
                        "the template's ready command `{command}` could not be followed: {message}"
                    )))
                }
            }
        }
        Err(DaemonError::NotRunning(id.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_without_commands_has_no_startup() {
        assert_eq!(Startup::of(&ImageConfig::default()), None);
        let blank = ImageConfig {
            start_cmd: Some("  ".into()),
            ready_cmd: Some(String::new()),
            ..ImageConfig::default()
        };
        assert_eq!(Startup::of(&blank), None);
    }

    #[test]
    fn either_command_makes_a_startup() {
        let config = ImageConfig {
            start_cmd: Some("python -m http.server".into()),
            ..ImageConfig::default()
        };
        assert_eq!(
            Startup::of(&config),
            Some(Startup {
                start_cmd: Some("python -m http.server".into()),
                ready_cmd: None
            })
        );
        let config = ImageConfig {
            ready_cmd: Some("[ -f /tmp/up ]".into()),
            ..ImageConfig::default()
        };
        assert_eq!(
            Startup::of(&config).and_then(|s| s.ready_cmd),
            Some("[ -f /tmp/up ]".into())
        );
    }

    #[test]
    fn tails_keep_the_end() {
        let long = "x".repeat(OUTPUT_TAIL) + "the end\n";
        assert!(tail(long.as_bytes()).ends_with("the end"));
        assert_eq!(tail(long.as_bytes()).len(), OUTPUT_TAIL - 1);
    }
}
