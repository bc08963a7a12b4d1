//! Crash recovery of `airlock serve`: sandboxes outlive a daemon killed with
//! -9 and the restarted daemon adopts them; what cannot be adopted is
//! recorded dead with reason `daemon_restart`; what runs or lingers on the
//! host without a record is removed when a daemon starts.
//!
//! A starting daemon stops the unrecorded supervisors tagged with its
//! instance and sweeps orphan cgroups and slot records of any launcher, so
//! the tests of this file run one at a time (see [`serial`]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{
    assert_sandbox_gone, serial, supervisors, SupervisorCleanup as Cleanup, TestDaemon,
};
use common::{binary, require_root};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SANDBOXES: usize = 20;
const MARKER: &str = "/home/user/crash-marker";

/// What one sandbox had before the crash.
#[derive(Debug, Clone)]
struct Before {
    id: String,
    supervisor: u32,
    sleep_pid: u64,
    content: String,
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

/// The command line of host process `pid`.
fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Whether `sleep 600` runs in sandbox `id`, seen from the host.
fn sleep_runs_in(id: &str) -> bool {
    sandbox_processes(id)
        .into_iter()
        .any(|pid| cmdline(pid) == ["sleep", "600"])
}

/// Whether a supervisor socket of `id` exists (in any daemon's directory).
fn socket_exists(id: &str) -> bool {
    std::fs::read_dir("/run/airlock/sockets")
        .into_iter()
        .flatten()
        .flatten()
        .any(|dir| dir.path().join(format!("{id}.sock")).exists())
}

/// The kinds of the audit events of `id`.
fn event_kinds(daemon: &TestDaemon, id: &str) -> Vec<String> {
    let answer = daemon.call(
        "GET",
        &format!("/v1/sandboxes/{id}/events?limit=1000"),
        None,
    );
    assert_eq!(answer.status, 200, "events of {id}: {}", answer.text());
    answer.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn view(daemon: &TestDaemon, id: &str) -> Value {
    let answer = daemon.call("GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(answer.status, 200, "get {id}: {}", answer.text());
    answer.json()
}

fn delete(daemon: &TestDaemon, id: &str) {
    let answer = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(answer.status, 204, "delete {id}: {}", answer.text());
}

/// The ids listed as running.
fn running_ids(daemon: &TestDaemon) -> Vec<String> {
    let answer = daemon.call("GET", "/v1/sandboxes?state=running&limit=1000", None);
    assert_eq!(answer.status, 200, "list: {}", answer.text());
    answer.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Creates a sandbox, starts `sleep 600` in the background and writes the
/// marker file through the files API.
fn prepare(daemon: &TestDaemon, cleanup: &Cleanup) -> Before {
    let created = daemon.create(json!({"timeout_s": 600}));
    let id = created["id"].as_str().unwrap().to_owned();
    cleanup.add(&id);
    assert_eq!(created["state"], "running", "{created}");
    let answer = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": "sleep", "args": ["600"], "background": true})),
    );
    assert_eq!(answer.status, 201, "background exec: {}", answer.text());
    let sleep_pid = answer.json()["pid"].as_u64().unwrap();
    let content = format!("written in {id} before the crash\n");
    let answer = daemon.call_as(
        Some(&daemon.key),
        "PUT",
        &format!("/v1/sandboxes/{id}/files?path={MARKER}"),
        Some(content.as_bytes()),
        Some("application/octet-stream"),
        &[],
    );
    assert_eq!(answer.status, 201, "write: {}", answer.text());
    let pids = supervisors(&id);
    assert_eq!(pids.len(), 1, "one supervisor for {id}: {pids:?}");
    Before {
        id,
        supervisor: pids[0],
        sleep_pid,
        content,
    }
}

/// Runs `f` for every item on its own thread and collects the results.
fn parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = items.iter().map(|i| scope.spawn(|| f(i))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn sandboxes_survive_a_daemon_killed_with_sigkill_and_are_adopted() {
    let _serial = serial();
    let cleanup = Cleanup::default();
    let mut daemon = TestDaemon::start(&[]);
    let before: Vec<Before> = parallel(&[(); SANDBOXES], |_| prepare(&daemon, &cleanup));
    for b in &before {
        assert!(sleep_runs_in(&b.id), "sleep 600 does not run in {}", b.id);
    }

    daemon.kill9();

    // The documented outcome: nothing of the sandboxes dies with the daemon.
    std::thread::sleep(Duration::from_millis(300));
    for b in &before {
        assert_eq!(
            supervisors(&b.id),
            [b.supervisor],
            "the supervisor of {} did not survive the daemon",
            b.id
        );
        assert!(
            sleep_runs_in(&b.id),
            "the sandbox {} lost its process with the daemon",
            b.id
        );
        assert!(socket_exists(&b.id), "the socket of {} is gone", b.id);
    }

    daemon.restart();

    let running = running_ids(&daemon);
    for b in &before {
        assert!(
            running.contains(&b.id),
            "{} is not listed as running after the restart: {running:?}\nlog:\n{}",
            b.id,
            daemon.log.lock().unwrap()
        );
        // Adopted, not re-created: the very same supervisor.
        assert_eq!(supervisors(&b.id), [b.supervisor], "supervisor of {}", b.id);
    }
    parallel(&before, |b| {
        let (out, code) = daemon.sh_out(&b.id, &format!("cat {MARKER}"));
        assert_eq!(code, 0, "exec in {} after the restart", b.id);
        assert_eq!(out, b.content, "the file of {} changed", b.id);

        let answer = daemon.call("GET", &format!("/v1/sandboxes/{}/processes", b.id), None);
        assert_eq!(answer.status, 200, "processes: {}", answer.text());
        let processes = answer.json()["processes"].as_array().unwrap().clone();
        let sleep = processes
            .iter()
            .find(|p| p["pid"].as_u64() == Some(b.sleep_pid))
            .unwrap_or_else(|| {
                panic!(
                    "the sleep started before the crash is not listed in {}: {processes:?}",
                    b.id
                )
            });
        assert_eq!(sleep["cmd"], "sleep", "{sleep}");
        assert_eq!(sleep["args"], json!(["600"]), "{sleep}");
        assert_eq!(sleep["running"], true, "{sleep}");

        let kinds = event_kinds(&daemon, &b.id);
        assert!(
            kinds.iter().any(|k| k == "sandbox.adopted"),
            "no sandbox.adopted event for {}: {kinds:?}",
            b.id
        );
    });
    let metrics = daemon.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_leaked_resources 0"),
        "leaks after adoption:\n{metrics}"
    );

    parallel(&before, |b| delete(&daemon, &b.id));
    for b in &before {
        let v = view(&daemon, &b.id);
        assert_eq!(v["state"], "dead", "{v}");
        assert_eq!(v["reason"], "deleted", "{v}");
        assert_sandbox_gone(&b.id);
        assert!(
            !cmdline(b.supervisor).contains(&"supervise".to_owned()),
            "supervisor {} of {} still runs",
            b.supervisor,
            b.id
        );
    }
    assert!(
        running_ids(&daemon).is_empty(),
        "sandboxes left running after the deletes"
    );
}

#[test]
fn a_sandbox_whose_supervisor_died_while_the_daemon_was_down_is_recorded_dead() {
    let _serial = serial();
    let cleanup = Cleanup::default();
    let mut daemon = TestDaemon::start(&[]);
    let survivor = prepare(&daemon, &cleanup);
    let victim = prepare(&daemon, &cleanup);

    daemon.kill9();
    // SAFETY: kill(2) with a pid we just read from /proc and checked is the
    // victim's supervisor; at worst the call fails.
    let killed = unsafe { libc::kill(victim.supervisor as i32, libc::SIGKILL) };
    assert_eq!(killed, 0, "kill -9 of the supervisor");
    assert!(
        TestDaemon::wait_for(Duration::from_secs(10), || {
            supervisors(&victim.id).is_empty() && sandbox_processes(&victim.id).is_empty()
        }),
        "the sandbox {} did not die with its supervisor",
        victim.id
    );

    daemon.restart();

    let v = view(&daemon, &victim.id);
    assert_eq!(v["state"], "dead", "{v}");
    assert_eq!(v["reason"], "daemon_restart", "{v}");
    let kinds = event_kinds(&daemon, &victim.id);
    assert!(
        kinds.iter().any(|k| k == "sandbox.reaped"),
        "no sandbox.reaped event: {kinds:?}"
    );
    assert_sandbox_gone(&victim.id);
    let answer = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{}/exec", victim.id),
        Some(json!({"cmd": "true"})),
    );
    assert_eq!(
        answer.status,
        409,
        "exec in a dead sandbox: {}",
        answer.text()
    );
    assert_eq!(answer.code(), "sandbox_not_running");

    // The other one was adopted meanwhile.
    let v = view(&daemon, &survivor.id);
    assert_eq!(v["state"], "running", "{v}");
    let (out, code) = daemon.sh_out(&survivor.id, &format!("cat {MARKER}"));
    assert_eq!((out.as_str(), code), (survivor.content.as_str(), 0));

    let metrics = daemon.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_leaked_resources 0"),
        "leaks after the restart:\n{metrics}"
    );
    delete(&daemon, &survivor.id);
    assert_sandbox_gone(&survivor.id);
}

/// A sandbox id nobody records: `sbx-` and 16 hex digits.
fn unrecorded_id(salt: u32) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("sbx-{:08x}{:08x}", std::process::id() ^ salt, nanos)
}

/// `airlock supervise` of `id` for the daemon tagged `owner`, started by
/// hand as that daemon would, with an empty spec.
fn supervise_by_hand(id: &str, owner: &str) -> Child {
    let socket = format!("/run/airlock/sockets/{owner}/{id}.sock");
    let mut child = Command::new(binary())
        .args([
            "supervise",
            "--id",
            id,
            "--socket",
            &socket,
            "--owner",
            owner,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"{}").unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let answer: Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("supervisor answered {line:?}: {e}"));
    assert_eq!(answer["ready"]["id"], id, "{answer}");
    assert!(has_processes(id), "the sandbox {id} does not run");
    child
}

/// Whether sandbox `id` has a live process (its init, at least).
fn has_processes(id: &str) -> bool {
    TestDaemon::wait_for(Duration::from_secs(5), || !sandbox_processes(id).is_empty())
}

/// Whether our child has exited, waiting at most `limit`.
fn exits_within(child: &mut Child, limit: Duration) -> bool {
    TestDaemon::wait_for(limit, || child.try_wait().unwrap().is_some())
}

/// Stops a supervisor we started (SIGTERM: it tears its sandbox down).
fn stop(mut child: Child) {
    // SAFETY: kill(2) on our own unreaped child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    if !exits_within(&mut child, Duration::from_secs(15)) {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// An empty sandbox cgroup nobody owns, in the first hierarchy found.
fn orphan_cgroup(id: &str) -> PathBuf {
    let parent = ["/sys/fs/cgroup/pids/airlock", "/sys/fs/cgroup/airlock"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_dir())
        .expect("no airlock cgroup hierarchy: no sandbox ran on this host yet?");
    let dir = parent.join(id);
    std::fs::create_dir(&dir).unwrap();
    dir
}

#[test]
fn unrecorded_supervisors_and_leftovers_are_removed_when_a_daemon_starts() {
    require_root();
    let _serial = serial();
    let cleanup = Cleanup::default();
    let mut daemon = TestDaemon::start(&[]);
    let owner = std::fs::read_to_string(daemon.data_dir().join("instance"))
        .expect("the daemon tags its sandboxes (<data-dir>/instance)")
        .trim()
        .to_owned();
    daemon.kill9();

    // A real sandbox of this daemon that its store does not know (as if it
    // was started as the daemon died, before its record was written).
    let stray = unrecorded_id(0x5a5a);
    cleanup.add(&stray);
    let supervisor = supervise_by_hand(&stray, &owner);
    // A sandbox of another daemon: not this daemon's business.
    let foreign = unrecorded_id(0x3c3c);
    cleanup.add(&foreign);
    let foreign_supervisor = supervise_by_hand(&foreign, "0123456789abcdef");
    // What a dead launcher may leave: a socket and an empty cgroup.
    let leftover = unrecorded_id(0xa5a5);
    let socket = PathBuf::from(format!("/run/airlock/sockets/{owner}/{leftover}.sock"));
    std::fs::write(&socket, b"").unwrap();
    let cgroup = orphan_cgroup(&leftover);

    daemon.restart();

    let mut supervisor = supervisor;
    let stopped = exits_within(&mut supervisor, Duration::from_secs(15));
    let foreign_alive = supervisors(&foreign).len() == 1 && !sandbox_processes(&foreign).is_empty();
    if !stopped {
        stop(supervisor);
    }
    stop(foreign_supervisor);
    let _ = std::fs::remove_dir("/run/airlock/sockets/0123456789abcdef");
    assert!(
        stopped,
        "the unrecorded supervisor of {stray} still runs after a daemon start"
    );
    assert!(
        foreign_alive,
        "a daemon start stopped the sandbox {foreign} of another daemon"
    );
    assert_sandbox_gone(&stray);
    assert_sandbox_gone(&foreign);
    assert!(
        !socket.exists(),
        "the leftover socket {} is left",
        socket.display()
    );
    assert!(
        !cgroup.exists(),
        "the orphan cgroup {} is left",
        cgroup.display()
    );

    // None of them is the daemon's: not found, not leaked.
    for id in [&stray, &leftover] {
        let answer = daemon.call("GET", &format!("/v1/sandboxes/{id}"), None);
        assert_eq!(answer.status, 404, "{id}: {}", answer.text());
    }
    let metrics = daemon.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_leaked_resources 0"),
        "leaks after the start:\n{metrics}"
    );
    // And the daemon works.
    let created = daemon.create(json!({}));
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(daemon.sh_out(&id, "echo ok"), ("ok\n".to_owned(), 0));
    delete(&daemon, &id);
    assert_sandbox_gone(&id);
}

#[test]
fn a_second_daemon_on_a_live_ones_data_directory_is_refused_and_the_first_serves_on() {
    let daemon = TestDaemon::start(&[]);
    let output = Command::new(binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(daemon.data_dir())
        .env("AIRLOCK_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("another airlock daemon is using"),
        "{stderr}"
    );
    assert_eq!(daemon.call("GET", "/v1/sandboxes", None).status, 200);
}
