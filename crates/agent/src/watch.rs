//! `watch` and `cancel`: directory changes streamed as `fs_event`s.
//!
//! Each `watch` owns one inotify instance (so a queue overflow, a cancel or
//! the end of the session drops exactly that watch and closes its
//! descriptor) read through tokio's `AsyncFd`: the descriptor is
//! non-blocking and only read when epoll says it is readable, so the
//! runtime thread never waits on it. Adding watches touches the filesystem
//! (path lookups, directory reads for recursive watches) and so runs on the
//! blocking pool like every other file operation.
//!
//! This uses rustix's inotify rather than the `inotify` crate: rustix is
//! already a dependency, and its `inotify::Reader` parses the kernel's
//! variable-length records (the only part that needs `unsafe`, which stays
//! inside rustix); the rest is `inotify_init1`, `inotify_add_watch` and
//! `inotify_rm_watch`. The `inotify` crate would add a dependency (with its
//! own tokio glue) for the same three calls.
//!
//! One kernel event becomes one `fs_event`; the mapping:
//!
//! | inotify | `fs_event` |
//! |---|---|
//! | `IN_CREATE` | `create` |
//! | `IN_MODIFY` | `write` (`IN_CLOSE_WRITE` is not asked for: it would duplicate it) |
//! | `IN_ATTRIB` | `chmod` |
//! | `IN_DELETE` | `remove` |
//! | `IN_MOVED_FROM`, `IN_MOVED_TO` | `rename` (old path, then new path) |
//! | `IN_DELETE_SELF` / `IN_MOVE_SELF` of the root | `remove` / `rename` of the root, then the final `not_found` |
//! | `IN_UNMOUNT` / `IN_IGNORED` of the root | final `not_found` |
//! | `IN_Q_OVERFLOW` | final `io` error |
//!
//! Events a subdirectory's own watch reports about itself (`IN_ATTRIB`,
//! `IN_DELETE_SELF`, `IN_MOVE_SELF` without a name) are skipped: its parent's
//! watch reports the same change with the name.
//!
//! A watch asked for entries stats what a `create`, `write` or `chmod` is
//! about as it sends the event (on the blocking pool, like any stat); one
//! gone by then goes without. A `local_only` watch refuses a directory on
//! a network filesystem (by its `statfs` type), whose changes made
//! elsewhere inotify never sees; every other mount (a bind mount, a
//! volume, tmpfs, overlayfs, gVisor's gofer) is watched like the root.

use crate::failure::Failure;
use crate::files::{blocking, check_xattr_prefix, info_of, lossy, Files};
use crate::locked;
use crate::outbox::Outbox;
use airlock_protocol::{ErrorKind, Event, FileInfo, FsEventKind};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;
use std::collections::HashMap;
use std::convert::Infallible;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::oneshot;

/// Watches that may be open at once in one session.
pub(crate) const MAX_WATCHES: usize = 64;
/// Directories one (recursive) watch may cover.
pub(crate) const MAX_DIRS: usize = 8192;
/// Entries of a directory that appeared in a recursive watch that are
/// reported as `create` when its watch is added; the rest are watched but
/// not reported.
const MAX_FOUND: usize = MAX_DIRS;
/// Bytes read from an inotify descriptor at once (plus room to align it).
/// One event is at most 16 + 256 bytes.
const EVENT_BUFFER: usize = 16 * 1024 + 8;

/// What every directory of a watch is watched for. `IN_EXCL_UNLINK` drops
/// events of entries that were unlinked while still open.
fn watch_flags() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR
        | WatchFlags::EXCL_UNLINK
}

/// `statfs` types of network filesystems (`linux/magic.h`): NFS, CIFS,
/// SMB, SMB2 and FUSE, as envd tells them apart.
const NETWORK_FILESYSTEMS: [i64; 5] = [0x6969, 0xFF53_4D42, 0x517B, 0xFE53_4D42, 0x6573_5546];

/// What a `watch` asked for beyond the directory.
#[derive(Debug, Clone, Default)]
pub(crate) struct WatchOptions {
    /// Watch the directories below it too.
    pub(crate) recursive: bool,
    /// Attach entries to `create`, `write` and `chmod` events, reporting
    /// the extended attributes under this prefix (when there is one).
    pub(crate) entries: Option<Option<String>>,
    /// Refuse a directory on a network filesystem.
    pub(crate) local_only: bool,
}

/// Sends the ack of a cancel once the cancelled watch's final event is queued
/// (by sending or dropping it).
type Ack = oneshot::Sender<()>;

/// An open watch in the session's registry.
struct Open {
    /// Tells the watch apart from a later one with the same request id.
    generation: u64,
    /// Cancels the watch; carries the ack of the `cancel` request.
    cancel: oneshot::Sender<Ack>,
}

type Registry = Arc<Mutex<HashMap<u64, Open>>>;

/// The open watches of one session.
pub(crate) struct Watches {
    files: Files,
    outbox: Outbox,
    open: Registry,
    generation: u64,
}

/// One kernel event, copied out of the read buffer.
#[derive(Debug)]
struct Raw {
    wd: i32,
    mask: ReadFlags,
    name: Option<OsString>,
}

/// The inotify instance of one watch and the directories it covers.
struct Tree {
    fd: Arc<OwnedFd>,
    /// The watched directory, as resolved from the request.
    root: PathBuf,
    root_wd: i32,
    recursive: bool,
    /// Whether events carry entries, and their attributes' prefix.
    entries: Option<Option<String>>,
    /// Watch descriptor → absolute path of the directory.
    dirs: HashMap<i32, PathBuf>,
}

fn errno_failure(what: impl std::fmt::Display, errno: Errno) -> Failure {
    Failure::io(what, &io::Error::from(errno))
}

/// The kernel's per-user limits on inotify, said plainly.
fn kernel_limit(errno: Errno) -> Option<Failure> {
    match errno {
        Errno::MFILE | Errno::NFILE => Some(Failure::new(
            ErrorKind::Io,
            "cannot start a watch: the limit on inotify instances or open files was reached",
        )),
        Errno::NOSPC => Some(Failure::new(
            ErrorKind::Io,
            "the kernel's limit on inotify watches was reached",
        )),
        Errno::NOMEM => Some(Failure::new(
            ErrorKind::Io,
            "the kernel is out of memory for inotify watches",
        )),
        _ => None,
    }
}

impl Tree {
    /// Starts watching `root` (and, when `recursive`, every directory below
    /// it). Blocking: runs on the blocking pool.
    fn open(root: PathBuf, options: WatchOptions) -> Result<Tree, Failure> {
        if options.local_only {
            refuse_network_filesystem(&root)?;
        }
        let recursive = options.recursive;
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).map_err(|errno| {
            kernel_limit(errno).unwrap_or_else(|| errno_failure("cannot start a watch", errno))
        })?;
        // The root may be reached through a symlink, like every path of a
        // request; `IN_ONLYDIR` refuses anything but a directory (ENOTDIR).
        let root_wd = inotify::add_watch(&fd, &root, watch_flags()).map_err(|errno| {
            kernel_limit(errno)
                .unwrap_or_else(|| errno_failure(format!("cannot watch {}", root.display()), errno))
        })?;
        let mut tree = Tree {
            fd: Arc::new(fd),
            root: root.clone(),
            root_wd,
            recursive,
            entries: options.entries,
            dirs: HashMap::from([(root_wd, root.clone())]),
        };
        if recursive {
            tree.add_tree(&root, false, &mut None)?;
        }
        Ok(tree)
    }

    fn too_many_dirs(&self) -> Failure {
        Failure::invalid(format!(
            "the watch of {} would cover more than {MAX_DIRS} directories; \
             watch a deeper path or without recursive",
            self.root.display()
        ))
    }

    /// Watches the subdirectory `dir` (not following a symlink). Returns
    /// whether it is newly watched; false when it vanished, is not a
    /// directory, cannot be watched (permissions) or is watched already (a
    /// bind mount of a watched directory: not descended into again).
    fn add_dir(&mut self, dir: &Path) -> Result<bool, Failure> {
        let flags = watch_flags() | WatchFlags::DONT_FOLLOW;
        let wd = match inotify::add_watch(self.fd.as_fd(), dir, flags) {
            Ok(wd) => wd,
            Err(errno) => return kernel_limit(errno).map_or(Ok(false), Err),
        };
        if self.dirs.contains_key(&wd) {
            return Ok(false);
        }
        if self.dirs.len() >= MAX_DIRS {
            let _ = inotify::remove_watch(self.fd.as_fd(), wd);
            return Err(self.too_many_dirs());
        }
        self.dirs.insert(wd, dir.to_path_buf());
        Ok(true)
    }

    /// Watches every directory below `top` (and `top` itself when
    /// `add_top`), each before it is read, so nothing created in it after
    /// the read is missed. With `found`, collects the entries met on the
    /// way (up to [`MAX_FOUND`]), parents before their children. Blocking.
    fn add_tree(
        &mut self,
        top: &Path,
        add_top: bool,
        found: &mut Option<Vec<PathBuf>>,
    ) -> Result<(), Failure> {
        let mut pending = Vec::new();
        if !add_top || self.add_dir(top)? {
            pending.push(top.to_path_buf());
        }
        while let Some(dir) = pending.pop() {
            // A directory that vanished or cannot be read is skipped; its
            // events (if it is watched) still arrive.
            let Ok(reader) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in reader.flatten() {
                let path = entry.path();
                if let Some(found) = found.as_mut() {
                    if found.len() < MAX_FOUND {
                        found.push(path.clone());
                    }
                }
                // The type of the entry itself: symlinks are not followed.
                let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
                if is_dir && self.add_dir(&path)? {
                    pending.push(path);
                }
            }
        }
        Ok(())
    }

    /// Stops watching `dir` and everything below it (it was moved away; if
    /// it moved within the watch, `IN_MOVED_TO` watches it again under its
    /// new path). Events still queued for these watches are skipped.
    fn detach(&mut self, dir: &Path) {
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(wd, path)| **wd != self.root_wd && path.starts_with(dir))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            // EINVAL when the kernel already dropped it: nothing to undo.
            let _ = inotify::remove_watch(self.fd.as_fd(), wd);
        }
    }
}

/// Reads what one `read` returns (only whole events) and copies it out.
/// Fails with `EAGAIN` when nothing is queued.
fn read_events(fd: BorrowedFd<'_>, buf: &mut [MaybeUninit<u8>]) -> Result<Vec<Raw>, Errno> {
    let mut reader = inotify::Reader::new(fd, buf);
    let mut batch = Vec::new();
    loop {
        // Reads only when the buffer is empty, which is the first time
        // round: the loop ends when the buffer is used up.
        let event = reader.next()?;
        batch.push(Raw {
            wd: event.wd(),
            mask: event.events(),
            name: event
                .file_name()
                .map(|name| OsStr::from_bytes(name.to_bytes()).to_os_string()),
        });
        if reader.is_buffer_empty() {
            return Ok(batch);
        }
    }
}

/// Whether a `statfs` type is a network filesystem's.
fn is_network_filesystem(f_type: i64) -> bool {
    NETWORK_FILESYSTEMS.contains(&f_type)
}

/// Fails when `root` is on a network filesystem. Blocking.
fn refuse_network_filesystem(root: &Path) -> Result<(), Failure> {
    let shown = root.display();
    let stat = rustix::fs::statfs(root)
        .map_err(|errno| errno_failure(format!("cannot watch {shown}"), errno))?;
    if is_network_filesystem(stat.f_type) {
        return Err(Failure::invalid(format!(
            "cannot watch path on network filesystem: {shown} (NFS, SMB or FUSE, whose \
             changes made elsewhere are not seen); allow network mounts to watch it anyway"
        )));
    }
    Ok(())
}

/// The entry an event of `kind` about `path` carries: what it is now, for
/// a `create`, `write` or `chmod` of a watch that asked for entries.
async fn entry_of(tree: &Tree, kind: FsEventKind, path: &Path) -> Option<FileInfo> {
    let xattrs = tree.entries.clone()?;
    if !matches!(
        kind,
        FsEventKind::Create | FsEventKind::Write | FsEventKind::Chmod
    ) {
        return None;
    }
    let path = path.to_path_buf();
    // Gone already (or unreadable): the event goes without.
    blocking(move || Ok(info_of(&path, xattrs.as_deref()).ok()))
        .await
        .ok()
        .flatten()
}

/// Queues one `fs_event` about `path`, with its entry when the watch asks
/// for them; fails when the host is gone.
async fn emit(
    tree: &Tree,
    outbox: &Outbox,
    id: u64,
    kind: FsEventKind,
    path: &Path,
) -> Result<(), Failure> {
    let event = Event::FsEvent {
        kind,
        path: lossy(path),
        entry: entry_of(tree, kind, path).await,
    };
    if outbox.send(id, event).await {
        Ok(())
    } else {
        Err(Failure::new(ErrorKind::Io, "the host is gone"))
    }
}

/// Watches the directories below `top` on the blocking pool (see
/// [`Tree::add_tree`]); returns the tree back with what was found.
async fn grow(tree: Tree, top: PathBuf, report: bool) -> Result<(Tree, Vec<PathBuf>), Failure> {
    blocking(move || {
        let mut tree = tree;
        let mut found = report.then(Vec::new);
        tree.add_tree(&top, true, &mut found)?;
        Ok((tree, found.unwrap_or_default()))
    })
    .await
}

/// Turns one kernel event into `fs_event`s and keeps the tree current.
/// Fails when the watch ends.
async fn handle(mut tree: Tree, raw: Raw, id: u64, outbox: &Outbox) -> Result<Tree, Failure> {
    let mask = raw.mask;
    if mask.contains(ReadFlags::QUEUE_OVERFLOW) {
        return Err(Failure::new(
            ErrorKind::Io,
            "too many events; the watch was dropped",
        ));
    }
    // Events of a watch removed by `detach` (or unknown) are skipped.
    let Some(dir) = tree.dirs.get(&raw.wd).cloned() else {
        return Ok(tree);
    };
    let Some(name) = raw.name else {
        // About the watched directory itself.
        if raw.wd != tree.root_wd {
            if mask.contains(ReadFlags::IGNORED) {
                tree.dirs.remove(&raw.wd);
            }
            return Ok(tree);
        }
        let shown = tree.root.display().to_string();
        if mask.contains(ReadFlags::ATTRIB) {
            emit(&tree, outbox, id, FsEventKind::Chmod, &dir).await?;
        }
        if mask.contains(ReadFlags::DELETE_SELF) {
            emit(&tree, outbox, id, FsEventKind::Remove, &dir).await?;
            return Err(Failure::new(
                ErrorKind::NotFound,
                format!("{shown} was removed; the watch ended"),
            ));
        }
        if mask.contains(ReadFlags::MOVE_SELF) {
            emit(&tree, outbox, id, FsEventKind::Rename, &dir).await?;
            return Err(Failure::new(
                ErrorKind::NotFound,
                format!("{shown} was moved or renamed; the watch ended"),
            ));
        }
        if mask.contains(ReadFlags::UNMOUNT) {
            return Err(Failure::new(
                ErrorKind::NotFound,
                format!("the filesystem of {shown} was unmounted; the watch ended"),
            ));
        }
        if mask.contains(ReadFlags::IGNORED) {
            return Err(Failure::new(
                ErrorKind::NotFound,
                format!("{shown} can no longer be watched; the watch ended"),
            ));
        }
        return Ok(tree);
    };
    let path = dir.join(name);
    let subtree = tree.recursive && mask.contains(ReadFlags::ISDIR);
    if mask.contains(ReadFlags::CREATE) {
        if subtree {
            // Watched before its `create` goes out, so the host may rely on
            // changes inside it from then on; what was created in it before
            // its watch was added is only seen by reading it.
            let found;
            (tree, found) = grow(tree, path.clone(), true).await?;
            emit(&tree, outbox, id, FsEventKind::Create, &path).await?;
            for entry in found {
                emit(&tree, outbox, id, FsEventKind::Create, &entry).await?;
            }
        } else {
            emit(&tree, outbox, id, FsEventKind::Create, &path).await?;
        }
    }
    if mask.contains(ReadFlags::MODIFY) {
        emit(&tree, outbox, id, FsEventKind::Write, &path).await?;
    }
    if mask.contains(ReadFlags::ATTRIB) {
        emit(&tree, outbox, id, FsEventKind::Chmod, &path).await?;
    }
    if mask.contains(ReadFlags::DELETE) {
        // The watch of a removed subdirectory goes with `IN_IGNORED`.
        emit(&tree, outbox, id, FsEventKind::Remove, &path).await?;
    }
    if mask.contains(ReadFlags::MOVED_FROM) {
        emit(&tree, outbox, id, FsEventKind::Rename, &path).await?;
        if subtree {
            tree.detach(&path);
        }
    }
    if mask.contains(ReadFlags::MOVED_TO) {
        if subtree {
            (tree, _) = grow(tree, path.clone(), false).await?;
        }
        emit(&tree, outbox, id, FsEventKind::Rename, &path).await?;
    }
    Ok(tree)
}

/// Streams the events of `tree` until the watch breaks.
async fn follow(
    mut tree: Tree,
    events: &AsyncFd<Arc<OwnedFd>>,
    id: u64,
    outbox: &Outbox,
) -> Result<Infallible, Failure> {
    let shown = tree.root.display().to_string();
    let mut buf = vec![MaybeUninit::<u8>::uninit(); EVENT_BUFFER];
    loop {
        let mut guard = events.readable().await.map_err(|error| {
            Failure::io(format!("cannot wait for the events of {shown}"), &error)
        })?;
        let batch = match read_events(events.get_ref().as_fd(), &mut buf) {
            Ok(batch) => batch,
            Err(Errno::AGAIN) => {
                guard.clear_ready();
                continue;
            }
            Err(Errno::INTR) => continue,
            Err(errno) => {
                return Err(errno_failure(
                    format!("cannot read the events of {shown}"),
                    errno,
                ))
            }
        };
        drop(guard);
        for raw in batch {
            tree = handle(tree, raw, id, outbox).await?;
        }
    }
}

/// One open watch: streams events until it breaks, is cancelled, or the
/// session ends (then without a final event: nobody is listening).
async fn watch_task(
    id: u64,
    tree: Tree,
    events: AsyncFd<Arc<OwnedFd>>,
    outbox: Outbox,
    open: Registry,
    generation: u64,
    mut cancel: oneshot::Receiver<Ack>,
) {
    let outcome = tokio::select! {
        biased;
        cancelled = &mut cancel => match cancelled {
            Ok(ack) => Some((Event::Done, Some(ack))),
            Err(_) => None,
        },
        ended = follow(tree, &events, id, &outbox) => match ended {
            Err(failure) => Some((failure.into_event(), None)),
            Ok(never) => match never {},
        },
    };
    // Deregisters and closes the inotify descriptor (a rescan still running
    // on the blocking pool holds it until it returns).
    drop(events);
    let Some((event, ack)) = outcome else {
        return;
    };
    // Leaves the registry in the same step as the final event is queued, so a
    // `cancel` either finds the watch open or its final event already queued.
    outbox
        .send_after(id, event, || {
            let mut open = locked(&open);
            if open
                .get(&id)
                .is_some_and(|slot| slot.generation == generation)
            {
                open.remove(&id);
            }
        })
        .await;
    // Acks a cancel (the one this answered, or one that came while the
    // final event waited for room): its `done` follows ours.
    drop(ack);
    drop(cancel);
}

impl Watches {
    /// No watches yet; paths resolve like `files`, events go to `outbox`.
    pub(crate) fn new(files: Files, outbox: Outbox) -> Watches {
        Watches {
            files,
            outbox,
            open: Arc::default(),
            generation: 0,
        }
    }

    /// Handles `watch`: the watch is in place when this returns (the read
    /// loop waits for it, so later requests see it), and the rest streams
    /// from a task of its own. Failures are answered here.
    pub(crate) async fn start(&mut self, id: u64, path: &str, options: WatchOptions) {
        if let Err(failure) = self.try_start(id, path, options).await {
            self.outbox.fail(id, failure).await;
        }
    }

    async fn try_start(
        &mut self,
        id: u64,
        path: &str,
        options: WatchOptions,
    ) -> Result<(), Failure> {
        if let Some(Some(prefix)) = &options.entries {
            check_xattr_prefix(prefix)?;
        }
        {
            let open = locked(&self.open);
            if open.contains_key(&id) {
                return Err(Failure::invalid(format!(
                    "a watch with id {id} is already open"
                )));
            }
            if open.len() >= MAX_WATCHES {
                return Err(Failure::invalid(format!(
                    "{MAX_WATCHES} watches are already open; cancel one first"
                )));
            }
        }
        let root = self.files.resolve(path)?;
        let tree = blocking(move || Tree::open(root, options)).await?;
        // SAFETY: `register_with_interest` needs the descriptor to stay open
        // and refer to the same file description while the `AsyncFd` lives,
        // and `as_raw_fd` to return it every time. The `AsyncFd` owns a
        // clone of the `Arc<OwnedFd>`: the descriptor is closed only when the
        // last clone drops, which is no earlier than the `AsyncFd` dropping
        // (and deregistering) its own; an `OwnedFd` behind an `Arc` cannot be
        // replaced, closed early or moved out, so its raw descriptor never
        // changes. The other clones (in `Tree`) only pass it to inotify
        // calls, which do not close it.
        let events =
            unsafe { AsyncFd::register_with_interest(Arc::clone(&tree.fd), Interest::READABLE) }
                .map_err(|error| Failure::io("cannot register the watch", &error.into()))?;
        let (cancel_tx, cancel_rx) = oneshot::channel();
        self.generation += 1;
        locked(&self.open).insert(
            id,
            Open {
                generation: self.generation,
                cancel: cancel_tx,
            },
        );
        tokio::spawn(watch_task(
            id,
            tree,
            events,
            self.outbox.clone(),
            Arc::clone(&self.open),
            self.generation,
            cancel_rx,
        ));
        Ok(())
    }

    /// Handles `cancel` (request `id`) of request `target`: answers `done`
    /// once the target's final event is queued, or at once when `target` is
    /// no open watch.
    pub(crate) async fn cancel(&self, id: u64, target: u64) {
        let slot = locked(&self.open).remove(&target);
        if let Some(slot) = slot {
            let (ack_tx, ack_rx) = oneshot::channel();
            if slot.cancel.send(ack_tx).is_ok() {
                let outbox = self.outbox.clone();
                tokio::spawn(async move {
                    // Sent or dropped: either way the target's final event
                    // is queued.
                    let _ = ack_rx.await;
                    outbox.send(id, Event::Done).await;
                });
                return;
            }
        }
        self.outbox.send(id, Event::Done).await;
    }

    /// The session is over: every watch ends without a final event and
    /// closes its inotify descriptor.
    pub(crate) fn close_all(&self) {
        locked(&self.open).clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn network_filesystems_are_told_by_their_type() {
        // NFS, CIFS, SMB, SMB2, FUSE (bindfs, sshfs, …).
        for magic in [0x6969, 0xFF53_4D42, 0x517B, 0xFE53_4D42, 0x6573_5546] {
            assert!(is_network_filesystem(magic), "{magic:#x}");
        }
        // tmpfs, ext4, overlayfs, btrfs, gVisor's 9p gofer.
        for magic in [0x0102_1994, 0xEF53, 0x794C_7630, 0x9123_683E, 0x0102_1997] {
            assert!(!is_network_filesystem(magic), "{magic:#x}");
        }
        let dir = tempfile::tempdir().unwrap();
        assert!(refuse_network_filesystem(dir.path()).is_ok());
        let missing = refuse_network_filesystem(&dir.path().join("none")).unwrap_err();
        assert_eq!(missing.kind, ErrorKind::NotFound);
    }
}
