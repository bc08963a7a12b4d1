//! The layer unpacker against layers built here with the tar crate's
//! Builder: what it makes, and what it refuses, with a canary directory
//! beside the layer's to show that nothing is made outside it. Needs root
//! (chown, the whiteouts' mknod).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_layers::unpack::{
    unpack_layer, Compression, Limit, Place, Refusal, UnpackError, UnpackLimits, Unpacked,
};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use tar::{EntryType, Header};

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the unpacker tests need root (they chown nodes and mknod whiteouts): run them as root"
    );
}

/// A layer directory `into` with an empty `canary` directory beside it.
struct Work {
    dir: tempfile::TempDir,
}

impl Work {
    fn new() -> Self {
        require_root();
        let dir = tempfile::tempdir().expect("a temp dir");
        fs::create_dir(dir.path().join("into")).expect("into");
        fs::create_dir(dir.path().join("canary")).expect("canary");
        Self { dir }
    }

    fn layer_dir(&self) -> PathBuf {
        self.dir.path().join("into")
    }

    fn at(&self, path: &str) -> PathBuf {
        self.layer_dir().join(path)
    }

    fn unpack(&self, blob: &[u8]) -> Result<Unpacked, UnpackError> {
        self.unpack_with(blob, &UnpackLimits::default())
    }

    fn unpack_with(&self, blob: &[u8], limits: &UnpackLimits) -> Result<Unpacked, UnpackError> {
        let result = unpack_layer(blob, &self.layer_dir(), limits);
        self.assert_nothing_outside();
        result
    }

    /// The canary is empty and `into` and the canary are all there is
    /// beside the layer.
    fn assert_nothing_outside(&self) {
        let canary: Vec<_> = fs::read_dir(self.dir.path().join("canary"))
            .expect("read the canary")
            .collect();
        assert!(
            canary.is_empty(),
            "something was made in the canary: {canary:?}"
        );
        let mut beside: Vec<String> = fs::read_dir(self.dir.path())
            .expect("read the work dir")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        beside.sort();
        assert_eq!(
            beside,
            ["canary", "into"],
            "something was made beside the layer"
        );
    }
}

const T: u64 = 1_600_000_000;

/// A tar built entry by entry; names are written into the header as
/// given (the Builder's own path setters refuse `..`), long names through
/// the Builder's GNU long-name records.
struct Tar(tar::Builder<Vec<u8>>);

impl Tar {
    fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    #[allow(clippy::too_many_arguments)]
    fn raw(
        mut self,
        name: &[u8],
        kind: EntryType,
        mode: u32,
        owner: (u64, u64),
        mtime: u64,
        link: Option<&[u8]>,
        data: &[u8],
    ) -> Self {
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(owner.0);
        header.set_gid(owner.1);
        header.set_mtime(mtime);
        header.set_size(data.len() as u64);
        if let Some(link) = link {
            header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        }
        if name.len() <= 100 {
            header.as_old_mut().name[..name.len()].copy_from_slice(name);
            header.set_cksum();
            self.0.append(&header, data).expect("append");
        } else {
            let path = std::str::from_utf8(name).expect("a long name in UTF-8");
            self.0
                .append_data(&mut header, path, data)
                .expect("append a long name");
        }
        self
    }

    fn file(self, name: &str, data: &[u8]) -> Self {
        self.raw(
            name.as_bytes(),
            EntryType::Regular,
            0o644,
            (0, 0),
            T,
            None,
            data,
        )
    }

    fn dir(self, name: &str, mode: u32) -> Self {
        self.raw(
            name.as_bytes(),
            EntryType::Directory,
            mode,
            (0, 0),
            T,
            None,
            b"",
        )
    }

    fn symlink(self, name: &str, target: &str) -> Self {
        self.raw(
            name.as_bytes(),
            EntryType::Symlink,
            0o777,
            (0, 0),
            T,
            Some(target.as_bytes()),
            b"",
        )
    }

    fn hard_link(self, name: &str, target: &str) -> Self {
        self.raw(
            name.as_bytes(),
            EntryType::Link,
            0o644,
            (0, 0),
            T,
            Some(target.as_bytes()),
            b"",
        )
    }

    fn whiteout(self, name: &str) -> Self {
        self.file(name, b"")
    }

    fn finish(self) -> Vec<u8> {
        self.0.into_inner().expect("finish the tar")
    }
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).expect("gzip");
    encoder.finish().expect("gzip")
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).expect("zstd")
}

fn hostile(result: Result<Unpacked, UnpackError>) -> (String, Refusal) {
    match result {
        Err(UnpackError::Hostile { entry, why }) => (entry, why),
        other => panic!("expected a hostile-entry error, got {other:?}"),
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).expect("metadata").mode() & 0o7777
}

fn owner(path: &Path) -> (u32, u32) {
    let meta = fs::symlink_metadata(path).expect("metadata");
    (meta.uid(), meta.gid())
}

fn mtime(path: &Path) -> i64 {
    fs::symlink_metadata(path).expect("metadata").mtime()
}

fn opaque(path: &Path) -> Option<Vec<u8>> {
    let mut value = [0u8; 16];
    match rustix::fs::lgetxattr(path, "user.overlay.opaque", &mut value) {
        Ok(n) => Some(value[..n].to_vec()),
        Err(rustix::io::Errno::NODATA) => None,
        Err(e) => panic!("getxattr {}: {e}", path.display()),
    }
}

fn is_whiteout(path: &Path) -> bool {
    let meta = fs::symlink_metadata(path).expect("metadata");
    meta.file_type().is_char_device() && meta.rdev() == 0
}

/// Everything under `root`: type, mode, owner, time, content or target,
/// opaque marker.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            let meta = fs::symlink_metadata(&path).expect("metadata");
            let kind = meta.file_type();
            let what = if kind.is_dir() {
                todo.push(path.clone());
                format!("dir opaque={:?}", opaque(&path))
            } else if kind.is_symlink() {
                format!("symlink {:?}", fs::read_link(&path).expect("readlink"))
            } else if kind.is_file() {
                format!(
                    "file {:?} nlink={}",
                    fs::read(&path).expect("read"),
                    meta.nlink()
                )
            } else {
                format!("other rdev={}", meta.rdev())
            };
            let name = path
                .strip_prefix(root)
                .expect("below root")
                .display()
                .to_string();
            // Parents no entry names are made at the time of the unpack.
            let mtime = if MADE_PARENTS.contains(&name.as_str()) {
                "now".to_string()
            } else {
                meta.mtime().to_string()
            };
            out.insert(
                name,
                format!(
                    "{what} {:o} {}:{} {mtime}",
                    meta.mode(),
                    meta.uid(),
                    meta.gid()
                ),
            );
        }
    }
    out
}

/// The directories [`every_kind`] leaves for the unpacker to make.
const MADE_PARENTS: [&str; 4] = ["run", "deep", "deep/a", "deep/a/b"];

/// A layer with one of every kind of node.
fn every_kind() -> Vec<u8> {
    Tar::new()
        .raw(b"./", EntryType::Directory, 0o755, (0, 0), 500, None, b"")
        .raw(
            b"./etc/",
            EntryType::Directory,
            0o750,
            (0, 4),
            1000,
            None,
            b"",
        )
        .raw(
            b"./etc/conf",
            EntryType::Regular,
            0o640,
            (1000, 1001),
            2000,
            None,
            b"setting=1\n",
        )
        .raw(
            b"./etc/link",
            EntryType::Symlink,
            0o777,
            (5, 6),
            3000,
            Some(b"/usr/../conf"),
            b"",
        )
        .raw(
            b"./etc/hard",
            EntryType::Link,
            0o644,
            (0, 0),
            0,
            Some(b"./etc/conf"),
            b"",
        )
        .raw(b"run/pipe", EntryType::Fifo, 0o620, (7, 8), 4000, None, b"")
        .raw(
            b"deep/a/b/c",
            EntryType::Regular,
            0o600,
            (0, 0),
            5000,
            None,
            b"deep",
        )
        .finish()
}

#[test]
fn every_kind_of_node_is_made_with_its_owner_mode_and_time() {
    let work = Work::new();
    let layer = every_kind();
    let got = work.unpack(&layer).expect("unpacks");
    assert_eq!((got.entries, got.bytes), (7, 14));
    assert_eq!(got.compression, Compression::None);

    let root = work.layer_dir();
    assert_eq!(
        (mode(&root), mtime(&root)),
        (0o755, 500),
        "./ gives the root its metadata"
    );
    let etc = work.at("etc");
    assert!(etc.is_dir());
    assert_eq!(
        (mode(&etc), owner(&etc), mtime(&etc)),
        (0o750, (0, 4), 1000),
        "etc"
    );
    let conf = work.at("etc/conf");
    assert_eq!(fs::read(&conf).expect("conf"), b"setting=1\n");
    assert_eq!(
        (mode(&conf), owner(&conf), mtime(&conf)),
        (0o640, (1000, 1001), 2000)
    );
    let link = work.at("etc/link");
    assert_eq!(
        fs::read_link(&link).expect("link"),
        Path::new("/usr/../conf"),
        "kept verbatim"
    );
    assert_eq!((owner(&link), mtime(&link)), ((5, 6), 3000));
    let hard = fs::symlink_metadata(work.at("etc/hard")).expect("hard");
    let conf_meta = fs::symlink_metadata(&conf).expect("conf");
    assert_eq!(
        (hard.ino(), hard.nlink()),
        (conf_meta.ino(), 2),
        "one inode, two names"
    );
    let pipe = work.at("run/pipe");
    assert!(fs::symlink_metadata(&pipe)
        .expect("pipe")
        .file_type()
        .is_fifo());
    assert_eq!(
        (mode(&pipe), owner(&pipe), mtime(&pipe)),
        (0o620, (7, 8), 4000)
    );
    for parent in MADE_PARENTS {
        let path = work.at(parent);
        assert_eq!(
            (mode(&path), owner(&path)),
            (0o755, (0, 0)),
            "made parent {parent}"
        );
    }
    assert_eq!(fs::read(work.at("deep/a/b/c")).expect("c"), b"deep");
}

#[test]
fn plain_gzip_and_zstd_layers_give_one_tree_and_their_digests() {
    let tar = every_kind();
    let mut trees = Vec::new();
    for (blob, compression) in [
        (tar.clone(), Compression::None),
        (gzip(&tar), Compression::Gzip),
        (zstd(&tar), Compression::Zstd),
    ] {
        let work = Work::new();
        let got = work.unpack(&blob).expect("unpacks");
        assert_eq!(got.compression, compression);
        assert_eq!(got.digest, sha256(&blob), "{compression:?} digest");
        assert_eq!(got.diff_id, sha256(&tar), "{compression:?} diff_id");
        trees.push(snapshot(&work.layer_dir()));
    }
    assert!(trees[0].len() > 5, "{:?}", trees[0]);
    assert_eq!(trees[0], trees[1], "gzip");
    assert_eq!(trees[0], trees[2], "zstd");
}

#[test]
fn bytes_after_the_end_of_archive_count_toward_both_digests() {
    let mut tar = Tar::new().file("a", b"a").finish();
    tar.extend_from_slice(b"trailing bytes after the end-of-archive");
    for blob in [tar.clone(), gzip(&tar)] {
        let work = Work::new();
        let got = work.unpack(&blob).expect("unpacks");
        assert_eq!(got.digest, sha256(&blob));
        assert_eq!(got.diff_id, sha256(&tar));
    }
    // A gzip blob with bytes after its last member: they are the blob's
    // (and garbage where a member should start).
    let mut blob = gzip(&tar);
    blob.extend_from_slice(&[0u8; 64]);
    let work = Work::new();
    assert!(matches!(
        work.unpack(&blob),
        Err(UnpackError::Corrupt { at: Place::End, .. })
    ));
}

#[test]
fn whiteouts_are_character_devices_and_opaque_markers_xattrs() {
    let work = Work::new();
    let layer = Tar::new()
        .whiteout(".wh.gone")
        .dir("a", 0o755)
        .whiteout("a/.wh.old")
        .whiteout("b/.wh..wh..opq")
        .file("b/keep", b"k")
        .whiteout("c/.wh..wh.plnk")
        // This layer's own nodes and its whiteouts of the same names.
        .file("mine", b"m")
        .whiteout(".wh.mine")
        .dir("mydir", 0o755)
        .file("mydir/x", b"x")
        .whiteout(".wh.mydir")
        .whiteout(".wh.back")
        .dir("back", 0o700)
        .finish();
    let got = work.unpack(&layer).expect("unpacks");
    assert!(is_whiteout(&work.at("gone")), "gone");
    assert!(is_whiteout(&work.at("a/old")), "a/old");
    assert!(
        is_whiteout(&work.at("c/.wh.plnk")),
        "an ordinary whiteout of a .wh. name"
    );
    assert_eq!(owner(&work.at("gone")), (0, 0));
    assert_eq!(opaque(&work.at("b")), Some(b"y".to_vec()), "b is opaque");
    assert_eq!(fs::read(work.at("b/keep")).expect("keep"), b"k");
    assert_eq!(opaque(&work.at("a")), None, "a is not opaque");
    assert_eq!(
        fs::read(work.at("mine")).expect("mine"),
        b"m",
        "a whiteout hides only lower layers"
    );
    assert_eq!(
        opaque(&work.at("mydir")),
        Some(b"y".to_vec()),
        "this layer's dir, opaque"
    );
    assert!(work.at("mydir/x").is_file());
    let back = work.at("back");
    assert!(back.is_dir(), "a directory over this layer's whiteout");
    assert_eq!((opaque(&back), mode(&back)), (Some(b"y".to_vec()), 0o700));
    let names = snapshot(&work.layer_dir());
    assert!(
        !names.keys().any(|n| n
            .split('/')
            .any(|c| c.starts_with(".wh.") && c != ".wh.plnk")),
        "{names:?}"
    );
    assert_eq!((got.whiteouts, got.opaque_dirs), (4, 3));
}

#[test]
fn setuid_and_setgid_bits_are_stripped_and_counted() {
    let work = Work::new();
    let layer = Tar::new()
        .raw(
            b"bin/su",
            EntryType::Regular,
            0o6755,
            (0, 0),
            T,
            None,
            b"#!",
        )
        .raw(
            b"shared/",
            EntryType::Directory,
            0o2775,
            (0, 0),
            T,
            None,
            b"",
        )
        .raw(b"tmp/", EntryType::Directory, 0o1777, (0, 0), T, None, b"")
        .finish();
    let got = work.unpack(&layer).expect("unpacks");
    assert_eq!(mode(&work.at("bin/su")), 0o755);
    assert_eq!(mode(&work.at("shared")), 0o775);
    assert_eq!(mode(&work.at("tmp")), 0o1777, "the sticky bit stays");
    assert_eq!(got.stripped_setid, 2);
}

#[test]
fn devices_are_skipped_and_counted() {
    let work = Work::new();
    let layer = Tar::new()
        .dir("dev", 0o755)
        .raw(b"dev/null", EntryType::Char, 0o666, (0, 0), T, None, b"")
        .raw(b"dev/sda", EntryType::Block, 0o660, (0, 6), T, None, b"")
        .finish();
    let got = work.unpack(&layer).expect("unpacks");
    assert_eq!(fs::read_dir(work.at("dev")).expect("dev").count(), 0);
    assert_eq!(got.skipped_devices, 2);
}

#[test]
fn ids_past_the_sandbox_range_become_nobody_and_only_plain_user_xattrs_are_applied() {
    let work = Work::new();
    let mut tar = Tar::new()
        .raw(b"a", EntryType::Regular, 0o644, (70000, 100), T, None, b"")
        .raw(b"b", EntryType::Regular, 0o644, (5, 65536), T, None, b"")
        .raw(
            b"c",
            EntryType::Regular,
            0o644,
            (65535, 65535),
            T,
            None,
            b"",
        );
    tar.0
        .append_pax_extensions([
            (
                "SCHILY.xattr.security.capability",
                b"\x01\x00\x00\x02".as_slice(),
            ),
            ("SCHILY.xattr.user.note", b"hi".as_slice()),
        ])
        .expect("pax");
    let layer = tar.file("capable", b"x").finish();
    let got = work.unpack(&layer).expect("unpacks");
    assert_eq!(owner(&work.at("a")), (65534, 100));
    assert_eq!(owner(&work.at("b")), (5, 65534));
    assert_eq!(owner(&work.at("c")), (65535, 65535));
    assert_eq!(got.clamped_ids, 2);
    // The file capability is not applied; the plain user attribute is.
    let mut names = [0u8; 256];
    let listed = rustix::fs::llistxattr(work.at("capable"), &mut names).expect("listxattr");
    assert_eq!(&names[..listed], b"user.note\0");
    assert_eq!((got.skipped_xattrs, got.xattrs), (1, 1));
}

#[test]
fn a_later_entry_replaces_an_earlier_one() {
    let work = Work::new();
    let layer = Tar::new()
        .file("x", b"one")
        .file("x", b"two")
        .dir("d", 0o755)
        .file("d/keep", b"k")
        .dir("d", 0o700)
        .file("t/sub/f", b"f")
        .symlink("t/sub/l", "/")
        .file("t", b"now a file")
        .symlink("s", "a")
        .dir("s", 0o755)
        .file("s/inside", b"i")
        .file("h", b"h")
        .hard_link("h2", "h")
        .file("h", b"new h")
        .finish();
    work.unpack(&layer).expect("unpacks");
    assert_eq!(fs::read(work.at("x")).expect("x"), b"two");
    assert_eq!(
        mode(&work.at("d")),
        0o700,
        "a directory over a directory takes its metadata"
    );
    assert!(work.at("d/keep").is_file(), "and keeps its contents");
    assert_eq!(
        fs::read(work.at("t")).expect("t"),
        b"now a file",
        "a file over a tree"
    );
    assert!(
        fs::symlink_metadata(work.at("s")).expect("s").is_dir(),
        "a directory over a symlink"
    );
    assert!(work.at("s/inside").is_file());
    assert_eq!(
        fs::read(work.at("h2")).expect("h2"),
        b"h",
        "a replaced name leaves its links"
    );
    assert_eq!(fs::read(work.at("h")).expect("h"), b"new h");
}

#[test]
fn a_deep_tree_unpacks_and_is_replaced_whole() {
    let work = Work::new();
    // 2,000 levels: more directories than a process may hold open at once
    // under the usual 1,024-descriptor soft limit.
    let deep = "d/".repeat(2000);
    let layer = Tar::new()
        .file(&format!("{deep}bottom"), b"b")
        .file("d", b"flat")
        .finish();
    work.unpack(&layer).expect("unpacks");
    assert_eq!(fs::read(work.at("d")).expect("d"), b"flat");
    assert_eq!(fs::read_dir(work.layer_dir()).expect("into").count(), 1);
}

#[test]
fn a_dot_dot_name_is_refused() {
    let work = Work::new();
    let layer = Tar::new().file("../x", b"out").finish();
    assert_eq!(
        hostile(work.unpack(&layer)),
        ("../x".into(), Refusal::ParentComponent)
    );
}

#[test]
fn a_dot_dot_inside_a_name_is_refused() {
    let work = Work::new();
    let layer = Tar::new()
        .dir("a", 0o755)
        .file("a/../../x", b"out")
        .finish();
    assert_eq!(
        hostile(work.unpack(&layer)),
        ("a/../../x".into(), Refusal::ParentComponent)
    );
}

#[test]
fn an_absolute_name_lands_inside() {
    let work = Work::new();
    let layer = Tar::new().file("/abs", b"in").finish();
    work.unpack(&layer).expect("unpacks");
    assert_eq!(fs::read(work.at("abs")).expect("abs"), b"in");
}

#[test]
fn a_symlink_to_the_root_cannot_carry_a_later_entry_out() {
    let work = Work::new();
    let layer = Tar::new()
        .symlink("evil", "/")
        .file("evil/etc/x", b"out")
        .finish();
    assert_eq!(
        hostile(work.unpack(&layer)),
        ("evil/etc/x".into(), Refusal::ThroughSymlink)
    );
    assert!(!Path::new("/etc/x").exists());

    let work = Work::new();
    let canary = work.dir.path().join("canary");
    let layer = Tar::new()
        .symlink("evil", canary.to_str().expect("a UTF-8 temp dir"))
        .file("evil/x", b"out")
        .finish();
    assert_eq!(
        hostile(work.unpack(&layer)),
        ("evil/x".into(), Refusal::ThroughSymlink)
    );
}

#[test]
fn a_symlink_to_dot_dot_cannot_carry_a_later_entry_out() {
    let work = Work::new();
    let layer = Tar::new()
        .symlink("evil", "..")
        .file("evil/x", b"out")
        .finish();
    assert_eq!(
        hostile(work.unpack(&layer)),
        ("evil/x".into(), Refusal::ThroughSymlink)
    );
    // A symlink deeper down, into the canary by a relative path.
    let work = Work::new();
    let layer = Tar::new()
        .symlink("a/evil", "../../canary")
        .dir("a/evil/sub", 0o755)
        .finish();
    assert_eq!(
        hostile(work.unpack(&layer)),
        ("a/evil/sub".into(), Refusal::ThroughSymlink)
    );
}

#[test]
fn a_hard_link_out_of_the_layer_is_refused() {
    let work = Work::new();
    let layer = Tar::new().hard_link("pw", "../../etc/passwd").finish();
    let refused = Refusal::HardLink {
        target: "../../etc/passwd".into(),
    };
    assert_eq!(hostile(work.unpack(&layer)), ("pw".into(), refused));
}

#[test]
fn a_hard_link_to_a_file_this_layer_did_not_make_is_refused() {
    let work = Work::new();
    // A file in the layer's directory that no entry made: linking it would
    // work as far as the kernel is concerned.
    fs::create_dir(work.at("etc")).expect("etc");
    fs::write(work.at("etc/passwd"), b"root:x:0:0").expect("passwd");
    let layer = Tar::new().hard_link("pw", "/etc/passwd").finish();
    let refused = Refusal::HardLink {
        target: "/etc/passwd".into(),
    };
    assert_eq!(hostile(work.unpack(&layer)), ("pw".into(), refused));
    assert_eq!(
        fs::metadata(work.at("etc/passwd")).expect("passwd").nlink(),
        1
    );
    // Nor to this layer's own symlink or directory, or a file it replaced.
    for (layer, target) in [
        (
            Tar::new().symlink("s", "/etc/shadow").hard_link("pw", "s"),
            "s",
        ),
        (Tar::new().dir("d", 0o755).hard_link("pw", "d"), "d"),
        (
            Tar::new()
                .file("f", b"f")
                .dir("f", 0o755)
                .hard_link("pw", "f"),
            "f",
        ),
        (Tar::new().file("d/f", b"f").hard_link("d", "d/f"), "d/f"),
    ] {
        let work = Work::new();
        let refused = Refusal::HardLink {
            target: target.into(),
        };
        let name = if target == "d/f" { "d" } else { "pw" };
        assert_eq!(
            hostile(work.unpack(&layer.finish())),
            (name.into(), refused)
        );
    }
}

#[test]
fn whiteouts_naming_dot_dot_are_refused() {
    for name in [".wh...", "a/.wh..", ".wh."] {
        let work = Work::new();
        let layer = Tar::new().dir("a", 0o755).whiteout(name).finish();
        assert_eq!(
            hostile(work.unpack(&layer)),
            (name.into(), Refusal::Whiteout),
            "{name}"
        );
    }
}

#[test]
fn a_name_below_a_file_is_refused() {
    let work = Work::new();
    let layer = Tar::new().file("f", b"f").file("f/x", b"x").finish();
    assert_eq!(
        hostile(work.unpack(&layer)),
        ("f/x".into(), Refusal::ParentNotDirectory)
    );
}

#[test]
fn a_name_over_4095_bytes_is_refused() {
    let work = Work::new();
    let name = format!("{}f", "a/".repeat(2048));
    let layer = Tar::new().file(&name, b"x").finish();
    let (entry, why) = hostile(work.unpack(&layer));
    assert_eq!(why, Refusal::TooLong);
    assert_eq!(
        entry,
        format!("{}…", &name[..256]),
        "errors show the start of a long name"
    );
}

#[test]
fn an_unknown_entry_type_is_refused() {
    let work = Work::new();
    let layer = Tar::new()
        .raw(b"v", EntryType::new(b'V'), 0o644, (0, 0), T, None, b"")
        .finish();
    assert_eq!(
        hostile(work.unpack(&layer)),
        ("v".into(), Refusal::UnsupportedType(b'V'))
    );
}

#[test]
fn a_truncated_gzip_is_corrupt() {
    let work = Work::new();
    let blob = gzip(&Tar::new().file("a", &[7u8; 10_000]).finish());
    let cut = &blob[..blob.len() / 2];
    assert!(
        matches!(work.unpack(cut), Err(UnpackError::Corrupt { .. })),
        "{:?}",
        work.unpack(cut)
    );
    let work = Work::new();
    let blob = zstd(&Tar::new().file("a", &[7u8; 10_000]).finish());
    assert!(matches!(
        work.unpack(&blob[..blob.len() - 4]),
        Err(UnpackError::Corrupt { .. })
    ));
}

#[test]
fn a_garbled_tar_is_corrupt() {
    let work = Work::new();
    let mut tar = Tar::new().file("first", b"1").file("second", b"2").finish();
    tar[1024 + 10] ^= 0x55; // the second header's name: its checksum fails
    match work.unpack(&tar) {
        Err(UnpackError::Corrupt { at, .. }) => assert_eq!(at, Place::After("first".into())),
        other => panic!("expected corrupt, got {other:?}"),
    }
    let work = Work::new();
    assert!(matches!(
        work.unpack(&[0x42u8; 4096]),
        Err(UnpackError::Corrupt {
            at: Place::Start,
            ..
        })
    ));
}

#[test]
fn a_tar_cut_inside_a_file_is_corrupt() {
    let work = Work::new();
    let tar = Tar::new().file("big", &[1u8; 10_000]).finish();
    match work.unpack(&tar[..4000]) {
        Err(UnpackError::Corrupt { at, .. }) => assert_eq!(at, Place::Entry("big".into())),
        other => panic!("expected corrupt, got {other:?}"),
    }
}

#[test]
fn a_layer_over_max_bytes_is_too_large() {
    let work = Work::new();
    let layer = Tar::new()
        .file("first", &[0u8; 600])
        .file("second", &[0u8; 600])
        .finish();
    let limits = UnpackLimits {
        max_bytes: 1000,
        ..UnpackLimits::default()
    };
    match work.unpack_with(&layer, &limits) {
        Err(UnpackError::TooLarge { limit, at }) => {
            assert_eq!(
                (limit, at),
                (Limit::Bytes(1000), Place::Entry("second".into()))
            );
        }
        other => panic!("expected too large, got {other:?}"),
    }
    assert!(!work.at("second").exists(), "refused before it is written");
}

#[test]
fn a_layer_over_max_entries_is_too_large() {
    let work = Work::new();
    let layer = Tar::new()
        .file("a", b"")
        .file("b", b"")
        .file("c", b"")
        .finish();
    let limits = UnpackLimits {
        max_entries: 2,
        ..UnpackLimits::default()
    };
    assert!(matches!(
        work.unpack_with(&layer, &limits),
        Err(UnpackError::TooLarge {
            limit: Limit::Entries(2),
            ..
        })
    ));
}

#[test]
fn a_long_name_record_over_the_header_budget_is_too_large() {
    let work = Work::new();
    // A GNU long-name record of 5 MiB, which the tar crate would read into
    // memory whole.
    let long = vec![b'a'; 5 << 20];
    let mut header = Header::new_gnu();
    header.set_entry_type(EntryType::GNULongName);
    header.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
    header.set_size(long.len() as u64);
    header.set_cksum();
    let mut tar = Tar::new().file("before", b"");
    tar.0.append(&header, long.as_slice()).expect("append");
    let layer = tar.file("short", b"").finish();
    match work.unpack(&layer) {
        Err(UnpackError::TooLarge { limit, at }) => {
            assert_eq!(
                (limit, at),
                (Limit::HeaderBytes(4 << 20), Place::After("before".into()))
            );
        }
        other => panic!("expected too large, got {other:?}"),
    }
}

#[test]
fn a_failing_reader_is_an_io_error_not_a_corrupt_layer() {
    struct Failing(usize);
    impl std::io::Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::Error::other("the disk went away"));
            }
            let n = buf.len().min(self.0);
            buf[..n].fill(0);
            self.0 -= n;
            Ok(n)
        }
    }
    let work = Work::new();
    let result = unpack_layer(Failing(100), &work.layer_dir(), &UnpackLimits::default());
    assert!(
        matches!(
            result,
            Err(UnpackError::Io {
                what: "read the layer",
                ..
            })
        ),
        "{result:?}"
    );
}
