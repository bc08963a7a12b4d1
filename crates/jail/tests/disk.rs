//! The disk store: a writable layer holds at most its quota (a write past
//! it fails with EDQUOT while the store still has room), belongs to the
//! sandbox's root, and goes whole. Needs root, btrfs-progs and loop devices.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_jail::disk::DiskStore;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

struct Mounted<'a>(&'a Path);

impl Drop for Mounted<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0)
            .status();
    }
}

#[test]
fn a_layer_holds_its_quota_belongs_to_its_root_and_goes_whole() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the disk store needs root (mkfs, a loop mount, btrfs ioctls); run as root, as CI does"
    );
    let data = tempfile::tempdir().unwrap();
    let store = DiskStore::open(data.path(), 2 << 30)
        .unwrap_or_else(|e| panic!("the disk store: {e} ({:?})", std::error::Error::source(&e)));
    let _mounted = Mounted(store.root());
    // Opening again (a daemon restart) finds it as it was.
    let again = DiskStore::open(data.path(), 2 << 30).unwrap();
    assert_eq!(again, store);

    let path = store.create("sbx-1", 8 << 20, 1_000_000_000).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (1_000_000_000, 1_000_000_000, 0o755)
    );
    let other = store.create("sbx-2", 64 << 20, 1_000_065_536).unwrap();
    assert_eq!(store.ids(), ["sbx-1", "sbx-2"]);

    // Past 8 MiB the writes fail with EDQUOT; the other layer still takes
    // more than that.
    let write = |dir: &Path, mib: usize| -> std::io::Result<()> {
        let mut f = std::fs::File::create(dir.join("fill"))?;
        let chunk = vec![7u8; 1 << 20];
        for _ in 0..mib {
            f.write_all(&chunk)?;
            f.sync_data()?;
        }
        Ok(())
    };
    let err = write(&path, 32).expect_err("a write past the quota succeeded");
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    write(&other, 16).unwrap();

    store.remove("sbx-1").unwrap();
    store.remove("sbx-1").unwrap();
    assert!(!path.exists());
    std::fs::create_dir_all(other.join("a/b/c")).unwrap();
    store.remove("sbx-2").unwrap();
    assert!(store.ids().is_empty());
    assert!(store.create("../x", 1 << 20, 0).is_err());
}
