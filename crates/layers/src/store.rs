//! The layer store on disk: `<data-dir>/layers/`.
//!
//! ```text
//! layers/
//!   sha256/<hex>/    one unpacked layer, named by its diff_id; never
//!                    changed once there, shared read-only by every sandbox
//!                    and template that stacks it
//!   tmp/<name>/      a layer being unpacked (or being removed): locked
//!                    (flock) by the process doing it while it lasts
//! ```
//!
//! A layer is unpacked into `tmp/` and renamed into `sha256/` only once it
//! is whole and its digest checked, so `sha256/` holds whole layers only. A
//! pull or build killed half-way leaves a `tmp/` entry whose lock went with
//! its process: [`LayerStore::sweep`] removes those. A removal renames the
//! layer into `tmp/` first, so a crash during it leaves nothing under
//! `sha256/` that is half gone.

use rustix::fs::{flock, FlockOperation};
use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// `sha256:` and 64 lowercase hex digits, the only digests the store
/// names layers by.
pub fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// The store's directory.
#[derive(Debug, Clone)]
pub struct LayerStore {
    root: PathBuf,
}

/// A directory a layer is being unpacked into, locked while it lives;
/// removed when dropped unless committed.
#[derive(Debug)]
pub struct Staging {
    path: PathBuf,
    lock: Option<File>,
}

impl Staging {
    /// The (empty, at first) directory to unpack into.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.lock.take().is_some() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// What [`LayerStore::sweep`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Abandoned entries of `tmp/` (half-unpacked or half-removed layers).
    pub abandoned: usize,
    /// Entries of `sha256/` that are not layers (bad names, files).
    pub strays: usize,
}

static STAGED: AtomicU64 = AtomicU64::new(0);

impl LayerStore {
    /// Opens the store at `root`, creating it (mode 0700) if needed.
    pub fn open(root: impl Into<PathBuf>) -> io::Result<LayerStore> {
        let root = root.into();
        for dir in [root.clone(), root.join("sha256"), root.join("tmp")] {
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
        Ok(LayerStore { root })
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the layer `diff_id` is (or would be) unpacked; `None` for a
    /// name that is not a sha256 digest.
    pub fn path_of(&self, diff_id: &str) -> Option<PathBuf> {
        if !is_sha256_digest(diff_id) {
            return None;
        }
        Some(self.root.join("sha256").join(&diff_id["sha256:".len()..]))
    }

    /// Whether the layer `diff_id` is in the store.
    pub fn has(&self, diff_id: &str) -> bool {
        self.path_of(diff_id).is_some_and(|p| p.is_dir())
    }

    /// A new, locked, empty directory under `tmp/` to unpack a layer into.
    pub fn stage(&self) -> io::Result<Staging> {
        let n = STAGED.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path = self
            .root
            .join("tmp")
            .join(format!("{}-{nanos}-{n}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o755).create(&path)?;
        let lock = File::open(&path)?;
        flock(&lock, FlockOperation::NonBlockingLockExclusive)?;
        Ok(Staging {
            path,
            lock: Some(lock),
        })
    }

    /// Moves a whole, checked layer into place as `diff_id`. If the store
    /// got the same layer meanwhile (another import), the staged copy goes.
    pub fn commit(&self, mut staging: Staging, diff_id: &str) -> io::Result<PathBuf> {
        let target = self
            .path_of(diff_id)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a sha256 digest"))?;
        if target.is_dir() {
            return Ok(target);
        }
        std::fs::rename(&staging.path, &target)?;
        staging.lock = None;
        Ok(target)
    }

    /// The layers in the store, by diff_id.
    pub fn layers(&self) -> io::Result<Vec<String>> {
        let mut layers = Vec::new();
        for entry in std::fs::read_dir(self.root.join("sha256"))? {
            let entry = entry?;
            let name = format!("sha256:{}", entry.file_name().to_string_lossy());
            if is_sha256_digest(&name) && entry.file_type()?.is_dir() {
                layers.push(name);
            }
        }
        layers.sort();
        Ok(layers)
    }

    /// Removes the layer `diff_id` (first out of `sha256/`, then its
    /// files); removing one that is not there is not an error.
    pub fn remove(&self, diff_id: &str) -> io::Result<()> {
        let Some(path) = self.path_of(diff_id) else {
            return Ok(());
        };
        let trash = self.stage()?;
        match std::fs::remove_dir(trash.path()) {
            Ok(()) => {}
            Err(e) => return Err(e),
        }
        match std::fs::rename(&path, trash.path()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Nothing to remove; the staging guard tidies the lock.
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        drop(trash);
        Ok(())
    }

    /// How many entries of `tmp/` no process is working on.
    pub fn abandoned(&self) -> io::Result<usize> {
        let mut abandoned = 0;
        for entry in std::fs::read_dir(self.root.join("tmp"))? {
            let path = entry?.path();
            if match File::open(&path) {
                Ok(file) => flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok(),
                Err(e) => e.kind() != io::ErrorKind::NotFound,
            } {
                abandoned += 1;
            }
        }
        Ok(abandoned)
    }

    /// Removes what no process is working on in `tmp/`, and whatever in
    /// `sha256/` is not a layer.
    pub fn sweep(&self) -> io::Result<Swept> {
        let mut swept = Swept::default();
        for entry in std::fs::read_dir(self.root.join("tmp"))? {
            let path = entry?.path();
            let abandoned = match File::open(&path) {
                Ok(file) => flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                // Not a directory we can open (a file left by hand): junk.
                Err(_) => true,
            };
            if abandoned {
                remove_any(&path)?;
                swept.abandoned += 1;
            }
        }
        for entry in std::fs::read_dir(self.root.join("sha256"))? {
            let entry = entry?;
            let name = format!("sha256:{}", entry.file_name().to_string_lossy());
            if !(is_sha256_digest(&name) && entry.file_type()?.is_dir()) {
                remove_any(&entry.path())?;
                swept.strays += 1;
            }
        }
        Ok(swept)
    }
}

fn remove_any(path: &Path) -> io::Result<()> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    #[test]
    fn digests_are_checked() {
        assert!(is_sha256_digest(DIGEST));
        assert!(!is_sha256_digest("sha256:AAAA"));
        assert!(!is_sha256_digest("sha512:aaaa"));
        assert!(!is_sha256_digest(&format!("{DIGEST}/..")));
    }

    #[test]
    fn a_staged_layer_is_removed_unless_committed_and_swept_only_once_abandoned() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path().join("layers")).unwrap();
        let dropped = store.stage().unwrap();
        let gone = dropped.path().to_owned();
        drop(dropped);
        assert!(!gone.exists());

        let staged = store.stage().unwrap();
        std::fs::write(staged.path().join("f"), "x").unwrap();
        // Locked by us: not abandoned.
        assert_eq!(store.sweep().unwrap(), Swept::default());
        let path = store.commit(staged, DIGEST).unwrap();
        assert_eq!(std::fs::read_to_string(path.join("f")).unwrap(), "x");
        assert_eq!(store.layers().unwrap(), [DIGEST]);

        // A staging dir whose process died (no lock) and a stray are swept.
        std::fs::create_dir(store.root().join("tmp/1-2-3")).unwrap();
        std::fs::write(store.root().join("sha256/junk"), "").unwrap();
        assert_eq!(
            store.sweep().unwrap(),
            Swept {
                abandoned: 1,
                strays: 1
            }
        );
        assert_eq!(store.layers().unwrap(), [DIGEST]);

        store.remove(DIGEST).unwrap();
        store.remove(DIGEST).unwrap();
        assert!(store.layers().unwrap().is_empty());
        assert_eq!(
            std::fs::read_dir(store.root().join("tmp")).unwrap().count(),
            0
        );
    }
}
