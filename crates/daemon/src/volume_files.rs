//! A volume's files read and written from the host, without a sandbox.
//!
//! Sandboxes write into volumes, so everything here is hostile ground: a
//! symlink to `/etc/shadow`, a FIFO, a directory swapped for a link midway.
//! Every path is resolved by descriptor from the volume's root with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`,
//! so `..` and links, absolute or not, stay inside the volume; the last
//! component is then acted on relative to its parent's descriptor and never
//! followed (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`), so a change of owner or
//! mode, a removal or a write never lands outside. Files are opened
//! non-blocking and checked to be regular before they are read. Owners are
//! the ids sandboxes see (uid 1000 is `user`), as the volume keeps them.

use std::os::fd::OwnedFd;

use futures_util::{Stream as AsyncStream, StreamExt};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use tokio::io::AsyncWriteExt;

use crate::volumes::VOLUME_OWNER;
use crate::{Daemon, DaemonError};
use airlock_store::VolumeRow;

/// Deepest listing one call returns.
pub const MAX_DEPTH: u32 = 32;
/// Most entries one listing returns.
pub const MAX_ENTRIES: usize = 100_000;
/// Highest uid or gid a file may be given: what a sandbox maps.
const MAX_ID: u32 = 65_535;

/// What a volume entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Other,
}

/// One file or directory of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeEntry {
    /// Its last component (`/` for the root).
    pub name: String,
    /// Its path from the volume's root, starting with `/`.
    pub path: String,
    pub kind: EntryKind,
    pub size: u64,
    /// Permission bits (and setuid, setgid, sticky).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Nanoseconds since the epoch.
    pub atime_ns: i128,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
    /// Where a symlink points.
    pub target: Option<String>,
}

/// The owner and mode a new file or directory gets, and whether it may
/// replace what is there (a file) or make missing parents (a directory).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Placement {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
    pub force: bool,
}

/// A change of owner or mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Metadata {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}

/// `path` as components from the volume's root: `.` and empty ones
/// dropped, `..` going up (never above the root). NUL is refused.
fn components(path: &str) -> Result<Vec<&str>, DaemonError> {
    if path.contains('\0') {
        return Err(DaemonError::BadInput("the path has a NUL byte".into()));
    }
    if path.len() > 4096 {
        return Err(DaemonError::BadInput("the path is too long".into()));
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part if part.len() > 255 => {
                return Err(DaemonError::BadInput("a path component is too long".into()))
            }
            part => parts.push(part),
        }
    }
    Ok(parts)
}

fn display(parts: &[&str]) -> String {
    format!("/{}", parts.join("/"))
}

fn io_error(path: &str, errno: Errno) -> DaemonError {
    match errno {
        Errno::NOENT => DaemonError::NotFound(format!("path {path} not found")),
        Errno::NOTDIR => DaemonError::Conflict(format!("a parent of {path} is not a directory")),
        Errno::EXIST => DaemonError::Conflict(format!("{path} exists already")),
        Errno::ISDIR => DaemonError::Conflict(format!("{path} is a directory")),
        Errno::NOTEMPTY => DaemonError::Conflict(format!("{path} is not empty")),
        Errno::LOOP => DaemonError::BadInput(format!("{path} is a symbolic link")),
        Errno::XDEV => DaemonError::BadInput(format!("{path} leaves the volume")),
        Errno::DQUOT | Errno::NOSPC => {
            DaemonError::NoSpace(format!("the volume is full (writing {path})"))
        }
        Errno::NAMETOOLONG => DaemonError::BadInput(format!("{path} is too long")),
        other => DaemonError::Internal(format!("volume file {path}: {other}")),
    }
}

/// A volume's root, held open.
struct Root {
    fd: OwnedFd,
}

const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

impl Root {
    fn open(path: &std::path::Path) -> Result<Root, DaemonError> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| DaemonError::Internal(format!("cannot open a volume: {e}")))?;
        Ok(Root { fd })
    }

    /// The directory `parts` names, resolved inside the volume.
    fn dir(&self, parts: &[&str], flags: OFlags) -> Result<OwnedFd, Errno> {
        let path = if parts.is_empty() {
            ".".to_owned()
        } else {
            parts.join("/")
        };
        rustix::fs::openat2(
            &self.fd,
            path.as_str(),
            flags | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
    }

    /// The parent of `parts` (which must not be the root) and the last
    /// component.
    fn parent<'p>(&self, parts: &[&'p str]) -> Result<(OwnedFd, &'p str), Errno> {
        let (name, dirs) = parts.split_last().ok_or(Errno::INVAL)?;
        Ok((self.dir(dirs, OFlags::PATH)?, name))
    }
}

fn kind_of(mode: u32) -> EntryKind {
    match FileType::from_raw_mode(mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Directory,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

fn nanos(sec: i64, nsec: u64) -> i128 {
    i128::from(sec) * 1_000_000_000 + i128::from(nsec)
}

/// The entry `name` of directory `dir` (not followed), shown at `path`.
fn entry_at(dir: &OwnedFd, name: &str, path: String) -> Result<VolumeEntry, Errno> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    let kind = kind_of(st.st_mode);
    let target = if kind == EntryKind::Symlink {
        rustix::fs::readlinkat(dir, name, Vec::new())
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    let display_name = if name == "." {
        "/".to_owned()
    } else {
        name.to_owned()
    };
    Ok(VolumeEntry {
        name: display_name,
        path,
        kind,
        size: u64::try_from(st.st_size).unwrap_or(0),
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        atime_ns: nanos(st.st_atime, st.st_atime_nsec as u64),
        mtime_ns: nanos(st.st_mtime, st.st_mtime_nsec as u64),
        ctime_ns: nanos(st.st_ctime, st.st_ctime_nsec as u64),
        target,
    })
}

fn stat(root: &Root, parts: &[&str]) -> Result<VolumeEntry, Errno> {
    let path = display(parts);
    if parts.is_empty() {
        let dir = root.dir(&[], OFlags::PATH)?;
        return entry_at(&dir, ".", path);
    }
    let (parent, name) = root.parent(parts)?;
    entry_at(&parent, name, path)
}

/// [`components`], owned (to move into a blocking task).
fn owned(path: &str) -> Result<Vec<String>, DaemonError> {
    Ok(components(path)?.into_iter().map(str::to_owned).collect())
}

/// Fails for an owner sandboxes do not map, or bits that are not a mode.
fn check_owner_and_mode(
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
) -> Result<(), DaemonError> {
    for (what, id) in [("uid", uid), ("gid", gid)] {
        if let Some(id) = id.filter(|id| *id > MAX_ID) {
            return Err(DaemonError::BadInput(format!(
                "{what} {id} is outside what sandboxes map (0 to {MAX_ID})"
            )));
        }
    }
    match mode {
        Some(mode) if mode > 0o7777 => Err(DaemonError::BadInput(format!(
            "mode {mode:o} is not a file mode (0 to 7777 octal)"
        ))),
        _ => Ok(()),
    }
}

/// Gives the file or directory `fd` its owner and mode.
fn place(fd: &OwnedFd, uid: Option<u32>, gid: Option<u32>, mode: Option<u32>) -> Result<(), Errno> {
    if uid.is_some() || gid.is_some() {
        rustix::fs::fchown(
            fd,
            uid.map(rustix::fs::Uid::from_raw),
            gid.map(rustix::fs::Gid::from_raw),
        )?;
    }
    if let Some(mode) = mode {
        rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))?;
    }
    Ok(())
}

/// Opens `name` of `dir` for a change of its metadata: never a symlink's
/// target, never blocking on a FIFO.
fn open_entry(dir: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn list(root: &Root, parts: &[&str], depth: u32, out: &mut Vec<VolumeEntry>) -> Result<(), Errno> {
    let dir = root.dir(parts, OFlags::RDONLY)?;
    list_dir(dir, &display(parts), depth, out)
}

fn list_dir(dir: OwnedFd, path: &str, depth: u32, out: &mut Vec<VolumeEntry>) -> Result<(), Errno> {
    let mut names = Vec::new();
    let listing = rustix::fs::Dir::read_from(&dir)?;
    for item in listing {
        let item = item?;
        let name = item.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    names.sort();
    for name in names {
        if out.len() >= MAX_ENTRIES {
            return Ok(());
        }
        let child = if path == "/" {
            format!("/{name}")
        } else {
            format!("{path}/{name}")
        };
        let entry = match entry_at(&dir, &name, child.clone()) {
            Ok(entry) => entry,
            // Gone between the listing and the look.
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(e),
        };
        let recurse = depth > 1 && entry.kind == EntryKind::Directory;
        out.push(entry);
        if recurse {
            match rustix::fs::openat(
                &dir,
                name.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(sub) => list_dir(sub, &child, depth - 1, out)?,
                Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Removes `name` of `dir` and, for a directory, everything under it,
/// never following a link.
fn remove_at(dir: &OwnedFd, name: &str) -> Result<(), Errno> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => return Ok(()),
        Err(Errno::ISDIR | Errno::PERM) => {}
        Err(e) => return Err(e),
    }
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut names = Vec::new();
    for item in rustix::fs::Dir::read_from(&sub)? {
        let item = item?;
        let child = item.file_name().to_string_lossy().into_owned();
        if child != "." && child != ".." {
            names.push(child);
        }
    }
    for child in names {
        match remove_at(&sub, &child) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e),
        }
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
}

fn make_dir(root: &Root, parts: &[&str], placement: Placement) -> Result<VolumeEntry, Errno> {
    if parts.is_empty() {
        return if placement.force {
            stat(root, parts)
        } else {
            Err(Errno::EXIST)
        };
    }
    let mode = placement.mode.unwrap_or(0o755);
    let uid = placement.uid.unwrap_or(VOLUME_OWNER);
    let gid = placement.gid.unwrap_or(VOLUME_OWNER);
    let mut dir = root.dir(&[], OFlags::PATH)?;
    for (at, name) in parts.iter().enumerate() {
        let last = at + 1 == parts.len();
        // Without force only the last is made: a missing parent is ENOENT.
        if last || placement.force {
            match rustix::fs::mkdirat(&dir, *name, Mode::from_raw_mode(mode)) {
                Ok(()) => {
                    let made = open_entry(&dir, name)?;
                    place(&made, Some(uid), Some(gid), Some(mode))?;
                }
                Err(Errno::EXIST) if placement.force => {}
                Err(e) => return Err(e),
            }
        }
        if !last {
            dir = rustix::fs::openat2(
                &dir,
                *name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            )?;
        }
    }
    let (parent, name) = root.parent(parts)?;
    let entry = entry_at(&parent, name, display(parts))?;
    if entry.kind != EntryKind::Directory {
        return Err(Errno::EXIST);
    }
    Ok(entry)
}

impl Daemon {
    fn volume_root(&self, volume: &VolumeRow) -> Result<Root, DaemonError> {
        Root::open(&self.volume_store()?.path(&volume.id))
    }

    /// What is at `path` of `volume` (a link is not followed).
    pub async fn volume_stat(
        &self,
        volume: &VolumeRow,
        path: &str,
    ) -> Result<VolumeEntry, DaemonError> {
        let root = self.volume_root(volume)?;
        let parts = owned(path)?;
        blocking(move || {
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            stat(&root, &parts).map_err(|e| io_error(&display(&parts), e))
        })
        .await
    }

    /// The entries under directory `path` of `volume`, `depth` levels
    /// down (1: its children), by path.
    pub async fn volume_list(
        &self,
        volume: &VolumeRow,
        path: &str,
        depth: u32,
    ) -> Result<Vec<VolumeEntry>, DaemonError> {
        if depth == 0 || depth > MAX_DEPTH {
            return Err(DaemonError::BadInput(format!(
                "depth must be between 1 and {MAX_DEPTH}"
            )));
        }
        let root = self.volume_root(volume)?;
        let parts = owned(path)?;
        blocking(move || {
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            let mut out = Vec::new();
            list(&root, &parts, depth, &mut out).map_err(|e| io_error(&display(&parts), e))?;
            Ok(out)
        })
        .await
    }

    /// Makes directory `path` of `volume` (with `force`, its missing
    /// parents too, and one that exists is no error).
    pub async fn volume_make_dir(
        &self,
        volume: &VolumeRow,
        path: &str,
        placement: Placement,
    ) -> Result<VolumeEntry, DaemonError> {
        check_owner_and_mode(placement.uid, placement.gid, placement.mode)?;
        let root = self.volume_root(volume)?;
        let parts = owned(path)?;
        blocking(move || {
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            make_dir(&root, &parts, placement).map_err(|e| io_error(&display(&parts), e))
        })
        .await
    }

    /// Changes the owner or mode of `path` of `volume` (of a link itself,
    /// its owner only).
    pub async fn volume_set_metadata(
        &self,
        volume: &VolumeRow,
        path: &str,
        metadata: Metadata,
    ) -> Result<VolumeEntry, DaemonError> {
        check_owner_and_mode(metadata.uid, metadata.gid, metadata.mode)?;
        let root = self.volume_root(volume)?;
        let parts = owned(path)?;
        blocking(move || {
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            let shown = display(&parts);
            let fail = |e| io_error(&shown, e);
            let (dir, name) = if parts.is_empty() {
                (root.dir(&[], OFlags::PATH).map_err(fail)?, ".")
            } else {
                root.parent(&parts).map_err(fail)?
            };
            match open_entry(&dir, name) {
                Ok(fd) => place(&fd, metadata.uid, metadata.gid, metadata.mode).map_err(fail)?,
                Err(Errno::LOOP) => {
                    if metadata.mode.is_some() {
                        return Err(DaemonError::BadInput(format!(
                            "{shown} is a symbolic link, which has no mode of its own"
                        )));
                    }
                    rustix::fs::chownat(
                        &dir,
                        name,
                        metadata.uid.map(rustix::fs::Uid::from_raw),
                        metadata.gid.map(rustix::fs::Gid::from_raw),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )
                    .map_err(fail)?;
                }
                Err(e) => return Err(fail(e)),
            }
            entry_at(&dir, name, shown.clone()).map_err(fail)
        })
        .await
    }

    /// Removes `path` of `volume`, a directory with everything in it.
    pub async fn volume_remove(&self, volume: &VolumeRow, path: &str) -> Result<(), DaemonError> {
        let root = self.volume_root(volume)?;
        let parts = owned(path)?;
        if parts.is_empty() {
            return Err(DaemonError::NotFound(
                "the volume's root cannot be removed".into(),
            ));
        }
        blocking(move || {
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            let shown = display(&parts);
            let (dir, name) = root.parent(&parts).map_err(|e| io_error(&shown, e))?;
            remove_at(&dir, name).map_err(|e| io_error(&shown, e))
        })
        .await
    }

    /// Opens regular file `path` of `volume` to read it, with its size.
    pub async fn volume_open(
        &self,
        volume: &VolumeRow,
        path: &str,
    ) -> Result<(tokio::fs::File, u64), DaemonError> {
        let root = self.volume_root(volume)?;
        let parts = owned(path)?;
        blocking(move || {
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            let shown = display(&parts);
            let fail = |e| io_error(&shown, e);
            if parts.is_empty() {
                return Err(DaemonError::Conflict(format!("{shown} is a directory")));
            }
            let (dir, name) = root.parent(&parts).map_err(fail)?;
            // Within the volume, a link is followed as the sandbox would
            // (it cannot leave it); a FIFO does not block the open.
            let fd = rustix::fs::openat2(
                &dir,
                name,
                OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            )
            .map_err(fail)?;
            let st = rustix::fs::fstat(&fd).map_err(fail)?;
            match kind_of(st.st_mode) {
                EntryKind::File => {}
                EntryKind::Directory => {
                    return Err(DaemonError::Conflict(format!("{shown} is a directory")))
                }
                _ => {
                    return Err(DaemonError::BadInput(format!(
                        "{shown} is not a regular file"
                    )))
                }
            }
            let file = std::fs::File::from(fd);
            Ok((
                tokio::fs::File::from_std(file),
                u64::try_from(st.st_size).unwrap_or(0),
            ))
        })
        .await
    }

    /// Writes regular file `path` of `volume` from `body` (its parent must
    /// exist; one there already is replaced only with `force`). More than
    /// `limit` bytes, or a full volume, and a file this made is removed.
    pub async fn volume_write<S, B, E>(
        &self,
        volume: &VolumeRow,
        path: &str,
        placement: Placement,
        mut body: S,
        limit: u64,
    ) -> Result<VolumeEntry, DaemonError>
    where
        S: AsyncStream<Item = Result<B, E>> + Unpin,
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        check_owner_and_mode(placement.uid, placement.gid, placement.mode)?;
        let root = self.volume_root(volume)?;
        let parts = owned(path)?;
        if parts.is_empty() {
            return Err(DaemonError::Conflict("/ is a directory".into()));
        }
        let shown = display(&parts.iter().map(String::as_str).collect::<Vec<_>>());
        let opened = {
            let parts = parts.clone();
            blocking(move || {
                let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
                let shown = display(&parts);
                let fail = |e| io_error(&shown, e);
                let (dir, name) = root.parent(&parts).map_err(fail)?;
                let mode = placement.mode.unwrap_or(0o644);
                let exclusive = if placement.force {
                    OFlags::TRUNC
                } else {
                    OFlags::EXCL
                };
                let existed = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok();
                let fd = rustix::fs::openat(
                    &dir,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | exclusive
                        | OFlags::NOFOLLOW
                        | OFlags::NONBLOCK
                        | OFlags::NOCTTY
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(mode),
                )
                .map_err(fail)?;
                let st = rustix::fs::fstat(&fd).map_err(fail)?;
                if kind_of(st.st_mode) != EntryKind::File {
                    return Err(DaemonError::BadInput(format!(
                        "{shown} is not a regular file"
                    )));
                }
                place(
                    &fd,
                    Some(placement.uid.unwrap_or(VOLUME_OWNER)),
                    Some(placement.gid.unwrap_or(VOLUME_OWNER)),
                    Some(mode),
                )
                .map_err(fail)?;
                Ok((dir, fd, existed))
            })
            .await?
        };
        let (dir, fd, existed) = opened;
        let name = parts.last().cloned().unwrap_or_default();
        let mut file = tokio::fs::File::from_std(std::fs::File::from(fd));
        let mut written: u64 = 0;
        let mut failure = None;
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => {
                    failure = Some(DaemonError::BadInput(format!("reading the body: {e}")));
                    break;
                }
            };
            let bytes = chunk.as_ref();
            written += bytes.len() as u64;
            if written > limit {
                failure = Some(DaemonError::TooLarge(format!(
                    "the file is larger than {limit} bytes"
                )));
                break;
            }
            if let Err(e) = file.write_all(bytes).await {
                let errno = Errno::from_io_error(&e).unwrap_or(Errno::IO);
                failure = Some(io_error(&shown, errno));
                break;
            }
        }
        if failure.is_none() {
            if let Err(e) = file.flush().await {
                let errno = Errno::from_io_error(&e).unwrap_or(Errno::IO);
                failure = Some(io_error(&shown, errno));
            }
        }
        drop(file);
        blocking(move || {
            if let Some(failure) = failure {
                if !existed {
                    let _ = rustix::fs::unlinkat(&dir, name.as_str(), AtFlags::empty());
                }
                return Err(failure);
            }
            entry_at(&dir, &name, shown.clone()).map_err(|e| io_error(&shown, e))
        })
        .await
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, DaemonError> + Send + 'static,
) -> Result<T, DaemonError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| DaemonError::Internal(format!("a volume file task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn paths_stay_inside_the_volume() {
        assert_eq!(components("/a/./b//c/").unwrap(), ["a", "b", "c"]);
        assert_eq!(components("../../etc/passwd").unwrap(), ["etc", "passwd"]);
        assert_eq!(components("/a/../..").unwrap(), Vec::<&str>::new());
        assert!(components("a\0b").is_err());
        assert_eq!(display(&["a", "b"]), "/a/b");
        assert_eq!(display(&[]), "/");
    }

    fn root_at(dir: &std::path::Path) -> Root {
        Root::open(dir).unwrap()
    }

    #[test]
    fn links_planted_in_a_volume_never_reach_the_host() {
        let host = tempfile::tempdir().unwrap();
        let secret = host.path().join("secret");
        std::fs::write(&secret, "host secret").unwrap();
        let volume = host.path().join("volume");
        std::fs::create_dir(&volume).unwrap();
        std::os::unix::fs::symlink(&secret, volume.join("abs")).unwrap();
        std::os::unix::fs::symlink("../secret", volume.join("rel")).unwrap();
        std::os::unix::fs::symlink(host.path(), volume.join("dir")).unwrap();
        let root = root_at(&volume);
        // Followed inside the volume: the absolute link names the volume's
        // own /…/secret, which does not exist; `..` stops at its root.
        for link in ["abs", "rel"] {
            let (dir, name) = root.parent(&[link]).unwrap();
            let opened = rustix::fs::openat2(&dir, name, OFlags::RDONLY, Mode::empty(), RESOLVE);
            assert_eq!(opened.err(), Some(Errno::NOENT), "{link}");
        }
        // A directory link resolves inside too.
        assert!(root.dir(&["dir", "secret"], OFlags::PATH).is_err());
        // Metadata changes and removals act on the link, not its target.
        let (dir, _) = root.parent(&["abs"]).unwrap();
        assert_eq!(open_entry(&dir, "abs").err(), Some(Errno::LOOP));
        remove_at(&dir, "dir").unwrap();
        assert!(host.path().join("secret").exists());
        let entry = stat(&root, &["rel"]).unwrap();
        assert_eq!(entry.kind, EntryKind::Symlink);
        assert_eq!(entry.target.as_deref(), Some("../secret"));
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host secret");
    }

    #[test]
    fn make_dir_needs_force_for_parents_and_for_one_that_exists() {
        let tmp = tempfile::tempdir().unwrap();
        let root = root_at(tmp.path());
        let plain = Placement::default();
        let force = Placement {
            force: true,
            ..Placement::default()
        };
        assert_eq!(
            make_dir(&root, &["a", "b"], plain).err(),
            Some(Errno::NOENT)
        );
        let made = make_dir(&root, &["a", "b"], force).unwrap();
        assert_eq!(made.kind, EntryKind::Directory);
        assert_eq!(made.path, "/a/b");
        assert_eq!(made.mode, 0o755);
        assert_eq!(make_dir(&root, &["a"], plain).err(), Some(Errno::EXIST));
        make_dir(&root, &["a"], force).unwrap();
        std::fs::write(tmp.path().join("f"), "x").unwrap();
        assert_eq!(make_dir(&root, &["f"], force).err(), Some(Errno::EXIST));
        let mut out = Vec::new();
        list(&root, &[], 3, &mut out).unwrap();
        let paths: Vec<&str> = out.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/a", "/a/b", "/f"]);
        out.clear();
        list(&root, &[], 1, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        let (dir, name) = root.parent(&["a"]).unwrap();
        remove_at(&dir, name).unwrap();
        assert!(!tmp.path().join("a").exists());
    }
}
