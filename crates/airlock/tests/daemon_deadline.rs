//! Deadlines that hold without the daemon, and adoption that survives a
//! supervisor that does not answer for a while.
//!
//! A sandbox's supervisor knows its deadline (the spec's timeout, then every
//! extension the daemon hands it) and ends the sandbox itself a short grace
//! after it, so a sandbox whose daemon was killed and never came back does
//! not run on. A daemon that starts later records such a sandbox dead with
//! reason `timeout`. A supervisor that is alive but does not answer while a
//! daemon starts (here: stopped with SIGSTOP) is not reaped; it is adopted
//! once it answers.
//!
//! Daemon starts sweep host-wide leftovers: the tests of this file run one
//! at a time (see [`serial`]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{
    assert_sandbox_gone, serial, supervisors, SupervisorCleanup as Cleanup, TestDaemon,
};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The supervisor's grace after a deadline (airlock_backend's
/// `process::deadline::GRACE`).
const GRACE: Duration = Duration::from_secs(3);
/// How long past deadline + grace a teardown may take on a loaded machine
/// before the test calls the sandbox a survivor.
const SLACK: Duration = Duration::from_secs(25);

fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) of a pid whose command line was just read as a
    // sandbox supervisor of this test; at worst the call fails.
    let sent = unsafe { libc::kill(pid as i32, signal) };
    assert_eq!(sent, 0, "signal {signal} to {pid}");
}

/// Host pids of the processes in sandbox `id` (by their cgroup).
fn sandbox_processes(id: &str) -> Vec<u32> {
    let needle = format!("/airlock/{id}");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cgroups) = std::fs::read_to_string(entry.path().join("cgroup")) else {
            continue;
        };
        if cgroups.lines().any(|l| l.ends_with(&needle)) {
            pids.push(pid);
        }
    }
    pids
}

/// Whether sandbox `id` still runs: its supervisor or any of its processes.
fn alive(id: &str) -> bool {
    !supervisors(id).is_empty() || !sandbox_processes(id).is_empty()
}

/// Creates a sandbox with `timeout_s` that runs `sleep 600` in the
/// background; its id and when it was created.
fn sandbox(daemon: &TestDaemon, cleanup: &Cleanup, timeout_s: u64) -> (String, Instant) {
    let created = daemon.create(json!({"timeout_s": timeout_s}));
    let at = Instant::now();
    let id = created["id"].as_str().unwrap().to_owned();
    cleanup.add(&id);
    let answer = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": "sleep", "args": ["600"], "background": true})),
    );
    assert_eq!(answer.status, 201, "background exec: {}", answer.text());
    assert_eq!(supervisors(&id).len(), 1, "one supervisor for {id}");
    (id, at)
}

fn view(daemon: &TestDaemon, id: &str) -> Value {
    let answer = daemon.call("GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(answer.status, 200, "get {id}: {}", answer.text());
    answer.json()
}

/// Waits until `id` no longer runs, at most until `limit` after `from`.
fn gone_by(id: &str, from: Instant, limit: Duration) -> bool {
    let left = limit.saturating_sub(from.elapsed());
    TestDaemon::wait_for(left, || !alive(id))
}

#[test]
fn a_sandbox_whose_daemon_is_killed_dies_at_its_deadline_and_is_recorded_timed_out() {
    let _serial = serial();
    let cleanup = Cleanup::default();
    let mut daemon = TestDaemon::start(&[]);
    let timeout = Duration::from_secs(3);
    let (id, created) = sandbox(&daemon, &cleanup, timeout.as_secs());

    daemon.kill9();

    assert!(
        gone_by(&id, created, timeout + GRACE + SLACK),
        "{id} still runs {:?} after its {timeout:?} timeout, with no daemon: supervisor {:?}, processes {:?}",
        created.elapsed(),
        supervisors(&id),
        sandbox_processes(&id),
    );
    assert_sandbox_gone(&id);

    // A daemon that starts later learns how it ended.
    daemon.restart();
    let v = view(&daemon, &id);
    assert_eq!(v["state"], "dead", "{v}");
    assert_eq!(v["reason"], "timeout", "{v}");
}

#[test]
fn an_extended_deadline_holds_without_the_daemon() {
    let _serial = serial();
    let cleanup = Cleanup::default();
    let mut daemon = TestDaemon::start(&[]);
    let first = Duration::from_secs(3);
    let (id, created) = sandbox(&daemon, &cleanup, first.as_secs());
    let extended = Duration::from_secs(20);
    let answer = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{id}/timeout"),
        Some(json!({"timeout_s": extended.as_secs()})),
    );
    assert!(
        answer.status < 300,
        "extending the timeout: {} {}",
        answer.status,
        answer.text()
    );
    let extended_at = Instant::now();

    daemon.kill9();

    // Well past the first deadline and its grace: still running.
    let past_first = first + GRACE + Duration::from_secs(4);
    std::thread::sleep(past_first.saturating_sub(created.elapsed()));
    assert!(
        extended_at.elapsed() < extended,
        "the machine is too slow for this test's timing"
    );
    assert_eq!(
        supervisors(&id).len(),
        1,
        "{id} was ended at its first deadline despite the extension"
    );
    assert!(
        !sandbox_processes(&id).is_empty(),
        "{id} lost its processes"
    );

    // And gone after the new one.
    assert!(
        gone_by(&id, extended_at, extended + GRACE + SLACK),
        "{id} still runs {:?} after its extended {extended:?} timeout, with no daemon",
        extended_at.elapsed(),
    );
    assert_sandbox_gone(&id);
}

#[test]
fn a_supervisor_that_does_not_answer_at_the_daemon_start_is_adopted_once_it_does() {
    let _serial = serial();
    let cleanup = Cleanup::default();
    let mut daemon = TestDaemon::start(&[]);
    let (id, _) = sandbox(&daemon, &cleanup, 600);
    let supervisor = supervisors(&id)[0];

    daemon.kill9();
    signal(supervisor, libc::SIGSTOP);
    // The daemon starts while the supervisor cannot answer: its greeting
    // times out.
    daemon.restart();
    let v = view(&daemon, &id);
    // Meanwhile it is running but not reachable: a call says so, and when
    // to try again, rather than that it is not running.
    let waiting = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": "/bin/true"})),
    );
    signal(supervisor, libc::SIGCONT);
    assert_eq!(
        (waiting.status, waiting.json()["code"].clone()),
        (503, json!("sandbox_reconnecting")),
        "{}",
        waiting.text()
    );
    assert_eq!(
        v["state"],
        "running",
        "a sandbox whose supervisor did not answer was reaped: {v}\nlog:\n{}",
        daemon.log.lock().unwrap()
    );
    assert_eq!(supervisors(&id), [supervisor], "its supervisor was stopped");

    // Once it answers, it is adopted: the same supervisor serves it.
    let adopted = TestDaemon::wait_for(Duration::from_secs(60), || {
        let answer = daemon.call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": "/bin/sh", "args": ["-c", "echo back"]})),
        );
        answer.status == 200 && answer.text().contains("back")
    });
    assert!(
        adopted,
        "{id} was not adopted after its supervisor answered again\nlog:\n{}",
        daemon.log.lock().unwrap()
    );
    assert_eq!(supervisors(&id), [supervisor]);
    let answer = daemon.call(
        "GET",
        &format!("/v1/sandboxes/{id}/events?limit=1000"),
        None,
    );
    assert!(
        answer.text().contains("sandbox.adopted"),
        "no sandbox.adopted event: {}",
        answer.text()
    );
    let metrics = daemon.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_leaked_resources 0"),
        "leaks after the late adoption:\n{metrics}"
    );
    let answer = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(answer.status, 204, "delete: {}", answer.text());
    assert_sandbox_gone(&id);
}
