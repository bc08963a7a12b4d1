//! The AIO dialect against a real `airlock serve`: DeerFlow's provisioner
//! and AIO sandbox calls, replayed by the pytest suite in `tests/aio/` with
//! the unmodified `agent-sandbox` client (what DeerFlow's AioSandbox
//! drives) and `requests` (what its provisioner backend sends).
//!
//! The suite runs against one daemon started with `--deerflow-base-dir`
//! on a fresh directory, which it reads as `AIRLOCK_DEERFLOW_BASE`; the
//! daemon's URL and key are `AIRLOCK_URL` and `AIRLOCK_API_KEY`, and
//! `AIRLOCK_OTHER_API_KEY` is a second key, not an admin's. The sandboxes
//! run on `AIRLOCK_TEST_TIER`'s tier (the daemon's default).
//!
//! The client is installed by `scripts/deps` (a venv in /opt/airlock/aio).
//! Without it this test fails; it never skips. `AIRLOCK_AIO_PYTEST_ARGS`
//! replaces pytest's arguments (`-x -q`), e.g. `-q -rA -k grep`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{serial, TestDaemon};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const VENV: &str = "/opt/airlock/aio";

/// Arguments of the pytest run: stop at the first failure, quietly.
const PYTEST_ARGS: &[&str] = &["-x", "-q"];

fn repo_dir() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../..")
}

/// The venv's pytest; a failure telling how to install it if it is not
/// there.
fn pytest() -> std::path::PathBuf {
    let pytest = Path::new(VENV).join("bin/pytest");
    assert!(
        pytest.exists(),
        "the AIO client (agent-sandbox) is not installed at {VENV}: run ./scripts/deps as root"
    );
    pytest
}

#[test]
fn deerflow_calls_replayed_with_the_aio_client() {
    let _serial = serial();
    let pytest = pytest();
    let base = tempfile::tempdir().unwrap();
    let base_dir = base.path().to_str().unwrap();
    let daemon = TestDaemon::start(&["--deerflow-base-dir", base_dir]);
    let other = daemon.new_key("aio-other");
    let mut command = Command::new(pytest);
    match std::env::var("AIRLOCK_AIO_PYTEST_ARGS") {
        Ok(args) if !args.trim().is_empty() => command.args(args.split_whitespace()),
        _ => command.args(PYTEST_ARGS),
    };
    command
        .args(["-p", "no:cacheprovider", "--color=no", "tests/aio"])
        .current_dir(repo_dir())
        .env("AIRLOCK_URL", &daemon.url)
        .env("AIRLOCK_API_KEY", &daemon.key)
        .env("AIRLOCK_OTHER_API_KEY", other["key"].as_str().unwrap())
        .env("AIRLOCK_DEERFLOW_BASE", base_dir);
    common::client_env(&mut command);
    let started = Instant::now();
    let out = command.output().expect("pytest runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "pytest tests/aio (tier {}): exit {:?} in {:.1?}\n{stdout}{stderr}",
        common::test_tier(),
        out.status.code(),
        started.elapsed()
    );
    assert!(
        out.status.success(),
        "pytest tests/aio failed (exit {:?})\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- daemon log\n{}",
        out.status.code(),
        daemon.log.lock().unwrap()
    );
    // Every test deletes what it created through the provisioner: no
    // sandbox may be left running behind it.
    let listed = daemon.call("GET", "/v1/sandboxes?limit=1000", None);
    assert_eq!(listed.status, 200, "{}", listed.text());
    let left: Vec<Value> = listed.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["state"] != "dead")
        .cloned()
        .collect();
    assert!(
        left.is_empty(),
        "sandboxes deleted through the provisioner are still there: {left:?}"
    );
}

/// Without `--deerflow-base-dir` there is nothing an extra mount could
/// come from: any is refused, and a sandbox without one works.
#[test]
fn without_a_base_dir_extra_mounts_are_refused() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    let mounts = |host_path: &str| {
        json!({
            "sandbox_id": "nobase1",
            "thread_id": "thread-1",
            "extra_mounts": [{
                "host_path": host_path,
                "container_path": "/mnt/skills/custom",
                "read_only": true,
            }],
        })
    };
    let dir = tempfile::tempdir().unwrap();
    for host_path in [dir.path().to_str().unwrap(), "/"] {
        let refused = daemon.call("POST", "/api/sandboxes", Some(mounts(host_path)));
        assert_eq!(refused.status, 400, "{host_path}: {}", refused.text());
        let got = daemon.call("GET", "/api/sandboxes/nobase1", None);
        assert_eq!(got.status, 404, "{}", got.text());
    }
    let created = daemon.call(
        "POST",
        "/api/sandboxes",
        Some(json!({"sandbox_id": "nobase1", "thread_id": "thread-1"})),
    );
    assert_eq!(created.status, 200, "{}", created.text());
    let created = created.json();
    assert_eq!(created["status"], "Running", "{created}");
    let url = created["sandbox_url"].as_str().unwrap();
    // The AIO API answers under the URL, as the client calls it.
    let mut response = common::daemon::agent()
        .post(format!("{url}/v1/shell/exec"))
        .header("Content-Type", "application/json")
        .send(json!({"command": "echo hi", "no_change_timeout": 600}).to_string())
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = serde_json::from_slice(&response.body_mut().read_to_vec().unwrap()).unwrap();
    assert_eq!(body["data"]["status"], "completed", "{body}");
    assert_eq!(
        body["data"]["output"].as_str().unwrap().trim(),
        "hi",
        "{body}"
    );
    let deleted = daemon.call("DELETE", "/api/sandboxes/nobase1", None);
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    assert_eq!(deleted.json(), json!({"ok": true, "sandbox_id": "nobase1"}));
}

/// `--deerflow-template` names what DeerFlow's sandboxes start from: one
/// the daemon does not have is refused (and nothing is made); the default
/// is `host`.
#[test]
fn deerflow_sandboxes_start_from_the_operators_template() {
    let _serial = serial();
    let daemon = TestDaemon::start(&["--deerflow-template", "no-such-template"]);
    let refused = daemon.call(
        "POST",
        "/api/sandboxes",
        Some(json!({"sandbox_id": "tmpl1", "thread_id": "thread-1"})),
    );
    assert_eq!(refused.status, 404, "{}", refused.text());
    assert!(
        refused.text().contains("no-such-template"),
        "{}",
        refused.text()
    );
    let got = daemon.call("GET", "/api/sandboxes/tmpl1", None);
    assert_eq!(got.status, 404, "{}", got.text());
    let default = TestDaemon::start(&[]);
    let created = default.call(
        "POST",
        "/api/sandboxes",
        Some(json!({"sandbox_id": "tmpl1", "thread_id": "thread-1"})),
    );
    assert_eq!(created.status, 200, "{}", created.text());
    let listed = default.call(
        "GET",
        "/v1/sandboxes?metadata=deerflow.sandbox_id%3Dtmpl1",
        None,
    );
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert_eq!(
        listed.json()["items"][0]["template"],
        "host",
        "{}",
        listed.text()
    );
    let deleted = default.call("DELETE", "/api/sandboxes/tmpl1", None);
    assert_eq!(deleted.status, 200, "{}", deleted.text());
}
