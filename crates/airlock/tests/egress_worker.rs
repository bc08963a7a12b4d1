//! The egress path runs confined: the proxy and resolver live in a worker
//! process that is not root, holds no capability, cannot gain privilege
//! and runs under its own syscall filter; a worker that dies is started
//! again and given every sandbox back. Needs root, nftables and python3.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::TestDaemon;
use serde_json::json;
use std::time::Duration;

/// The daemon's egress worker: pid and `/proc/<pid>/status`.
fn worker_of(daemon: &TestDaemon) -> Option<(u32, String)> {
    let daemon_pid = daemon.pid().to_string();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let parent = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .map(str::trim);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if parent == Some(daemon_pid.as_str())
            && cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == b"egress-worker")
        {
            return Some((pid, status));
        }
    }
    None
}

fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {name} in {status}"))
}

#[test]
fn egress_is_served_by_a_confined_worker_that_comes_back() {
    let daemon = TestDaemon::start(&["--egress-host", "site.test=203.0.113.9"]);
    let created = daemon.create(json!({"network": {"mode": "allow", "rules": ["site.test"]}}));
    let id = created["id"].as_str().unwrap();
    let (out, _) = daemon.sh_out(id, "getent hosts site.test");
    assert_eq!(out, "203.0.113.9     site.test\n");

    let (pid, status) = worker_of(&daemon).expect("the daemon runs an egress worker");
    let uid = airlock_jail::runtime::EGRESS_WORKER_ID.to_string();
    assert_eq!(
        field(&status, "Uid:")
            .split_whitespace()
            .collect::<Vec<_>>(),
        [uid.as_str(); 4],
        "real, effective, saved and filesystem uid"
    );
    for caps in ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:"] {
        assert_eq!(field(&status, caps), "0000000000000000", "{caps}");
    }
    assert_eq!(field(&status, "NoNewPrivs:"), "1");
    assert_eq!(field(&status, "Seccomp:"), "2", "a filter is installed");
    // Non-dumpable: its /proc files belong to root, not to its own uid.
    let meta = std::fs::metadata(format!("/proc/{pid}/environ")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 0);

    // Killed, it comes back, and the sandbox's path with it.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    assert!(
        TestDaemon::wait_for(Duration::from_secs(20), || {
            worker_of(&daemon).is_some_and(|(again, _)| again != pid)
        }),
        "no new worker"
    );
    let mut resolved = String::new();
    assert!(
        TestDaemon::wait_for(Duration::from_secs(20), || {
            resolved = daemon.sh_out(id, "getent hosts site.test").0;
            !resolved.is_empty()
        }),
        "the sandbox resolves nothing after the worker came back"
    );
    assert_eq!(resolved, "203.0.113.9     site.test\n");
    // And refusals still reach the audit trail.
    let (out, _) = daemon.sh_out(id, "getent hosts denied.test || echo refused");
    assert_eq!(out, "refused\n");
    // Reports cross the worker's channel and the audit writer: wait.
    let mut events = serde_json::Value::Null;
    let found = TestDaemon::wait_for(Duration::from_secs(10), || {
        events = daemon
            .call(
                "GET",
                &format!("/v1/sandboxes/{id}/events?stream=security"),
                None,
            )
            .json();
        events["items"].as_array().is_some_and(|items| {
            items
                .iter()
                .any(|e| e["detail"]["destination"] == "denied.test")
        })
    });
    assert!(found, "no denial of denied.test: {events}");
    daemon.delete_all();
}
