//! Process requests against a real agent on a socketpair.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_protocol::{ErrorKind, Event, Request, PROTOCOL_VERSION};
use common::{alive, command, sh, Agent};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

#[tokio::test]
async fn hello_ping_and_version_mismatch() {
    let mut agent = Agent::start();
    match agent
        .call(Request::Hello {
            version: PROTOCOL_VERSION,
            oldest: None,
        })
        .await
    {
        Event::Hello {
            version,
            agent_version,
        } => {
            assert_eq!(version, PROTOCOL_VERSION);
            assert_eq!(agent_version, env!("CARGO_PKG_VERSION"));
        }
        other => panic!("{other:?}"),
    }
    match agent
        .call(Request::Hello {
            version: PROTOCOL_VERSION + 1,
            oldest: None,
        })
        .await
    {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::UnsupportedVersion),
        other => panic!("{other:?}"),
    }
    // A host of version 1 (no range) gets version 1; a host of a later
    // version that still speaks ours gets ours.
    for (version, oldest, chosen) in [
        (1, None, 1),
        (PROTOCOL_VERSION + 5, Some(1), PROTOCOL_VERSION),
    ] {
        match agent.call(Request::Hello { version, oldest }).await {
            Event::Hello { version, .. } => assert_eq!(version, chosen),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(agent.call(Request::Ping).await, Event::Pong);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn keepalives_arrive_on_id_zero() {
    let mut agent = Agent::start_with(Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(agent.call(Request::Ping).await, Event::Pong);
    assert!(agent.keepalives >= 2, "{} keepalives", agent.keepalives);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn unknown_request_is_answered_with_invalid_argument() {
    let mut agent = Agent::start();
    // A valid frame whose message is not a request of this protocol.
    let header = br#"{"id":7,"msg":{"op":"fly"}}"#;
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&(header.len() as u32).to_be_bytes());
    bytes.extend_from_slice(&0u32.to_be_bytes());
    bytes.extend_from_slice(header);
    agent.send_raw(&bytes).await;
    match agent.next(7).await.msg {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::InvalidArgument),
        other => panic!("{other:?}"),
    }
    assert_eq!(agent.call(Request::Ping).await, Event::Pong);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn echo_streams_stdout_and_stderr_before_exit() {
    let mut agent = Agent::start();
    let out = agent
        .run(sh("echo one; echo two >&2; echo three; printf four >&2"))
        .await;
    assert_eq!(out.stdout, b"one\nthree\n");
    assert_eq!(out.stderr, b"two\nfour");
    assert_eq!(out.status.code, Some(0));
    assert_eq!(out.status.signal, None);
    assert!(!out.status.timed_out && !out.status.oom);
    assert!(!out.status.stdout_truncated && !out.status.stderr_truncated);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn exit_codes_and_signals() {
    let mut agent = Agent::start();
    let out = agent.run(sh("exit 3")).await;
    assert_eq!(out.status.code, Some(3));
    assert_eq!(out.status.shell_code(), 3);
    let out = agent.run(sh("kill -9 $$")).await;
    assert_eq!(out.status.code, None);
    assert_eq!(out.status.signal, Some(9));
    assert_eq!(out.status.shell_code(), 137);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn stdin_round_trip_and_close() {
    let mut agent = Agent::start();
    let mut spawn = command("cat", &[]);
    spawn.stdin = true;
    let (id, pid) = agent.start_process(spawn).await;
    for chunk in [&b"hello "[..], &b"world\n"[..]] {
        let write = agent
            .send_payload(Request::WriteStdin { pid }, chunk.to_vec())
            .await;
        assert_eq!(agent.next(write).await.msg, Event::Done);
    }
    assert_eq!(agent.call(Request::CloseStdin { pid }).await, Event::Done);
    let mut stdout = Vec::new();
    loop {
        let frame = agent.next(id).await;
        match frame.msg {
            Event::Stdout => stdout.extend_from_slice(&frame.payload),
            Event::Exited(status) => {
                assert_eq!(status.code, Some(0));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(stdout, b"hello world\n");
    // The process is gone now.
    match agent.call(Request::WriteStdin { pid }).await {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    agent.close().await.unwrap();
}

#[tokio::test]
async fn stdin_errors() {
    let mut agent = Agent::start();
    // No stdin pipe: invalid argument.
    let (id, pid) = agent.start_process(command("sleep", &["5"])).await;
    match agent.call(Request::WriteStdin { pid }).await {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::InvalidArgument),
        other => panic!("{other:?}"),
    }
    match agent.call(Request::CloseStdin { pid }).await {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::InvalidArgument),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        agent.call(Request::Signal { pid, signal: 9 }).await,
        Event::Done
    );
    let frames = agent.finish(id).await;
    assert!(matches!(frames.last().unwrap().msg, Event::Exited(_)));
    // Unknown pid: not found.
    match agent.call(Request::CloseStdin { pid: 999_999 }).await {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    agent.close().await.unwrap();
}

#[tokio::test]
async fn a_process_that_never_reads_stdin_stalls_nobody() {
    let mut agent = Agent::start();
    let mut spawn = command("sleep", &["30"]);
    spawn.stdin = true;
    let (id, pid) = agent.start_process(spawn).await;
    // More than a pipe holds: this write cannot complete while sleep runs.
    let stuck = agent
        .send_payload(Request::WriteStdin { pid }, vec![b'x'; 1 << 20])
        .await;
    // Other requests still answer at once.
    let started = Instant::now();
    assert_eq!(agent.call(Request::Ping).await, Event::Pong);
    let out = agent.run(sh("echo alive")).await;
    assert_eq!(out.stdout, b"alive\n");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        agent.call(Request::Signal { pid, signal: 9 }).await,
        Event::Done
    );
    // The stuck write ends with an error once the process is gone.
    match agent.next(stuck).await.msg {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::Closed),
        other => panic!("{other:?}"),
    }
    let frames = agent.finish(id).await;
    match &frames.last().unwrap().msg {
        Event::Exited(status) => assert_eq!(status.signal, Some(9)),
        other => panic!("{other:?}"),
    }
    agent.close().await.unwrap();
}

#[tokio::test]
async fn env_is_exactly_what_was_sent() {
    let mut agent = Agent::start();
    let mut spawn = command("env", &[]);
    spawn
        .env
        .insert("AIRLOCK_TEST".to_owned(), "yes it is".to_owned());
    let out = agent.run(spawn).await;
    let lines: BTreeSet<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let expected: BTreeSet<String> = [
        "AIRLOCK_TEST=yes it is".to_owned(),
        "PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
    ]
    .into();
    assert_eq!(lines, expected);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn cwd_defaults_to_home_and_follows_the_request() {
    let mut agent = Agent::start();
    std::fs::create_dir(agent.home().join("sub")).unwrap();
    let home = agent.home().canonicalize().unwrap();
    let out = agent.run(command("pwd", &["-P"])).await;
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim_end(),
        home.to_str().unwrap()
    );
    let mut spawn = command("pwd", &["-P"]);
    spawn.cwd = Some("sub".to_owned());
    let out = agent.run(spawn).await;
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim_end(),
        home.join("sub").to_str().unwrap()
    );
    let mut spawn = command("pwd", &[]);
    spawn.cwd = Some("/no/such/dir".to_owned());
    match agent.call(Request::Spawn(spawn)).await {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    agent.close().await.unwrap();
}

#[tokio::test]
async fn limits_apply_to_the_child() {
    let mut agent = Agent::start();
    let mut spawn = sh("ulimit -n; ulimit -Hn; ulimit -c; ulimit -f");
    spawn.limits.nofile = 77;
    spawn.limits.fsize_bytes = 1024 * 512;
    let out = agent.run(spawn).await;
    // `ulimit -f` counts 512-byte blocks in dash and 1024-byte ones in bash.
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(&lines[..3], &["77", "77", "0"]);
    assert!(lines[3] == "1024" || lines[3] == "512", "{text}");
    agent.close().await.unwrap();
}

#[tokio::test]
async fn spawn_failures() {
    let mut agent = Agent::start();
    match agent
        .call(Request::Spawn(command("no-such-command-airlock", &[])))
        .await
    {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    let script = agent.home().join("script");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    match agent
        .call(Request::Spawn(command(script.to_str().unwrap(), &[])))
        .await
    {
        Event::Error { kind, .. } => {
            // Not executable, unless the tests run as root (then exec only
            // needs one x bit, and there is none).
            assert_eq!(kind, ErrorKind::NotExecutable);
        }
        other => panic!("{other:?}"),
    }
    match agent.call(Request::Spawn(command("bad\0cmd", &[]))).await {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::InvalidArgument),
        other => panic!("{other:?}"),
    }
    agent.close().await.unwrap();
}

#[tokio::test]
async fn output_cap_cuts_yes_exactly() {
    let mut agent = Agent::start();
    let mut spawn = command("yes", &[]);
    spawn.output_limit = 100_000;
    let started = Instant::now();
    let out = agent.run(spawn).await;
    assert_eq!(out.stdout.len(), 100_000);
    assert!(out.stdout.chunks(2).all(|c| c == b"y\n"));
    assert!(out.status.stdout_truncated);
    assert!(!out.status.stderr_truncated);
    // yes dies of SIGPIPE once its pipe has no reader.
    assert_eq!(out.status.signal, Some(libc::SIGPIPE));
    assert!(started.elapsed() < Duration::from_secs(5));

    // Exactly the cap is not truncated.
    let mut spawn = sh("printf 12345");
    spawn.output_limit = 5;
    let out = agent.run(spawn).await;
    assert_eq!(out.stdout, b"12345");
    assert!(!out.status.stdout_truncated);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn timeout_kills_the_process_group() {
    let mut agent = Agent::start();
    let mut spawn = command("sleep", &["100"]);
    spawn.timeout_ms = Some(200);
    let started = Instant::now();
    let out = agent.run(spawn).await;
    assert!(out.status.timed_out);
    assert_eq!(out.status.signal, Some(9));
    assert!(started.elapsed() < Duration::from_secs(3));
    agent.close().await.unwrap();
}

#[tokio::test]
async fn background_grandchild_does_not_hold_exited() {
    let mut agent = Agent::start();
    let started = Instant::now();
    let out = agent.run(sh("sleep 100 & echo done")).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.stdout, b"done\n");
    assert_eq!(out.status.code, Some(0));
    // Closing the session kills the group the sleep still belongs to.
    let pgid = out.pid;
    agent.close().await.unwrap();
    // The orphaned sleep is reaped by whoever adopted it; give that a moment.
    let pgid = rustix::process::Pid::from_raw(pgid as i32).unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while rustix::process::test_kill_process_group(pgid).is_ok() {
        assert!(Instant::now() < deadline, "the background sleep survived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn signal_list_and_wait() {
    let mut agent = Agent::start();
    let (id_a, pid_a) = agent.start_process(command("sleep", &["100"])).await;
    let (_id_b, pid_b) = agent.start_process(command("sleep", &["100"])).await;
    match agent.call(Request::ListProcesses).await {
        Event::Processes { processes } => {
            let pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
            let mut expected = vec![pid_a, pid_b];
            expected.sort_unstable();
            assert_eq!(pids, expected);
            assert_eq!(processes[0].cmd, "sleep");
            assert_eq!(processes[0].args, vec!["100".to_owned()]);
        }
        other => panic!("{other:?}"),
    }
    // A wait on a running process answers when it ends.
    let waiter = agent.send(Request::Wait { pid: pid_a }).await;
    assert_eq!(
        agent
            .call(Request::Signal {
                pid: pid_a,
                signal: libc::SIGTERM
            })
            .await,
        Event::Done
    );
    match agent.next(waiter).await.msg {
        Event::Exited(status) => {
            assert_eq!(status.pid, pid_a);
            assert_eq!(status.signal, Some(libc::SIGTERM));
        }
        other => panic!("{other:?}"),
    }
    let frames = agent.finish(id_a).await;
    assert!(matches!(frames.last().unwrap().msg, Event::Exited(_)));
    // A wait on a finished process answers at once.
    match agent.call(Request::Wait { pid: pid_a }).await {
        Event::Exited(status) => assert_eq!(status.signal, Some(libc::SIGTERM)),
        other => panic!("{other:?}"),
    }
    match agent.call(Request::ListProcesses).await {
        Event::Processes { processes } => {
            assert_eq!(
                processes.iter().map(|p| p.pid).collect::<Vec<_>>(),
                vec![pid_b]
            );
        }
        other => panic!("{other:?}"),
    }
    for request in [
        Request::Wait { pid: 999_999 },
        Request::Signal {
            pid: pid_a,
            signal: 9,
        },
    ] {
        match agent.call(request).await {
            Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
    }
    agent.close().await.unwrap();
    assert!(!alive(pid_b));
}

#[tokio::test]
async fn closing_the_stream_kills_running_processes() {
    let mut agent = Agent::start();
    let (_id, pid) = agent.start_process(command("sleep", &["100"])).await;
    let (_id, shell) = agent.start_process(sh("sleep 100; true")).await;
    assert!(alive(pid) && alive(shell));
    let started = Instant::now();
    agent.close().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(!alive(pid), "pid {pid} survived");
    assert!(!alive(shell), "pid {shell} survived");
}

#[tokio::test]
async fn many_processes_at_once() {
    let mut agent = Agent::start();
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push((
            n,
            agent.send(Request::Spawn(sh(&format!("echo {n}")))).await,
        ));
    }
    for (n, id) in ids {
        let out = agent.collect(id).await;
        assert_eq!(out.stdout, format!("{n}\n").into_bytes());
    }
    agent.close().await.unwrap();
}

#[tokio::test]
async fn a_slow_host_loses_no_output() {
    let mut agent = Agent::start();
    let mut spawn = command("head", &["-c", "20000000", "/dev/zero"]);
    spawn.output_limit = 1 << 30;
    let id = agent.send(Request::Spawn(spawn)).await;
    // Not reading: the socket, the agent's queue and the pipe fill, and
    // `head` blocks instead of the agent buffering 20 MB.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = agent.collect(id).await;
    assert_eq!(out.stdout.len(), 20_000_000);
    assert!(out.stdout.iter().all(|b| *b == 0));
    assert_eq!(out.status.code, Some(0));
    assert!(!out.status.stdout_truncated);
    agent.close().await.unwrap();
}
