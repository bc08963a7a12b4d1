//! Framing round trips and the schema snapshot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_protocol::*;
use std::collections::BTreeMap;

#[tokio::test]
async fn frames_round_trip_with_payload() {
    let spawn = Request::Spawn(SpawnRequest {
        cmd: "echo".into(),
        args: vec!["hi".into()],
        env: BTreeMap::from([("PATH".into(), "/usr/bin".into())]),
        cwd: None,
        user: Identity::User,
        stdin: true,
        pty: None,
        timeout_ms: Some(10),
        output_limit: 1024,
        limits: ProcessLimits {
            nofile: 64,
            fsize_bytes: 1 << 20,
        },
    });
    let frames = vec![
        Frame::new(1, spawn),
        Frame::with_payload(2, Request::WriteStdin { pid: 7 }, b"data\0\xff".to_vec()),
        Frame::new(3, Request::Ping),
    ];
    let (mut a, mut b) = tokio::io::duplex(1 << 16);
    for frame in &frames {
        write_frame(&mut a, frame).await.unwrap();
    }
    drop(a);
    for expected in &frames {
        let got: Frame<Request> = read_frame(&mut b).await.unwrap();
        assert_eq!(&got, expected);
    }
    assert!(matches!(
        read_frame::<_, Request>(&mut b).await,
        Err(FrameError::Closed)
    ));
}

#[tokio::test]
async fn oversized_lengths_are_refused_before_allocating() {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&u32::MAX.to_be_bytes());
    bytes.extend_from_slice(&0u32.to_be_bytes());
    let mut reader = &bytes[..];
    assert!(matches!(
        read_frame::<_, Request>(&mut reader).await,
        Err(FrameError::HeaderTooLarge(_))
    ));
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&2u32.to_be_bytes());
    bytes.extend_from_slice(&u32::MAX.to_be_bytes());
    let mut reader = &bytes[..];
    assert!(matches!(
        read_frame::<_, Request>(&mut reader).await,
        Err(FrameError::PayloadTooLarge(_))
    ));
}

#[tokio::test]
async fn garbage_headers_are_decode_errors() {
    let header = br#"{"id":1,"msg":{"op":"format_disk"}}"#;
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&(header.len() as u32).to_be_bytes());
    bytes.extend_from_slice(&0u32.to_be_bytes());
    bytes.extend_from_slice(header);
    let mut reader = &bytes[..];
    assert!(matches!(
        read_frame::<_, Request>(&mut reader).await,
        Err(FrameError::Decode(_))
    ));
}

#[test]
fn final_events() {
    assert!(!Event::Stdout.is_final());
    assert!(!Event::Started { pid: 1 }.is_final());
    assert!(Event::Done.is_final());
    assert!(Event::Pong.is_final());
    assert!(!Event::FsEvent {
        kind: FsEventKind::Write,
        path: "/a".into(),
        entry: None,
    }
    .is_final());
}

#[tokio::test]
async fn watch_and_cancel_round_trip() {
    let cases = [
        (
            Request::Watch {
                path: "/home/user/src".into(),
                recursive: true,
                entries: false,
                xattrs: None,
                local_only: false,
            },
            r#"{"op":"watch","path":"/home/user/src","recursive":true}"#,
        ),
        (
            Request::Cancel { target: 7 },
            r#"{"op":"cancel","target":7}"#,
        ),
    ];
    for (request, json) in &cases {
        assert_eq!(serde_json::to_string(request).unwrap(), *json);
        assert_eq!(&serde_json::from_str::<Request>(json).unwrap(), request);
    }
    // `recursive` defaults to false; unknown fields are refused.
    assert_eq!(
        serde_json::from_str::<Request>(r#"{"op":"watch","path":"p"}"#).unwrap(),
        Request::Watch {
            path: "p".into(),
            recursive: false,
            entries: false,
            xattrs: None,
            local_only: false,
        }
    );
    assert!(serde_json::from_str::<Request>(r#"{"op":"cancel","target":1,"x":0}"#).is_err());

    let kinds = [
        (FsEventKind::Create, "create"),
        (FsEventKind::Write, "write"),
        (FsEventKind::Remove, "remove"),
        (FsEventKind::Rename, "rename"),
        (FsEventKind::Chmod, "chmod"),
    ];
    for (kind, name) in kinds {
        let event = Event::FsEvent {
            kind,
            path: "/home/user/a.txt".into(),
            entry: None,
        };
        let json = format!(r#"{{"event":"fs_event","kind":"{name}","path":"/home/user/a.txt"}}"#);
        assert_eq!(serde_json::to_string(&event).unwrap(), json);
        assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), event);
    }

    // Through the framing, as the header JSON on the wire.
    let frames = vec![
        Frame::new(4, cases[0].0.clone()),
        Frame::new(5, Request::Cancel { target: 4 }),
    ];
    let (mut a, mut b) = tokio::io::duplex(1 << 16);
    for frame in &frames {
        write_frame(&mut a, frame).await.unwrap();
    }
    drop(a);
    for expected in &frames {
        let got: Frame<Request> = read_frame(&mut b).await.unwrap();
        assert_eq!(&got, expected);
    }
    let encoded = encode(&Frame::new(
        4,
        Event::FsEvent {
            kind: FsEventKind::Rename,
            path: "/x".into(),
            entry: None,
        },
    ))
    .unwrap();
    assert_eq!(
        &encoded[8..],
        br#"{"id":4,"msg":{"event":"fs_event","kind":"rename","path":"/x"}}"#
    );
}

/// Terminals are additions to version 1: a spawn without `pty` is written
/// and read exactly as before the field existed (an older agent, whose
/// `spawn` refuses unknown fields, still takes it), and the new request and
/// event have their own names.
#[test]
fn terminals_are_compatible_additions() {
    let spawn = SpawnRequest {
        cmd: "sh".into(),
        args: vec![],
        env: BTreeMap::new(),
        cwd: None,
        user: Identity::User,
        stdin: false,
        pty: None,
        timeout_ms: None,
        output_limit: 10,
        limits: ProcessLimits {
            nofile: 64,
            fsize_bytes: 1,
        },
    };
    let old = r#"{"op":"spawn","cmd":"sh","args":[],"env":{},"cwd":null,"user":"user","stdin":false,"timeout_ms":null,"output_limit":10,"limits":{"nofile":64,"fsize_bytes":1}}"#;
    assert_eq!(
        serde_json::to_string(&Request::Spawn(spawn.clone())).unwrap(),
        old
    );
    assert_eq!(
        serde_json::from_str::<Request>(old).unwrap(),
        Request::Spawn(spawn.clone())
    );

    let with_pty = Request::Spawn(SpawnRequest {
        pty: Some(PtySize { cols: 80, rows: 24 }),
        ..spawn
    });
    let json = serde_json::to_string(&with_pty).unwrap();
    assert!(json.contains(r#""pty":{"cols":80,"rows":24}"#), "{json}");
    assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), with_pty);
    assert!(serde_json::from_str::<PtySize>(r#"{"cols":1,"rows":2,"x":3}"#).is_err());

    let resize = Request::Resize {
        pid: 7,
        cols: 132,
        rows: 43,
    };
    let json = r#"{"op":"resize","pid":7,"cols":132,"rows":43}"#;
    assert_eq!(serde_json::to_string(&resize).unwrap(), json);
    assert_eq!(serde_json::from_str::<Request>(json).unwrap(), resize);
    assert_eq!(
        serde_json::to_string(&Event::Pty).unwrap(),
        r#"{"event":"pty"}"#
    );
    assert!(!Event::Pty.is_final());
}

#[test]
fn shell_exit_codes() {
    let mut status = ExitStatus {
        pid: 1,
        code: Some(3),
        signal: None,
        oom: false,
        timed_out: false,
        stdout_truncated: false,
        stderr_truncated: false,
    };
    assert_eq!(status.shell_code(), 3);
    status.code = None;
    status.signal = Some(9);
    assert_eq!(status.shell_code(), 137);
}

/// The checked-in schema is the contract with agents already deployed in
/// templates and guests. Changing the types must change this file in the same
/// commit (regenerate with `AIRLOCK_UPDATE_SCHEMA=1 cargo test -p airlock-protocol`),
/// and an incompatible change must bump `PROTOCOL_VERSION`.
#[test]
fn schema_snapshot_matches() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "schema/v{}.json",
        airlock_protocol::PROTOCOL_VERSION
    ));
    let current = serde_json::to_string_pretty(&schema()).unwrap() + "\n";
    if std::env::var_os("AIRLOCK_UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &current).unwrap();
    }
    let stored = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        stored == current,
        "the agent protocol schema changed; review the change, bump PROTOCOL_VERSION if it is \
         incompatible, and regenerate {} with AIRLOCK_UPDATE_SCHEMA=1",
        path.display()
    );
}

#[tokio::test]
async fn raw_frames_are_relayed_byte_for_byte() {
    let frame = Frame::with_payload(9, Request::WriteStdin { pid: 3 }, vec![1, 2, 3]);
    let encoded = encode(&frame).unwrap();
    let mut reader = &encoded[..];
    assert_eq!(read_frame_bytes(&mut reader).await.unwrap(), encoded);
    assert!(matches!(
        read_frame_bytes(&mut reader).await,
        Err(FrameError::Closed)
    ));
    let mut oversized = Vec::new();
    oversized.extend_from_slice(&u32::MAX.to_be_bytes());
    oversized.extend_from_slice(&0u32.to_be_bytes());
    let mut reader = &oversized[..];
    assert!(matches!(
        read_frame_bytes(&mut reader).await,
        Err(FrameError::HeaderTooLarge(_))
    ));
}

/// What version 4 added is left out unless used, so a host speaks to
/// older agents (which refuse unknown fields) as before, and an agent
/// that was asked for none answers as before.
#[test]
fn version_4_additions_are_left_out_unless_used() {
    let plain = [
        (
            Request::Stat {
                path: "/a".into(),
                xattrs: None,
            },
            r#"{"op":"stat","path":"/a"}"#,
        ),
        (
            Request::ListDirStream {
                path: "/a".into(),
                depth: 1,
                limit: 5,
                xattrs: None,
            },
            r#"{"op":"list_dir_stream","path":"/a","depth":1,"limit":5}"#,
        ),
        (
            Request::WriteFile {
                path: "/a".into(),
                mode: None,
                create_parents: false,
                append: false,
                owner: airlock_protocol::Identity::User,
                xattrs: None,
            },
            r#"{"op":"write_file","path":"/a","mode":null,"create_parents":false,"append":false,"owner":"user"}"#,
        ),
    ];
    for (request, json) in &plain {
        assert_eq!(serde_json::to_string(request).unwrap(), *json);
        assert_eq!(&serde_json::from_str::<Request>(json).unwrap(), request);
    }
    let info = airlock_protocol::FileInfo {
        path: "/a".into(),
        name: "a".into(),
        kind: airlock_protocol::FileKind::File,
        size: 1,
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime_ns: 0,
        symlink_target: None,
        xattrs: Default::default(),
    };
    assert!(!serde_json::to_string(&info).unwrap().contains("xattrs"));

    let used = Request::Watch {
        path: "/a".into(),
        recursive: false,
        entries: true,
        xattrs: Some("user.e2b.".into()),
        local_only: true,
    };
    let json = serde_json::to_string(&used).unwrap();
    assert_eq!(
        json,
        r#"{"op":"watch","path":"/a","recursive":false,"entries":true,"xattrs":"user.e2b.","local_only":true}"#
    );
    assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), used);
    let mut tagged = info.clone();
    tagged.xattrs.insert("user.e2b.k".into(), "v".into());
    let event = Event::FsEvent {
        kind: FsEventKind::Create,
        path: "/a".into(),
        entry: Some(tagged),
    };
    let json = serde_json::to_string(&event).unwrap();
    assert!(json.contains(r#""xattrs":{"user.e2b.k":"v"}"#), "{json}");
    assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), event);
    let write = r#"{"op":"write_file","path":"/a","xattrs":{"prefix":"user.e2b.","attrs":{"user.e2b.k":"v"}}}"#;
    match serde_json::from_str::<Request>(write).unwrap() {
        Request::WriteFile {
            xattrs: Some(set), ..
        } => assert_eq!(set.attrs["user.e2b.k"], "v"),
        other => panic!("{other:?}"),
    }
}
