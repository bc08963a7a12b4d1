//! Writable layers on disk, each under a hard quota.
//!
//! A sandbox's writable layer (the overlay's upper and work directories,
//! or the whole root of a `host` sandbox) is a btrfs subvolume of its own
//! on the *disk store*, with a quota group limiting what it may hold: a
//! write past `limits.disk` fails with `EDQUOT` ("Disk quota exceeded") in
//! the sandbox, and the host's disk and the other sandboxes are untouched.
//! A layer costs three ioctls to make (create the subvolume, set its
//! limit, hand it to the sandbox's root) and one to remove, not an mkfs.
//!
//! Why btrfs: XFS project quotas and ext4 project quotas both need the
//! kernel's quota support (`CONFIG_XFS_QUOTA`, `CONFIG_QUOTA`), which
//! kernels such as this CI machine's leave out; btrfs quota groups are part
//! of btrfs itself. The disk store is the data directory's own file system
//! when that is btrfs, else a sparse image `<data-dir>/disk.img` formatted
//! once (`mkfs.btrfs`) and loop-mounted on `<data-dir>/disk` with quotas
//! enabled; both are set up once, when the daemon starts.
//!
//! Layers live at `<disk>/sandboxes/<id>`. [`DiskStore::remove`] is
//! idempotent, and [`DiskStore::ids`] lists what is there so a starting
//! daemon can remove the layers of sandboxes it has no record of.
//!
//! Named volumes, which outlive sandboxes, are subvolumes of the same
//! store under their own quota, at `<disk>/volumes/<id>`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `BTRFS_IOC_SUBVOL_CREATE`: `_IOW(0x94, 14, struct btrfs_ioctl_vol_args)`.
const SUBVOL_CREATE: u64 = 0x5000_940E;
/// `BTRFS_IOC_SNAP_DESTROY`: `_IOW(0x94, 15, struct btrfs_ioctl_vol_args)`.
const SNAP_DESTROY: u64 = 0x5000_940F;
/// `BTRFS_IOC_QGROUP_LIMIT`: `_IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)`.
const QGROUP_LIMIT: u64 = 0x8030_942B;
/// `BTRFS_QGROUP_LIMIT_MAX_RFER`.
const LIMIT_MAX_RFER: u64 = 1;
/// Tries of a removal that finds the layer still mounted (50 ms apart).
const BUSY_TRIES: u32 = 40;
/// `BTRFS_SUPER_MAGIC`, `statfs(2)`'s `f_type` of btrfs.
const BTRFS_MAGIC: i64 = 0x9123_683E;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; 4088],
}

/// `struct btrfs_ioctl_qgroup_limit_args`.
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// The disk store could not be set up, or a layer made or removed.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("cannot {what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cannot run {program} to set up the disk store (install btrfs-progs)")]
    Spawn {
        program: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{program} failed to set up the disk store: {stderr}")]
    Failed {
        program: &'static str,
        stderr: String,
    },
    #[error("`{0}` is not a sandbox or volume id")]
    BadId(String),
}

fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> DiskError {
    move |source| DiskError::Io { what, source }
}

/// The file system the writable layers live on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskStore {
    root: PathBuf,
}

fn is_btrfs(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|s| s.f_type == BTRFS_MAGIC)
}

fn run(program: &'static str, args: &[&std::ffi::OsStr]) -> Result<(), DiskError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| DiskError::Spawn { program, source })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(DiskError::Failed {
            program,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

impl DiskStore {
    /// The store of the daemon whose data directory is `data_dir`, set up
    /// on first use: the data directory itself if it is btrfs, else a
    /// sparse image of `size` bytes loop-mounted on `<data_dir>/disk` (made
    /// once; mounted again after a reboot). Quotas are enabled either way.
    pub fn open(data_dir: &Path, size: u64) -> Result<DiskStore, DiskError> {
        let (mount, root) = if is_btrfs(data_dir) {
            (data_dir.to_owned(), data_dir.join("disk"))
        } else {
            let mount = data_dir.join("disk");
            std::fs::create_dir_all(&mount)
                .map_err(io_error("create the disk store's mount point"))?;
            if !is_btrfs(&mount) {
                let image = data_dir.join("disk.img");
                if !image.exists() {
                    let file =
                        File::create(&image).map_err(io_error("create the disk store's image"))?;
                    file.set_len(size)
                        .map_err(io_error("size the disk store's image"))?;
                    drop(file);
                    run("mkfs.btrfs", &["-q".as_ref(), image.as_os_str()])?;
                }
                run(
                    "mount",
                    &[
                        "-o".as_ref(),
                        "loop".as_ref(),
                        image.as_os_str(),
                        mount.as_os_str(),
                    ],
                )?;
            }
            (mount.clone(), mount)
        };
        // Idempotent: enabling quotas that are on already is a no-op.
        run(
            "btrfs",
            &["quota".as_ref(), "enable".as_ref(), mount.as_os_str()],
        )?;
        let store = DiskStore { root };
        std::fs::create_dir_all(store.sandboxes()).map_err(io_error("create the disk store"))?;
        Ok(store)
    }

    /// The store at `root`, set up already (by the daemon, for its
    /// supervisors).
    pub fn at(root: impl Into<PathBuf>) -> DiskStore {
        DiskStore { root: root.into() }
    }

    /// Its root (what `at` takes).
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn sandboxes(&self) -> PathBuf {
        self.root.join("sandboxes")
    }

    /// Where the writable layer of sandbox `id` is.
    pub fn path(&self, id: &str) -> PathBuf {
        self.sandboxes().join(id)
    }

    /// Makes the writable layer of sandbox `id`: a subvolume holding at
    /// most `bytes`, its root directory owned by `owner` (the host uid
    /// and gid of the sandbox's root) with mode 0755.
    pub fn create(&self, id: &str, bytes: u64, owner: u32) -> Result<PathBuf, DiskError> {
        if !crate::launch::is_sandbox_id(id) {
            return Err(DiskError::BadId(id.to_owned()));
        }
        make_subvolume(&self.sandboxes(), id, bytes, owner)
    }

    /// Removes the writable layer of sandbox `id` and everything in it;
    /// one that is not there is not an error.
    pub fn remove(&self, id: &str) -> Result<(), DiskError> {
        if !crate::launch::is_sandbox_id(id) {
            return Err(DiskError::BadId(id.to_owned()));
        }
        destroy_subvolume(&self.sandboxes(), id)
    }

    fn volumes(&self) -> PathBuf {
        self.root.join("volumes")
    }

    /// Where the files of volume `id` are.
    pub fn volume_path(&self, id: &str) -> PathBuf {
        self.volumes().join(id)
    }

    /// Makes volume `id`: a subvolume holding at most `bytes`, its root
    /// directory owned by uid and gid `owner` as sandboxes see them (a
    /// volume keeps sandbox ids, not host ones: each tier maps them).
    pub fn create_volume(&self, id: &str, bytes: u64, owner: u32) -> Result<PathBuf, DiskError> {
        if !is_volume_id(id) {
            return Err(DiskError::BadId(id.to_owned()));
        }
        std::fs::create_dir_all(self.volumes()).map_err(io_error("create the volume store"))?;
        make_subvolume(&self.volumes(), id, bytes, owner)
    }

    /// Removes volume `id` and its files; one that is not there is not an
    /// error.
    pub fn remove_volume(&self, id: &str) -> Result<(), DiskError> {
        if !is_volume_id(id) {
            return Err(DiskError::BadId(id.to_owned()));
        }
        destroy_subvolume(&self.volumes(), id)
    }

    fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// Where the memory image of sandbox `id` is kept while it is
    /// checkpointed (a plain directory: its size is bounded by the
    /// sandbox's memory limit, not by its disk quota).
    pub fn checkpoint_path(&self, id: &str) -> Result<PathBuf, DiskError> {
        if !crate::launch::is_sandbox_id(id) {
            return Err(DiskError::BadId(id.to_owned()));
        }
        Ok(self.checkpoints().join(id))
    }

    /// Removes the memory image of sandbox `id`; none is not an error.
    pub fn remove_checkpoint(&self, id: &str) -> Result<(), DiskError> {
        match std::fs::remove_dir_all(self.checkpoint_path(id)?) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error("remove a memory image")(e)),
        }
    }

    /// The sandbox ids that have a memory image here.
    pub fn checkpoint_ids(&self) -> Vec<String> {
        list_ids(&self.checkpoints(), crate::launch::is_sandbox_id)
    }

    /// The ids of the volumes here.
    pub fn volume_ids(&self) -> Vec<String> {
        list_ids(&self.volumes(), is_volume_id)
    }

    /// The sandbox ids that have a writable layer here.
    pub fn ids(&self) -> Vec<String> {
        list_ids(&self.sandboxes(), crate::launch::is_sandbox_id)
    }
}

/// Whether `id` is a volume's: `vol-` and 1 to 32 lowercase hex digits.
pub fn is_volume_id(id: &str) -> bool {
    id.strip_prefix("vol-").is_some_and(|hex| {
        (1..=32).contains(&hex.len())
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn list_ids(dir: &Path, valid: fn(&str) -> bool) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| valid(name))
        .collect();
    ids.sort();
    ids
}

/// Makes subvolume `name` in `dir` holding at most `bytes`, its root owned
/// by `owner` with mode 0755.
fn make_subvolume(dir: &Path, name: &str, bytes: u64, owner: u32) -> Result<PathBuf, DiskError> {
    let parent = File::open(dir).map_err(io_error("open the disk store"))?;
    let mut args = VolArgs {
        fd: 0,
        name: [0; 4088],
    };
    args.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: the ioctl reads a `struct btrfs_ioctl_vol_args` (`args`,
    // live and of that layout, its name NUL-terminated by the zeroed
    // rest) on the directory `parent`, which we hold open.
    let made = unsafe { libc::ioctl(parent.as_raw_fd(), SUBVOL_CREATE as _, &args) };
    if made != 0 {
        return Err(DiskError::Io {
            what: "create a btrfs subvolume (a writable layer or a volume)",
            source: io::Error::last_os_error(),
        });
    }
    let path = dir.join(name);
    let undo = |what: &'static str, source: io::Error| {
        let _ = destroy_subvolume(dir, name);
        DiskError::Io { what, source }
    };
    let made = File::open(&path).map_err(|e| undo("open a new subvolume", e))?;
    let limit = QgroupLimitArgs {
        // 0: the subvolume `made` is in.
        qgroupid: 0,
        flags: LIMIT_MAX_RFER,
        max_rfer: bytes,
        max_excl: 0,
        rsv_rfer: 0,
        rsv_excl: 0,
    };
    // SAFETY: the ioctl reads a `struct btrfs_ioctl_qgroup_limit_args`
    // (`limit`, live and of that layout) for the subvolume of `made`.
    let limited = unsafe { libc::ioctl(made.as_raw_fd(), QGROUP_LIMIT as _, &limit) };
    if limited != 0 {
        return Err(undo(
            "limit a subvolume (btrfs quotas)",
            io::Error::last_os_error(),
        ));
    }
    let id_owner = Some(rustix::fs::Uid::from_raw(owner));
    let gid_owner = Some(rustix::fs::Gid::from_raw(owner));
    if let Err(e) = rustix::fs::fchown(&made, id_owner, gid_owner) {
        return Err(undo("hand over a new subvolume", e.into()));
    }
    Ok(path)
}

/// Removes subvolume `name` in `dir` and everything in it; one that is not
/// there is not an error.
fn destroy_subvolume(dir: &Path, name: &str) -> Result<(), DiskError> {
    let parent = match File::open(dir) {
        Ok(parent) => parent,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error("open the disk store")(e)),
    };
    let mut args = VolArgs {
        fd: 0,
        name: [0; 4088],
    };
    args.name[..name.len()].copy_from_slice(name.as_bytes());
    let mut busy = 0;
    let source = loop {
        // SAFETY: as in `make_subvolume`: a live `struct
        // btrfs_ioctl_vol_args` with a NUL-terminated name, on the
        // directory `parent`.
        let removed = unsafe { libc::ioctl(parent.as_raw_fd(), SNAP_DESTROY as _, &args) };
        if removed == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        // Still mounted in the namespace of a sandbox whose last
        // process is just gone: the kernel lets go of it shortly.
        if error.raw_os_error() == Some(libc::EBUSY) && busy < BUSY_TRIES {
            busy += 1;
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        }
        break error;
    };
    match source.raw_os_error() {
        Some(libc::ENOENT) => Ok(()),
        // Not a subvolume (made by hand, or a half-made one): a plain
        // directory tree.
        Some(libc::EINVAL) | Some(libc::ENOTTY) => match std::fs::remove_dir_all(dir.join(name)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error("remove a subvolume")(e)),
        },
        _ => Err(DiskError::Io {
            what: "remove a subvolume",
            source,
        }),
    }
}
