//! Freezing a sandbox's writable layer into an OCI layer: the overlayfs
//! *upper* directory of a sandbox (`<disk>/sandboxes/<id>/upper`, see
//! `jail::disk` and the launcher's overlay mount) written out as an
//! uncompressed OCI layer tar stream, for template builds (each step's
//! changes become a layer) and, later, snapshots. The caller compresses
//! and digests the stream and unpacks it into the store like any layer.
//!
//! The upper was written by the sandbox: it is **hostile input** read as
//! host root, possibly while the sandbox still runs.
//!
//! # How it is read
//!
//! - **By descriptor.** The upper's root is opened once (its last
//!   component without following a symlink; the rest of the caller's path
//!   is trusted). Every node is looked at with `fstatat(AT_SYMLINK_NOFOLLOW)`
//!   and opened with `openat(O_NOFOLLOW | O_NOATIME | O_NONBLOCK |
//!   O_CLOEXEC)` beneath its parent's descriptor by its single-component
//!   name; symlinks and FIFOs are opened `O_PATH`, never for reading, and
//!   devices and sockets are not opened at all. No symlink is ever
//!   followed and no path is resolved from the root. An opened node must
//!   be the one that was listed (device, inode and type); a node that
//!   vanished, changed type or was replaced is [`SnapshotError::Changed`].
//!   Only one directory descriptor is held at a time: going back up, the
//!   parent is reopened as `..` and must be the directory it was.
//! - **One file system.** A node on another device than the root (a
//!   mount inside the upper) is an error.
//! - **Bounded memory.** Each directory on the way down keeps its own
//!   sorted names until they are done (at most [`SnapshotLimits::max_entries`]
//!   names in all); the tree's listing is never held whole. The depth is
//!   bounded by the bound on paths (4095 bytes: at most 2048 directories).
//!   Hard links are remembered in a table of at most 16 MiB of names.
//!
//! # What becomes what
//!
//! - **Order.** The root first (as `./`), then each directory's names in
//!   byte order, depth first: a directory's entry comes before its
//!   contents. Two calls on the same tree give the same bytes.
//! - **Headers.** GNU format, names and link targets byte for byte (GNU
//!   long-name and long-link records past 99 bytes), numeric uid and gid,
//!   no user or group names, no access or change times. Directories are
//!   named with a trailing `/`.
//! - **Metadata.** The mode's permission and sticky bits, but **setuid and
//!   setgid are stripped** (counted), as the unpacker would strip them.
//!   The modification time in whole seconds, as the file has it (a time
//!   before 1970 becomes 0). Owners through the [`IdMap`]: host id `h` in
//!   `[base, base + count)` becomes `h - base`; any other owner (host root,
//!   the overflow id, another sandbox's range) becomes 65534 (`nobody`),
//!   counted.
//! - **Types.** Regular files with their data, directories, symlinks (the
//!   target verbatim, never followed) and FIFOs (which the unpacker makes
//!   again) are carried. A regular file with more than one link that was
//!   already written under an earlier name becomes a tar hard link to that
//!   name (the unpacker accepts links to earlier files of the same layer);
//!   past the table's bound, further ones are written as copies. Sockets
//!   and devices are **skipped** and counted (the unpacker skips devices;
//!   a socket means nothing without its process).
//! - **Whiteouts.** A character device 0:0 at `DIR/NAME` (overlayfs's
//!   whiteout) becomes an empty file `DIR/.wh.NAME`; a directory with
//!   `user.overlay.opaque=y` (or `trusted.overlay.opaque=y`, the spelling of
//!   mounts without `userxattr`) becomes its entry followed at once by an
//!   empty `DIR/.wh..wh..opq`, before its contents. These markers are
//!   root's, mode 0644, time 0: the layer's format gives them no meaning
//!   beyond their names.
//! - **Refused.** `user.overlay.redirect` and `user.overlay.metacopy` (or
//!   their `trusted.` spelling) on a directory or regular file: a redirect
//!   or metacopy upper is not a whole layer, and airlock's mounts never make
//!   one (`userxattr` implies `redirect_dir=nofollow` and no metacopy: a
//!   rename of a lower directory fails with `EXDEV`). A sandbox cannot set
//!   the upper's `user.overlay.*` through its overlay: Linux 6.7 and later
//!   store such a write *escaped*, as `user.overlay.overlay.*` (for nested
//!   overlays; earlier kernels refuse it), and `trusted.*` needs
//!   `CAP_SYS_ADMIN` of the host; the test of a real mount checks the
//!   escape and the `EXDEV`. The walker does not rely on it. A name starting with
//!   `.wh.` (the layer format's reserved prefix: it would read as a
//!   whiteout), a name whose whiteout would be over 255 bytes, and a path
//!   over 4095 bytes (what the unpacker accepts) are errors too.
//! - **Extended attributes.** A regular file's `user.*` attributes (e2b's
//!   file metadata lives there) but `user.overlay.*` (overlayfs's own) go
//!   in a PAX record (`SCHILY.xattr.NAME`) before its entry, at most
//!   [`MAX_CARRIED_XATTR_BYTES`] of names and values per file (the rest is
//!   left out, counted, as is one with a newline, which tar readers cannot
//!   read back); the unpacker applies those and only those.
//! - **Not carried.** Other extended attributes (file capabilities, ACLs,
//!   `trusted.*`, overlayfs's own `origin`/`impure` bookkeeping), and any on
//!   directories and links. Nanoseconds, access and change times.
//!
//! # Bounds
//!
//! [`SnapshotLimits`]: the regular files' bytes and the number of entries
//! (nodes listed, and tar entries written) are capped; past either the
//! walk stops with [`SnapshotError::TooLarge`]. A file's data is read
//! exactly to the size its header says: a file that is shorter or longer
//! than that, or whose size or times change while it is read, is
//! [`SnapshotError::Changed`] (snapshot a running sandbox only frozen).
//! On any error the stream written so far is not a layer; the caller
//! discards it.

use crate::unpack::{
    is_carried_xattr, shown, Limit, MAX_CARRIED_XATTR_BYTES, MAX_COMPONENT, MAX_PATH, NOBODY,
};
use rustix::fs::{
    fgetxattr, flistxattr, fstat, openat, readlinkat, statat, AtFlags, Dir, FileType, Mode, OFlags,
    Stat, CWD,
};
use rustix::io::Errno;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{self, BufWriter, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use tar::{EntryType, Header};

/// The bytes of names the hard-link table may hold.
const LINK_TABLE_BYTES: usize = 16 << 20;
/// A tar block.
const BLOCK: usize = 512;
/// The longest name a GNU header holds itself (its field is 100 bytes; the
/// last is left for a NUL, as GNU tar does).
const HEADER_NAME: usize = 99;
/// The xattrs that make a directory opaque.
const OPAQUE: [&[u8]; 2] = [b"user.overlay.opaque", b"trusted.overlay.opaque"];
/// The xattrs of overlayfs features a layer cannot express.
const UNSUPPORTED: [&[u8]; 4] = [
    b"user.overlay.redirect",
    b"user.overlay.metacopy",
    b"trusted.overlay.redirect",
    b"trusted.overlay.metacopy",
];
/// The OCI image spec's whiteout prefix and opaque marker.
const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";

/// How the sandbox's ids map onto the host's: inside id `n` is host id
/// `base + n` for `n < count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    pub host_base_uid: u32,
    pub host_base_gid: u32,
    pub count: u32,
}

impl IdMap {
    fn inside(base: u32, count: u32, host: u32) -> Option<u32> {
        host.checked_sub(base).filter(|n| *n < count)
    }
}

/// What one snapshot may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLimits {
    /// The most bytes of regular files' data.
    pub max_bytes: u64,
    /// The most nodes in the upper (skipped ones too), and the most tar
    /// entries written (whiteout and opaque markers too).
    pub max_entries: u64,
}

impl Default for SnapshotLimits {
    /// 8 GiB and 1,000,000 entries, the unpacker's defaults.
    fn default() -> Self {
        Self {
            max_bytes: 8 << 30,
            max_entries: 1_000_000,
        }
    }
}

/// What [`write_layer`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshotted {
    /// Tar entries written (GNU long-name records not counted).
    pub entries: u64,
    /// Bytes of regular files' data written.
    pub bytes: u64,
    /// Whiteouts written (`.wh.NAME`).
    pub whiteouts: u64,
    /// Opaque markers written (`.wh..wh..opq`).
    pub opaque_dirs: u64,
    /// Sockets and devices (other than whiteouts) left out.
    pub skipped: u64,
    /// Nodes whose setuid or setgid bit was stripped.
    pub stripped_setid: u64,
    /// Nodes whose owner or group was outside the id map (written as 65534).
    pub unmapped_ids: u64,
    /// Tar hard links written.
    pub hard_links: u64,
    /// Nodes left out because [`Elide::nodes`] names them.
    pub elided: u64,
    /// Extended attributes carried (in PAX records).
    pub xattrs: u64,
    /// Carried-kind extended attributes left out: past a file's bound.
    pub skipped_xattrs: u64,
}

/// Why an upper could not be written out.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The upper's root could not be opened as a directory.
    #[error("could not open the writable layer {upper:?}")]
    Open {
        upper: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A step of reading a node failed.
    #[error("could not {what} {path:?} of the writable layer")]
    Io {
        what: &'static str,
        /// The node, relative to the upper.
        path: String,
        #[source]
        source: io::Error,
    },
    /// A node changed while it was read.
    #[error("{path:?} of the writable layer changed while it was read (is the sandbox still writing to it?)")]
    Changed { path: String },
    /// The upper is over a limit.
    #[error("the writable layer is over its limit of {limit} (at {path:?})")]
    TooLarge { limit: Limit, path: String },
    /// A name cannot be an entry of a layer.
    #[error("{path:?} of the writable layer cannot be an entry of a layer: {why}")]
    BadName { path: String, why: BadName },
    /// A node carries an overlayfs xattr of a feature layers cannot express.
    #[error("{path:?} of the writable layer carries the overlayfs attribute {xattr}: redirect_dir and metacopy are not supported")]
    Unsupported { path: String, xattr: String },
    /// A node is on another file system than the upper's root.
    #[error("{path:?} of the writable layer is on another file system than its root")]
    OtherFileSystem { path: String },
    /// A node's type is none Linux has.
    #[error("{path:?} of the writable layer has an unknown file type (mode {mode:o})")]
    UnknownType { path: String, mode: u32 },
    /// The caller's writer failed.
    #[error("could not write the layer")]
    Write {
        #[source]
        source: io::Error,
    },
}

/// Why a name cannot be a layer's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadName {
    /// It starts with `.wh.`, which layers reserve for whiteouts.
    Reserved,
    /// It (or its whiteout `.wh.NAME`) is longer than [`MAX_COMPONENT`].
    ComponentTooLong,
    /// Its path is longer than [`MAX_PATH`].
    TooLong,
}

impl fmt::Display for BadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Reserved => f.write_str("it starts with `.wh.`, which layers keep for whiteouts"),
            Self::ComponentTooLong => write!(
                f,
                "its name (or its whiteout's) is longer than {MAX_COMPONENT} bytes"
            ),
            Self::TooLong => write!(f, "its path is longer than {MAX_PATH} bytes"),
        }
    }
}

/// What a tier's own setup of a sandbox left in its upper and a layer
/// must not carry (Docker keeps the same out of its layers through its
/// "init" layer): paths relative to the upper's root, without a leading
/// or trailing `/`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Elide {
    /// Nodes left out whatever they are (generated files such as
    /// `etc/hostname`: the build sandbox's identity, not the image's).
    pub nodes: HashSet<Vec<u8>>,
    /// Directories left out unless something beneath them is written (the
    /// mount points and directories the setup makes or chmods, copied up
    /// whether or not the sandbox changed them). An opaque one is always
    /// written.
    pub dirs: HashSet<Vec<u8>>,
}

/// [`write_layer`] leaving out what `elide` names.
pub fn write_layer_eliding(
    upper: &Path,
    ids: &IdMap,
    out: impl Write,
    limits: &SnapshotLimits,
    elide: &Elide,
) -> Result<Snapshotted, SnapshotError> {
    let root = openat(CWD, upper, DIR_FLAGS, Mode::empty()).map_err(|e| SnapshotError::Open {
        upper: upper.to_owned(),
        source: e.into(),
    })?;
    let walk = Walk {
        ids: *ids,
        limits: *limits,
        out: BufWriter::with_capacity(64 << 10, out),
        dev: 0,
        path: Vec::new(),
        links: HashMap::new(),
        link_bytes: 0,
        listed: 0,
        buf: vec![0; 64 << 10],
        xattrs: vec![0; 64 << 10],
        done: Snapshotted::default(),
        elide,
        pending: Vec::new(),
    };
    walk.run(root)
}

/// Writes the overlayfs upper directory `upper` as an uncompressed OCI
/// layer tar stream to `out`, owners mapped back through `ids`, under
/// `limits`. See the module documentation for what is read, carried,
/// stripped, skipped and refused.
///
/// # Errors
///
/// [`SnapshotError`]: an upper that cannot be opened or read, a node that
/// changes while it is read, one that cannot be a layer's entry, an upper
/// over its limits, or a failed write. What was written is then no layer.
pub fn write_layer(
    upper: &Path,
    ids: &IdMap,
    out: impl Write,
    limits: &SnapshotLimits,
) -> Result<Snapshotted, SnapshotError> {
    write_layer_eliding(upper, ids, out, limits, &Elide::default())
}

/// How directories are opened: readable (to list them and their xattrs).
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC);
/// How regular files are opened.
const FILE_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC);
/// How symlinks and FIFOs are opened: for `fstat` and `readlinkat` only.
const PATH_FLAGS: OFlags = OFlags::PATH.union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

/// The walk of one upper and what it wrote so far.
struct Walk<'e, W: Write> {
    ids: IdMap,
    limits: SnapshotLimits,
    out: BufWriter<W>,
    /// The upper root's device.
    dev: u64,
    /// The path of the directory being listed, relative to the root (empty
    /// for the root), without a trailing `/`.
    path: Vec<u8>,
    /// Files with more than one link already written: (device, inode) to
    /// their path.
    links: HashMap<(u64, u64), Vec<u8>>,
    link_bytes: usize,
    /// Names listed so far.
    listed: u64,
    buf: Vec<u8>,
    xattrs: Vec<u8>,
    done: Snapshotted,
    elide: &'e Elide,
    /// Directory entries held back (elidable, nothing beneath written
    /// yet), outermost first: each one's header and name.
    pending: Vec<(Header, Vec<u8>)>,
}

/// A directory on the way down.
struct Frame {
    /// Its names still to write, in order.
    names: std::vec::IntoIter<Vec<u8>>,
    /// The length of its path.
    len: usize,
    dev: u64,
    ino: u64,
}

/// A directory just written, to go down into.
struct Descend {
    fd: OwnedFd,
    names: Vec<Vec<u8>>,
    path: Vec<u8>,
    dev: u64,
    ino: u64,
}

/// A node's header fields.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: u64,
    setid: bool,
    unmapped: bool,
}

/// What errors show of a path: `.` for the root.
fn show(path: &[u8]) -> String {
    if path.is_empty() {
        ".".to_owned()
    } else {
        shown(path)
    }
}

fn io_at<'a>(what: &'static str, path: &'a [u8]) -> impl FnOnce(Errno) -> SnapshotError + 'a {
    move |errno| SnapshotError::Io {
        what,
        path: show(path),
        source: errno.into(),
    }
}

fn write_err(source: io::Error) -> SnapshotError {
    SnapshotError::Write { source }
}

fn changed(path: &[u8]) -> SnapshotError {
    SnapshotError::Changed { path: show(path) }
}

/// Whether `opened` is the node `listed` was.
fn same_node(listed: &Stat, opened: &Stat) -> bool {
    listed.st_dev == opened.st_dev
        && listed.st_ino == opened.st_ino
        && FileType::from_raw_mode(listed.st_mode) == FileType::from_raw_mode(opened.st_mode)
}

/// Opens `name` of `dir` with `flags`, without updating its access time
/// where the kernel lets us (`O_NOATIME` needs the owner or `CAP_FOWNER`).
/// A node gone or replaced by something else (a symlink: `ELOOP`) is
/// `Changed`.
fn open_node(
    dir: &OwnedFd,
    name: &[u8],
    flags: OFlags,
    path: &[u8],
) -> Result<OwnedFd, SnapshotError> {
    let noatime = if flags.contains(OFlags::PATH) {
        flags
    } else {
        flags | OFlags::NOATIME
    };
    let opened = match openat(dir, name, noatime, Mode::empty()) {
        Err(Errno::PERM) if noatime != flags => openat(dir, name, flags, Mode::empty()),
        result => result,
    };
    match opened {
        Ok(fd) => Ok(fd),
        Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR | Errno::NXIO) => Err(changed(path)),
        Err(errno) => Err(io_at("open", path)(errno)),
    }
}

/// `parent/name`, or `name` in the root.
fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(parent.len() + 1 + name.len());
    if !parent.is_empty() {
        path.extend_from_slice(parent);
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

impl<W: Write> Walk<'_, W> {
    fn run(mut self, root: OwnedFd) -> Result<Snapshotted, SnapshotError> {
        let st = fstat(&root).map_err(io_at("look at", b""))?;
        self.dev = st.st_dev;
        let descend = self.directory(root, &st, Vec::new())?;
        let mut current = descend.fd;
        let mut stack = vec![Frame {
            names: descend.names.into_iter(),
            len: 0,
            dev: descend.dev,
            ino: descend.ino,
        }];
        while let Some(top) = stack.last_mut() {
            let Some(name) = top.names.next() else {
                // Left with nothing beneath it written: it stays out.
                if self
                    .pending
                    .last()
                    .is_some_and(|(_, name)| name.strip_suffix(b"/") == Some(&self.path[..]))
                {
                    self.pending.pop();
                }
                stack.pop();
                let Some(parent) = stack.last() else {
                    break;
                };
                // Back up by `..`, which must still be the directory we
                // came down from (the sandbox may rename directories).
                let up = openat(&current, "..", DIR_FLAGS, Mode::empty())
                    .map_err(io_at("reopen", &self.path[..parent.len]))?;
                let st = fstat(&up).map_err(io_at("look at", &self.path[..parent.len]))?;
                if (st.st_dev, st.st_ino) != (parent.dev, parent.ino) {
                    return Err(changed(&self.path[..parent.len]));
                }
                self.path.truncate(parent.len);
                current = up;
                continue;
            };
            if let Some(down) = self.node(&current, &name)? {
                self.path = down.path;
                stack.push(Frame {
                    names: down.names.into_iter(),
                    len: self.path.len(),
                    dev: down.dev,
                    ino: down.ino,
                });
                current = down.fd;
            }
        }
        // The end-of-archive: two zero blocks.
        self.out.write_all(&[0; 2 * BLOCK]).map_err(write_err)?;
        self.out.flush().map_err(write_err)?;
        Ok(self.done)
    }

    /// Writes the node `name` of the directory `dir` (at `self.path`);
    /// a directory is returned to go down into.
    fn node(&mut self, dir: &OwnedFd, name: &[u8]) -> Result<Option<Descend>, SnapshotError> {
        let path = join(&self.path, name);
        let bad = |why| SnapshotError::BadName {
            path: show(&path),
            why,
        };
        if name.starts_with(WHITEOUT_PREFIX) {
            return Err(bad(BadName::Reserved));
        }
        if name.len() > MAX_COMPONENT {
            return Err(bad(BadName::ComponentTooLong));
        }
        if path.len() > MAX_PATH {
            return Err(bad(BadName::TooLong));
        }
        if self.elide.nodes.contains(&path) {
            self.done.elided += 1;
            return Ok(None);
        }
        let st = match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Err(changed(&path)),
            Err(errno) => return Err(io_at("look at", &path)(errno)),
        };
        if st.st_dev != self.dev {
            return Err(SnapshotError::OtherFileSystem { path: show(&path) });
        }
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                let fd = open_node(dir, name, DIR_FLAGS, &path)?;
                return self.directory(fd, &st, path).map(Some);
            }
            FileType::RegularFile => self.file(dir, name, &st, &path)?,
            FileType::Symlink => {
                let fd = open_node(dir, name, PATH_FLAGS, &path)?;
                let opened = self.opened(&fd, &st, &path)?;
                let target = readlinkat(&fd, "", Vec::new())
                    .map_err(io_at("read the target of", &path))?
                    .into_bytes();
                let meta = self.meta(&opened);
                self.put(header(EntryType::Symlink, &meta, 0), &path, Some(&target))?;
            }
            FileType::Fifo => {
                let fd = open_node(dir, name, PATH_FLAGS, &path)?;
                let opened = self.opened(&fd, &st, &path)?;
                let meta = self.meta(&opened);
                self.put(header(EntryType::Fifo, &meta, 0), &path, None)?;
            }
            FileType::CharacterDevice if st.st_rdev == 0 => {
                let mut marker = WHITEOUT_PREFIX.to_vec();
                marker.extend_from_slice(name);
                if marker.len() > MAX_COMPONENT {
                    return Err(bad(BadName::ComponentTooLong));
                }
                let marker = join(&self.path, &marker);
                if marker.len() > MAX_PATH {
                    return Err(bad(BadName::TooLong));
                }
                self.put(marker_header(), &marker, None)?;
                self.done.whiteouts += 1;
            }
            FileType::CharacterDevice | FileType::BlockDevice | FileType::Socket => {
                self.done.skipped += 1;
            }
            FileType::Unknown => {
                return Err(SnapshotError::UnknownType {
                    path: show(&path),
                    mode: st.st_mode,
                })
            }
        }
        Ok(None)
    }

    /// `fstat` of an opened node, which must be the one listed as `listed`.
    fn opened(&self, fd: &OwnedFd, listed: &Stat, path: &[u8]) -> Result<Stat, SnapshotError> {
        let st = fstat(fd).map_err(io_at("look at", path))?;
        if same_node(listed, &st) {
            Ok(st)
        } else {
            Err(changed(path))
        }
    }

    /// Writes the directory `fd` (listed as `listed`) and its opaque marker,
    /// and lists its names.
    fn directory(
        &mut self,
        fd: OwnedFd,
        listed: &Stat,
        path: Vec<u8>,
    ) -> Result<Descend, SnapshotError> {
        let st = self.opened(&fd, listed, &path)?;
        let opaque = self.overlay_xattrs(&fd, &path)?;
        let meta = self.meta(&st);
        let mut name = if path.is_empty() {
            b".".to_vec()
        } else {
            path.clone()
        };
        name.push(b'/');
        if !opaque && self.elide.dirs.contains(&path) {
            self.pending
                .push((header(EntryType::Directory, &meta, 0), name.clone()));
        } else {
            self.put(header(EntryType::Directory, &meta, 0), &name, None)?;
        }
        if opaque {
            name.extend_from_slice(OPAQUE_MARKER);
            self.put(marker_header(), &name, None)?;
            self.done.opaque_dirs += 1;
        }
        let names = self.list(&fd, &path)?;
        Ok(Descend {
            fd,
            names,
            path,
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    /// The names of the directory `fd`, in byte order.
    fn list(&mut self, fd: &OwnedFd, path: &[u8]) -> Result<Vec<Vec<u8>>, SnapshotError> {
        let mut names = Vec::new();
        for entry in Dir::read_from(fd).map_err(io_at("list", path))? {
            let entry = entry.map_err(io_at("list", path))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            self.listed += 1;
            if self.listed > self.limits.max_entries {
                return Err(SnapshotError::TooLarge {
                    limit: Limit::Entries(self.limits.max_entries),
                    path: show(path),
                });
            }
            names.push(name.to_vec());
        }
        names.sort_unstable();
        Ok(names)
    }

    /// Reads the xattr names of a directory or regular file: refuses the
    /// overlayfs features layers cannot express and tells whether it is
    /// marked opaque.
    fn overlay_xattrs(&mut self, fd: &OwnedFd, path: &[u8]) -> Result<bool, SnapshotError> {
        let len = match flistxattr(fd, &mut self.xattrs[..]) {
            Ok(len) => len,
            // A file system without xattrs has none of these.
            Err(Errno::NOTSUP) => return Ok(false),
            Err(errno) => return Err(io_at("list the extended attributes of", path)(errno)),
        };
        let mut opaque = false;
        for xattr in self.xattrs[..len].split(|b| *b == 0) {
            if UNSUPPORTED.contains(&xattr) {
                return Err(SnapshotError::Unsupported {
                    path: show(path),
                    xattr: String::from_utf8_lossy(xattr).into_owned(),
                });
            }
            if OPAQUE.contains(&xattr) {
                let mut value = [0u8; 2];
                match fgetxattr(fd, xattr, &mut value[..]) {
                    Ok(1) if value[0] == b'y' => opaque = true,
                    // Another value (6.7's `x` says "has xattr whiteouts",
                    // which only lower layers use), or it went away.
                    Ok(_) | Err(Errno::RANGE | Errno::NODATA) => {}
                    Err(errno) => {
                        return Err(io_at("read the extended attributes of", path)(errno))
                    }
                }
            }
        }
        Ok(opaque)
    }

    /// The extended attributes of a regular file that a layer carries
    /// (names and values), after [`Walk::overlay_xattrs`] listed its names
    /// into `self.xattrs`; past the bound, the rest are counted and left.
    fn carried_xattrs(&mut self, fd: &OwnedFd, path: &[u8]) -> Result<Xattrs, SnapshotError> {
        let len = match flistxattr(fd, &mut self.xattrs[..]) {
            Ok(len) => len,
            Err(Errno::NOTSUP) => return Ok(Vec::new()),
            Err(errno) => return Err(io_at("list the extended attributes of", path)(errno)),
        };
        // In byte order: the same tree gives the same bytes, and which
        // are left past the bound does not depend on the file system.
        let mut names: Vec<Vec<u8>> = self.xattrs[..len]
            .split(|b| *b == 0)
            .filter(|name| is_carried_xattr(name))
            .map(<[u8]>::to_vec)
            .collect();
        names.sort_unstable();
        let mut carried = Vec::new();
        let mut total = 0usize;
        let mut value = vec![0u8; 64 << 10];
        for name in names {
            let n = match fgetxattr(fd, &name[..], &mut value[..]) {
                Ok(n) => n,
                // Gone meanwhile, or grown past what one read holds.
                Err(Errno::NODATA | Errno::RANGE) => {
                    self.done.skipped_xattrs += 1;
                    continue;
                }
                Err(errno) => return Err(io_at("read the extended attributes of", path)(errno)),
            };
            total += name.len() + n;
            // A newline cannot be read back: tar readers split PAX
            // records at newlines.
            if total > MAX_CARRIED_XATTR_BYTES
                || name.contains(&b'\n')
                || value[..n].contains(&b'\n')
            {
                self.done.skipped_xattrs += 1;
                continue;
            }
            carried.push((name, value[..n].to_vec()));
        }
        self.done.xattrs += carried.len() as u64;
        Ok(carried)
    }

    /// Writes a PAX extended header (`x`) carrying `xattrs` for the entry
    /// that follows it.
    fn put_pax(&mut self, xattrs: &Xattrs) -> Result<(), SnapshotError> {
        let mut records = Vec::new();
        for (name, value) in xattrs {
            records.extend(pax_record(b"SCHILY.xattr.", name, value));
        }
        // Held-back directories go before it, as before any entry.
        for (header, name) in std::mem::take(&mut self.pending) {
            self.put_entry(header, &name, None)?;
        }
        self.record(
            Header::new_ustar(),
            b"././@PaxHeader",
            EntryType::XHeader,
            &[&records],
        )
    }

    /// Writes the regular file `name` of `dir`, listed as `listed`: a hard
    /// link to its first name if it had one, else its data.
    fn file(
        &mut self,
        dir: &OwnedFd,
        name: &[u8],
        listed: &Stat,
        path: &[u8],
    ) -> Result<(), SnapshotError> {
        let inode = (listed.st_dev, listed.st_ino);
        if listed.st_nlink > 1 {
            if let Some(first) = self.links.get(&inode).cloned() {
                let meta = self.meta_of(listed);
                self.put(header(EntryType::Link, &meta, 0), path, Some(&first))?;
                self.done.hard_links += 1;
                return Ok(());
            }
        }
        let fd = open_node(dir, name, FILE_FLAGS, path)?;
        let st = self.opened(&fd, listed, path)?;
        self.overlay_xattrs(&fd, path)?;
        let carried = self.carried_xattrs(&fd, path)?;
        let size = u64::try_from(st.st_size).map_err(|_| changed(path))?;
        match self.done.bytes.checked_add(size) {
            Some(bytes) if bytes <= self.limits.max_bytes => {}
            _ => {
                return Err(SnapshotError::TooLarge {
                    limit: Limit::Bytes(self.limits.max_bytes),
                    path: show(path),
                })
            }
        }
        let meta = self.meta(&st);
        if !carried.is_empty() {
            self.put_pax(&carried)?;
        }
        self.put(header(EntryType::Regular, &meta, size), path, None)?;
        let mut file = std::fs::File::from(fd);
        let mut left = size;
        while left > 0 {
            let want = usize::try_from(left).map_or(self.buf.len(), |l| l.min(self.buf.len()));
            let n = match file.read(&mut self.buf[..want]) {
                Ok(0) => return Err(changed(path)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(SnapshotError::Io {
                        what: "read",
                        path: show(path),
                        source: e,
                    })
                }
            };
            self.out.write_all(&self.buf[..n]).map_err(write_err)?;
            left -= n as u64;
        }
        // Nothing past the size, and the same size and times as before.
        let more = loop {
            match file.read(&mut self.buf[..1]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(SnapshotError::Io {
                        what: "read",
                        path: show(path),
                        source: e,
                    })
                }
                Ok(n) => break n,
            }
        };
        let after = fstat(&file).map_err(io_at("look at", path))?;
        if more != 0
            || after.st_size != st.st_size
            || (after.st_mtime, after.st_mtime_nsec) != (st.st_mtime, st.st_mtime_nsec)
            || (after.st_ctime, after.st_ctime_nsec) != (st.st_ctime, st.st_ctime_nsec)
        {
            return Err(changed(path));
        }
        self.pad(size)?;
        self.done.bytes += size;
        if st.st_nlink > 1 && self.link_bytes + path.len() <= LINK_TABLE_BYTES {
            self.link_bytes += path.len();
            self.links.insert(inode, path.to_vec());
        }
        Ok(())
    }

    /// The header fields of a node, counted.
    fn meta(&mut self, st: &Stat) -> Meta {
        let meta = self.meta_of(st);
        self.done.stripped_setid += u64::from(meta.setid);
        self.done.unmapped_ids += u64::from(meta.unmapped);
        meta
    }

    /// The header fields of a node.
    fn meta_of(&self, st: &Stat) -> Meta {
        let mode = st.st_mode & 0o7777;
        let uid = IdMap::inside(self.ids.host_base_uid, self.ids.count, st.st_uid);
        let gid = IdMap::inside(self.ids.host_base_gid, self.ids.count, st.st_gid);
        Meta {
            mode: mode & !0o6000,
            uid: uid.unwrap_or(NOBODY),
            gid: gid.unwrap_or(NOBODY),
            mtime: u64::try_from(st.st_mtime).unwrap_or(0),
            setid: mode & 0o6000 != 0,
            unmapped: uid.is_none() || gid.is_none(),
        }
    }

    /// Writes one entry's header (after GNU long-name records for a long
    /// `link` or `name`), counted toward the entries limit.
    fn put(
        &mut self,
        header: Header,
        name: &[u8],
        link: Option<&[u8]>,
    ) -> Result<(), SnapshotError> {
        // Something beneath the held-back directories: they go first.
        for (header, name) in std::mem::take(&mut self.pending) {
            self.put_entry(header, &name, None)?;
        }
        self.put_entry(header, name, link)
    }

    fn put_entry(
        &mut self,
        mut header: Header,
        name: &[u8],
        link: Option<&[u8]>,
    ) -> Result<(), SnapshotError> {
        self.done.entries += 1;
        if self.done.entries > self.limits.max_entries {
            return Err(SnapshotError::TooLarge {
                limit: Limit::Entries(self.limits.max_entries),
                path: show(name),
            });
        }
        if let Some(link) = link {
            if link.len() > HEADER_NAME {
                self.long(EntryType::GNULongLink, link)?;
            }
            let field = &mut header.as_old_mut().linkname;
            let kept = link.len().min(HEADER_NAME);
            field[..kept].copy_from_slice(&link[..kept]);
        }
        if name.len() > HEADER_NAME {
            self.long(EntryType::GNULongName, name)?;
        }
        let field = &mut header.as_old_mut().name;
        let kept = name.len().min(HEADER_NAME);
        field[..kept].copy_from_slice(&name[..kept]);
        header.set_cksum();
        self.out.write_all(header.as_bytes()).map_err(write_err)
    }

    /// A GNU long-name (`L`) or long-link (`K`) record: the value and a NUL.
    fn long(&mut self, kind: EntryType, value: &[u8]) -> Result<(), SnapshotError> {
        self.record(Header::new_gnu(), b"././@LongLink", kind, &[value, &[0]])
    }

    /// An extension record (`header` of `kind` named `name`, root's, time
    /// 0) whose data is `parts` in a row.
    fn record(
        &mut self,
        mut header: Header,
        name: &[u8],
        kind: EntryType,
        parts: &[&[u8]],
    ) -> Result<(), SnapshotError> {
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        let size: u64 = parts.iter().map(|p| p.len() as u64).sum();
        header.set_size(size);
        header.set_entry_type(kind);
        header.set_cksum();
        self.out.write_all(header.as_bytes()).map_err(write_err)?;
        for part in parts {
            self.out.write_all(part).map_err(write_err)?;
        }
        self.pad(size)
    }

    /// Zeros from the end of `size` bytes of data to the next block.
    fn pad(&mut self, size: u64) -> Result<(), SnapshotError> {
        let rest = (size % BLOCK as u64) as usize;
        if rest != 0 {
            self.out.write_all(&[0; BLOCK][rest..]).map_err(write_err)?;
        }
        Ok(())
    }
}

/// Extended attributes a layer carries for a file: names and values.
type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// One PAX record, `LEN PREFIXKEY=VALUE\n`, its length counting itself.
fn pax_record(prefix: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let body = prefix.len() + key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    let mut record = Vec::with_capacity(len);
    record.extend_from_slice(len.to_string().as_bytes());
    record.push(b' ');
    record.extend_from_slice(prefix);
    record.extend_from_slice(key);
    record.push(b'=');
    record.extend_from_slice(value);
    record.push(b'\n');
    record
}

/// A header of `kind` with `meta` and `size` (no name yet).
fn header(kind: EntryType, meta: &Meta, size: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(meta.mode);
    header.set_uid(meta.uid.into());
    header.set_gid(meta.gid.into());
    header.set_mtime(meta.mtime);
    header.set_size(size);
    header
}

/// The header of a whiteout or opaque marker: an empty file, root's.
fn marker_header() -> Header {
    header(
        EntryType::Regular,
        &Meta {
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: 0,
            setid: false,
            unmapped: false,
        },
        0,
    )
}
