//! Bad input: a clear one-line error, exit 2, nothing left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

fn snapshot() -> Vec<String> {
    let mut items = Vec::new();
    for controller in ["memory", "cpu", "cpuacct", "pids"] {
        if let Ok(entries) = std::fs::read_dir(format!("/sys/fs/cgroup/{controller}/airlock")) {
            items.extend(
                entries
                    .flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.path().display().to_string()),
            );
        }
    }
    if let Ok(entries) = std::fs::read_dir("/run/airlock/slots") {
        for entry in entries.flatten() {
            let record = std::fs::read_to_string(entry.path()).unwrap_or_default();
            if !record.is_empty() {
                items.push(record);
            }
        }
    }
    items.sort();
    items
}

fn assert_refused(args: &[&str], needle: &str) {
    let before = snapshot();
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "args {args:?}: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "one line, got: {stderr}"
    );
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    assert!(out.stdout.is_empty());
    assert_eq!(snapshot(), before, "bad input left something behind");
}

#[test]
fn missing_template_dir() {
    assert_refused(
        &["--template", "/nonexistent/rootfs", "--", "true"],
        "/nonexistent/rootfs",
    );
}

#[test]
fn zero_memory() {
    assert_refused(&["--memory", "0", "--", "true"], "memory");
}

#[test]
fn negative_cpus() {
    assert_refused(&["--cpus", "-1", "--", "true"], "-1");
}

#[test]
fn unknown_flag() {
    assert_refused(&["--frobnicate", "--", "true"], "--frobnicate");
}

#[test]
fn missing_mount_source() {
    assert_refused(
        &["--mount", "/nonexistent/src:/mnt/x", "--", "true"],
        "/nonexistent/src",
    );
}

#[test]
fn mount_over_a_reserved_path() {
    assert_refused(&["--mount", "/tmp:/proc", "--", "true"], "/proc");
}

#[test]
fn bad_env() {
    assert_refused(&["--env", "NOEQUALS", "--", "true"], "NOEQUALS");
}

#[test]
fn missing_command() {
    assert_refused(&["--memory", "64M"], "CMD");
}

/// `airlock keys` with no database at the data directory: a clear error
/// naming the directory and how to point at the daemon's, exit 1, and
/// nothing created (before, it made the directory and a database no daemon
/// reads, and printed a key that daemon would refuse).
#[test]
fn keys_refuse_to_create_a_state_directory() {
    let temp = tempfile::tempdir().unwrap();
    let missing = temp.path().join("not-there");
    let empty = temp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let keys = |args: &[&str], env_dir: Option<&std::path::Path>| {
        let mut command = std::process::Command::new(binary());
        command
            .arg("keys")
            .args(args)
            .env_remove("AIRLOCK_DATA_DIR");
        if let Some(dir) = env_dir {
            command.env("AIRLOCK_DATA_DIR", dir);
        }
        command.output().unwrap()
    };
    let missing_arg = missing.to_str().unwrap();
    for (args, env_dir, dir) in [
        (
            vec!["create", "ci", "--data-dir", missing_arg],
            None,
            &missing,
        ),
        (vec!["list", "--data-dir", missing_arg], None, &missing),
        (
            vec!["revoke", "key-000000000000", "--data-dir", missing_arg],
            None,
            &missing,
        ),
        (
            vec!["create", "ci", "--admin"],
            Some(empty.as_path()),
            &empty,
        ),
    ] {
        let out = keys(&args, env_dir);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "no key printed: {args:?}");
        assert!(
            stderr.contains(&dir.display().to_string())
                && stderr.contains("--data-dir")
                && stderr.contains("AIRLOCK_DATA_DIR"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!missing.exists(), "the directory was not created");
    assert_eq!(
        std::fs::read_dir(&empty).unwrap().count(),
        0,
        "nothing was created in an existing directory"
    );
}
