//! Limits on watches and the release of their inotify descriptors. One test
//! in its own binary: it counts the inotify descriptors of this process,
//! which other watch tests running beside it would change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_protocol::{ErrorKind, Event, Request};
use common::Agent;
use std::fs;

/// Open inotify descriptors of this process (the agent runs on a thread).
fn inotify_fds() -> usize {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy() == "anon_inode:inotify")
        .count()
}

fn watch_request(path: &str, recursive: bool) -> Request {
    Request::Watch {
        path: path.to_owned(),
        recursive,
        entries: false,
        xattrs: None,
        local_only: false,
    }
}

fn error_kind(event: &Event) -> ErrorKind {
    match event {
        Event::Error { kind, .. } => *kind,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn watches_are_bounded_and_release_their_descriptors() {
    assert_eq!(inotify_fds(), 0);
    let mut agent = Agent::start();

    // More than 8192 directories: refused, and nothing stays open. (On a
    // tmpfs when there is one: that many directories are slow to make on
    // some disks.)
    let scratch = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
    let wide = scratch.path().join("wide");
    for i in 0..8193 {
        fs::create_dir_all(wide.join(format!("d{i}"))).unwrap();
    }
    let wide = wide.to_string_lossy().into_owned();
    match agent.call(watch_request(&wide, true)).await {
        Event::Error { kind, message } => {
            assert_eq!(kind, ErrorKind::InvalidArgument);
            assert!(message.contains("8192 directories"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(inotify_fds(), 0);
    // Without recursive the same directory is one watch.
    let id = agent.send(watch_request(&wide, false)).await;
    assert_eq!(agent.call(Request::Ping).await, Event::Pong);
    assert_eq!(inotify_fds(), 1);
    assert_eq!(
        agent.call(Request::Cancel { target: id }).await,
        Event::Done
    );
    assert_eq!(agent.next(id).await.msg, Event::Done);
    assert_eq!(inotify_fds(), 0);

    // 64 watches at once; the 65th is refused until one is cancelled.
    fs::create_dir(agent.home().join("w")).unwrap();
    let mut ids = Vec::new();
    for _ in 0..64 {
        ids.push(agent.send(watch_request("w", false)).await);
    }
    let refused = agent.call(watch_request("w", false)).await;
    assert_eq!(error_kind(&refused), ErrorKind::InvalidArgument);
    assert_eq!(inotify_fds(), 64);

    // The cancel's `done` comes after the watch closed its descriptor.
    assert_eq!(
        agent.call(Request::Cancel { target: ids[0] }).await,
        Event::Done
    );
    assert_eq!(agent.next(ids[0]).await.msg, Event::Done);
    assert_eq!(inotify_fds(), 63);
    agent.send(watch_request("w", false)).await;
    assert_eq!(agent.call(Request::Ping).await, Event::Pong);
    assert_eq!(inotify_fds(), 64);

    // The end of the session closes every one, without final events.
    fs::File::create(agent.home().join("w/a")).unwrap();
    agent.close().await.unwrap();
    assert_eq!(inotify_fds(), 0);
}
