//! Starting and tearing down a sandbox of the process tier.
//!
//! The launcher (host side, root) prepares everything that can fail on bad
//! input first, takes a uid slot and a cgroup, then clones the sandbox init
//! into new user, pid, mount, network, IPC and UTS namespaces. While the
//! child waits on a pipe, the launcher writes its uid/gid maps (the slot's
//! private range: root inside is an unprivileged uid outside) and moves it
//! into the cgroup. The child then enters a new cgroup namespace, builds the
//! root filesystem from the [`rootfs`](crate::rootfs) plan, pivots into it,
//! brings up loopback, and finally, in this order, sets no_new_privs,
//! installs the seccomp filter, restricts writes with Landlock and execs the
//! agent from a descriptor of the launcher's own binary (nothing of the host
//! filesystem is reachable by path from inside).
//!
//! Everything the sandbox holds on the host (the cgroup, the slot record,
//! the init process) is released by [`Jail::teardown`], which is idempotent
//! and also runs on drop. Mounts live only in the sandbox's own mount
//! namespace and vanish with its last process.

use crate::cgroup::{CgroupError, CgroupLayout, CgroupLimits, CgroupStats, SandboxCgroup};
use crate::disk::DiskStore;
use crate::kernel::{raw_mount, HostSources, RootDir};
use crate::offline_net::{self, NamespaceMaker};
use crate::rootfs::{self, HostEntry, HostFacts, NodeKind, RootfsPlan, SHARED_ETC, SYSTEM_ENTRIES};
use crate::runtime::{RuntimeDir, RuntimeError, Slot, SlotRecord, UIDS_PER_SANDBOX};
use crate::{landlock as ll, seccomp};
use airlock_policy::{LayerBacking, SandboxSpec, SpecError, Template, VolumeMount};
use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The sandbox could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("template directory {0} does not exist or is not a directory")]
    TemplateMissing(PathBuf),
    #[error("template directory {0} has a comma, colon or backslash in its path, which overlayfs cannot take")]
    TemplatePathUnsupported(PathBuf),
    #[error("mount source {0} does not exist")]
    MountSourceMissing(PathBuf),
    #[error("the sandbox's writable layer is to be on disk, but no disk store was given")]
    NoDiskStore,
    #[error(transparent)]
    Disk(#[from] crate::disk::DiskError),
    #[error("`{0}` is not a sandbox id (sbx- and 1 to 32 lowercase hex digits)")]
    BadId(String),
    #[error(
        "the process tier needs root: it maps a private uid range per sandbox and creates cgroups"
    )]
    NotRoot,
    #[error("a sandbox must be launched from a single-threaded process")]
    NotSingleThreaded,
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("the seccomp filter could not be built")]
    Seccomp(#[source] seccomp::SeccompError),
    #[error("cannot {0}")]
    Io(&'static str, #[source] io::Error),
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    #[error("the agent binary {0} cannot be opened: build it beside airlock (cargo build --bins) or name it in AIRLOCK_AGENT")]
    AgentMissing(PathBuf, #[source] io::Error),
}

/// What every tier checks before it starts anything for `spec` as `id`:
/// the id's form, the spec's own rules, and that its template and mount
/// sources exist (and that overlayfs can take the template's path).
pub fn check_launchable(id: &str, spec: &SandboxSpec) -> Result<(), LaunchError> {
    if !is_sandbox_id(id) {
        return Err(LaunchError::BadId(id.to_owned()));
    }
    spec.validate()?;
    if let Template::Dir { path } = &spec.template {
        if !path.is_dir() {
            return Err(LaunchError::TemplateMissing(path.clone()));
        }
        if path.to_string_lossy().contains([',', ':', '\\']) {
            return Err(LaunchError::TemplatePathUnsupported(path.clone()));
        }
    }
    if let Template::Layers { layers } = &spec.template {
        if let Some(missing) = layers.iter().find(|p| !p.is_dir()) {
            return Err(LaunchError::TemplateMissing(missing.clone()));
        }
    }
    for mount in &spec.mounts {
        if mount.source.symlink_metadata().is_err() {
            return Err(LaunchError::MountSourceMissing(mount.source.clone()));
        }
    }
    if let Some(missing) = spec.volumes.iter().find(|v| !v.source.is_dir()) {
        return Err(LaunchError::MountSourceMissing(missing.source.clone()));
    }
    Ok(())
}

/// Where the in-sandbox agent binary is: `AIRLOCK_AGENT` if set, else
/// `airlock-agent` beside the running binary. Every tier runs this one
/// binary as its sandboxes' init.
pub fn agent_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("AIRLOCK_AGENT").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("airlock-agent")))
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin/airlock-agent"))
}

/// Opens [`agent_binary`] for a launch.
pub fn open_agent() -> Result<fs::File, LaunchError> {
    let path = agent_binary();
    fs::File::open(&path).map_err(|e| LaunchError::AgentMissing(path, e))
}

impl LaunchError {
    /// True when the caller's input was at fault (the CLI exits 2, the API
    /// answers 4xx); false for host-side failures.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            LaunchError::Spec(_)
                | LaunchError::TemplateMissing(_)
                | LaunchError::TemplatePathUnsupported(_)
                | LaunchError::MountSourceMissing(_)
                | LaunchError::BadId(_)
        )
    }
}

/// What [`Jail::prepare`] gathered; used by one launch.
pub struct Prepared {
    layout: CgroupLayout,
    host: HostFacts,
    seccomp: seccompiler::BpfProgram,
    agent: fs::File,
}

/// A running sandbox of the process tier, seen from the host.
#[derive(Debug)]
pub struct Jail {
    id: String,
    init_pid: i32,
    cgroup: SandboxCgroup,
    /// The disk store holding its writable layer, if on disk.
    disk: Option<DiskStore>,
    slot: Option<Slot>,
    channel: Option<UnixStream>,
    reaped: bool,
    torn_down: bool,
}

/// File descriptor number the agent's end of the channel has inside.
const AGENT_FD: RawFd = 3;

/// Everything the child needs, prepared before the clone so the child only
/// runs straight-line code.
struct ChildContext<'a> {
    id: &'a str,
    rootfs: &'a RootfsPlan,
    stage: PathBuf,
    template_dir: Option<&'a Path>,
    /// Layers to stack (`Template::Layers`): how many arrive on
    /// `layer_channel`, bottom first, as idmapped mounts.
    layers: usize,
    /// Volumes to attach: how many idmapped mounts arrive on
    /// `layer_channel` after the layers, in the spec's order.
    volumes: usize,
    layer_channel: Option<OwnedFd>,
    /// The writable layer on disk (a directory of the disk store, owned by
    /// the sandbox's root) bound on the stage; `None` for a tmpfs.
    upper: Option<&'a Path>,
    disk_bytes: u64,
    go_read: OwnedFd,
    cgroup_read: OwnedFd,
    err_write: OwnedFd,
    agent_end: OwnedFd,
    exe: OwnedFd,
    argv: Vec<CString>,
    seccomp: seccompiler::BpfProgram,
    landlock: ll::LandlockCompat,
    /// For network policy `none`, where the sandbox's own namespace
    /// arrives ([`crate::offline_net`]); otherwise it shares the
    /// launcher's, prepared by [`crate::net::enter_egress_namespace`].
    netns_channel: Option<OwnedFd>,
}

impl Jail {
    /// Starts a sandbox for `spec` and returns once its agent is exec'd.
    /// Must be called from a single-threaded process: the child runs Rust
    /// code between clone and exec.
    pub fn launch(spec: &SandboxSpec, runtime: &RuntimeDir) -> Result<Jail, LaunchError> {
        Jail::launch_named(spec, runtime, new_sandbox_id())
    }

    /// [`Jail::launch`] with an id chosen by the caller (the daemon records
    /// the sandbox before it exists). The id must look like `sbx-` and hex.
    pub fn launch_named(
        spec: &SandboxSpec,
        runtime: &RuntimeDir,
        id: String,
    ) -> Result<Jail, LaunchError> {
        let prepared = Jail::prepare(runtime)?;
        Jail::launch_prepared(prepared, spec, runtime, id, None)
    }

    /// The part of a launch that does not depend on the spec: checks,
    /// the cgroup layout, the runtime directory, facts of
    /// the host, the compiled seccomp filter. A supervisor started ahead of
    /// need does this while it waits for its spec.
    pub fn prepare(runtime: &RuntimeDir) -> Result<Prepared, LaunchError> {
        if !rustix::process::geteuid().is_root() {
            return Err(LaunchError::NotRoot);
        }
        let layout = CgroupLayout::detect()?;
        runtime.prepare()?;
        // What launchers that died left behind is swept at launch, while
        // the child builds its root (see `Jail::start`).
        Ok(Prepared {
            layout,
            host: HostFacts::gather(),
            seccomp: seccomp::sandbox_filter().map_err(LaunchError::Seccomp)?,
            agent: open_agent()?,
        })
    }

    /// [`Jail::launch_named`] from the work [`Jail::prepare`] did.
    /// A spec whose writable layer is on disk needs `disk`, the store it
    /// is made in.
    pub fn launch_prepared(
        prepared: Prepared,
        spec: &SandboxSpec,
        runtime: &RuntimeDir,
        id: String,
        disk: Option<&DiskStore>,
    ) -> Result<Jail, LaunchError> {
        check_launchable(&id, spec)?;
        if !single_threaded() {
            return Err(LaunchError::NotSingleThreaded);
        }
        let Prepared {
            layout,
            host,
            seccomp: program,
            agent,
        } = prepared;
        let rootfs = rootfs::plan(spec, &host, &id);

        let mut slot = runtime.acquire_slot()?;
        slot.record(&SlotRecord {
            id: id.clone(),
            launcher_pid: std::process::id(),
        })?;
        // Made in `Jail::start`, while the child builds its root.
        let cgroup = SandboxCgroup::existing(layout, &id);
        let disk = match spec.limits.layer {
            LayerBacking::Memory => None,
            LayerBacking::Disk => match disk {
                Some(disk) => Some(disk.clone()),
                None => {
                    slot.release();
                    return Err(LaunchError::NoDiskStore);
                }
            },
        };
        let mut jail = Jail {
            id,
            init_pid: 0,
            cgroup,
            disk: None,
            slot: Some(slot),
            channel: None,
            reaped: true,
            torn_down: false,
        };
        // On any error below, dropping `jail` tears down what exists so far.
        let upper = match &disk {
            Some(store) => {
                let owner = jail.slot.as_ref().map_or(0, Slot::host_uid_base);
                jail.disk = Some(store.clone());
                Some(store.create(&jail.id, spec.limits.disk_bytes, owner)?)
            }
            None => None,
        };
        jail.start(spec, &rootfs, runtime, program, agent, upper.as_deref())?;
        Ok(jail)
    }

    fn start(
        &mut self,
        spec: &SandboxSpec,
        rootfs: &RootfsPlan,
        runtime: &RuntimeDir,
        seccomp: seccompiler::BpfProgram,
        agent: fs::File,
        upper: Option<&Path>,
    ) -> Result<(), LaunchError> {
        let (host_end, agent_end) =
            UnixStream::pair().map_err(|e| LaunchError::Io("create the agent channel", e))?;
        let (go_read, go_write) = pipe()?;
        let (cgroup_write, cgroup_read) =
            UnixStream::pair().map_err(|e| LaunchError::Io("create the cgroup channel", e))?;
        let (err_read, err_write) = pipe()?;
        let (netns_host, netns_child) = if spec.network.is_none() {
            let (host, child) = UnixStream::pair()
                .map_err(|e| LaunchError::Io("create the network namespace channel", e))?;
            (Some(host), Some(OwnedFd::from(child)))
        } else {
            (None, None)
        };
        let template_dir = match &spec.template {
            Template::Dir { path } => Some(path.as_path()),
            Template::Host | Template::Layers { .. } => None,
        };
        let layers: &[PathBuf] = match &spec.template {
            Template::Layers { layers } => layers,
            _ => &[],
        };
        let (layers_host, layers_child) = if layers.is_empty() && spec.volumes.is_empty() {
            (None, None)
        } else {
            let (host, child) =
                UnixStream::pair().map_err(|e| LaunchError::Io("create the layer channel", e))?;
            (Some(host), Some(OwnedFd::from(child)))
        };
        let argv = ["airlock-agent", "--fd", "3"]
            .iter()
            .map(|s| {
                CString::new(*s)
                    .map_err(|e| LaunchError::Io("build the agent command line", e.into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let context = ChildContext {
            id: &self.id,
            rootfs,
            stage: runtime.stage(),
            template_dir,
            layers: layers.len(),
            volumes: spec.volumes.len(),
            layer_channel: layers_child,
            upper,
            disk_bytes: spec.limits.writable_layer_bytes(),
            go_read,
            cgroup_read: cgroup_read.into(),
            err_write,
            agent_end: agent_end.into(),
            // Above AGENT_FD: the child puts the channel on AGENT_FD, which
            // must not be the descriptor it execs (a file opened first in
            // a fresh process gets the lowest free number, 3).
            exe: rustix::io::fcntl_dupfd_cloexec(&agent, AGENT_FD + 1)
                .map_err(|e| LaunchError::Io("keep the agent binary open", e.into()))?,
            argv,
            seccomp,
            landlock: if spec.security.unsafe_allow_no_landlock {
                ll::LandlockCompat::UnsafeBestEffort
            } else {
                ll::LandlockCompat::Required
            },
            netns_channel: netns_child,
        };
        // No CLONE_NEWNET: a sandbox's own network namespace is made beside
        // its setup, off the critical path (see `crate::offline_net`).
        let flags = libc::CLONE_NEWUSER
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWUTS;
        // SAFETY: the process is single-threaded (checked in `launch`); the
        // child only runs `child_main`, which never returns (it execs or
        // `_exit`s).
        let pid = unsafe { fork_with(flags) }
            .map_err(|e| LaunchError::Io("clone the sandbox init", e))?;
        if pid == 0 {
            drop(go_write);
            drop(cgroup_write);
            drop(err_read);
            drop(host_end);
            drop(layers_host);
            drop(netns_host);
            child_main(context);
        }
        self.init_pid = pid;
        self.reaped = false;
        drop(context);

        let base = self.slot.as_ref().map_or(0, Slot::host_uid_base);
        write_id_maps(pid, base)?;
        if let Some(channel) = &layers_host {
            send_layers(pid, layers, &spec.volumes, channel)?;
        }
        release(go_write, "start the sandbox init")?;
        let netns = match netns_host {
            Some(channel) => Some(
                NamespaceMaker::start(pid, channel)
                    .map_err(|e| LaunchError::Io("start making the network namespace", e))?,
            ),
            None => None,
        };
        // The cgroup is made while the child builds its root. The child
        // waits for it before it enters its cgroup namespace and execs, so
        // nothing of the sandbox runs outside its limits (only the setup
        // before, airlock's own code, is charged to the launcher's cgroup).
        // On v1 the child moves itself in, through `tasks` files opened
        // here (see `SandboxCgroup::entry_files`); on v2 it is moved, which
        // waits for an RCU grace period (milliseconds) while it works.
        self.cgroup.make(CgroupLimits {
            memory_bytes: spec.limits.memory_bytes,
            cpu_millis: spec.limits.cpu_millis,
            pids: spec.limits.pids,
        })?;
        let entry = match self.cgroup.entry_files()? {
            Some(files) => files.into_iter().map(OwnedFd::from).collect(),
            None => {
                self.cgroup.add_process(self.init_pid as u32)?;
                Vec::new()
            }
        };
        // A child whose setup failed has already exited; then its own
        // account below explains more than the broken pipe would.
        let released = send_cgroup_entry(&cgroup_write, &entry);
        drop(entry);
        // Launchers that died left their cgroups and slot records: release
        // them now, while the child finishes its setup and this process
        // would only wait (after the cgroup, which the child waits for).
        // This launch's own record is live (its slot is locked), so the
        // sweep leaves it and its cgroup alone.
        runtime.sweep(Some(self.cgroup.layout()));

        let mut message = String::new();
        let _ = fs::File::from(err_read).read_to_string(&mut message);
        // Its failure is why the init failed, if it did.
        if let Some(netns) = netns {
            netns
                .finish()
                .map_err(|e| LaunchError::Io("make the network namespace", e))?;
        }
        if !message.is_empty() {
            return Err(LaunchError::Setup(message));
        }
        released?;
        if let Ok(Some(status)) = rustix::process::waitpid(
            rustix::process::Pid::from_raw(self.init_pid),
            rustix::process::WaitOptions::NOHANG,
        ) {
            self.reaped = true;
            return Err(LaunchError::Setup(format!(
                "the sandbox init died during setup ({status:?})"
            )));
        }
        host_end
            .set_nonblocking(false)
            .map_err(|e| LaunchError::Io("configure the agent channel", e))?;
        self.channel = Some(host_end);
        Ok(())
    }

    /// The sandbox id (also its hostname).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The host pid of the sandbox init (the agent).
    pub fn init_pid(&self) -> i32 {
        self.init_pid
    }

    /// The host end of the agent channel; `None` after it was taken.
    pub fn take_channel(&mut self) -> Option<UnixStream> {
        self.channel.take()
    }

    /// Usage figures of the sandbox's cgroup.
    pub fn stats(&self) -> CgroupStats {
        self.cgroup.stats()
    }

    /// Kills every process of the sandbox at once (SIGKILL to its init takes
    /// the whole pid namespace down; the cgroup catches anything else).
    pub fn kill(&self) {
        if !self.reaped && self.init_pid > 0 {
            // SAFETY: kill(2) has no memory-safety preconditions. `init_pid`
            // is our own unreaped child, so the pid cannot have been reused.
            unsafe {
                libc::kill(self.init_pid, libc::SIGKILL);
            }
        }
    }

    /// Releases everything the sandbox holds on the host. Idempotent.
    pub fn teardown(&mut self) -> Result<(), LaunchError> {
        if self.torn_down {
            return Ok(());
        }
        self.channel = None;
        self.kill();
        // The record goes while the sandbox dies (see `Slot::clear_record`).
        if let Some(slot) = &mut self.slot {
            slot.clear_record();
        }
        if !self.reaped && self.init_pid > 0 {
            let _ = rustix::process::waitpid(
                rustix::process::Pid::from_raw(self.init_pid),
                rustix::process::WaitOptions::empty(),
            );
            self.reaped = true;
        }
        // With its init reaped, the pid namespace is empty: the cgroup
        // usually is too, and goes at once. Anything left in it is killed.
        if !self.cgroup.remove_if_empty() {
            self.cgroup.kill_all(Duration::from_secs(10))?;
            self.cgroup.remove()?;
        }
        if let Some(disk) = &self.disk {
            disk.remove(&self.id)?;
        }
        if let Some(slot) = self.slot.take() {
            slot.release();
        }
        self.torn_down = true;
        Ok(())
    }
}

impl Drop for Jail {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// Descriptors sent in one message at most (SCM_RIGHTS carries at most 253
/// descriptors a message).
const FDS_PER_MESSAGE: usize = 64;

/// Clones each layer directory as a detached mount, idmapped through the
/// user namespace of the sandbox init `pid` (so a file the image gives uid
/// 0 is seen by the sandbox as its own root, without a copy of the layer
/// per sandbox), read-only, nosuid and nodev; and sends them, bottom first,
/// to the init, which attaches them under its stage and stacks them. The
/// volumes' mounts (idmapped the same way, writable unless read-only)
/// follow, for the init to attach where the plan says.
fn send_layers(
    pid: i32,
    layers: &[PathBuf],
    volumes: &[VolumeMount],
    channel: &UnixStream,
) -> Result<(), LaunchError> {
    let userns = fs::File::open(format!("/proc/{pid}/ns/user"))
        .map_err(|e| LaunchError::Io("open the sandbox's user namespace", e))?;
    let mut mounts = clone_layers(layers, Some(&userns))?;
    mounts.extend(clone_volumes(volumes, Some(&userns))?);
    for chunk in mounts.chunks(FDS_PER_MESSAGE) {
        send_fds(channel, chunk, "send the template layers")?;
    }
    Ok(())
}

/// Sends one byte and `fds` (at most [`FDS_PER_MESSAGE`]) as one message.
fn send_fds(channel: &UnixStream, fds: &[OwnedFd], what: &'static str) -> Result<(), LaunchError> {
    let fds: Vec<rustix::fd::BorrowedFd<'_>> = fds.iter().map(rustix::fd::AsFd::as_fd).collect();
    let mut space =
        vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)) {
        return Err(LaunchError::Io(
            what,
            io::Error::from(io::ErrorKind::InvalidInput),
        ));
    }
    rustix::net::sendmsg(
        channel,
        &[io::IoSlice::new(b"m")],
        &mut control,
        rustix::net::SendFlags::empty(),
    )
    .map_err(|e| LaunchError::Io(what, e.into()))?;
    Ok(())
}

/// Maps ids 0 to [`UIDS_PER_SANDBOX`] of the user namespace of `pid` (a
/// child waiting for it) to host `base` onwards, uids and gids alike.
fn write_id_maps(pid: i32, base: u32) -> Result<(), LaunchError> {
    let map = format!("0 {base} {UIDS_PER_SANDBOX}\n");
    fs::write(format!("/proc/{pid}/uid_map"), &map)
        .map_err(|e| LaunchError::Io("write the uid map", e))?;
    fs::write(format!("/proc/{pid}/gid_map"), &map)
        .map_err(|e| LaunchError::Io("write the gid map", e))
}

/// A user namespace whose ids 0 to [`UIDS_PER_SANDBOX`] are host `base`
/// onwards, held by its descriptor alone: the map layers are idmapped
/// through for a sandbox whose runtime makes a namespace of that map
/// itself (runc), before that namespace exists. Forks: call it from a
/// single-threaded process.
pub fn mapping_userns(base: u32) -> Result<fs::File, LaunchError> {
    use rustix::pipe::{pipe_with, PipeFlags};
    let io = |what: &'static str| move |e: rustix::io::Errno| LaunchError::Io(what, e.into());
    let (ready_read, ready_write) =
        pipe_with(PipeFlags::CLOEXEC).map_err(io("make the user namespace's pipe"))?;
    let (hold_read, hold_write) =
        pipe_with(PipeFlags::CLOEXEC).map_err(io("make the user namespace's pipe"))?;
    // SAFETY: the caller is single-threaded, so the child is a whole copy
    // of it; the child makes only raw system calls on descriptors it owns
    // and leaves with `_exit`, running no destructor or atexit handler.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(LaunchError::Io(
            "fork the user namespace's holder",
            io::Error::last_os_error(),
        ));
    }
    if pid == 0 {
        let (ready, hold) = (ready_write.as_raw_fd(), hold_read.as_raw_fd());
        // SAFETY: raw calls on live descriptors and a valid one-byte buffer;
        // `_exit` ends the child without unwinding into the parent's code.
        unsafe {
            libc::close(hold_write.as_raw_fd());
            let byte: u8 = if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                b'1'
            } else {
                b'0'
            };
            libc::write(ready, (&byte as *const u8).cast(), 1);
            // Until the parent has the namespace: its end closing is EOF.
            let mut sink = 0u8;
            libc::read(hold, (&mut sink as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    drop(ready_write);
    drop(hold_read);
    let reap = |hold: OwnedFd| {
        drop(hold);
        let mut status = 0;
        // SAFETY: waits for our own child, writing into a live local.
        while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
    };
    let mut byte = [0u8; 1];
    let unshared = rustix::io::read(&ready_read, &mut byte).map(|n| n == 1 && byte[0] == b'1');
    if !matches!(unshared, Ok(true)) {
        reap(hold_write);
        return Err(LaunchError::Io(
            "make a user namespace for the sandbox's id map",
            io::Error::from(io::ErrorKind::PermissionDenied),
        ));
    }
    let made = write_id_maps(pid, base).and_then(|()| {
        fs::File::open(format!("/proc/{pid}/ns/user"))
            .map_err(|e| LaunchError::Io("open the sandbox's user namespace", e))
    });
    reap(hold_write);
    made
}

/// Clones each layer directory as a detached mount, read-only, nosuid and
/// nodev, bottom first; idmapped through `userns` when one is given (the
/// process tier's private uid range), as they are otherwise (a tier whose
/// own kernel keeps owners as the image gives them).
pub fn clone_layers(
    layers: &[PathBuf],
    userns: Option<&fs::File>,
) -> Result<Vec<OwnedFd>, LaunchError> {
    layers
        .iter()
        .map(|layer| clone_tree(layer, userns, true))
        .collect()
}

/// Clones each volume's directory as a detached mount, nosuid and nodev,
/// read-only where the mount says so, idmapped through `userns` when one
/// is given: the volume keeps the ids the sandbox sees (uid 1000 is
/// `user` in every sandbox), whatever host range this sandbox maps.
pub fn clone_volumes(
    volumes: &[VolumeMount],
    userns: Option<&fs::File>,
) -> Result<Vec<OwnedFd>, LaunchError> {
    volumes
        .iter()
        .map(|volume| clone_tree(&volume.source, userns, volume.read_only))
        .collect()
}

fn clone_tree(
    path: &Path,
    userns: Option<&fs::File>,
    read_only: bool,
) -> Result<OwnedFd, LaunchError> {
    use rustix::mount::{open_tree, OpenTreeFlags};
    let idmap = if userns.is_some() {
        libc::MOUNT_ATTR_IDMAP
    } else {
        0
    };
    let tree = open_tree(
        rustix::fs::CWD,
        path,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| LaunchError::Io("clone a layer's or volume's mount", e.into()))?;
    let read_only = if read_only {
        libc::MOUNT_ATTR_RDONLY
    } else {
        0
    };
    let attr = libc::mount_attr {
        attr_set: idmap | read_only | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |ns| ns.as_raw_fd() as u64),
    };
    // SAFETY: mount_setattr reads `attr` (a live, initialized struct of
    // the size passed) and acts on the detached mount `tree`, which we
    // own; the empty path with AT_EMPTY_PATH names `tree` itself.
    let set = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if set != 0 {
        return Err(LaunchError::Io(
            "idmap a layer or volume (needs a kernel with idmapped mounts, 5.12+, on the store's file system)",
            io::Error::last_os_error(),
        ));
    }
    Ok(tree)
}

/// The init's side of [`send_layers`]: `count` mounts, bottom first.
fn receive_layers(channel: &OwnedFd, count: usize) -> Result<Vec<OwnedFd>, String> {
    let mut layers = Vec::with_capacity(count);
    while layers.len() < count {
        layers.extend(receive_fds(channel, "receive the template layers")?);
    }
    if layers.len() != count {
        return Err(format!(
            "receive the template layers: {} arrived for {count}",
            layers.len()
        ));
    }
    Ok(layers)
}

/// A raw `clone(flags | SIGCHLD)` without `CLONE_VM`: fork(2), into the
/// namespaces `flags` asks for, without glibc's atfork handlers. `Ok(0)` in
/// the child; the child's pid in the caller.
///
/// # Safety
/// The calling process must be single-threaded, and the child must never
/// return into the caller's code: it ends in exec or `_exit`.
pub(crate) unsafe fn fork_with(flags: libc::c_int) -> io::Result<i32> {
    // SAFETY: a raw clone without CLONE_VM and with a null stack behaves
    // like fork(2): the child gets a copy-on-write copy of this address
    // space and continues here. The caller is single-threaded (this
    // function's contract), so no lock (allocator included) can be held by
    // a thread that does not exist in the child.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        i32::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))
    }
}

/// Receives one message of [`send_fds`]: its descriptors.
pub(crate) fn receive_fds(channel: &OwnedFd, what: &str) -> Result<Vec<OwnedFd>, String> {
    let mut space =
        vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
    let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let got = rustix::net::recvmsg(
        channel,
        &mut [io::IoSliceMut::new(&mut byte)],
        &mut control,
        rustix::net::RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| format!("{what}: {e}"))?;
    if got.bytes == 0 {
        return Err(format!("{what}: the launcher went away"));
    }
    // A truncated message lost descriptors.
    if got.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(format!("{what}: the launcher's message was truncated"));
    }
    let mut fds = Vec::new();
    for message in control.drain() {
        if let rustix::net::RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    Ok(fds)
}

/// Tells the child its cgroup is ready, handing it the `tasks` files it
/// moves itself in with on v1 (none on v2, where it was moved).
fn send_cgroup_entry(channel: &UnixStream, files: &[OwnedFd]) -> Result<(), LaunchError> {
    send_fds(channel, files, "move the sandbox init into its cgroup")
}

/// The init's side of [`send_cgroup_entry`]: waits for its cgroup and, on
/// v1, moves itself into it (`0` is the calling thread).
fn enter_cgroup(channel: &OwnedFd) -> Result<(), String> {
    for tasks in receive_fds(channel, "wait for the cgroup")? {
        rustix::io::write(&tasks, b"0").map_err(|e| format!("enter the cgroup: {e}"))?;
    }
    Ok(())
}

/// Writes the one byte a waiting child reads as "go on".
fn release(write_end: OwnedFd, what: &'static str) -> Result<(), LaunchError> {
    fs::File::from(write_end)
        .write_all(b"g")
        .map_err(|e| LaunchError::Io(what, e))
}

/// Blocks until the launcher writes its byte; EOF means it gave up or died.
fn wait_for_launcher(read_end: &OwnedFd, what: &str) -> Result<(), String> {
    let mut byte = [0u8; 1];
    match rustix::io::read(read_end, &mut byte) {
        Ok(1) => Ok(()),
        Ok(_) => Err(format!("{what}: the launcher went away")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), LaunchError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| LaunchError::Io("create a pipe", e.into()))
}

/// Whether this process has one thread (what a launch that forks or
/// unshares needs).
pub fn single_threaded() -> bool {
    crate::read_kernel_text("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.split_whitespace().eq(["Threads:", "1"]))
        })
        .unwrap_or(false)
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    bytes
}

/// True for `sbx-` followed by 1 to 32 lowercase hex digits: safe as a
/// hostname, a cgroup name and a file name.
pub fn is_sandbox_id(id: &str) -> bool {
    id.strip_prefix("sbx-").is_some_and(|hex| {
        (1..=32).contains(&hex.len())
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// `sbx-` and 16 random hex digits.
pub fn new_sandbox_id() -> String {
    let mut id = String::from("sbx-");
    for byte in random_bytes::<8>() {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

impl HostFacts {
    /// Reads what the `host` template needs to know about this host.
    pub fn gather() -> HostFacts {
        let mut facts = HostFacts::default();
        for name in SYSTEM_ENTRIES {
            let path = Path::new("/").join(name);
            let Ok(meta) = path.symlink_metadata() else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = fs::read_link(&path) {
                    facts.system_entries.push((
                        (*name).into(),
                        HostEntry::Symlink(target.to_string_lossy().into_owned()),
                    ));
                }
            } else if meta.is_dir() {
                facts.system_entries.push(((*name).into(), HostEntry::Dir));
            }
        }
        for name in SHARED_ETC {
            // Only real files and directories: a symlink could point anywhere.
            if let Ok(meta) = Path::new("/etc").join(name).symlink_metadata() {
                if meta.is_dir() {
                    facts.shared_etc.push(((*name).into(), NodeKind::Dir));
                } else if meta.is_file() {
                    facts.shared_etc.push(((*name).into(), NodeKind::File));
                }
            }
        }
        facts.localtime = fs::read_link("/etc/localtime")
            .ok()
            .map(|t| t.to_string_lossy().into_owned());
        facts.sudo_shim = Some(agent_binary()).filter(|agent| agent.is_file());
        facts
    }
}

/// Mounts a sandbox's root on `stage`, in the caller's own mount namespace
/// (the process tier's init; the supervisor of a tier whose runtime is
/// handed a root directory), and returns the path of the root: the
/// writable layer (`upper`, a directory of the disk store bound there, or a
/// tmpfs of `disk_bytes`), then either the overlay of `layers` (detached
/// mounts from [`clone_layers`], bottom first) or of the `template`
/// directory under it, or the bare layer (the `host` template, whose plan
/// binds the host's system directories into it). Paths may be
/// `/proc/self/fd` links. `owner` is the host uid and gid of the sandbox's
/// root when the caller is outside its user namespace (else 0): the
/// writable layer and the overlay's directories are given to it.
pub fn assemble_root(
    stage: &str,
    upper: Option<&str>,
    template: Option<&str>,
    layers: Vec<OwnedFd>,
    disk_bytes: u64,
    owner: u32,
) -> Result<String, String> {
    let give = |path: &str| {
        if owner == 0 {
            return Ok(());
        }
        let id = Some(owner);
        std::os::unix::fs::chown(path, id, id)
    };
    match upper {
        None => step(
            "mount the writable layer",
            raw_mount(
                Some("airlock"),
                stage,
                Some("tmpfs"),
                libc::MS_NOSUID | libc::MS_NODEV,
                Some(&format!(
                    "size={disk_bytes},mode=0755,uid={owner},gid={owner}"
                )),
            ),
        )?,
        Some(source) => {
            step(
                "bind the writable layer",
                raw_mount(Some(source), stage, None, libc::MS_BIND, None),
            )?;
            step(
                "harden the writable layer",
                raw_mount(
                    None,
                    stage,
                    None,
                    libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV,
                    None,
                ),
            )?;
        }
    }
    let new_root = match template {
        None if !layers.is_empty() => {
            for dir in ["upper", "work", "root", "lower"] {
                let dir = format!("{stage}/{dir}");
                step(
                    "create the overlay dirs",
                    fs::create_dir(&dir).and_then(|()| give(&dir)),
                )?;
            }
            let mut lowers = Vec::with_capacity(layers.len());
            for (position, layer) in layers.iter().enumerate() {
                let at = format!("{stage}/lower/{position}");
                step("create a layer's mount point", fs::create_dir(&at))?;
                step(
                    "attach a template layer",
                    rustix::mount::move_mount(
                        layer,
                        "",
                        rustix::fs::CWD,
                        at.as_str(),
                        rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
                    ),
                )?;
                lowers.push(at);
            }
            drop(layers);
            // overlayfs lists the top layer first.
            lowers.reverse();
            // `volatile`: the writable layer is the sandbox's scratch, gone
            // with it (and after a host crash, when no sandbox survives);
            // overlayfs skips the fsync of every copy-up, which on a disk
            // upper cost each create several ms.
            let options = format!(
                "lowerdir={},upperdir={stage}/upper,workdir={stage}/work,userxattr,volatile",
                lowers.join(":")
            );
            let root = format!("{stage}/root");
            step(
                "mount the template's layers",
                raw_mount(
                    Some("overlay"),
                    &root,
                    Some("overlay"),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    Some(&options),
                ),
            )?;
            root
        }
        None => stage.to_owned(),
        Some(template) => {
            for dir in ["upper", "work", "root"] {
                let dir = format!("{stage}/{dir}");
                step(
                    "create the overlay dirs",
                    fs::create_dir(&dir).and_then(|()| give(&dir)),
                )?;
            }
            let lower = template;
            let options = format!(
                "lowerdir={lower},upperdir={stage}/upper,workdir={stage}/work,userxattr,volatile"
            );
            let root = format!("{stage}/root");
            step(
                "mount the template overlay",
                raw_mount(
                    Some("overlay"),
                    &root,
                    Some("overlay"),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    Some(&options),
                ),
            )?;
            root
        }
    };
    Ok(new_root)
}

/// The sandbox init between clone and exec. Never returns.
fn child_main(context: ChildContext<'_>) -> ! {
    let err = context.err_write.as_raw_fd();
    let message = match child_setup(&context) {
        Ok(never) => match never {},
        Err(message) => message,
    };
    // SAFETY: `err` is the write end of the error pipe, still open (it is
    // only closed by exec); the buffer is valid for its length. `_exit`
    // skips atexit handlers and destructors that belong to the launcher.
    unsafe {
        libc::write(err, message.as_ptr().cast(), message.len());
        libc::_exit(125);
    }
}

fn step<T, E: std::fmt::Display>(what: &str, result: Result<T, E>) -> Result<T, String> {
    result.map_err(|e| format!("{what}: {e}"))
}

fn child_setup(context: &ChildContext<'_>) -> Result<std::convert::Infallible, String> {
    use rustix::process::{Gid, Uid};
    use rustix::thread::{set_no_new_privs, UnshareFlags};
    // Wait until the launcher has written our uid/gid maps.
    wait_for_launcher(&context.go_read, "wait for the uid map")?;
    // Open host paths while our credentials are still the launcher's.
    let mut host_paths: Vec<&Path> = context
        .rootfs
        .ops
        .iter()
        .filter_map(rootfs::SetupOp::host_source)
        .collect();
    if let Some(template) = context.template_dir {
        host_paths.push(template);
    }
    if let Some(upper) = context.upper {
        host_paths.push(upper);
    }
    let sources = step("open host paths", HostSources::open(host_paths))?;
    let mut layers = match &context.layer_channel {
        Some(channel) => receive_layers(channel, context.layers + context.volumes)?,
        None => Vec::new(),
    };
    let volumes = layers.split_off(context.layers);
    step("setgroups", rustix::thread::set_thread_groups(&[Gid::ROOT]))?;
    step(
        "setresgid",
        rustix::thread::set_thread_res_gid(Gid::ROOT, Gid::ROOT, Gid::ROOT),
    )?;
    step(
        "setresuid",
        rustix::thread::set_thread_res_uid(Uid::ROOT, Uid::ROOT, Uid::ROOT),
    )?;
    // Set after the uid change, which would clear it. If the launcher dies,
    // the sandbox dies with it.
    step(
        "set the parent-death signal",
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)),
    )?;
    step(
        "set the hostname",
        rustix::system::sethostname(context.id.as_bytes()),
    )?;

    // Mounts from here on are private to this mount namespace.
    step(
        "make mounts private",
        raw_mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None),
    )?;
    let stage = context.stage.to_string_lossy().into_owned();
    let upper = match context.upper {
        Some(upper) => Some(
            sources
                .link(upper)
                .ok_or("the writable layer was not opened")?,
        ),
        None => None,
    };
    let template = match context.template_dir {
        Some(template) => Some(
            sources
                .link(template)
                .ok_or("the template directory was not opened")?,
        ),
        None => None,
    };
    let new_root = assemble_root(
        &stage,
        upper.as_deref(),
        template.as_deref(),
        layers,
        context.disk_bytes,
        0,
    )?;
    let mut root = step(
        "open the new root",
        RootDir::open(Path::new(&new_root), sources),
    )?
    .with_trees(volumes);
    step(
        "build the root filesystem",
        rootfs::apply(context.rootfs, &mut root),
    )?;
    drop(root);
    if let Some(channel) = &context.netns_channel {
        offline_net::enter(channel)?;
    }

    step("enter the new root", std::env::set_current_dir(&new_root))?;
    step("pivot_root", rustix::process::pivot_root(".", "."))?;
    step(
        "detach the old root",
        rustix::mount::unmount(".", rustix::mount::UnmountFlags::DETACH),
    )?;
    step("enter /", std::env::set_current_dir("/"))?;

    // The agent's stdio is /dev/null of the sandbox: no host terminal inside.
    let null = step(
        "open /dev/null",
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null"),
    )?;
    for fd in 0..3 {
        // SAFETY: dup2 onto 0..2 replaces this process's stdio; `null` stays
        // open for the duration of the call.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
            return Err(format!("redirect stdio: {}", io::Error::last_os_error()));
        }
    }
    drop(null);
    let core = rustix::process::Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    step(
        "set RLIMIT_CORE",
        rustix::process::setrlimit(rustix::process::Resource::Core, core),
    )?;

    // Put the agent channel on fd 3 and make every other descriptor
    // close-on-exec: no host descriptor survives into the sandbox.
    // SAFETY: dup2 onto AGENT_FD; the source is an open descriptor we own.
    if unsafe { libc::dup2(context.agent_end.as_raw_fd(), AGENT_FD) } < 0 {
        return Err(format!(
            "place the agent channel: {}",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on our
    // own descriptors; nothing is closed yet.
    if unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    } < 0
    {
        return Err(format!(
            "mark descriptors close-on-exec: {}",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: clears FD_CLOEXEC on the agent channel only.
    if unsafe { libc::fcntl(AGENT_FD, libc::F_SETFD, 0) } < 0 {
        return Err(format!(
            "keep the agent channel: {}",
            io::Error::last_os_error()
        ));
    }

    // Only now, inside its cgroup, does the sandbox get its cgroup namespace
    // (rooted at that cgroup) and run anything of its own.
    enter_cgroup(&context.cgroup_read)?;
    // SAFETY: unshare(2) only changes this process's namespace membership.
    step("unshare the cgroup namespace", unsafe {
        rustix::thread::unshare_unsafe(UnshareFlags::NEWCGROUP)
    })?;

    // Enforcement, in this order: no_new_privs, seccomp, landlock, exec.
    step("set no_new_privs", set_no_new_privs(true))?;
    step(
        "install the seccomp filter",
        seccomp::install(&context.seccomp),
    )?;
    let writable: Vec<&Path> = context
        .rootfs
        .writable
        .iter()
        .map(Path::new)
        .filter(|p| p.exists())
        .collect();
    step(
        "restrict writes with landlock",
        ll::restrict_writes(&writable, context.landlock),
    )?;

    let mut argv: Vec<*const libc::c_char> = context.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    // SAFETY: `exe` is an open descriptor of the agent binary; argv and
    // envp are null-terminated arrays of pointers to NUL-terminated strings
    // owned by `context`, alive for the call. On success this never returns.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            context.exe.as_raw_fd(),
            c"".as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
    }
    Err(format!("exec the agent: {}", io::Error::last_os_error()))
}
