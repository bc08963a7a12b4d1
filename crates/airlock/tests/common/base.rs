//! The `base` template as a test fixture, built once per machine and
//! shared by every test that needs it: `airlock template bootstrap
//! --output` (mmdebstrap from the host's apt sources) into an OCI archive
//! under /var/cache/airlock-test, named by the recipe, so a change of the
//! recipe builds a new one. The first test to need it builds it (minutes)
//! while the others wait on a lock.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;

const CACHE: &str = "/var/cache/airlock-test";

/// What names the fixture: the binary's bootstrap recipe. Bump when the
/// recipe (packages, hooks) changes.
const RECIPE: &str = "base-v2";

/// Holds an exclusive lock on `name` in the cache while it lives.
struct Locked(#[allow(dead_code)] std::fs::File);

fn lock(name: &str) -> Locked {
    std::fs::create_dir_all(CACHE).unwrap();
    let file = std::fs::File::create(format!("{CACHE}/{name}.lock")).unwrap();
    // SAFETY: flock on a descriptor this function owns; no memory involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "cannot lock {CACHE}/{name}.lock");
    Locked(file)
}

/// The OCI archive of the `base` template.
pub fn base_archive() -> PathBuf {
    let path = PathBuf::from(format!("{CACHE}/{RECIPE}.tar"));
    let _locked = lock(RECIPE);
    if path.exists() {
        return path;
    }
    let found = Command::new("sh")
        .args(["-c", "command -v mmdebstrap"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "the base template tests need mmdebstrap (Debian package mmdebstrap; scripts/deps installs it)"
    );
    eprintln!(
        "building the base template fixture {} (once; minutes)",
        path.display()
    );
    let out = Command::new(super::binary())
        .args(["template", "bootstrap", "base", "--output"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "template bootstrap --output: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// The base template's root filesystem as a directory (for `airlock run
/// --template DIR`), extracted from the archive's one layer by GNU tar
/// as root (owners, modes and setuid bits as the packages made them).
pub fn base_rootfs() -> PathBuf {
    let dir = PathBuf::from(format!("{CACHE}/{RECIPE}-rootfs"));
    let archive = base_archive();
    let _locked = lock(&format!("{RECIPE}-rootfs"));
    if dir.join("usr/bin/python3").exists() {
        return dir;
    }
    let index: serde_json::Value =
        serde_json::from_slice(&extract(&archive, "index.json")).unwrap();
    let manifest = blob(index["manifests"][0]["digest"].as_str().unwrap());
    let manifest: serde_json::Value =
        serde_json::from_slice(&extract(&archive, &manifest)).unwrap();
    let layer = blob(manifest["layers"][0]["digest"].as_str().unwrap());
    let partial = PathBuf::from(format!("{CACHE}/{RECIPE}-rootfs.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).unwrap();
    let script = format!(
        "tar -xOf '{}' '{layer}' | tar -x --numeric-owner -C '{}' --exclude './dev/*'",
        archive.display(),
        partial.display()
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "extracting the base rootfs: {out:?}");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&partial, &dir).unwrap();
    dir
}

fn blob(digest: &str) -> String {
    format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))
}

fn extract(archive: &std::path::Path, name: &str) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(name)
        .output()
        .unwrap();
    assert!(out.status.success(), "tar -xOf {name}: {out:?}");
    out.stdout
}
