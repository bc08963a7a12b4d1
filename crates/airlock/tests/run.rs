//! `airlock run`: what a user gets, end to end, through the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;

#[test]
fn echo_streams_stdout_and_exits_zero() {
    let out = run(&["--", "echo", "hello"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn stderr_is_streamed_separately() {
    let out = run(&["--", "/bin/sh", "-c", "echo out; echo err >&2"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
}

#[test]
fn python_runs() {
    let value = sh_json(
        &[],
        "python3 -c 'import sys; print(sys.version_info[0] * 7)'",
    );
    assert_eq!(stdout(&value), "21\n");
    assert_eq!(exit_code(&value), 0);
}

#[test]
fn exit_codes_pass_through() {
    let value = sh_json(&[], "exit 3");
    assert_eq!(exit_code(&value), 3);
    assert_eq!(value["signal"], serde_json::Value::Null);
}

#[test]
fn death_by_signal_is_128_plus_n() {
    let value = sh_json(&[], "kill -TERM $$");
    assert_eq!(exit_code(&value), 143);
    assert_eq!(value["signal"], 15);
    assert_eq!(value["oom"], false);
}

#[test]
fn command_not_found_is_127() {
    let out = run(&["--", "no-such-command-anywhere"]);
    assert_eq!(out.status.code(), Some(127));
}

#[test]
fn stdin_is_passed_through() {
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
    let out = run_with_stdin(&["--", "cat"], Some(&data));
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stdout == data,
        "stdin came back changed ({} bytes)",
        out.stdout.len()
    );
}

#[test]
fn stdin_larger_than_the_agent_queue_reaches_a_slow_reader_whole() {
    // 40 MB into a command that starts reading only after a pause: the CLI
    // must wait for the agent's `done` per chunk, not overflow its 16 MiB
    // queue.
    let data = vec![b'x'; 40_000_000];
    let out = run_with_stdin(&["--", "/bin/sh", "-c", "sleep 0.3; wc -c"], Some(&data));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "40000000");
}

#[test]
fn large_output_streams_completely() {
    let out = run(&[
        "--",
        "/bin/sh",
        "-c",
        "head -c 5000000 /dev/zero | tr '\\0' a",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout.len(), 5_000_000);
    assert!(out.stdout.iter().all(|&b| b == b'a'));
}

#[test]
fn environment_is_not_inherited() {
    let value = sh_json(&["--env", "GREETING=hi there"], "env");
    let env = stdout(&value);
    assert!(
        !env.contains("AIRLOCK_TEST_HOST_SECRET"),
        "host env leaked: {env}"
    );
    assert!(env.contains("GREETING=hi there"));
    assert!(env.contains("HOME=/home/user"));
}

#[test]
fn default_identity_is_user_in_home() {
    let value = sh_json(&[], "id -u; id -g; pwd; whoami; hostname");
    let lines: Vec<&str> = stdout(&value).lines().collect();
    assert_eq!(&lines[..4], ["1000", "1000", "/home/user", "user"]);
    assert_eq!(lines[4], value["sandbox_id"].as_str().unwrap());
}

#[test]
fn cwd_option() {
    let value = sh_json(&["--cwd", "/tmp"], "pwd");
    assert_eq!(stdout(&value), "/tmp\n");
}

#[test]
fn root_is_root_only_inside() {
    let value = sh_json(&["--user", "root"], "id -u; cat /proc/self/uid_map");
    let text = stdout(&value);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("0"));
    let map: Vec<u64> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(map[0], 0);
    assert!(
        map[1] >= u64::from(UID_BASE),
        "root inside maps to host uid {}",
        map[1]
    );
    assert_eq!(map[2], 65536);
}

/// Tries to create a file and to append to one in /mnt/data; prints, for
/// each, `wrote` or the errno.
const WRITE_PROBE: &str = "python3 -c '
for path in (\"/mnt/data/new\", \"/mnt/data/input.txt\"):
    try:
        with open(path, \"a\") as f:
            f.write(\"from the sandbox\\n\")
        print(\"wrote\")
    except OSError as e:
        print(e.errno)
'";

#[test]
fn read_only_mount() {
    // The directory and its file are writable by anyone, so nothing but
    // the mount's `:ro` stands between the sandbox and them: the same
    // mount without it is written to (the control), with it every write
    // fails with EROFS, the read-only mount's own errno (file permissions
    // and Landlock answer EACCES).
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let input = dir.path().join("input.txt");
    std::fs::write(&input, "from host\n").unwrap();
    std::fs::set_permissions(&input, std::fs::Permissions::from_mode(0o666)).unwrap();
    for user in ["user", "root"] {
        let mount = format!("{}:/mnt/data", dir.path().display());
        let value = sh_json(&["--mount", &mount, "--user", user], WRITE_PROBE);
        assert_eq!(
            stdout(&value),
            "wrote\nwrote\n",
            "rw mount as {user}: {value}"
        );
        std::fs::remove_file(dir.path().join("new")).unwrap();
        std::fs::write(&input, "from host\n").unwrap();

        let mount = format!("{}:/mnt/data:ro", dir.path().display());
        let value = sh_json(
            &["--mount", &mount, "--user", user],
            &format!("cat /mnt/data/input.txt; {WRITE_PROBE}"),
        );
        assert_eq!(
            stdout(&value),
            format!("from host\n{EROFS}\n{EROFS}\n", EROFS = libc::EROFS),
            "ro mount as {user}: {value}"
        );
        assert!(!dir.path().join("new").exists());
        assert_eq!(std::fs::read_to_string(&input).unwrap(), "from host\n");
    }
}

#[test]
fn read_write_mount() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mount = format!("{}:/mnt/out", dir.path().display());
    let value = sh_json(
        &["--mount", &mount],
        "echo result > /mnt/out/answer.txt && echo ok",
    );
    assert_eq!(stdout(&value), "ok\n");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("answer.txt")).unwrap(),
        "result\n"
    );
}

#[test]
fn json_result_has_every_field() {
    let value = sh_json(&[], "true");
    for field in [
        "sandbox_id",
        "exit_code",
        "signal",
        "oom",
        "timed_out",
        "wall_time_ms",
        "cpu_time_ms",
        "peak_memory_bytes",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
    ] {
        assert!(value.get(field).is_some(), "missing {field} in {value}");
    }
}

#[test]
fn sandbox_layout_exists() {
    let value = sh_json(
        &[],
        "for d in /home/user /tmp /mnt/user-data/uploads /mnt/user-data/workspace /mnt/user-data/outputs \
         /mnt/skills/public /mnt/skills/custom; do test -d $d || echo missing $d; done; \
         touch /mnt/user-data/outputs/x /tmp/x /home/user/x && echo writable",
    );
    assert_eq!(stdout(&value), "writable\n");
}

#[test]
fn login_shell_starts() {
    let value = sh_json(&[], "bash -l -c 'echo $PATH'");
    assert!(stdout(&value).contains("/usr/bin"), "{value}");
}

#[test]
fn directory_template_with_busybox() {
    let busybox = std::path::Path::new("/bin/busybox");
    assert!(
        busybox.exists(),
        "the busybox-static package is needed for template tests (CI installs it)"
    );
    let template = tempfile::tempdir().unwrap();
    std::fs::set_permissions(template.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = template.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::copy(busybox, bin.join("busybox")).unwrap();
    for tool in ["sh", "echo", "cat", "ls", "id", "touch"] {
        std::os::unix::fs::symlink("busybox", bin.join(tool)).unwrap();
    }
    let path = template.path().to_str().unwrap();
    let value = sh_json(
        &["--template", path, "--user", "root"],
        "echo from-template; touch /newfile && echo root-writable; ls /bin/busybox",
    );
    assert_eq!(
        stdout(&value),
        "from-template\nroot-writable\n/bin/busybox\n",
        "{value}"
    );
    assert!(
        !template.path().join("newfile").exists(),
        "writes must go to the private upper layer"
    );
}

#[test]
fn concurrent_sandboxes_start_and_clean_up_independently() {
    // Launchers sweep each other's leftovers; none may take a live
    // sandbox's fresh cgroup for an orphan.
    let handles: Vec<_> = (0..24)
        .map(|i| {
            std::thread::spawn(move || {
                let value = sh_json(&[], &format!("echo sandbox-{i}; hostname"));
                let text = stdout(&value).to_owned();
                (i, text, value["sandbox_id"].as_str().unwrap().to_owned())
            })
        })
        .collect();
    let mut ids = Vec::new();
    for handle in handles {
        let (i, text, id) = handle.join().unwrap();
        assert_eq!(text, format!("sandbox-{i}\n{id}\n"));
        ids.push(id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 24, "sandbox ids must be unique");
}

#[test]
fn an_open_stdin_nobody_writes_does_not_hold_the_run() {
    // Like a terminal the command never reads: the run must end with the
    // command, not wait for an EOF that never comes.
    require_root();
    let mut child = std::process::Command::new(binary())
        .args(["run", "--", "true"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _held_open = child.stdin.take();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success());
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("airlock run waited for stdin after the command ended");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn signals_to_the_cli_reach_the_command() {
    require_root();
    let mut child = std::process::Command::new(binary())
        .args([
            "run",
            "--",
            "/bin/sh",
            "-c",
            "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(&mut stdout, &mut ready).unwrap();
    assert_eq!(&ready, b"ready\n");
    // SAFETY: kill(2) on our own, not yet reaped child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(rest, "got-term\n");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(7), "{status:?}");
}

#[test]
fn the_agent_is_its_own_small_binary() {
    // What runs inside a sandbox links the agent and the protocol, nothing
    // of the daemon: no HTTP server, no SQLite, no CLI parser.
    let agent = std::fs::read(env!("CARGO_BIN_EXE_airlock-agent")).unwrap();
    let airlock = std::fs::read(env!("CARGO_BIN_EXE_airlock")).unwrap();
    let has =
        |bytes: &[u8], needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
    for marker in [
        "sqlite3_prepare",
        "hyper::proto",
        "axum::routing",
        "clap_builder",
    ] {
        assert!(
            has(&airlock, marker),
            "{marker} is not a marker of the daemon binary"
        );
        assert!(!has(&agent, marker), "the agent binary links {marker}");
    }
    assert!(
        agent.len() * 3 < airlock.len(),
        "agent {} bytes, airlock {}",
        agent.len(),
        airlock.len()
    );
    let value = sh_json(&[], "tr '\\0' ' ' < /proc/1/cmdline");
    assert_eq!(stdout(&value), "airlock-agent --fd 3 ");
}

#[test]
fn a_missing_agent_binary_is_named() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_airlock"))
        .env("AIRLOCK_AGENT", "/nonexistent/airlock-agent")
        .args(["run", "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/airlock-agent") && stderr.contains("AIRLOCK_AGENT"),
        "{stderr}"
    );
}
