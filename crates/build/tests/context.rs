//! The build context: selection (globs, directories, `.dockerignore`),
//! refusal of everything that would leave the context, the bounds, and the
//! tar stream a COPY ships.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_build::context::{
    hash_sources, pack_sources, Context, ContextError, Limits, PackOptions, Packed,
};
use std::fs;
use std::io::Read;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

fn write(root: &Path, path: &str, content: &str) {
    let full = root.join(path);
    fs::create_dir_all(full.parent().unwrap()).unwrap();
    fs::write(full, content).unwrap();
}

fn sources(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A context of a small project.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "app.py", "print('hi')\n");
    write(root, "lib/util.py", "X = 1\n");
    write(root, "lib/data.json", "{}\n");
    write(
        root,
        "node_modules/left-pad/index.js",
        "module.exports = 1\n",
    );
    write(root, "logs/a.log", "noise\n");
    write(root, "logs/keep.log", "kept\n");
    write(root, "docs/README.md", "# read me\n");
    write(root, "docs/secret.md", "secret\n");
    write(root, "nested/deep/er/secret.key", "key\n");
    write(root, "nested/deep/er/ok.txt", "ok\n");
    write(
        root,
        ".dockerignore",
        "# build output and dependencies\nnode_modules\n*.log\nlogs/*.log\n!logs/keep.log\ndocs\n!docs/README.md\n**/secret*\n",
    );
    dir
}

/// An entry of a tar stream: name, kind, mode, owner, content (or a
/// symlink's target).
type TarEntry = (String, char, u32, (u64, u64), String);

fn entries(tar: &[u8]) -> Vec<TarEntry> {
    let mut archive = tar::Archive::new(tar);
    let mut out = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let header = entry.header().clone();
        let kind = match header.entry_type() {
            tar::EntryType::Directory => 'd',
            tar::EntryType::Regular => 'f',
            tar::EntryType::Symlink => 'l',
            other => panic!("a {other:?} entry"),
        };
        let name = entry.path().unwrap().to_string_lossy().into_owned();
        let mut content = String::new();
        if kind == 'l' {
            content = entry
                .link_name()
                .unwrap()
                .unwrap()
                .to_string_lossy()
                .into_owned();
        } else {
            entry.read_to_string(&mut content).unwrap();
        }
        out.push((
            name,
            kind,
            header.mode().unwrap(),
            (header.uid().unwrap(), header.gid().unwrap()),
            content,
        ));
    }
    out
}

fn names(tar: &[u8]) -> Vec<String> {
    entries(tar).into_iter().map(|e| e.0).collect()
}

fn pack(root: &Path, srcs: &[&str], dest: &str, options: PackOptions) -> (Packed, Vec<u8>) {
    let mut out = Vec::new();
    let packed = pack_sources(root, &sources(srcs), dest, &options, &mut out).unwrap();
    (packed, out)
}

#[test]
fn the_whole_context_without_what_dockerignore_excludes() {
    let dir = project();
    let (packed, tar) = pack(dir.path(), &["."], "/app/", PackOptions::default());
    assert_eq!(packed.dir, "/app");
    assert_eq!(
        names(&tar),
        vec![
            ".dockerignore",
            "app.py",
            "docs",
            "docs/README.md",
            "lib",
            "lib/data.json",
            "lib/util.py",
            "logs",
            "logs/keep.log",
            "nested",
            "nested/deep",
            "nested/deep/er",
            "nested/deep/er/ok.txt",
        ]
    );
    let digest = hash_sources(dir.path(), &sources(&["."])).unwrap();
    assert_eq!(packed.digest, digest, "the stream and the key see the same");
    assert_eq!(digest.entries, 13);
    assert!(digest.digest.starts_with("sha256:") && digest.digest.len() == 71);
}

#[test]
fn dockerignore_decides_what_a_source_finds() {
    let dir = project();
    let root = dir.path();
    let err = |srcs: &[&str]| hash_sources(root, &sources(srcs)).unwrap_err();
    assert!(matches!(
        err(&["node_modules"]),
        ContextError::Excluded { .. }
    ));
    assert!(matches!(
        err(&["docs/secret.md"]),
        ContextError::Excluded { .. }
    ));
    // Beneath an excluded directory, unless an exception brings it back.
    assert!(matches!(
        err(&["node_modules/left-pad/index.js"]),
        ContextError::Excluded { .. }
    ));
    write(root, "docs/other.md", "x");
    assert!(matches!(
        err(&["docs/other.md"]),
        ContextError::Excluded { .. }
    ));
    assert!(hash_sources(root, &sources(&["docs/README.md"])).is_ok());
    assert!(hash_sources(root, &sources(&["logs/keep.log"])).is_ok());
    let (_, tar) = pack(root, &["logs/*.log"], "/l/", PackOptions::default());
    assert_eq!(names(&tar), vec!["keep.log"]);
    // A change of an excluded file changes no digest.
    let before = hash_sources(root, &sources(&["."])).unwrap();
    write(root, "node_modules/left-pad/index.js", "changed");
    write(root, "docs/secret.md", "changed");
    assert_eq!(hash_sources(root, &sources(&["."])).unwrap(), before);
    // A change of an included one does.
    write(root, "docs/README.md", "changed");
    assert_ne!(hash_sources(root, &sources(&["."])).unwrap(), before);
}

#[test]
fn globs_files_and_layout() {
    let dir = project();
    let root = dir.path();
    let (packed, tar) = pack(
        root,
        &["lib/*.py", "app.py"],
        "/srv/",
        PackOptions::default(),
    );
    assert_eq!(packed.dir, "/srv");
    assert_eq!(names(&tar), vec!["util.py", "app.py"]);
    // One file to a destination without a slash is that file.
    let (packed, tar) = pack(root, &["app.py"], "/srv/main.py", PackOptions::default());
    assert_eq!(packed.dir, "/srv");
    assert_eq!(names(&tar), vec!["main.py"]);
    // Unless the image has a directory there.
    let options = PackOptions {
        dest_is_dir: true,
        ..PackOptions::default()
    };
    let (packed, tar) = pack(root, &["app.py"], "/srv/main.py", options);
    assert_eq!(packed.dir, "/srv/main.py");
    assert_eq!(names(&tar), vec!["app.py"]);
    // A directory's contents go into the destination.
    let (packed, tar) = pack(root, &["lib"], "/opt/lib", PackOptions::default());
    assert_eq!(packed.dir, "/opt/lib");
    assert_eq!(names(&tar), vec!["data.json", "util.py"]);
    let (_, tar) = pack(root, &["./lib/[u]*"], "/x/", PackOptions::default());
    assert_eq!(names(&tar), vec!["util.py"]);
    let err = |srcs: &[&str]| hash_sources(root, &sources(srcs)).unwrap_err();
    assert!(matches!(err(&["*.rs"]), ContextError::NoMatch { .. }));
    assert!(matches!(
        err(&["missing.txt"]),
        ContextError::NotFound { .. }
    ));
    assert!(matches!(err(&["l*/util.py"]), ContextError::Glob { .. }));
    let mut out = Vec::new();
    assert!(matches!(
        pack_sources(
            root,
            &sources(&["app.py"]),
            "rel/",
            &PackOptions::default(),
            &mut out
        ),
        Err(ContextError::Destination { .. })
    ));
}

#[test]
fn owners_and_modes() {
    let dir = project();
    let root = dir.path();
    fs::set_permissions(root.join("app.py"), fs::Permissions::from_mode(0o6755)).unwrap();
    let (_, tar) = pack(root, &["app.py"], "/a", PackOptions::default());
    let entry = &entries(&tar)[0];
    assert_eq!(entry.2, 0o755, "set-id bits are cleared");
    assert_eq!(entry.3, (0, 0), "root owns what is copied");
    assert_eq!(entry.4, "print('hi')\n");
    let options = PackOptions {
        uid: 1000,
        gid: 1001,
        chmod: Some(0o600),
        dest_is_dir: false,
    };
    let (_, tar) = pack(root, &["lib"], "/l/", options);
    for (name, _, mode, owner, _) in entries(&tar) {
        assert_eq!((mode, owner), (0o600, (1000, 1001)), "{name}");
    }
    // The mode is in the digest; the owner and the time are not.
    let before = hash_sources(root, &sources(&["app.py"])).unwrap();
    fs::set_permissions(root.join("app.py"), fs::Permissions::from_mode(0o644)).unwrap();
    let after = hash_sources(root, &sources(&["app.py"])).unwrap();
    assert_ne!(before, after);
    let file = fs::File::options()
        .append(true)
        .open(root.join("app.py"))
        .unwrap();
    file.set_modified(std::time::SystemTime::UNIX_EPOCH)
        .unwrap();
    assert_eq!(hash_sources(root, &sources(&["app.py"])).unwrap(), after);
}

#[test]
fn nothing_outside_the_context_is_reached() {
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "secret", "host secret");
    let dir = project();
    let root = dir.path();
    symlink(outside.path().join("secret"), root.join("abs-link")).unwrap();
    symlink("../../etc/passwd", root.join("lib/up-link")).unwrap();
    symlink(outside.path(), root.join("out-dir")).unwrap();
    symlink("lib", root.join("lib-link")).unwrap();
    symlink("util.py", root.join("lib/in-link")).unwrap();
    let err = |srcs: &[&str]| hash_sources(root, &sources(srcs)).unwrap_err();
    for (source, what) in [
        ("abs-link", "points out of the build context"),
        ("lib/up-link", "points out of the build context"),
        ("out-dir", "points out of the build context"),
        ("out-dir/secret", "goes through a symlink"),
        ("lib-link/util.py", "goes through a symlink"),
        ("../x", "climbs out of the build context"),
        ("lib/../../x", "climbs out of the build context"),
        ("/etc/passwd", "is absolute"),
    ] {
        let message = err(&[source]).to_string();
        assert!(message.contains(what), "{source}: {message}");
    }
    // A symlink named as a source inside the context is copied as a
    // symlink; so is every symlink inside a copied directory, whatever it
    // points at (never followed: it resolves in the sandbox).
    let (_, tar) = pack(root, &["lib-link"], "/x/", PackOptions::default());
    assert_eq!(
        entries(&tar),
        vec![("lib-link".into(), 'l', 0o777, (0, 0), "lib".into())]
    );
    let (_, tar) = pack(root, &["lib"], "/x/", PackOptions::default());
    let links: Vec<(String, String)> = entries(&tar)
        .into_iter()
        .filter(|e| e.1 == 'l')
        .map(|e| (e.0, e.4))
        .collect();
    assert_eq!(
        links,
        vec![
            ("in-link".to_owned(), "util.py".to_owned()),
            ("up-link".to_owned(), "../../etc/passwd".to_owned())
        ]
    );
    let all = entries(&tar);
    assert!(all.iter().all(|e| !e.4.contains("host secret")));
    // A .dockerignore that is a symlink is not read.
    let dir2 = tempfile::tempdir().unwrap();
    write(outside.path(), "ignore", "*\n");
    write(dir2.path(), "f", "x");
    symlink(
        outside.path().join("ignore"),
        dir2.path().join(".dockerignore"),
    )
    .unwrap();
    assert!(matches!(
        Context::open(dir2.path(), Limits::default()),
        Err(ContextError::ReadIgnore(_))
    ));
}

#[test]
fn special_files_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "f", "x");
    let fifo = root.join("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(status.success(), "mkfifo failed");
    let (packed, tar) = pack(root, &["."], "/x/", PackOptions::default());
    assert_eq!(names(&tar), vec!["f"]);
    assert_eq!(packed.digest.skipped, 1);
}

#[test]
fn bounds() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for i in 0..10 {
        write(root, &format!("d/f{i}"), "0123456789");
    }
    let context = |max_entries, max_bytes| {
        Context::open(
            root,
            Limits {
                max_entries,
                max_bytes,
            },
        )
        .unwrap()
    };
    let all = sources(&["."]);
    // The directory and its ten files.
    assert_eq!(context(11, 100).hash_sources(&all).unwrap().entries, 11);
    assert!(matches!(
        context(10, 100).hash_sources(&all),
        Err(ContextError::TooManyEntries { max: 10 })
    ));
    assert!(matches!(
        context(11, 99).hash_sources(&all),
        Err(ContextError::TooLarge { max: 99 })
    ));
    let mut out = Vec::new();
    assert!(matches!(
        context(5, 100).pack_sources(&all, "/x/", &PackOptions::default(), &mut out),
        Err(ContextError::TooManyEntries { max: 5 })
    ));
    // The default bound of entries is 100,000.
    assert_eq!(Limits::default().max_entries, 100_000);
}
