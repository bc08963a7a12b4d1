//! Shared helpers for tests that run the real `airlock` binary.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod base;
pub mod daemon;
pub mod images;
pub mod net;
pub mod registry;
pub mod store;

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// First host uid of sandbox ranges (see airlock_jail::runtime::UID_BASE).
pub const UID_BASE: u32 = 1_000_000_000;

/// These tests create user namespaces with uid ranges and cgroups: they need
/// root. They fail loudly instead of skipping, so CI can never pass them
/// vacuously.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the sandbox tests need root (user namespaces with uid ranges, cgroups); run them as root, as CI does"
    );
}

pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_airlock"))
}

/// `airlock run ARGS` with stdin from /dev/null.
pub fn run(args: &[&str]) -> Output {
    run_with_stdin(args, None)
}

/// The tier the suites run on: `AIRLOCK_TEST_TIER` (scripts/test runs the
/// hostile suite once per tier), `process` by default. A tier this host
/// cannot run fails the test with its probe's reason.
pub fn test_tier() -> String {
    std::env::var("AIRLOCK_TEST_TIER").unwrap_or_else(|_| "process".into())
}

/// Whether this run of the suite is on the gvisor tier (scripts/test runs
/// the suites once per tier): the sandbox's kernel is gVisor's, so a check
/// of the host kernel's answer becomes a check of gVisor's where they
/// differ.
pub fn on_gvisor() -> bool {
    test_tier() == "gvisor"
}

/// `airlock run ARGS` feeding `stdin`.
/// With `AIRLOCK_TEST_TEMPLATE=base` (scripts/test sets it for a second
/// run of the hostile suite), a run that names no template runs on the
/// `base` template's root filesystem instead of the host's; with
/// `AIRLOCK_TEST_TIER`, a run that names no tier runs on that tier.
pub fn run_with_stdin(args: &[&str], stdin: Option<&[u8]>) -> Output {
    require_root();
    let mut command = Command::new(binary());
    command.arg("run");
    if !args.contains(&"--tier") {
        command.arg("--tier").arg(test_tier());
    }
    if std::env::var("AIRLOCK_TEST_TEMPLATE").as_deref() == Ok("base")
        && !args.contains(&"--template")
    {
        command.arg("--template").arg(base::base_rootfs());
    }
    let mut child = command
        .args(args)
        .env("AIRLOCK_TEST_HOST_SECRET", "host-secret-value")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("airlock binary runs");
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        let bytes = bytes.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        });
    }
    child.wait_with_output().unwrap()
}

/// The result of `airlock run --json [opts] -- sh -c SCRIPT`, after checking
/// that the sandbox left nothing behind.
pub fn sh_json(opts: &[&str], script: &str) -> Value {
    run_json(opts, &["/bin/sh", "-c", script])
}

/// The result of `airlock run --json [opts] -- python3 -c SCRIPT` (no shell
/// quoting in between), after checking that the sandbox left nothing
/// behind.
pub fn py_json(opts: &[&str], script: &str) -> Value {
    run_json(opts, &["python3", "-c", script])
}

/// The result of `airlock run --json [opts] -- COMMAND...`, after checking
/// that the sandbox left nothing behind.
pub fn run_json(opts: &[&str], command: &[&str]) -> Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(opts);
    args.push("--");
    args.extend_from_slice(command);
    let out = run(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    let value: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON result ({e}); exit {:?}\nstdout: {text}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(
        out.status.code(),
        value["exit_code"].as_i64().map(|c| (c & 0xff) as i32),
        "the CLI exits with the command's code"
    );
    assert_no_leftovers(value["sandbox_id"].as_str().unwrap());
    value
}

pub fn stdout(value: &Value) -> &str {
    value["stdout"].as_str().unwrap()
}

pub fn exit_code(value: &Value) -> i64 {
    value["exit_code"].as_i64().unwrap()
}

/// Asserts that sandbox `id` left no cgroup, no process, no mount and no
/// slot record on the host.
pub fn assert_no_leftovers(id: &str) {
    for controller in ["memory", "cpu", "cpuacct", "pids", "unified"] {
        let dir = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join("airlock")
            .join(id);
        assert!(
            !dir.exists(),
            "cgroup {} survived its sandbox",
            dir.display()
        );
    }
    let v2 = Path::new("/sys/fs/cgroup/airlock").join(id);
    assert!(!v2.exists(), "cgroup {} survived its sandbox", v2.display());
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cgroups) = std::fs::read_to_string(entry.path().join("cgroup")) else {
            continue;
        };
        assert!(
            !cgroups.contains(id),
            "process {} of sandbox {id} survived it",
            entry.file_name().to_string_lossy()
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(id) && !mounts.contains("/run/airlock/stage "),
        "a sandbox mount is visible on the host"
    );
    if let Ok(entries) = std::fs::read_dir("/run/airlock/slots") {
        for entry in entries.flatten() {
            let record = std::fs::read_to_string(entry.path()).unwrap_or_default();
            assert!(!record.contains(id), "slot record of {id} survived it");
        }
    }
}

/// Sets what a client test program (pytest, node) runs with against a
/// local daemon: no colour, unbuffered, nothing written beside the tests,
/// loopback never proxied; and takes away what of the host's environment
/// could reroute the clients or change what they import.
pub fn client_env(command: &mut std::process::Command) {
    command
        .env("NO_COLOR", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    for name in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "PYTHONPATH",
        "NODE_OPTIONS",
        "NODE_PATH",
    ] {
        command.env_remove(name);
    }
}
