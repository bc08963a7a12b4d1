//! Host-side bookkeeping that outlives a crashed launcher: uid slots and
//! sandbox records under the runtime directory (`/run/airlock`).
//!
//! Each live sandbox holds an exclusive `flock` on `slots/<n>`, a file that
//! records the sandbox's id. The slot number picks the sandbox's private
//! host uid range, so no two live sandboxes share host uids. The lock dies
//! with the process holding it: a slot file that is non-empty but lockable
//! belongs to a launcher that died, and [`sweep`] releases what it left.

use crate::cgroup::{list_sandbox_cgroups, CgroupLayout, SandboxCgroup};
use rustix::fs::{flock, FlockOperation};
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// First host uid handed to sandboxes; far above any real account.
pub const UID_BASE: u32 = 1_000_000_000;
/// The host user (and group) the egress worker runs as: just below the
/// sandbox ranges, so it is no sandbox's and, on a normal host, nobody
/// else's (not `nobody`, whose processes other services share).
pub const EGRESS_WORKER_ID: u32 = UID_BASE - 1;
/// Uids (and gids) each sandbox maps: 0..65536 inside.
pub const UIDS_PER_SANDBOX: u32 = 65_536;
/// Number of slots; keeps every host uid below 2^31.
pub const SLOTS: u32 = 16_384;

/// Bookkeeping failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot prepare the runtime directory {0}")]
    Dir(PathBuf, #[source] io::Error),
    #[error("all {SLOTS} sandbox slots are in use")]
    NoFreeSlot,
    #[error("cannot write the record of slot {0}")]
    Record(u32, #[source] io::Error),
}

/// What a slot file says about its sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SlotRecord {
    pub id: String,
    pub launcher_pid: u32,
}

/// A held slot. Dropping it releases the lock; [`Slot::release`] also
/// clears the record.
#[derive(Debug)]
pub struct Slot {
    pub number: u32,
    file: File,
    /// Whether the file holds no record (so clearing it again is skipped:
    /// a truncation is a journal transaction where /run is not a tmpfs).
    cleared: bool,
}

impl Slot {
    /// First host uid of this slot's range.
    pub fn host_uid_base(&self) -> u32 {
        UID_BASE + self.number * UIDS_PER_SANDBOX
    }

    /// Writes the record of the sandbox that owns this slot.
    pub fn record(&mut self, record: &SlotRecord) -> Result<(), RuntimeError> {
        let bytes =
            serde_json::to_vec(record).map_err(|e| RuntimeError::Record(self.number, e.into()))?;
        self.file
            .set_len(0)
            .and_then(|()| self.file.rewind())
            .and_then(|()| self.file.write_all(&bytes))
            .map_err(|e| RuntimeError::Record(self.number, e))?;
        self.cleared = false;
        Ok(())
    }

    /// Clears the record and keeps the slot locked (its uid range stays
    /// this launcher's). A launcher does it once its sandbox is killed:
    /// if it dies after, what it leaves is a cgroup without a record, which
    /// [`RuntimeDir::sweep`] removes once empty.
    pub fn clear_record(&mut self) {
        if !self.cleared {
            let _ = self.file.set_len(0);
            self.cleared = true;
        }
    }

    /// Clears the record and unlocks the slot.
    pub fn release(mut self) {
        self.clear_record();
    }
}

/// The runtime directory layout.
#[derive(Debug, Clone)]
pub struct RuntimeDir {
    root: PathBuf,
}

impl RuntimeDir {
    /// `/run/airlock`.
    pub fn system() -> RuntimeDir {
        RuntimeDir::at("/run/airlock")
    }

    /// A runtime directory somewhere else (tests).
    pub fn at(root: impl Into<PathBuf>) -> RuntimeDir {
        RuntimeDir { root: root.into() }
    }

    /// The empty directory each sandbox mounts its private root on, inside
    /// its own mount namespace (so sandboxes never see each other's).
    pub fn stage(&self) -> PathBuf {
        self.root.join("stage")
    }

    fn slots(&self) -> PathBuf {
        self.root.join("slots")
    }

    /// Where the supervisors of the OCI tiers keep each sandbox's bundle
    /// and runtime state (`<id>/`), removed by its teardown.
    pub fn containers(&self) -> PathBuf {
        self.root.join("containers")
    }

    /// Where supervisors serve their sandboxes' agent channels
    /// (`<id>.sock`, mode 0600).
    pub fn sockets(&self) -> PathBuf {
        self.root.join("sockets")
    }

    /// The records of slots whose owner is alive (it holds the lock).
    pub fn live_records(&self) -> Vec<SlotRecord> {
        let mut live = Vec::new();
        let Ok(entries) = fs::read_dir(self.slots()) else {
            return live;
        };
        for entry in entries.flatten() {
            if entry.metadata().map_or(true, |m| m.len() == 0) {
                continue;
            }
            let Ok(mut file) = OpenOptions::new().read(true).write(true).open(entry.path()) else {
                continue;
            };
            let Some(record) = read_record(&mut file) else {
                continue;
            };
            // A lock we can take means the owner is dead; let it go at once.
            if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
                live.push(record);
            }
        }
        live
    }

    /// Creates the directories if needed. The root is searchable but not
    /// listable (0711): a sandbox init, already root of its own user
    /// namespace and so unprivileged on the host, must reach the empty stage
    /// (0755); the slot records stay private (0700).
    pub fn prepare(&self) -> Result<(), RuntimeError> {
        use std::os::unix::fs::PermissionsExt;
        for (dir, mode) in [
            (self.root.clone(), 0o711),
            (self.stage(), 0o755),
            (self.slots(), 0o700),
        ] {
            match fs::create_dir(&dir) {
                // The mode is set once, on creation (not under the umask).
                Ok(()) => fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
                    .map_err(|e| RuntimeError::Dir(dir.clone(), e))?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(RuntimeError::Dir(dir, e)),
            }
        }
        Ok(())
    }

    /// Takes the lowest free slot. Low numbers first keeps the slot
    /// directory as small as the peak number of live sandboxes, which keeps
    /// [`RuntimeDir::sweep`] cheap.
    pub fn acquire_slot(&self) -> Result<Slot, RuntimeError> {
        for number in 0..SLOTS {
            let path = self.slots().join(number.to_string());
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| RuntimeError::Dir(path.clone(), e))?;
            if flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok() {
                let mut slot = Slot {
                    number,
                    file,
                    cleared: false,
                };
                if let Some(stale) = read_record(&mut slot.file) {
                    cleanup_stale(&stale);
                    let _ = slot.file.set_len(0);
                }
                return Ok(slot);
            }
        }
        Err(RuntimeError::NoFreeSlot)
    }

    /// Releases everything left by launchers that died: their cgroups and
    /// slot records. Cgroups with no live record are stale too. Returns the
    /// ids cleaned up.
    pub fn sweep(&self, layout: Option<&CgroupLayout>) -> Vec<String> {
        // Cgroups are listed before the records are read. A launcher writes
        // its record before it creates its cgroup, so every cgroup seen here
        // whose launcher is alive has a record by the time it is read below;
        // the other order would take a launcher's brand-new cgroup for an
        // orphan.
        let cgroups = layout.map(list_sandbox_cgroups).unwrap_or_default();
        let mut live = Vec::new();
        let mut cleaned = Vec::new();
        if let Ok(entries) = fs::read_dir(self.slots()) {
            for entry in entries.flatten() {
                // Free slots are empty files: skip them without opening.
                if entry.metadata().map_or(true, |m| m.len() == 0) {
                    continue;
                }
                let Ok(mut file) = OpenOptions::new().read(true).write(true).open(entry.path())
                else {
                    continue;
                };
                let Some(record) = read_record(&mut file) else {
                    continue;
                };
                if flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok() {
                    // Re-read under the lock: the owner may have just released it.
                    if let Some(record) = read_record(&mut file) {
                        cleanup_stale(&record);
                        cleaned.push(record.id);
                    }
                    let _ = file.set_len(0);
                } else {
                    live.push(record.id);
                }
            }
        }
        if let Some(layout) = layout {
            for name in cgroups {
                if !live.contains(&name) && !cleaned.contains(&name) {
                    let cgroup = SandboxCgroup::existing(layout.clone(), &name);
                    if cgroup.pids().is_empty() && cgroup.remove().is_ok() {
                        cleaned.push(name);
                    }
                }
            }
        }
        cleaned
    }
}

fn read_record(file: &mut File) -> Option<SlotRecord> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    if text.is_empty() {
        return None;
    }
    serde_json::from_str(&text).ok()
}

fn cleanup_stale(record: &SlotRecord) {
    if let Ok(layout) = CgroupLayout::detect() {
        let cgroup = SandboxCgroup::existing(layout, &record.id);
        let _ = cgroup.kill_all(Duration::from_secs(5));
        let _ = cgroup.remove();
    }
}

/// True if `path` exists (used for messages).
pub fn exists(path: &Path) -> bool {
    path.symlink_metadata().is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_exclusive_and_released() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = RuntimeDir::at(dir.path());
        runtime.prepare().unwrap();
        let a = runtime.acquire_slot().unwrap();
        let b = runtime.acquire_slot().unwrap();
        assert_eq!(a.number, 0);
        assert_eq!(b.number, 1);
        assert_eq!(b.host_uid_base() - a.host_uid_base(), UIDS_PER_SANDBOX);
        a.release();
        let c = runtime.acquire_slot().unwrap();
        assert_eq!(c.number, 0);
        drop(b);
        drop(c);
    }

    #[test]
    fn records_of_dead_launchers_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = RuntimeDir::at(dir.path());
        runtime.prepare().unwrap();
        let mut live = runtime.acquire_slot().unwrap();
        live.record(&SlotRecord {
            id: "live".into(),
            launcher_pid: 1,
        })
        .unwrap();
        {
            let mut dead = runtime.acquire_slot().unwrap();
            dead.record(&SlotRecord {
                id: "dead".into(),
                launcher_pid: 2,
            })
            .unwrap();
            // Dropped without release: like a launcher killed with -9.
        }
        let cleaned = runtime.sweep(None);
        assert_eq!(cleaned, vec!["dead".to_string()]);
        assert!(runtime.sweep(None).is_empty());
        live.release();
    }

    #[test]
    fn uid_ranges_stay_below_2_pow_31() {
        assert!(u64::from(UID_BASE) + u64::from(SLOTS) * u64::from(UIDS_PER_SANDBOX) <= 1 << 31);
    }
}
