//! cgroups: memory, CPU and task limits, the kill switch, and usage figures.
//!
//! Both hierarchies are supported and detected at run time from
//! `/proc/self/mountinfo`: cgroup v1 (one mount per controller, as on hybrid
//! hosts) and cgroup v2 (one unified tree with the controllers enabled). Each
//! sandbox gets `<mount>/airlock/<sandbox id>` in every controller it uses.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Name of the parent cgroup all sandboxes live under.
pub const PARENT: &str = "airlock";

/// A cgroup operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no usable cgroup hierarchy: need cgroup v1 memory, cpu and pids controllers, or cgroup v2 with them enabled")]
    NoHierarchy,
    #[error("cannot read the mount table")]
    MountTable(#[source] io::Error),
    #[error("cannot create cgroup {0}")]
    Create(PathBuf, #[source] io::Error),
    #[error("cannot write {1:?} to {0}")]
    Write(PathBuf, String, #[source] io::Error),
    #[error("processes of cgroup {0} did not die within {1:?}")]
    KillTimeout(PathBuf, Duration),
    #[error("cannot remove cgroup {0}")]
    Remove(PathBuf, #[source] io::Error),
    #[error(
        "this host mounts no cgroup v1 freezer (a sandbox can be paused with it, or on cgroup v2)"
    )]
    NoFreezer,
    #[error("cgroup {0} has no freezer: its sandbox was started by an airlock without pauses")]
    NotFreezable(PathBuf),
    #[error("the processes of cgroup {0} did not freeze within {1:?}")]
    FreezeTimeout(PathBuf, Duration),
}

/// Where the controllers are mounted on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// One mount per controller. `cpu` and `cpuacct` may be the same dir.
    V1 {
        memory: PathBuf,
        cpu: PathBuf,
        cpuacct: PathBuf,
        pids: PathBuf,
        /// Where pauses freeze a sandbox, when the host mounts it.
        freezer: Option<PathBuf>,
    },
    /// The unified hierarchy.
    V2 { root: PathBuf },
}

/// The limits a sandbox cgroup enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    pub memory_bytes: u64,
    pub cpu_millis: u32,
    pub pids: u32,
}

/// What a sandbox used, read when it ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CgroupStats {
    /// Times the kernel's OOM killer killed a task of the sandbox.
    pub oom_kills: u64,
    /// Peak memory use in bytes, when the kernel reports it.
    pub peak_memory_bytes: Option<u64>,
    /// CPU time used, nanoseconds.
    pub cpu_time_ns: u64,
    /// Times a fork failed at the pids limit.
    pub pids_limit_hits: u64,
}

const CFS_PERIOD_US: u64 = 100_000;

impl CgroupLayout {
    /// Detects the layout from `/proc/self/mountinfo`.
    pub fn detect() -> Result<CgroupLayout, CgroupError> {
        let table =
            crate::read_kernel_text("/proc/self/mountinfo").map_err(CgroupError::MountTable)?;
        let layout = Self::from_mountinfo(&table).ok_or(CgroupError::NoHierarchy)?;
        if let CgroupLayout::V2 { root } = &layout {
            let controllers =
                crate::read_kernel_text(root.join("cgroup.controllers")).unwrap_or_default();
            let has = |name: &str| controllers.split_whitespace().any(|c| c == name);
            if !(has("memory") && has("cpu") && has("pids")) {
                return Err(CgroupError::NoHierarchy);
            }
        }
        Ok(layout)
    }

    /// Picks the layout from a mount table: v1 when memory, cpu, cpuacct and
    /// pids are mounted as v1 controllers, else the cgroup2 mount.
    pub fn from_mountinfo(table: &str) -> Option<CgroupLayout> {
        let mut v1: Vec<(Vec<String>, PathBuf)> = Vec::new();
        let mut v2: Option<PathBuf> = None;
        for line in table.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split(' ').nth(4);
            let mut right = right.split(' ');
            let fstype = right.next();
            let super_opts = right.nth(1).unwrap_or("");
            let Some(mount_point) = mount_point else {
                continue;
            };
            match fstype {
                Some("cgroup") => {
                    let controllers = super_opts.split(',').map(str::to_owned).collect();
                    v1.push((controllers, PathBuf::from(unescape(mount_point))));
                }
                Some("cgroup2") if v2.is_none() => v2 = Some(PathBuf::from(unescape(mount_point))),
                _ => {}
            }
        }
        let find = |name: &str| {
            v1.iter()
                .find(|(controllers, _)| controllers.iter().any(|c| c == name))
                .map(|(_, path)| path.clone())
        };
        if let (Some(memory), Some(cpu), Some(cpuacct), Some(pids)) =
            (find("memory"), find("cpu"), find("cpuacct"), find("pids"))
        {
            return Some(CgroupLayout::V1 {
                memory,
                cpu,
                cpuacct,
                pids,
                freezer: find("freezer"),
            });
        }
        v2.map(|root| CgroupLayout::V2 { root })
    }

    /// The directories a sandbox named `name` has, one per distinct mount.
    pub fn sandbox_dirs(&self, name: &str) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = match self {
            CgroupLayout::V1 {
                memory,
                cpu,
                cpuacct,
                pids,
                freezer,
            } => [
                Some(memory),
                Some(cpu),
                Some(cpuacct),
                Some(pids),
                freezer.as_ref(),
            ]
            .into_iter()
            .flatten()
            .map(|m| m.join(PARENT).join(name))
            .collect(),
            CgroupLayout::V2 { root } => vec![root.join(PARENT).join(name)],
        };
        dirs.dedup();
        dirs
    }
}

/// `\040`-style escapes of mountinfo paths.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let octal = &field[i + 1..i + 4];
            if let Ok(value) = u8::from_str_radix(octal, 8) {
                out.push(value);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup(s) of one sandbox.
#[derive(Debug)]
pub struct SandboxCgroup {
    layout: CgroupLayout,
    name: String,
}

impl SandboxCgroup {
    /// The hierarchy the cgroup lives in.
    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    /// Refers to the cgroup of sandbox `name` without creating anything (used
    /// to clean up after a launcher that died).
    pub fn existing(layout: CgroupLayout, name: &str) -> SandboxCgroup {
        SandboxCgroup {
            layout,
            name: name.to_owned(),
        }
    }

    /// Creates the cgroup and sets its limits. On error, whatever was created
    /// is removed again.
    pub fn create(
        layout: CgroupLayout,
        name: &str,
        limits: CgroupLimits,
    ) -> Result<SandboxCgroup, CgroupError> {
        let cgroup = SandboxCgroup::existing(layout, name);
        cgroup.make(limits)?;
        Ok(cgroup)
    }

    /// [`SandboxCgroup::create`] for a cgroup already referred to: makes
    /// its directories and sets its limits; on error, whatever was made is
    /// removed again.
    pub fn make(&self, limits: CgroupLimits) -> Result<(), CgroupError> {
        if let Err(e) = self.create_dirs().and_then(|()| self.apply(limits)) {
            let _ = self.remove();
            return Err(e);
        }
        Ok(())
    }

    /// On cgroup v1, each controller's `tasks` file opened for writing: a
    /// thread that writes `0` to them enters the cgroup, and the kernel
    /// checks the credentials the files were opened with (root's), not the
    /// writer's. A sandbox init, unprivileged on the host, moves itself in
    /// with them while its launcher does other work; and a thread that
    /// moves itself is moved without the global threadgroup lock, whose RCU
    /// grace period makes moving another process cost milliseconds. `None`
    /// on cgroup v2, where [`SandboxCgroup::add_process`] is used instead.
    pub fn entry_files(&self) -> Result<Option<Vec<fs::File>>, CgroupError> {
        if !matches!(self.layout, CgroupLayout::V1 { .. }) {
            return Ok(None);
        }
        self.dirs()
            .into_iter()
            .map(|dir| {
                let tasks = dir.join("tasks");
                fs::OpenOptions::new()
                    .write(true)
                    .open(&tasks)
                    .map_err(|e| CgroupError::Write(tasks, "0".to_owned(), e))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// All directories of this cgroup.
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.layout.sandbox_dirs(&self.name)
    }

    fn create_dirs(&self) -> Result<(), CgroupError> {
        if let CgroupLayout::V2 { root } = &self.layout {
            let parent = root.join(PARENT);
            mkdir_ok_if_exists(&parent)?;
            write(&root.join("cgroup.subtree_control"), "+memory +cpu +pids")?;
            write(&parent.join("cgroup.subtree_control"), "+memory +cpu +pids")?;
        }
        for dir in self.dirs() {
            if let Some(parent) = dir.parent() {
                mkdir_ok_if_exists(parent)?;
            }
            fs::create_dir(&dir).map_err(|e| CgroupError::Create(dir.clone(), e))?;
        }
        Ok(())
    }

    fn apply(&self, limits: CgroupLimits) -> Result<(), CgroupError> {
        self.resize(limits.memory_bytes, limits.cpu_millis)?;
        match &self.layout {
            CgroupLayout::V1 { pids, .. } => {
                let pids_dir = pids.join(PARENT).join(&self.name);
                write(&pids_dir.join("pids.max"), &limits.pids.to_string())
            }
            CgroupLayout::V2 { root } => {
                let dir = root.join(PARENT).join(&self.name);
                write(&dir.join("pids.max"), &limits.pids.to_string())
            }
        }
    }

    /// Sets the memory and CPU limits (the memory limit may go below what
    /// the cgroup's tasks use: the kernel reclaims, or OOM-kills).
    pub fn resize(&self, memory_bytes: u64, cpu_millis: u32) -> Result<(), CgroupError> {
        let quota = u64::from(cpu_millis) * CFS_PERIOD_US / 1000;
        let value = memory_bytes.to_string();
        match &self.layout {
            CgroupLayout::V1 { memory, cpu, .. } => {
                let memory = memory.join(PARENT).join(&self.name);
                let limit = memory.join("memory.limit_in_bytes");
                let memsw = memory.join("memory.memsw.limit_in_bytes");
                // memsw may never be below the memory limit: a raise moves
                // it first, a cut moves it last.
                let raising = crate::read_kernel_text(&limit)
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok())
                    .is_some_and(|now| memory_bytes > now);
                if raising && memsw.exists() {
                    write(&memsw, &value)?;
                }
                write(&limit, &value)?;
                if !raising && memsw.exists() {
                    write(&memsw, &value)?;
                }
                let cpu = cpu.join(PARENT).join(&self.name);
                write(&cpu.join("cpu.cfs_period_us"), &CFS_PERIOD_US.to_string())?;
                write(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;
            }
            CgroupLayout::V2 { root } => {
                let dir = root.join(PARENT).join(&self.name);
                write(&dir.join("memory.max"), &value)?;
                let swap = dir.join("memory.swap.max");
                if swap.exists() {
                    write(&swap, "0")?;
                }
                write(&dir.join("cpu.max"), &format!("{quota} {CFS_PERIOD_US}"))?;
            }
        }
        Ok(())
    }

    /// Moves `pid` into every controller of this cgroup.
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        for dir in self.dirs() {
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// The pids in the cgroup right now (empty when it does not exist).
    pub fn pids(&self) -> Vec<i32> {
        let mut all = Vec::new();
        for dir in self.dirs() {
            if let Ok(text) = crate::read_kernel_text(dir.join("cgroup.procs")) {
                all.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        all.sort_unstable();
        all.dedup();
        all
    }

    /// On cgroup v1, moves the calling process, which must be
    /// single-threaded, into this cgroup, so that a child forked next starts
    /// inside it. It writes `0` (the calling thread) to each `tasks` file:
    /// the kernel moves a task that moves itself without taking the global
    /// threadgroup lock, whose RCU grace period makes moving another process
    /// (`cgroup.procs`) cost milliseconds. Returns the way back, or `None` on
    /// cgroup v2, where [`SandboxCgroup::add_process`] is used instead.
    pub fn enter_with_current_thread(&self) -> Result<Option<WayBack>, CgroupError> {
        let CgroupLayout::V1 {
            memory,
            cpu,
            cpuacct,
            pids,
            freezer,
        } = &self.layout
        else {
            return Ok(None);
        };
        let own = crate::read_kernel_text("/proc/self/cgroup").map_err(|e| {
            CgroupError::Write(PathBuf::from("/proc/self/cgroup"), String::new(), e)
        })?;
        let mut back = Vec::new();
        for (controller, mount) in [
            ("memory", Some(memory)),
            ("cpu", Some(cpu)),
            ("cpuacct", Some(cpuacct)),
            ("pids", Some(pids)),
            ("freezer", freezer.as_ref()),
        ] {
            let Some(mount) = mount else {
                continue;
            };
            let path = own_path(&own, controller).unwrap_or("/");
            let tasks = mount.join(path.trim_start_matches('/')).join("tasks");
            if !back.contains(&tasks) {
                back.push(tasks);
            }
        }
        let way_back = WayBack { tasks: back };
        for dir in self.dirs() {
            if let Err(e) = write(&dir.join("tasks"), "0") {
                let _ = way_back.go();
                return Err(e);
            }
        }
        Ok(Some(way_back))
    }

    /// The file that freezes the cgroup and the values that freeze and
    /// thaw it.
    fn freezer_file(&self) -> Result<(PathBuf, &'static str, &'static str), CgroupError> {
        match &self.layout {
            CgroupLayout::V1 {
                freezer: Some(freezer),
                ..
            } => Ok((
                freezer.join(PARENT).join(&self.name).join("freezer.state"),
                "FROZEN",
                "THAWED",
            )),
            CgroupLayout::V1 { freezer: None, .. } => Err(CgroupError::NoFreezer),
            CgroupLayout::V2 { root } => Ok((
                root.join(PARENT).join(&self.name).join("cgroup.freeze"),
                "1",
                "0",
            )),
        }
    }

    /// Whether every process of the cgroup is frozen now.
    pub fn is_frozen(&self) -> bool {
        match &self.layout {
            CgroupLayout::V1 { .. } => self.freezer_file().is_ok_and(|(file, _, _)| {
                crate::read_kernel_text(file).is_ok_and(|s| s.trim() == "FROZEN")
            }),
            CgroupLayout::V2 { root } => {
                crate::read_kernel_text(root.join(PARENT).join(&self.name).join("cgroup.events"))
                    .is_ok_and(|events| events.lines().any(|l| l.trim() == "frozen 1"))
            }
        }
    }

    /// Freezes every process of the cgroup (they keep their memory and
    /// use no CPU) and waits until all are, at most `within`; on failure
    /// it thaws them again.
    pub fn freeze(&self, within: Duration) -> Result<(), CgroupError> {
        let (file, frozen, _) = self.freezer_file()?;
        if !file.exists() {
            return Err(CgroupError::NotFreezable(self.dirs().remove(0)));
        }
        let deadline = Instant::now() + within;
        loop {
            // v1 reports FREEZING while tasks are still on their way (in a
            // vfork, an uninterruptible sleep); asking again retries them.
            write(&file, frozen)?;
            if self.is_frozen() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.thaw();
                return Err(CgroupError::FreezeTimeout(self.dirs().remove(0), within));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Thaws the cgroup's processes. Idempotent; a cgroup without a freezer
    /// is never frozen.
    pub fn thaw(&self) -> Result<(), CgroupError> {
        let (file, _, thawed) = self.freezer_file()?;
        if !file.exists() {
            return Ok(());
        }
        write(&file, thawed)
    }

    /// SIGKILLs every process in the cgroup, including double-forked
    /// daemons that left their session, and waits until it is empty. A
    /// frozen cgroup is thawed first (v1 delivers no signal to a frozen
    /// task).
    pub fn kill_all(&self, within: Duration) -> Result<(), CgroupError> {
        let _ = self.thaw();
        if let CgroupLayout::V2 { root } = &self.layout {
            let kill = root.join(PARENT).join(&self.name).join("cgroup.kill");
            if kill.exists() {
                let _ = fs::write(&kill, "1");
            }
        }
        let deadline = Instant::now() + within;
        // A SIGKILLed process is usually gone within a fraction of a
        // millisecond: look again soon, then less often.
        let mut backoff = crate::Backoff::new();
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                return Ok(());
            }
            let own = std::process::id() as i32;
            for pid in pids.into_iter().filter(|&pid| pid != own) {
                // SAFETY: kill(2) has no memory-safety preconditions; a pid
                // that exited in the meantime just gives ESRCH. The pids come
                // from this sandbox's own cgroup, so nothing outside it is hit.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            if Instant::now() > deadline {
                return Err(CgroupError::KillTimeout(self.dirs().remove(0), within));
            }
            backoff.sleep();
        }
    }

    /// Usage figures (zeros for anything the kernel does not report).
    pub fn stats(&self) -> CgroupStats {
        let read = |path: PathBuf| crate::read_kernel_text(path).unwrap_or_default();
        let num = |path: PathBuf| read(path).trim().parse::<u64>().ok();
        let keyed = |text: &str, key: &str| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(key)
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .unwrap_or(0)
        };
        match &self.layout {
            CgroupLayout::V1 {
                memory,
                cpuacct,
                pids,
                ..
            } => {
                let memory = memory.join(PARENT).join(&self.name);
                CgroupStats {
                    oom_kills: keyed(&read(memory.join("memory.oom_control")), "oom_kill "),
                    peak_memory_bytes: num(memory.join("memory.max_usage_in_bytes")),
                    cpu_time_ns: num(cpuacct.join(PARENT).join(&self.name).join("cpuacct.usage"))
                        .unwrap_or(0),
                    pids_limit_hits: keyed(
                        &read(pids.join(PARENT).join(&self.name).join("pids.events")),
                        "max ",
                    ),
                }
            }
            CgroupLayout::V2 { root } => {
                let dir = root.join(PARENT).join(&self.name);
                CgroupStats {
                    oom_kills: keyed(&read(dir.join("memory.events")), "oom_kill "),
                    peak_memory_bytes: num(dir.join("memory.peak")),
                    cpu_time_ns: keyed(&read(dir.join("cpu.stat")), "usage_usec ") * 1000,
                    pids_limit_hits: keyed(&read(dir.join("pids.events")), "max "),
                }
            }
        }
    }

    /// Removes the cgroup directories. Idempotent: missing ones are fine.
    /// The cgroup must be empty (see [`SandboxCgroup::kill_all`]).
    /// Removes the cgroup if no process is left in it, in one `rmdir` per
    /// directory (the kernel refuses, `EBUSY`, while any task remains, so
    /// no listing is needed first). False when a task is still there: then
    /// [`SandboxCgroup::kill_all`] and [`SandboxCgroup::remove`] are due,
    /// as they are on any other failure (which `remove` then reports).
    pub fn remove_if_empty(&self) -> bool {
        self.dirs()
            .into_iter()
            .all(|dir| match fs::remove_dir(&dir) {
                Ok(()) => true,
                Err(e) => e.kind() == io::ErrorKind::NotFound,
            })
    }

    pub fn remove(&self) -> Result<(), CgroupError> {
        let mut first_error = None;
        for dir in self.dirs() {
            let mut attempt = 0;
            loop {
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    // A task that just died may still be listed for a moment.
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempt < 200 => {
                        attempt += 1;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => {
                        first_error.get_or_insert(CgroupError::Remove(dir.clone(), e));
                        break;
                    }
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The cgroups the launcher came from, to return to after forking a sandbox.
#[derive(Debug)]
#[must_use = "the launcher must leave the sandbox's cgroup again"]
pub struct WayBack {
    tasks: Vec<PathBuf>,
}

impl WayBack {
    /// Moves the calling thread back where it was.
    pub fn go(&self) -> Result<(), CgroupError> {
        for tasks in &self.tasks {
            write(tasks, "0")?;
        }
        Ok(())
    }
}

/// The path of `controller` in a `/proc/self/cgroup` listing.
fn own_path<'a>(listing: &'a str, controller: &str) -> Option<&'a str> {
    listing.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == controller)
            .then_some(path)
    })
}

fn mkdir_ok_if_exists(dir: &Path) -> Result<(), CgroupError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(CgroupError::Create(dir.to_owned(), e)),
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|e| CgroupError::Write(path.to_owned(), value.to_owned(), e))
}

/// Names of the sandbox cgroups that exist under the airlock parent.
pub fn list_sandbox_cgroups(layout: &CgroupLayout) -> Vec<String> {
    let mut names = Vec::new();
    for dir in layout.sandbox_dirs("") {
        if let Ok(entries) = fs::read_dir(&dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    names.push(entry.file_name().to_string_lossy().into_owned());
                }
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_hosts_use_v1() {
        let layout = CgroupLayout::from_mountinfo(HYBRID).unwrap();
        assert_eq!(
            layout,
            CgroupLayout::V1 {
                memory: "/sys/fs/cgroup/memory".into(),
                cpu: "/sys/fs/cgroup/cpu".into(),
                cpuacct: "/sys/fs/cgroup/cpuacct".into(),
                pids: "/sys/fs/cgroup/pids".into(),
                freezer: None,
            }
        );
        assert_eq!(layout.sandbox_dirs("sbx").len(), 4);
        // A host that mounts the freezer gives each sandbox a dir there,
        // which pauses freeze.
        let with_freezer = format!(
            "{HYBRID}36 31 0:33 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
        );
        let layout = CgroupLayout::from_mountinfo(&with_freezer).unwrap();
        let dirs = layout.sandbox_dirs("sbx");
        assert_eq!(dirs.len(), 5);
        assert!(dirs.contains(&PathBuf::from("/sys/fs/cgroup/freezer/airlock/sbx")));
        let cgroup = SandboxCgroup::existing(layout, "sbx");
        assert_eq!(
            cgroup.freezer_file().unwrap(),
            (
                PathBuf::from("/sys/fs/cgroup/freezer/airlock/sbx/freezer.state"),
                "FROZEN",
                "THAWED"
            )
        );
        let without = SandboxCgroup::existing(CgroupLayout::from_mountinfo(HYBRID).unwrap(), "s");
        assert!(matches!(
            without.freezer_file(),
            Err(CgroupError::NoFreezer)
        ));
        assert!(!without.is_frozen());
    }

    #[test]
    fn comounted_cpu_cpuacct_gives_one_dir() {
        let table = "\
1 0 0:1 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
2 0 0:2 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
3 0 0:3 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";
        let layout = CgroupLayout::from_mountinfo(table).unwrap();
        assert_eq!(layout.sandbox_dirs("x").len(), 3);
    }

    #[test]
    fn unified_hosts_use_v2() {
        let table = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            CgroupLayout::from_mountinfo(table),
            Some(CgroupLayout::V2 {
                root: "/sys/fs/cgroup".into()
            })
        );
        assert_eq!(
            CgroupLayout::from_mountinfo("1 0 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }

    #[test]
    fn own_cgroup_paths() {
        let listing = "8:pids:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/x\n0::/\n";
        assert_eq!(own_path(listing, "memory"), Some("/process_api/abc"));
        assert_eq!(own_path(listing, "cpuacct"), Some("/x"));
        assert_eq!(own_path(listing, "pids"), Some("/"));
        assert_eq!(own_path(listing, "freezer"), None);
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
