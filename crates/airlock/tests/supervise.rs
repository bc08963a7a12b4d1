//! `airlock supervise`: the per-sandbox process the daemon talks through.
//! A sandbox outlives its daemon connection; SIGTERM tears it down; a
//! supervisor killed with -9 leaves nothing the next launch does not sweep.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_protocol::{
    read_frame, write_frame, Event, Frame, Identity, ProcessLimits, Request, SpawnRequest,
};
use common::*;
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::net::UnixStream;

fn unique_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "sbx-{:08x}{:08x}",
        std::process::id(),
        (nanos & 0xffff_ffff) as u32
    )
}

struct Supervised {
    child: Child,
    id: String,
    socket: String,
    init_pid: i32,
}

/// Starts `airlock supervise` and hands it `spec` on stdin, as the daemon will.
fn start_supervisor(id: &str, socket: &str, spec: &str) -> Child {
    let mut child = Command::new(binary())
        .args(["supervise", "--id", id, "--socket", socket])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(spec.as_bytes())
        .unwrap();
    child
}

fn supervise(spec: &str) -> Supervised {
    require_root();
    let id = unique_id();
    let socket = format!("/run/airlock/sockets/{id}.sock");
    let mut child = start_supervisor(&id, &socket, spec);
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
    let ready = &answer["ready"];
    assert_eq!(ready["id"], id.as_str(), "{answer}");
    Supervised {
        child,
        init_pid: ready["init_pid"].as_i64().unwrap() as i32,
        id,
        socket,
    }
}

fn spawn(cmd: &str) -> Request {
    Request::Spawn(SpawnRequest {
        cmd: "/bin/sh".into(),
        args: vec!["-c".into(), cmd.into()],
        env: BTreeMap::from([("PATH".into(), "/usr/bin:/bin".into())]),
        cwd: None,
        user: Identity::User,
        stdin: false,
        pty: None,
        timeout_ms: None,
        output_limit: 1 << 20,
        limits: ProcessLimits {
            nofile: 256,
            fsize_bytes: 1 << 30,
        },
    })
}

async fn connect(socket: &str, first_id: u64) -> UnixStream {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    write_frame(
        &mut stream,
        &Frame::new(
            first_id,
            Request::Hello {
                version: airlock_protocol::PROTOCOL_VERSION,
                oldest: None,
            },
        ),
    )
    .await
    .unwrap();
    loop {
        let frame: Frame<Event> = read_frame(&mut stream).await.unwrap();
        if frame.id == first_id {
            assert!(matches!(frame.msg, Event::Hello { .. }), "{frame:?}");
            return stream;
        }
    }
}

/// Runs a command and returns its stdout, skipping frames of other requests.
async fn run_in(stream: &mut UnixStream, id: u64, cmd: &str) -> String {
    write_frame(stream, &Frame::new(id, spawn(cmd)))
        .await
        .unwrap();
    let mut out = Vec::new();
    loop {
        let frame: Frame<Event> = read_frame(stream).await.unwrap();
        if frame.id != id {
            continue;
        }
        match frame.msg {
            Event::Stdout => out.extend_from_slice(&frame.payload),
            Event::Exited(status) => {
                assert_eq!(status.code, Some(0), "{status:?}");
                return String::from_utf8(out).unwrap();
            }
            Event::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    }
}

fn wait_gone(pid: i32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[tokio::test]
async fn sandbox_outlives_a_dropped_connection_and_sigterm_tears_it_down() {
    let mut sup = supervise("{}");
    {
        let mut stream = connect(&sup.socket, 1).await;
        assert_eq!(run_in(&mut stream, 2, "echo first").await, "first\n");
        // A daemon that dies mid-request: the request is in flight when the
        // connection drops, and it drops inside a frame.
        write_frame(&mut stream, &Frame::new(3, spawn("sleep 0.2; echo lost")))
            .await
            .unwrap();
        use tokio::io::AsyncWriteExt;
        stream.write_all(&[0, 0, 0, 40, 0, 0]).await.unwrap();
    }
    let mut stream = connect(&sup.socket, 100).await;
    let text = run_in(&mut stream, 101, "echo second; hostname").await;
    assert_eq!(text, format!("second\n{}\n", sup.id));
    drop(stream);

    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(sup.child.id() as i32, libc::SIGTERM);
    }
    let status = sup.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        !std::path::Path::new(&sup.socket).exists(),
        "socket left behind"
    );
    assert!(wait_gone(sup.init_pid, Duration::from_secs(5)));
    assert_no_leftovers(&sup.id);
    // How it ended, left for a daemon that will never read it (this test
    // has none): removed, or every run would leave one behind.
    let ending = format!("/run/airlock/sockets/{}.ended", sup.id);
    assert!(
        std::path::Path::new(&ending).exists(),
        "{ending} was not written"
    );
    std::fs::remove_file(&ending).unwrap();
}

#[test]
fn a_killed_supervisor_takes_its_sandbox_down_and_the_next_launch_sweeps_it() {
    let mut sup = supervise("{}");
    sup.child.kill().unwrap();
    sup.child.wait().unwrap();
    assert!(
        wait_gone(sup.init_pid, Duration::from_secs(5)),
        "the sandbox init survived its supervisor"
    );
    // The next launch sweeps what the dead supervisor could not release.
    let out = run(&["--", "true"]);
    assert_eq!(out.status.code(), Some(0));
    assert_no_leftovers(&sup.id);
    let _ = std::fs::remove_file(&sup.socket);
}

#[test]
fn bad_specs_and_ids_are_refused() {
    require_root();
    for (id, spec) in [
        ("sbx-00000000000000ab", r#"{"limits": {"memory_bytes": 0}}"#),
        ("sbx-00000000000000ab", "not json"),
        ("../../etc", "{}"),
    ] {
        let child = start_supervisor(id, "/run/airlock/sockets/bad.sock", spec);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{id} {spec}");
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(answer["error"]["bad_input"], true, "{answer}");
    }
}
