//! The `gvisor` and `oci` tiers' side of a launch: everything between a
//! validated [`SandboxSpec`](airlock_policy::SandboxSpec) and an OCI
//! runtime running the in-sandbox agent.
//!
//! The supervisor of such a sandbox (`airlock supervise --tier gvisor|oci`)
//! builds the sandbox's root on the host exactly as the process tier's init
//! builds it inside (the same layers, writable layer and plan, from
//! `airlock-jail`), in a mount namespace of its own; writes an OCI bundle
//! whose init is the agent ([`bundle`]); and runs it with the runtime
//! ([`Runtime`]), the agent's channel on the container's stdin (the one
//! descriptor every runtime hands its init). [`container::Container`] owns
//! what that takes on the host and releases it in one idempotent teardown.
//!
//! What differs between the tiers is the runtime and what it puts between
//! the sandbox and the host: gVisor's `runsc` a kernel of its own (the
//! sentry, on the `ptrace` or `kvm` platform, with its netstack); `runc`
//! the host's kernel behind namespaces, capabilities and cgroups.

pub mod bundle;
pub mod container;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Which OCI runtime a tier runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// gVisor's `runsc`: the `gvisor` tier.
    Gvisor,
    /// `runc`: the `oci` tier.
    Runc,
}

/// gVisor platforms `runsc` can run its sentry on.
pub const GVISOR_PLATFORMS: &[&str] = &["ptrace", "kvm", "systrap"];

/// An OCI runtime as a tier runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    pub kind: Kind,
    /// The runtime's binary.
    pub binary: PathBuf,
    /// gVisor's platform (`ptrace`, `kvm`); unused by runc.
    pub platform: String,
}

/// How long a probe waits for the runtime to run the agent binary once.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

impl Runtime {
    /// `runsc` on `platform`.
    pub fn gvisor(binary: impl Into<PathBuf>, platform: impl Into<String>) -> Runtime {
        Runtime {
            kind: Kind::Gvisor,
            binary: binary.into(),
            platform: platform.into(),
        }
    }

    /// `runc`.
    pub fn runc(binary: impl Into<PathBuf>) -> Runtime {
        Runtime {
            kind: Kind::Runc,
            binary: binary.into(),
            platform: String::new(),
        }
    }

    /// The name of the tier this runtime serves.
    pub fn tier_name(&self) -> &'static str {
        match self.kind {
            Kind::Gvisor => "gvisor",
            Kind::Runc => "oci",
        }
    }

    /// The runtime's global flags for a container whose state lives under
    /// `state` and whose network is `network` (gVisor: `none` for a
    /// loopback-only sandbox, `sandbox` for its netstack on the interfaces
    /// of the namespace it is given).
    pub fn global_args(&self, state: &Path, network: &str) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec!["--root".into(), state.into()];
        if self.kind == Kind::Gvisor {
            args.extend(
                [
                    "--platform",
                    &self.platform,
                    "--network",
                    network,
                    // The supervisor puts the runtime's processes in the
                    // sandbox's cgroup itself (see `container`); runsc's
                    // own cgroup code does not take v1+v2 hybrid hosts.
                    "--ignore-cgroups",
                ]
                .map(std::ffi::OsString::from),
            );
            // For diagnosing the runtime: its debug log and a trace of the
            // sandbox's system calls, in files under this directory.
            if let Some(dir) = std::env::var_os("AIRLOCK_RUNSC_DEBUG_LOG") {
                args.push("--debug".into());
                args.push("--strace".into());
                let mut flag = std::ffi::OsString::from("--debug-log=");
                flag.push(dir);
                args.push(flag);
            }
        }
        args
    }

    /// Whether this runtime can run sandboxes here: its binary runs, and
    /// (the proof) it runs `agent` as the init of a minimal bundle within
    /// [`PROBE_TIMEOUT`]. The error says what would fix it.
    pub fn probe(&self, agent: &Path, scratch: &Path) -> Result<(), String> {
        let version = Command::new(&self.binary)
            .arg("--version")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output();
        let package = match self.kind {
            Kind::Gvisor => "runsc",
            Kind::Runc => "runc",
        };
        match version {
            Ok(out) if out.status.success() => {}
            _ => {
                return Err(format!(
                "{} does not run; install it (apt-get install {package}) or name another binary",
                self.binary.display()
            ))
            }
        }
        if self.kind == Kind::Gvisor && !GVISOR_PLATFORMS.contains(&self.platform.as_str()) {
            return Err(format!(
                "gVisor has no platform {:?}; use one of {}",
                self.platform,
                GVISOR_PLATFORMS.join(", ")
            ));
        }
        if !agent.is_file() {
            return Err(format!(
                "the agent binary {} is missing; build it beside airlock (cargo build --bins) or name it in AIRLOCK_AGENT",
                agent.display()
            ));
        }
        self.probe_run(agent, scratch)
    }

    /// Runs `agent` (with no arguments: it prints its usage and exits 2)
    /// as the init of a bundle whose root holds only the `/tmp` every
    /// sandbox's root has (gVisor's bundle binds it).
    fn probe_run(&self, agent: &Path, scratch: &Path) -> Result<(), String> {
        let dir = scratch.join(format!("probe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let result = (|| {
            let root = dir.join("root");
            std::fs::create_dir_all(root.join("tmp"))
                .map_err(|e| format!("cannot make {}: {e}", root.display()))?;
            let config = bundle::probe_config(&root, agent, self.kind)
                .map_err(|e| format!("cannot write the probe's bundle: {e}"))?;
            std::fs::write(dir.join("config.json"), config)
                .map_err(|e| format!("cannot write the probe's bundle: {e}"))?;
            let mut child = Command::new(&self.binary)
                .args(self.global_args(&dir.join("state"), "none"))
                .arg("run")
                .arg("--bundle")
                .arg(&dir)
                .arg(format!("airlock-probe-{}", std::process::id()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", self.binary.display()))?;
            let started = Instant::now();
            loop {
                match child.try_wait() {
                    Ok(Some(status)) if status.code() == Some(2) => return Ok(()),
                    Ok(Some(status)) => {
                        let mut err = String::new();
                        if let Some(mut stderr) = child.stderr.take() {
                            use std::io::Read;
                            let _ = stderr.read_to_string(&mut err);
                        }
                        return Err(format!(
                            "{} could not run a sandbox here ({status}): {}",
                            self.binary.display(),
                            last_line(&err)
                        ));
                    }
                    Ok(None) if started.elapsed() < PROBE_TIMEOUT => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(match self.kind {
                            Kind::Gvisor => format!(
                                "runsc on the {} platform did not start a sandbox within {} s (the kvm platform spins where /dev/kvm is a software hypervisor); choose another with --gvisor-platform, e.g. ptrace",
                                self.platform,
                                PROBE_TIMEOUT.as_secs()
                            ),
                            Kind::Runc => format!(
                                "{} did not start a container within {} s",
                                self.binary.display(),
                                PROBE_TIMEOUT.as_secs()
                            ),
                        });
                    }
                }
            }
        })();
        // What the runtime left of the probe (its state dir) goes with it.
        let _ = std::fs::remove_dir_all(&dir);
        result
    }
}

/// The last non-empty line of a runtime's error output (runsc and runc end
/// with the reason).
pub fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no message")
        .chars()
        .take(500)
        .collect()
}
