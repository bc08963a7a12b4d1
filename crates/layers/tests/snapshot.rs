//! `snapshot::write_layer` against uppers built here by hand (hostile
//! nodes included) and against the upper of a real overlayfs mount: what
//! it writes, that it writes the same bytes twice, that the unpacker makes
//! the upper back from it, and what it refuses. Needs root (chown, mknod,
//! mount).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_layers::snapshot::{
    write_layer, write_layer_eliding, BadName, Elide, IdMap, SnapshotError, SnapshotLimits,
    Snapshotted,
};
use airlock_layers::unpack::{unpack_layer, Limit, UnpackLimits};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, XattrFlags, CWD};
use rustix::process::{Gid, Uid};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the snapshot tests need root (they chown nodes, mknod whiteouts and mount overlayfs): run them as root"
    );
}

/// The host ids of the sandbox's root in the hand-made uppers.
const BASE: u32 = 200_000;
const IDS: IdMap = IdMap {
    host_base_uid: BASE,
    host_base_gid: BASE,
    count: 65536,
};
/// A fixed modification time for the hand-made nodes.
const MTIME: i64 = 1_700_000_000;

fn chown(path: &Path, uid: u32, gid: u32) {
    rustix::fs::chownat(
        CWD,
        path,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

fn touch(path: &Path) {
    let at = rustix::fs::Timespec {
        tv_sec: MTIME,
        tv_nsec: 0,
    };
    let times = rustix::fs::Timestamps {
        last_access: at,
        last_modification: at,
    };
    rustix::fs::utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW).unwrap();
}

fn file(path: &Path, data: &[u8], mode: u32, uid: u32, gid: u32) {
    fs::write(path, data).unwrap();
    chown(path, uid, gid);
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn dir(path: &Path, mode: u32, uid: u32, gid: u32) {
    fs::create_dir(path).unwrap();
    chown(path, uid, gid);
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn mknod(path: &Path, kind: FileType, dev: (u32, u32)) {
    rustix::fs::mknodat(
        CWD,
        path,
        kind,
        Mode::from_raw_mode(0o600),
        rustix::fs::makedev(dev.0, dev.1),
    )
    .unwrap();
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, XattrFlags::empty()).unwrap();
}

/// A hand-made upper of every kind of node a sandbox can leave, in a
/// tempdir whose `upper` it is (the rest of the tempdir is free).
fn hostile_upper() -> (tempfile::TempDir, PathBuf) {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    let at = |p: &str| upper.join(p);
    dir(&upper, 0o755, BASE, BASE);
    file(&at("a.txt"), b"hello", 0o644, BASE, BASE);
    mknod(&at("dev"), FileType::CharacterDevice, (1, 3));
    std::os::unix::fs::symlink("/etc", at("evil")).unwrap();
    chown(&at("evil"), BASE, BASE);
    mknod(&at("fifo"), FileType::Fifo, (0, 0));
    chown(&at("fifo"), BASE + 1000, BASE + 1000);
    fs::set_permissions(at("fifo"), fs::Permissions::from_mode(0o640)).unwrap();
    // overlayfs's whiteout of a lower `gone`.
    mknod(&at("gone"), FileType::CharacterDevice, (0, 0));
    dir(&at("home"), 0o755, BASE, BASE);
    dir(&at("home/user"), 0o750, BASE + 1000, BASE + 1000);
    file(
        &at("home/user/notes"),
        &vec![b'n'; 70_000],
        0o600,
        BASE + 1000,
        BASE + 1000,
    );
    file(&at("link1"), b"linked", 0o644, BASE, BASE);
    fs::hard_link(at("link1"), at("link2")).unwrap();
    dir(&at("opaque"), 0o755, BASE, BASE);
    set_xattr(&at("opaque"), "user.overlay.opaque", b"y");
    file(&at("opaque/kept"), b"k", 0o644, BASE, BASE);
    // A node of host root: nothing of a sandbox's is.
    file(&at("root-owned"), b"r", 0o644, 0, 0);
    std::os::unix::fs::symlink("/etc/shadow", at("shadow")).unwrap();
    chown(&at("shadow"), BASE, BASE);
    let _socket = std::os::unix::net::UnixListener::bind(at("sock")).unwrap();
    file(&at("suid"), b"#!/bin/sh\n", 0o4755, BASE, BASE);
    // chown clears set-id bits: set them again.
    fs::set_permissions(at("suid"), fs::Permissions::from_mode(0o6755)).unwrap();
    std::os::unix::fs::symlink("../../..", at("up")).unwrap();
    chown(&at("up"), BASE, BASE);
    for p in [
        "a.txt",
        "evil",
        "fifo",
        "home/user/notes",
        "home/user",
        "home",
        "link1",
        "opaque/kept",
        "opaque",
        "root-owned",
        "shadow",
        "suid",
        "up",
        "",
    ] {
        touch(&at(p));
    }
    (tmp, upper)
}

fn snapshot(upper: &Path) -> (Vec<u8>, Snapshotted) {
    let mut out = Vec::new();
    let done = write_layer(upper, &IDS, &mut out, &SnapshotLimits::default()).unwrap();
    (out, done)
}

/// One tar entry as the tests look at it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: String,
    kind: char,
    mode: u32,
    uid: u64,
    gid: u64,
    size: u64,
    link: Option<String>,
}

fn entry(name: &str, kind: char, mode: u32, ids: u64, size: u64, link: Option<&str>) -> Entry {
    Entry {
        name: name.to_owned(),
        kind,
        mode,
        uid: ids,
        gid: ids,
        size,
        link: link.map(str::to_owned),
    }
}

fn entries(layer: &[u8]) -> Vec<Entry> {
    let mut archive = tar::Archive::new(layer);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let h = e.header();
            assert_eq!(h.username_bytes(), Some(&b""[..]), "no user names");
            assert_eq!(h.groupname_bytes(), Some(&b""[..]), "no group names");
            Entry {
                name: String::from_utf8(e.path_bytes().into_owned()).unwrap(),
                kind: char::from(h.entry_type().as_byte()),
                mode: h.mode().unwrap(),
                uid: h.uid().unwrap(),
                gid: h.gid().unwrap(),
                size: h.size().unwrap(),
                link: e
                    .link_name_bytes()
                    .map(|l| String::from_utf8(l.into_owned()).unwrap()),
            }
        })
        .collect()
}

#[test]
fn the_layer_has_the_uppers_entries_in_order_with_whiteouts_and_markers() {
    let (_tmp, upper) = hostile_upper();
    let (layer, done) = snapshot(&upper);
    let got = entries(&layer);
    let nobody = 65534;
    let expected = vec![
        entry("./", '5', 0o755, 0, 0, None),
        entry("a.txt", '0', 0o644, 0, 5, None),
        entry("evil", '2', 0o777, 0, 0, Some("/etc")),
        entry("fifo", '6', 0o640, 1000, 0, None),
        entry(".wh.gone", '0', 0o644, 0, 0, None),
        entry("home/", '5', 0o755, 0, 0, None),
        entry("home/user/", '5', 0o750, 1000, 0, None),
        entry("home/user/notes", '0', 0o600, 1000, 70_000, None),
        entry("link1", '0', 0o644, 0, 6, None),
        entry("link2", '1', 0o644, 0, 0, Some("link1")),
        entry("opaque/", '5', 0o755, 0, 0, None),
        entry("opaque/.wh..wh..opq", '0', 0o644, 0, 0, None),
        entry("opaque/kept", '0', 0o644, 0, 1, None),
        entry("root-owned", '0', 0o644, nobody, 1, None),
        entry("shadow", '2', 0o777, 0, 0, Some("/etc/shadow")),
        entry("suid", '0', 0o755, 0, 10, None),
        entry("up", '2', 0o777, 0, 0, Some("../../..")),
    ];
    assert_eq!(got, expected);
    // Times are the files' own; the markers' are 0.
    let mut archive = tar::Archive::new(&layer[..]);
    for e in archive.entries().unwrap() {
        let e = e.unwrap();
        let name = String::from_utf8(e.path_bytes().into_owned()).unwrap();
        let mtime = e.header().mtime().unwrap();
        let want = if name.contains(".wh.") {
            0
        } else {
            MTIME as u64
        };
        assert_eq!(mtime, want, "the time of {name}");
    }
    assert_eq!(
        done,
        Snapshotted {
            entries: 17,
            bytes: 5 + 70_000 + 6 + 1 + 1 + 10,
            whiteouts: 1,
            opaque_dirs: 1,
            // the socket and the device 1:3
            skipped: 2,
            stripped_setid: 1,
            unmapped_ids: 1,
            hard_links: 1,
            elided: 0,
            xattrs: 0,
            skipped_xattrs: 0,
        }
    );
}

#[test]
fn two_snapshots_of_one_tree_are_the_same_bytes() {
    let (_tmp, upper) = hostile_upper();
    let (first, _) = snapshot(&upper);
    let (second, _) = snapshot(&upper);
    assert!(first == second, "two snapshots of one tree differ");
    // And it is a tar stream to its end: whole blocks, two zero blocks last.
    assert_eq!(first.len() % 512, 0);
    assert!(first[first.len() - 1024..].iter().all(|b| *b == 0));
}

/// A tree as the round trips compare it: path to what it is.
type Listing = BTreeMap<String, String>;

/// Lists `root` in overlay form (whiteouts as `whiteout`, opaque dirs
/// marked), without following symlinks. `times` includes modification
/// times (seconds) of what is not a whiteout.
fn listing(root: &Path, times: bool) -> Listing {
    let mut out = Listing::new();
    list_into(root, root, times, &mut out);
    out
}

fn list_into(root: &Path, at: &Path, times: bool, out: &mut Listing) {
    let meta = fs::symlink_metadata(at).unwrap();
    let rel = at
        .strip_prefix(root)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let kind = meta.file_type();
    let owner = format!(
        "{:o} {}:{}{}",
        meta.mode() & 0o7777,
        meta.uid(),
        meta.gid(),
        if times {
            format!(" @{}", meta.mtime())
        } else {
            String::new()
        }
    );
    let what = if kind.is_char_device() && meta.rdev() == 0 {
        "whiteout".to_owned()
    } else if kind.is_dir() {
        let mut value = [0u8; 8];
        let opaque = matches!(
            rustix::fs::lgetxattr(at, "user.overlay.opaque", &mut value[..]),
            Ok(1) if value[0] == b'y'
        );
        format!("dir {owner}{}", if opaque { " opaque" } else { "" })
    } else if kind.is_symlink() {
        format!(
            "symlink {owner} -> {}",
            fs::read_link(at).unwrap().display()
        )
    } else if kind.is_fifo() {
        format!("fifo {owner}")
    } else if kind.is_file() {
        let data = fs::read(at).unwrap();
        let shown = if data.len() > 64 {
            format!("{} bytes of {:?}", data.len(), data[0] as char)
        } else {
            String::from_utf8_lossy(&data).into_owned()
        };
        format!("file {owner} {shown:?}")
    } else {
        format!("other {kind:?}")
    };
    out.insert(rel, what);
    if kind.is_dir() {
        let mut names: Vec<_> = fs::read_dir(at)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for path in names {
            list_into(root, &path, times, out);
        }
    }
}

#[test]
fn the_unpacker_makes_the_upper_back_from_its_layer() {
    let (tmp, upper) = hostile_upper();
    let (layer, _) = snapshot(&upper);
    let into = tmp.path().join("into");
    fs::create_dir(&into).unwrap();
    let unpacked = unpack_layer(&layer[..], &into, &UnpackLimits::default()).unwrap();
    assert_eq!(unpacked.whiteouts, 1);
    assert_eq!(unpacked.opaque_dirs, 1);
    assert_eq!(
        unpacked.stripped_setid, 0,
        "set-id bits were stripped already"
    );

    // What the upper should come back as: owners mapped back, set-id bits
    // gone, the socket and the device left out.
    let mut want = BTreeMap::new();
    for (path, what) in listing(&upper, true) {
        let what = what
            .replace(&format!("{}:{}", BASE + 1000, BASE + 1000), "1000:1000")
            .replace(&format!("{BASE}:{BASE}"), "0:0");
        let what = if path == "root-owned" {
            what.replace("0:0", "65534:65534")
        } else if path == "suid" {
            what.replace("6755", "755")
        } else {
            what
        };
        if path == "sock" || path == "dev" {
            continue;
        }
        want.insert(path, what);
    }
    assert_eq!(listing(&into, true), want);
    // The hard link pair is one file again.
    let ino = |p: &str| fs::metadata(into.join(p)).unwrap().ino();
    assert_eq!(ino("link1"), ino("link2"));
}

fn get_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut value = vec![0u8; 70_000];
    match rustix::fs::lgetxattr(path, name, &mut value[..]) {
        Ok(n) => Some(value[..n].to_vec()),
        Err(rustix::io::Errno::NODATA) => None,
        Err(e) => panic!("getxattr {name} of {}: {e}", path.display()),
    }
}

#[test]
fn a_files_user_attributes_go_through_the_layer_and_nothing_else_does() {
    require_root();
    // On a tmpfs: ext4 holds a file's attributes in one block, too small
    // for the bound checked here.
    let tmp = tempfile::tempdir().unwrap();
    let _tmpfs = Tmpfs::new(tmp.path());
    let upper = tmp.path().join("upper");
    let at = |p: &str| upper.join(p);
    dir(&upper, 0o755, BASE, BASE);
    file(&at("a.txt"), b"hello", 0o644, BASE, BASE);
    dir(&at("home"), 0o755, BASE, BASE);
    file(&at("home/notes"), b"n", 0o644, BASE, BASE);
    // e2b's file metadata, and a value of every byte but the newline
    // (one with a newline stays out: tar readers split PAX records there).
    set_xattr(&at("a.txt"), "user.e2b.author", b"someone");
    let bytes: Vec<u8> = (0..=255).filter(|b| *b != b'\n').collect();
    set_xattr(&at("a.txt"), "user.e2b.binary", &bytes);
    set_xattr(&at("a.txt"), "user.e2b.lines", b"a\nb");
    // overlayfs's own bookkeeping, never carried; nor trusted.* nor a
    // directory's.
    set_xattr(&at("a.txt"), "user.overlay.origin", b"x");
    set_xattr(&at("a.txt"), "trusted.airlock", b"t");
    set_xattr(&at("home"), "user.dir", b"d");
    // Past the bound per file, the rest stays out (counted).
    set_xattr(&at("home/notes"), "user.big1", &vec![b'a'; 40_000]);
    set_xattr(&at("home/notes"), "user.big2", &vec![b'b'; 40_000]);
    for p in ["a.txt", "home/notes", "home", ""] {
        touch(&at(p));
    }
    let (layer, done) = snapshot(&upper);
    assert_eq!((done.xattrs, done.skipped_xattrs), (3, 2), "{done:?}");
    let into = tmp.path().join("into");
    fs::create_dir(&into).unwrap();
    let unpacked = unpack_layer(&layer[..], &into, &UnpackLimits::default()).unwrap();
    assert_eq!(unpacked.xattrs, 3, "{unpacked:?}");
    let file = into.join("a.txt");
    assert_eq!(
        get_xattr(&file, "user.e2b.author").as_deref(),
        Some(&b"someone"[..])
    );
    assert_eq!(get_xattr(&file, "user.e2b.binary"), Some(bytes));
    assert_eq!(get_xattr(&file, "user.overlay.origin"), None);
    assert_eq!(get_xattr(&file, "user.e2b.lines"), None);
    assert_eq!(get_xattr(&file, "trusted.airlock"), None);
    assert_eq!(get_xattr(&into.join("home"), "user.dir"), None);
    assert_eq!(fs::read(&file).unwrap(), b"hello");
    let notes = into.join("home/notes");
    assert_eq!(
        get_xattr(&notes, "user.big1").map(|v| v.len()),
        Some(40_000)
    );
    assert_eq!(get_xattr(&notes, "user.big2"), None);
    // Two snapshots of the tree are still the same bytes.
    assert_eq!(snapshot(&upper).0, layer);
}

/// A tmpfs mounted for a test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(at: &Path) -> Self {
        rustix::mount::mount(
            "none",
            at,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            c"size=64m",
        )
        .unwrap_or_else(|e| panic!("mount a tmpfs on {}: {e}", at.display()));
        Self(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
    }
}

/// A hand-made layer whose PAX records try what a layer may not: overlayfs
/// attributes, privileged namespaces, attributes on a directory.
#[test]
fn a_layers_pax_attributes_apply_only_as_plain_user_data_on_files() {
    require_root();
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |name: &str, kind: tar::EntryType, records: &[(&str, &[u8])], data: &[u8]| {
        if !records.is_empty() {
            let mut pax = Vec::new();
            for (key, value) in records {
                let body = key.len() + value.len() + 3;
                let mut len = body + 1;
                while len != body + len.to_string().len() {
                    len = body + len.to_string().len();
                }
                pax.extend_from_slice(format!("{len} {key}=").as_bytes());
                pax.extend_from_slice(value);
                pax.push(b'\n');
            }
            let mut header = tar::Header::new_ustar();
            header.set_path("././@PaxHeader").unwrap();
            header.set_entry_type(tar::EntryType::XHeader);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            header.set_size(pax.len() as u64);
            header.set_cksum();
            builder.append(&header, &pax[..]).unwrap();
        }
        let mut header = tar::Header::new_gnu();
        header.set_path(name).unwrap();
        header.set_entry_type(kind);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_mode(0o755);
        header.set_size(data.len() as u64);
        header.set_cksum();
        builder.append(&header, data).unwrap();
    };
    add(
        "dir/",
        tar::EntryType::Directory,
        &[("SCHILY.xattr.user.overlay.opaque", b"y")],
        b"",
    );
    add(
        "dir/file",
        tar::EntryType::Regular,
        &[
            ("SCHILY.xattr.user.overlay.redirect", b"/etc"),
            ("SCHILY.xattr.user.overlay.metacopy", b""),
            ("SCHILY.xattr.security.capability", b"\x01\x00\x00\x02"),
            ("SCHILY.xattr.trusted.overlay.opaque", b"y"),
            ("SCHILY.xattr.user.kept", b"yes"),
        ],
        b"data",
    );
    let layer = builder.into_inner().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let unpacked = unpack_layer(&layer[..], tmp.path(), &UnpackLimits::default()).unwrap();
    assert_eq!(
        (unpacked.xattrs, unpacked.skipped_xattrs),
        (1, 5),
        "{unpacked:?}"
    );
    let file = tmp.path().join("dir/file");
    assert_eq!(get_xattr(&file, "user.kept").as_deref(), Some(&b"yes"[..]));
    for name in [
        "user.overlay.redirect",
        "user.overlay.metacopy",
        "security.capability",
        "trusted.overlay.opaque",
    ] {
        assert_eq!(get_xattr(&file, name), None, "{name}");
    }
    assert_eq!(
        get_xattr(&tmp.path().join("dir"), "user.overlay.opaque"),
        None
    );
}

#[test]
fn symlinks_are_stored_verbatim_and_never_followed() {
    let (tmp, upper) = hostile_upper();
    // A directory of the upper replaced by a symlink to the host's /etc,
    // and the upper's own root given as a symlink.
    let (layer, _) = snapshot(&upper);
    let names: Vec<String> = entries(&layer).into_iter().map(|e| e.name).collect();
    assert!(
        names.iter().all(|n| !n.starts_with("evil/")),
        "the walker went through the symlink evil -> /etc: {names:?}"
    );
    let passwd = fs::read("/etc/passwd").unwrap();
    assert!(
        !layer.windows(passwd.len()).any(|w| w == passwd),
        "the host's /etc/passwd is in the layer"
    );
    let link = tmp.path().join("link-to-upper");
    std::os::unix::fs::symlink(&upper, &link).unwrap();
    let err = write_layer(&link, &IDS, io::sink(), &SnapshotLimits::default()).unwrap_err();
    assert!(
        matches!(err, SnapshotError::Open { .. }),
        "an upper given as a symlink was followed: {err:?}"
    );
}

#[test]
fn the_limits_of_entries_and_bytes_hold() {
    let (_tmp, upper) = hostile_upper();
    let (_, done) = snapshot(&upper);
    let with = |limits: SnapshotLimits| write_layer(&upper, &IDS, io::sink(), &limits);
    // 17 nodes below the root (the socket and the device among them) and
    // 17 tar entries (the root and the opaque marker among them).
    let exact = SnapshotLimits {
        max_bytes: done.bytes,
        max_entries: 17,
    };
    assert_eq!(with(exact).unwrap(), done);
    let err = with(SnapshotLimits {
        max_entries: 16,
        ..exact
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            SnapshotError::TooLarge {
                limit: Limit::Entries(16),
                ..
            }
        ),
        "{err:?}"
    );
    // Nodes that write no entry count too: five sockets, one entry.
    let sockets = tempfile::tempdir().unwrap();
    let _listeners: Vec<_> = (0..5)
        .map(|n| {
            std::os::unix::net::UnixListener::bind(sockets.path().join(n.to_string())).unwrap()
        })
        .collect();
    let limits = SnapshotLimits {
        max_bytes: 0,
        max_entries: 4,
    };
    let err = write_layer(sockets.path(), &IDS, io::sink(), &limits).unwrap_err();
    assert!(
        matches!(
            err,
            SnapshotError::TooLarge {
                limit: Limit::Entries(4),
                ..
            }
        ),
        "the nodes listed are bounded too: {err:?}"
    );
    let err = with(SnapshotLimits {
        max_bytes: done.bytes - 1,
        ..exact
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            SnapshotError::TooLarge {
                limit: Limit::Bytes(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("bytes of data"), "{err}");
}

#[test]
fn redirect_and_metacopy_xattrs_are_refused() {
    for (node, xattr) in [
        ("home", "user.overlay.redirect"),
        ("a.txt", "user.overlay.metacopy"),
        ("home/user", "trusted.overlay.redirect"),
        ("link1", "trusted.overlay.metacopy"),
    ] {
        let (_tmp, upper) = hostile_upper();
        set_xattr(&upper.join(node), xattr, b"");
        let err = write_layer(&upper, &IDS, io::sink(), &SnapshotLimits::default()).unwrap_err();
        match &err {
            SnapshotError::Unsupported { path, xattr: got } => {
                assert_eq!((path.as_str(), got.as_str()), (node, xattr));
            }
            other => panic!("{xattr} on {node}: {other:?}"),
        }
        let message = err.to_string();
        assert!(
            message.contains("redirect_dir and metacopy are not supported"),
            "{message}"
        );
    }
    // The trusted. spelling of opaque means opaque.
    let (_tmp, upper) = hostile_upper();
    set_xattr(&upper.join("home"), "trusted.overlay.opaque", b"y");
    let (layer, done) = snapshot(&upper);
    assert_eq!(done.opaque_dirs, 2);
    let names: Vec<String> = entries(&layer).into_iter().map(|e| e.name).collect();
    let at = names.iter().position(|n| n == "home/").unwrap();
    assert_eq!(names[at + 1], "home/.wh..wh..opq");
}

#[test]
fn owners_outside_the_sandboxs_range_become_nobody_and_are_counted() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    dir(&upper, 0o755, BASE, BASE);
    file(&upper.join("below"), b"", 0o644, BASE - 1, BASE);
    file(
        &upper.join("inside"),
        b"",
        0o644,
        BASE + 65535,
        BASE + 65535,
    );
    file(&upper.join("past"), b"", 0o644, BASE, BASE + 65536);
    file(&upper.join("overflow"), b"", 0o644, 65534, 65534);
    let (layer, done) = snapshot(&upper);
    let ids: Vec<(String, u64, u64)> = entries(&layer)
        .into_iter()
        .map(|e| (e.name, e.uid, e.gid))
        .collect();
    assert_eq!(
        ids,
        [
            ("./".to_owned(), 0, 0),
            ("below".to_owned(), 65534, 0),
            ("inside".to_owned(), 65535, 65535),
            ("overflow".to_owned(), 65534, 65534),
            ("past".to_owned(), 0, 65534),
        ]
    );
    assert_eq!(done.unmapped_ids, 3);
}

#[test]
fn names_a_layer_cannot_hold_are_refused() {
    // A name with the whiteout prefix would read as a whiteout.
    let (_tmp, upper) = hostile_upper();
    file(&upper.join("home/.wh.passwd"), b"", 0o644, BASE, BASE);
    let err = write_layer(&upper, &IDS, io::sink(), &SnapshotLimits::default()).unwrap_err();
    assert!(
        matches!(&err, SnapshotError::BadName { path, why: BadName::Reserved } if path == "home/.wh.passwd"),
        "{err:?}"
    );
    // The whiteout of a 252-byte name would be 256 bytes.
    let (_tmp, upper) = hostile_upper();
    mknod(
        &upper.join("x".repeat(252)),
        FileType::CharacterDevice,
        (0, 0),
    );
    let err = write_layer(&upper, &IDS, io::sink(), &SnapshotLimits::default()).unwrap_err();
    assert!(
        matches!(
            &err,
            SnapshotError::BadName {
                why: BadName::ComponentTooLong,
                ..
            }
        ),
        "{err:?}"
    );
    // A tree deeper than a path may be long: 2100 levels of `d`, made by
    // descriptor (its paths are longer than the host's PATH_MAX).
    let (_tmp, upper) = hostile_upper();
    let mut at = rustix::fs::openat(CWD, &upper, OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..2100 {
        rustix::fs::mkdirat(&at, "d", Mode::from_raw_mode(0o755)).unwrap();
        at = rustix::fs::openat(&at, "d", OFlags::DIRECTORY, Mode::empty()).unwrap();
    }
    let err = write_layer(&upper, &IDS, io::sink(), &SnapshotLimits::default()).unwrap_err();
    match &err {
        SnapshotError::BadName {
            path,
            why: BadName::TooLong,
        } => assert!(path.starts_with("d/d/d/"), "{path}"),
        other => panic!("a 2100-deep tree: {other:?}"),
    }
}

/// A writer that does something to the upper once it has been handed
/// `after` bytes: what a sandbox still running could do mid-snapshot.
struct Meddling<F: FnMut()> {
    written: usize,
    after: usize,
    meddle: Option<F>,
}

impl<F: FnMut()> Write for Meddling<F> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written += buf.len();
        if self.written >= self.after {
            if let Some(mut meddle) = self.meddle.take() {
                meddle();
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn meddled(upper: &Path, after: usize, meddle: impl FnMut()) -> Result<Snapshotted, SnapshotError> {
    let out = Meddling {
        written: 0,
        after,
        meddle: Some(meddle),
    };
    write_layer(upper, &IDS, out, &SnapshotLimits::default())
}

#[test]
fn a_file_that_changes_while_it_is_read_is_an_error() {
    // `big` is read in 64 KiB pieces; the writer sees the first ones while
    // the rest is still to be read.
    for (what, grow) in [("grows", true), ("shrinks", false)] {
        require_root();
        let tmp = tempfile::tempdir().unwrap();
        let upper = tmp.path().join("upper");
        dir(&upper, 0o755, BASE, BASE);
        let big = upper.join("big");
        file(&big, &vec![7u8; 1 << 20], 0o644, BASE, BASE);
        let err = meddled(&upper, 1, || {
            let f = fs::OpenOptions::new().append(true).open(&big).unwrap();
            if grow {
                (&f).write_all(b"more").unwrap();
            } else {
                f.set_len(1000).unwrap();
            }
        })
        .unwrap_err();
        assert!(
            matches!(&err, SnapshotError::Changed { path } if path == "big"),
            "a file that {what}: {err:?}"
        );
        assert!(
            err.to_string().contains("changed while it was read"),
            "{err}"
        );
    }
}

#[test]
fn a_directory_moved_while_it_is_walked_is_an_error() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    dir(&upper, 0o755, BASE, BASE);
    for d in ["a", "a/sub", "z"] {
        dir(&upper.join(d), 0o755, BASE, BASE);
    }
    file(
        &upper.join("a/sub/big"),
        &vec![1u8; 1 << 20],
        0o644,
        BASE,
        BASE,
    );
    file(&upper.join("a/sub/secret"), b"s", 0o644, BASE, BASE);
    // Mid-walk of a/sub, move it under z: going back up by `..` would land
    // in z.
    let err = meddled(&upper, 1, || {
        fs::rename(upper.join("a/sub"), upper.join("z/sub")).unwrap();
    })
    .unwrap_err();
    assert!(
        matches!(&err, SnapshotError::Changed { path } if path == "a"),
        "{err:?}"
    );
}

// ---------------------------------------------------------------------
// A real overlayfs.

/// A layer made with the tar crate's Builder.
fn lower_layer() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, kind: tar::EntryType, mode: u32, data: &[u8], link: Option<&str>| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(MTIME as u64);
        h.set_size(data.len() as u64);
        if let Some(link) = link {
            h.set_link_name(link).unwrap();
        }
        b.append_data(&mut h, name, data).unwrap();
    };
    use tar::EntryType::{Directory as D, Regular as F, Symlink as L};
    add("etc/", D, 0o755, b"", None);
    add("etc/hostname", F, 0o644, b"lower\n", None);
    add("etc/keep", F, 0o644, b"keep\n", None);
    add("etc/chmodded", F, 0o644, b"c\n", None);
    add("data/", D, 0o755, b"", None);
    add("data/file1", F, 0o644, b"one\n", None);
    add("data/dir/", D, 0o755, b"", None);
    add("data/dir/x", F, 0o600, b"x\n", None);
    add("olddir/", D, 0o755, b"", None);
    add("olddir/a", F, 0o644, b"a\n", None);
    add("olddir/sub/", D, 0o755, b"", None);
    add("olddir/sub/b", F, 0o644, b"b\n", None);
    add("rmme", F, 0o644, b"bye\n", None);
    add("bin", L, 0o777, b"", Some("usr/bin"));
    b.into_inner().unwrap()
}

/// An overlayfs mount, unmounted when dropped.
struct Mounted(PathBuf);

impl Mounted {
    fn new(at: &Path, options: &str, flags: rustix::mount::MountFlags) -> Self {
        let data = std::ffi::CString::new(options).unwrap();
        rustix::mount::mount("overlay", at, "overlay", flags, data.as_c_str())
            .unwrap_or_else(|e| panic!("mount overlayfs ({options}) on {}: {e}", at.display()));
        Self(at.to_owned())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::empty());
    }
}

fn read_all(path: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    fs::File::open(path).unwrap().read_to_end(&mut v).unwrap();
    v
}

/// The important one: changes made through a real overlayfs (mounted
/// with `userxattr`, as the sandboxes mount it; root in the host's user
/// namespace may mount it so), frozen by `write_layer`, unpacked as a new
/// layer and stacked read-only on the old one, give the very merged view
/// the overlay had.
#[test]
fn a_real_overlays_changes_frozen_and_stacked_give_the_same_merged_view() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let p = |name: &str| tmp.path().join(name);
    for d in ["lower", "upper", "work", "merged", "new", "remerged"] {
        fs::create_dir(p(d)).unwrap();
    }
    unpack_layer(&lower_layer()[..], &p("lower"), &UnpackLimits::default()).unwrap();
    let options = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        p("lower").display(),
        p("upper").display(),
        p("work").display()
    );
    let before = {
        let _mount = Mounted::new(&p("merged"), &options, rustix::mount::MountFlags::empty());
        let m = |name: &str| p("merged").join(name);
        // Create, modify, delete, chmod, rm -rf and recreate (opaque), link,
        // a FIFO and a symlink, and owners other than root.
        file(&m("newfile"), b"new\n", 0o640, 1000, 1000);
        fs::write(m("etc/hostname"), b"changed\n").unwrap();
        fs::remove_file(m("rmme")).unwrap();
        fs::set_permissions(m("etc/chmodded"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::remove_dir_all(m("olddir")).unwrap();
        dir(&m("olddir"), 0o700, 1000, 1000);
        file(&m("olddir/c"), b"c\n", 0o644, 1000, 1000);
        fs::remove_file(m("data/dir/x")).unwrap();
        file(&m("data/dir/y"), &vec![b'y'; 100_000], 0o644, 0, 0);
        fs::hard_link(m("newfile"), m("newlink")).unwrap();
        mknod(&m("data/pipe"), FileType::Fifo, (0, 0));
        std::os::unix::fs::symlink("../etc/shadow", m("data/shadow")).unwrap();
        dir(&m("a-long-directory-name-".repeat(5).as_ref()), 0o755, 0, 0);
        file(
            &m(&format!(
                "{}/{}",
                "a-long-directory-name-".repeat(5),
                "f".repeat(200)
            )),
            b"long",
            0o644,
            0,
            0,
        );
        // The sandbox cannot make overlayfs markers of its own: writes of
        // the overlay's xattrs through the mount are escaped (Linux 6.7+)
        // or refused.
        let opaque =
            rustix::fs::setxattr(m("data"), "user.overlay.opaque", b"y", XattrFlags::empty());
        let redirect = rustix::fs::setxattr(
            m("etc"),
            "user.overlay.redirect",
            b"/x",
            XattrFlags::empty(),
        );
        if opaque.is_ok() {
            let mut value = [0u8; 8];
            assert!(
                rustix::fs::getxattr(
                    p("upper").join("data"),
                    "user.overlay.opaque",
                    &mut value[..]
                )
                .is_err(),
                "a write through the mount set the upper's own opaque marker"
            );
            // Take the escaped ones back off, which the merged view shows
            // as the sandbox set them (the layer does not carry xattrs).
            rustix::fs::removexattr(m("data"), "user.overlay.opaque").unwrap();
        }
        if redirect.is_ok() {
            rustix::fs::removexattr(m("etc"), "user.overlay.redirect").unwrap();
        }
        // No redirects: a lower directory cannot be renamed.
        assert_eq!(
            rustix::fs::rename(m("data/dir"), m("data/moved")).err(),
            Some(rustix::io::Errno::XDEV),
            "overlayfs with userxattr renamed a lower directory (a redirect)"
        );
        assert_eq!(read_all(&m("etc/hostname")), b"changed\n");
        listing(&p("merged"), true)
    };
    assert!(before.contains_key("olddir/c") && !before.contains_key("olddir/a"));

    let mut layer = Vec::new();
    let ids = IdMap {
        host_base_uid: 0,
        host_base_gid: 0,
        count: 65536,
    };
    let done = write_layer(&p("upper"), &ids, &mut layer, &SnapshotLimits::default()).unwrap();
    assert!(done.whiteouts >= 2, "{done:?}");
    assert!(done.opaque_dirs >= 1, "{done:?}");
    assert_eq!(done.hard_links, 1, "{done:?}");
    let names: Vec<String> = entries(&layer).into_iter().map(|e| e.name).collect();
    assert!(names.contains(&".wh.rmme".to_owned()), "{names:?}");
    assert!(names.contains(&"data/dir/.wh.x".to_owned()), "{names:?}");
    let opq = names.iter().position(|n| n == "olddir/").unwrap();
    assert_eq!(names[opq + 1], "olddir/.wh..wh..opq");

    unpack_layer(&layer[..], &p("new"), &UnpackLimits::default()).unwrap();
    let stacked = format!(
        "lowerdir={}:{},userxattr",
        p("new").display(),
        p("lower").display()
    );
    let after = {
        let _mount = Mounted::new(&p("remerged"), &stacked, rustix::mount::MountFlags::RDONLY);
        listing(&p("remerged"), true)
    };
    assert_eq!(after, before);
}

#[test]
fn the_setups_files_and_untouched_directories_are_left_out() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    let base = IDS.host_base_uid;
    dir(&upper, 0o755, base, base);
    // What a sandbox's setup leaves: generated files and mount points.
    dir(&upper.join("etc"), 0o755, base, base);
    file(&upper.join("etc/hostname"), b"sbx\n", 0o644, base, base);
    file(
        &upper.join("etc/hosts"),
        b"127.0.0.1 sbx\n",
        0o644,
        base,
        base,
    );
    dir(&upper.join("proc"), 0o555, base, base);
    dir(&upper.join("mnt"), 0o755, base, base);
    dir(&upper.join("mnt/user-data"), 0o755, base, base);
    // What the step did: a file in a directory the setup touched, and an
    // empty directory of its own beneath an elidable one.
    dir(&upper.join("tmp"), 0o1777, base, base);
    file(
        &upper.join("tmp/made"),
        b"x",
        0o644,
        base + 1000,
        base + 1000,
    );
    dir(&upper.join("mnt/mine"), 0o700, base, base);
    let elide = Elide {
        nodes: ["etc/hostname", "etc/hosts"]
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect(),
        dirs: ["etc", "proc", "mnt", "mnt/user-data", "tmp"]
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect(),
    };
    let mut out = Vec::new();
    let done =
        write_layer_eliding(&upper, &IDS, &mut out, &SnapshotLimits::default(), &elide).unwrap();
    let names: Vec<String> = entries(&out).into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["./", "mnt/", "mnt/mine/", "tmp/", "tmp/made"]);
    assert_eq!(done.elided, 2);
    assert_eq!(done.entries, 5);
    // Nothing of the step's: only the root.
    std::fs::remove_file(upper.join("tmp/made")).unwrap();
    std::fs::remove_dir(upper.join("mnt/mine")).unwrap();
    let mut out = Vec::new();
    let done =
        write_layer_eliding(&upper, &IDS, &mut out, &SnapshotLimits::default(), &elide).unwrap();
    assert_eq!(done.entries, 1);
}
