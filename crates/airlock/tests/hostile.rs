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
    assert_eq!(stdout(&value), "denied\n0\n");
}

#[test]
fn system_dirs_are_read_only_even_for_root() {
    for user in ["user", "root"] {
        let value = sh_json(
            &["--user", user],
            "for f in /usr/x /etc/x /etc/passwd /bin/x /lib/x; do (echo x > $f) 2>/dev/null && echo WROTE $f; done; echo end",
        );
        assert_eq!(stdout(&value), "end\n", "as {user}");
    }
}

#[test]
fn generated_etc_has_no_host_secrets() {
    // resolv.conf is generated: it names the sandbox's own resolver, never
    // the host's servers or search domains.
    let value = sh_json(&["--user", "root"], "ls /etc; test -e /etc/shadow && echo SHADOW; test -e /etc/ssh && echo SSH; grep -v '^nameserver 127.0.0.1$' /etc/resolv.conf | grep -v '^options edns0$' && echo RESOLV; true");
    let listing = stdout(&value);
    assert!(
        !listing.contains("SHADOW") && !listing.contains("SSH") && !listing.contains("RESOLV"),
        "{listing}"
    );
    assert!(listing.contains("passwd"));
}

#[test]
fn mount_and_unshare_fail_even_for_root() {
    let value = sh_json(
        &["--user", "root"],
        "mount -t tmpfs none /tmp 2>/dev/null && echo MOUNTED; unshare -Ur true 2>/dev/null && echo UNSHARED; \
         unshare -m true 2>/dev/null && echo UNSHARED_MNT; echo end",
    );
    assert_eq!(stdout(&value), "end\n");
}

const SYSCALL_PROBE: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
def probe(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *args)
    return (r, ctypes.get_errno())
print(*probe(425, 1, 0))          # io_uring_setup
print(*probe(250, 0, -3, 0))       # keyctl(GET_KEYRING_ID, session)
print(*probe(321, 0, 0, 0))        # bpf
print(*probe(323, 0))              # userfaultfd
"#;

#[test]
fn dangerous_syscalls_get_eperm() {
    for user in ["user", "root"] {
        let script = format!("python3 -c '{}'", SYSCALL_PROBE.replace('\'', "\\'"));
        let value = sh_json(&["--user", user], &script);
        let lines: Vec<&str> = stdout(&value).lines().collect();
        assert_eq!(
            lines,
            ["-1 1", "-1 1", "-1 1", "-1 1"],
            "as {user}: {value}"
        );
    }
}

#[test]
fn user_has_no_capabilities_and_no_new_privs() {
    let value = sh_json(
        &[],
        "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status",
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
        "grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status",
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

#[test]
fn landlock_confines_writes_of_root() {
    // Root inside owns the tmpfs root and /mnt/skills, so only Landlock stops these.
    let value = sh_json(
        &["--user", "root"],
        "touch /newfile 2>/dev/null && echo WROTE_ROOT; touch /mnt/skills/public/x 2>/dev/null && echo WROTE_SKILLS; \
         touch /tmp/ok && echo tmp-ok",
    );
    assert_eq!(stdout(&value), "tmp-ok\n");
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
    assert!(parts[2].parse::<u32>().unwrap() < 32);
}

#[test]
fn real_fork_bomb_is_contained_and_killed() {
    let started = Instant::now();
    let value = sh_json(
        &["--pids", "64", "--timeout", "3s"],
        "bomb() { bomb | bomb & }; bomb; wait",
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(value["exit_code"].is_i64());
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
    assert_eq!(lines[0], "1", "{value}");
    assert!(lines[1].parse::<u32>().unwrap() <= 16, "{value}");
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
    assert!(text.lines().any(|l| l.ends_with(":/")), "{text}");
}

#[test]
fn sensitive_proc_entries_are_masked() {
    let value = sh_json(
        &["--user", "root"],
        "wc -c < /proc/timer_list; wc -c < /proc/keys; (echo 1 > /proc/sys/kernel/ns_last_pid) 2>/dev/null && echo WROTE_SYS; \
         (echo b > /proc/sysrq-trigger) 2>/dev/null && echo WROTE_SYSRQ; head -c1 /proc/kcore >/dev/null 2>&1 && echo READ_KCORE; \
         head -c1 /proc/kpageflags >/dev/null 2>&1 && echo READ_KPAGEFLAGS; echo end",
    );
    assert_eq!(stdout(&value), "0\n0\nend\n");
}

#[test]
fn dev_is_minimal_and_read_only() {
    let value = sh_json(&["--user", "root"], "ls /dev | tr '\\n' ' '; mknod /dev/sda b 8 0 2>/dev/null && echo MKNOD; touch /dev/x 2>/dev/null && echo TOUCH; echo");
    assert_eq!(
        stdout(&value),
        "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero \n"
    );
}

#[test]
fn ptrace_is_denied_even_for_root() {
    let script = "python3 -c 'import ctypes; libc = ctypes.CDLL(None, use_errno=True); \
                  r = libc.ptrace(16, 1, 0, 0); print(r, ctypes.get_errno())'";
    let value = sh_json(&["--user", "root"], script);
    assert_eq!(stdout(&value), "-1 1\n");
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
