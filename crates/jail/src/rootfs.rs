//! The sandbox's root filesystem as a plan of setup steps.
//!
//! [`plan`] is a pure function from the spec (and a few facts about the host)
//! to a list of [`SetupOp`]s; [`apply`] runs them against a [`RootfsSys`],
//! which is the kernel in a sandbox and a recording fake in tests. Every path
//! in an op is relative to the new root and is resolved beneath it by
//! descriptor (`openat2(RESOLVE_IN_ROOT)`), never by joining strings, so a
//! symlink planted in a template cannot send a mount or a write to a host path.

use airlock_policy::{SandboxSpec, Template};
use std::path::PathBuf;

/// uid and gid of `user` inside the sandbox.
pub const USER_ID: u32 = 1000;
/// Home of `user` and the default working directory.
pub const USER_HOME: &str = "/home/user";

/// Mount flags the plan uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags {
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

const NOSUID_NOEXEC: Flags = Flags {
    nosuid: true,
    nodev: false,
    noexec: true,
};
const HARDENED: Flags = Flags {
    nosuid: true,
    nodev: true,
    noexec: true,
};

/// Whether a host path to bind is a directory or a single file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    Dir,
    File,
}

/// One step of building the root. Paths are relative to the new root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupOp {
    /// Creates a directory (and missing parents with 0755 root) unless it
    /// exists, then sets owner and mode.
    Mkdir {
        path: String,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    /// Creates a symlink holding `target`.
    Symlink { path: String, target: String },
    /// Creates or replaces a regular file.
    WriteFile {
        path: String,
        contents: String,
        mode: u32,
    },
    /// Binds a host path, creating the mount point.
    BindHost {
        source: PathBuf,
        path: String,
        kind: NodeKind,
        read_only: bool,
        flags: Flags,
    },
    /// Binds a host file read-only (nosuid, nodev) over the regular file
    /// at `path` when the root has one there, and does nothing otherwise
    /// (the mount point is never created, so nothing is copied up): how a
    /// template's `/usr/bin/sudo` becomes the agent's shim.
    CoverFile { source: PathBuf, path: String },
    /// Attaches the detached mount `tree` the launcher handed over (a
    /// volume's, in the spec's order), creating the mount point.
    AttachTree { path: String, tree: usize },
    /// Mounts a tmpfs with the given options.
    Tmpfs {
        path: String,
        options: String,
        flags: Flags,
    },
    /// Mounts a fresh procfs of the sandbox's pid namespace.
    Proc { path: String },
    /// Mounts a private devpts instance.
    Devpts { path: String },
    /// Hides a file by binding /dev/null over it, when it exists.
    MaskFile { path: String },
    /// Makes an existing path and everything mounted below it read-only,
    /// nosuid and nodev, when it exists (a bind of the path onto itself, then
    /// one recursive attribute change).
    ReadOnly { path: String },
    /// Makes the mount whose root is `path` read-only, leaving the mounts
    /// below it as they are.
    SealMount { path: String },
    /// Makes the mount whose root is `path` and every mount below it
    /// read-only, nosuid and nodev.
    SealTree { path: String },
    /// Appends `line` to the account file `path` (`etc/passwd`,
    /// `etc/group`) unless an entry there is named `name` or has the id
    /// `id` (its third field); creates the file if it is missing. Leaves a
    /// file over [`MAX_ACCOUNT_FILE`] as it is.
    EnsureEntry {
        path: String,
        name: String,
        id: u32,
        line: String,
    },
}

impl SetupOp {
    /// The host path this step binds, which the setup opens beforehand.
    pub fn host_source(&self) -> Option<&std::path::Path> {
        match self {
            SetupOp::BindHost { source, .. } | SetupOp::CoverFile { source, .. } => {
                Some(source.as_path())
            }
            _ => None,
        }
    }
}

/// Where an image keeps the `sudo` that [`HostFacts::sudo_shim`] covers.
pub const SUDO_PATH: &str = "usr/bin/sudo";

/// The largest account file [`SetupOp::EnsureEntry`] reads.
pub const MAX_ACCOUNT_FILE: u64 = 1 << 20;

/// What [`RootfsSys::read_file`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileRead {
    Missing,
    TooLarge,
    Contents(Vec<u8>),
}

/// Whether the account file `text` has an entry named `name` or with the
/// id `id`.
fn has_entry(text: &[u8], name: &str, id: u32) -> bool {
    let id = id.to_string();
    text.split(|b| *b == b'\n').any(|line| {
        let mut fields = line.split(|b| *b == b':');
        let first = fields.next();
        let third = fields.nth(1);
        first == Some(name.as_bytes()) || third == Some(id.as_bytes())
    })
}

/// Facts about the host the plan depends on, gathered before planning.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostFacts {
    /// Top-level system entries of the host (`usr`, `bin`, `lib`, ...) as
    /// directories or symlinks (merged-/usr hosts link `bin` to `usr/bin`).
    pub system_entries: Vec<(String, HostEntry)>,
    /// Host `/etc` files and directories that are safe to share read-only and
    /// exist here (loader cache, alternatives, CA certificates).
    pub shared_etc: Vec<(String, NodeKind)>,
    /// Target of the host's `/etc/localtime` symlink.
    pub localtime: Option<String>,
    /// The agent binary, bound over an image's `sudo` (see
    /// `airlock_agent::sudo`); `None` leaves `sudo` as the image has it.
    pub sudo_shim: Option<PathBuf>,
}

/// A top-level host entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEntry {
    Dir,
    Symlink(String),
}

/// Top-level host directories the `host` template shares read-only.
pub const SYSTEM_ENTRIES: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// Host `/etc` entries the `host` template shares read-only: none hold secrets.
pub const SHARED_ETC: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl/certs",
    "ca-certificates",
];
/// Device nodes a sandbox gets, bound from the host.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// procfs files hidden behind /dev/null: the world-readable ones that tell
/// about the host kernel. Files only the host's root may open (kcore,
/// kpage*, sysrq-trigger, /proc/irq, /proc/bus, ...) need no mask: root of
/// the sandbox is an unprivileged uid on the host, and the kernel denies
/// it every inode owned by an unmapped uid whatever its capabilities.
pub const PROC_MASKED_FILES: &[&str] = &[
    "proc/keys",
    "proc/timer_list",
    "proc/sched_debug",
    "proc/latency_stats",
    "proc/kallsyms",
];
/// procfs paths made read-only: the sysctls of the sandbox's own
/// namespaces are writable by its root otherwise.
pub const PROC_READ_ONLY: &[&str] = &["proc/sys"];

/// The root filesystem plan and the paths Landlock lets the sandbox write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootfsPlan {
    pub ops: Vec<SetupOp>,
    /// Absolute sandbox paths that stay writable (Landlock rules).
    pub writable: Vec<String>,
}

fn mkdir(path: &str, mode: u32, owner: u32) -> SetupOp {
    SetupOp::Mkdir {
        path: path.to_owned(),
        mode,
        uid: owner,
        gid: owner,
    }
}

/// The dynamic loader's preload list, which the gvisor tier writes to load
/// its statx shim (see `airlock-oci`).
pub const PRELOAD_FILE: &str = "etc/ld.so.preload";

/// What the setup of a sandbox on a template writes into its writable
/// layer itself, not its processes: the files it generates (its hostname,
/// hosts and resolver) and the directories it makes or sets the mode of
/// (mount points among them), relative to the root. An export of the
/// layer leaves them out (`airlock_layers::snapshot::Elide`).
pub fn template_setup_paths() -> (Vec<String>, Vec<String>) {
    let spec = SandboxSpec {
        template: Template::Layers { layers: Vec::new() },
        ..SandboxSpec::default()
    };
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    for op in plan(&spec, &HostFacts::default(), "").ops {
        match op {
            SetupOp::WriteFile { path, .. } => files.push(path),
            SetupOp::Mkdir { path, .. } => dirs.push(path),
            _ => {}
        }
    }
    files.push(PRELOAD_FILE.to_owned());
    (files, dirs)
}

/// Builds the setup plan for `spec`. `hostname` goes into /etc/hostname and
/// /etc/hosts.
pub fn plan(spec: &SandboxSpec, facts: &HostFacts, hostname: &str) -> RootfsPlan {
    let mut ops = Vec::new();
    let mut writable: Vec<String> = Vec::new();
    let host_template = matches!(spec.template, Template::Host);

    if host_template {
        for (name, entry) in &facts.system_entries {
            ops.push(match entry {
                HostEntry::Dir => SetupOp::BindHost {
                    source: PathBuf::from("/").join(name),
                    path: name.clone(),
                    kind: NodeKind::Dir,
                    read_only: true,
                    flags: Flags {
                        nosuid: true,
                        nodev: true,
                        noexec: false,
                    },
                },
                HostEntry::Symlink(target) => SetupOp::Symlink {
                    path: name.clone(),
                    target: target.clone(),
                },
            });
        }
        // /etc is a small tmpfs of its own, so it can be made read-only,
        // with the shared binds inside it, in one step and without copying
        // a mount tree.
        ops.push(mkdir("etc", 0o755, 0));
        ops.push(SetupOp::Tmpfs {
            path: "etc".into(),
            options: "mode=0755,size=1m".into(),
            flags: HARDENED,
        });
        for (file, contents) in generated_etc(hostname) {
            ops.push(SetupOp::WriteFile {
                path: format!("etc/{file}"),
                contents,
                mode: 0o644,
            });
        }
        if let Some(target) = &facts.localtime {
            ops.push(SetupOp::Symlink {
                path: "etc/localtime".into(),
                target: target.clone(),
            });
        }
        for (name, kind) in &facts.shared_etc {
            // Left writable here: the recursive read-only of etc below
            // covers these binds in one step.
            ops.push(SetupOp::BindHost {
                source: PathBuf::from("/etc").join(name),
                path: format!("etc/{name}"),
                kind: *kind,
                read_only: false,
                flags: Flags::default(),
            });
        }
        ops.push(SetupOp::SealTree { path: "etc".into() });
    } else {
        // A template brings its own /etc; only the identity of this
        // sandbox and its resolver are written (an image's resolv.conf
        // names the resolver of wherever it was built), and the account
        // sandboxes run as by default is added where the image has none.
        ops.push(mkdir("etc", 0o755, 0));
        ops.push(SetupOp::EnsureEntry {
            path: "etc/passwd".into(),
            name: "user".into(),
            id: USER_ID,
            line: format!("user:x:{USER_ID}:{USER_ID}:user:/home/user:/bin/sh\n"),
        });
        ops.push(SetupOp::EnsureEntry {
            path: "etc/group".into(),
            name: "user".into(),
            id: USER_ID,
            line: format!("user:x:{USER_ID}:\n"),
        });
        for (file, contents) in generated_etc(hostname) {
            if file == "hostname" || file == "hosts" || file == "resolv.conf" {
                ops.push(SetupOp::WriteFile {
                    path: format!("etc/{file}"),
                    contents,
                    mode: 0o644,
                });
            }
        }
        writable.push("/".into());
    }

    ops.extend([
        mkdir("root", 0o700, 0),
        mkdir("home", 0o755, 0),
        mkdir("home/user", 0o755, USER_ID),
        mkdir("tmp", 0o1777, 0),
        mkdir("var", 0o755, 0),
        mkdir("var/tmp", 0o1777, 0),
        mkdir("run", 0o755, 0),
        mkdir("mnt", 0o755, 0),
        mkdir("mnt/user-data", 0o755, 0),
        mkdir("mnt/user-data/uploads", 0o755, USER_ID),
        mkdir("mnt/user-data/workspace", 0o755, USER_ID),
        mkdir("mnt/user-data/outputs", 0o755, USER_ID),
        mkdir("mnt/skills", 0o755, 0),
        mkdir("mnt/skills/public", 0o755, 0),
        mkdir("mnt/skills/custom", 0o755, 0),
    ]);
    if host_template {
        writable.extend(
            [
                "/root",
                "/home/user",
                "/tmp",
                "/var/tmp",
                "/run",
                "/mnt/user-data",
            ]
            .iter()
            .map(|p| p.to_string()),
        );
    }

    for mount in &spec.mounts {
        let kind = if mount.source.is_dir() {
            NodeKind::Dir
        } else {
            NodeKind::File
        };
        ops.push(SetupOp::BindHost {
            source: mount.source.clone(),
            path: mount.target.trim_start_matches('/').to_owned(),
            kind,
            read_only: mount.read_only,
            flags: Flags {
                nosuid: true,
                nodev: true,
                noexec: false,
            },
        });
        if !mount.read_only {
            writable.push(mount.target.clone());
        }
    }
    for (tree, volume) in spec.volumes.iter().enumerate() {
        ops.push(SetupOp::AttachTree {
            path: volume.target.trim_start_matches('/').to_owned(),
            tree,
        });
        if !volume.read_only {
            writable.push(volume.target.clone());
        }
    }

    if let Some(shim) = &facts.sudo_shim {
        ops.push(SetupOp::CoverFile {
            source: shim.clone(),
            path: SUDO_PATH.into(),
        });
    }

    ops.push(mkdir("proc", 0o555, 0));
    ops.push(SetupOp::Proc {
        path: "proc".into(),
    });
    ops.extend(
        PROC_MASKED_FILES
            .iter()
            .map(|p| SetupOp::MaskFile { path: (*p).into() }),
    );
    ops.extend(
        PROC_READ_ONLY
            .iter()
            .map(|p| SetupOp::ReadOnly { path: (*p).into() }),
    );

    ops.push(mkdir("dev", 0o755, 0));
    ops.push(SetupOp::Tmpfs {
        path: "dev".into(),
        options: "mode=0755,size=64k".into(),
        flags: NOSUID_NOEXEC,
    });
    for device in DEVICES {
        // A device node has nothing beneath it to exec or setuid: the bind
        // needs no flags of its own.
        ops.push(SetupOp::BindHost {
            source: PathBuf::from("/dev").join(device),
            path: format!("dev/{device}"),
            kind: NodeKind::File,
            read_only: false,
            flags: Flags::default(),
        });
    }
    ops.push(mkdir("dev/pts", 0o755, 0));
    ops.push(SetupOp::Devpts {
        path: "dev/pts".into(),
    });
    ops.push(SetupOp::Symlink {
        path: "dev/ptmx".into(),
        target: "pts/ptmx".into(),
    });
    ops.push(mkdir("dev/shm", 0o1777, 0));
    let shm_size = (spec.limits.memory_bytes / 2).clamp(1 << 20, 64 << 20);
    ops.push(SetupOp::Tmpfs {
        path: "dev/shm".into(),
        options: format!("mode=1777,size={shm_size}"),
        flags: HARDENED,
    });
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(SetupOp::Symlink {
            path: format!("dev/{name}"),
            target: target.into(),
        });
    }
    ops.push(SetupOp::SealMount { path: "dev".into() });
    if host_template {
        writable.extend(
            DEVICES
                .iter()
                .map(|d| format!("/dev/{d}"))
                .chain(["/dev/pts".to_string(), "/dev/shm".to_string()]),
        );
    }

    RootfsPlan { ops, writable }
}

/// [`plan`] for a sandbox whose kernel is not the host's (gVisor's, a VM's):
/// the same root, without the kernel's own file systems (`/proc` and
/// `/dev`, their masks and devices), which that kernel mounts itself from
/// the bundle. Their mount points stay.
pub fn guest_plan(spec: &SandboxSpec, facts: &HostFacts, hostname: &str) -> RootfsPlan {
    let mut plan = plan(spec, facts, hostname);
    let kernels = |path: &str| {
        ["proc", "dev"].iter().any(|top| {
            path.strip_prefix(top)
                .is_some_and(|rest| rest.starts_with('/'))
        })
    };
    plan.ops.retain(|op| match op {
        SetupOp::Proc { .. } | SetupOp::Devpts { .. } => false,
        SetupOp::Mkdir { path, .. } => !kernels(path),
        SetupOp::Tmpfs { path, .. }
        | SetupOp::BindHost { path, .. }
        | SetupOp::CoverFile { path, .. }
        | SetupOp::AttachTree { path, .. }
        | SetupOp::Symlink { path, .. }
        | SetupOp::MaskFile { path }
        | SetupOp::ReadOnly { path }
        | SetupOp::SealMount { path }
        | SetupOp::SealTree { path } => path != "dev" && path != "proc" && !kernels(path),
        SetupOp::WriteFile { .. } | SetupOp::EnsureEntry { .. } => true,
    });
    plan
}

/// The generated `/etc/resolv.conf` of a sandbox whose resolver is at
/// `nameserver` (the egress resolver: `127.0.0.1`, or where a guest kernel
/// with a loopback of its own reaches it).
pub fn resolv_conf(nameserver: std::net::IpAddr) -> String {
    format!("nameserver {nameserver}\noptions edns0\n")
}

/// The generated `/etc` of the `host` template: identities and names only.
fn generated_etc(hostname: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "passwd",
            "root:x:0:0:root:/root:/bin/bash\n\
             user:x:1000:1000:user:/home/user:/bin/bash\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                .into(),
        ),
        (
            "group",
            "root:x:0:\ntty:x:5:\nusers:x:100:user\nuser:x:1000:\nnogroup:x:65534:\n".into(),
        ),
        ("hostname", format!("{hostname}\n")),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
        ),
        // The egress resolver listens here in a sandbox that may reach the
        // network; with policy `none` lookups fail at once.
        (
            "resolv.conf",
            resolv_conf(std::net::Ipv4Addr::LOCALHOST.into()),
        ),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n".into(),
        ),
        // Kept tiny on purpose: every `bash -l -c` reads it, so it must cost nothing.
        (
            "profile",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nexport PATH\n"
                .into(),
        ),
    ]
}

/// Kernel operations the plan needs, relative to the new root.
pub trait RootfsSys {
    type Error;
    fn mkdir(&mut self, path: &str, mode: u32, uid: u32, gid: u32) -> Result<(), Self::Error>;
    fn symlink(&mut self, path: &str, target: &str) -> Result<(), Self::Error>;
    fn write_file(&mut self, path: &str, contents: &[u8], mode: u32) -> Result<(), Self::Error>;
    fn bind_host(
        &mut self,
        source: &std::path::Path,
        path: &str,
        kind: NodeKind,
        read_only: bool,
        flags: Flags,
    ) -> Result<(), Self::Error>;
    /// Attaches the `tree`th detached mount the setup was given at `path`,
    /// creating the directory first.
    fn attach_tree(&mut self, path: &str, tree: usize) -> Result<(), Self::Error>;
    /// See [`SetupOp::CoverFile`].
    fn cover_file(&mut self, source: &std::path::Path, path: &str) -> Result<(), Self::Error>;
    fn mount_fs(
        &mut self,
        fstype: &str,
        path: &str,
        options: &str,
        flags: Flags,
    ) -> Result<(), Self::Error>;
    fn exists(&mut self, path: &str) -> bool;
    /// The regular file at `path` (not followed if a symlink), up to `max`
    /// bytes.
    fn read_file(&mut self, path: &str, max: u64) -> Result<FileRead, Self::Error>;
    fn mask_file(&mut self, path: &str) -> Result<(), Self::Error>;
    fn read_only(&mut self, path: &str) -> Result<(), Self::Error>;
    fn seal_mount(&mut self, path: &str) -> Result<(), Self::Error>;
    fn seal_tree(&mut self, path: &str) -> Result<(), Self::Error>;
}

/// Runs the plan's ops in order.
pub fn apply<S: RootfsSys>(plan: &RootfsPlan, sys: &mut S) -> Result<(), S::Error> {
    for op in &plan.ops {
        match op {
            SetupOp::Mkdir {
                path,
                mode,
                uid,
                gid,
            } => sys.mkdir(path, *mode, *uid, *gid)?,
            SetupOp::Symlink { path, target } => sys.symlink(path, target)?,
            SetupOp::WriteFile {
                path,
                contents,
                mode,
            } => sys.write_file(path, contents.as_bytes(), *mode)?,
            SetupOp::BindHost {
                source,
                path,
                kind,
                read_only,
                flags,
            } => sys.bind_host(source, path, *kind, *read_only, *flags)?,
            SetupOp::AttachTree { path, tree } => sys.attach_tree(path, *tree)?,
            SetupOp::CoverFile { source, path } => sys.cover_file(source, path)?,
            SetupOp::Tmpfs {
                path,
                options,
                flags,
            } => sys.mount_fs("tmpfs", path, options, *flags)?,
            SetupOp::Proc { path } => sys.mount_fs("proc", path, "", HARDENED)?,
            SetupOp::Devpts { path } => sys.mount_fs(
                "devpts",
                path,
                "newinstance,ptmxmode=0666,mode=0620,gid=5",
                NOSUID_NOEXEC,
            )?,
            SetupOp::MaskFile { path } => {
                if sys.exists(path) {
                    sys.mask_file(path)?;
                }
            }
            SetupOp::ReadOnly { path } => {
                if sys.exists(path) {
                    sys.read_only(path)?;
                }
            }
            SetupOp::SealMount { path } => sys.seal_mount(path)?,
            SetupOp::EnsureEntry {
                path,
                name,
                id,
                line,
            } => {
                let mut contents = match sys.read_file(path, MAX_ACCOUNT_FILE)? {
                    FileRead::TooLarge => continue,
                    FileRead::Contents(text) if has_entry(&text, name, *id) => continue,
                    FileRead::Contents(text) => text,
                    FileRead::Missing => Vec::new(),
                };
                if !contents.is_empty() && !contents.ends_with(b"\n") {
                    contents.push(b'\n');
                }
                contents.extend_from_slice(line.as_bytes());
                sys.write_file(path, &contents, 0o644)?;
            }
            SetupOp::SealTree { path } => sys.seal_tree(path)?,
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use airlock_policy::BindMount;

    fn facts() -> HostFacts {
        HostFacts {
            system_entries: vec![
                ("usr".into(), HostEntry::Dir),
                ("bin".into(), HostEntry::Symlink("usr/bin".into())),
            ],
            shared_etc: vec![("ld.so.cache".into(), NodeKind::File)],
            localtime: None,
            sudo_shim: Some("/opt/airlock/airlock-agent".into()),
        }
    }

    /// Records every call; `exists` answers for what the recorder created
    /// and for a fixed list of paths the kernel would provide.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<String>,
        present: Vec<&'static str>,
        created: Vec<String>,
        files: std::collections::HashMap<&'static str, String>,
        written: Vec<(String, String)>,
    }

    impl RootfsSys for Recorder {
        type Error = ();
        fn mkdir(&mut self, path: &str, mode: u32, uid: u32, _gid: u32) -> Result<(), ()> {
            self.calls.push(format!("mkdir {path} {mode:o} {uid}"));
            self.created.push(path.to_owned());
            Ok(())
        }
        fn symlink(&mut self, path: &str, target: &str) -> Result<(), ()> {
            self.calls.push(format!("symlink {path} -> {target}"));
            Ok(())
        }
        fn write_file(&mut self, path: &str, contents: &[u8], _mode: u32) -> Result<(), ()> {
            self.calls.push(format!("write {path}"));
            self.written.push((
                path.to_owned(),
                String::from_utf8_lossy(contents).into_owned(),
            ));
            Ok(())
        }
        fn bind_host(
            &mut self,
            source: &std::path::Path,
            path: &str,
            _k: NodeKind,
            ro: bool,
            _f: Flags,
        ) -> Result<(), ()> {
            self.calls
                .push(format!("bind {} {path} ro={ro}", source.display()));
            Ok(())
        }
        fn attach_tree(&mut self, path: &str, tree: usize) -> Result<(), ()> {
            self.calls.push(format!("attach {tree} {path}"));
            Ok(())
        }
        fn cover_file(&mut self, source: &std::path::Path, path: &str) -> Result<(), ()> {
            self.calls
                .push(format!("cover {} {path}", source.display()));
            Ok(())
        }
        fn mount_fs(&mut self, fstype: &str, path: &str, _o: &str, _f: Flags) -> Result<(), ()> {
            self.calls.push(format!("mount {fstype} {path}"));
            Ok(())
        }
        fn exists(&mut self, path: &str) -> bool {
            self.present.contains(&path) || self.created.iter().any(|c| c == path)
        }
        fn read_file(&mut self, path: &str, _max: u64) -> Result<FileRead, ()> {
            self.calls.push(format!("read {path}"));
            Ok(match self.files.get(path) {
                Some(text) => FileRead::Contents(text.as_bytes().to_vec()),
                None => FileRead::Missing,
            })
        }
        fn mask_file(&mut self, path: &str) -> Result<(), ()> {
            self.calls.push(format!("mask {path}"));
            Ok(())
        }
        fn read_only(&mut self, path: &str) -> Result<(), ()> {
            self.calls.push(format!("ro {path}"));
            Ok(())
        }
        fn seal_mount(&mut self, path: &str) -> Result<(), ()> {
            self.calls.push(format!("seal {path}"));
            Ok(())
        }
        fn seal_tree(&mut self, path: &str) -> Result<(), ()> {
            self.calls.push(format!("seal-tree {path}"));
            Ok(())
        }
    }

    fn position(calls: &[String], call: &str) -> usize {
        calls
            .iter()
            .position(|c| c == call)
            .unwrap_or_else(|| panic!("no `{call}` in {calls:#?}"))
    }

    #[test]
    fn host_template_shares_system_dirs_read_only_and_generates_etc() {
        let plan = plan(&SandboxSpec::default(), &facts(), "sbx-1");
        let mut rec = Recorder {
            present: vec!["proc/timer_list", "proc/sys"],
            ..Default::default()
        };
        apply(&plan, &mut rec).unwrap();
        let calls = &rec.calls;
        position(calls, "bind /usr usr ro=true");
        position(calls, "symlink bin -> usr/bin");
        assert!(position(calls, "mount tmpfs etc") < position(calls, "write etc/passwd"));
        position(calls, "bind /etc/ld.so.cache etc/ld.so.cache ro=false");
        // /etc is made read-only after everything inside it exists.
        assert!(position(calls, "write etc/passwd") < position(calls, "seal-tree etc"));
        // The shared /etc binds become read-only with the recursive
        // read-only of etc, so they must come before it.
        assert!(
            position(calls, "bind /etc/ld.so.cache etc/ld.so.cache ro=false")
                < position(calls, "seal-tree etc")
        );
        // Sensitive procfs entries are masked only after procfs is mounted.
        assert!(position(calls, "mount proc proc") < position(calls, "mask proc/timer_list"));
        position(calls, "ro proc/sys");
        assert!(
            !calls.iter().any(|c| c == "mask proc/keys"),
            "absent paths are skipped"
        );
        // /dev is read-only after its nodes are bound.
        assert!(position(calls, "bind /dev/null dev/null ro=false") < position(calls, "seal dev"));
        position(calls, "mkdir home/user 755 1000");
        position(calls, "mkdir tmp 1777 0");
        assert!(plan.writable.contains(&"/home/user".to_string()));
        assert!(!plan
            .writable
            .iter()
            .any(|w| w == "/" || w == "/usr" || w == "/etc"));
    }

    #[test]
    fn volumes_attach_in_order_after_the_dirs_and_only_writable_ones_are_writable() {
        let mut spec = SandboxSpec::default();
        for (target, read_only) in [("/home/user/data", false), ("/mnt/shared", true)] {
            spec.volumes.push(airlock_policy::VolumeMount {
                volume: "vol-1".into(),
                source: "/srv/disk/volumes/vol-1".into(),
                target: target.into(),
                read_only,
            });
        }
        let plan = plan(&spec, &facts(), "sbx-1");
        let mut rec = Recorder::default();
        apply(&plan, &mut rec).unwrap();
        let calls = &rec.calls;
        assert!(
            position(calls, "mkdir home/user 755 1000")
                < position(calls, "attach 0 home/user/data")
        );
        assert!(
            position(calls, "attach 0 home/user/data") < position(calls, "attach 1 mnt/shared")
        );
        assert!(plan.writable.contains(&"/home/user/data".to_string()));
        assert!(!plan.writable.contains(&"/mnt/shared".to_string()));
        // A guest kernel's plan attaches them too.
        let guest = guest_plan(&spec, &facts(), "sbx-1");
        assert!(guest
            .ops
            .iter()
            .any(|op| matches!(op, SetupOp::AttachTree { tree: 1, .. })));
    }

    #[test]
    fn generated_etc_has_no_secrets() {
        let plan = plan(&SandboxSpec::default(), &facts(), "sbx-1");
        for op in &plan.ops {
            if let SetupOp::WriteFile { path, contents, .. } = op {
                assert!(!path.contains("shadow") && !path.contains("ssh"), "{path}");
                assert!(!contents.contains("$6$"));
                if path.contains("resolv") {
                    // Generated: the sandbox's own resolver, nothing of the host's.
                    assert_eq!(contents.as_str(), "nameserver 127.0.0.1\noptions edns0\n");
                }
            }
            if let SetupOp::BindHost { source, .. } = op {
                let s = source.to_string_lossy();
                assert!(
                    !s.contains("shadow") && !s.contains("ssh") && !s.contains("private"),
                    "{s}"
                );
            }
        }
        let hosts = plan
            .ops
            .iter()
            .find_map(|op| match op {
                SetupOp::WriteFile { path, contents, .. } if path == "etc/hosts" => {
                    Some(contents.clone())
                }
                _ => None,
            })
            .unwrap();
        assert!(hosts.contains("sbx-1"));
    }

    #[test]
    fn dir_template_writes_root_and_keeps_its_etc() {
        let spec = SandboxSpec {
            template: Template::Dir {
                path: "/srv/rootfs".into(),
            },
            ..SandboxSpec::default()
        };
        let plan = plan(&spec, &facts(), "sbx-2");
        assert!(plan.writable.contains(&"/".to_string()));
        assert!(!plan.ops.iter().any(
            |op| matches!(op, SetupOp::BindHost { source, .. } if source == &PathBuf::from("/usr"))
        ));
        assert!(!plan
            .ops
            .iter()
            .any(|op| matches!(op, SetupOp::WriteFile { path, .. } if path == "etc/passwd")));
        // The image's resolv.conf names the resolver of where it was built:
        // the sandbox's own is written over it.
        assert!(plan.ops.iter().any(|op| matches!(
            op,
            SetupOp::WriteFile { path, contents, .. }
                if path == "etc/resolv.conf" && contents.starts_with("nameserver 127.0.0.1\n")
        )));
    }

    #[test]
    fn a_templates_accounts_gain_user_only_where_missing() {
        let spec = SandboxSpec {
            template: Template::Dir {
                path: "/srv/rootfs".into(),
            },
            ..SandboxSpec::default()
        };
        let plan = plan(&spec, &facts(), "sbx-4");
        let written = |files: &[(&'static str, &str)]| {
            let mut rec = Recorder::default();
            for (path, text) in files {
                rec.files.insert(path, (*text).to_owned());
            }
            apply(&plan, &mut rec).unwrap();
            rec.written
                .into_iter()
                .filter(|(path, _)| path == "etc/passwd" || path == "etc/group")
                .collect::<Vec<_>>()
        };
        // An image without the account (python:slim has none): appended,
        // after a missing final newline.
        assert_eq!(
            written(&[
                ("etc/passwd", "root:x:0:0:root:/root:/bin/bash"),
                ("etc/group", "root:x:0:\n")
            ]),
            [
                (
                    "etc/passwd".to_owned(),
                    "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/sh\n"
                        .to_owned()
                ),
                (
                    "etc/group".to_owned(),
                    "root:x:0:\nuser:x:1000:\n".to_owned()
                )
            ]
        );
        // An image with uid 1000 under another name, or `user` itself: kept.
        assert!(written(&[
            ("etc/passwd", "node:x:1000:1000::/home/node:/bin/sh\n"),
            ("etc/group", "user:x:1001:\n")
        ])
        .is_empty());
        // No account files at all: made.
        assert_eq!(written(&[]).len(), 2);
    }

    #[test]
    fn user_mounts_follow_their_mode() {
        let spec = SandboxSpec {
            mounts: vec![
                BindMount::parse("/srv/in:/mnt/in:ro").unwrap(),
                BindMount::parse("/srv/out:/mnt/out").unwrap(),
            ],
            ..SandboxSpec::default()
        };
        let plan = plan(&spec, &facts(), "sbx-3");
        let mut rec = Recorder::default();
        apply(&plan, &mut rec).unwrap();
        position(&rec.calls, "bind /srv/in mnt/in ro=true");
        position(&rec.calls, "bind /srv/out mnt/out ro=false");
        assert!(plan.writable.contains(&"/mnt/out".to_string()));
        assert!(!plan.writable.contains(&"/mnt/in".to_string()));
    }
    #[test]
    fn an_images_sudo_is_covered_by_the_agent_on_every_kernel() {
        let spec = SandboxSpec {
            template: Template::Layers {
                layers: vec!["/layers/a".into()],
            },
            ..SandboxSpec::default()
        };
        for plan in [
            plan(&spec, &facts(), "sbx-1"),
            guest_plan(&spec, &facts(), "sbx-1"),
        ] {
            let mut rec = Recorder::default();
            apply(&plan, &mut rec).unwrap();
            position(&rec.calls, "cover /opt/airlock/airlock-agent usr/bin/sudo");
            assert!(plan
                .ops
                .iter()
                .filter_map(SetupOp::host_source)
                .any(|source| source == std::path::Path::new("/opt/airlock/airlock-agent")));
        }
        // Without a shim, nothing covers it.
        let bare = plan(&spec, &HostFacts::default(), "sbx-1");
        assert!(!bare
            .ops
            .iter()
            .any(|op| matches!(op, SetupOp::CoverFile { .. })));
    }

    #[test]
    fn a_guest_kernel_gets_the_root_without_proc_and_dev() {
        let spec = SandboxSpec::default();
        let guest = guest_plan(&spec, &HostFacts::default(), "sbx-1");
        let own = plan(&spec, &HostFacts::default(), "sbx-1");
        assert!(own.ops.iter().any(|op| matches!(op, SetupOp::Proc { .. })));
        for op in &guest.ops {
            let path = match op {
                SetupOp::Mkdir { path, .. }
                | SetupOp::Tmpfs { path, .. }
                | SetupOp::BindHost { path, .. }
                | SetupOp::CoverFile { path, .. }
                | SetupOp::AttachTree { path, .. }
                | SetupOp::Symlink { path, .. }
                | SetupOp::MaskFile { path }
                | SetupOp::ReadOnly { path }
                | SetupOp::SealMount { path }
                | SetupOp::SealTree { path }
                | SetupOp::WriteFile { path, .. }
                | SetupOp::EnsureEntry { path, .. } => path.as_str(),
                SetupOp::Proc { .. } | SetupOp::Devpts { .. } => panic!("{op:?} in a guest plan"),
            };
            assert!(
                !path.starts_with("proc/") && !path.starts_with("dev/"),
                "{op:?}"
            );
            if path == "proc" || path == "dev" {
                assert!(matches!(op, SetupOp::Mkdir { .. }), "{op:?}");
            }
        }
        // Everything else is the same plan.
        assert!(guest.ops.iter().all(|op| own.ops.contains(op)));
        assert!(guest
            .ops
            .contains(&mkdir("mnt/user-data/workspace", 0o755, USER_ID)));
    }
}
