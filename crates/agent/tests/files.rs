//! File requests against a real agent on a socketpair.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_protocol::{ErrorKind, Event, FileKind, Identity, Request};
use common::Agent;
use std::os::unix::fs::PermissionsExt;

fn write_file(path: &str, create_parents: bool) -> Request {
    Request::WriteFile {
        path: path.to_owned(),
        mode: None,
        create_parents,
        append: false,
        owner: Identity::User,
        xattrs: None,
    }
}

/// Writes `data` in chunks of `chunk` bytes on one id; returns the final event.
async fn write(agent: &mut Agent, request: Request, data: &[u8], chunk: usize) -> Event {
    let id = agent.send(request).await;
    for part in data.chunks(chunk) {
        agent.send_on(id, Request::WriteData, part.to_vec()).await;
    }
    agent.send_on(id, Request::WriteEnd, Vec::new()).await;
    let mut frames = agent.finish(id).await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    frames.pop().unwrap().msg
}

/// Reads a file; returns the bytes or the error kind.
async fn read(
    agent: &mut Agent,
    path: &str,
    offset: u64,
    length: Option<u64>,
) -> Result<Vec<u8>, ErrorKind> {
    let id = agent
        .send(Request::ReadFile {
            path: path.to_owned(),
            offset,
            length,
        })
        .await;
    let mut data = Vec::new();
    loop {
        let frame = agent.next(id).await;
        match frame.msg {
            Event::FileData => {
                assert!(frame.payload.len() <= 1 << 20);
                data.extend_from_slice(&frame.payload);
            }
            Event::FileEnd { bytes } => {
                assert_eq!(bytes, data.len() as u64);
                return Ok(data);
            }
            Event::Error { kind, .. } => return Err(kind),
            other => panic!("{other:?}"),
        }
    }
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
async fn nested_write_with_parents_then_read_ranges() {
    let mut agent = Agent::start();
    let event = write(&mut agent, write_file("a/b/c.txt", true), b"0123456789", 3).await;
    assert_eq!(event, Event::Written { bytes: 10 });
    assert_eq!(
        std::fs::read(agent.home().join("a/b/c.txt")).unwrap(),
        b"0123456789"
    );
    let mode = std::fs::metadata(agent.home().join("a/b/c.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644 & !umask());
    assert_eq!(
        read(&mut agent, "a/b/c.txt", 0, None).await.unwrap(),
        b"0123456789"
    );
    assert_eq!(
        read(&mut agent, "a/b/c.txt", 3, Some(4)).await.unwrap(),
        b"3456"
    );
    assert_eq!(
        read(&mut agent, "a/b/c.txt", 8, Some(100)).await.unwrap(),
        b"89"
    );
    assert_eq!(read(&mut agent, "a/b/c.txt", 50, None).await.unwrap(), b"");
    let absolute = agent.path("a/b/c.txt");
    assert_eq!(read(&mut agent, &absolute, 0, Some(1)).await.unwrap(), b"0");

    // Without create_parents a missing parent is an error.
    let event = write(&mut agent, write_file("x/y.txt", false), b"data", 4).await;
    assert_eq!(error_kind(event), ErrorKind::NotFound);
    agent.close().await.unwrap();
}

/// The umask of this process, read without changing it.
fn umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(line["Umask:".len()..].trim(), 8).unwrap()
}

#[tokio::test]
async fn write_mode_and_append() {
    let mut agent = Agent::start();
    let request = Request::WriteFile {
        path: "run.sh".to_owned(),
        mode: Some(0o755),
        create_parents: false,
        append: false,
        owner: Identity::User,
        xattrs: None,
    };
    assert_eq!(
        write(&mut agent, request, b"#!/bin/sh\necho ran\n", 64).await,
        Event::Written { bytes: 19 }
    );
    let mode = std::fs::metadata(agent.home().join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755);
    let append = Request::WriteFile {
        path: "run.sh".to_owned(),
        mode: None,
        create_parents: false,
        append: true,
        owner: Identity::User,
        xattrs: None,
    };
    assert_eq!(
        write(&mut agent, append, b"echo again\n", 64).await,
        Event::Written { bytes: 11 }
    );
    let out = agent.run(common::command("./run.sh", &[])).await;
    assert_eq!(out.stdout, b"ran\nagain\n");
    // Overwriting truncates.
    assert_eq!(
        write(&mut agent, write_file("run.sh", false), b"x", 64).await,
        Event::Written { bytes: 1 }
    );
    assert_eq!(std::fs::read(agent.home().join("run.sh")).unwrap(), b"x");
    agent.close().await.unwrap();
}

#[tokio::test]
async fn two_concurrent_writes_on_different_ids() {
    let mut agent = Agent::start();
    let first = agent.send(write_file("one", false)).await;
    let second = agent.send(write_file("two", false)).await;
    for n in 0..5 {
        agent
            .send_on(first, Request::WriteData, format!("a{n}").into_bytes())
            .await;
        agent
            .send_on(second, Request::WriteData, format!("b{n}").into_bytes())
            .await;
    }
    agent.send_on(second, Request::WriteEnd, Vec::new()).await;
    agent.send_on(first, Request::WriteEnd, Vec::new()).await;
    assert_eq!(agent.next(first).await.msg, Event::Written { bytes: 10 });
    assert_eq!(agent.next(second).await.msg, Event::Written { bytes: 10 });
    assert_eq!(
        std::fs::read(agent.home().join("one")).unwrap(),
        b"a0a1a2a3a4"
    );
    assert_eq!(
        std::fs::read(agent.home().join("two")).unwrap(),
        b"b0b1b2b3b4"
    );
    agent.close().await.unwrap();
}

#[tokio::test]
async fn large_write_then_read_round_trip() {
    let mut agent = Agent::start();
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    assert_eq!(
        write(&mut agent, write_file("big.bin", false), &data, 3 << 20).await,
        Event::Written {
            bytes: data.len() as u64
        }
    );
    let back = read(&mut agent, "big.bin", 0, None).await.unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "the bytes differ");
    agent.close().await.unwrap();
}

#[tokio::test]
async fn write_errors_end_the_id_once() {
    let mut agent = Agent::start();
    std::fs::create_dir(agent.home().join("dir")).unwrap();
    // Writing onto a directory fails; the rest of the id's frames are ignored.
    let id = agent.send(write_file("dir", false)).await;
    agent.send_on(id, Request::WriteData, b"x".to_vec()).await;
    agent.send_on(id, Request::WriteEnd, Vec::new()).await;
    assert_eq!(
        error_kind(agent.next(id).await.msg),
        ErrorKind::IsADirectory
    );
    // A bad path is refused at once, and its frames are ignored too.
    let id = agent.send(write_file("bad\0path", false)).await;
    agent.send_on(id, Request::WriteData, b"x".to_vec()).await;
    agent.send_on(id, Request::WriteEnd, Vec::new()).await;
    assert_eq!(
        error_kind(agent.next(id).await.msg),
        ErrorKind::InvalidArgument
    );
    // No stray events: the next answer on the stream is the pong.
    assert_eq!(agent.call(Request::Ping).await, Event::Pong);
    // Data or end for an id with no open write.
    assert_eq!(
        error_kind(agent.call(Request::WriteData).await),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        error_kind(agent.call(Request::WriteEnd).await),
        ErrorKind::InvalidArgument
    );
    agent.close().await.unwrap();
}

#[tokio::test]
async fn read_errors() {
    let mut agent = Agent::start();
    std::fs::create_dir(agent.home().join("dir")).unwrap();
    assert_eq!(
        read(&mut agent, "missing", 0, None).await,
        Err(ErrorKind::NotFound)
    );
    assert_eq!(
        read(&mut agent, "dir", 0, None).await,
        Err(ErrorKind::IsADirectory)
    );
    assert_eq!(
        read(&mut agent, "nul\0", 0, None).await,
        Err(ErrorKind::InvalidArgument)
    );
    agent.close().await.unwrap();
}

#[tokio::test]
async fn stat_and_symlinks() {
    let mut agent = Agent::start();
    let home = agent.home().to_path_buf();
    std::fs::write(home.join("f"), b"hello").unwrap();
    std::os::unix::fs::symlink("f", home.join("link")).unwrap();
    match agent
        .call(Request::Stat {
            path: "f".to_owned(),
            xattrs: None,
        })
        .await
    {
        Event::Stat(info) => {
            assert_eq!(info.kind, FileKind::File);
            assert_eq!(info.size, 5);
            assert_eq!(info.name, "f");
            assert_eq!(info.path, home.join("f").to_str().unwrap());
            assert_eq!(info.uid, rustix::process::getuid().as_raw());
            assert!(info.mtime_ns > 1_500_000_000_000_000_000);
            assert_eq!(info.symlink_target, None);
        }
        other => panic!("{other:?}"),
    }
    match agent
        .call(Request::Stat {
            path: "link".to_owned(),
            xattrs: None,
        })
        .await
    {
        Event::Stat(info) => {
            assert_eq!(info.kind, FileKind::Symlink);
            assert_eq!(info.symlink_target.as_deref(), Some("f"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        error_kind(
            agent
                .call(Request::Stat {
                    path: "missing".to_owned(),
                    xattrs: None,
                })
                .await
        ),
        ErrorKind::NotFound
    );
    agent.close().await.unwrap();
}

#[tokio::test]
async fn list_dir_by_depth() {
    let mut agent = Agent::start();
    let home = agent.home().to_path_buf();
    std::fs::create_dir_all(home.join("top/sub/deep")).unwrap();
    std::fs::write(home.join("top/b.txt"), b"b").unwrap();
    std::fs::write(home.join("top/sub/a.txt"), b"a").unwrap();
    std::fs::write(home.join("top/sub/deep/z.txt"), b"z").unwrap();
    std::fs::create_dir(home.join("elsewhere")).unwrap();
    std::fs::write(home.join("elsewhere/hidden"), b"h").unwrap();
    std::os::unix::fs::symlink(home.join("elsewhere"), home.join("top/link")).unwrap();

    let names = |event: Event| match event {
        Event::Entries { entries } => entries
            .into_iter()
            .map(|e| {
                e.path
                    .strip_prefix(home.join("top").to_str().unwrap())
                    .unwrap()
                    .to_owned()
            })
            .collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    let one = agent
        .call(Request::ListDir {
            path: "top".to_owned(),
            depth: 1,
        })
        .await;
    assert_eq!(names(one), vec!["/b.txt", "/link", "/sub"]);
    let two = agent
        .call(Request::ListDir {
            path: "top".to_owned(),
            depth: 2,
        })
        .await;
    assert_eq!(
        names(two),
        vec!["/b.txt", "/link", "/sub", "/sub/a.txt", "/sub/deep"]
    );
    for (path, depth, kind) in [
        ("missing", 1, ErrorKind::NotFound),
        ("top/b.txt", 1, ErrorKind::NotADirectory),
        ("top", 0, ErrorKind::InvalidArgument),
    ] {
        let event = agent
            .call(Request::ListDir {
                path: path.to_owned(),
                depth,
            })
            .await;
        assert_eq!(error_kind(event), kind, "{path}");
    }
    agent.close().await.unwrap();
}

/// A directory of `n` empty files `f000000`… under the home.
fn many_files(agent: &Agent, dir: &str, n: usize) -> std::path::PathBuf {
    let dir = agent.home().join(dir);
    std::fs::create_dir(&dir).unwrap();
    for i in 0..n {
        std::fs::File::create(dir.join(format!("f{i:06}"))).unwrap();
    }
    dir
}

#[tokio::test]
async fn a_directory_of_100000_entries_lists_in_pages() {
    let mut agent = Agent::start();
    let dir = many_files(&agent, "big", 100_000);
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/inner"), b"x").unwrap();
    // One answer cannot hold it.
    let whole = agent
        .call(Request::ListDir {
            path: "big".to_owned(),
            depth: 1,
        })
        .await;
    assert_eq!(error_kind(whole), ErrorKind::InvalidArgument);

    let mut paths: Vec<String> = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let id = agent
            .send(Request::ListDirPage {
                path: "big".to_owned(),
                depth: 2,
                after: after.clone(),
                limit: airlock_protocol::MAX_LIST_PAGE,
            })
            .await;
        let frames = agent.finish(id).await;
        assert_eq!(frames.len(), 1, "a page is one final event");
        let frame = &frames[0];
        assert!(
            airlock_protocol::encode(frame).unwrap().len() <= airlock_protocol::MAX_HEADER_BYTES
        );
        let Event::EntriesPage { entries, next } = frame.msg.clone() else {
            panic!("{:?}", frame.msg);
        };
        assert!(!entries.is_empty());
        assert!(entries.len() <= airlock_protocol::MAX_LIST_PAGE as usize);
        paths.extend(entries.into_iter().map(|e| e.path));
        pages += 1;
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert!(pages >= 10, "{pages} pages");
    assert_eq!(
        paths.len(),
        100_002,
        "every entry once: the files, sub and sub/inner"
    );
    assert!(
        paths.windows(2).all(|pair| pair[0] < pair[1]),
        "sorted across pages, none twice"
    );
    let big = dir.to_str().unwrap();
    assert_eq!(paths[0], format!("{big}/f000000"));
    assert_eq!(paths[99_999], format!("{big}/f099999"));
    assert_eq!(paths[100_001], format!("{big}/sub/inner"));

    // Bad pages change nothing and say why.
    for (depth, after, limit) in [
        (1, Some("not a token!".to_owned()), 10),
        (1, None, 0),
        (0, None, 10),
        (33, None, 10),
    ] {
        let event = agent
            .call(Request::ListDirPage {
                path: "big".to_owned(),
                depth,
                after,
                limit,
            })
            .await;
        assert_eq!(error_kind(event), ErrorKind::InvalidArgument);
    }
    let missing = agent
        .call(Request::ListDirPage {
            path: "nowhere".to_owned(),
            depth: 1,
            after: None,
            limit: 10,
        })
        .await;
    assert_eq!(error_kind(missing), ErrorKind::NotFound);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn a_directory_of_100000_entries_lists_as_a_stream() {
    let mut agent = Agent::start();
    let dir = many_files(&agent, "big", 100_000);
    let id = agent
        .send(Request::ListDirStream {
            path: "big".to_owned(),
            depth: 1,
            limit: 1_000_000,
            xattrs: None,
        })
        .await;
    let mut names = std::collections::HashSet::new();
    let mut chunks = 0;
    let end = loop {
        let frame = agent.next(id).await;
        match frame.msg {
            Event::EntriesChunk { ref entries } => {
                // Each chunk is small: the agent holds one at a time.
                assert!(airlock_protocol::encode(&frame).unwrap().len() <= 512 << 10);
                for entry in entries {
                    assert!(names.insert(entry.name.clone()), "{} twice", entry.name);
                }
                chunks += 1;
            }
            other => break other,
        }
    };
    assert_eq!(
        end,
        Event::EntriesEnd {
            count: 100_000,
            truncated: false
        }
    );
    assert_eq!(names.len(), 100_000);
    assert!(chunks >= 10, "{chunks} chunks");

    // A limit stops the walk and says there is more.
    let id = agent
        .send(Request::ListDirStream {
            path: dir.to_str().unwrap().to_owned(),
            depth: 1,
            limit: 4321,
            xattrs: None,
        })
        .await;
    let mut count = 0;
    let end = loop {
        match agent.next(id).await.msg {
            Event::EntriesChunk { entries } => count += entries.len(),
            other => break other,
        }
    };
    assert_eq!(count, 4321);
    assert_eq!(
        end,
        Event::EntriesEnd {
            count: 4321,
            truncated: true
        }
    );
    let not_dir = agent
        .call(Request::ListDirStream {
            path: "big/f000001".to_owned(),
            depth: 1,
            limit: 10,
            xattrs: None,
        })
        .await;
    assert_eq!(error_kind(not_dir), ErrorKind::NotADirectory);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn make_dir_remove_and_rename() {
    let mut agent = Agent::start();
    let home = agent.home().to_path_buf();
    let mkdir = |path: &str, parents: bool| Request::MakeDir {
        path: path.to_owned(),
        parents,
        mode: None,
        owner: Identity::User,
    };
    assert_eq!(agent.call(mkdir("d", false)).await, Event::Done);
    assert!(home.join("d").is_dir());
    assert_eq!(
        error_kind(agent.call(mkdir("d", false)).await),
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        error_kind(agent.call(mkdir("p/q/r", false)).await),
        ErrorKind::NotFound
    );
    assert_eq!(agent.call(mkdir("p/q/r", true)).await, Event::Done);
    assert!(home.join("p/q/r").is_dir());
    let with_mode = Request::MakeDir {
        path: "private".to_owned(),
        parents: false,
        mode: Some(0o700),
        owner: Identity::User,
    };
    assert_eq!(agent.call(with_mode).await, Event::Done);
    assert_eq!(
        std::fs::metadata(home.join("private"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o700
    );

    std::fs::write(home.join("p/q/r/file"), b"x").unwrap();
    let remove = |path: &str, recursive: bool| Request::Remove {
        path: path.to_owned(),
        recursive,
    };
    assert_eq!(
        error_kind(agent.call(remove("p", false)).await),
        ErrorKind::DirectoryNotEmpty
    );
    assert_eq!(agent.call(remove("p", true)).await, Event::Done);
    assert!(!home.join("p").exists());
    assert_eq!(
        error_kind(agent.call(remove("p", true)).await),
        ErrorKind::NotFound
    );
    assert_eq!(agent.call(remove("d", false)).await, Event::Done);

    // A symlink to a directory is removed, not what it points to.
    std::fs::create_dir(home.join("kept")).unwrap();
    std::fs::write(home.join("kept/inside"), b"i").unwrap();
    std::os::unix::fs::symlink(home.join("kept"), home.join("ln")).unwrap();
    assert_eq!(agent.call(remove("ln", true)).await, Event::Done);
    assert!(home.join("kept/inside").exists());

    std::fs::write(home.join("old"), b"content").unwrap();
    std::fs::write(home.join("target"), b"replaced").unwrap();
    let rename = |from: &str, to: &str| Request::Rename {
        from: from.to_owned(),
        to: to.to_owned(),
    };
    assert_eq!(agent.call(rename("old", "target")).await, Event::Done);
    assert!(!home.join("old").exists());
    assert_eq!(std::fs::read(home.join("target")).unwrap(), b"content");
    assert_eq!(
        error_kind(agent.call(rename("old", "new")).await),
        ErrorKind::NotFound
    );
    assert_eq!(
        error_kind(agent.call(rename("target", "kept")).await),
        ErrorKind::IsADirectory
    );
    agent.close().await.unwrap();
}

#[tokio::test]
async fn file_work_runs_beside_process_output() {
    let mut agent = Agent::start();
    // A chatty process and a file round trip at the same time.
    let spawn = agent
        .send(Request::Spawn(common::sh(
            "i=0; while [ $i -lt 200 ]; do echo line $i; i=$((i+1)); done",
        )))
        .await;
    let data = vec![7u8; 3 << 20];
    assert_eq!(
        write(&mut agent, write_file("side.bin", false), &data, 1 << 20).await,
        Event::Written {
            bytes: data.len() as u64
        }
    );
    let out = agent.collect(spawn).await;
    assert_eq!(out.stdout.iter().filter(|b| **b == b'\n').count(), 200);
    assert_eq!(read(&mut agent, "side.bin", 0, None).await.unwrap(), data);
    agent.close().await.unwrap();
}

fn tagged_write(path: &str, attrs: &[(&str, &str)]) -> Request {
    Request::WriteFile {
        path: path.to_owned(),
        mode: None,
        create_parents: true,
        append: false,
        owner: Identity::User,
        xattrs: Some(airlock_protocol::Xattrs {
            prefix: "user.t.".into(),
            attrs: attrs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }),
    }
}

async fn xattrs_of(agent: &mut Agent, path: &str) -> Vec<(String, String)> {
    match agent
        .call(Request::Stat {
            path: path.to_owned(),
            xattrs: Some("user.t.".into()),
        })
        .await
    {
        Event::Stat(info) => info.xattrs.into_iter().collect(),
        other => panic!("{other:?}"),
    }
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn writes_leave_attributes_that_stat_lists_and_renames_keep() {
    let mut agent = Agent::start();
    let home = agent.home().to_path_buf();
    let attrs = [("user.t.a", "1"), ("user.t.b", "two words")];
    let event = write(&mut agent, tagged_write("d/f", &attrs), b"data", 2).await;
    assert_eq!(event, Event::Written { bytes: 4 });
    assert_eq!(std::fs::read(home.join("d/f")).unwrap(), b"data");
    assert_eq!(xattrs_of(&mut agent, "d/f").await, pairs(&attrs));
    // A stat that asks for none reports none.
    match agent
        .call(Request::Stat {
            path: "d/f".into(),
            xattrs: None,
        })
        .await
    {
        Event::Stat(info) => assert!(info.xattrs.is_empty()),
        other => panic!("{other:?}"),
    }
    // Attributes outside the prefix are left alone; an overwrite with
    // fewer replaces the set, one without any clears it.
    rustix::fs::setxattr(
        home.join("d/f"),
        "user.other",
        b"x",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let event = write(
        &mut agent,
        tagged_write("d/f", &[("user.t.b", "3")]),
        b"new",
        3,
    )
    .await;
    assert_eq!(event, Event::Written { bytes: 3 });
    assert_eq!(std::fs::read(home.join("d/f")).unwrap(), b"new");
    assert_eq!(
        xattrs_of(&mut agent, "d/f").await,
        pairs(&[("user.t.b", "3")])
    );
    // Renamed, the file keeps them.
    let renamed = agent
        .call(Request::Rename {
            from: "d/f".into(),
            to: "d/g".into(),
        })
        .await;
    assert_eq!(renamed, Event::Done);
    assert_eq!(
        xattrs_of(&mut agent, "d/g").await,
        pairs(&[("user.t.b", "3")])
    );
    let event = write(&mut agent, tagged_write("d/g", &[]), b"", 1).await;
    assert_eq!(event, Event::Written { bytes: 0 });
    assert!(xattrs_of(&mut agent, "d/g").await.is_empty());
    assert_eq!(
        rustix::fs::getxattr(home.join("d/g"), "user.other", &mut [0u8; 8][..]).unwrap(),
        1
    );

    // A streamed listing reports them per entry.
    let event = write(
        &mut agent,
        tagged_write("d/h", &[("user.t.k", "v")]),
        b"h",
        1,
    )
    .await;
    assert_eq!(event, Event::Written { bytes: 1 });
    let id = agent
        .send(Request::ListDirStream {
            path: "d".into(),
            depth: 1,
            limit: 10,
            xattrs: Some("user.t.".into()),
        })
        .await;
    let mut listed = Vec::new();
    loop {
        match agent.next(id).await.msg {
            Event::EntriesChunk { entries } => listed.extend(entries),
            Event::EntriesEnd { count, .. } => {
                assert_eq!(count, 2);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(listed[0].xattrs.is_empty(), "{listed:?}");
    assert_eq!(
        listed[1].xattrs.get("user.t.k").map(String::as_str),
        Some("v")
    );
    agent.close().await.unwrap();
}

#[tokio::test]
async fn attribute_requests_outside_user_are_refused_before_anything_changes() {
    let mut agent = Agent::start();
    std::fs::write(agent.home().join("f"), b"old").unwrap();
    let mut bad = tagged_write("f", &[("user.t.a", "1")]);
    if let Request::WriteFile {
        xattrs: Some(set), ..
    } = &mut bad
    {
        set.prefix = "trusted.".into();
        set.attrs.clear();
        set.attrs.insert("trusted.a".into(), "1".into());
    }
    let event = write(&mut agent, bad, b"new", 3).await;
    assert_eq!(error_kind(event), ErrorKind::InvalidArgument);
    let event = write(
        &mut agent,
        tagged_write("f", &[("user.q.a", "1")]),
        b"new",
        3,
    )
    .await;
    assert_eq!(error_kind(event), ErrorKind::InvalidArgument);
    assert_eq!(std::fs::read(agent.home().join("f")).unwrap(), b"old");
    let stat = agent
        .call(Request::Stat {
            path: "f".into(),
            xattrs: Some("security.".into()),
        })
        .await;
    assert_eq!(error_kind(stat), ErrorKind::InvalidArgument);
    agent.close().await.unwrap();
}

#[tokio::test]
async fn a_filesystem_without_user_attributes_refuses_a_tagged_write_and_keeps_the_file() {
    // /proc has no user attributes: a file there stands in for such a
    // filesystem; /dev/shm (tmpfs) has them since Linux 6.6.
    let mut agent = Agent::start();
    let event = write(
        &mut agent,
        tagged_write("/proc/self/comm", &[("user.t.a", "1")]),
        b"renamed",
        7,
    )
    .await;
    assert_eq!(error_kind(event), ErrorKind::Unsupported);
    // Clearing where there is nothing to clear is no error.
    let comm = std::fs::read("/proc/self/comm").unwrap();
    let event = write(&mut agent, tagged_write("/proc/self/comm", &[]), &comm, 64).await;
    assert!(matches!(event, Event::Written { .. }), "{event:?}");
    agent.close().await.unwrap();
}
