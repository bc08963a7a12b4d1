//! The agent as PID 1 of a new pid namespace, dropping privileges per
//! identity, reaping orphans and stopping gracefully on SIGTERM.
//!
//! Needs root and `unshare --pid` (util-linux); fails with a clear message
//! otherwise, as every test that needs root does (CI runs as root). The test
//! binary re-runs itself under `unshare` with only `pid1_agent_child`
//! selected, and that process becomes the agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_agent::{serve, AgentConfig};
use airlock_protocol::{ErrorKind, Event, Identity, Request, PROTOCOL_VERSION};
use common::{on_terminal, sh, Agent};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "AIRLOCK_AGENT_PID1_CHILD";
const USER_HOME: &str = "AIRLOCK_AGENT_TEST_USER_HOME";
const ROOT_HOME: &str = "AIRLOCK_AGENT_TEST_ROOT_HOME";

/// Not a test by itself: the body of the PID 1 that `pid1_sandbox` starts,
/// serving the stream it gets as stdin.
#[test]
#[ignore = "started by pid1_sandbox inside a new pid namespace"]
fn pid1_agent_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    assert_eq!(std::process::id(), 1);
    let fd: OwnedFd = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
    let config = AgentConfig {
        keepalive: Duration::from_secs(30),
        drop_privileges: true,
        user_home: PathBuf::from(std::env::var_os(USER_HOME).unwrap()),
        root_home: PathBuf::from(std::env::var_os(ROOT_HOME).unwrap()),
        sudo_socket: None,
    };
    serve(config, UnixStream::from(fd)).unwrap();
}

fn as_root(script: &str) -> airlock_protocol::SpawnRequest {
    let mut spawn = sh(script);
    spawn.user = Identity::Root;
    spawn
}

const IDENTITY_SCRIPT: &str = "id -u; id -g; id -G; \
    grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; pwd; \
    if cat /proc/1/environ >/dev/null 2>&1; then echo readable; else echo unreadable; fi";

fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(|l| l.replace('\t', " "))
        .collect()
}

#[tokio::test]
async fn pid1_sandbox() {
    assert!(
        rustix::process::getuid().is_root(),
        "pid1_sandbox needs root (it runs the agent as PID 1 of a new pid namespace); run the tests as root, as CI does"
    );
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .stderr(Stdio::null())
        .status();
    assert!(
        matches!(probe, Ok(status) if status.success()),
        "pid1_sandbox needs `unshare --pid --fork --mount-proc` (util-linux) to work"
    );
    let user_home = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(user_home.path(), Some(1000), Some(1000)).unwrap();
    let root_home = tempfile::tempdir().unwrap();
    let user_dir = user_home.path().to_path_buf();
    let root_dir = root_home.path().to_path_buf();

    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "pid1_agent_child",
            "--ignored",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env(USER_HOME, &user_dir)
        .env(ROOT_HOME, &root_dir)
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut agent = Agent::connect(ours, user_home);

    assert!(matches!(
        agent
            .call(Request::Hello {
                version: PROTOCOL_VERSION,
                oldest: None,
            })
            .await,
        Event::Hello { .. }
    ));

    // Identity::User: uid/gid 1000, no capabilities at all, cannot read PID 1.
    let out = agent.run(sh(IDENTITY_SCRIPT)).await;
    let zero = "0000000000000000";
    assert_eq!(
        lines(&out.stdout),
        vec![
            "1000".to_owned(),
            "1000".to_owned(),
            "1000".to_owned(),
            format!("CapInh: {zero}"),
            format!("CapPrm: {zero}"),
            format!("CapEff: {zero}"),
            format!("CapBnd: {zero}"),
            format!("CapAmb: {zero}"),
            user_dir.to_str().unwrap().to_owned(),
            "unreadable".to_owned(),
        ],
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // On a terminal the identity and cwd are the same, and the terminal's
    // slave belongs to the user (as a login's would).
    let out = agent
        .run(on_terminal(
            sh("id -u; id -G; grep CapEff /proc/self/status; pwd; stat -c %u \"$(tty)\""),
            80,
            24,
        ))
        .await;
    assert_eq!(
        lines(&out.pty),
        vec![
            "1000".to_owned(),
            "1000".to_owned(),
            format!("CapEff: {zero}"),
            user_dir.to_str().unwrap().to_owned(),
            "1000".to_owned(),
        ],
        "terminal of a user process"
    );

    // Identity::Root: uid 0 with exactly the kept capabilities.
    let out = agent.run(as_root(IDENTITY_SCRIPT)).await;
    let keep = "00000000000004fb";
    assert_eq!(
        lines(&out.stdout),
        vec![
            "0".to_owned(),
            "0".to_owned(),
            "0".to_owned(),
            format!("CapInh: {zero}"),
            format!("CapPrm: {keep}"),
            format!("CapEff: {keep}"),
            format!("CapBnd: {keep}"),
            format!("CapAmb: {zero}"),
            root_dir.to_str().unwrap().to_owned(),
            "unreadable".to_owned(),
        ],
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Files for the user are the user's, parents included.
    let id = agent
        .send(Request::WriteFile {
            path: "made/for/user.txt".to_owned(),
            mode: None,
            create_parents: true,
            append: false,
            owner: Identity::User,
            xattrs: None,
        })
        .await;
    agent.send_on(id, Request::WriteData, b"hi".to_vec()).await;
    agent.send_on(id, Request::WriteEnd, Vec::new()).await;
    assert_eq!(agent.next(id).await.msg, Event::Written { bytes: 2 });
    for path in ["made", "made/for", "made/for/user.txt"] {
        match agent
            .call(Request::Stat {
                path: path.to_owned(),
                xattrs: None,
            })
            .await
        {
            Event::Stat(info) => assert_eq!((info.uid, info.gid), (1000, 1000), "{path}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        agent
            .call(Request::MakeDir {
                path: "rootdir".to_owned(),
                parents: false,
                mode: None,
                owner: Identity::Root,
            })
            .await,
        Event::Done
    );
    match agent
        .call(Request::Stat {
            path: "rootdir".to_owned(),
            xattrs: None,
        })
        .await
    {
        Event::Stat(info) => assert_eq!(info.uid, 0),
        other => panic!("{other:?}"),
    }

    // Orphans are reaped by PID 1: no zombie is left behind.
    let out = agent.run(sh("sleep 0.1 & echo background")).await;
    assert_eq!(out.stdout, b"background\n");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let out = agent
        .run(as_root("grep -l '^State:.*Z' /proc/[0-9]*/status; true"))
        .await;
    assert_eq!(lines(&out.stdout), Vec::<String>::new());

    // Failed execs race with orphans dying: std reaps a failed child
    // itself, so PID 1's waitpid(-1) must never take it first.
    let (churn, _pid) = agent
        .start_process(sh(
            "i=0; while [ $i -lt 100 ]; do (true &); i=$((i+1)); done",
        ))
        .await;
    for _ in 0..30 {
        match agent
            .call(Request::Spawn(common::command(
                "no-such-command-airlock",
                &[],
            )))
            .await
        {
            Event::Error { kind, .. } => assert_eq!(kind, ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
    }
    let frames = agent.finish(churn).await;
    match &frames.last().unwrap().msg {
        Event::Exited(status) => assert_eq!(status.code, Some(0)),
        other => panic!("{other:?}"),
    }

    // SIGTERM to PID 1: processes get SIGTERM, the stubborn one SIGKILL
    // after the grace, then the agent ends and closes the stream.
    let (stubborn, _pid) = agent
        .start_process(sh("trap '' TERM; echo ready; sleep 100"))
        .await;
    assert_eq!(agent.next(stubborn).await.msg, Event::Stdout);
    let started = Instant::now();
    let _ = agent.send(Request::Spawn(as_root("kill -TERM 1"))).await;
    agent.wait_closed(Duration::from_secs(8)).await;
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(1500), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(6), "{elapsed:?}");
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    drop(root_home);
}
