//! A sandbox of any tier this host runs itself, as `airlock run` and a
//! supervisor own it: the process tier's [`Jail`] or an OCI tier's
//! [`Container`], behind one surface.

use airlock::error_chain;
use airlock_jail::runtime::RuntimeDir;
use airlock_jail::Jail;
use airlock_oci::container::Container;
use airlock_policy::SandboxSpec;
use std::path::{Path, PathBuf};

/// The sandbox this supervisor owns, of whichever tier.
// One per process (a supervisor's or `airlock run`'s), never in a
// collection: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Sandbox {
    Jail(Jail),
    Container(Container),
}

impl Sandbox {
    pub fn id(&self) -> &str {
        match self {
            Sandbox::Jail(jail) => jail.id(),
            Sandbox::Container(container) => container.id(),
        }
    }

    pub fn init_pid(&self) -> i32 {
        match self {
            Sandbox::Jail(jail) => jail.init_pid(),
            Sandbox::Container(container) => container.init_pid(),
        }
    }

    /// The network namespace its egress path binds in (meaningful for a
    /// sandbox with network).
    pub fn egress_netns(&self) -> PathBuf {
        let of_init = || PathBuf::from(format!("/proc/{}/ns/net", self.init_pid()));
        match self {
            Sandbox::Jail(_) => of_init(),
            Sandbox::Container(container) => container.egress_netns().unwrap_or_else(of_init),
        }
    }

    pub fn take_channel(&mut self) -> Option<std::os::unix::net::UnixStream> {
        match self {
            Sandbox::Jail(jail) => jail.take_channel(),
            Sandbox::Container(container) => container.take_channel(),
        }
    }

    pub fn oom(&self) -> bool {
        match self {
            Sandbox::Jail(jail) => jail.stats().oom_kills > 0,
            Sandbox::Container(container) => container.stats().oom_kills > 0,
        }
    }

    pub fn kill(&self) {
        match self {
            Sandbox::Jail(jail) => jail.kill(),
            Sandbox::Container(container) => container.kill(),
        }
    }

    pub fn stats(&self) -> airlock_jail::cgroup::CgroupStats {
        match self {
            Sandbox::Jail(jail) => jail.stats(),
            Sandbox::Container(container) => container.stats(),
        }
    }

    /// Saves its memory to disk and lets its processes go (gVisor's
    /// tier); the image's bytes.
    pub fn checkpoint(&mut self) -> Result<u64, String> {
        match self {
            Sandbox::Container(container) if container.can_checkpoint() => {
                container.checkpoint().map_err(|e| error_chain(&e))
            }
            _ => Err("this tier cannot checkpoint a sandbox's memory".into()),
        }
    }

    /// Brings a checkpointed sandbox back; the new agent channel.
    pub fn restore(&mut self) -> Result<std::os::unix::net::UnixStream, String> {
        match self {
            Sandbox::Container(container) => container.restore().map_err(|e| error_chain(&e)),
            Sandbox::Jail(_) => Err("this tier cannot checkpoint a sandbox's memory".into()),
        }
    }

    /// The restored sandbox has answered: its memory image can go.
    pub fn restore_confirmed(&mut self) {
        if let Sandbox::Container(container) = self {
            container.restore_confirmed();
        }
    }

    /// Whether its memory is checkpointed and nothing of it runs.
    pub fn is_checkpointed(&self) -> bool {
        match self {
            Sandbox::Container(container) => container.is_checkpointed(),
            Sandbox::Jail(_) => false,
        }
    }

    /// Releases everything the sandbox holds (idempotent); the error says
    /// what was left.
    pub fn teardown(&mut self) -> Result<(), String> {
        match self {
            Sandbox::Jail(jail) => jail.teardown().map_err(|e| error_chain(&e)),
            Sandbox::Container(container) => container.teardown().map_err(|e| error_chain(&e)),
        }
    }
}

/// What a supervisor prepares before its spec comes, per tier.
pub enum Prepared {
    Jail(airlock_jail::launch::Prepared),
    Container(airlock_oci::container::Prepared, airlock_oci::Runtime),
}

impl Prepared {
    /// Prepares a launch on `tier` (`process`, `oci`, `gvisor`); the OCI
    /// tiers run `runtime` (by default the first `runsc` or `runc` in
    /// PATH), gVisor on `platform`. Errors carry whether the caller's
    /// input was at fault.
    pub fn of_tier(
        tier: &str,
        runtime: Option<PathBuf>,
        platform: &str,
        runtime_dir: &RuntimeDir,
    ) -> Result<Prepared, (String, bool)> {
        let oci = match tier {
            "process" => {
                return Jail::prepare(runtime_dir)
                    .map(Prepared::Jail)
                    .map_err(|e| (error_chain(&e), e.is_bad_input()))
            }
            "gvisor" => airlock_oci::Runtime::gvisor(
                runtime.unwrap_or_else(|| airlock::in_path(Path::new("runsc"))),
                platform,
            ),
            "oci" => airlock_oci::Runtime::runc(
                runtime.unwrap_or_else(|| airlock::in_path(Path::new("runc"))),
            ),
            other => {
                return Err((
                    format!("there is no tier {other:?} (process, oci, gvisor)"),
                    true,
                ))
            }
        };
        Container::prepare(runtime_dir)
            .map(|prepared| Prepared::Container(prepared, oci))
            .map_err(|e| (error_chain(&e), e.is_bad_input()))
    }

    /// Launches sandbox `id` for `spec`. A sandbox with network joins the
    /// network namespace this process is in (prepared by the caller).
    pub fn launch(
        self,
        spec: &SandboxSpec,
        runtime_dir: &RuntimeDir,
        id: String,
        disk: Option<&airlock_jail::disk::DiskStore>,
    ) -> Result<Sandbox, (String, bool)> {
        match self {
            Prepared::Jail(prepared) => {
                Jail::launch_prepared(prepared, spec, runtime_dir, id, disk)
                    .map(Sandbox::Jail)
                    .map_err(|e| (error_chain(&e), e.is_bad_input()))
            }
            Prepared::Container(prepared, runtime) => {
                let netns = (!spec.network.is_none())
                    .then(|| PathBuf::from(format!("/proc/{}/ns/net", std::process::id())));
                Container::launch(prepared, spec, runtime_dir, id, disk, &runtime, netns)
                    .map(Sandbox::Container)
                    .map_err(|e| (error_chain(&e), e.is_bad_input()))
            }
        }
    }
}
