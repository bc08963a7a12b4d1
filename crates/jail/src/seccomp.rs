//! The sandbox's syscall filter: a reviewed deny table compiled to seccomp BPF.
//!
//! The filter is installed once, by the sandbox's init, right before it execs
//! the agent: after `no_new_privs`, before Landlock (DESIGN.md: no_new_privs →
//! seccomp → landlock → exec). Every process in the sandbox inherits it and
//! nothing inside can remove it.
//!
//! # Model
//!
//! The filter is a *deny list* with a default of allow. The namespaces, the
//! cgroup and Landlock are the boundary; this filter takes away the kernel
//! interfaces that the sandbox never needs and that either reach outside the
//! namespaces (clock, keyrings, modules, reboot) or are large kernel attack
//! surface (`bpf`, `io_uring`, `userfaultfd`, `perf_event_open`), in the spirit
//! of Docker's default profile and Firecracker's per-syscall filters.
//!
//! [`RULES`] is the single source of truth: one row per syscall, each with the
//! condition under which it is denied, the errno it gets and the reason. A
//! reviewer reads the table, not the BPF. The unit tests keep a second,
//! independently written list of what must be denied, check that it matches
//! the table, and make every listed call in a forked child under the real
//! filter — once as built, and once with the errnos shifted to values no
//! kernel returns, which proves that the filter, not a kernel permission
//! check, is what denies (so deleting or weakening a row fails the tests
//! even when they run unprivileged).
//!
//! # Program layout
//!
//! ```text
//! 0  ld  seccomp_data.arch
//! 1  jeq AUDIT_ARCH_X86_64 ? +1 : +0
//! 2  ret KILL_PROCESS                 ; i386 (int 0x80) and any foreign ABI
//! 3  ld  seccomp_data.nr
//! 4  jge X32_SYSCALL_BIT ? +0 : +1
//! 5  ret ERRNO(EPERM)                 ; x32 ABI, and any nr >= 0x40000000
//! 6… a binary search over the rows' numbers: `jge mid ? +0 : +1; ja upper`
//!    down to leaves of at most 8 rows, each `jeq nr` in turn, then
//!    `ret ALLOW` and the leaf's `ret ERRNO(…)`s; a conditional row's
//!    argument check follows its `jeq`
//! ```
//!
//! The program is compiled here, not by `seccompiler` (whose type it
//! keeps): seccompiler chains the rows one after the other, so an allowed
//! call ran through all ~170 of them, and the kernel, which walks the
//! program for every syscall number when it installs it (to cache the
//! calls that are always allowed), spent about 0.1 ms of every launch
//! there. The search makes any path about a dozen instructions.
//!
//! Apart from the conditional rows (`clone`, `ioctl`, `personality`), the
//! program only looks at `nr` and `arch`, so the kernel's seccomp action cache
//! (Linux ≥ 5.11) marks every other syscall as always-allowed and skips the
//! BPF entirely for them.
//!
//! # Architecture
//!
//! The table is written for x86_64. On any other architecture the module
//! still compiles but [`RULES`] is empty and [`sandbox_filter`] returns
//! [`SeccompError::UnsupportedArch`], so a launch fails closed with a clear
//! message instead of running without a filter.

use std::io;

pub use seccompiler::BpfProgram;

/// When a [`Rule`] denies its syscall.
///
/// Argument conditions compare the *low 32 bits* of the argument. Every
/// argument the table inspects is a 32-bit quantity in the kernel (`clone`
/// takes `lower_32_bits(flags)`, `ioctl`'s request and `personality`'s persona
/// are `unsigned int`), so comparing all 64 bits would let a caller dodge a
/// rule by setting high bits that the kernel then ignores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deny {
    /// Every call.
    Always,
    /// Calls where argument `arg` has at least one of `bits` set.
    IfAnyBitSet {
        /// Index of the argument (0–5).
        arg: u8,
        /// The bits, any one of which denies the call; must not be empty.
        bits: u32,
    },
    /// Calls where argument `arg` equals one of `values`.
    IfArgIn {
        /// Index of the argument (0–5).
        arg: u8,
        /// The denied values; must not be empty.
        values: &'static [u32],
    },
    /// Calls where argument `arg` equals none of `values`.
    UnlessArgIn {
        /// Index of the argument (0–5).
        arg: u8,
        /// The only allowed values; must not be empty.
        values: &'static [u32],
    },
}

/// One row of the deny table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The x86_64 syscall number.
    pub syscall: i64,
    /// The syscall's name, as in `man 2`.
    pub name: &'static str,
    /// When the call is denied.
    pub deny: Deny,
    /// The errno a denied call fails with.
    pub errno: i32,
    /// Why the sandbox must not have it.
    pub reason: &'static str,
}

/// Errors of building or installing the filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The filter only exists for x86_64.
    #[error("the sandbox seccomp filter is written for x86_64 and cannot be built for {arch}")]
    UnsupportedArch {
        /// The architecture this binary was built for.
        arch: &'static str,
    },
    /// Two rows name the same syscall.
    #[error("the seccomp rule table lists {name} more than once")]
    DuplicateRule {
        /// The syscall listed twice.
        name: &'static str,
    },
    /// A conditional row has an empty condition, which would deny every call.
    #[error("the seccomp rule for {name} has an empty argument condition")]
    EmptyCondition {
        /// The syscall of the row.
        name: &'static str,
    },
    /// A row names a number that is not a native x86_64 syscall.
    #[error("the seccomp rule for {name} names no native syscall number")]
    BadSyscallNumber {
        /// The syscall of the row.
        name: &'static str,
    },
    /// A row's condition looks at an argument a syscall does not have.
    #[error("the seccomp rule for {name} inspects an argument past the sixth")]
    BadArgument {
        /// The syscall of the row.
        name: &'static str,
    },
    /// The program is empty.
    #[error("the seccomp program is empty")]
    EmptyProgram,
    /// The program exceeds the kernel's instruction limit.
    #[error("the seccomp program has {len} instructions, more than the kernel's limit of {BPF_MAXINSNS}")]
    ProgramTooLong {
        /// Number of instructions.
        len: usize,
    },
    /// A program's bytes are not whole instructions.
    #[error("a seccomp program of {len} bytes is not whole 8-byte instructions")]
    Truncated {
        /// Its length.
        len: usize,
    },
    /// `no_new_privs` could not be read.
    #[error("could not read the no_new_privs flag")]
    NoNewPrivsQuery(#[source] io::Error),
    /// `no_new_privs` is not set on the calling thread.
    #[error("no_new_privs must be set before the seccomp filter is installed")]
    NoNewPrivsNotSet,
    /// The kernel refused the filter.
    #[error("the kernel refused the seccomp filter")]
    Install(#[source] io::Error),
}

/// Bit 30 of the syscall number selects the x32 ABI on x86_64.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `AUDIT_ARCH_X86_64` from `<linux/audit.h>`: `EM_X86_64 | __AUDIT_ARCH_64BIT
/// | __AUDIT_ARCH_LE`.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;

/// `BPF_MAXINSNS` from `<linux/bpf_common.h>`.
const BPF_MAXINSNS: usize = 4096;

/// Offsets into `struct seccomp_data { int nr; __u32 arch; … }`.
#[cfg(target_arch = "x86_64")]
const SECCOMP_DATA_NR: u32 = 0;
#[cfg(target_arch = "x86_64")]
const SECCOMP_DATA_ARCH: u32 = 4;
/// `seccomp_data.args[0]`; each argument is 8 bytes.
#[cfg(target_arch = "x86_64")]
const SECCOMP_DATA_ARGS: u32 = 16;

// Classic BPF opcodes (`<linux/filter.h>`), as the 16-bit `code` field.
#[cfg(target_arch = "x86_64")]
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20)
#[cfg(target_arch = "x86_64")]
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
#[cfg(target_arch = "x86_64")]
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
#[cfg(target_arch = "x86_64")]
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
#[cfg(target_arch = "x86_64")]
const BPF_JMP_JSET_K: u16 = 0x05 | 0x40; // BPF_JMP | BPF_JSET | BPF_K
#[cfg(target_arch = "x86_64")]
const BPF_JMP_JA: u16 = 0x05; // BPF_JMP | BPF_JA

/// The personas Docker's default profile allows: `PER_LINUX` (0),
/// `PER_LINUX32` (0x8), `UNAME26` (0x20000), `PER_LINUX32 | UNAME26` and the
/// query `0xffffffff`.
#[cfg(target_arch = "x86_64")]
const PERSONALITY_ALLOWED: [u32; 5] = [0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

/// Every namespace flag `clone` could take. `CLONE_NEWTIME` (0x80) falls into
/// `clone`'s exit-signal byte, so the kernel cannot create a time namespace
/// through `clone` at all; it is listed anyway because no valid exit signal
/// has that bit, so denying it costs nothing and keeps the list complete.
#[cfg(target_arch = "x86_64")]
const CLONE_NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWTIME) as u32;

/// The terminal ioctls that inject input: `TIOCSTI` and `TIOCLINUX`.
#[cfg(target_arch = "x86_64")]
const IOCTL_DENIED: [u32; 2] = [libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// `open_tree_attr(2)` (Linux 6.15, same number on every architecture); the
/// `libc` crate has no constant for it yet.
#[cfg(target_arch = "x86_64")]
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// One row per syscall; see the module docs. Rows are grouped by topic.
///
/// Not listed on purpose: `stime` (no x86_64 syscall; the i386 one is killed
/// by the arch check), `create_module`, `get_kernel_syms`, `query_module`
/// (ENOSYS since Linux 2.6, no `libc` constants) and the never-implemented
/// `afs_syscall`, `tuxcall`, `security`, `vserver`, `getpmsg`, `putpmsg`.
#[cfg(target_arch = "x86_64")]
pub const RULES: &[Rule] = &[
    // --- Mounts: the mount namespace is final before the agent runs. -------
    rule(libc::SYS_mount, "mount", "attaches or remounts filesystems; the mount table is final before the agent starts, and a mount could cover or re-expose paths the launch plan decided on"),
    rule(libc::SYS_umount2, "umount2", "detaching a mount could expose what the launch plan mounted over"),
    rule(libc::SYS_pivot_root, "pivot_root", "changes the root of the mount namespace; only the jail's setup does this, before the filter exists"),
    rule(libc::SYS_move_mount, "move_mount", "new mount API: attaches a detached mount anywhere, same power as mount(2)"),
    rule(libc::SYS_open_tree, "open_tree", "new mount API: clones a mount subtree as a detached mount for move_mount"),
    rule(SYS_OPEN_TREE_ATTR, "open_tree_attr", "new mount API: open_tree plus mount_setattr in one call"),
    rule(libc::SYS_fsopen, "fsopen", "new mount API: creates a filesystem context, the first step of mounting"),
    rule(libc::SYS_fsconfig, "fsconfig", "new mount API: configures a filesystem context and creates its superblock"),
    rule(libc::SYS_fsmount, "fsmount", "new mount API: turns a filesystem context into a mount"),
    rule(libc::SYS_fspick, "fspick", "new mount API: reopens an existing superblock for reconfiguration"),
    rule(libc::SYS_mount_setattr, "mount_setattr", "changes mount flags (read-only, nosuid, noexec, idmapping) of existing mounts"),
    // --- Namespaces: a new user namespace grants every capability over it. --
    rule(libc::SYS_unshare, "unshare", "new namespaces, a user namespace above all, hand the process capabilities that reach kernel code unprivileged users cannot (netfilter, mounts, …)"),
    rule(libc::SYS_setns, "setns", "joins another namespace; the sandbox holds no namespace descriptors, and must never use one"),
    Rule {
        syscall: libc::SYS_clone,
        name: "clone",
        deny: Deny::IfAnyBitSet { arg: 0, bits: CLONE_NAMESPACE_FLAGS },
        errno: libc::EPERM,
        reason: "clone with a namespace flag is unshare by another name; plain fork and thread creation (no namespace flags) stay allowed",
    },
    Rule {
        syscall: libc::SYS_clone3,
        name: "clone3",
        deny: Deny::Always,
        errno: libc::ENOSYS,
        reason: "its flags live in struct clone_args in memory, which seccomp cannot read; ENOSYS (not EPERM) makes glibc and musl fall back to clone, whose flags are filtered",
    },
    // --- Kernel keyrings: not namespaced. ---------------------------------
    rule(libc::SYS_keyctl, "keyctl", "kernel keyrings are not namespaced: keys of the same uid elsewhere would be reachable, and the code has a history of exploitable bugs"),
    rule(libc::SYS_add_key, "add_key", "kernel keyrings are not namespaced (see keyctl)"),
    rule(libc::SYS_request_key, "request_key", "kernel keyrings are not namespaced, and it can make the kernel run a host upcall (see keyctl)"),
    // --- Large kernel attack surface. --------------------------------------
    rule(libc::SYS_bpf, "bpf", "loads eBPF programs and maps: a large, frequently exploited kernel surface the sandbox never needs"),
    rule(libc::SYS_perf_event_open, "perf_event_open", "performance counters leak kernel addresses and timing side channels, and are frequent exploit targets"),
    rule(libc::SYS_userfaultfd, "userfaultfd", "lets a process pause the kernel inside a page fault at a chosen moment, the standard tool for winning kernel races"),
    rule(libc::SYS_io_uring_setup, "io_uring_setup", "io_uring does syscall work asynchronously, out of this filter's sight, and is among the largest sources of kernel exploits"),
    rule(libc::SYS_io_uring_enter, "io_uring_enter", "io_uring (see io_uring_setup)"),
    rule(libc::SYS_io_uring_register, "io_uring_register", "io_uring (see io_uring_setup)"),
    // --- The host kernel itself. -------------------------------------------
    rule(libc::SYS_kexec_load, "kexec_load", "replaces the running kernel"),
    rule(libc::SYS_kexec_file_load, "kexec_file_load", "replaces the running kernel"),
    rule(libc::SYS_init_module, "init_module", "loads code into the host kernel"),
    rule(libc::SYS_finit_module, "finit_module", "loads code into the host kernel"),
    rule(libc::SYS_delete_module, "delete_module", "unloads host kernel modules"),
    rule(libc::SYS_reboot, "reboot", "reboots or halts the machine (and in a pid namespace kills its init)"),
    rule(libc::SYS_swapon, "swapon", "changes the host's swap devices"),
    rule(libc::SYS_swapoff, "swapoff", "changes the host's swap devices"),
    rule(libc::SYS_acct, "acct", "host-wide process accounting to a file of the caller's choosing"),
    rule(libc::SYS_syslog, "syslog", "reads or clears the kernel log, which leaks kernel addresses and host activity"),
    rule(libc::SYS_quotactl, "quotactl", "manages disk quotas of host filesystems"),
    rule(libc::SYS_quotactl_fd, "quotactl_fd", "manages disk quotas of host filesystems"),
    rule(libc::SYS_lookup_dcookie, "lookup_dcookie", "kernel profiling interface (oprofile) that resolves internal dentry cookies; removed from recent kernels"),
    rule(libc::SYS_nfsservctl, "nfsservctl", "the old NFS server control interface (ENOSYS since Linux 3.1); denied so an old kernel never serves it"),
    rule(libc::SYS__sysctl, "_sysctl", "the binary sysctl interface, writes kernel parameters on kernels before 5.5"),
    rule(libc::SYS_uselib, "uselib", "obsolete a.out shared-library loader, an old kernel path with a history of bugs"),
    rule(libc::SYS_iopl, "iopl", "raw hardware I/O port access"),
    rule(libc::SYS_ioperm, "ioperm", "raw hardware I/O port access"),
    rule(libc::SYS_vhangup, "vhangup", "hangs up the current terminal, which may be shared with the outside"),
    // --- The clock: time namespaces only offset monotonic and boottime. ---
    rule(libc::SYS_settimeofday, "settimeofday", "sets the host's wall clock, which is not namespaced"),
    rule(libc::SYS_clock_settime, "clock_settime", "sets the host's clocks, which are not namespaced"),
    rule(libc::SYS_clock_adjtime, "clock_adjtime", "adjusts the host's clocks (NTP discipline); programs read time with clock_gettime"),
    rule(libc::SYS_adjtimex, "adjtimex", "adjusts the host's clock (NTP discipline); denied outright, including the read-only query"),
    // --- Other processes: the pid namespace already hides the outside. ----
    rule(libc::SYS_ptrace, "ptrace", "defence in depth: the sandbox never needs to trace, and the pid namespace already hides everything outside"),
    rule(libc::SYS_process_vm_readv, "process_vm_readv", "reads another process's memory under ptrace rules (see ptrace)"),
    rule(libc::SYS_process_vm_writev, "process_vm_writev", "writes another process's memory under ptrace rules (see ptrace)"),
    rule(libc::SYS_pidfd_getfd, "pidfd_getfd", "copies a descriptor out of another process under ptrace rules (see ptrace)"),
    // --- Filesystem handles: the Shocker escape. ---------------------------
    rule(libc::SYS_open_by_handle_at, "open_by_handle_at", "opens files by handle, skipping the path walk and with it the mount namespace (the Shocker container escape)"),
    rule(libc::SYS_name_to_handle_at, "name_to_handle_at", "makes the handles open_by_handle_at takes and leaks inode identities"),
    // --- Argument conditions. ----------------------------------------------
    Rule {
        syscall: libc::SYS_personality,
        name: "personality",
        deny: Deny::UnlessArgIn { arg: 0, values: &PERSONALITY_ALLOWED },
        errno: libc::EPERM,
        reason: "other personas switch off exploit mitigations (ADDR_NO_RANDOMIZE disables ASLR, READ_IMPLIES_EXEC makes data executable); Docker's allowed set stays",
    },
    Rule {
        syscall: libc::SYS_ioctl,
        name: "ioctl",
        deny: Deny::IfArgIn { arg: 1, values: &IOCTL_DENIED },
        errno: libc::EPERM,
        reason: "TIOCSTI pushes bytes into a terminal's input queue and TIOCLINUX can paste the console selection: both inject commands into whoever reads the terminal",
    },
];

/// No table for other architectures; see the module docs.
#[cfg(not(target_arch = "x86_64"))]
pub const RULES: &[Rule] = &[];

/// Socket families the egress worker may open.
#[cfg(target_arch = "x86_64")]
const WORKER_SOCKET_FAMILIES: [u32; 2] = [libc::AF_INET as u32, libc::AF_INET6 as u32];

/// What the egress worker is denied on top of [`RULES`]. The worker parses
/// hostile bytes (ClientHellos, HTTP heads, DNS queries) as an unprivileged
/// user with no file access (Landlock); these rows take away what a
/// compromised worker could still use to reach beyond its sockets.
#[cfg(target_arch = "x86_64")]
pub const WORKER_RULES: &[Rule] = &[
    rule(libc::SYS_execve, "execve", "the worker runs no program: a compromised one must not start a shell or anything else"),
    rule(libc::SYS_execveat, "execveat", "as execve"),
    rule(libc::SYS_open, "open", "the worker opens no file once confined (its resolver configuration is read before)"),
    rule(libc::SYS_openat, "openat", "as open"),
    rule(libc::SYS_openat2, "openat2", "as open"),
    rule(libc::SYS_creat, "creat", "as open"),
    rule(libc::SYS_kill, "kill", "the worker signals no process (abort uses tgkill on itself)"),
    Rule {
        syscall: libc::SYS_socket,
        name: "socket",
        deny: Deny::UnlessArgIn { arg: 0, values: &WORKER_SOCKET_FAMILIES },
        errno: libc::EPERM,
        reason: "the worker needs only TCP and UDP over IPv4 and IPv6: no unix sockets (the daemon's and supervisors' sockets), no netlink, no packet sockets (socketpair stays: tokio's signal driver makes one, and a pair reaches nothing)",
    },
];

/// No table for other architectures; see the module docs.
#[cfg(not(target_arch = "x86_64"))]
pub const WORKER_RULES: &[Rule] = &[];

/// An unconditional EPERM row.
#[cfg(target_arch = "x86_64")]
const fn rule(syscall: i64, name: &'static str, reason: &'static str) -> Rule {
    Rule {
        syscall,
        name,
        deny: Deny::Always,
        errno: libc::EPERM,
        reason,
    }
}

/// The number and name of every syscall the table denies (at least under
/// some argument condition), in table order.
pub fn denied_syscalls() -> impl Iterator<Item = (i64, &'static str)> {
    RULES.iter().map(|rule| (rule.syscall, rule.name))
}

/// Builds the sandbox's filter from [`RULES`].
///
/// Pure: it allocates and computes, nothing more. Call it before forking so
/// the child only has to [`install`] it.
pub fn sandbox_filter() -> Result<BpfProgram, SeccompError> {
    #[cfg(target_arch = "x86_64")]
    {
        compile(RULES, i32::unsigned_abs)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Err(SeccompError::UnsupportedArch {
            arch: std::env::consts::ARCH,
        })
    }
}

/// Builds the egress worker's filter: [`RULES`] and [`WORKER_RULES`].
pub fn worker_filter() -> Result<BpfProgram, SeccompError> {
    #[cfg(target_arch = "x86_64")]
    {
        let rules: Vec<Rule> = RULES.iter().chain(WORKER_RULES).copied().collect();
        compile(&rules, i32::unsigned_abs)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Err(SeccompError::UnsupportedArch {
            arch: std::env::consts::ARCH,
        })
    }
}

/// Compiles `rules`, emitting `emit(rule.errno)` as the errno of each denied
/// row. Production uses the identity; the tests substitute errnos no kernel
/// returns, to prove that it is the filter, not the kernel, that denies.
#[cfg(target_arch = "x86_64")]
fn compile(rules: &[Rule], emit: impl Fn(i32) -> u32) -> Result<BpfProgram, SeccompError> {
    let mut seen = std::collections::HashSet::new();
    let mut rows = Vec::with_capacity(rules.len());
    for rule in rules {
        if !seen.insert(rule.syscall) {
            return Err(SeccompError::DuplicateRule { name: rule.name });
        }
        let nr = u32::try_from(rule.syscall)
            .ok()
            .filter(|nr| *nr < X32_SYSCALL_BIT)
            .ok_or(SeccompError::BadSyscallNumber { name: rule.name })?;
        rows.push(Row {
            nr,
            deny: ret_errno(emit(rule.errno)),
            check: row_check(rule)?,
        });
    }
    rows.sort_by_key(|row| row.nr);
    let mut program = vec![
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR),
        jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, ret_errno(emit(libc::EPERM))),
    ];
    dispatch(&rows, &mut program)?;
    if program.len() > BPF_MAXINSNS {
        return Err(SeccompError::ProgramTooLong { len: program.len() });
    }
    Ok(program)
}

/// One row of the table as the compiler sees it.
#[cfg(target_arch = "x86_64")]
struct Row {
    nr: u32,
    /// The `ret` value of a denied call: `ERRNO(errno)`.
    deny: u32,
    /// The argument check of a conditional row: instructions that end in a
    /// `ret` on every path, where [`DENY_PLACEHOLDER`] stands for `deny`;
    /// `None` for an unconditional row.
    check: Option<Vec<seccompiler::sock_filter>>,
}

/// What a row's check returns for "denied" until [`dispatch`] puts the
/// row's errno in: `ERRNO(0)`, which no row emits (errno 0 would be
/// success).
#[cfg(target_arch = "x86_64")]
const DENY_PLACEHOLDER: u32 = libc::SECCOMP_RET_ERRNO;

/// The instructions that decide a conditional row (the syscall number is
/// already matched); `None` for [`Deny::Always`].
#[cfg(target_arch = "x86_64")]
fn row_check(rule: &Rule) -> Result<Option<Vec<seccompiler::sock_filter>>, SeccompError> {
    let empty = || SeccompError::EmptyCondition { name: rule.name };
    let load = |arg: u8| {
        if arg < 6 {
            // The low 32 bits of args[arg] (little endian).
            Ok(stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARGS + 8 * u32::from(arg)))
        } else {
            Err(SeccompError::BadArgument { name: rule.name })
        }
    };
    let allow = libc::SECCOMP_RET_ALLOW;
    // A value list: `jeq value ? hit : next` per value, then the miss.
    let list = |arg: u8, values: &[u32], hit: u32, miss: u32| {
        if values.is_empty() {
            return Err(empty());
        }
        let mut check = vec![load(arg)?];
        for &value in values {
            check.push(jump(BPF_JMP_JEQ_K, value, 0, 1));
            check.push(stmt(BPF_RET_K, hit));
        }
        check.push(stmt(BPF_RET_K, miss));
        Ok(Some(check))
    };
    match rule.deny {
        Deny::Always => Ok(None),
        Deny::IfAnyBitSet { arg, bits } => {
            if bits == 0 {
                return Err(empty());
            }
            Ok(Some(vec![
                load(arg)?,
                jump(BPF_JMP_JSET_K, bits, 0, 1),
                stmt(BPF_RET_K, DENY_PLACEHOLDER),
                stmt(BPF_RET_K, allow),
            ]))
        }
        Deny::IfArgIn { arg, values } => list(arg, values, DENY_PLACEHOLDER, allow),
        Deny::UnlessArgIn { arg, values } => list(arg, values, allow, DENY_PLACEHOLDER),
    }
}

/// Rows a leaf of the dispatch tree matches one after the other.
#[cfg(target_arch = "x86_64")]
const LEAF_ROWS: usize = 8;

/// Appends the code that finds `rows` (sorted by number; the accumulator
/// holds the syscall number): a binary search over the numbers down to
/// leaves of at most [`LEAF_ROWS`] rows, each matched in turn, and `ret
/// ALLOW` for a number no row names. An allowed call thus runs about a
/// dozen instructions instead of one per row, which matters twice: the
/// kernel walks the program once per syscall number when it installs it
/// (to build its cache of always-allowed calls, with interrupts off), and
/// conditional rows are walked on every call.
#[cfg(target_arch = "x86_64")]
fn dispatch(rows: &[Row], out: &mut Vec<seccompiler::sock_filter>) -> Result<(), SeccompError> {
    if rows.len() > LEAF_ROWS {
        let mid = rows.len() / 2;
        // nr >= the middle row's: on to the upper half, through a `ja`
        // (whose offset has 32 bits; a conditional jump's has 8).
        out.push(jump(BPF_JMP_JGE_K, rows[mid].nr, 0, 1));
        let ja = out.len();
        out.push(stmt(BPF_JMP_JA, 0));
        dispatch(&rows[..mid], out)?;
        out[ja].k = u32::try_from(out.len() - ja - 1)
            .map_err(|_| SeccompError::ProgramTooLong { len: out.len() })?;
        return dispatch(&rows[mid..], out);
    }
    // A leaf: `jeq nr` per row. An unconditional row jumps to its errno's
    // `ret`, shared by the leaf and placed after its `ret ALLOW`; a
    // conditional row's check follows its `jeq`, which skips it on a miss.
    let mut code = Vec::new();
    let mut denials: Vec<u32> = Vec::new();
    let mut to_denial = Vec::new();
    for row in rows {
        match &row.check {
            None => {
                let slot = match denials.iter().position(|d| *d == row.deny) {
                    Some(slot) => slot,
                    None => {
                        denials.push(row.deny);
                        denials.len() - 1
                    }
                };
                to_denial.push((code.len(), slot));
                code.push(jump(BPF_JMP_JEQ_K, row.nr, 0, 0));
            }
            Some(check) => {
                code.push(jump(BPF_JMP_JEQ_K, row.nr, 0, offset(check.len())?));
                code.extend(check.iter().map(|insn| match (insn.code, insn.k) {
                    (BPF_RET_K, DENY_PLACEHOLDER) => stmt(BPF_RET_K, row.deny),
                    _ => insn.clone(),
                }));
            }
        }
    }
    code.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    let rets = code.len();
    for (at, slot) in to_denial {
        code[at].jt = offset(rets + slot - at - 1)?;
    }
    code.extend(denials.into_iter().map(|deny| stmt(BPF_RET_K, deny)));
    out.extend(code);
    Ok(())
}

/// A conditional jump's 8-bit offset. Within a leaf a jump spans at most
/// its rows' checks and `ret`s, far below 256 for any table with short
/// value lists; a longer one is refused rather than miscompiled.
#[cfg(target_arch = "x86_64")]
fn offset(distance: usize) -> Result<u8, SeccompError> {
    u8::try_from(distance).map_err(|_| SeccompError::ProgramTooLong { len: distance })
}

#[cfg(target_arch = "x86_64")]
fn ret_errno(errno: u32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (errno & libc::SECCOMP_RET_DATA)
}

#[cfg(target_arch = "x86_64")]
fn stmt(code: u16, k: u32) -> seccompiler::sock_filter {
    seccompiler::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

#[cfg(target_arch = "x86_64")]
fn jump(code: u16, k: u32, jt: u8, jf: u8) -> seccompiler::sock_filter {
    seccompiler::sock_filter { code, jt, jf, k }
}

/// `struct sock_fprog` from `<linux/filter.h>`, pointing at seccompiler's
/// `sock_filter`, which is `#[repr(C)]` with the kernel's layout.
#[repr(C)]
struct SockFprog {
    len: libc::c_ushort,
    filter: *const seccompiler::sock_filter,
}

/// `program` as the kernel lays out `struct sock_filter` (code, jt, jf, k in
/// native byte order, 8 bytes an instruction): how a supervisor hands the
/// filter to an agent that installs it itself (the OCI tiers).
pub fn to_bytes(program: &BpfProgram) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for insn in program {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    bytes
}

/// The program [`to_bytes`] wrote.
pub fn from_bytes(bytes: &[u8]) -> Result<BpfProgram, SeccompError> {
    if !bytes.len().is_multiple_of(8) {
        return Err(SeccompError::Truncated { len: bytes.len() });
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| seccompiler::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect())
}

/// Installs `program` on the calling thread; its children and everything it
/// execs inherit it, and it cannot be removed.
///
/// Requires `no_new_privs` to be set already (the launch order is
/// no_new_privs → seccomp → landlock → exec): the kernel demands it from
/// callers without `CAP_SYS_ADMIN`, and the jail demands it from everyone so
/// that a wrong order fails loudly instead of depending on privileges.
///
/// Only the calling thread is filtered (no `SECCOMP_FILTER_FLAG_TSYNC`): the
/// sandbox's init is single threaded at this point.
///
/// Uses only raw syscalls and allocates nothing on success, so it is safe to
/// call in a freshly forked child.
pub fn install(program: &BpfProgram) -> Result<(), SeccompError> {
    if program.is_empty() {
        return Err(SeccompError::EmptyProgram);
    }
    let len = libc::c_ushort::try_from(program.len())
        .ok()
        .filter(|&len| usize::from(len) <= BPF_MAXINSNS)
        .ok_or(SeccompError::ProgramTooLong { len: program.len() })?;

    // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointer arguments (the unused ones
    // must be zero) and only reads a flag of the calling thread.
    let nnp = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) };
    match nnp {
        1 => {}
        0 => return Err(SeccompError::NoNewPrivsNotSet),
        _ => return Err(SeccompError::NoNewPrivsQuery(io::Error::last_os_error())),
    }

    const NO_FLAGS: libc::c_uint = 0;
    let fprog = SockFprog {
        len,
        filter: program.as_ptr(),
    };
    // SAFETY: `fprog` points at `len` initialised instructions owned by
    // `program`, which outlives the call; `seccompiler::sock_filter` is
    // `#[repr(C)]` with the kernel's field layout (u16, u8, u8, u32). The
    // kernel copies the program during the call and keeps no pointer to it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            NO_FLAGS,
            &fprog as *const SockFprog,
        )
    };
    if rc != 0 {
        return Err(SeccompError::Install(io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(all(test, target_arch = "x86_64"))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    //! Every test that exercises the filter forks a child, installs the filter
    //! there and reports back through exit codes or a shared memory page; the
    //! test process itself is never filtered. After the fork the child only
    //! makes raw syscalls (plus, where a test says so, glibc's fork or thread
    //! creation, which glibc keeps fork-safe) and ends with `_exit`.
    //!
    //! The tests need no privileges: `no_new_privs` makes seccomp available
    //! to any user. Probe arguments are chosen so that a probe is harmless
    //! even if the filter failed to deny it, also as root.

    use super::*;
    use std::collections::HashSet;
    use std::panic::AssertUnwindSafe;

    /// Added to an errno to get a value no kernel returns (MAX_ERRNO is 4095).
    const MARKER: i32 = 1000;

    // ---------------------------------------------------------------------
    // Harness.

    /// How a child ended.
    #[derive(Debug, PartialEq, Eq)]
    enum Ended {
        Exited(i32),
        Signaled(i32),
    }

    /// Runs `f` in a forked child and waits for it. `f`'s return value is
    /// the exit code; a panic becomes 101.
    fn in_child(f: impl FnOnce() -> i32) -> Ended {
        // SAFETY: the child only runs `f`, which the tests write to make raw
        // syscalls (or glibc calls that glibc makes fork-safe), and then
        // leaves through `_exit`, never returning into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let code = std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(101);
            // SAFETY: `_exit` ends the child at once, without running the
            // destructors or atexit handlers of the state it shares with
            // the parent.
            unsafe { libc::_exit(code) }
        }
        wait(pid)
    }

    fn wait(pid: libc::pid_t) -> Ended {
        let mut status = 0;
        loop {
            // SAFETY: `status` is a valid out-pointer; `pid` is our child.
            let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
            if rc == pid {
                break;
            }
            let err = io::Error::last_os_error();
            assert_eq!(err.raw_os_error(), Some(libc::EINTR), "waitpid: {err}");
        }
        if libc::WIFEXITED(status) {
            Ended::Exited(libc::WEXITSTATUS(status))
        } else {
            Ended::Signaled(libc::WTERMSIG(status))
        }
    }

    /// A page shared between the parent and its forked child.
    struct Shared {
        ptr: *mut i64,
    }

    const SHARED_SLOTS: usize = 4096 / 8;

    impl Shared {
        fn new() -> Self {
            // SAFETY: an anonymous shared mapping of one page; no existing
            // memory is touched and the result is checked below.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(
                ptr,
                libc::MAP_FAILED,
                "mmap: {}",
                io::Error::last_os_error()
            );
            Shared { ptr: ptr.cast() }
        }

        fn set(&self, slot: usize, value: i64) {
            assert!(slot < SHARED_SLOTS);
            // SAFETY: `slot` is within the page mapped in `new`, which is
            // aligned for i64 and stays mapped until `drop`.
            unsafe { self.ptr.add(slot).write_volatile(value) }
        }

        fn get(&self, slot: usize) -> i64 {
            assert!(slot < SHARED_SLOTS);
            // SAFETY: as in `set`.
            unsafe { self.ptr.add(slot).read_volatile() }
        }
    }

    impl Drop for Shared {
        fn drop(&mut self) {
            // SAFETY: unmaps exactly the page mapped in `new`; no reference
            // into it outlives `self`.
            unsafe { libc::munmap(self.ptr.cast(), 4096) };
        }
    }

    /// Child side: detaches from the terminal, disables core dumps, sets
    /// no_new_privs and installs `program`. Returns an exit code on failure.
    fn enter(program: &BpfProgram) -> Result<(), i32> {
        // SAFETY: setsid takes no arguments; a forked child is never a
        // process-group leader, so it gets a new session without a
        // controlling terminal (which makes a stray vhangup or TIOCSTI moot).
        unsafe { libc::setsid() };
        // SAFETY: PR_SET_DUMPABLE takes an integer; it keeps a child killed
        // by SIGSYS from writing a core dump.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
        // SAFETY: PR_SET_NO_NEW_PRIVS takes integers only.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(90);
        }
        install(program).map_err(|_| 91)
    }

    /// A raw syscall: returns the result and errno (0 on success).
    fn raw(nr: i64, args: [u64; 6]) -> (i64, i32) {
        let [a, b, c, d, e, f] = args;
        // SAFETY: the tests only pass argument sets under which the kernel
        // writes through no pointer: pointer arguments are null or
        // unmapped (the kernel answers EFAULT without touching our memory),
        // or, for TIOCSTI, point at a live byte the kernel only reads.
        let ret = unsafe { libc::syscall(nr, a, b, c, d, e, f) };
        if ret == -1 {
            (ret, io::Error::last_os_error().raw_os_error().unwrap_or(0))
        } else {
            (ret, 0)
        }
    }

    // ---------------------------------------------------------------------
    // The reviewed list: what the sandbox must deny, written out again,
    // independently of the table, so that deleting or weakening a row fails
    // `table_matches_the_reviewed_list` and the per-denial tests.

    /// A call the filter must deny.
    #[derive(Debug, Clone, Copy)]
    struct Probe {
        nr: i64,
        args: [u64; 6],
        what: &'static str,
    }

    /// A syscall the sandbox must deny, the errno it must get, and harmless
    /// calls that prove it.
    struct Denial {
        nr: i64,
        name: &'static str,
        errno: i32,
        probes: Vec<Probe>,
    }

    fn probe(nr: i64, args: [u64; 6], what: &'static str) -> Probe {
        Probe { nr, args, what }
    }

    fn denial(
        nr: i64,
        name: &'static str,
        errno: i32,
        calls: &[([u64; 6], &'static str)],
    ) -> Denial {
        let probes = calls
            .iter()
            .map(|&(args, what)| probe(nr, args, what))
            .collect();
        Denial {
            nr,
            name,
            errno,
            probes,
        }
    }

    /// Every denial. Probe arguments fail harmlessly (EFAULT, EBADF, EINVAL,
    /// ENOSYS) or are no-ops should the filter let a call through, also when
    /// the tests run as root.
    fn reviewed_denials() -> Vec<Denial> {
        use libc::*;
        const NULL: u64 = 0;
        const FD: u64 = u64::MAX; // -1
        const BAD_FLAGS: u64 = 0xffff_ffff;
        let eperm = |nr, name, calls: &[([u64; 6], &'static str)]| denial(nr, name, EPERM, calls);

        // CLONE_SIGHAND without CLONE_VM is EINVAL, so no process is created
        // even unfiltered; `run_probes` guards against it all the same.
        let clone = |flag: c_int| [(flag | CLONE_SIGHAND) as u64, 0, 0, 0, 0, 0];
        let high = 1u64 << 32;

        vec![
            eperm(SYS_mount, "mount", &[([NULL; 6], "mount(NULL, NULL, ...)")]),
            eperm(
                SYS_umount2,
                "umount2",
                &[([NULL, BAD_FLAGS, 0, 0, 0, 0], "umount2(NULL, bad flags)")],
            ),
            eperm(
                SYS_pivot_root,
                "pivot_root",
                &[([NULL; 6], "pivot_root(NULL, NULL)")],
            ),
            eperm(
                SYS_move_mount,
                "move_mount",
                &[([FD, NULL, FD, NULL, BAD_FLAGS, 0], "move_mount(bad flags)")],
            ),
            eperm(
                SYS_open_tree,
                "open_tree",
                &[([FD, NULL, BAD_FLAGS, 0, 0, 0], "open_tree(bad flags)")],
            ),
            eperm(
                467,
                "open_tree_attr",
                &[(
                    [FD, NULL, BAD_FLAGS, NULL, 0, 0],
                    "open_tree_attr(bad flags)",
                )],
            ),
            eperm(
                SYS_fsopen,
                "fsopen",
                &[([NULL, BAD_FLAGS, 0, 0, 0, 0], "fsopen(NULL, bad flags)")],
            ),
            eperm(
                SYS_fsconfig,
                "fsconfig",
                &[([FD, 0, NULL, NULL, 0, 0], "fsconfig(-1)")],
            ),
            eperm(
                SYS_fsmount,
                "fsmount",
                &[([FD, BAD_FLAGS, 0, 0, 0, 0], "fsmount(-1, bad flags)")],
            ),
            eperm(
                SYS_fspick,
                "fspick",
                &[([FD, NULL, BAD_FLAGS, 0, 0, 0], "fspick(bad flags)")],
            ),
            eperm(
                SYS_mount_setattr,
                "mount_setattr",
                &[(
                    [FD, NULL, BAD_FLAGS, NULL, 0, 0],
                    "mount_setattr(bad flags)",
                )],
            ),
            eperm(SYS_unshare, "unshare", &[([0; 6], "unshare(0), a no-op")]),
            eperm(SYS_setns, "setns", &[([FD, 0, 0, 0, 0, 0], "setns(-1, 0)")]),
            eperm(
                SYS_clone,
                "clone",
                &[
                    (clone(CLONE_NEWNS), "clone(CLONE_NEWNS)"),
                    (clone(CLONE_NEWCGROUP), "clone(CLONE_NEWCGROUP)"),
                    (clone(CLONE_NEWUTS), "clone(CLONE_NEWUTS)"),
                    (clone(CLONE_NEWIPC), "clone(CLONE_NEWIPC)"),
                    (clone(CLONE_NEWUSER), "clone(CLONE_NEWUSER)"),
                    (clone(CLONE_NEWPID), "clone(CLONE_NEWPID)"),
                    (clone(CLONE_NEWNET), "clone(CLONE_NEWNET)"),
                    (clone(CLONE_NEWTIME), "clone(CLONE_NEWTIME)"),
                    (
                        [high | clone(CLONE_NEWUSER)[0], 0, 0, 0, 0, 0],
                        "clone(CLONE_NEWUSER) with high bits set",
                    ),
                ],
            ),
            denial(
                SYS_clone3,
                "clone3",
                ENOSYS,
                &[([NULL, 0, 0, 0, 0, 0], "clone3(NULL, 0)")],
            ),
            eperm(
                SYS_keyctl,
                "keyctl",
                &[([0xffff, 0, 0, 0, 0, 0], "keyctl(bad op)")],
            ),
            eperm(SYS_add_key, "add_key", &[([NULL; 6], "add_key(NULL, ...)")]),
            eperm(
                SYS_request_key,
                "request_key",
                &[([NULL; 6], "request_key(NULL, ...)")],
            ),
            eperm(
                SYS_bpf,
                "bpf",
                &[([0xffff, NULL, 0, 0, 0, 0], "bpf(bad cmd)")],
            ),
            eperm(
                SYS_perf_event_open,
                "perf_event_open",
                &[([NULL, 0, FD, FD, 0, 0], "perf_event_open(NULL)")],
            ),
            eperm(
                SYS_userfaultfd,
                "userfaultfd",
                &[([BAD_FLAGS, 0, 0, 0, 0, 0], "userfaultfd(bad flags)")],
            ),
            eperm(
                SYS_io_uring_setup,
                "io_uring_setup",
                &[([0, NULL, 0, 0, 0, 0], "io_uring_setup(0, NULL)")],
            ),
            eperm(
                SYS_io_uring_enter,
                "io_uring_enter",
                &[([FD, 0, 0, 0, NULL, 0], "io_uring_enter(-1)")],
            ),
            eperm(
                SYS_io_uring_register,
                "io_uring_register",
                &[([FD, 0, NULL, 0, 0, 0], "io_uring_register(-1)")],
            ),
            eperm(
                SYS_kexec_load,
                "kexec_load",
                &[([0, 0, NULL, BAD_FLAGS, 0, 0], "kexec_load(bad flags)")],
            ),
            eperm(
                SYS_kexec_file_load,
                "kexec_file_load",
                &[(
                    [FD, FD, 0, NULL, BAD_FLAGS, 0],
                    "kexec_file_load(bad flags)",
                )],
            ),
            eperm(
                SYS_init_module,
                "init_module",
                &[([NULL, 0, NULL, 0, 0, 0], "init_module(NULL, 0)")],
            ),
            eperm(
                SYS_finit_module,
                "finit_module",
                &[(
                    [FD, NULL, BAD_FLAGS, 0, 0, 0],
                    "finit_module(-1, bad flags)",
                )],
            ),
            eperm(
                SYS_delete_module,
                "delete_module",
                &[([NULL, 0, 0, 0, 0, 0], "delete_module(NULL)")],
            ),
            // A bad magic number is rejected before the command is looked at.
            eperm(
                SYS_reboot,
                "reboot",
                &[([0, 0, 0, NULL, 0, 0], "reboot(bad magic)")],
            ),
            eperm(
                SYS_swapon,
                "swapon",
                &[([NULL, 0, 0, 0, 0, 0], "swapon(NULL)")],
            ),
            eperm(
                SYS_swapoff,
                "swapoff",
                &[([NULL, 0, 0, 0, 0, 0], "swapoff(NULL)")],
            ),
            // Address 1 is unmapped: EFAULT, where NULL would switch
            // accounting off.
            eperm(
                SYS_acct,
                "acct",
                &[([1, 0, 0, 0, 0, 0], "acct(bad pointer)")],
            ),
            eperm(
                SYS_syslog,
                "syslog",
                &[([10, NULL, 0, 0, 0, 0], "syslog(SIZE_BUFFER), read-only")],
            ),
            // Command 0 without a device: ENODEV before anything happens.
            eperm(
                SYS_quotactl,
                "quotactl",
                &[([0, NULL, 0, NULL, 0, 0], "quotactl(0, NULL)")],
            ),
            eperm(
                SYS_quotactl_fd,
                "quotactl_fd",
                &[([FD, 0, 0, NULL, 0, 0], "quotactl_fd(-1)")],
            ),
            eperm(
                SYS_lookup_dcookie,
                "lookup_dcookie",
                &[([0, NULL, 0, 0, 0, 0], "lookup_dcookie(0, NULL)")],
            ),
            eperm(SYS_nfsservctl, "nfsservctl", &[([0; 6], "nfsservctl()")]),
            eperm(SYS__sysctl, "_sysctl", &[([NULL; 6], "_sysctl(NULL)")]),
            eperm(SYS_uselib, "uselib", &[([NULL; 6], "uselib(NULL)")]),
            // Level 0 and zero ports are no-ops.
            eperm(SYS_iopl, "iopl", &[([0; 6], "iopl(0)")]),
            eperm(SYS_ioperm, "ioperm", &[([0; 6], "ioperm(0, 0, 0)")]),
            // The probing child has no controlling terminal (setsid): a no-op.
            eperm(SYS_vhangup, "vhangup", &[([0; 6], "vhangup()")]),
            // Both NULL: a no-op even for root.
            eperm(
                SYS_settimeofday,
                "settimeofday",
                &[([NULL; 6], "settimeofday(NULL, NULL)")],
            ),
            eperm(
                SYS_clock_settime,
                "clock_settime",
                &[([FD, NULL, 0, 0, 0, 0], "clock_settime(bad clock)")],
            ),
            eperm(
                SYS_clock_adjtime,
                "clock_adjtime",
                &[([FD, NULL, 0, 0, 0, 0], "clock_adjtime(bad clock)")],
            ),
            eperm(SYS_adjtimex, "adjtimex", &[([NULL; 6], "adjtimex(NULL)")]),
            eperm(
                SYS_ptrace,
                "ptrace",
                &[([0xffff, FD, 0, 0, 0, 0], "ptrace(bad request, -1)")],
            ),
            // Zero iovecs: reads and writes nothing.
            eperm(
                SYS_process_vm_readv,
                "process_vm_readv",
                &[([0, NULL, 0, NULL, 0, 0], "process_vm_readv(0 iovecs)")],
            ),
            eperm(
                SYS_process_vm_writev,
                "process_vm_writev",
                &[([0, NULL, 0, NULL, 0, 0], "process_vm_writev(0 iovecs)")],
            ),
            eperm(
                SYS_pidfd_getfd,
                "pidfd_getfd",
                &[([FD, FD, 0, 0, 0, 0], "pidfd_getfd(-1, -1)")],
            ),
            eperm(
                SYS_open_by_handle_at,
                "open_by_handle_at",
                &[([FD, NULL, 0, 0, 0, 0], "open_by_handle_at(-1, NULL)")],
            ),
            eperm(
                SYS_name_to_handle_at,
                "name_to_handle_at",
                &[(
                    [FD, NULL, NULL, NULL, BAD_FLAGS, 0],
                    "name_to_handle_at(bad flags)",
                )],
            ),
            eperm(
                SYS_personality,
                "personality",
                &[
                    (
                        [ADDR_NO_RANDOMIZE as u64, 0, 0, 0, 0, 0],
                        "personality(ADDR_NO_RANDOMIZE)",
                    ),
                    (
                        [READ_IMPLIES_EXEC as u64, 0, 0, 0, 0, 0],
                        "personality(READ_IMPLIES_EXEC)",
                    ),
                    (
                        [high | ADDR_NO_RANDOMIZE as u64, 0, 0, 0, 0, 0],
                        "personality(ADDR_NO_RANDOMIZE) with high bits set",
                    ),
                ],
            ),
            eperm(
                SYS_ioctl,
                "ioctl",
                &[
                    ([FD, TIOCSTI, NULL, 0, 0, 0], "ioctl(-1, TIOCSTI)"),
                    ([FD, TIOCLINUX, NULL, 0, 0, 0], "ioctl(-1, TIOCLINUX)"),
                    (
                        [FD, high | TIOCSTI, NULL, 0, 0, 0],
                        "ioctl(-1, TIOCSTI) with high bits set",
                    ),
                ],
            ),
        ]
    }

    /// Runs `probes` in a child under `program` and returns each probe's
    /// (result, errno).
    fn run_probes(program: &BpfProgram, probes: &[Probe]) -> Result<Vec<(i64, i32)>, Ended> {
        assert!(probes.len() * 2 < SHARED_SLOTS);
        let shared = Shared::new();
        let ended = in_child(|| {
            if let Err(code) = enter(program) {
                return code;
            }
            for (i, probe) in probes.iter().enumerate() {
                let (ret, errno) = raw(probe.nr, probe.args);
                if ret == 0 && (probe.nr == libc::SYS_clone || probe.nr == libc::SYS_clone3) {
                    // SAFETY: we are an accidental grandchild; leave at once.
                    unsafe { libc::_exit(0) }
                }
                shared.set(2 * i, ret);
                shared.set(2 * i + 1, i64::from(errno));
            }
            0
        });
        if ended != Ended::Exited(0) {
            return Err(ended);
        }
        Ok((0..probes.len())
            .map(|i| (shared.get(2 * i), shared.get(2 * i + 1) as i32))
            .collect())
    }

    /// Runs every reviewed denial in its own child under `program` and
    /// asserts that each probe fails with `errno_of(denial)`.
    fn assert_every_denial_enforced(program: &BpfProgram, errno_of: impl Fn(&Denial) -> i32) {
        assert_denials_enforced(program, reviewed_denials(), errno_of);
    }

    fn assert_denials_enforced(
        program: &BpfProgram,
        denials: Vec<Denial>,
        errno_of: impl Fn(&Denial) -> i32,
    ) {
        let mut failures = Vec::new();
        for denial in denials {
            let want = errno_of(&denial);
            match run_probes(program, &denial.probes) {
                Err(ended) => failures.push(format!("{}: child ended {ended:?}", denial.name)),
                Ok(results) => {
                    for (probe, (ret, errno)) in denial.probes.iter().zip(results) {
                        if ret != -1 || errno != want {
                            failures.push(format!(
                                "{}: got ret {ret} errno {errno}, want errno {want}",
                                probe.what
                            ));
                        }
                    }
                }
            }
        }
        assert!(
            failures.is_empty(),
            "denials not enforced:\n{}",
            failures.join("\n")
        );
    }

    fn production() -> BpfProgram {
        sandbox_filter().expect("the table compiles")
    }

    // ---------------------------------------------------------------------
    // The table.

    #[test]
    fn table_has_no_duplicate_syscalls() {
        let mut seen = HashSet::new();
        for rule in RULES {
            assert!(
                seen.insert(rule.syscall),
                "{} ({}) is listed twice",
                rule.name,
                rule.syscall
            );
        }
        let mut names = HashSet::new();
        for rule in RULES {
            assert!(
                names.insert(rule.name),
                "the name {} is used twice",
                rule.name
            );
        }
    }

    #[test]
    fn every_rule_has_a_reason() {
        for rule in RULES {
            assert!(rule.reason.len() > 10, "{} needs a reason", rule.name);
            assert!((0..i64::from(X32_SYSCALL_BIT)).contains(&rule.syscall));
        }
    }

    /// The table and the reviewed list name the same syscalls with the same
    /// errnos: a row cannot be added, removed or given another errno without
    /// updating the list (and its probes) as well.
    #[test]
    fn table_matches_the_reviewed_list() {
        let reviewed = reviewed_denials();
        for denial in &reviewed {
            let rule = RULES.iter().find(|rule| rule.syscall == denial.nr);
            let rule = rule.unwrap_or_else(|| panic!("{} is not in the table", denial.name));
            assert_eq!(rule.name, denial.name, "syscall {}", denial.nr);
            assert_eq!(rule.errno, denial.errno, "{}", denial.name);
            assert!(!denial.probes.is_empty(), "{} has no probe", denial.name);
        }
        for rule in RULES {
            assert!(
                reviewed.iter().any(|denial| denial.nr == rule.syscall),
                "{} is in the table but not in the reviewed list",
                rule.name
            );
        }
    }

    #[test]
    fn denied_syscalls_lists_the_table() {
        let listed: Vec<_> = denied_syscalls().collect();
        assert_eq!(listed.len(), RULES.len());
        assert!(listed.contains(&(libc::SYS_mount, "mount")));
        assert!(listed.contains(&(libc::SYS_clone3, "clone3")));
    }

    #[test]
    fn compile_rejects_malformed_tables() {
        let dup = [RULES[0], RULES[0]];
        assert!(matches!(
            compile(&dup, i32::unsigned_abs),
            Err(SeccompError::DuplicateRule { .. })
        ));

        let mut empty_bits = RULES[0];
        empty_bits.deny = Deny::IfAnyBitSet { arg: 0, bits: 0 };
        let mut empty_in = RULES[0];
        empty_in.deny = Deny::IfArgIn {
            arg: 0,
            values: &[],
        };
        let mut empty_unless = RULES[0];
        empty_unless.deny = Deny::UnlessArgIn {
            arg: 0,
            values: &[],
        };
        for bad in [empty_bits, empty_in, empty_unless] {
            assert!(matches!(
                compile(&[bad], i32::unsigned_abs),
                Err(SeccompError::EmptyCondition { .. })
            ));
        }

        let mut negative = RULES[0];
        negative.syscall = -1;
        let mut x32 = RULES[0];
        x32.syscall = i64::from(X32_SYSCALL_BIT) + 1;
        for bad in [negative, x32] {
            assert!(matches!(
                compile(&[bad], i32::unsigned_abs),
                Err(SeccompError::BadSyscallNumber { .. })
            ));
        }
        let mut seventh = RULES[0];
        seventh.deny = Deny::IfArgIn {
            arg: 6,
            values: &[1],
        };
        assert!(matches!(
            compile(&[seventh], i32::unsigned_abs),
            Err(SeccompError::BadArgument { .. })
        ));
    }

    /// Runs `program` as the kernel would for a call `nr(args)` of the
    /// native ABI: the result and the number of instructions run. Only the
    /// instructions the compiler emits are known; any other panics.
    fn run(program: &BpfProgram, nr: u32, args: [u64; 6]) -> (u32, usize) {
        let mut a = 0u32;
        let mut pc = 0usize;
        let mut steps = 0;
        loop {
            let insn = &program[pc];
            steps += 1;
            pc += 1;
            match insn.code {
                BPF_LD_W_ABS => {
                    a = match insn.k {
                        SECCOMP_DATA_NR => nr,
                        SECCOMP_DATA_ARCH => AUDIT_ARCH_X86_64,
                        k if k >= SECCOMP_DATA_ARGS
                            && (k - SECCOMP_DATA_ARGS).is_multiple_of(8) =>
                        {
                            args[((k - SECCOMP_DATA_ARGS) / 8) as usize] as u32
                        }
                        k => panic!("load of offset {k}"),
                    }
                }
                BPF_RET_K => return (insn.k, steps),
                BPF_JMP_JA => pc += insn.k as usize,
                code => {
                    let taken = match code {
                        BPF_JMP_JEQ_K => a == insn.k,
                        BPF_JMP_JGE_K => a >= insn.k,
                        BPF_JMP_JSET_K => a & insn.k != 0,
                        other => panic!("instruction {other:#x}"),
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
            }
        }
    }

    /// Every native syscall number, run through the compiled program, gets
    /// what the table says (with all arguments 0 and with the arguments a
    /// conditional row looks for), in a bounded number of instructions:
    /// the binary search, not a chain of every row.
    #[test]
    fn every_number_gets_its_row_in_a_few_instructions() {
        for (rules, program) in [
            (RULES.to_vec(), production()),
            (
                RULES
                    .iter()
                    .chain(WORKER_RULES)
                    .copied()
                    .collect::<Vec<_>>(),
                worker_filter().unwrap(),
            ),
        ] {
            let mut longest = 0;
            for nr in 0..600u32 {
                let row = rules.iter().find(|rule| rule.syscall == i64::from(nr));
                let deny = |rule: &Rule| ret_errno(rule.errno.unsigned_abs());
                let mut cases = vec![(
                    [0u64; 6],
                    match row {
                        None => libc::SECCOMP_RET_ALLOW,
                        Some(rule) => match rule.deny {
                            Deny::Always => deny(rule),
                            Deny::IfAnyBitSet { .. } => libc::SECCOMP_RET_ALLOW,
                            Deny::IfArgIn { values, .. } if values.contains(&0) => deny(rule),
                            Deny::IfArgIn { .. } => libc::SECCOMP_RET_ALLOW,
                            Deny::UnlessArgIn { values, .. } if values.contains(&0) => {
                                libc::SECCOMP_RET_ALLOW
                            }
                            Deny::UnlessArgIn { .. } => deny(rule),
                        },
                    },
                )];
                if let Some(rule) = row {
                    let with = |arg: u8, value: u32| {
                        let mut args = [0u64; 6];
                        // High bits are ignored: only the low 32 count.
                        args[usize::from(arg)] = (1 << 40) | u64::from(value);
                        args
                    };
                    match rule.deny {
                        Deny::Always => {}
                        Deny::IfAnyBitSet { arg, bits } => {
                            cases.push((with(arg, bits & bits.wrapping_neg()), deny(rule)));
                        }
                        Deny::IfArgIn { arg, values } => {
                            for &value in values {
                                cases.push((with(arg, value), deny(rule)));
                            }
                        }
                        Deny::UnlessArgIn { arg, values } => {
                            for &value in values {
                                cases.push((with(arg, value), libc::SECCOMP_RET_ALLOW));
                            }
                            let outside = (0..).find(|v| !values.contains(v)).unwrap();
                            cases.push((with(arg, outside), deny(rule)));
                        }
                    }
                }
                for (args, want) in cases {
                    let (got, steps) = run(&program, nr, args);
                    assert_eq!(got, want, "syscall {nr} with {args:?}");
                    longest = longest.max(steps);
                }
            }
            assert!(
                longest <= 24,
                "a call runs {longest} instructions of the filter"
            );
        }
    }

    #[test]
    fn program_starts_with_the_arch_and_x32_checks() {
        let program = production();
        assert!(program.len() < BPF_MAXINSNS);
        assert_eq!(program[0], stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARCH));
        assert_eq!(program[1], jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0));
        assert_eq!(program[2], stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS));
        assert_eq!(program[4], jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1));
        assert_eq!(
            program[5],
            stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32)
        );
    }

    #[test]
    fn install_requires_no_new_privs() {
        let program = production();
        let ended = in_child(|| {
            // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointers.
            if unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } != 0 {
                return 2; // inherited from whoever ran the tests: inconclusive
            }
            match install(&program) {
                Err(SeccompError::NoNewPrivsNotSet) => 0,
                Err(_) => 3,
                Ok(()) => 4,
            }
        });
        match ended {
            Ended::Exited(2) => panic!(
                "no_new_privs is already set on the test process, so this cannot be tested; run the tests outside a no_new_privs sandbox"
            ),
            other => assert_eq!(other, Ended::Exited(0)),
        }
        assert!(matches!(
            install(&Vec::new()),
            Err(SeccompError::EmptyProgram)
        ));
    }

    // ---------------------------------------------------------------------
    // One child per denial.

    /// The production filter denies every reviewed syscall with its errno.
    #[test]
    fn every_denial_gets_its_errno() {
        assert_every_denial_enforced(&production(), |denial| denial.errno);
    }

    /// With every errno the table emits shifted to one no kernel returns,
    /// each probe gets exactly that errno: the denial comes from the filter,
    /// not from the kernel's own permission checks (which answer EPERM to
    /// many of these calls when the tests run unprivileged). Removing or
    /// weakening a row fails this test even then.
    #[test]
    fn every_denial_comes_from_the_filter() {
        let program = compile(RULES, |errno| (errno + MARKER).unsigned_abs()).unwrap();
        assert_every_denial_enforced(&program, |denial| denial.errno + MARKER);
    }

    // ---------------------------------------------------------------------
    // The egress worker's rows.

    /// What the worker must be denied beyond the sandbox's table, written
    /// out again. Probes fail harmlessly unfiltered (EFAULT, EBADF) or make
    /// a socket that the child drops as it exits.
    fn reviewed_worker_denials() -> Vec<Denial> {
        use libc::*;
        const NULL: u64 = 0;
        const FD: u64 = u64::MAX; // -1
        let eperm = |nr, name, calls: &[([u64; 6], &'static str)]| denial(nr, name, EPERM, calls);
        let stream = SOCK_STREAM as u64;
        vec![
            eperm(SYS_execve, "execve", &[([NULL; 6], "execve(NULL)")]),
            eperm(
                SYS_execveat,
                "execveat",
                &[([FD, NULL, NULL, NULL, 0, 0], "execveat(-1, NULL)")],
            ),
            eperm(SYS_open, "open", &[([NULL; 6], "open(NULL)")]),
            eperm(
                SYS_openat,
                "openat",
                &[([FD, NULL, 0, 0, 0, 0], "openat(-1, NULL)")],
            ),
            eperm(
                SYS_openat2,
                "openat2",
                &[([FD, NULL, NULL, 0, 0, 0], "openat2(-1, NULL)")],
            ),
            eperm(SYS_creat, "creat", &[([NULL; 6], "creat(NULL)")]),
            // Signal 0 to our own process group: a no-op that succeeds
            // unfiltered.
            eperm(SYS_kill, "kill", &[([0, 0, 0, 0, 0, 0], "kill(0, 0)")]),
            eperm(
                SYS_socket,
                "socket",
                &[
                    ([AF_UNIX as u64, stream, 0, 0, 0, 0], "socket(AF_UNIX)"),
                    (
                        [AF_NETLINK as u64, SOCK_RAW as u64, 0, 0, 0, 0],
                        "socket(AF_NETLINK)",
                    ),
                    (
                        [AF_PACKET as u64, SOCK_RAW as u64, 0, 0, 0, 0],
                        "socket(AF_PACKET)",
                    ),
                    (
                        [(1u64 << 32) | AF_UNIX as u64, stream, 0, 0, 0, 0],
                        "socket(AF_UNIX) with high bits set",
                    ),
                ],
            ),
        ]
    }

    fn worker_rules_marked() -> BpfProgram {
        let rules: Vec<Rule> = RULES.iter().chain(WORKER_RULES).copied().collect();
        compile(&rules, |errno| (errno + MARKER).unsigned_abs()).unwrap()
    }

    #[test]
    fn worker_table_matches_its_reviewed_list() {
        let reviewed = reviewed_worker_denials();
        assert_eq!(reviewed.len(), WORKER_RULES.len());
        for denial in &reviewed {
            let rule = WORKER_RULES
                .iter()
                .find(|rule| rule.syscall == denial.nr)
                .unwrap_or_else(|| panic!("{} is not in the worker table", denial.name));
            assert_eq!(rule.name, denial.name);
            assert!(!rule.reason.is_empty());
        }
    }

    /// Each worker row gets its errno, from the filter (shifted errnos),
    /// under the worker's program, which keeps every sandbox row too.
    #[test]
    fn every_worker_denial_comes_from_the_filter() {
        let program = worker_rules_marked();
        assert_denials_enforced(&program, reviewed_worker_denials(), |d| d.errno + MARKER);
        assert_denials_enforced(&program, reviewed_denials(), |d| d.errno + MARKER);
        assert_denials_enforced(&worker_filter().unwrap(), reviewed_worker_denials(), |d| {
            d.errno
        });
    }

    /// What the worker does all day still works under its filter: TCP and
    /// UDP sockets of both families, and threads.
    #[test]
    fn the_worker_keeps_its_sockets_and_threads() {
        let program = worker_filter().unwrap();
        let ended = in_child(|| {
            if let Err(code) = enter(&program) {
                return code;
            }
            for (family, kind) in [
                (libc::AF_INET, libc::SOCK_STREAM),
                (libc::AF_INET6, libc::SOCK_STREAM),
                (libc::AF_INET, libc::SOCK_DGRAM),
                (libc::AF_INET6, libc::SOCK_DGRAM),
            ] {
                let (ret, _) = raw(libc::SYS_socket, [family as u64, kind as u64, 0, 0, 0, 0]);
                if ret < 0 {
                    return 10;
                }
            }
            match std::thread::spawn(|| 7).join() {
                Ok(7) => 0,
                _ => 11,
            }
        });
        assert_eq!(ended, Ended::Exited(0));
    }

    // ---------------------------------------------------------------------
    // Behaviour around the conditional rows.

    #[test]
    fn fork_and_plain_clone_still_work() {
        let program = production();
        let ended = in_child(|| {
            if let Err(code) = enter(&program) {
                return code;
            }
            // glibc's fork: clone(CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD).
            // SAFETY: the grandchild only calls `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: leaves the grandchild at once.
                unsafe { libc::_exit(7) }
            }
            if pid < 0 || wait(pid) != Ended::Exited(7) {
                return 1;
            }
            // A raw clone without namespace flags.
            let (pid, _) = raw(libc::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]);
            if pid == 0 {
                // SAFETY: leaves the grandchild at once.
                unsafe { libc::_exit(8) }
            }
            if pid < 0 || wait(pid as libc::pid_t) != Ended::Exited(8) {
                return 2;
            }
            0
        });
        assert_eq!(
            ended,
            Ended::Exited(0),
            "1: fork failed, 2: clone(SIGCHLD) failed"
        );
    }

    /// Spawns a thread in a child under `program`: 0 if it ran, 1 if the
    /// spawn failed, 2 if clone3 did not fail with ENOSYS.
    fn spawn_thread_under(program: &BpfProgram) -> Ended {
        in_child(|| {
            if let Err(code) = enter(program) {
                return code;
            }
            // glibc tries clone3 first and falls back to clone on ENOSYS.
            let clone3_errno = raw(libc::SYS_clone3, [0; 6]).1;
            match std::thread::Builder::new().spawn(|| 42).map(|t| t.join()) {
                Ok(Ok(42)) if clone3_errno == libc::ENOSYS => 0,
                Ok(Ok(42)) => 2,
                _ => 1,
            }
        })
    }

    #[test]
    fn threads_still_spawn_through_the_clone_fallback() {
        assert_eq!(spawn_thread_under(&production()), Ended::Exited(0));
    }

    /// Why clone3 gets ENOSYS: with EPERM, glibc does not fall back and thread
    /// creation fails. This keeps the test above honest.
    #[test]
    fn clone3_with_eperm_would_break_threads() {
        let table: Vec<Rule> = RULES
            .iter()
            .map(|&rule| {
                if rule.syscall == libc::SYS_clone3 {
                    Rule {
                        errno: libc::EPERM,
                        ..rule
                    }
                } else {
                    rule
                }
            })
            .collect();
        let program = compile(&table, i32::unsigned_abs).unwrap();
        assert_eq!(spawn_thread_under(&program), Ended::Exited(1));
    }

    #[test]
    fn clone_with_a_new_user_namespace_is_eperm() {
        let program = production();
        let ended = in_child(|| {
            if let Err(code) = enter(&program) {
                return code;
            }
            let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as u64;
            match raw(libc::SYS_clone, [flags, 0, 0, 0, 0, 0]) {
                (0, _) => {
                    // SAFETY: we are the grandchild the filter should have
                    // prevented; leave at once.
                    unsafe { libc::_exit(0) }
                }
                (-1, libc::EPERM) => 0,
                (-1, _) => 1,
                (_, _) => 2,
            }
        });
        assert_eq!(
            ended,
            Ended::Exited(0),
            "1: wrong errno, 2: the namespace was created"
        );
    }

    #[test]
    fn ioctl_tiocsti_is_denied_but_fionread_works() {
        let program = production();
        let ended = in_child(|| {
            if let Err(code) = enter(&program) {
                return code;
            }
            let mut fds = [0; 2];
            // SAFETY: `fds` has room for the two descriptors pipe writes.
            if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
                return 1;
            }
            let bytes = b"abc";
            // SAFETY: writes 3 bytes from a live buffer to our pipe.
            if unsafe { libc::write(fds[1], bytes.as_ptr().cast(), 3) } != 3 {
                return 2;
            }
            let mut queued: libc::c_int = 0;
            // SAFETY: FIONREAD writes one c_int to the pointer we pass.
            let rc = unsafe { libc::ioctl(fds[0], libc::FIONREAD, &mut queued) };
            if rc != 0 || queued != 3 {
                return 3;
            }
            let c = b'x';
            for request in [libc::TIOCSTI, libc::TIOCLINUX, (1 << 32) | libc::TIOCSTI] {
                let (ret, errno) = raw(
                    libc::SYS_ioctl,
                    [fds[0] as u64, request, &c as *const u8 as u64, 0, 0, 0],
                );
                if ret != -1 || errno != libc::EPERM {
                    return 4;
                }
            }
            0
        });
        assert_eq!(
            ended,
            Ended::Exited(0),
            "1: pipe, 2: write, 3: FIONREAD failed, 4: TIOCSTI/TIOCLINUX not EPERM"
        );
    }

    #[test]
    fn personality_allows_only_dockers_personas() {
        let program = production();
        let ended = in_child(|| {
            if let Err(code) = enter(&program) {
                return code;
            }
            // The query first: it must report the current persona.
            if raw(libc::SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0]).0 < 0 {
                return 1;
            }
            for persona in PERSONALITY_ALLOWED {
                if raw(libc::SYS_personality, [u64::from(persona), 0, 0, 0, 0, 0]).0 < 0 {
                    return 2;
                }
            }
            let denied = raw(
                libc::SYS_personality,
                [libc::ADDR_NO_RANDOMIZE as u64, 0, 0, 0, 0, 0],
            );
            if denied != (-1, libc::EPERM) {
                return 3;
            }
            0
        });
        assert_eq!(
            ended,
            Ended::Exited(0),
            "1: query failed, 2: an allowed persona failed, 3: ADDR_NO_RANDOMIZE not EPERM"
        );
    }

    // ---------------------------------------------------------------------
    // Other ABIs.

    #[test]
    fn x32_syscalls_are_denied() {
        let x32_getpid = i64::from(X32_SYSCALL_BIT) | libc::SYS_getpid;
        let x32_mount = i64::from(X32_SYSCALL_BIT) | libc::SYS_mount;
        let probes = [
            probe(x32_getpid, [0; 6], "x32 getpid"),
            probe(x32_mount, [0; 6], "x32 mount(NULL, ...)"),
        ];
        // Without the filter the kernel answers ENOSYS (no x32 support) or
        // runs the call; never EPERM. So an EPERM below is the filter's.
        let unfiltered = in_child(|| {
            let (ret, errno) = raw(x32_getpid, [0; 6]);
            i32::from(ret == -1 && errno == libc::EPERM)
        });
        assert_eq!(
            unfiltered,
            Ended::Exited(0),
            "the kernel itself answers EPERM"
        );

        let results = run_probes(&production(), &probes).unwrap();
        for (probe, result) in probes.iter().zip(results) {
            assert_eq!(result, (-1, libc::EPERM), "{}", probe.what);
        }
    }

    /// i386 `getpid` through `int 0x80`: returns its result, or the process
    /// dies if the call never returns.
    fn int80_getpid() -> i64 {
        let ret: i32;
        // SAFETY: `int 0x80` enters the kernel's i386 syscall path with eax
        // = 20 (i386 getpid), which takes no arguments and reads or writes no
        // memory. The kernel writes only eax; r8–r11 are declared clobbered
        // because old kernels did not preserve them on this path.
        unsafe {
            std::arch::asm!(
                "int 0x80",
                inlateout("eax") 20i32 => ret,
                out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                options(nostack),
            );
        }
        i64::from(ret)
    }

    #[test]
    fn i386_syscalls_kill_the_process() {
        // Control: does this kernel run i386 syscalls at all?
        let control = in_child(|| {
            // SAFETY: PR_SET_DUMPABLE takes an integer; no core dump if the
            // i386 call crashes us.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
            // SAFETY: getpid has no preconditions.
            let pid = i64::from(unsafe { libc::getpid() });
            i32::from(int80_getpid() != pid)
        });
        if control != Ended::Exited(0) {
            panic!(
                "this kernel does not run i386 syscalls ({control:?}), so the foreign-arch kill cannot be tested; \
                 CI machines have IA32 emulation"
            );
        }
        let program = production();
        let filtered = in_child(|| {
            if let Err(code) = enter(&program) {
                return code;
            }
            int80_getpid();
            0
        });
        assert_eq!(filtered, Ended::Signaled(libc::SIGSYS));
    }

    // ---------------------------------------------------------------------
    // Ordinary work.

    #[test]
    fn ordinary_programs_still_run() {
        let program = production();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        let ended = in_child(|| {
            if let Err(code) = enter(&program) {
                return code;
            }
            if std::fs::write(&path, b"hello").is_err() {
                return 1;
            }
            if std::fs::read(&path).ok().as_deref() != Some(b"hello".as_slice()) {
                return 2;
            }
            // fork/posix_spawn + exec of another program.
            match std::process::Command::new("/bin/sh")
                .args(["-c", "exit 3"])
                .status()
            {
                Ok(status) if status.code() == Some(3) => 0,
                _ => 3,
            }
        });
        assert_eq!(
            ended,
            Ended::Exited(0),
            "1: write, 2: read, 3: spawning /bin/sh failed"
        );
    }

    #[test]
    fn a_program_survives_its_byte_form() {
        let program = sandbox_filter().unwrap();
        let bytes = to_bytes(&program);
        assert_eq!(bytes.len(), program.len() * 8);
        let back = from_bytes(&bytes).unwrap();
        assert_eq!(back.len(), program.len());
        assert!(back
            .iter()
            .zip(&program)
            .all(|(a, b)| (a.code, a.jt, a.jf, a.k) == (b.code, b.jt, b.jf, b.k)));
        assert!(matches!(
            from_bytes(&bytes[..7]),
            Err(SeccompError::Truncated { len: 7 })
        ));
    }
}
