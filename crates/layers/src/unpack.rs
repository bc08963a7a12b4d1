//! The OCI layer unpacker: one layer blob (a tar stream, plain, gzip or
//! zstd) into an empty directory of the store, ready to be an overlayfs
//! lower layer. The layer is hostile input; the unpacker runs as host root.
//!
//! # What it does with a layer
//!
//! - **Digests.** It hashes the blob as read (`digest`) and the tar stream
//!   it decompresses to (`diff_id`), both to their very end: bytes after the
//!   tar's end-of-archive count too. The caller compares them with what
//!   the manifest and the image config say.
//! - **Every node by descriptor.** The directory of each entry's parent is
//!   opened beneath the descriptor of the layer's root with `openat2`
//!   (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`); the
//!   node itself is made with an `*at` call on that descriptor and a
//!   single-component name (`mkdirat`, `openat(O_CREAT | O_EXCL |
//!   O_NOFOLLOW)`, `symlinkat`, `linkat` without following, `mknodat`),
//!   and its metadata is set on its descriptor or with
//!   `AT_SYMLINK_NOFOLLOW`. No path is ever joined onto the root and
//!   opened by the host's path resolution, and the tar crate's own
//!   `unpack` is never used.
//! - **Names.** Leading `/` and `./` are dropped, as are empty and `.`
//!   components (so `/abs` lands at `abs`, inside). A name with a `..`
//!   component, a NUL byte, a component over 255 bytes or a length over
//!   4095 bytes is refused, as is an empty name for anything but a
//!   directory (a directory `./`, which layers made with `tar -C dir .`
//!   start with, gives its metadata to the layer's root). Missing parent
//!   directories are made (0755, root's). A name below a symlink an earlier
//!   entry made is refused (`openat2` answers `ELOOP`): a layer's symlinks
//!   are resolved inside the sandbox's root, later, never by the unpacker.
//! - **Types.** Regular files (also contiguous files and GNU sparse files,
//!   written out whole), directories, symlinks (the target kept verbatim),
//!   hard links (only to a regular file this layer made earlier, by its
//!   normalized name; anything else is refused) and FIFOs are made.
//!   Character and block devices are **skipped** and counted (each sandbox
//!   gets a generated `/dev`). PAX global headers are ignored. Any other
//!   type is refused.
//! - **Whiteouts** (the OCI image spec's "Whiteouts") become overlayfs
//!   whiteouts: `DIR/.wh.NAME` is a character device 0:0 at `DIR/NAME`, and
//!   `DIR/.wh..wh..opq` sets `user.overlay.opaque=y` on `DIR` (the
//!   sandboxes mount overlayfs with `userxattr`). A whiteout only hides
//!   the layers below: where this layer has `NAME` itself, a non-directory
//!   stays as it is and a directory becomes opaque; a directory this layer
//!   makes over its own whiteout is opaque too. A whiteout of `.`, `..` or
//!   of the empty name is refused.
//! - **Replacement.** A later entry of the same name replaces the earlier
//!   one: a directory over a directory keeps it (and its contents) and
//!   takes the new metadata; anything else unlinks the earlier node, a
//!   directory with its whole tree (by descriptor).
//! - **Metadata.** Owner and group as in the entry, but ids of 65536 and
//!   up become 65534 (`nobody`: sandboxes map only 0..65535), counted.
//!   Mode bits are kept but for **setuid and setgid, which are stripped**
//!   and counted: the store is host-side, root-owned data, and although
//!   the process tier mounts layers `nosuid`, no set-id file of a layer
//!   should exist on the host at all. Modification times are set
//!   (directories' at the end, after their contents). **PAX extended
//!   attributes (`SCHILY.xattr.*`) are not applied** (file capabilities
//!   and ACLs would be a privilege source) but counted, except a regular
//!   file's `user.*` ones other than `user.overlay.*` ([`is_carried_xattr`]:
//!   plain data, such as e2b's file metadata, which snapshots carry), at
//!   most [`MAX_CARRIED_XATTR_BYTES`] of names and values per file; the
//!   sandboxes' overlays take `user.overlay.*` for their own, so a layer
//!   never sets one (an opaque directory comes from its marker only).
//! - **Limits** ([`UnpackLimits`]): the regular files' bytes (and any data
//!   the tar stream carries beside them: data of non-file entries, bytes
//!   after the end-of-archive) and the number of entries are capped; the
//!   headers in front of one entry (long names, PAX records, sparse maps,
//!   which the tar crate buffers) may take at most 4 MiB of the stream.
//!
//! On an error the directory holds whatever was made before it; the caller
//! removes it. Nothing is ever made outside it.

#![forbid(unsafe_code)]

mod stream;
mod tree;

pub use stream::Compression;

use rustix::fs::{
    chmodat, chownat, fchmod, fchown, fsetxattr, futimens, linkat, mknodat, openat, symlinkat,
    utimensat, AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, XattrFlags,
};
use rustix::io::Errno;
use rustix::process::{Gid, Uid};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use stream::{Digesting, Flags, Metered, HEADER_BUDGET, MAGIC_LEN};
use tree::{Existing, Tree, TreeError};

/// The longest name the unpacker accepts, in bytes: the kernel's
/// `PATH_MAX` less its terminating NUL.
pub const MAX_PATH: usize = 4095;
/// The longest component of a name, in bytes (`NAME_MAX`).
pub const MAX_COMPONENT: usize = 255;
/// The uid and gid that ids past a sandbox's range (65536 and up) become.
pub const NOBODY: u32 = 65534;
/// Extended attributes applied to a file: names and values.
type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// The first id a sandbox cannot map.
const ID_RANGE: u64 = 65536;
/// The most bytes of extended attributes (names and values) a layer
/// carries for one file.
pub const MAX_CARRIED_XATTR_BYTES: usize = 64 << 10;

/// Whether a layer carries an extended attribute of this name (for a
/// regular file): `user.*`, which has no meaning to the kernel, but
/// `user.overlay.*`, which the sandboxes' overlayfs mounts (`userxattr`)
/// read as their own.
pub fn is_carried_xattr(name: &[u8]) -> bool {
    name.starts_with(b"user.") && !name.starts_with(b"user.overlay.") && name.len() <= MAX_COMPONENT
}

/// What one layer may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnpackLimits {
    /// The most bytes of regular files (and other data the tar stream
    /// carries) in the layer.
    pub max_bytes: u64,
    /// The most tar entries in the layer.
    pub max_entries: u64,
}

impl Default for UnpackLimits {
    /// 8 GiB and 1,000,000 entries.
    fn default() -> Self {
        Self {
            max_bytes: 8 << 30,
            max_entries: 1_000_000,
        }
    }
}

/// What [`unpack_layer`] made of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpacked {
    /// `sha256:<hex>` of the blob as read: the layer's digest.
    pub digest: String,
    /// `sha256:<hex>` of the decompressed tar stream: the layer's `diff_id`.
    pub diff_id: String,
    /// How the blob was compressed.
    pub compression: Compression,
    /// Tar entries read (extension headers not counted).
    pub entries: u64,
    /// Bytes of regular files written.
    pub bytes: u64,
    /// Entries whose setuid or setgid bit was stripped.
    pub stripped_setid: u64,
    /// Character and block devices skipped.
    pub skipped_devices: u64,
    /// Entries whose uid or gid (65536 or more) became 65534.
    pub clamped_ids: u64,
    /// PAX extended attributes (`SCHILY.xattr.*`) not applied.
    pub skipped_xattrs: u64,
    /// PAX extended attributes applied (see [`is_carried_xattr`]).
    pub xattrs: u64,
    /// Whiteouts made (character devices 0:0).
    pub whiteouts: u64,
    /// Directories made opaque.
    pub opaque_dirs: u64,
}

/// Why a layer could not be unpacked.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The tar stream or its compression is truncated or garbled.
    #[error("the layer is corrupt {at} (a truncated or garbled tar or compression stream)")]
    Corrupt {
        /// Where in the layer.
        at: Place,
        /// What the reader found.
        #[source]
        source: io::Error,
    },
    /// An entry tries something a layer may not do.
    #[error("the layer's entry {entry:?} is refused: {why}")]
    Hostile {
        /// The entry's name as the tar has it (its first 256 bytes).
        entry: String,
        /// What it tried.
        why: Refusal,
    },
    /// The layer is over one of its limits.
    #[error("the layer is over its limit of {limit} {at}")]
    TooLarge {
        /// The limit it passed.
        limit: Limit,
        /// Where in the layer.
        at: Place,
    },
    /// A step on the store's side failed (the caller's reader, or making a
    /// node: a full disk, a missing kernel feature).
    #[error("could not {what} {at}")]
    Io {
        /// The step that failed.
        what: &'static str,
        /// Where in the layer.
        at: Place,
        /// The failure.
        #[source]
        source: io::Error,
    },
}

/// Where in a layer an error happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Before its first entry.
    Start,
    /// In the headers after this entry.
    After(String),
    /// At this entry.
    Entry(String),
    /// After its last entry.
    End,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Start => f.write_str("before its first entry"),
            Self::After(entry) => write!(f, "after entry {entry:?}"),
            Self::Entry(entry) => write!(f, "at entry {entry:?}"),
            Self::End => f.write_str("after its last entry"),
        }
    }
}

/// A limit of [`UnpackLimits`] or of the unpacker itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// [`UnpackLimits::max_bytes`].
    Bytes(u64),
    /// [`UnpackLimits::max_entries`].
    Entries(u64),
    /// The bytes of headers in front of one entry.
    HeaderBytes(u64),
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bytes(n) => write!(f, "{n} bytes of data"),
            Self::Entries(n) => write!(f, "{n} entries"),
            Self::HeaderBytes(n) => write!(f, "{n} bytes of headers for one entry"),
        }
    }
}

/// What a refused entry tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Its name has a `..` component.
    ParentComponent,
    /// Its name or link target holds a NUL byte.
    Nul,
    /// Its name is empty (and it is not a directory).
    EmptyName,
    /// Its name or link target is longer than [`MAX_PATH`] bytes.
    TooLong,
    /// A component of its name is longer than [`MAX_COMPONENT`] bytes.
    ComponentTooLong,
    /// A parent of it is a symlink (or resolving it left the layer).
    ThroughSymlink,
    /// A parent of it is not a directory.
    ParentNotDirectory,
    /// It is a hard link to something other than a regular file this layer
    /// made earlier.
    HardLink {
        /// The link's target as the tar has it.
        target: String,
    },
    /// It is a symlink with an empty target.
    EmptyLinkTarget,
    /// It whites out `.`, `..` or the empty name.
    Whiteout,
    /// Its type is not one a layer may hold.
    UnsupportedType(u8),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ParentComponent => f.write_str("its name has a `..` component"),
            Self::Nul => f.write_str("its name or link target holds a NUL byte"),
            Self::EmptyName => f.write_str("its name is empty"),
            Self::TooLong => write!(f, "its name or link target is longer than {MAX_PATH} bytes"),
            Self::ComponentTooLong => {
                write!(f, "a component of its name is longer than {MAX_COMPONENT} bytes")
            }
            Self::ThroughSymlink => f.write_str("a parent of it is a symlink"),
            Self::ParentNotDirectory => f.write_str("a parent of it is not a directory"),
            Self::HardLink { target } => write!(
                f,
                "it is a hard link to {target:?}, which is not a regular file this layer made earlier"
            ),
            Self::EmptyLinkTarget => f.write_str("it is a symlink to the empty name"),
            Self::Whiteout => f.write_str("it whites out `.`, `..` or the empty name"),
            Self::UnsupportedType(kind) => write!(
                f,
                "its type '{}' is not one a layer may hold",
                char::from(*kind).escape_default()
            ),
        }
    }
}

/// Unpacks the layer blob `reader` (plain tar, gzip or zstd, told by its
/// magic bytes) into `into`, an existing empty directory, under `limits`.
/// See the module documentation for what is made, refused, stripped and
/// skipped. The whole stream is read, so the digests returned are of all of
/// it.
///
/// # Errors
///
/// [`UnpackError`]: a corrupt stream, a hostile entry, a layer over its
/// limits, or a failure to read or to make a node. `into` then holds part
/// of the layer; the caller removes it.
pub fn unpack_layer(
    reader: impl Read,
    into: &Path,
    limits: &UnpackLimits,
) -> Result<Unpacked, UnpackError> {
    let tree = Tree::open(into).map_err(|source| UnpackError::Io {
        what: "open the directory to unpack into",
        at: Place::Start,
        source,
    })?;
    let flags = Flags::default();
    let mut raw = Digesting::new(reader, Some(&flags.source_failed));
    let prefix = raw
        .peek(MAGIC_LEN)
        .map_err(|e| stream_error(&flags, Place::Start, e))?;
    let compression = Compression::detect(&prefix);
    let (layer, diff_id) = {
        let decoded = compression
            .decoder(prefix, &mut raw)
            .map_err(|source| UnpackError::Io {
                what: "start the decompressor",
                at: Place::Start,
                source,
            })?;
        let mut tar_stream = Digesting::new(decoded, None);
        let mut layer = Layer::new(tree, *limits);
        layer.read_entries(&mut tar_stream, &flags)?;
        layer.finish()?;
        // What follows the end-of-archive counts toward the diff_id, and
        // toward the data limit.
        let left = limits.max_bytes.saturating_sub(layer.data);
        match tar_stream.drain(left) {
            Ok(Ok(read)) => layer.data += read,
            Ok(Err(_)) => {
                return Err(UnpackError::TooLarge {
                    limit: Limit::Bytes(limits.max_bytes),
                    at: Place::End,
                })
            }
            Err(e) => return Err(stream_error(&flags, Place::End, e)),
        }
        (layer, tar_stream.digest())
    };
    // And so does what follows the compressed stream toward the digest.
    if let Err(e) = raw.drain(u64::MAX) {
        return Err(stream_error(&flags, Place::End, e));
    }
    Ok(Unpacked {
        digest: raw.digest(),
        diff_id,
        compression,
        entries: layer.entries,
        bytes: layer.bytes,
        stripped_setid: layer.stripped_setid,
        skipped_devices: layer.skipped_devices,
        clamped_ids: layer.clamped_ids,
        skipped_xattrs: layer.skipped_xattrs,
        xattrs: layer.xattrs,
        whiteouts: layer.whiteouts,
        opaque_dirs: layer.tree.opaque_dirs,
    })
}

/// The error of a failed read of the stream: the caller's reader failing
/// is I/O, the tar reader over its header budget is too large, anything
/// else is a corrupt layer.
fn stream_error(flags: &Flags, at: Place, source: io::Error) -> UnpackError {
    if flags.source_failed.get() {
        UnpackError::Io {
            what: "read the layer",
            at,
            source,
        }
    } else if flags.over_budget.get() {
        UnpackError::TooLarge {
            limit: Limit::HeaderBytes(HEADER_BUDGET),
            at,
        }
    } else {
        UnpackError::Corrupt { at, source }
    }
}

/// A layer being unpacked: its tree and what it has made so far.
struct Layer {
    tree: Tree,
    limits: UnpackLimits,
    /// Normalized names of the regular files made (hard-link targets).
    files: BTreeSet<Vec<u8>>,
    /// Directories' modification times, set at the end.
    dir_times: BTreeMap<Vec<u8>, i64>,
    /// The buffer files' data is copied through.
    buf: Vec<u8>,
    entries: u64,
    bytes: u64,
    /// Bytes of the tar stream's data: `bytes` and data of other entries.
    data: u64,
    stripped_setid: u64,
    skipped_devices: u64,
    clamped_ids: u64,
    skipped_xattrs: u64,
    xattrs: u64,
    whiteouts: u64,
}

/// An entry's normalized name: components joined by `/`, empty for the
/// layer's root.
struct Name {
    path: Vec<u8>,
}

impl Name {
    fn parse(raw: &[u8]) -> Result<Self, Refusal> {
        if raw.contains(&0) {
            return Err(Refusal::Nul);
        }
        let mut path = Vec::with_capacity(raw.len());
        for component in raw.split(|b| *b == b'/') {
            match component {
                b"" | b"." => continue,
                b".." => return Err(Refusal::ParentComponent),
                c if c.len() > MAX_COMPONENT => return Err(Refusal::ComponentTooLong),
                c => {
                    if !path.is_empty() {
                        path.push(b'/');
                    }
                    path.extend_from_slice(c);
                }
            }
        }
        if path.len() > MAX_PATH {
            return Err(Refusal::TooLong);
        }
        Ok(Self { path })
    }

    fn is_root(&self) -> bool {
        self.path.is_empty()
    }

    /// The parent's path and the last component.
    fn split(&self) -> (&[u8], &[u8]) {
        match self.path.iter().rposition(|b| *b == b'/') {
            Some(slash) => (&self.path[..slash], &self.path[slash + 1..]),
            None => (&[], &self.path),
        }
    }
}

/// What the last component of a name says about whiteouts.
enum Whiteout<'a> {
    /// Not a whiteout.
    No,
    /// `.wh..wh..opq`: the parent is opaque.
    Opaque,
    /// `.wh.NAME`: NAME is whited out.
    Of(&'a [u8]),
}

impl<'a> Whiteout<'a> {
    fn of(name: &'a [u8]) -> Result<Self, Refusal> {
        match name.strip_prefix(b".wh.") {
            None => Ok(Self::No),
            Some(b".wh..opq") => Ok(Self::Opaque),
            Some(b"" | b"." | b"..") => Err(Refusal::Whiteout),
            Some(hidden) => Ok(Self::Of(hidden)),
        }
    }
}

/// The metadata an entry gives its node.
struct Meta {
    uid: Uid,
    gid: Gid,
    mode: Mode,
    mtime: i64,
}

/// What an entry is made into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    HardLink,
    Fifo,
    Device,
    Ignored,
}

impl Kind {
    fn of(header: &tar::Header, raw_name: &[u8]) -> Result<Self, Refusal> {
        use tar::EntryType as T;
        Ok(match header.entry_type() {
            // An old-style entry (type NUL) named with a trailing slash is
            // a directory, as old tars wrote them.
            T::Regular if header.as_bytes()[156] == 0 && raw_name.ends_with(b"/") => Self::Dir,
            T::Regular | T::Continuous | T::GNUSparse => Self::File,
            T::Directory => Self::Dir,
            T::Symlink => Self::Symlink,
            T::Link => Self::HardLink,
            T::Fifo => Self::Fifo,
            T::Char | T::Block => Self::Device,
            T::XGlobalHeader => Self::Ignored,
            other => return Err(Refusal::UnsupportedType(other.as_byte())),
        })
    }
}

/// An error of one entry's step.
struct Fail {
    kind: FailKind,
}

enum FailKind {
    Refused(Refusal),
    Corrupt(io::Error),
    TooLarge(Limit),
    Io(&'static str, io::Error),
}

impl Fail {
    fn refused(why: Refusal) -> Self {
        Self {
            kind: FailKind::Refused(why),
        }
    }

    fn io(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> Self {
        move |errno| Self {
            kind: FailKind::Io(what, errno.into()),
        }
    }

    fn at(self, entry: &str) -> UnpackError {
        let at = Place::Entry(entry.to_owned());
        match self.kind {
            FailKind::Refused(why) => UnpackError::Hostile {
                entry: entry.to_owned(),
                why,
            },
            FailKind::Corrupt(source) => UnpackError::Corrupt { at, source },
            FailKind::TooLarge(limit) => UnpackError::TooLarge { limit, at },
            FailKind::Io(what, source) => UnpackError::Io { what, at, source },
        }
    }
}

impl From<TreeError> for Fail {
    fn from(e: TreeError) -> Self {
        match e {
            TreeError::Escape => Self::refused(Refusal::ThroughSymlink),
            TreeError::NotDirectory => Self::refused(Refusal::ParentNotDirectory),
            TreeError::Io(what, source) => Self {
                kind: FailKind::Io(what, source),
            },
        }
    }
}

impl From<Refusal> for Fail {
    fn from(why: Refusal) -> Self {
        Self::refused(why)
    }
}

impl Layer {
    fn new(tree: Tree, limits: UnpackLimits) -> Self {
        Self {
            tree,
            limits,
            files: BTreeSet::new(),
            dir_times: BTreeMap::new(),
            buf: vec![0u8; 64 << 10],
            entries: 0,
            bytes: 0,
            data: 0,
            stripped_setid: 0,
            skipped_devices: 0,
            clamped_ids: 0,
            skipped_xattrs: 0,
            xattrs: 0,
            whiteouts: 0,
        }
    }

    /// Reads the tar stream's entries up to its end-of-archive and makes
    /// each one.
    fn read_entries(&mut self, tar_stream: impl Read, flags: &Flags) -> Result<(), UnpackError> {
        let mut archive = tar::Archive::new(Metered::new(tar_stream, flags));
        flags.budget.set(HEADER_BUDGET);
        let mut entries = archive
            .entries()
            .map_err(|e| stream_error(flags, Place::Start, e))?;
        let mut last: Option<String> = None;
        // Data of the last entry left for the tar reader to skip.
        let mut unread = 0u64;
        loop {
            flags.budget.set(HEADER_BUDGET.saturating_add(unread));
            let next = entries.next();
            flags.budget.set(u64::MAX);
            let mut entry = match next {
                None => return Ok(()),
                Some(Ok(entry)) => entry,
                Some(Err(e)) => {
                    let at = last.map_or(Place::Start, Place::After);
                    return Err(stream_error(flags, at, e));
                }
            };
            let shown = shown(&entry.path_bytes());
            unread = self.entry(&mut entry).map_err(|fail| match fail.kind {
                // A read of the entry's data that failed on the
                // caller's side is theirs, not the layer's.
                FailKind::Corrupt(e) => stream_error(flags, Place::Entry(shown.clone()), e),
                _ => fail.at(&shown),
            })?;
            last = Some(shown);
        }
    }

    /// Makes one entry; returns how much of its data it left unread.
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<u64, Fail> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(Fail {
                kind: FailKind::TooLarge(Limit::Entries(self.limits.max_entries)),
            });
        }
        let raw_name = entry.path_bytes().into_owned();
        let kind = Kind::of(entry.header(), &raw_name)?;
        let size = entry.size();
        if kind == Kind::Ignored {
            return self.skip(size);
        }
        let name = Name::parse(&raw_name)?;
        let xattrs = self.carried_xattrs(entry, kind == Kind::File)?;
        let meta = self.meta(entry.header())?;
        let (_, last) = name.split();
        match Whiteout::of(last)? {
            Whiteout::Opaque => {
                let dir = self.tree.dir(name.split().0, true)?;
                self.tree.set_opaque(&dir)?;
                return self.skip(size);
            }
            Whiteout::Of(hidden) => {
                let hidden = hidden.to_vec();
                self.whiteout(&name, &hidden)?;
                return self.skip(size);
            }
            Whiteout::No => {}
        }
        match kind {
            Kind::File => {
                self.file(&name, entry, &meta, &xattrs)?;
                return Ok(0);
            }
            Kind::Dir => self.dir(&name, &meta)?,
            Kind::Symlink => self.symlink(&name, entry, &meta)?,
            Kind::HardLink => self.hard_link(&name, entry)?,
            Kind::Fifo => self.fifo(&name, &meta)?,
            Kind::Device => self.skipped_devices += 1,
            Kind::Ignored => {}
        }
        self.skip(size)
    }

    /// Counts `size` bytes of data the tar reader will skip toward the data
    /// limit.
    fn skip(&mut self, size: u64) -> Result<u64, Fail> {
        self.charge(size)?;
        Ok(size)
    }

    fn charge(&mut self, size: u64) -> Result<(), Fail> {
        match self.data.checked_add(size) {
            Some(data) if data <= self.limits.max_bytes => {
                self.data = data;
                Ok(())
            }
            _ => Err(Fail {
                kind: FailKind::TooLarge(Limit::Bytes(self.limits.max_bytes)),
            }),
        }
    }

    /// The extended attributes of the entry that a layer carries (only
    /// for a regular file, `file`); the others are counted as skipped.
    fn carried_xattrs<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        file: bool,
    ) -> Result<Xattrs, Fail> {
        let corrupt = |e: io::Error| Fail {
            kind: FailKind::Corrupt(e),
        };
        let mut carried = Vec::new();
        let mut total = 0usize;
        if let Some(extensions) = entry.pax_extensions().map_err(corrupt)? {
            for extension in extensions {
                let extension = extension.map_err(corrupt)?;
                let Some(name) = extension.key_bytes().strip_prefix(b"SCHILY.xattr.") else {
                    continue;
                };
                let value = extension.value_bytes();
                total = total.saturating_add(name.len() + value.len());
                if file && is_carried_xattr(name) && total <= MAX_CARRIED_XATTR_BYTES {
                    carried.push((name.to_vec(), value.to_vec()));
                } else {
                    self.skipped_xattrs += 1;
                }
            }
        }
        Ok(carried)
    }

    fn meta(&mut self, header: &tar::Header) -> Result<Meta, Fail> {
        let corrupt = |e: io::Error| Fail {
            kind: FailKind::Corrupt(e),
        };
        let (uid, gid) = (
            header.uid().map_err(corrupt)?,
            header.gid().map_err(corrupt)?,
        );
        if uid >= ID_RANGE || gid >= ID_RANGE {
            self.clamped_ids += 1;
        }
        let clamp = |id: u64| {
            u32::try_from(id)
                .ok()
                .filter(|id| u64::from(*id) < ID_RANGE)
                .unwrap_or(NOBODY)
        };
        let mode = header.mode().map_err(corrupt)? & 0o7777;
        if mode & 0o6000 != 0 {
            self.stripped_setid += 1;
        }
        Ok(Meta {
            uid: Uid::from_raw(clamp(uid)),
            gid: Gid::from_raw(clamp(gid)),
            mode: Mode::from_raw_mode(mode & !0o6000),
            mtime: i64::try_from(header.mtime().map_err(corrupt)?).unwrap_or(i64::MAX),
        })
    }

    /// The parent directory of `name`, made if missing, with whatever was
    /// at `name` removed.
    fn replace(&mut self, name: &Name) -> Result<OwnedFd, Fail> {
        let dir = self.tree.dir(name.split().0, true)?;
        let last = name.split().1;
        if let Some(existing) = self.tree.existing(&dir, last)? {
            self.tree.clear(&dir, last, existing)?;
        }
        self.forget(&name.path);
        Ok(dir)
    }

    /// Forgets the files and directories at `path` and below it.
    fn forget(&mut self, path: &[u8]) {
        self.files.remove(path);
        self.dir_times.remove(path);
        let mut below = path.to_vec();
        below.push(b'/');
        let mut end = path.to_vec();
        end.push(b'/' + 1);
        let gone: Vec<Vec<u8>> = self
            .files
            .range(below.clone()..end.clone())
            .cloned()
            .collect();
        for path in gone {
            self.files.remove(&path);
        }
        let gone: Vec<Vec<u8>> = self
            .dir_times
            .range(below..end)
            .map(|(k, _)| k.clone())
            .collect();
        for path in gone {
            self.dir_times.remove(&path);
        }
    }

    fn file<R: Read>(
        &mut self,
        name: &Name,
        entry: &mut tar::Entry<'_, R>,
        meta: &Meta,
        xattrs: &Xattrs,
    ) -> Result<(), Fail> {
        let size = entry.size();
        self.charge(size)?;
        if name.is_root() {
            return Err(Refusal::EmptyName.into());
        }
        let dir = self.replace(name)?;
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = openat(&dir, name.split().1, flags, Mode::from_raw_mode(0o600))
            .map_err(Fail::io("make a file"))?;
        let mut file = std::fs::File::from(fd);
        let written = copy_data(entry, &mut file, &mut self.buf)?;
        if written != size {
            return Err(Fail {
                kind: FailKind::Corrupt(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the entry's data ends before its size",
                )),
            });
        }
        set_meta(&file, meta)?;
        for (xattr, value) in xattrs {
            match fsetxattr(&file, &xattr[..], value, XattrFlags::empty()) {
                Ok(()) => self.xattrs += 1,
                // A store without user attributes keeps the file without.
                Err(Errno::NOTSUP) => self.skipped_xattrs += 1,
                Err(errno) => return Err(Fail::io("set an extended attribute")(errno)),
            }
        }
        futimens(&file, &times(meta.mtime)).map_err(Fail::io("set a file's times"))?;
        self.bytes += size;
        self.files.insert(name.path.clone());
        Ok(())
    }

    fn dir(&mut self, name: &Name, meta: &Meta) -> Result<(), Fail> {
        let fd = if name.is_root() {
            self.tree.dir(b"", false)?
        } else {
            let dir = self.tree.dir(name.split().0, true)?;
            let last = name.split().1;
            match self.tree.existing(&dir, last)? {
                Some(Existing::Dir) => tree::open_dir(&dir, last)?,
                Some(existing) => {
                    self.tree.clear(&dir, last, existing)?;
                    self.forget(&name.path);
                    let made = tree::new_dir(&dir, last)?;
                    if existing == Existing::Whiteout {
                        // A directory over this layer's own whiteout: what
                        // the layers below have there stays hidden.
                        self.tree.set_opaque(&made)?;
                    }
                    made
                }
                None => tree::new_dir(&dir, last)?,
            }
        };
        set_meta(&fd, meta)?;
        self.dir_times.insert(name.path.clone(), meta.mtime);
        Ok(())
    }

    fn symlink<R: Read>(
        &mut self,
        name: &Name,
        entry: &tar::Entry<'_, R>,
        meta: &Meta,
    ) -> Result<(), Fail> {
        let target = entry.link_name_bytes().unwrap_or_default();
        if target.is_empty() {
            return Err(Refusal::EmptyLinkTarget.into());
        }
        if target.contains(&0) {
            return Err(Refusal::Nul.into());
        }
        if target.len() > MAX_PATH {
            return Err(Refusal::TooLong.into());
        }
        if name.is_root() {
            return Err(Refusal::EmptyName.into());
        }
        let dir = self.replace(name)?;
        let last = name.split().1;
        symlinkat(target.as_ref(), &dir, last).map_err(Fail::io("make a symlink"))?;
        chownat(
            &dir,
            last,
            Some(meta.uid),
            Some(meta.gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(Fail::io("set a symlink's owner"))?;
        utimensat(&dir, last, &times(meta.mtime), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(Fail::io("set a symlink's times"))?;
        Ok(())
    }

    fn hard_link<R: Read>(&mut self, name: &Name, entry: &tar::Entry<'_, R>) -> Result<(), Fail> {
        let raw_target = entry.link_name_bytes().unwrap_or_default().into_owned();
        let refused = || Refusal::HardLink {
            target: shown(&raw_target),
        };
        let target = Name::parse(&raw_target).map_err(|_| refused())?;
        if name.is_root() {
            return Err(Refusal::EmptyName.into());
        }
        if target.path == name.path || !self.files.contains(&target.path) {
            return Err(refused().into());
        }
        let dir = self.replace(name)?;
        // Replacing the link's name may have removed its target (a name
        // above it).
        if !self.files.contains(&target.path) {
            return Err(refused().into());
        }
        let target_dir = self.tree.dir(target.split().0, false)?;
        linkat(
            &target_dir,
            target.split().1,
            &dir,
            name.split().1,
            AtFlags::empty(),
        )
        .map_err(Fail::io("make a hard link"))?;
        self.files.insert(name.path.clone());
        Ok(())
    }

    fn fifo(&mut self, name: &Name, meta: &Meta) -> Result<(), Fail> {
        if name.is_root() {
            return Err(Refusal::EmptyName.into());
        }
        let dir = self.replace(name)?;
        let last = name.split().1;
        mknodat(&dir, last, FileType::Fifo, Mode::from_raw_mode(0o600), 0)
            .map_err(Fail::io("make a FIFO"))?;
        chownat(
            &dir,
            last,
            Some(meta.uid),
            Some(meta.gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(Fail::io("set a FIFO's owner"))?;
        // The FIFO was made just now in a directory only this unpacker
        // writes, so the name is still that FIFO (chmod has no
        // AT_SYMLINK_NOFOLLOW before Linux 6.6, and opening a FIFO blocks).
        chmodat(&dir, last, meta.mode, AtFlags::empty()).map_err(Fail::io("set a FIFO's mode"))?;
        utimensat(&dir, last, &times(meta.mtime), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(Fail::io("set a FIFO's times"))?;
        Ok(())
    }

    /// `.wh.HIDDEN` beside `name`: HIDDEN is whited out for the layers below.
    fn whiteout(&mut self, name: &Name, hidden: &[u8]) -> Result<(), Fail> {
        let dir = self.tree.dir(name.split().0, true)?;
        match self.tree.existing(&dir, hidden)? {
            None => {
                tree::make_whiteout(&dir, hidden)?;
                self.whiteouts += 1;
            }
            Some(Existing::Dir) => {
                // This layer's own directory stays, without what the layers
                // below have in it.
                let made = tree::open_dir(&dir, hidden)?;
                self.tree.set_opaque(&made)?;
            }
            // This layer's own node already hides what is below it.
            Some(Existing::Whiteout | Existing::Other) => {}
        }
        Ok(())
    }

    /// Sets the directories' modification times, now that nothing more is
    /// made in them.
    fn finish(&mut self) -> Result<(), UnpackError> {
        let dir_times = std::mem::take(&mut self.dir_times);
        for (path, mtime) in dir_times {
            let shown = shown(&path);
            let fd = self
                .tree
                .dir(&path, false)
                .map_err(|e| Fail::from(e).at(&shown))?;
            futimens(&fd, &times(mtime))
                .map_err(|e| Fail::io("set a directory's times")(e).at(&shown))?;
        }
        Ok(())
    }
}

/// How much of a name errors show: names may be megabytes long.
const SHOWN: usize = 256;

/// A name as errors show it: its first [`SHOWN`] bytes, lossily UTF-8,
/// with `…` when cut.
pub(crate) fn shown(raw: &[u8]) -> String {
    if raw.len() <= SHOWN {
        return String::from_utf8_lossy(raw).into_owned();
    }
    format!("{}…", String::from_utf8_lossy(&raw[..SHOWN]))
}

/// Sets the owner and then the mode of an open file or directory (in this
/// order: a chown clears set-id bits, which are stripped anyway).
fn set_meta(fd: impl std::os::fd::AsFd, meta: &Meta) -> Result<(), Fail> {
    fchown(&fd, Some(meta.uid), Some(meta.gid)).map_err(Fail::io("set an owner"))?;
    fchmod(&fd, meta.mode).map_err(Fail::io("set a mode"))?;
    Ok(())
}

fn times(mtime: i64) -> Timestamps {
    let at = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: at,
        last_modification: at,
    }
}

/// Copies an entry's data into its file: a failed read is the layer's
/// (corrupt, or the caller's reader, which the caller tells apart), a
/// failed write the store's.
fn copy_data(from: &mut impl Read, to: &mut std::fs::File, buf: &mut [u8]) -> Result<u64, Fail> {
    let mut total = 0u64;
    loop {
        let n = match from.read(buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Fail {
                    kind: FailKind::Corrupt(e),
                })
            }
        };
        to.write_all(&buf[..n]).map_err(|e| Fail {
            kind: FailKind::Io("write a file", e),
        })?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_and_refused_as_the_module_says() {
        let parsed = |raw: &[u8]| Name::parse(raw).map(|n| n.path);
        assert_eq!(parsed(b"./a/b/").ok(), Some(b"a/b".to_vec()));
        assert_eq!(parsed(b"//abs//x/./y").ok(), Some(b"abs/x/y".to_vec()));
        assert_eq!(parsed(b"./").ok(), Some(Vec::new()));
        assert_eq!(parsed(b"a/../../x").err(), Some(Refusal::ParentComponent));
        assert_eq!(parsed(b"a\0b").err(), Some(Refusal::Nul));
        assert_eq!(parsed(&[b'a'; 256]).err(), Some(Refusal::ComponentTooLong));
        let long = [b"ab/".as_slice(); 1366].concat();
        assert_eq!(parsed(&long).err(), Some(Refusal::TooLong));
    }

    #[test]
    fn whiteout_names_are_read_as_the_image_spec_says() {
        assert!(matches!(
            Whiteout::of(b".wh..wh..opq"),
            Ok(Whiteout::Opaque)
        ));
        assert!(matches!(Whiteout::of(b".wh.x"), Ok(Whiteout::Of(b"x"))));
        assert!(matches!(
            Whiteout::of(b".wh..wh.plnk"),
            Ok(Whiteout::Of(b".wh.plnk"))
        ));
        assert!(matches!(Whiteout::of(b"x.wh.y"), Ok(Whiteout::No)));
        for hostile in [b".wh.".as_slice(), b".wh..", b".wh..."] {
            assert!(matches!(Whiteout::of(hostile), Err(Refusal::Whiteout)));
        }
    }

    #[test]
    fn compression_is_told_by_magic_bytes() {
        assert_eq!(Compression::detect(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
        assert_eq!(
            Compression::detect(&[0x28, 0xb5, 0x2f, 0xfd]),
            Compression::Zstd
        );
        assert_eq!(Compression::detect(b"ustar"), Compression::None);
        assert_eq!(Compression::detect(&[0x1f]), Compression::None);
    }
}
