//! Processes on a terminal (`spawn` with `pty`) against a real agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_protocol::{ErrorKind, Event, ExitStatus, Request};
use common::{command, on_terminal, sh, Agent};

/// Reads `pty` chunks of request `id` until what came so far contains
/// `needle`; fails if the process ends first. Returns everything read.
async fn read_until(agent: &mut Agent, id: u64, needle: &str) -> String {
    let mut seen = Vec::new();
    loop {
        let frame = agent.next(id).await;
        match frame.msg {
            Event::Pty => seen.extend_from_slice(&frame.payload),
            other => panic!(
                "waiting for {needle:?} the process sent {other:?}; it showed {:?}",
                String::from_utf8_lossy(&seen)
            ),
        }
        let text = String::from_utf8_lossy(&seen);
        if text.contains(needle) {
            return text.into_owned();
        }
    }
}

/// The rest of the events of request `id`: the terminal's output and the exit.
async fn read_to_exit(agent: &mut Agent, id: u64) -> (String, ExitStatus) {
    let mut seen = Vec::new();
    loop {
        let frame = agent.next(id).await;
        match frame.msg {
            Event::Pty => seen.extend_from_slice(&frame.payload),
            Event::Exited(status) => return (String::from_utf8_lossy(&seen).into_owned(), status),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_terminal_is_stdio_and_controlling_terminal_with_the_given_size() {
    let mut agent = Agent::start();
    let out = agent
        .run(on_terminal(
            sh("for fd in 0 1 2; do test -t $fd && echo tty$fd; done; \
                stty size; echo \"TERM=$TERM\"; \
                test \"$(ps -o tty= -p $$)\" != '?' && echo controlled; \
                echo oops >&2"),
            100,
            30,
        ))
        .await;
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    // The terminal turns \n into \r\n, and stderr is the terminal too.
    assert_eq!(
        String::from_utf8_lossy(&out.pty),
        "tty0\r\ntty1\r\ntty2\r\n30 100\r\nTERM=xterm-256color\r\ncontrolled\r\noops\r\n"
    );
    assert_eq!(out.status.code, Some(0));
    assert!(!out.status.stdout_truncated);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn term_from_the_environment_wins() {
    let mut agent = Agent::start();
    let mut spawn = on_terminal(sh("echo \"$TERM\""), 80, 24);
    spawn.env.insert("TERM".into(), "vt100".into());
    let out = agent.run(spawn).await;
    assert_eq!(out.pty, b"vt100\r\n");
    agent.close().await.unwrap();
}

#[tokio::test]
async fn typed_input_echoes_and_exit_codes_come_through() {
    let mut agent = Agent::start();
    let (id, pid) = agent
        .start_process(on_terminal(command("sh", &["-i"]), 80, 24))
        .await;
    let write = agent
        .send_payload(Request::WriteStdin { pid }, b"echo hi-$((40+2))\n".to_vec())
        .await;
    assert_eq!(agent.next(write).await.msg, Event::Done);
    // The terminal echoes the typed line, then the shell prints its output.
    let text = read_until(&mut agent, id, "hi-42\r\n").await;
    assert!(text.contains("echo hi-$((40+2))"), "{text:?}");

    // A terminal's input cannot be closed, as in envd.
    match agent.call(Request::CloseStdin { pid }).await {
        Event::Error { kind, message } => {
            assert_eq!(kind, ErrorKind::InvalidArgument);
            assert!(message.contains("^D"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let write = agent
        .send_payload(Request::WriteStdin { pid }, b"exit 3\n".to_vec())
        .await;
    assert_eq!(agent.next(write).await.msg, Event::Done);
    let (_, status) = read_to_exit(&mut agent, id).await;
    assert_eq!(status.code, Some(3));
    agent.close().await.unwrap();
}

#[tokio::test]
async fn control_d_ends_the_input_of_a_reader() {
    let mut agent = Agent::start();
    let (id, pid) = agent
        .start_process(on_terminal(command("cat", &[]), 80, 24))
        .await;
    let write = agent
        .send_payload(Request::WriteStdin { pid }, b"line\n\x04".to_vec())
        .await;
    assert_eq!(agent.next(write).await.msg, Event::Done);
    let (text, status) = read_to_exit(&mut agent, id).await;
    // Echo, then cat's copy.
    assert_eq!(text, "line\r\nline\r\n");
    assert_eq!(status.code, Some(0));
    agent.close().await.unwrap();
}

#[tokio::test]
async fn resize_reaches_the_process_with_sigwinch() {
    let mut agent = Agent::start();
    let (id, pid) = agent
        .start_process(on_terminal(
            // Bounded, so a failing test leaves nothing running for long.
            sh("trap 'stty size; exit 0' WINCH; stty size; \
                for i in $(seq 400); do sleep 0.05; done; exit 9"),
            80,
            24,
        ))
        .await;
    read_until(&mut agent, id, "24 80\r\n").await;
    assert_eq!(
        agent
            .call(Request::Resize {
                pid,
                cols: 132,
                rows: 43
            })
            .await,
        Event::Done
    );
    let (text, status) = read_to_exit(&mut agent, id).await;
    assert_eq!(text, "43 132\r\n");
    assert_eq!(status.code, Some(0));
    agent.close().await.unwrap();
}

#[tokio::test]
async fn terminal_errors() {
    let mut agent = Agent::start();
    // A size with a zero is refused before anything starts.
    let id = agent
        .send(Request::Spawn(on_terminal(sh("true"), 0, 24)))
        .await;
    match agent.next(id).await.msg {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::InvalidArgument),
        other => panic!("{other:?}"),
    }
    // A process on pipes has nothing to resize.
    let (id, pid) = agent.start_process(command("sleep", &["5"])).await;
    match agent
        .call(Request::Resize {
            pid,
            cols: 80,
            rows: 24,
        })
        .await
    {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::InvalidArgument),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        agent.call(Request::Signal { pid, signal: 9 }).await,
        Event::Done
    );
    agent.finish(id).await;
    // Nor has a process that is gone.
    match agent
        .call(Request::Resize {
            pid: 999_999,
            cols: 80,
            rows: 24,
        })
        .await
    {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    let (id, pid) = agent
        .start_process(on_terminal(command("sleep", &["5"]), 80, 24))
        .await;
    match agent
        .call(Request::Resize {
            pid,
            cols: 80,
            rows: 0,
        })
        .await
    {
        Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::InvalidArgument),
        other => panic!("{other:?}"),
    }
    // SIGKILL to the group ends a terminal's process like any other.
    assert_eq!(
        agent.call(Request::Signal { pid, signal: 9 }).await,
        Event::Done
    );
    let (_, status) = read_to_exit(&mut agent, id).await;
    assert_eq!(status.signal, Some(9));
    agent.close().await.unwrap();
}

#[tokio::test]
async fn output_past_the_limit_hangs_the_terminal_up() {
    let mut agent = Agent::start();
    let mut spawn = on_terminal(command("yes", &[]), 80, 24);
    spawn.output_limit = 10_000;
    let out = tokio::time::timeout(std::time::Duration::from_secs(10), agent.run(spawn))
        .await
        .expect("yes kept running past the cap: the terminal did not hang up");
    assert_eq!(out.pty.len(), 10_000);
    assert!(out.status.stdout_truncated);
    assert_eq!(out.status.signal, Some(libc::SIGHUP), "{:?}", out.status);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn a_background_holder_of_the_terminal_does_not_hold_exited() {
    let mut agent = Agent::start();
    let started = std::time::Instant::now();
    let out = agent
        .run(on_terminal(sh("sleep 30 & echo parent"), 80, 24))
        .await;
    assert_eq!(out.pty, b"parent\r\n");
    assert_eq!(out.status.code, Some(0));
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    agent.close().await.unwrap();
}
