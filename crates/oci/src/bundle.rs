//! The OCI bundle of a sandbox: a pure function of its spec and of where
//! the supervisor put things (`config.json` as the runtime spec defines
//! it, built with `oci-spec`).
//!
//! The container's init is the agent, bound read-only at [`AGENT_PATH`]
//! (under the runtime's own `/dev`, so nothing of it lands in the
//! sandbox's root or its writable layer), with its channel on stdin
//! (runsc) or on descriptor 3 (runc, which replaces a socket on stdin but
//! passes extra descriptors through with `--preserve-fds`). It
//! runs as root of the sandbox with only the capabilities it needs to run
//! processes as root or `user` ([`AGENT_CAPABILITIES`]) and no_new_privs.
//! The root is the directory the supervisor assembled, writable as the
//! process tier's is; `/proc`, `/dev`, `/dev/pts`, `/dev/shm` and `/sys`
//! come from the runtime (for gVisor, its own kernel's).

use crate::Kind;
use airlock_policy::SandboxSpec;
use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxIdMappingBuilder,
    LinuxMemoryBuilder, LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType,
    LinuxPidsBuilder, LinuxResourcesBuilder, Mount, MountBuilder, PosixRlimitBuilder,
    PosixRlimitType, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Where the agent binary appears inside the container.
pub const AGENT_PATH: &str = "/dev/.airlock-agent";

/// Where the sandbox's seccomp filter appears inside the container, for
/// the agent to install on itself.
pub const SECCOMP_PATH: &str = "/dev/.airlock-seccomp";

/// Where the gvisor tier's statx shim appears inside the container (named
/// by the sandbox's `/etc/ld.so.preload`; see `compat/statx-shim.c`).
pub const SHIM_PATH: &str = "/dev/.airlock-statx-shim.so";

/// What the agent keeps: those its root children keep (the process tier's
/// `ROOT_KEEP`), and `SETPCAP` to drop the rest from a child's bounding set.
pub const AGENT_CAPABILITIES: &[Capability] = &[
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fowner,
    Capability::Fsetid,
    Capability::Kill,
    Capability::Setgid,
    Capability::Setuid,
    Capability::NetBindService,
    Capability::Setpcap,
];

/// procfs and sysfs paths hidden from the sandbox (runc's defaults and the
/// process tier's masks); gVisor's own procfs shows none of the host's.
pub const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/kallsyms",
    "/proc/scsi",
    "/sys/firmware",
];

/// Paths made read-only once the runtime has set the container up: its
/// `/dev` (the devices and mount points are made; nothing more is, as the
/// process tier seals its own) and procfs entries.
pub const READONLY_PATHS: &[&str] = &[
    "/dev",
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The descriptor the agent finds its channel on under runtime `kind`.
pub fn channel_fd(kind: Kind) -> i32 {
    match kind {
        Kind::Gvisor => 0,
        Kind::Runc => 3,
    }
}

/// Where the supervisor put what the bundle names.
#[derive(Debug, Clone)]
pub struct Placement<'a> {
    /// The sandbox's assembled root directory.
    pub root: &'a Path,
    /// The agent binary on the host.
    pub agent: &'a Path,
    /// The sandbox's hostname (its id).
    pub hostname: &'a str,
    /// The runtime the bundle is for.
    pub kind: Kind,
    /// A network namespace to join (the egress namespace of a sandbox that
    /// may reach the network); `None` gives the container a namespace of
    /// its own with loopback only.
    pub netns: Option<PathBuf>,
    /// The host uid and gid of the sandbox's root, when the runtime maps a
    /// user namespace (runc); gVisor's kernel keeps ids of its own.
    pub id_map: Option<(u32, u32)>,
    /// The statx shim on the host, bound at [`SHIM_PATH`] (gvisor tier).
    pub shim: Option<PathBuf>,
    /// The seccomp filter on the host, bound at [`SECCOMP_PATH`].
    pub seccomp: Option<PathBuf>,
    /// Whether the root is read-only (the `host` template's, where only
    /// [`Placement::writable`] may be written, as Landlock allows on the
    /// process tier).
    pub read_only_root: bool,
    /// Host directories bound read-write at the sandbox paths they name
    /// (the writable places of a read-only root).
    pub writable: Vec<(PathBuf, String)>,
}

/// The bundle could not be described.
#[derive(Debug, thiserror::Error)]
#[error("the sandbox's OCI bundle cannot be built: {0}")]
pub struct BundleError(#[from] oci_spec::OciSpecError);

fn mount(
    destination: &str,
    typ: &str,
    source: &str,
    options: &[&str],
) -> Result<Mount, BundleError> {
    Ok(MountBuilder::default()
        .destination(destination)
        .typ(typ)
        .source(source)
        .options(options.iter().map(|o| o.to_string()).collect::<Vec<_>>())
        .build()?)
}

fn namespace(
    typ: LinuxNamespaceType,
    path: Option<PathBuf>,
) -> Result<LinuxNamespace, BundleError> {
    let mut builder = LinuxNamespaceBuilder::default().typ(typ);
    if let Some(path) = path {
        builder = builder.path(path);
    }
    Ok(builder.build()?)
}

/// `/sys`: the kernel's, read-only; but for a container in a user
/// namespace that joins a network namespace of the host's (its egress
/// namespace), where the kernel refuses a sysfs, an empty read-only tmpfs,
/// as the process tier has none.
fn sys(placement: &Placement<'_>) -> Result<Mount, BundleError> {
    if placement.id_map.is_some() && placement.netns.is_some() {
        mount(
            "/sys",
            "tmpfs",
            "tmpfs",
            &["nosuid", "noexec", "nodev", "ro", "size=4k", "mode=755"],
        )
    } else {
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        )
    }
}

/// The runtime's file systems and the agent.
fn mounts(spec: &SandboxSpec, placement: &Placement<'_>) -> Result<Vec<Mount>, BundleError> {
    let shm_size = (spec.limits.memory_bytes / 2).clamp(1 << 20, 64 << 20);
    let shm = format!("size={shm_size}");
    let bind = |source: &Path, destination: &str| {
        MountBuilder::default()
            .destination(destination)
            .typ("bind")
            .source(source)
            .options(["bind", "ro", "nosuid", "nodev"].map(String::from).to_vec())
            .build()
    };
    // runc seals /dev through READONLY_PATHS once it is set up. gVisor
    // takes no read-only paths and cannot set up a /dev mounted read-only:
    // there root may add nodes to /dev, which name only gVisor's own few
    // devices (no block device exists in its kernel).
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
            ],
        )?,
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", &shm],
        )?,
        sys(placement)?,
        bind(placement.agent, AGENT_PATH)?,
    ];
    if let Some(shim) = &placement.shim {
        mounts.push(bind(shim, SHIM_PATH)?);
    }
    if let Some(seccomp) = &placement.seccomp {
        mounts.push(bind(seccomp, SECCOMP_PATH)?);
    }
    // gVisor mounts a tmpfs of its own at an empty /tmp the bundle does not
    // mount: its files would live in the sentry's memory, out of the disk
    // quota, snapshots and forks. Bound explicitly, /tmp stays the root's,
    // as on every other tier.
    let tmp_bound = placement.writable.iter().any(|(_, d)| d == "/tmp");
    if placement.kind == Kind::Gvisor && !tmp_bound {
        mounts.push(
            MountBuilder::default()
                .destination("/tmp")
                .typ("bind")
                .source(placement.root.join("tmp"))
                .options(
                    ["rbind", "rw", "nosuid", "nodev"]
                        .map(String::from)
                        .to_vec(),
                )
                .build()?,
        );
    }
    for (source, destination) in &placement.writable {
        mounts.push(
            MountBuilder::default()
                .destination(destination)
                .typ("bind")
                .source(source)
                .options(
                    ["rbind", "rw", "nosuid", "nodev"]
                        .map(String::from)
                        .to_vec(),
                )
                .build()?,
        );
    }
    Ok(mounts)
}

/// Host tasks a gVisor sandbox needs beyond its guest's: the sentry's and
/// gofer's threads and the runtime's own process.
pub const GVISOR_HOST_TASKS: u32 = 256;

/// The pids limit of a sandbox's host cgroup. Under gVisor's ptrace
/// platform every guest task costs host tasks (its stub, sentry threads)
/// and the guest's limit is counted per user (root's and `user`'s apart,
/// see [`rlimits`]); a sentry that cannot make a host task panics and
/// takes the sandbox down, so the host cgroup gets 16 tasks per guest task
/// and the sentry's own: at 8, a fork bomb crashed the sandbox in about
/// half the runs instead of meeting the guest's limit. runc's container is
/// the host's tasks.
pub fn host_pids(spec: &SandboxSpec, kind: Kind) -> u32 {
    match kind {
        Kind::Gvisor => spec
            .limits
            .pids
            .saturating_mul(16)
            .saturating_add(GVISOR_HOST_TASKS),
        Kind::Runc => spec.limits.pids,
    }
}

/// The init's rlimits, inherited by everything the agent starts. Under
/// gVisor the guest's pids limit is gVisor's own RLIMIT_NPROC (per user,
/// as Linux counts it); the host cgroup's only keeps the sentry in bounds.
fn rlimits(
    spec: &SandboxSpec,
    kind: Kind,
) -> Result<Vec<oci_spec::runtime::PosixRlimit>, BundleError> {
    Ok(match kind {
        Kind::Gvisor => vec![PosixRlimitBuilder::default()
            .typ(PosixRlimitType::RlimitNproc)
            .soft(u64::from(spec.limits.pids))
            .hard(u64::from(spec.limits.pids))
            .build()?],
        Kind::Runc => Vec::new(),
    })
}

/// `config.json` of sandbox `spec` placed as `placement` says.
pub fn config(
    spec: &SandboxSpec,
    kind: Kind,
    placement: &Placement<'_>,
) -> Result<Spec, BundleError> {
    let capabilities: HashSet<Capability> = AGENT_CAPABILITIES.iter().copied().collect();
    let mut args = vec![
        AGENT_PATH.to_owned(),
        "--fd".into(),
        channel_fd(kind).to_string(),
    ];
    if placement.seccomp.is_some() {
        args.extend(["--seccomp".to_owned(), SECCOMP_PATH.to_owned()]);
    }
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(UserBuilder::default().uid(0u32).gid(0u32).build()?)
        .args(args)
        .env(Vec::<String>::new())
        .cwd("/")
        .capabilities(
            LinuxCapabilitiesBuilder::default()
                .bounding(capabilities.clone())
                .effective(capabilities.clone())
                .permitted(capabilities)
                .inheritable(HashSet::new())
                .ambient(HashSet::new())
                .build()?,
        )
        .no_new_privileges(true)
        .rlimits(rlimits(spec, kind)?)
        .build()?;
    let mut namespaces = vec![
        namespace(LinuxNamespaceType::Pid, None)?,
        namespace(LinuxNamespaceType::Ipc, None)?,
        namespace(LinuxNamespaceType::Uts, None)?,
        namespace(LinuxNamespaceType::Mount, None)?,
        namespace(LinuxNamespaceType::Network, placement.netns.clone())?,
    ];
    if kind == Kind::Runc {
        // The sandbox sees its own cgroup as the root (gVisor's kernel
        // shows it none of the host's).
        namespaces.push(namespace(LinuxNamespaceType::Cgroup, None)?);
    }
    let mut linux = LinuxBuilder::default();
    if let Some((uid, gid)) = placement.id_map {
        namespaces.push(namespace(LinuxNamespaceType::User, None)?);
        let size = airlock_jail::runtime::UIDS_PER_SANDBOX;
        linux = linux
            .uid_mappings(vec![LinuxIdMappingBuilder::default()
                .container_id(0u32)
                .host_id(uid)
                .size(size)
                .build()?])
            .gid_mappings(vec![LinuxIdMappingBuilder::default()
                .container_id(0u32)
                .host_id(gid)
                .size(size)
                .build()?]);
    }
    let limits = &spec.limits;
    let period: u64 = 100_000;
    let resources = LinuxResourcesBuilder::default()
        .memory(
            LinuxMemoryBuilder::default()
                .limit(i64::try_from(limits.memory_bytes).unwrap_or(i64::MAX))
                .build()?,
        )
        .cpu(
            LinuxCpuBuilder::default()
                .quota(i64::from(limits.cpu_millis) * period as i64 / 1000)
                .period(period)
                .build()?,
        )
        .pids(
            LinuxPidsBuilder::default()
                .limit(i64::from(limits.pids))
                .build()?,
        )
        .build()?;
    if kind == Kind::Runc {
        // runc joins (and limits) the supervisor's cgroup for the sandbox;
        // without a path it would nest one of its own below wherever it
        // was started.
        linux = linux.cgroups_path(PathBuf::from(format!(
            "/{}/{}",
            airlock_jail::cgroup::PARENT,
            placement.hostname
        )));
    }
    let linux = linux
        .namespaces(namespaces)
        .resources(resources)
        .masked_paths(
            MASKED_PATHS
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>(),
        )
        .readonly_paths(
            READONLY_PATHS
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>(),
        )
        .build()?;
    Ok(SpecBuilder::default()
        .version("1.0.2")
        .root(
            RootBuilder::default()
                .path(placement.root)
                .readonly(placement.read_only_root)
                .build()?,
        )
        .hostname(placement.hostname)
        .mounts(mounts(spec, placement)?)
        .process(process)
        .linux(linux)
        .build()?)
}

/// The bundle of a runtime's probe: the agent, run with no arguments, as
/// the init of an empty root with no network.
pub fn probe_config(root: &Path, agent: &Path, kind: Kind) -> Result<String, BundleError> {
    let spec = SandboxSpec::default();
    let mut config = config(
        &spec,
        kind,
        &Placement {
            root,
            agent,
            hostname: "airlock-probe",
            kind,
            netns: None,
            id_map: None,
            shim: None,
            seccomp: None,
            read_only_root: false,
            writable: Vec::new(),
        },
    )?;
    if let Some(process) = config.process_mut() {
        process.set_args(Some(vec![AGENT_PATH.to_owned()]));
    }
    config.set_linux(config.linux().clone().map(|mut linux| {
        linux.set_resources(None);
        linux
    }));
    serde_json::to_string_pretty(&config)
        .map_err(|e| BundleError(oci_spec::OciSpecError::Other(e.to_string())))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn placed<'a>(root: &'a Path, agent: &'a Path, netns: Option<PathBuf>) -> Placement<'a> {
        Placement {
            root,
            agent,
            hostname: "sbx-1",
            kind: Kind::Gvisor,
            netns,
            id_map: None,
            shim: None,
            seccomp: None,
            read_only_root: false,
            writable: Vec::new(),
        }
    }

    #[test]
    fn the_agent_is_init_with_its_channel_on_stdin_and_few_capabilities() {
        let spec = SandboxSpec::default();
        let config = config(
            &spec,
            Kind::Gvisor,
            &placed(Path::new("/r"), Path::new("/usr/bin/airlock-agent"), None),
        )
        .unwrap();
        let process = config.process().as_ref().unwrap();
        assert_eq!(
            process.args().as_ref().unwrap(),
            &vec![AGENT_PATH.to_owned(), "--fd".into(), "0".into()]
        );
        assert_eq!(process.user().uid(), 0);
        assert_eq!(process.no_new_privileges(), Some(true));
        let caps = process.capabilities().as_ref().unwrap();
        let bounding = caps.bounding().as_ref().unwrap();
        assert_eq!(bounding.len(), AGENT_CAPABILITIES.len());
        assert!(!bounding.contains(&Capability::SysAdmin));
        assert!(!bounding.contains(&Capability::SysPtrace));
        assert!(caps.ambient().as_ref().unwrap().is_empty());
        let agent = config
            .mounts()
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.destination() == Path::new(AGENT_PATH))
            .unwrap();
        assert_eq!(
            agent.source().as_deref(),
            Some(Path::new("/usr/bin/airlock-agent"))
        );
        assert!(agent.options().as_ref().unwrap().contains(&"ro".to_owned()));
        assert_eq!(config.root().as_ref().unwrap().path(), Path::new("/r"));
        assert_eq!(config.hostname().as_deref(), Some("sbx-1"));
    }

    #[test]
    fn limits_and_the_network_namespace_come_from_the_spec_and_placement() {
        let mut spec = SandboxSpec::default();
        spec.limits.memory_bytes = 256 << 20;
        spec.limits.cpu_millis = 500;
        spec.limits.pids = 77;
        let netns = PathBuf::from("/proc/42/ns/net");
        let config = config(
            &spec,
            Kind::Gvisor,
            &placed(Path::new("/r"), Path::new("/a"), Some(netns.clone())),
        )
        .unwrap();
        let linux = config.linux().as_ref().unwrap();
        let resources = linux.resources().as_ref().unwrap();
        assert_eq!(
            resources.memory().as_ref().unwrap().limit(),
            Some(256 << 20)
        );
        assert_eq!(resources.cpu().as_ref().unwrap().quota(), Some(50_000));
        assert_eq!(resources.pids().as_ref().unwrap().limit(), 77);
        let namespaces = linux.namespaces().as_ref().unwrap();
        let net = namespaces
            .iter()
            .find(|n| n.typ() == LinuxNamespaceType::Network)
            .unwrap();
        assert_eq!(net.path().as_deref(), Some(netns.as_path()));
        assert!(!namespaces
            .iter()
            .any(|n| n.typ() == LinuxNamespaceType::User));
        assert!(linux.uid_mappings().is_none());
    }

    #[test]
    fn gvisor_gets_the_roots_tmp_bound_and_runc_needs_no_bind() {
        let spec = SandboxSpec::default();
        let tmp_mounts = |placement: &Placement<'_>| {
            config(&spec, placement.kind, placement)
                .unwrap()
                .mounts()
                .as_ref()
                .unwrap()
                .iter()
                .filter(|m| m.destination() == Path::new("/tmp"))
                .map(|m| m.source().clone().unwrap())
                .collect::<Vec<_>>()
        };
        let gvisor = placed(Path::new("/r"), Path::new("/a"), None);
        assert_eq!(tmp_mounts(&gvisor), vec![PathBuf::from("/r/tmp")]);
        let mut runc = gvisor.clone();
        runc.kind = Kind::Runc;
        assert!(tmp_mounts(&runc).is_empty());
        // A read-only root's writable /tmp is bound once, from where the
        // plan says.
        let mut host = gvisor.clone();
        host.read_only_root = true;
        host.writable = vec![(PathBuf::from("/w/tmp"), "/tmp".to_owned())];
        assert_eq!(tmp_mounts(&host), vec![PathBuf::from("/w/tmp")]);
    }

    #[test]
    fn a_mapped_root_gets_a_user_namespace_of_the_slot_range() {
        let spec = SandboxSpec::default();
        let mut placement = placed(Path::new("/r"), Path::new("/a"), None);
        placement.id_map = Some((200_000, 200_000));
        let config = config(&spec, Kind::Runc, &placement).unwrap();
        let linux = config.linux().as_ref().unwrap();
        assert!(linux
            .namespaces()
            .as_ref()
            .unwrap()
            .iter()
            .any(|n| n.typ() == LinuxNamespaceType::User));
        let map = &linux.uid_mappings().as_ref().unwrap()[0];
        assert_eq!((map.container_id(), map.host_id()), (0, 200_000));
        assert_eq!(map.size(), airlock_jail::runtime::UIDS_PER_SANDBOX);
    }

    #[test]
    fn a_mapped_root_in_the_hosts_network_namespace_gets_no_sysfs() {
        let spec = SandboxSpec::default();
        let sys_type = |id_map: Option<(u32, u32)>, netns: Option<&str>| {
            let mut placement = placed(Path::new("/r"), Path::new("/a"), None);
            placement.id_map = id_map;
            placement.netns = netns.map(PathBuf::from);
            let config = config(&spec, Kind::Runc, &placement).unwrap();
            let sys = config
                .mounts()
                .as_ref()
                .unwrap()
                .iter()
                .find(|m| m.destination() == Path::new("/sys"))
                .unwrap()
                .clone();
            assert!(sys.options().as_ref().unwrap().contains(&"ro".to_owned()));
            sys.typ().clone().unwrap()
        };
        let mapped = Some((200_000, 200_000));
        assert_eq!(sys_type(mapped, Some("/run/netns/x")), "tmpfs");
        assert_eq!(sys_type(mapped, None), "sysfs");
        assert_eq!(sys_type(None, Some("/run/netns/x")), "sysfs");
    }

    #[test]
    fn the_probe_runs_the_agent_bare() {
        let text = probe_config(Path::new("/r"), Path::new("/a"), Kind::Gvisor).unwrap();
        let config: Spec = serde_json::from_str(&text).unwrap();
        assert_eq!(
            config.process().as_ref().unwrap().args().as_ref().unwrap(),
            &vec![AGENT_PATH.to_owned()]
        );
    }
}
