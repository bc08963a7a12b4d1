//! `watch` and `cancel` against a real agent on a socketpair.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_protocol::{ErrorKind, Event, FsEventKind, Request};
use common::{sh, Agent};
use std::collections::BTreeSet;
use std::fs::{self, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;
use FsEventKind::{Chmod, Create, Remove, Rename};

/// Time for stray events to arrive before a test checks there are none.
const SETTLE: Duration = Duration::from_millis(100);

/// Starts a watch and waits until it is in place: the agent reads the `ping`
/// sent after it only then.
async fn watch(agent: &mut Agent, path: &str, recursive: bool) -> u64 {
    let id = agent
        .send(Request::Watch {
            path: path.to_owned(),
            recursive,
            entries: false,
            xattrs: None,
            local_only: false,
        })
        .await;
    assert_eq!(agent.call(Request::Ping).await, Event::Pong);
    id
}

fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The next event of watch `id`, which must be an `fs_event`.
async fn fs_event(agent: &mut Agent, id: u64) -> (FsEventKind, String) {
    match agent.next(id).await.msg {
        Event::FsEvent { kind, path, .. } => (kind, path),
        other => panic!("expected an fs_event, got {other:?}"),
    }
}

/// The next events of watch `id` are exactly these.
async fn expect(agent: &mut Agent, id: u64, expected: &[(FsEventKind, &Path)]) {
    for (kind, path) in expected {
        assert_eq!(fs_event(agent, id).await, (*kind, text(path)));
    }
}

/// Collects the events of watch `id` up to and including `last`.
async fn until(
    agent: &mut Agent,
    id: u64,
    last: (FsEventKind, &Path),
) -> Vec<(FsEventKind, String)> {
    let last = (last.0, text(last.1));
    let mut events = Vec::new();
    loop {
        let event = fs_event(agent, id).await;
        let done = event == last;
        events.push(event);
        if done {
            return events;
        }
    }
}

/// Cancels watch `id`: its stream ends with `done`, and the cancel's own
/// `done` comes after it, with nothing in between.
async fn cancel(agent: &mut Agent, id: u64) {
    let cancel = agent.send(Request::Cancel { target: id }).await;
    let first = agent.next_any().await;
    assert_eq!((first.id, first.msg), (id, Event::Done));
    let second = agent.next_any().await;
    assert_eq!((second.id, second.msg), (cancel, Event::Done));
}

/// Fails if request `id` sends anything before the answer to a `ping`.
async fn quiet(agent: &mut Agent, id: u64) {
    tokio::time::sleep(SETTLE).await;
    let ping = agent.send(Request::Ping).await;
    loop {
        let frame = agent.next_any().await;
        assert_ne!(frame.id, id, "unexpected {frame:?}");
        if frame.id == ping {
            assert_eq!(frame.msg, Event::Pong);
            return;
        }
    }
}

fn append(path: &Path, data: &[u8]) {
    OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(data)
        .unwrap();
}

fn error_kind(event: Event) -> ErrorKind {
    match event {
        Event::Error { kind, message } => {
            assert!(!message.is_empty());
            kind
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn flat_watch_reports_each_change_once() {
    let mut agent = Agent::start();
    let dir = agent.home().join("w");
    fs::create_dir(&dir).unwrap();
    // A relative path is joined to the home, like every file path.
    let id = watch(&mut agent, "w", false).await;

    let (a, b, sub) = (dir.join("a.txt"), dir.join("b.txt"), dir.join("sub"));
    fs::File::create(&a).unwrap();
    // (Writes back to back would be one event: the kernel merges an event
    // identical to the last one queued.)
    append(&a, b"hello");
    fs::set_permissions(&a, Permissions::from_mode(0o600)).unwrap();
    fs::rename(&a, &b).unwrap();
    fs::remove_file(&b).unwrap();
    fs::create_dir(&sub).unwrap();
    // Not recursive: nothing inside `sub` is reported.
    fs::write(sub.join("inner.txt"), b"x").unwrap();
    fs::remove_file(sub.join("inner.txt")).unwrap();
    fs::remove_dir(&sub).unwrap();

    expect(
        &mut agent,
        id,
        &[
            (Create, &a),
            (FsEventKind::Write, &a),
            (Chmod, &a),
            (Rename, &a),
            (Rename, &b),
            (Remove, &b),
            (Create, &sub),
            (Remove, &sub),
        ],
    )
    .await;
    // Nothing else arrives before the watch's `done`.
    tokio::time::sleep(SETTLE).await;
    cancel(&mut agent, id).await;
    agent.close().await.unwrap();
}

#[tokio::test]
async fn recursive_watch_follows_new_and_moved_directories() {
    let mut agent = Agent::start();
    let root = agent.home().join("r");
    let old = root.join("old");
    fs::create_dir_all(&old).unwrap();
    let id = watch(&mut agent, &text(&root), true).await;

    // A subdirectory present at the start.
    let g = old.join("g.txt");
    fs::write(&g, b"x").unwrap();
    expect(&mut agent, id, &[(Create, &g), (FsEventKind::Write, &g)]).await;

    // A subdirectory created after the start: its `create` comes once it is
    // watched.
    let new = root.join("new");
    fs::create_dir(&new).unwrap();
    expect(&mut agent, id, &[(Create, &new)]).await;
    let f = new.join("f.txt");
    fs::write(&f, b"1").unwrap();
    expect(&mut agent, id, &[(Create, &f), (FsEventKind::Write, &f)]).await;

    // A tree made at once: every level is reported as created (some maybe
    // twice, when made just as the watch of its parent was added).
    let (x, y, z) = (new.join("x"), new.join("x/y"), new.join("x/y/z"));
    let deep = z.join("deep.txt");
    fs::create_dir_all(&z).unwrap();
    fs::write(&deep, b"2").unwrap();
    let sentinel = root.join("sentinel");
    fs::File::create(&sentinel).unwrap();
    let events = until(&mut agent, id, (Create, &sentinel)).await;
    let created: BTreeSet<String> = events
        .iter()
        .filter(|(kind, _)| *kind == Create)
        .map(|(_, path)| path.clone())
        .collect();
    for path in [&x, &y, &z, &deep, &sentinel] {
        assert!(created.contains(&text(path)), "{path:?} in {events:?}");
    }
    for (kind, path) in &events {
        assert!(
            *kind == Create || (*kind == FsEventKind::Write && *path == text(&deep)),
            "{events:?}"
        );
    }

    // A directory moved within the watch is followed under its new path.
    let moved = new.join("moved");
    fs::rename(&old, &moved).unwrap();
    expect(&mut agent, id, &[(Rename, &old), (Rename, &moved)]).await;
    let h = moved.join("h.txt");
    fs::write(&h, b"3").unwrap();
    append(&moved.join("g.txt"), b"4");
    expect(
        &mut agent,
        id,
        &[
            (Create, &h),
            (FsEventKind::Write, &h),
            (FsEventKind::Write, &moved.join("g.txt")),
        ],
    )
    .await;

    // A directory moved out of the watch is no longer watched.
    let outside = agent.home().join("outside");
    fs::rename(&moved, &outside).unwrap();
    expect(&mut agent, id, &[(Rename, &moved)]).await;
    fs::write(outside.join("later.txt"), b"5").unwrap();

    // Removing a tree reports every entry, the directory last.
    fs::remove_dir_all(&new).unwrap();
    let events = until(&mut agent, id, (Remove, &new)).await;
    let removed: BTreeSet<String> = events.iter().map(|(_, path)| path.clone()).collect();
    assert!(events.iter().all(|(kind, _)| *kind == Remove), "{events:?}");
    for path in [&f, &x, &y, &z, &deep, &new] {
        assert!(removed.contains(&text(path)), "{path:?} in {events:?}");
    }

    tokio::time::sleep(SETTLE).await;
    cancel(&mut agent, id).await;
    agent.close().await.unwrap();
}

#[tokio::test]
async fn cancel_ends_the_stream_and_later_changes_are_silent() {
    let mut agent = Agent::start();
    let dir = agent.home().join("c");
    fs::create_dir(&dir).unwrap();
    let id = watch(&mut agent, &text(&dir), true).await;
    let one = dir.join("one");
    fs::File::create(&one).unwrap();
    expect(&mut agent, id, &[(Create, &one)]).await;

    cancel(&mut agent, id).await;
    fs::File::create(dir.join("two")).unwrap();
    fs::create_dir(dir.join("three")).unwrap();
    quiet(&mut agent, id).await;

    // Cancelling it again, an unknown id, or a request that is no watch is a
    // no-op answered by `done`.
    assert_eq!(
        agent.call(Request::Cancel { target: id }).await,
        Event::Done
    );
    assert_eq!(
        agent.call(Request::Cancel { target: 9999 }).await,
        Event::Done
    );
    let (spawn, _) = agent.start_process(sh("sleep 0.2; echo ok")).await;
    assert_eq!(
        agent.call(Request::Cancel { target: spawn }).await,
        Event::Done
    );
    let mut stdout = Vec::new();
    loop {
        let frame = agent.next(spawn).await;
        match frame.msg {
            Event::Stdout => stdout.extend_from_slice(&frame.payload),
            Event::Exited(status) => {
                assert_eq!(status.code, Some(0));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(stdout, b"ok\n");

    // The id can be used again for a new watch.
    agent
        .send_on(
            id,
            Request::Watch {
                path: text(&dir),
                recursive: false,
                entries: false,
                xattrs: None,
                local_only: false,
            },
            Vec::new(),
        )
        .await;
    assert_eq!(agent.call(Request::Ping).await, Event::Pong);
    let four = dir.join("four");
    fs::File::create(&four).unwrap();
    expect(&mut agent, id, &[(Create, &four)]).await;
    cancel(&mut agent, id).await;
    agent.close().await.unwrap();
}

#[tokio::test]
async fn watches_that_cannot_start_end_with_an_error() {
    let mut agent = Agent::start();
    let missing = Request::Watch {
        path: "missing".to_owned(),
        recursive: false,
        entries: false,
        xattrs: None,
        local_only: false,
    };
    assert_eq!(error_kind(agent.call(missing).await), ErrorKind::NotFound);

    // Only directories can be watched.
    fs::write(agent.home().join("file.txt"), b"x").unwrap();
    for recursive in [false, true] {
        let file = Request::Watch {
            path: "file.txt".to_owned(),
            recursive,
            entries: false,
            xattrs: None,
            local_only: false,
        };
        assert_eq!(error_kind(agent.call(file).await), ErrorKind::NotADirectory);
    }

    for path in ["", "a\0b"] {
        let bad = Request::Watch {
            path: path.to_owned(),
            recursive: false,
            entries: false,
            xattrs: None,
            local_only: false,
        };
        assert_eq!(
            error_kind(agent.call(bad).await),
            ErrorKind::InvalidArgument
        );
    }

    // A symlink to a directory is followed for the watched directory itself;
    // paths are reported under the path of the request.
    let real = agent.home().join("real");
    fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, agent.home().join("link")).unwrap();
    let id = watch(&mut agent, "link", false).await;
    fs::File::create(real.join("a")).unwrap();
    let through_link = agent.home().join("link/a");
    expect(&mut agent, id, &[(Create, &through_link)]).await;
    cancel(&mut agent, id).await;
    agent.close().await.unwrap();
}

#[tokio::test]
async fn removing_or_moving_the_watched_directory_ends_the_watch() {
    let mut agent = Agent::start();
    let gone = agent.home().join("gone");
    fs::create_dir_all(gone.join("sub")).unwrap();
    fs::write(gone.join("sub/f"), b"x").unwrap();
    let id = watch(&mut agent, &text(&gone), true).await;
    fs::remove_dir_all(&gone).unwrap();
    let events = until(&mut agent, id, (Remove, &gone)).await;
    let removed: BTreeSet<String> = events.iter().map(|(_, path)| path.clone()).collect();
    assert!(events.iter().all(|(kind, _)| *kind == Remove), "{events:?}");
    assert_eq!(
        removed,
        [gone.join("sub/f"), gone.join("sub"), gone.clone()]
            .iter()
            .map(|path| text(path))
            .collect()
    );
    assert_eq!(error_kind(agent.next(id).await.msg), ErrorKind::NotFound);
    quiet(&mut agent, id).await;

    let moving = agent.home().join("moving");
    fs::create_dir(&moving).unwrap();
    let id = watch(&mut agent, &text(&moving), false).await;
    fs::rename(&moving, agent.home().join("moved")).unwrap();
    expect(&mut agent, id, &[(Rename, &moving)]).await;
    assert_eq!(error_kind(agent.next(id).await.msg), ErrorKind::NotFound);
    fs::File::create(agent.home().join("moved/a")).unwrap();
    quiet(&mut agent, id).await;
    agent.close().await.unwrap();
}

#[tokio::test]
async fn an_overflowing_queue_ends_the_watch_with_an_error() {
    let mut agent = Agent::start();
    let dir = agent.home().join("busy");
    fs::create_dir(&dir).unwrap();
    let paths = [dir.join("a"), dir.join("b")];
    let mut files = paths.each_ref().map(|path| fs::File::create(path).unwrap());
    let id = watch(&mut agent, &text(&dir), false).await;
    // The test does not read while it makes the events, so the agent's
    // outgoing queue and the socket fill, the agent stops reading inotify,
    // and the kernel queue (max_queued_events long) overflows. Writes
    // alternate between two files so the kernel merges none of them.
    let queue: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let made = queue + 10_000;
    for i in 0..made {
        files[i % 2].write_all(b"x").unwrap();
    }
    let mut writes = 0;
    loop {
        match agent.next(id).await.msg {
            Event::FsEvent {
                kind: FsEventKind::Write,
                path,
                ..
            } => {
                assert_eq!(path, text(&paths[writes % 2]));
                writes += 1;
            }
            Event::Error { kind, message } => {
                assert_eq!(kind, ErrorKind::Io);
                assert_eq!(message, "too many events; the watch was dropped");
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(writes < made, "{writes} of {made} events");
    quiet(&mut agent, id).await;

    // A new watch works.
    let id = watch(&mut agent, &text(&dir), false).await;
    fs::remove_file(&paths[0]).unwrap();
    expect(&mut agent, id, &[(Remove, &paths[0])]).await;
    cancel(&mut agent, id).await;
    agent.close().await.unwrap();
}

#[tokio::test]
async fn watches_asked_for_entries_attach_them_to_what_still_exists() {
    let mut agent = Agent::start();
    let dir = agent.home().join("e");
    fs::create_dir(&dir).unwrap();
    let id = agent
        .send(Request::Watch {
            path: "e".to_owned(),
            recursive: false,
            entries: true,
            xattrs: Some("user.t.".into()),
            local_only: true,
        })
        .await;
    assert_eq!(agent.call(Request::Ping).await, Event::Pong);

    let (a, b) = (dir.join("a.txt"), dir.join("b.txt"));
    fs::write(&a, b"hello").unwrap();
    rustix::fs::setxattr(&a, "user.t.k", b"v", rustix::fs::XattrFlags::empty()).unwrap();
    fs::rename(&a, &b).unwrap();
    fs::remove_file(&b).unwrap();
    let mut seen = Vec::new();
    loop {
        let Event::FsEvent { kind, path, entry } = agent.next(id).await.msg else {
            panic!("expected an fs_event");
        };
        let done = kind == Remove;
        seen.push((kind, path, entry));
        if done {
            break;
        }
    }
    for (kind, path, entry) in &seen {
        match kind {
            // `a.txt` may be renamed before its `create` is handled: then
            // it goes without.
            Create | FsEventKind::Write | Chmod => {
                if let Some(entry) = entry {
                    assert_eq!(entry.path, *path);
                    assert_eq!(entry.name, "a.txt");
                }
            }
            Rename | Remove => assert!(entry.is_none(), "{kind:?} {path} {entry:?}"),
        }
    }
    // The attribute's own `chmod` is reported with it, unless the file had
    // gone by then.
    let chmod = seen.iter().find(|(kind, ..)| *kind == Chmod).unwrap();
    if let Some(entry) = &chmod.2 {
        assert_eq!(entry.xattrs.get("user.t.k").map(String::as_str), Some("v"));
    }
    cancel(&mut agent, id).await;

    // A prefix outside `user.` is refused.
    let bad = Request::Watch {
        path: "e".to_owned(),
        recursive: false,
        entries: true,
        xattrs: Some("trusted.".into()),
        local_only: false,
    };
    assert_eq!(
        error_kind(agent.call(bad).await),
        ErrorKind::InvalidArgument
    );
    agent.close().await.unwrap();
}

#[tokio::test]
async fn entries_follow_the_events_when_the_entry_stays() {
    let mut agent = Agent::start();
    let dir = agent.home().join("s");
    fs::create_dir(&dir).unwrap();
    let id = agent
        .send(Request::Watch {
            path: "s".to_owned(),
            recursive: false,
            entries: true,
            xattrs: None,
            local_only: false,
        })
        .await;
    assert_eq!(agent.call(Request::Ping).await, Event::Pong);
    let file = dir.join("kept.txt");
    fs::write(&file, b"12345").unwrap();
    let Event::FsEvent { kind, entry, .. } = agent.next(id).await.msg else {
        panic!("expected an fs_event");
    };
    assert_eq!(kind, Create);
    let entry = entry.expect("the created file is still there");
    assert_eq!(entry.name, "kept.txt");
    assert!(entry.xattrs.is_empty());
    let Event::FsEvent { kind, entry, .. } = agent.next(id).await.msg else {
        panic!("expected an fs_event");
    };
    assert_eq!(kind, FsEventKind::Write);
    assert_eq!(entry.expect("still there").size, 5);
    cancel(&mut agent, id).await;
    agent.close().await.unwrap();
}
