//! The CLI client commands against a real daemon.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{assert_sandbox_gone, TestDaemon};
use std::io::Write;
use std::process::{Command, Output, Stdio};

fn cli(daemon: &TestDaemon, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(args)
        .env("AIRLOCK_URL", &daemon.url)
        .env("AIRLOCK_API_KEY", &daemon.key)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(bytes) = stdin {
        child.stdin.take().unwrap().write_all(bytes).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn create_exec_copy_list_and_kill_through_the_cli() {
    let daemon = TestDaemon::start(&[]);
    let created = cli(
        &daemon,
        &["create", "--memory", "128M", "--meta", "owner=cli"],
        None,
    );
    assert!(created.status.success(), "{}", text(&created.stderr));
    let id = text(&created.stdout).trim().to_owned();
    assert!(id.starts_with("sbx-"), "{id}");

    let exec = cli(
        &daemon,
        &[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
        None,
    );
    assert_eq!(exec.status.code(), Some(3));
    assert_eq!(text(&exec.stdout), "out\n");
    assert_eq!(text(&exec.stderr), "err\n");
    let piped = cli(&daemon, &["exec", &id, "--", "wc", "-c"], Some(b"12345"));
    assert_eq!(text(&piped.stdout).trim(), "5");

    let up = cli(
        &daemon,
        &["cp", "-", &format!("{id}:/home/user/in.txt")],
        Some(b"payload\n"),
    );
    assert!(up.status.success(), "{}", text(&up.stderr));
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("out.txt");
    let down = cli(
        &daemon,
        &[
            "cp",
            &format!("{id}:/home/user/in.txt"),
            local.to_str().unwrap(),
        ],
        None,
    );
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert_eq!(std::fs::read_to_string(&local).unwrap(), "payload\n");
    let listing = cli(&daemon, &["files", &id, "ls", "/home/user"], None);
    assert!(
        text(&listing.stdout).contains("/home/user/in.txt"),
        "{}",
        text(&listing.stdout)
    );

    let ls = cli(&daemon, &["ls", "--json", "--meta", "owner=cli"], None);
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    assert_eq!(rows[0]["id"], id.as_str());

    let logs = cli(&daemon, &["logs", &id, "--json"], None);
    assert!(text(&logs.stdout).contains("exec.exited"));

    let killed = cli(&daemon, &["kill", &id], None);
    assert!(killed.status.success(), "{}", text(&killed.stderr));
    assert_sandbox_gone(&id);
    let gone = cli(&daemon, &["exec", &id, "--", "true"], None);
    assert_ne!(gone.status.code(), Some(0));
    assert!(
        text(&gone.stderr).contains("sandbox_not_running"),
        "{}",
        text(&gone.stderr)
    );

    let wrong_key = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(["ls"])
        .env("AIRLOCK_URL", &daemon.url)
        .env("AIRLOCK_API_KEY", "al_wrong")
        .output()
        .unwrap();
    assert_eq!(wrong_key.status.code(), Some(1));
    assert!(
        text(&wrong_key.stderr).contains("AIRLOCK_API_KEY"),
        "{}",
        text(&wrong_key.stderr)
    );
}
