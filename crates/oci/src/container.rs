//! A sandbox of an OCI tier, seen from its supervisor: what it holds on the
//! host and the one teardown that releases it.
//!
//! A launch, in order: the checks every tier makes; a uid slot (its record
//! is how the daemon's reconciliation finds a dead supervisor's leftovers)
//! and the sandbox's cgroup with its limits; the writable layer; then, in a
//! mount namespace of the supervisor's own, the root (template layers
//! stacked by overlayfs under the writable layer, or the host's system
//! directories for the `host` template) and the plan's files and mounts in
//! it (`airlock_jail::rootfs::guest_plan`: no `/proc` or `/dev` of the
//! host's kernel). The bundle goes to `<runtime dir>/containers/<id>/`,
//! with the runtime's state beside it, and the runtime runs it from a
//! child that starts inside the cgroup, so every process the runtime makes
//! (for gVisor: its sentry and gofer) is counted and limited there.
//!
//! [`Container::teardown`] kills everything in the cgroup, detaches the
//! root, removes the cgroup, the writable layer, the bundle and state
//! directory, and gives the slot back. It is idempotent and runs on drop.

use crate::bundle::{self, Placement};
use crate::{last_line, Kind, Runtime};
use airlock_jail::cgroup::{CgroupLayout, CgroupLimits, CgroupStats, SandboxCgroup};
use airlock_jail::disk::DiskStore;
use airlock_jail::kernel::{raw_mount, HostSources, RootDir};
use airlock_jail::launch::{self, LaunchError};
use airlock_jail::rootfs::{self, HostFacts, SetupOp};
use airlock_jail::runtime::{RuntimeDir, Slot, SlotRecord};
use airlock_policy::{LayerBacking, SandboxSpec, Template};
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The gvisor tier's statx shim (see `compat/statx-shim.c`), built by
/// build.rs; empty where it is not built.
static STATX_SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/statx-shim.so"));

/// How long the runtime gets to create the container.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A sandbox of an OCI tier could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    Bundle(#[from] bundle::BundleError),
    #[error("cannot {0}")]
    Io(&'static str, #[source] io::Error),
    #[error("sandbox setup failed: {0}")]
    Root(String),
    #[error("{runtime} did not run the sandbox: {message}")]
    Refused { runtime: String, message: String },
    #[error("{runtime} did not start the sandbox within {} s", START_TIMEOUT.as_secs())]
    Slow { runtime: String },
    /// The runtime's binary cannot be run.
    #[error(
        "cannot run {0}: install it (apt-get install runsc / runc) or name another with --runtime"
    )]
    RuntimeMissing(PathBuf, #[source] io::Error),
    #[error(transparent)]
    Network(#[from] airlock_jail::net::NetError),
}

impl ContainerError {
    /// True when the caller's input was at fault (an API client's 4xx).
    pub fn is_bad_input(&self) -> bool {
        match self {
            ContainerError::Launch(e) => e.is_bad_input(),
            _ => false,
        }
    }
}

/// What [`Container::prepare`] gathered; used by one launch.
pub struct Prepared {
    layout: CgroupLayout,
    host: HostFacts,
    agent: PathBuf,
    seccomp: Vec<u8>,
}

/// A running sandbox of an OCI tier.
#[derive(Debug)]
pub struct Container {
    id: String,
    runtime: Runtime,
    /// `<runtime dir>/containers/<id>`: the bundle and the runtime's state.
    dir: PathBuf,
    stage: PathBuf,
    cgroup: SandboxCgroup,
    disk: Option<DiskStore>,
    /// The disk store its memory image goes to when it is checkpointed
    /// (none: it cannot be).
    images: Option<DiskStore>,
    slot: Option<Slot>,
    /// The runtime's `run`, which lasts as long as the container.
    child: Option<Child>,
    /// Its pid (ours to signal until we reap it).
    runtime_pid: Option<u32>,
    /// Processes seen in the cgroup when it was killed, to reap at teardown.
    killed: std::sync::Mutex<Vec<i32>>,
    init_pid: i32,
    channel: Option<UnixStream>,
    /// A networked gVisor sandbox's way to the egress namespace.
    guest_link: Option<airlock_jail::net::GuestLink>,
    /// The bundle's `config.json`, written again for a restore.
    config: Vec<u8>,
    /// Whether it has an egress path (the runtime's network mode).
    networked: bool,
    /// Its memory is checkpointed to disk and no process of it runs.
    checkpointed: bool,
    /// It was restored from its memory image, which its runtime may not
    /// have read yet.
    image_in_use: bool,
    mounted: bool,
    torn_down: bool,
}

impl Container {
    /// What does not depend on the spec (a supervisor started ahead of
    /// need does it while it waits): checks, the cgroup layout, the runtime
    /// directory and its sweep, the host's facts, the agent binary.
    pub fn prepare(runtime: &RuntimeDir) -> Result<Prepared, ContainerError> {
        if !rustix::process::geteuid().is_root() {
            return Err(LaunchError::NotRoot.into());
        }
        let layout = CgroupLayout::detect().map_err(LaunchError::from)?;
        runtime.prepare().map_err(LaunchError::from)?;
        runtime.sweep(Some(&layout));
        let agent = launch::agent_binary();
        if let Err(e) = fs::metadata(&agent) {
            return Err(LaunchError::AgentMissing(agent, e).into());
        }
        let seccomp = airlock_jail::seccomp::sandbox_filter().map_err(LaunchError::Seccomp)?;
        Ok(Prepared {
            layout,
            host: HostFacts::gather(),
            agent,
            seccomp: airlock_jail::seccomp::to_bytes(&seccomp),
        })
    }

    /// Starts sandbox `id` for `spec` under `runtime`, from the work
    /// [`Container::prepare`] did. `netns` is the network namespace the
    /// container joins (the egress namespace the supervisor prepared), or
    /// `None` for one of its own with loopback only. Must run in a
    /// single-threaded process: it unshares its mount namespace.
    pub fn launch(
        prepared: Prepared,
        spec: &SandboxSpec,
        runtime_dir: &RuntimeDir,
        id: String,
        disk: Option<&DiskStore>,
        runtime: &Runtime,
        netns: Option<PathBuf>,
    ) -> Result<Container, ContainerError> {
        launch::check_launchable(&id, spec)?;
        if !launch::single_threaded() {
            return Err(LaunchError::NotSingleThreaded.into());
        }
        // gVisor's netstack sends its packets out of a device rather than
        // through this namespace's stack: it gets a namespace of its own,
        // linked to this one, whose rules judge what arrives.
        let guest_link = match (&netns, runtime.kind) {
            (Some(_), Kind::Gvisor) => Some(airlock_jail::net::GuestLink::create()?),
            _ => None,
        };
        let netns = match &guest_link {
            Some(link) => Some(link.guest_path()),
            None => netns,
        };
        let Prepared {
            layout,
            host,
            agent,
            seccomp,
        } = prepared;
        let mut slot = runtime_dir.acquire_slot().map_err(LaunchError::from)?;
        // runc runs the sandbox in a user namespace mapping its root to the
        // slot's unprivileged host range, as the process tier does; gVisor's
        // kernel keeps ids of its own above the host's.
        let owner = match runtime.kind {
            Kind::Runc => slot.host_uid_base(),
            Kind::Gvisor => 0,
        };
        slot.record(&SlotRecord {
            id: id.clone(),
            launcher_pid: std::process::id(),
        })
        .map_err(LaunchError::from)?;
        let cgroup = match SandboxCgroup::create(
            layout,
            &id,
            CgroupLimits {
                memory_bytes: spec.limits.memory_bytes,
                cpu_millis: spec.limits.cpu_millis,
                pids: bundle::host_pids(spec, runtime.kind),
            },
        ) {
            Ok(cgroup) => cgroup,
            Err(e) => {
                slot.release();
                return Err(LaunchError::from(e).into());
            }
        };
        let mut container = Container {
            dir: runtime_dir.containers().join(&id),
            stage: runtime_dir.stage(),
            id,
            runtime: runtime.clone(),
            cgroup,
            disk: None,
            images: disk.cloned(),
            slot: Some(slot),
            child: None,
            runtime_pid: None,
            killed: std::sync::Mutex::new(Vec::new()),
            init_pid: 0,
            channel: None,
            guest_link,
            config: Vec::new(),
            networked: netns.is_some(),
            checkpointed: false,
            image_in_use: false,
            mounted: false,
            torn_down: false,
        };
        // From here on, dropping `container` tears down what exists.
        let upper = match spec.limits.layer {
            LayerBacking::Memory => None,
            LayerBacking::Disk => {
                let store = disk.ok_or(LaunchError::NoDiskStore)?;
                container.disk = Some(store.clone());
                Some(
                    store
                        .create(&container.id, spec.limits.disk_bytes, owner)
                        .map_err(LaunchError::from)?,
                )
            }
        };
        fs::create_dir_all(&container.dir)
            .and_then(|()| fs::set_permissions(&container.dir, fs::Permissions::from_mode(0o700)))
            .map_err(|e| ContainerError::Io("make the sandbox's bundle directory", e))?;
        let shim = if runtime.kind == Kind::Gvisor && !STATX_SHIM.is_empty() {
            let path = container.dir.join("statx-shim.so");
            fs::write(&path, STATX_SHIM)
                .and_then(|()| fs::set_permissions(&path, fs::Permissions::from_mode(0o555)))
                .map_err(|e| ContainerError::Io("write the statx shim", e))?;
            Some(path)
        } else {
            None
        };
        let seccomp_file = container.dir.join("seccomp.bpf");
        fs::write(&seccomp_file, &seccomp)
            .map_err(|e| ContainerError::Io("write the seccomp filter", e))?;
        let (root, writable) = container.build_root(
            spec,
            &host,
            upper.as_deref(),
            shim.is_some(),
            container.guest_link.is_some(),
            owner,
        )?;
        // The host template's root is read-only but for the places the
        // plan makes writable (Landlock's job on the process tier), each
        // bound read-write; the kernel's own file systems come from the
        // runtime.
        let read_only_root = matches!(spec.template, Template::Host);
        let writable = if read_only_root {
            writable
                .iter()
                .filter(|p| !p.starts_with("/dev") && !p.starts_with("/proc") && p.as_str() != "/")
                .map(|p| (Path::new(&root).join(p.trim_start_matches('/')), p.clone()))
                .collect()
        } else {
            Vec::new()
        };
        let config = bundle::config(
            spec,
            runtime.kind,
            &Placement {
                root: Path::new(&root),
                agent: &agent,
                hostname: &container.id,
                kind: runtime.kind,
                netns: netns.clone(),
                id_map: (owner != 0).then_some((owner, owner)),
                shim,
                seccomp: Some(seccomp_file),
                read_only_root,
                writable,
            },
        )?;
        let text = serde_json::to_vec_pretty(&config)
            .map_err(|e| ContainerError::Io("encode the bundle", e.into()))?;
        fs::write(container.dir.join("config.json"), &text)
            .map_err(|e| ContainerError::Io("write the bundle", e))?;
        container.config = text;
        if container.guest_link.is_some() {
            container.hide_network_sysctls()?;
        }
        container.start(&["run".into()])?;
        Ok(container)
    }

    /// runsc of 2022 refuses to give a sandbox a network when
    /// `/proc/sys/net/core/rmem_default` exists where it looks, taking it as
    /// the sign of the host's own network namespace; since Linux 6.x every
    /// namespace has it. In this process's mount namespace (the runtime's,
    /// no one else's) `/proc/sys` becomes a small tmpfs holding the host's
    /// `kernel`, `vm` and `fs` trees but no `net`. The sandbox does not see
    /// it: gVisor's `/proc` is its own.
    fn hide_network_sysctls(&self) -> Result<(), ContainerError> {
        let view = self.dir.join("sysctl-view");
        let view = view.to_string_lossy();
        let fail = |what| move |e: rustix::io::Errno| ContainerError::Io(what, e.into());
        fs::create_dir_all(&*view).map_err(|e| ContainerError::Io("make a sysctl view", e))?;
        raw_mount(
            Some("/proc/sys"),
            &view,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )
        .map_err(fail("bind /proc/sys"))?;
        raw_mount(
            Some("none"),
            "/proc/sys",
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some("size=64k,mode=0755"),
        )
        .map_err(fail("cover /proc/sys"))?;
        for tree in ["kernel", "vm", "fs"] {
            let at = format!("/proc/sys/{tree}");
            fs::create_dir(&at).map_err(|e| ContainerError::Io("make a sysctl tree", e))?;
            raw_mount(
                Some(&format!("{view}/{tree}")),
                &at,
                None,
                libc::MS_BIND | libc::MS_REC,
                None,
            )
            .map_err(fail("bind a sysctl tree"))?;
        }
        rustix::mount::unmount(&*view, rustix::mount::UnmountFlags::DETACH)
            .map_err(fail("detach the sysctl view"))?;
        Ok(())
    }

    /// Builds the root in a mount namespace of this process's own and
    /// returns its path and the sandbox paths the plan makes writable.
    /// `owner` is the host uid of the sandbox's root when its runtime maps
    /// a user namespace (0 otherwise): the layers are idmapped through that
    /// map and what the setup makes is owned from it.
    fn build_root(
        &mut self,
        spec: &SandboxSpec,
        host: &HostFacts,
        upper: Option<&Path>,
        shim: bool,
        guest_link: bool,
        owner: u32,
    ) -> Result<(String, Vec<String>), ContainerError> {
        let mut plan = rootfs::guest_plan(spec, host, &self.id);
        if guest_link {
            // The guest's own loopback is not the namespace's: its resolver
            // is at the link's far end.
            for op in &mut plan.ops {
                if let SetupOp::WriteFile { path, contents, .. } = op {
                    if path == "etc/resolv.conf" {
                        *contents = rootfs::resolv_conf(airlock_jail::net::GUEST_GATEWAY_V4.into());
                    }
                }
            }
        }
        if shim {
            // Before /etc is sealed (the host template's), if it is.
            let at = plan
                .ops
                .iter()
                .position(|op| matches!(op, SetupOp::SealTree { path } if path == "etc"))
                .unwrap_or(plan.ops.len());
            plan.ops.insert(
                at,
                SetupOp::WriteFile {
                    path: rootfs::PRELOAD_FILE.into(),
                    contents: format!("{}\n", bundle::SHIM_PATH),
                    mode: 0o644,
                },
            );
        }
        // SAFETY: the hazard `unshare_unsafe` guards against is FILES, which
        // would leave descriptors this process holds unshared behind std's
        // back; NEWNS alone changes only which mount table this (single-
        // threaded, checked by `launch`) process sees.
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }
            .map_err(|e| ContainerError::Io("unshare the mount namespace", e.into()))?;
        raw_mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None)
            .map_err(|e| ContainerError::Io("make mounts private", e.into()))?;
        let template_dir = match &spec.template {
            Template::Dir { path } => Some(path.as_path()),
            Template::Host | Template::Layers { .. } => None,
        };
        let layers: &[PathBuf] = match &spec.template {
            Template::Layers { layers } => layers,
            _ => &[],
        };
        let mut host_paths: Vec<&Path> = plan.ops.iter().filter_map(SetupOp::host_source).collect();
        host_paths.extend(template_dir);
        host_paths.extend(upper);
        let sources =
            HostSources::open(host_paths).map_err(|e| ContainerError::Root(e.to_string()))?;
        let id_map = match owner {
            0 => None,
            base if !layers.is_empty() || !spec.volumes.is_empty() => {
                Some(launch::mapping_userns(base)?)
            }
            _ => None,
        };
        let layers = launch::clone_layers(layers, id_map.as_ref())?;
        let volumes = launch::clone_volumes(&spec.volumes, id_map.as_ref())?;
        drop(id_map);
        let link = |path: Option<&Path>| path.and_then(|p| sources.link(p));
        let stage = self.stage.to_string_lossy().into_owned();
        fs::create_dir_all(&self.stage)
            .map_err(|e| ContainerError::Io("make the stage directory", e))?;
        self.mounted = true;
        let root = launch::assemble_root(
            &stage,
            link(upper).as_deref(),
            link(template_dir).as_deref(),
            layers,
            spec.limits.writable_layer_bytes(),
            owner,
        )
        .map_err(ContainerError::Root)?;
        let mut dir = RootDir::open(Path::new(&root), sources)
            .map_err(|e| ContainerError::Root(e.to_string()))?
            .owned_from(owner)
            .with_trees(volumes);
        rootfs::apply(&plan, &mut dir).map_err(|e| ContainerError::Root(e.to_string()))?;
        Ok((root, plan.writable))
    }

    /// Runs the bundle: the runtime's `run` in the foreground, born inside
    /// the cgroup, the agent's end of the channel as its stdin. Returns once
    /// the runtime has made the container (its pid file is written), or
    /// with the runtime's own reason when it gave up.
    fn start(&mut self, verb: &[std::ffi::OsString]) -> Result<(), ContainerError> {
        // Orphans of the runtime (a container init whose runtime process
        // was killed first) come to this process, which reaps them at
        // teardown, rather than to the host's init.
        rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
            .map_err(|e| ContainerError::Io("become a subreaper", e.into()))?;
        let (host_end, agent_end) =
            UnixStream::pair().map_err(|e| ContainerError::Io("create the agent channel", e))?;
        let log = fs::File::create(self.dir.join("runtime.log"))
            .map_err(|e| ContainerError::Io("create the runtime's log", e))?;
        let pid_file = self.dir.join("pid");
        match fs::remove_file(&pid_file) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(ContainerError::Io("clear the runtime's pid file", e)),
        }
        let network = match (self.runtime.kind, self.networked) {
            (Kind::Gvisor, false) => "none",
            _ => "sandbox",
        };
        let mut command = Command::new(&self.runtime.binary);
        command
            .args(self.runtime.global_args(&self.dir.join("state"), network))
            .args(verb)
            .arg("--bundle")
            .arg(&self.dir)
            .arg("--pid-file")
            .arg(&pid_file);
        let agent_end = std::os::fd::OwnedFd::from(agent_end);
        // The parent's copy of the agent's end, closed once the child has
        // its own (when the channel is not on the child's stdin).
        let mut held = None;
        match bundle::channel_fd(self.runtime.kind) {
            0 => {
                command.stdin(Stdio::from(agent_end));
            }
            fd => {
                use std::os::fd::AsRawFd;
                use std::os::unix::process::CommandExt;
                let raw = agent_end.as_raw_fd();
                command.arg("--preserve-fds").arg("1").stdin(Stdio::null());
                // SAFETY: runs in the forked child before exec, where only
                // async-signal-safe calls are allowed: dup2 is one. `raw`
                // stays open in the parent (`agent_end` lives until the
                // spawn returns), so the child's copy is open too; dup2
                // clears close-on-exec on the new descriptor.
                unsafe {
                    command.pre_exec(move || {
                        if libc::dup2(raw, fd) < 0 {
                            return Err(io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                held = Some(agent_end);
            }
        }
        command
            .arg(&self.id)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        // runsc is told to leave cgroups alone, so it is born in the
        // sandbox's (on cgroup v1 this thread steps in for the fork and
        // back out; on v2 the child is moved right after) and every process
        // of gVisor's is counted there. runc puts the container in it
        // itself (the bundle's cgroupsPath) and stays outside.
        let way_back = match self.runtime.kind {
            Kind::Gvisor => self
                .cgroup
                .enter_with_current_thread()
                .map_err(LaunchError::from)?,
            Kind::Runc => None,
        };
        let spawned = command.spawn();
        if let Some(way_back) = &way_back {
            way_back.go().map_err(LaunchError::from)?;
        }
        drop(held);
        let child =
            spawned.map_err(|e| ContainerError::RuntimeMissing(self.runtime.binary.clone(), e))?;
        if way_back.is_none() && self.runtime.kind == Kind::Gvisor {
            self.cgroup
                .add_process(child.id())
                .map_err(LaunchError::from)?;
        }
        drop(command);
        self.runtime_pid = Some(child.id());
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Some(pid) = fs::read_to_string(&pid_file)
                .ok()
                .and_then(|text| text.trim().parse::<i32>().ok())
            {
                self.init_pid = pid;
                break;
            }
            let exited = self
                .child
                .as_mut()
                .map(|c| c.try_wait())
                .transpose()
                .map_err(|e| ContainerError::Io("watch the runtime", e))?
                .flatten();
            if let Some(status) = exited {
                let log = fs::read_to_string(self.dir.join("runtime.log")).unwrap_or_default();
                return Err(ContainerError::Refused {
                    runtime: self.runtime_name(),
                    message: format!("{status}: {}", last_line(&log)),
                });
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(ContainerError::Slow {
                    runtime: self.runtime_name(),
                });
            }
            // A runtime writes its pid file some 20 ms in: looking every
            // 250 us costs a few reads and answers within a quarter of a
            // millisecond of it.
            std::thread::sleep(Duration::from_micros(250));
        }
        host_end
            .set_nonblocking(false)
            .map_err(|e| ContainerError::Io("configure the agent channel", e))?;
        self.channel = Some(host_end);
        Ok(())
    }

    fn runtime_name(&self) -> String {
        self.runtime.binary.file_name().map_or_else(
            || "the runtime".into(),
            |n| n.to_string_lossy().into_owned(),
        )
    }

    /// Where a checkpoint of its memory is kept: on the daemon's disk
    /// store, never in the runtime directory's memory.
    fn image_dir(&self) -> Result<PathBuf, ContainerError> {
        let refused = |message: &str| ContainerError::Refused {
            runtime: self.runtime_name(),
            message: message.into(),
        };
        self.images
            .as_ref()
            .ok_or_else(|| refused("there is no disk store to save its memory to"))?
            .checkpoint_path(&self.id)
            .map_err(|e| refused(&e.to_string()))
    }

    /// Whether its memory can be checkpointed to disk: its runtime is
    /// gVisor's and there is a disk store for the image.
    pub fn can_checkpoint(&self) -> bool {
        self.runtime.kind == Kind::Gvisor && self.images.is_some()
    }

    /// Whether its memory is checkpointed and nothing of it runs.
    pub fn is_checkpointed(&self) -> bool {
        self.checkpointed
    }

    /// Saves the sandbox's memory and processes to disk (`runsc
    /// checkpoint`) and lets them go: afterwards no process of it runs and
    /// it holds no memory, only its image, its root and its network path,
    /// until [`Container::restore`]. The agent's channel closes. Returns the
    /// image's size in bytes.
    pub fn checkpoint(&mut self) -> Result<u64, ContainerError> {
        if !self.can_checkpoint() {
            return Err(ContainerError::Refused {
                runtime: self.runtime_name(),
                message: "this runtime cannot checkpoint a sandbox's memory".into(),
            });
        }
        let image = self.image_dir()?;
        match fs::remove_dir_all(&image) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(ContainerError::Io("clear an old checkpoint", e)),
        }
        if let Some(parent) = image.parent() {
            fs::create_dir_all(parent)
                .map_err(|e| ContainerError::Io("make the memory image store", e))?;
        }
        fs::create_dir_all(&image)
            .and_then(|()| fs::set_permissions(&image, fs::Permissions::from_mode(0o700)))
            .map_err(|e| ContainerError::Io("make the checkpoint directory", e))?;
        let network = if self.networked { "sandbox" } else { "none" };
        let state = self.dir.join("state");
        let out = Command::new(&self.runtime.binary)
            .args(self.runtime.global_args(&state, network))
            .arg("checkpoint")
            .arg("--image-path")
            .arg(&image)
            .arg(&self.id)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| ContainerError::RuntimeMissing(self.runtime.binary.clone(), e))?;
        if !out.status.success() {
            return Err(ContainerError::Refused {
                runtime: self.runtime_name(),
                message: format!(
                    "checkpoint: {}",
                    last_line(&String::from_utf8_lossy(&out.stderr))
                ),
            });
        }
        self.checkpointed = true;
        // `runsc run` ends once its sandbox is saved; it is reaped here.
        if let Some(mut child) = self.child.take() {
            wait_or_kill(&mut child, START_TIMEOUT);
        }
        self.runtime_pid = None;
        self.init_pid = 0;
        // The saved container's record, which a restore of the same id
        // would collide with.
        let _ = Command::new(&self.runtime.binary)
            .args(self.runtime.global_args(&state, network))
            .args(["delete", "-force"])
            .arg(&self.id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        Ok(dir_bytes(&image))
    }

    /// Brings a checkpointed sandbox back (`runsc restore`): its processes
    /// go on where they were, with a fresh agent channel in place of the
    /// old one (gVisor hands the restored init the new stdin). Returns the
    /// host's end of that channel. The image is removed once it runs.
    pub fn restore(&mut self) -> Result<UnixStream, ContainerError> {
        if !self.checkpointed {
            return Err(ContainerError::Refused {
                runtime: self.runtime_name(),
                message: "the sandbox is not checkpointed".into(),
            });
        }
        fs::write(self.dir.join("config.json"), &self.config)
            .map_err(|e| ContainerError::Io("write the bundle", e))?;
        let image = self.image_dir()?;
        self.start(&[
            "restore".into(),
            "--image-path".into(),
            image.clone().into(),
        ])?;
        self.checkpointed = false;
        // The image stays until the restored sandbox has spoken
        // ([`Container::restore_confirmed`]): runsc writes its pid file
        // when it has made the container, before it opens the image, and
        // an image removed in between is a restore that fails after this
        // returned.
        self.image_in_use = true;
        self.channel.take().ok_or(ContainerError::Refused {
            runtime: self.runtime_name(),
            message: "the restored sandbox has no channel".into(),
        })
    }

    /// The restored sandbox has answered on its new channel, so its
    /// runtime has read the memory image: the image goes. Idempotent.
    pub fn restore_confirmed(&mut self) {
        if !self.image_in_use {
            return;
        }
        // One that cannot go now is left to the teardown, which removes it
        // too.
        if let Some(images) = &self.images {
            self.image_in_use = images.remove_checkpoint(&self.id).is_err();
        }
    }

    /// The sandbox id (also its hostname).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The host pid the runtime gave for the container.
    pub fn init_pid(&self) -> i32 {
        self.init_pid
    }

    /// The network namespace the sandbox's egress path binds in (a path
    /// that stays valid while this value lives) when it is not the one its
    /// init is in (gVisor's guest link).
    pub fn egress_netns(&self) -> Option<PathBuf> {
        self.guest_link
            .as_ref()
            .map(airlock_jail::net::GuestLink::egress_path)
    }

    /// The host end of the agent channel; `None` after it was taken.
    pub fn take_channel(&mut self) -> Option<UnixStream> {
        self.channel.take()
    }

    /// Usage counters of the sandbox's cgroup (the runtime's processes
    /// with everything inside).
    pub fn stats(&self) -> CgroupStats {
        self.cgroup.stats()
    }

    /// Kills every process of the sandbox at once, and the runtime's own
    /// (runc's stays outside the cgroup and holds the channel), so the
    /// agent's channel closes (the teardown follows). The runtime goes
    /// first: runc removes the container's cgroups once its init dies,
    /// and the sandbox's figures (its OOM kills, its peak memory) are read
    /// from them after this; the teardown removes them instead.
    pub fn kill(&self) {
        if let Some(pid) = self
            .runtime_pid
            .and_then(|p| rustix::process::Pid::from_raw(p as i32))
        {
            // Our unreaped child: its pid cannot have been reused.
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        self.killed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(self.cgroup.pids());
        let _ = self.cgroup.kill_all(Duration::from_secs(5));
    }

    /// Releases everything the sandbox holds. Idempotent.
    pub fn teardown(&mut self) -> Result<(), ContainerError> {
        if self.torn_down {
            return Ok(());
        }
        let mut left = Vec::new();
        // Killed processes whose parent died with them are reparented to
        // this process (a subreaper, see `start`) and reaped here, so no
        // zombie of the sandbox outlives it.
        let mut members =
            std::mem::take(&mut *self.killed.lock().unwrap_or_else(|p| p.into_inner()));
        members.extend(self.cgroup.pids());
        // `runc run` would only reap the killed init, remove its cgroups
        // and state and exit: all of which this teardown does itself (the
        // init, reparented to this subreaper, is reaped below), so it is
        // killed at once, and dies while the sandbox's processes do.
        if self.runtime.kind == Kind::Runc {
            if let Some(child) = self.child.as_mut() {
                let _ = child.kill();
            }
        }
        if self.cgroup.kill_all(Duration::from_secs(10)).is_err() {
            left.push("processes");
        }
        if let Some(mut child) = self.child.take() {
            match self.runtime.kind {
                // Killed above.
                Kind::Runc => {
                    let _ = child.wait();
                }
                // runsc takes down its sandbox and gofer processes as it
                // ends: it is given a moment for that (a zombie it left to
                // the host's init would outlive the teardown), then killed.
                Kind::Gvisor => wait_or_kill(&mut child, Duration::from_secs(5)),
            }
        }
        reap(&members);
        if self.mounted {
            // A lazy unmount of the stage takes the root and everything
            // mounted in it; the runtime's processes, which held copies,
            // are gone.
            match rustix::mount::unmount(&self.stage, rustix::mount::UnmountFlags::DETACH) {
                Ok(()) | Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => {
                    self.mounted = false
                }
                Err(_) => left.push("its root's mounts"),
            }
        }
        if self.cgroup.remove().is_err() {
            left.push("its cgroup");
        }
        if self.runtime.kind == Kind::Runc && remove_runc_cgroups(&self.id).is_err() {
            left.push("its runtime's cgroups");
        }
        if let Some(images) = &self.images {
            if images.remove_checkpoint(&self.id).is_err() {
                left.push("its memory image");
            }
        }
        if let Some(disk) = &self.disk {
            if disk.remove(&self.id).is_err() {
                left.push("its writable layer");
            }
        }
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) => left.push("its bundle directory"),
        }
        if left.is_empty() {
            if let Some(slot) = self.slot.take() {
                slot.release();
            }
            self.torn_down = true;
            Ok(())
        } else {
            Err(ContainerError::Root(format!(
                "teardown left {}",
                left.join(", ")
            )))
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// Bytes of the regular files under `dir` (not following links).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let kind = e.file_type().ok()?;
            if kind.is_dir() {
                Some(dir_bytes(&e.path()))
            } else if kind.is_file() {
                e.metadata().ok().map(|m| m.len())
            } else {
                Some(0)
            }
        })
        .sum()
}

/// Waits up to `within` for `child` to exit (looking again soon, then less
/// often: a runtime whose container was killed usually ends within a
/// millisecond or two), then kills it; reaped either way.
fn wait_or_kill(child: &mut std::process::Child, within: Duration) {
    let deadline = Instant::now() + within;
    let mut backoff = airlock_jail::Backoff::new();
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        backoff.sleep();
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Reaps those of `pids` that are (now) this process's children and have
/// exited, giving each a short while.
fn reap(pids: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(1);
    for &pid in pids {
        let Some(pid) = rustix::process::Pid::from_raw(pid) else {
            continue;
        };
        let mut backoff = airlock_jail::Backoff::new();
        loop {
            match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG) {
                // Not exited yet (killed, on its way): look again shortly.
                Ok(None) if Instant::now() < deadline => backoff.sleep(),
                // Reaped, not our child (ECHILD), or out of time.
                _ => break,
            }
        }
    }
}

/// Removes the cgroup directories runc made for sandbox `id` in every
/// hierarchy (it makes one in each mounted controller, beyond the four the
/// supervisor's own cgroup has). They must be empty (killed) by now.
pub fn remove_runc_cgroups(id: &str) -> io::Result<()> {
    let mut result = Ok(());
    for hierarchy in fs::read_dir("/sys/fs/cgroup")?.flatten() {
        let dir = hierarchy.path().join(airlock_jail::cgroup::PARENT).join(id);
        match fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => result = Err(e),
        }
    }
    result
}

/// The bundle and state directory of sandbox `id`, for reconciliation.
pub fn dir_of(runtime_dir: &RuntimeDir, id: &str) -> PathBuf {
    runtime_dir.containers().join(id)
}
