//! Schemathesis against a real `airlock serve`: requests generated from
//! `/v1/openapi.json` (valid and invalid) must never get a 5xx.
//!
//! Two runs, each with a fixed seed so CI is reproducible (set
//! `AIRLOCK_SCHEMATHESIS_SEED` to explore others, `AIRLOCK_SCHEMATHESIS_EXAMPLES`
//! for more cases per operation):
//!
//! 1. Every operation and phase (including stateful sequences that create
//!    sandboxes and use their ids), with generated parameters.
//! 2. The operations on one sandbox, aimed at a live one: its id, its
//!    processes, and paths and commands that exist inside it, so the calls
//!    reach the agent instead of stopping at 404 or 400.
//!
//! Schemathesis is installed by `scripts/deps` in /opt/airlock/venv. Without
//! it this test fails; it never skips.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::TestDaemon;
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const ST: &str = "/opt/airlock/venv/bin/st";
const DEFAULT_SEED: &str = "20261130";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// Runs `st [config] run …` against `daemon` with only the
/// `not_a_server_error` check; panics with its output unless it passes.
fn schemathesis(
    daemon: &TestDaemon,
    name: &str,
    examples: u32,
    config: Option<&Path>,
    extra: &[&str],
) {
    assert!(
        Path::new(ST).exists(),
        "schemathesis is not installed at {ST}: run scripts/deps as root"
    );
    let work = tempfile::tempdir().unwrap();
    let mut command = Command::new(ST);
    command.arg("--no-color");
    if let Some(config) = config {
        command.arg("--config-file").arg(config);
    }
    let seed = env_or("AIRLOCK_SCHEMATHESIS_SEED", DEFAULT_SEED);
    let examples = env_or("AIRLOCK_SCHEMATHESIS_EXAMPLES", &examples.to_string());
    command
        .arg("run")
        .arg(format!("{}/v1/openapi.json", daemon.url))
        .args(["--url", &daemon.url])
        .args(["--checks", "not_a_server_error"])
        .args(["--header", &format!("X-API-Key: {}", daemon.key)])
        .args(["--max-examples", &examples])
        .args(["--seed", &seed])
        .args(["--request-timeout", "30"])
        .args(["--workers", "1"])
        .arg("--continue-on-failure")
        .args(extra)
        // Its cache and reports go to a scratch directory.
        .current_dir(work.path())
        .env("NO_COLOR", "1")
        .env_remove("SCHEMATHESIS_HOOKS")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy");
    let started = Instant::now();
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {ST} ({e}): run scripts/deps as root"));
    eprintln!(
        "schemathesis run `{name}` (seed {seed}, {examples} examples): {:?} in {:.1?}",
        out.status.code(),
        started.elapsed()
    );
    assert!(
        out.status.success(),
        "schemathesis run `{name}` failed (exit {:?}); reproduce with AIRLOCK_SCHEMATHESIS_SEED={seed}\n\
         --- stdout\n{}\n--- stderr\n{}\n--- daemon log\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        daemon.log.lock().unwrap()
    );
}

/// A TOML string literal.
fn toml(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

#[test]
fn generated_requests_never_get_a_server_error() {
    // Few live sandboxes: generated creates hit the cap (a 429) instead of
    // filling the machine.
    let daemon = TestDaemon::start(&["--max-live", "8", "--default-timeout", "120s"]);

    // 1. Everything, with generated parameters, but the streams that never
    // end on their own (a watch, the output of a process that keeps
    // running) and the bootstrap of a Debian system (minutes of mmdebstrap
    // for each valid body; tests/base.rs covers its input checks), and a
    // pause, whose 501 from a tier that cannot pause is its documented
    // answer (tests/tiers.rs covers its input checks).
    schemathesis(
        &daemon,
        "all operations",
        30,
        None,
        &[
            "--exclude-path-regex",
            "/(files/watch|output|bootstrap|pause)$",
        ],
    );
    daemon.delete_all();

    // 2. The operations on one live sandbox.
    let sandbox = daemon.create(json!({"timeout_s": 3600}));
    let id = sandbox["id"].as_str().unwrap().to_owned();
    let exited = daemon.sh(
        &id,
        "mkdir -p /tmp/st/a && echo hi > /tmp/st/a/file && ln -s loop /tmp/st/loop && echo done",
    );
    let exited_pid = exited[0]["pid"].as_u64().expect("a started event");
    let answer = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": "sleep", "args": ["600"], "background": true, "stdin": true})),
    );
    assert_eq!(answer.status, 201, "{}", answer.text());
    let running_pid = answer.json()["pid"].as_u64().unwrap();

    let list = |values: &[&str]| {
        let quoted: Vec<String> = values.iter().map(|v| toml(v)).collect();
        format!("[{}]", quoted.join(", "))
    };
    // Values worth trying, including the awkward ones: mount points, a
    // symlink loop, a name over NAME_MAX, files whose reads fail.
    let long_name = format!("/tmp/{}", "n".repeat(300));
    let paths = [
        "/",
        "/tmp",
        "/tmp/st",
        "/tmp/st/a",
        "/tmp/st/a/file",
        "/tmp/st/new",
        "/home/user",
        "/home/user/x",
        "/mnt/user-data/workspace",
        "/mnt/user-data/outputs/out",
        "/etc/passwd",
        "/etc",
        "/usr/bin",
        "/proc/self/status",
        "/dev/null",
        "/tmp/../etc/passwd",
        "/tmp/st/../st2",
        "/tmp/st/loop",
        "/tmp/st/loop/x",
        "/proc/self/mem",
        "/etc/passwd/x",
        &long_name,
    ];
    // Commands that end on their own whatever their arguments and stdin.
    let cmds = [
        "echo",
        "true",
        "false",
        "ls",
        "id",
        "pwd",
        "/tmp",
        "/nonexistent",
        "/etc/passwd",
        "/etc/passwd/x",
        "/tmp/st/loop",
        &long_name,
    ];
    let config = format!(
        r#"
[dictionaries.ids]
values = [{id}]
[dictionaries.pids]
values = [{exited}, {running}, "1"]
[dictionaries.paths]
values = {paths}
[dictionaries.cmds]
values = {cmds}

[parameters]
"path.id" = {{ dictionary = "ids", probability = 0.9 }}
"path.pid" = {{ dictionary = "pids", probability = 0.8 }}
"query.path" = {{ dictionary = "paths", probability = 0.7 }}
"body.path" = {{ dictionary = "paths", probability = 0.7 }}
"body.from" = {{ dictionary = "paths", probability = 0.7 }}
"body.to" = {{ dictionary = "paths", probability = 0.7 }}
"body.cmd" = {{ dictionary = "cmds", probability = 0.7 }}

# Not here: calls that would end the sandbox (run 1 has them), and streams
# that last as long as the client stays (a watch; the output of `sleep`).
[[operations]]
include-name = [
  "DELETE /v1/sandboxes/{{id}}",
  "POST /v1/sandboxes/{{id}}/timeout",
  "GET /v1/sandboxes/{{id}}/files/watch",
  "GET /v1/sandboxes/{{id}}/processes/{{pid}}/output",
]
enabled = false
"#,
        id = toml(&id),
        exited = toml(&exited_pid.to_string()),
        running = toml(&running_pid.to_string()),
        paths = list(&paths),
        cmds = list(&cmds),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("schemathesis.toml");
    std::fs::write(&path, config).unwrap();
    schemathesis(
        &daemon,
        "one live sandbox",
        60,
        Some(&path),
        &[
            "--phases",
            "coverage,fuzzing",
            "--include-path-regex",
            "^/v1/sandboxes/\\{id\\}",
            // It must stay running, and pauses are its tier's (see above).
            "--exclude-path-regex",
            "/pause$",
        ],
    );

    // The sandbox it was all aimed at is still there and working.
    let view = daemon
        .call("GET", &format!("/v1/sandboxes/{id}"), None)
        .json();
    assert_eq!(view["state"], "running", "{view}");
    // (From `/`: generated deletes may have removed the home directory.)
    let answer = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": "echo", "args": ["alive"], "cwd": "/"})),
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let events = answer.lines();
    assert!(
        events.iter().any(|e| e["data"] == "alive\n")
            && events
                .iter()
                .any(|e| e["type"] == "exited" && e["exit_code"] == 0),
        "{events:?}"
    );
    let metrics = daemon.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_leaked_resources 0"),
        "leaks after schemathesis:\n{metrics}"
    );
}
