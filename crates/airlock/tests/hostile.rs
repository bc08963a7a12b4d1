//! Hostile tests: each one fails if the protection it names is removed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

#[test]
fn only_sandbox_pids_are_visible() {
    let value = sh_json(
        &[],
        "ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '",
    );
    let pids: Vec<u32> = stdout(&value)
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids[0], 1, "the agent is pid 1: {pids:?}");
    assert!(pids.len() < 10, "host processes are visible: {pids:?}");
}

#[test]
fn agent_environment_and_host_environment_are_unreadable() {
    let value = sh_json(&[], "cat /proc/1/environ >/dev/null 2>&1 && echo READ || echo denied; grep -l host-secret-value /proc/*/environ 2>/dev/null | wc -l");
    if on_gvisor() {
        // gVisor's procfs lets anyone read the init's environment; the
        // bundle gives the agent none of the host's (gVisor adds HOME).
        assert_eq!(stdout(&value), "READ\n0\n");
        let agent = sh_json(&[], "tr '\\0' ' ' < /proc/1/environ");
        assert_eq!(stdout(&agent), "HOME=/root ", "{agent}");
    } else {
        assert_eq!(stdout(&value), "denied\n0\n");
    }
}

/// Whether this run of the suite is on the `base` template (scripts/test
/// runs it twice): a template's root is the sandbox's own copy-on-write
/// view, writable by its root, where the host template's is read-only.
fn on_base() -> bool {
    std::env::var("AIRLOCK_TEST_TEMPLATE").as_deref() == Ok("base")
}

/// On `base`: what the sandbox wrote landed in its private layer, never in
/// the template's shared files.
fn assert_template_untouched(paths: &[&str]) {
    if !on_base() {
        return;
    }
    let root = common::base::base_rootfs();
    for path in paths {
        let on_host = root.join(path.trim_start_matches('/'));
        assert!(
            !on_host.exists(),
            "a sandbox's write reached the template's shared layer: {}",
            on_host.display()
        );
    }
}

#[test]
fn system_dirs_are_read_only_even_for_root() {
    let passwd =
        on_base().then(|| std::fs::read(common::base::base_rootfs().join("etc/passwd")).unwrap());
    for user in ["user", "root"] {
        let value = sh_json(
            &["--user", user],
            "for f in /usr/x /etc/x /etc/passwd /bin/x /lib/x; do (echo x > $f) 2>/dev/null && echo WROTE $f; done; echo end",
        );
        if on_base() && user == "root" {
            // The template's root is the sandbox's own: root writes its copy.
            assert_eq!(
                stdout(&value),
                "WROTE /usr/x\nWROTE /etc/x\nWROTE /etc/passwd\nWROTE /bin/x\nWROTE /lib/x\nend\n"
            );
        } else {
            assert_eq!(stdout(&value), "end\n", "as {user}");
        }
    }
    assert_template_untouched(&["/usr/x", "/etc/x", "/bin/x", "/lib/x"]);
    if let Some(passwd) = passwd {
        assert_eq!(
            std::fs::read(common::base::base_rootfs().join("etc/passwd")).unwrap(),
            passwd,
            "the template's /etc/passwd changed"
        );
    }
}

#[test]
fn generated_etc_has_no_host_secrets() {
    // resolv.conf is generated: it names the sandbox's own resolver, never
    // the host's servers or search domains.
    let value = sh_json(&["--user", "root"], "ls /etc; test -e /etc/shadow && echo SHADOW; test -e /etc/ssh && echo SSH; grep -v '^nameserver 127.0.0.1$' /etc/resolv.conf | grep -v '^options edns0$' && echo RESOLV; true");
    let listing = stdout(&value);
    // The base template has Debian's own /etc/shadow (locked accounts):
    // it must not be the host's.
    let shadow_ok = if on_base() {
        let inside = sh_json(&["--user", "root"], "cat /etc/shadow");
        std::fs::read_to_string("/etc/shadow").ok().as_deref() != Some(stdout(&inside))
    } else {
        !listing.contains("SHADOW")
    };
    assert!(
        shadow_ok && !listing.contains("SSH") && !listing.contains("RESOLV"),
        "{listing}"
    );
    assert!(listing.contains("passwd"));
}

/// Python helpers for syscall probes: `call(nr, *args)` makes a raw
/// syscall and gives 0 on success or its errno; `in_child(fn)` runs `fn`
/// in a forked child (so what it changes stays there) and gives the errno
/// it exits with; `report(name, errno)` prints one `name errno` line.
const PROBE_LIB: &str = r#"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 0 if r >= 0 else ctypes.get_errno()
def in_child(fn):
    pid = os.fork()
    if pid == 0:
        os._exit(fn())
    return os.waitpid(pid, 0)[1] >> 8
def report(name, errno):
    print(name, errno, flush=True)
"#;

/// Runs a probe script on the host, outside any sandbox, as nobody (uid and
/// gid 65534, no capabilities): what the kernel itself answers these calls
/// without the sandbox's seccomp filter.
fn unfiltered_on_host(script: &str) -> String {
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .uid(65534)
        .gid(65534)
        .current_dir("/")
        .output()
        .expect("python3 runs on the host");
    assert!(
        out.status.success(),
        "the probe failed on the host: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `name errno` lines, one per probe, each with `errno`.
fn all_with(probes: &[(&str, i32)], errno: i32) -> String {
    probes
        .iter()
        .map(|(name, _)| format!("{name} {errno}\n"))
        .collect()
}

/// Runs `calls` (lines of Python after [`PROBE_LIB`]) on the host as
/// nobody, where each probe must get the answer `unfiltered` gives it (the
/// kernel's own: success or an errno other than EPERM), then in sandboxes
/// as each of `users`, where every probe must get EPERM. Since nothing but
/// the seccomp filter answers these calls with EPERM, that errno inside
/// is the filter's.
fn assert_only_the_filter_says_eperm(users: &[&str], calls: &str, unfiltered: &[(&str, i32)]) {
    let script = format!("{PROBE_LIB}{calls}");
    let expected: String = unfiltered
        .iter()
        .map(|(name, errno)| format!("{name} {errno}\n"))
        .collect();
    assert!(unfiltered.iter().all(|(_, errno)| *errno != libc::EPERM));
    assert_eq!(
        unfiltered_on_host(&script),
        expected,
        "without a filter this host's kernel does not answer the probes as expected \
         (`name errno`, 0 for success), so EPERM inside could come from the kernel"
    );
    for user in users {
        let value = py_json(&["--user", user], &script);
        assert_eq!(
            stdout(&value),
            all_with(unfiltered, libc::EPERM),
            "as {user}: {value}"
        );
    }
}

#[test]
fn mount_and_unshare_fail_even_for_root() {
    // Unfiltered, mount(2) copies its filesystem type before any
    // permission check (an unmapped pointer: EFAULT), unshare(0) is a
    // no-op, a new user namespace is granted, setns(-1) finds no
    // descriptor and CLONE_SIGHAND without CLONE_VM is invalid.
    assert_only_the_filter_says_eperm(
        &["root", "user"],
        &format!(
            "report(\"mount\", call({mount}, 0, 0, 1, 0, 0))
report(\"unshare\", call({unshare}, 0))
report(\"unshare_user\", in_child(lambda: call({unshare}, {newuser})))
report(\"setns\", call({setns}, -1, 0))
report(\"clone_user\", call({clone}, {newuser} | {sighand}, 0, 0, 0, 0))
",
            mount = libc::SYS_mount,
            unshare = libc::SYS_unshare,
            setns = libc::SYS_setns,
            clone = libc::SYS_clone,
            newuser = libc::CLONE_NEWUSER,
            sighand = libc::CLONE_SIGHAND,
        ),
        &[
            ("mount", libc::EFAULT),
            ("unshare", 0),
            ("unshare_user", 0),
            ("setns", libc::EBADF),
            ("clone_user", libc::EINVAL),
        ],
    );
}

#[test]
fn dangerous_syscalls_get_eperm() {
    // Unfiltered, io_uring_setup and perf_event_open copy their parameters
    // first (NULL: EFAULT), keyctl finds the session keyring, bpf refuses
    // an unknown command with EINVAL and userfaultfd is granted to anyone
    // for user-mode faults (UFFD_USER_MODE_ONLY).
    assert_only_the_filter_says_eperm(
        &["user", "root"],
        &format!(
            "report(\"io_uring_setup\", call({io_uring_setup}, 1, 0))
report(\"keyctl\", call({keyctl}, 0, -3, 0))
report(\"bpf\", call({bpf}, 0xffff, 0, 0))
report(\"userfaultfd\", call({userfaultfd}, 1))
report(\"perf_event_open\", call({perf_event_open}, 0, 0, -1, -1, 0))
",
            io_uring_setup = libc::SYS_io_uring_setup,
            keyctl = libc::SYS_keyctl,
            bpf = libc::SYS_bpf,
            userfaultfd = libc::SYS_userfaultfd,
            perf_event_open = libc::SYS_perf_event_open,
        ),
        &[
            ("io_uring_setup", libc::EFAULT),
            ("keyctl", 0),
            ("bpf", libc::EINVAL),
            ("userfaultfd", 0),
            ("perf_event_open", libc::EFAULT),
        ],
    );
}

/// Appends `NoNewPrivs:\t<flag>` and `CapAmb:\t<hex set>` as prctl tells them
/// (gVisor's /proc/self/status has neither line).
const NO_NEW_PRIVS: &str = "; python3 -c 'import ctypes; p = ctypes.CDLL(None).prctl; print(\"NoNewPrivs:\\t%d\" % p(39, 0, 0, 0, 0)); print(\"CapAmb:\\t%016x\" % sum(1 << c for c in range(41) if p(47, 1, c, 0, 0) == 1))'";

#[test]
fn user_has_no_capabilities_and_no_new_privs() {
    let value = sh_json(
        &[],
        &format!(
            "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|Seccomp):' /proc/self/status{NO_NEW_PRIVS}"
        ),
    );
    let status = stdout(&value);
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            status.contains(&format!("{cap}:\t0000000000000000")),
            "{cap} not empty: {status}"
        );
    }
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
}

#[test]
fn root_keeps_only_a_small_capability_set() {
    let value = sh_json(
        &["--user", "root"],
        &format!("grep -E '^(CapEff|CapBnd):' /proc/self/status{NO_NEW_PRIVS}"),
    );
    let status = stdout(&value);
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:\t"))
        .map(|h| u64::from_str_radix(h, 16).unwrap())
        .unwrap();
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    const CAP_NET_RAW: u64 = 1 << 13;
    const CAP_SYS_PTRACE: u64 = 1 << 19;
    assert_eq!(
        eff & (CAP_SYS_ADMIN | CAP_NET_RAW | CAP_SYS_PTRACE),
        0,
        "{status}"
    );
    assert!(status.contains("NoNewPrivs:\t1"));
}

/// `sudo` (where the image ships it: `base`) gives `user` the sandbox's
/// root and nothing more: the capabilities, no_new_privs and seccomp
/// filter of a command the API starts as root, so a mount still fails.
/// Where the image has no sudo, no process can ask the agent for root.
#[test]
fn sudo_grants_the_sandboxs_root_and_nothing_more() {
    let probe = format!("grep -E '^(CapEff|CapBnd|Seccomp):' /proc/self/status{NO_NEW_PRIVS}");
    let as_root = stdout(&sh_json(&["--user", "root"], &probe)).to_owned();
    assert!(as_root.contains("NoNewPrivs:\t1"), "{as_root}");
    if on_base() {
        let value = sh_json(
            &[],
            &format!(
                "cat > /tmp/probe.sh <<'PROBE'\n{probe}\nPROBE\n\
                 id -un; sudo id -un; sudo sh /tmp/probe.sh; \
                 sudo mount -t tmpfs none /mnt 2>/dev/null && echo MOUNTED || echo refused"
            ),
        );
        assert_eq!(
            stdout(&value),
            format!("user\nroot\n{as_root}refused\n"),
            "{value}"
        );
    } else {
        let value = sh_json(
            &[],
            "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); \
             print(s.connect_ex(b\"\\0airlock-sudo\"))'",
        );
        assert_eq!(
            stdout(&value),
            format!("{}\n", libc::ECONNREFUSED),
            "a sandbox without sudo has no sudo socket: {value}"
        );
    }
}

#[test]
fn landlock_confines_writes_of_root() {
    // Root inside owns the tmpfs root and /mnt/skills, so only Landlock stops these.
    let value = sh_json(
        &["--user", "root"],
        "touch /newfile 2>/dev/null && echo WROTE_ROOT; touch /mnt/skills/public/x 2>/dev/null && echo WROTE_SKILLS; \
         touch /tmp/ok && echo tmp-ok",
    );
    if on_base() {
        // A template's root is the sandbox's own copy-on-write view (no
        // skills are mounted here): the writes stay in its private layer.
        assert_eq!(stdout(&value), "WROTE_ROOT\nWROTE_SKILLS\ntmp-ok\n");
        assert_template_untouched(&["/newfile", "/mnt/skills/public/x"]);
    } else {
        assert_eq!(stdout(&value), "tmp-ok\n");
    }
}

#[test]
fn fork_bomb_stops_at_pids_limit() {
    let script = "python3 -c '
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as e:
    print(\"stopped\", e.errno, n)
'";
    let value = sh_json(&["--pids", "32"], script);
    let text = stdout(&value);
    let parts: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(parts[..2], ["stopped", "11"], "{value}");
    // gVisor counts the limit (its RLIMIT_NPROC) against forks made, the
    // host's cgroup against every task alive.
    let forks = parts[2].parse::<u32>().unwrap();
    if on_gvisor() {
        assert!(forks <= 32, "{value}");
    } else {
        assert!(forks < 32, "{value}");
    }
}

/// What a watcher on the host saw of the sandbox whose pids cgroup has
/// `pids.max` set to a given limit.
#[derive(Debug, Default)]
struct BombWatch {
    /// The sandbox's pid namespace (`pid:[INODE]`), once seen.
    pid_ns: Option<String>,
    /// The most processes seen at once in that pid namespace, counted over
    /// the host's whole /proc (in the cgroup or not).
    peak_in_ns: usize,
    /// The last `max` count of the cgroup's `pids.events`: forks refused
    /// at the limit.
    refused_at_limit: u64,
}

/// The pids cgroup directories of live sandboxes (v1 and v2 layouts).
fn pids_cgroups() -> Vec<std::path::PathBuf> {
    ["/sys/fs/cgroup/pids/airlock", "/sys/fs/cgroup/airlock"]
        .iter()
        .filter_map(|root| std::fs::read_dir(root).ok())
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("sbx-"))
        })
        .collect()
}

/// The pid namespace of every process on the host, as (pid, `pid:[INODE]`).
fn host_pid_namespaces() -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let ns = std::fs::read_link(e.path().join("ns/pid")).ok()?;
            Some((pid, ns.to_string_lossy().into_owned()))
        })
        .collect()
}

/// Watches, until `stop` is set, the sandbox whose pids limit is `limit`.
fn watch_bomb(limit: u64, stop: &std::sync::atomic::AtomicBool) -> BombWatch {
    use std::sync::atomic::Ordering;
    let mut watch = BombWatch::default();
    let mut cgroup: Option<std::path::PathBuf> = None;
    // The launcher joins the cgroup before it starts the sandbox's pid
    // namespace: a process still in the host's is not the sandbox's.
    let host_ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|ns| ns.to_string_lossy().into_owned())
        .unwrap();
    while !stop.load(Ordering::SeqCst) {
        if cgroup.is_none() {
            cgroup = pids_cgroups().into_iter().find(|dir| {
                std::fs::read_to_string(dir.join("pids.max"))
                    .is_ok_and(|max| max.trim() == limit.to_string())
            });
        }
        if let Some(dir) = &cgroup {
            if let Ok(events) = std::fs::read_to_string(dir.join("pids.events")) {
                if let Some(n) = events
                    .lines()
                    .find_map(|l| l.strip_prefix("max "))
                    .and_then(|n| n.trim().parse().ok())
                {
                    watch.refused_at_limit = n;
                }
            }
            if watch.pid_ns.is_none() {
                // The first member not in the host's pid namespace (the
                // runtime of an OCI tier may have a process of its own
                // there, runc's init before it enters the sandbox's).
                watch.pid_ns = std::fs::read_to_string(dir.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|pid| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok())
                    .map(|ns| ns.to_string_lossy().into_owned())
                    .find(|ns| *ns != host_ns);
            }
            if let Some(ns) = &watch.pid_ns {
                let count = host_pid_namespaces()
                    .iter()
                    .filter(|(_, n)| n == ns)
                    .count();
                watch.peak_in_ns = watch.peak_in_ns.max(count);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    watch
}

#[test]
fn real_fork_bomb_is_contained_and_killed() {
    // An unusual limit, so the watcher finds this sandbox's cgroup among
    // those of other tests running at the same time.
    const LIMIT: u64 = 47;
    if on_gvisor() {
        // Under gVisor the guest's tasks are its kernel's: the limit is its
        // RLIMIT_NPROC, and the host cgroup (twice that and the sentry's
        // own threads) only bounds gVisor. The forks fail inside, the
        // sandbox lives to its timeout and goes whole (sh_json checks its
        // cgroup, processes, mounts and slot are gone).
        let value = sh_json(
            &["--pids", &LIMIT.to_string(), "--timeout", "4s"],
            "bash -c 'bomb() { while :; do bomb | bomb & done; }; bomb'",
        );
        let stderr = value["stderr"].as_str().unwrap();
        assert!(
            stderr.contains("fork: retry: Resource temporarily unavailable"),
            "no fork failed with EAGAIN inside: {value}"
        );
        assert_eq!(value["timed_out"], true, "{value}");
        return;
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (value, watch) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| watch_bomb(LIMIT, &stop));
        let value = sh_json(
            &["--pids", &LIMIT.to_string(), "--timeout", "4s"],
            // Every process forks for ever: a bomb that only dies when
            // it is killed.
            "bash -c 'bomb() { while :; do bomb | bomb & done; }; bomb'",
        );
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (value, watcher.join().unwrap())
    });
    // Contained: forks failed inside with EAGAIN (bash reports its
    // strerror), the cgroup counted forks refused at its limit, and the
    // bomb never had more processes than the limit anywhere on the host
    // (counted by pid namespace, so one that left the cgroup counts too).
    let stderr = value["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("fork: retry: Resource temporarily unavailable"),
        "no fork failed with EAGAIN inside: {value}"
    );
    let ns = watch
        .pid_ns
        .clone()
        .unwrap_or_else(|| panic!("never saw the sandbox's cgroup: {watch:?}"));
    assert!(
        watch.refused_at_limit > 0,
        "pids.events never counted the limit: {watch:?}"
    );
    assert!(
        watch.peak_in_ns > 1 && watch.peak_in_ns as u64 <= LIMIT,
        "processes of the bomb at once: {watch:?}"
    );
    // Killed: at its timeout, and nothing of it is left (sh_json checked
    // its cgroup, processes, mounts and slot; no process is left in its
    // pid namespace either).
    assert_eq!(value["timed_out"], true, "{value}");
    let left: Vec<u32> = host_pid_namespaces()
        .into_iter()
        .filter(|(_, n)| *n == ns)
        .map(|(pid, _)| pid)
        .collect();
    assert!(
        left.is_empty(),
        "processes of the bomb outlived it: {left:?}"
    );
}

#[test]
fn memory_hog_is_oom_killed() {
    let value = sh_json(
        &["--memory", "64M"],
        "python3 -c 'x = b\"a\" * (512 << 20); print(len(x))'",
    );
    assert_eq!(exit_code(&value), 137, "{value}");
    assert_eq!(value["oom"], true, "{value}");
}

#[test]
fn detached_daemons_die_with_the_sandbox() {
    let value = sh_json(
        &[],
        "setsid nohup sleep 1000 >/dev/null 2>&1 & echo started",
    );
    assert_eq!(stdout(&value), "started\n");
    // assert_no_leftovers (inside sh_json) checked no process of the sandbox survived.
}

#[test]
fn timeout_kills_a_process_that_ignores_sigterm() {
    let started = Instant::now();
    let value = sh_json(&["--timeout", "2s"], "trap '' TERM; while :; do :; done");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(value["timed_out"], true);
    assert_eq!(exit_code(&value), 137);
}

#[test]
fn disk_fill_hits_enospc_at_the_quota() {
    let value = sh_json(
        &["--disk", "16M"],
        "dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1 | grep -c 'No space left'; du -m /tmp/fill | cut -f1",
    );
    let lines: Vec<&str> = stdout(&value).lines().collect();
    let size = lines[1].parse::<u32>().unwrap();
    if on_gvisor() {
        // gVisor's kernel answers a full layer under an overlay with EFBIG
        // (dd dies of SIGXFSZ) where the host's says ENOSPC, and may hold
        // the last 1 MiB write in its own cache when it does.
        let refused = lines[0] == "1"
            || value["stderr"]
                .as_str()
                .is_some_and(|e| e.contains("File size limit exceeded"));
        assert!(refused, "{value}");
        assert!(size <= 17, "{value}");
    } else {
        assert_eq!(lines[0], "1", "{value}");
        assert!(size <= 16, "{value}");
    }
}

#[test]
fn nofile_limit_gives_emfile() {
    let value = sh_json(
        &["--nofile", "32"],
        "python3 -c '
import os
fds = []
try:
    while True:
        fds.append(os.open(\"/dev/null\", os.O_RDONLY))
except OSError as e:
    print(e.errno, len(fds) < 32)
'",
    );
    assert_eq!(stdout(&value), "24 True\n");
}

#[test]
fn only_loopback_exists() {
    let value = sh_json(&[], "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
    assert_eq!(stdout(&value), "lo\n");
    // And it is up: a connection to itself over 127.0.0.1 goes through.
    let value = sh_json(
        &[],
        "python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); \
         c = socket.create_connection(s.getsockname(), timeout=5); a, _ = s.accept(); \
         c.sendall(b\"up\"); print(a.recv(2).decode())'",
    );
    assert_eq!(stdout(&value), "up\n");
}

#[test]
fn output_is_capped_and_the_run_returns() {
    let started = Instant::now();
    let value = sh_json(&["--output-limit", "1M"], "yes");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(value["stdout_truncated"], true);
    assert_eq!(stdout(&value).len(), 1 << 20);
}

#[test]
fn no_host_descriptor_reaches_the_sandbox() {
    let value = sh_json(&[], "ls /proc/self/fd | sort -n | tr '\\n' ' '");
    // 0-2 are stdio, 3 is the fd ls opened for the listing itself.
    assert_eq!(stdout(&value), "0 1 2 3 ");
}

#[test]
fn symlinks_in_a_template_cannot_redirect_setup_to_the_host() {
    let busybox = std::path::Path::new("/bin/busybox");
    assert!(
        busybox.exists(),
        "the busybox-static package is needed (CI installs it)"
    );
    let host_target = tempfile::tempdir().unwrap();
    let template = tempfile::tempdir().unwrap();
    std::fs::set_permissions(template.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = template.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::copy(busybox, bin.join("busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", bin.join("sh")).unwrap();
    // Absolute symlinks pointing at a host directory, where setup creates
    // directories, writes files and mounts.
    std::os::unix::fs::symlink(host_target.path(), template.path().join("mnt")).unwrap();
    std::os::unix::fs::symlink(host_target.path(), template.path().join("etc")).unwrap();
    std::os::unix::fs::symlink(host_target.path(), template.path().join("proc")).unwrap();
    let data = tempfile::tempdir().unwrap();
    let mount = format!("{}:/mnt/data", data.path().display());
    let path = template.path().to_str().unwrap();
    // Setup may refuse the template (a dangling /etc) or succeed; either way
    // nothing may land in the host directory the symlinks point at.
    let out = run(&[
        "--json",
        "--template",
        path,
        "--mount",
        &mount,
        "--",
        "/bin/sh",
        "-c",
        "echo ran",
    ]);
    if out.status.success() {
        let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_no_leftovers(value["sandbox_id"].as_str().unwrap());
    } else {
        assert_eq!(
            out.status.code(),
            Some(125),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("setup failed"));
    }
    let leaked: Vec<_> = std::fs::read_dir(host_target.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        leaked.is_empty(),
        "setup wrote through a template symlink to the host: {leaked:?}"
    );
}

#[test]
fn host_ipc_objects_are_invisible() {
    // A System V shared memory segment of the host, with a recognisable key.
    let created = std::process::Command::new("ipcmk")
        .args(["-M", "4096"])
        .output()
        .expect("ipcmk (util-linux) runs");
    assert!(created.status.success(), "ipcmk failed");
    let text = String::from_utf8_lossy(&created.stdout);
    let id = text.split_whitespace().last().unwrap().to_owned();
    let value = sh_json(&[], "tail -n +2 /proc/sysvipc/shm | wc -l");
    let _ = std::process::Command::new("ipcrm")
        .args(["-m", &id])
        .status();
    assert_eq!(
        stdout(&value),
        "0\n",
        "host shm segments are visible inside"
    );
}

#[test]
fn cgroup_namespace_hides_host_cgroup_paths() {
    let value = sh_json(&[], "cat /proc/self/cgroup");
    let text = stdout(&value);
    assert!(
        !text.contains("airlock") && !text.contains("sbx-"),
        "{text}"
    );
    if on_gvisor() {
        // gVisor's kernel mounts no cgroups in the sandbox: nothing to see.
        assert_eq!(text, "", "{value}");
    } else {
        assert!(text.lines().any(|l| l.ends_with(":/")), "{text}");
    }
}

#[test]
fn sensitive_proc_entries_are_masked() {
    let value = sh_json(
        &["--user", "root"],
        // A file that is not there at all (gVisor's procfs has neither)
        // counts as masked: `|| echo 0`.
        "(wc -c < /proc/timer_list || echo 0) 2>/dev/null; (wc -c < /proc/keys || echo 0) 2>/dev/null; (echo 1 > /proc/sys/kernel/ns_last_pid) 2>/dev/null && echo WROTE_SYS; \
         (echo b > /proc/sysrq-trigger) 2>/dev/null && echo WROTE_SYSRQ; head -c1 /proc/kcore >/dev/null 2>&1 && echo READ_KCORE; \
         head -c1 /proc/kpageflags >/dev/null 2>&1 && echo READ_KPAGEFLAGS; echo end",
    );
    assert_eq!(stdout(&value), "0\n0\nend\n");
}

#[test]
fn dev_is_minimal_and_read_only() {
    let value = sh_json(&["--user", "root"], "ls /dev | tr '\\n' ' '; mknod /dev/sda b 8 0 2>/dev/null && echo MKNOD; touch /dev/x 2>/dev/null && echo TOUCH; echo");
    if on_gvisor() {
        // gVisor's kernel adds its own FUSE and TUN devices (usable only
        // with capabilities the sandbox does not have), and its /dev is a
        // tmpfs of its own that root may add to: a node made there names a
        // device of gVisor's kernel, which has no disk behind it.
        assert_eq!(
            stdout(&value),
            "fd full fuse net null ptmx pts random shm stderr stdin stdout tty urandom zero MKNOD\nTOUCH\n\n"
        );
        let disk = sh_json(
            &["--user", "root"],
            "mknod /dev/sda b 8 0 && head -c1 /dev/sda >/dev/null 2>&1 && echo READ_DISK; echo end",
        );
        assert_eq!(stdout(&disk), "end\n", "{disk}");
    } else {
        assert_eq!(
            stdout(&value),
            "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero \n"
        );
    }
}

#[test]
fn ptrace_is_denied_even_for_root() {
    // Unfiltered, a process may trace its own child (same uid, dumpable)
    // and a child may ask to be traced: both succeed without privilege.
    assert_only_the_filter_says_eperm(
        &["root", "user"],
        &format!(
            "def attach_own_child():
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    errno = call({ptrace}, 16, child, 0, 0)
    os.kill(child, 9)
    os.waitpid(child, 0)
    return errno
report(\"attach\", attach_own_child())
report(\"traceme\", in_child(lambda: call({ptrace}, 0, 0, 0, 0)))
",
            ptrace = libc::SYS_ptrace,
        ),
        &[("attach", 0), ("traceme", 0)],
    );
}

#[test]
fn cpu_quota_throttles_a_busy_loop() {
    let value = sh_json(&["--cpus", "0.2", "--timeout", "2s"], "while :; do :; done");
    assert_eq!(value["timed_out"], true);
    let cpu = value["cpu_time_ms"].as_u64().unwrap();
    // 0.2 CPU for 2 s is 400 ms; unthrottled it would be about 2000 ms.
    assert!(cpu < 900, "cpu time {cpu} ms under a 0.2 CPU quota");
}

#[test]
fn core_dumps_are_off_and_file_size_is_capped() {
    let value = sh_json(
        &["--disk", "64M"],
        "python3 -c 'import resource as r; print(r.getrlimit(r.RLIMIT_CORE), r.getrlimit(r.RLIMIT_FSIZE))'",
    );
    assert_eq!(stdout(&value), "(0, 0) (67112960, 67112960)\n");
}
