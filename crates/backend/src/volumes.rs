//! Where named volumes' files are on this host, for the tiers that run
//! here: subvolumes of the disk store, each under its quota (see
//! `airlock_jail::disk`). A sandbox's spec names a volume by id and by
//! this place ([`airlock_policy::VolumeMount`]); each tier mounts it its
//! own way. A tier that runs elsewhere (Kubernetes) brings its own.

use std::path::{Path, PathBuf};

use airlock_jail::disk::DiskStore;

pub use airlock_jail::disk::{is_volume_id, DiskError as VolumeError};

/// The volumes of the disk store at a root.
#[derive(Debug, Clone)]
pub struct LocalVolumes {
    disk: DiskStore,
}

impl LocalVolumes {
    /// The volumes of the disk store whose root is `root` (set up by the
    /// daemon's start).
    pub fn at(root: &Path) -> LocalVolumes {
        LocalVolumes {
            disk: DiskStore::at(root),
        }
    }

    /// Where volume `id`'s files are.
    pub fn path(&self, id: &str) -> PathBuf {
        self.disk.volume_path(id)
    }

    /// Makes volume `id`, holding at most `bytes`, its root owned by
    /// `owner` as sandboxes see it.
    pub fn create(&self, id: &str, bytes: u64, owner: u32) -> Result<PathBuf, VolumeError> {
        self.disk.create_volume(id, bytes, owner)
    }

    /// Removes volume `id` and its files (idempotent).
    pub fn remove(&self, id: &str) -> Result<(), VolumeError> {
        self.disk.remove_volume(id)
    }

    /// The ids of the volumes that have files here.
    pub fn ids(&self) -> Vec<String> {
        self.disk.volume_ids()
    }
}
