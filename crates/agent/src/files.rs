//! File operations.
//!
//! Paths are paths inside the sandbox: the agent lives in the sandbox root,
//! so plain filesystem calls are right. Relative paths are joined to the
//! user's home; a NUL byte is refused. Every filesystem call runs on the
//! blocking pool (one call per task, so a large read or write never holds a
//! blocking thread while waiting for the host), and process streaming on the
//! runtime thread never waits for a disk.
//!
//! Reads and writes refuse anything but regular files (after opening with
//! `O_NONBLOCK`): a FIFO or device could block a blocking thread forever.

use crate::failure::Failure;
use crate::outbox::Outbox;
use crate::privileges::USER_ID;
use crate::process::join_path;
use airlock_protocol::{ErrorKind, Event, FileInfo, FileKind, Identity, Xattrs};
use std::collections::BTreeMap;
use std::fs::{self, DirBuilder, File, Metadata, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::mpsc;

mod extract;
mod listing;
mod xattrs;

pub(crate) use xattrs::check_prefix as check_xattr_prefix;

/// Largest `file_data` payload.
pub(crate) const READ_CHUNK: usize = 1 << 20;
/// `write_data` chunks that may wait for the disk per open write.
const WRITE_QUEUE: usize = 4;
/// Entries a `list_dir` may collect before it is refused.
const MAX_ENTRIES: usize = 100_000;
/// Mode of created files and directories unless the request says otherwise.
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

/// File operations, with what they need from the agent's configuration.
#[derive(Debug, Clone)]
pub(crate) struct Files {
    home: Arc<PathBuf>,
    drop_privileges: bool,
}

/// A message for an open write, in arrival order.
#[derive(Debug)]
pub(crate) enum WriteMsg {
    Data(Vec<u8>),
    End,
}

/// What `write_file` asked for, resolved.
#[derive(Debug, Clone)]
pub(crate) struct WriteTarget {
    path: PathBuf,
    mode: Option<u32>,
    create_parents: bool,
    append: bool,
    chown: bool,
    xattrs: Option<Xattrs>,
}

/// Runs `work` on the blocking pool.
pub(crate) async fn blocking<T, F>(work: F) -> Result<T, Failure>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, Failure> + Send + 'static,
{
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|_| {
        Err(Failure::new(
            ErrorKind::Io,
            "the file operation was interrupted",
        ))
    })
}

/// A path as protocol text (not UTF-8 bytes replaced).
pub(crate) fn lossy(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Protocol metadata of `path` from its `lstat`.
fn file_info(path: &Path, meta: &Metadata) -> FileInfo {
    let file_type = meta.file_type();
    let kind = if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_dir() {
        FileKind::Dir
    } else if file_type.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    let symlink_target = if file_type.is_symlink() {
        fs::read_link(path).ok().map(|target| lossy(&target))
    } else {
        None
    };
    FileInfo {
        path: lossy(path),
        name: path
            .file_name()
            .map_or_else(|| lossy(path), |name| name.to_string_lossy().into_owned()),
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime_ns: meta
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(meta.mtime_nsec()),
        symlink_target,
        xattrs: BTreeMap::new(),
    }
}

/// What `stat` reports of `path` (an `lstat`), with its extended
/// attributes under `xattrs` when that names a prefix. Blocking.
pub(crate) fn info_of(path: &Path, xattrs: Option<&str>) -> io::Result<FileInfo> {
    let meta = fs::symlink_metadata(path)?;
    let mut info = file_info(path, &meta);
    if let Some(prefix) = xattrs {
        info.xattrs = xattrs::read(path, prefix);
    }
    Ok(info)
}

/// Creates the missing ancestors of `dir` with [`DIR_MODE`]; appends the
/// directories it created, outermost first.
fn create_missing_dirs(dir: &Path, created: &mut Vec<PathBuf>) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut cursor = Some(dir);
    while let Some(current) = cursor {
        if current.as_os_str().is_empty() {
            break;
        }
        match fs::metadata(current) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                missing.push(current.to_path_buf());
                cursor = current.parent();
            }
            Err(error) => return Err(error),
        }
    }
    for dir in missing.into_iter().rev() {
        match DirBuilder::new().mode(DIR_MODE).create(&dir) {
            Ok(()) => created.push(dir),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Gives the created directories to the user.
fn chown_dirs(dirs: &[PathBuf]) -> Result<(), Failure> {
    for dir in dirs {
        std::os::unix::fs::lchown(dir, Some(USER_ID), Some(USER_ID))
            .map_err(|error| Failure::io(format!("cannot chown {}", dir.display()), &error))?;
    }
    Ok(())
}

/// Opens (creating, truncating or appending) the target of a write.
fn open_for_write(target: &WriteTarget) -> Result<File, Failure> {
    let shown = target.path.display();
    let mut created_dirs = Vec::new();
    if target.create_parents {
        if let Some(parent) = target.path.parent() {
            create_missing_dirs(parent, &mut created_dirs).map_err(|error| {
                Failure::io(format!("cannot create the parents of {shown}"), &error)
            })?;
        }
    }
    let mut options = OpenOptions::new();
    options
        .write(true)
        .mode(target.mode.unwrap_or(FILE_MODE) & 0o7777)
        .custom_flags(libc::O_NONBLOCK);
    if target.append {
        options.append(true);
    }
    let cannot_open =
        |error: io::Error| Failure::io(format!("cannot open {shown} for writing"), &error);
    // With attributes to set (or clear), the file is truncated only once
    // they are, so a write they fail leaves it as it was; one it created
    // is removed, which needs to know whether it did.
    let (file, created) = if target.xattrs.is_some() {
        match options.clone().create_new(true).open(&target.path) {
            Ok(file) => (file, true),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => (
                options
                    .create(true)
                    .open(&target.path)
                    .map_err(cannot_open)?,
                false,
            ),
            Err(error) => return Err(cannot_open(error)),
        }
    } else {
        options.create(true).truncate(!target.append);
        (options.open(&target.path).map_err(cannot_open)?, false)
    };
    let meta = file
        .metadata()
        .map_err(|error| Failure::io(format!("cannot inspect {shown}"), &error))?;
    if !meta.is_file() {
        return Err(Failure::invalid(format!("{shown} is not a regular file")));
    }
    if let Some(mode) = target.mode {
        file.set_permissions(Permissions::from_mode(mode & 0o7777))
            .map_err(|error| Failure::io(format!("cannot set the mode of {shown}"), &error))?;
    }
    if target.chown {
        std::os::unix::fs::fchown(&file, Some(USER_ID), Some(USER_ID))
            .map_err(|error| Failure::io(format!("cannot chown {shown}"), &error))?;
        chown_dirs(&created_dirs)?;
    }
    if let Some(set) = &target.xattrs {
        if let Err(failure) = xattrs::replace(&file, set, &shown.to_string()) {
            if created {
                let _ = fs::remove_file(&target.path);
                for dir in created_dirs.iter().rev() {
                    let _ = fs::remove_dir(dir);
                }
            }
            return Err(failure);
        }
        if !target.append {
            file.set_len(0)
                .map_err(|error| Failure::io(format!("cannot truncate {shown}"), &error))?;
        }
    }
    Ok(file)
}

/// Reads up to `want` bytes at `at`; fewer only at the end of the file.
fn read_chunk(file: &File, at: u64, want: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; want];
    let mut filled = 0;
    while filled < want {
        match file.read_at(&mut buf[filled..], at + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

fn open_for_read(path: &Path) -> Result<File, Failure> {
    let shown = path.display();
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|error| Failure::io(format!("cannot open {shown} for reading"), &error))?;
    let meta = file
        .metadata()
        .map_err(|error| Failure::io(format!("cannot inspect {shown}"), &error))?;
    if meta.is_dir() {
        return Err(Failure::new(
            ErrorKind::IsADirectory,
            format!("{shown} is a directory"),
        ));
    }
    if !meta.is_file() {
        return Err(Failure::invalid(format!("{shown} is not a regular file")));
    }
    Ok(file)
}

fn make_dir(path: &Path, parents: bool, mode: Option<u32>, chown: bool) -> Result<(), Failure> {
    let shown = path.display();
    if fs::symlink_metadata(path).is_ok() {
        return Err(Failure::new(
            ErrorKind::AlreadyExists,
            format!("{shown} already exists"),
        ));
    }
    let mut created = Vec::new();
    if parents {
        if let Some(parent) = path.parent() {
            create_missing_dirs(parent, &mut created).map_err(|error| {
                Failure::io(format!("cannot create the parents of {shown}"), &error)
            })?;
        }
    }
    DirBuilder::new()
        .mode(mode.unwrap_or(DIR_MODE) & 0o7777)
        .create(path)
        .map_err(|error| Failure::io(format!("cannot create the directory {shown}"), &error))?;
    created.push(path.to_path_buf());
    if let Some(mode) = mode {
        fs::set_permissions(path, Permissions::from_mode(mode & 0o7777))
            .map_err(|error| Failure::io(format!("cannot set the mode of {shown}"), &error))?;
    }
    if chown {
        chown_dirs(&created)?;
    }
    Ok(())
}

fn remove(path: &Path, recursive: bool) -> Result<(), Failure> {
    let shown = path.display();
    if path == Path::new("/") {
        return Err(Failure::invalid("the root directory cannot be removed"));
    }
    let fail = |error: io::Error| Failure::io(format!("cannot remove {shown}"), &error);
    let meta = fs::symlink_metadata(path).map_err(fail)?;
    if meta.is_dir() {
        if recursive {
            // remove_dir_all never follows symlinks inside the tree.
            fs::remove_dir_all(path).map_err(fail)
        } else {
            fs::remove_dir(path).map_err(fail)
        }
    } else {
        fs::remove_file(path).map_err(fail)
    }
}

impl Files {
    /// File operations relative to `home`; `drop_privileges` enables chown.
    pub(crate) fn new(home: PathBuf, drop_privileges: bool) -> Files {
        Files {
            home: Arc::new(home),
            drop_privileges,
        }
    }

    /// The path inside the sandbox a request names.
    pub(crate) fn resolve(&self, path: &str) -> Result<PathBuf, Failure> {
        if path.is_empty() {
            return Err(Failure::invalid("the path is empty"));
        }
        if path.contains('\0') {
            return Err(Failure::invalid("the path contains a NUL byte"));
        }
        Ok(join_path(&self.home, path))
    }

    fn chown_for(&self, owner: Identity) -> bool {
        self.drop_privileges && owner == Identity::User
    }

    /// Handles `stat` (an `lstat`), with the attributes under `xattrs`.
    pub(crate) async fn stat(&self, path: &str, xattrs: Option<String>) -> Result<Event, Failure> {
        let path = self.resolve(path)?;
        if let Some(prefix) = &xattrs {
            xattrs::check_prefix(prefix)?;
        }
        blocking(move || {
            info_of(&path, xattrs.as_deref())
                .map(Event::Stat)
                .map_err(|error| Failure::io(format!("cannot stat {}", path.display()), &error))
        })
        .await
    }

    /// Handles `list_dir`.
    pub(crate) async fn list_dir(&self, path: &str, depth: u32) -> Result<Event, Failure> {
        if depth == 0 {
            return Err(Failure::invalid(
                "the depth of a listing must be at least 1",
            ));
        }
        let path = self.resolve(path)?;
        blocking(move || {
            listing::all(&path, depth, MAX_ENTRIES).map(|entries| Event::Entries { entries })
        })
        .await
    }

    /// Handles `list_dir_page`.
    pub(crate) async fn list_dir_page(
        &self,
        path: &str,
        depth: u32,
        after: Option<String>,
        limit: u32,
    ) -> Result<Event, Failure> {
        listing::check_depth(depth)?;
        let path = self.resolve(path)?;
        blocking(move || {
            listing::page(&path, depth, after.as_deref(), limit).map(|page| Event::EntriesPage {
                entries: page.entries,
                next: page.next,
            })
        })
        .await
    }

    /// Handles `list_dir_stream`: sends `entries_chunk`s on `id` and
    /// returns the final `entries_end`. Entries report their attributes
    /// under `xattrs`. Each chunk is walked on its own
    /// blocking call, and the next only once the chunk is queued, so the
    /// agent holds one chunk however large the tree.
    pub(crate) async fn list_dir_stream(
        &self,
        outbox: &Outbox,
        id: u64,
        path: &str,
        depth: u32,
        limit: u64,
        xattrs: Option<String>,
    ) -> Result<Event, Failure> {
        listing::check_depth(depth)?;
        if let Some(prefix) = &xattrs {
            xattrs::check_prefix(prefix)?;
        }
        let path = self.resolve(path)?;
        let mut walk = blocking(move || {
            listing::Walk::start(&path, depth).map(|walk| walk.reporting_xattrs(xattrs))
        })
        .await?;
        let mut count: u64 = 0;
        loop {
            let allowed = limit - count;
            let (back, chunk) = blocking(move || {
                let chunk = walk.chunk(allowed);
                Ok((walk, chunk))
            })
            .await?;
            walk = back;
            count += chunk.entries.len() as u64;
            if !chunk.entries.is_empty()
                && !outbox
                    .send(
                        id,
                        Event::EntriesChunk {
                            entries: chunk.entries,
                        },
                    )
                    .await
            {
                // The host left: nobody to answer.
                return Ok(Event::EntriesEnd {
                    count,
                    truncated: false,
                });
            }
            if chunk.ended {
                return Ok(Event::EntriesEnd {
                    count,
                    truncated: chunk.truncated,
                });
            }
        }
    }

    /// Handles `make_dir`.
    pub(crate) async fn make_dir(
        &self,
        path: &str,
        parents: bool,
        mode: Option<u32>,
        owner: Identity,
    ) -> Result<Event, Failure> {
        let path = self.resolve(path)?;
        let chown = self.chown_for(owner);
        blocking(move || make_dir(&path, parents, mode, chown).map(|()| Event::Done)).await
    }

    /// Handles `remove`.
    pub(crate) async fn remove(&self, path: &str, recursive: bool) -> Result<Event, Failure> {
        let path = self.resolve(path)?;
        blocking(move || remove(&path, recursive).map(|()| Event::Done)).await
    }

    /// Handles `rename`.
    pub(crate) async fn rename(&self, from: &str, to: &str) -> Result<Event, Failure> {
        let from = self.resolve(from)?;
        let to = self.resolve(to)?;
        blocking(move || {
            fs::rename(&from, &to)
                .map(|()| Event::Done)
                .map_err(|error| {
                    Failure::io(
                        format!("cannot rename {} to {}", from.display(), to.display()),
                        &error,
                    )
                })
        })
        .await
    }

    /// Handles `read_file`: sends `file_data` chunks on `id` and returns the
    /// final event.
    pub(crate) async fn read(
        &self,
        outbox: &Outbox,
        id: u64,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<Event, Failure> {
        let path = Arc::new(self.resolve(path)?);
        let file = {
            let path = Arc::clone(&path);
            Arc::new(blocking(move || open_for_read(&path)).await?)
        };
        let mut position = offset;
        let mut remaining = length.unwrap_or(u64::MAX);
        let mut total: u64 = 0;
        while remaining > 0 {
            let want = usize::try_from(remaining.min(READ_CHUNK as u64)).unwrap_or(READ_CHUNK);
            let chunk = {
                let file = Arc::clone(&file);
                let path = Arc::clone(&path);
                let at = position;
                blocking(move || {
                    read_chunk(&file, at, want).map_err(|error| {
                        Failure::io(format!("cannot read {}", path.display()), &error)
                    })
                })
                .await?
            };
            if chunk.is_empty() {
                break;
            }
            let n = chunk.len() as u64;
            position += n;
            remaining -= n;
            total += n;
            if !outbox.send_payload(id, Event::FileData, chunk).await {
                break;
            }
        }
        Ok(Event::FileEnd { bytes: total })
    }

    /// Resolves the target of `write_file` (and checks the attributes it
    /// is to leave).
    pub(crate) fn write_target(
        &self,
        path: &str,
        mode: Option<u32>,
        create_parents: bool,
        append: bool,
        owner: Identity,
        xattrs: Option<Xattrs>,
    ) -> Result<WriteTarget, Failure> {
        if let Some(set) = &xattrs {
            xattrs::check(set)?;
        }
        Ok(WriteTarget {
            path: self.resolve(path)?,
            mode,
            create_parents,
            append,
            chown: self.chown_for(owner),
            xattrs,
        })
    }

    /// Starts the task of one open `extract` into `dir` (relative to the
    /// home, like every path); feed it through the sender.
    pub(crate) fn start_extract(
        &self,
        outbox: Outbox,
        id: u64,
        dir: &str,
    ) -> Result<mpsc::Sender<WriteMsg>, Failure> {
        let dir = self.resolve(dir)?;
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        tokio::spawn(extract::extract_task(outbox, id, dir, rx));
        Ok(tx)
    }

    /// Starts the task of one open write; feed it through the sender.
    pub(crate) fn start_write(
        &self,
        outbox: Outbox,
        id: u64,
        target: WriteTarget,
    ) -> mpsc::Sender<WriteMsg> {
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        tokio::spawn(write_task(outbox, id, target, rx));
        tx
    }
}

/// One open write: answers `written` at the end, or one `error` and then
/// ignores the rest of the id's frames.
async fn write_task(
    outbox: Outbox,
    id: u64,
    target: WriteTarget,
    mut rx: mpsc::Receiver<WriteMsg>,
) {
    match write_chunks(target, &mut rx).await {
        Ok(Some(bytes)) => {
            outbox.send(id, Event::Written { bytes }).await;
        }
        // The session ended before write_end: nobody to answer.
        Ok(None) => {}
        Err(failure) => {
            outbox.fail(id, failure).await;
            while let Some(msg) = rx.recv().await {
                if matches!(msg, WriteMsg::End) {
                    break;
                }
            }
        }
    }
}

async fn write_chunks(
    target: WriteTarget,
    rx: &mut mpsc::Receiver<WriteMsg>,
) -> Result<Option<u64>, Failure> {
    let shown = Arc::new(target.path.display().to_string());
    let mut file = blocking(move || open_for_write(&target)).await?;
    let mut total: u64 = 0;
    while let Some(msg) = rx.recv().await {
        match msg {
            WriteMsg::Data(data) => {
                let len = data.len() as u64;
                let shown = Arc::clone(&shown);
                file = blocking(move || {
                    file.write_all(&data)
                        .map(|()| file)
                        .map_err(|error| Failure::io(format!("cannot write {shown}"), &error))
                })
                .await?;
                total += len;
            }
            WriteMsg::End => return Ok(Some(total)),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn resolve_refuses_nul_and_empty() {
        let files = Files::new(PathBuf::from("/home/user"), false);
        assert_eq!(files.resolve("a").unwrap(), PathBuf::from("/home/user/a"));
        assert_eq!(
            files.resolve("a\0b").unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            files.resolve("").unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn missing_dirs_are_created_outermost_first() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        let mut created = Vec::new();
        create_missing_dirs(&deep, &mut created).unwrap();
        assert_eq!(
            created,
            vec![dir.path().join("a"), dir.path().join("a/b"), deep.clone()]
        );
        assert!(deep.is_dir());
    }
}
