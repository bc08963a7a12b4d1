//! The build context: the files a COPY names, selected, hashed for the
//! step's cache key ([`Context::hash_sources`]) and packed as a tar stream
//! for the sandbox that runs the build ([`Context::pack_sources`]), the
//! same entries in the same order for both.
//!
//! **Selection.** A source is a path relative to the context (`.` is the
//! whole context), with `*`, `?` and `[…]` allowed in its last component
//! (a glob that matches nothing is an error). Absolute sources and `..`
//! are refused. Every path is resolved beneath a descriptor of the context
//! directory with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` and
//! every entry looked at with `fstatat(AT_SYMLINK_NOFOLLOW)`: no symlink
//! is ever followed, so nothing outside the context is ever read. A source
//! that goes *through* a symlink is refused; a source that *is* a symlink
//! is copied as that symlink, and refused when its target points out of
//! the context (the build would otherwise copy a link to a file it cannot
//! have); symlinks met inside a copied directory are copied as they are,
//! as Docker does (they resolve in the sandbox, not here). A directory's
//! contents are copied, recursively, and the `.dockerignore` at the
//! context's root (see [`pattern`]) leaves out what it excludes (a source
//! it excludes is not found). Sockets, FIFOs and devices are skipped and
//! counted; hard links are copied as separate files.
//!
//! **The digest** ([`SourcesDigest`]) is SHA-256 over, per source in
//! order: the source as written, then each entry it selects, in order
//! (directories depth first, names sorted bytewise), as its path relative
//! to the context, its type, its permission bits (set-id bits cleared, as
//! the sandbox gets them), and a symlink's target or a file's size and
//! bytes. Owners and times are not in it: the tar gives every entry root
//! (or `--chown`) and the time is the file's, as Docker's cache does.
//!
//! **Bounds** ([`Limits`]): at most 100,000 entries and a total size
//! (4 GiB unless configured), directories at most [`MAX_DEPTH`] deep.

pub mod pattern;

use crate::spec::{resolve_path, source_problem, MAX_PATH_BYTES};
use pattern::{Ignore, IgnoreError, Pattern};
use rustix::fs::{
    fstat, openat2, readlinkat, statat, AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat,
};
use rustix::io::Errno;
use sha2::{Digest, Sha256};
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The most entries the sources of one COPY may select.
pub const MAX_ENTRIES: usize = 100_000;
/// The default bound of their total size.
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;
/// The most names listed while selecting (excluded ones count too).
pub const MAX_LISTED: usize = 1_000_000;
/// The deepest directory walked, counted from a source.
pub const MAX_DEPTH: usize = 128;
/// The largest `.dockerignore` read.
pub const MAX_IGNORE_BYTES: u64 = 1024 * 1024;

/// How every path is resolved: beneath the context, through no symlink.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::CLOEXEC);
/// Regular files: `NONBLOCK` so a FIFO swapped in never blocks the open.
const FILE_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC);

/// Bounds of one selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_entries: usize,
    pub max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_entries: MAX_ENTRIES,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// What the sources of a COPY hold, as a digest (see the module
/// documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcesDigest {
    /// `sha256:<hex>`.
    pub digest: String,
    /// Entries selected (directories, files, symlinks).
    pub entries: usize,
    /// Bytes of the files' contents.
    pub bytes: u64,
    /// Sockets, FIFOs and devices left out.
    pub skipped: usize,
}

/// Owners and modes of a packed COPY, and what the image says of its
/// destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackOptions {
    /// Owner of every entry (`--chown`, resolved to numbers by the
    /// executor); 0:0 by default.
    pub uid: u64,
    pub gid: u64,
    /// `--chmod`: the permission bits of every file and directory.
    pub chmod: Option<u32>,
    /// The destination exists in the image as a directory, so a single
    /// file goes into it rather than to it.
    pub dest_is_dir: bool,
}

/// What [`Context::pack_sources`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// The absolute directory the stream's names are relative to: the
    /// executor makes it (and its parents) and extracts the stream there.
    pub dir: String,
    /// The digest of what was written, computed as
    /// [`Context::hash_sources`] does: compare it with the one the key was
    /// made of, in case the context changed in between.
    pub digest: SourcesDigest,
}

/// Why sources could not be selected, hashed or packed.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("cannot open the build context {}", path.display())]
    OpenContext { path: PathBuf, source: io::Error },
    #[error("cannot read .dockerignore")]
    ReadIgnore(#[source] io::Error),
    #[error(".dockerignore is larger than {MAX_IGNORE_BYTES} bytes")]
    IgnoreTooLarge,
    #[error(transparent)]
    Ignore(#[from] IgnoreError),
    #[error("the source {path:?} {why}")]
    Source { path: String, why: &'static str },
    #[error(
        "the source {path:?} has a wildcard before its last component; only the last may have one"
    )]
    Glob { path: String },
    #[error("the source {path:?} is not in the build context")]
    NotFound { path: String },
    #[error("the source {path:?} is excluded by .dockerignore")]
    Excluded { path: String },
    #[error("no file of the build context matches {path:?}")]
    NoMatch { path: String },
    #[error("the source {path:?} goes through a symlink; airlock follows no symlink in the build context")]
    ThroughSymlink { path: String },
    #[error("the symlink {path:?} points out of the build context (to {target:?})")]
    SymlinkEscapes { path: String, target: String },
    #[error("the sources select more than {max} entries")]
    TooManyEntries { max: usize },
    #[error("the sources list more than {MAX_LISTED} names")]
    TooManyListed,
    #[error("the sources hold more than {max} bytes")]
    TooLarge { max: u64 },
    #[error("{path:?} is nested more than {MAX_DEPTH} directories deep")]
    TooDeep { path: String },
    #[error("the path {path:?} is longer than {MAX_PATH_BYTES} bytes")]
    PathTooLong { path: String },
    #[error("{path:?} changed while it was read")]
    Changed { path: String },
    #[error("cannot read {path:?} in the build context")]
    Read { path: String, source: io::Error },
    #[error("the destination {dest:?} is not absolute")]
    Destination { dest: String },
    #[error("cannot write the tar stream")]
    Write(#[source] io::Error),
}

fn shown(path: &[u8]) -> String {
    if path.is_empty() {
        ".".to_owned()
    } else {
        String::from_utf8_lossy(path).chars().take(256).collect()
    }
}

fn read_err(path: &[u8]) -> impl FnOnce(Errno) -> ContextError + '_ {
    move |errno| ContextError::Read {
        path: shown(path),
        source: errno.into(),
    }
}

fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(parent.len() + name.len() + 1);
    path.extend_from_slice(parent);
    if !parent.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// A build context directory and its `.dockerignore`.
#[derive(Debug)]
pub struct Context {
    root: OwnedFd,
    ignore: Ignore,
    limits: Limits,
}

/// The kind of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink,
    Other,
}

fn kind(stat: &Stat) -> Kind {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => Kind::Dir,
        FileType::RegularFile => Kind::File,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Other,
    }
}

/// Permission bits as the sandbox gets them (set-id bits cleared).
fn mode_bits(stat: &Stat) -> u32 {
    stat.st_mode & 0o1777
}

/// One source's match: a path in the context and what is there.
struct Match {
    /// Relative to the context, `/`-separated; empty for the context.
    path: Vec<u8>,
    stat: Stat,
}

/// An entry as the digest and the tar see it.
struct Entry<'a> {
    /// Relative to the context.
    path: &'a [u8],
    /// Relative to the destination directory.
    name: &'a [u8],
    kind: Kind,
    mode: u32,
    mtime: i64,
}

/// What the walk hands each entry to.
trait Sink {
    /// `content` is the file's reader (exactly `size` bytes are wanted),
    /// `target` a symlink's.
    fn entry(
        &mut self,
        entry: &Entry<'_>,
        size: u64,
        content: Option<&mut dyn Read>,
        target: Option<&[u8]>,
    ) -> Result<(), ContextError>;
}

/// A reader that gives exactly `left` bytes, or says it could not.
struct Exact<'a> {
    inner: &'a mut dyn Read,
    left: u64,
    short: bool,
}

impl Read for Exact<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            self.short = true;
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file got shorter",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// The digest's encoding: length-prefixed fields into SHA-256.
struct Hasher(Sha256);

impl Hasher {
    fn new() -> Hasher {
        let mut h = Hasher(Sha256::new());
        h.bytes(b"airlock-build sources v1");
        h
    }

    fn bytes(&mut self, b: &[u8]) {
        self.0.update((b.len() as u64).to_le_bytes());
        self.0.update(b);
    }

    fn u64(&mut self, n: u64) {
        self.0.update(n.to_le_bytes());
    }

    fn entry(&mut self, entry: &Entry<'_>) {
        self.bytes(b"entry");
        self.bytes(entry.path);
        self.bytes(match entry.kind {
            Kind::Dir => b"dir",
            Kind::File => b"file",
            Kind::Symlink => b"symlink",
            Kind::Other => b"other",
        });
        self.u64(u64::from(entry.mode));
    }

    fn finish(self) -> String {
        crate::cache::hex_digest(self.0.finalize().as_slice())
    }
}

impl Sink for Hasher {
    fn entry(
        &mut self,
        entry: &Entry<'_>,
        size: u64,
        content: Option<&mut dyn Read>,
        target: Option<&[u8]>,
    ) -> Result<(), ContextError> {
        Hasher::entry(self, entry);
        if let Some(target) = target {
            self.bytes(target);
        }
        if let Some(content) = content {
            self.u64(size);
            let mut exact = Exact {
                inner: content,
                left: size,
                short: false,
            };
            let mut writer = HashWriter(&mut self.0);
            io::copy(&mut exact, &mut writer).map_err(|source| {
                if exact.short {
                    ContextError::Changed {
                        path: shown(entry.path),
                    }
                } else {
                    ContextError::Read {
                        path: shown(entry.path),
                        source,
                    }
                }
            })?;
        }
        Ok(())
    }
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A reader that hashes what passes through it.
struct Tee<'a> {
    inner: Exact<'a>,
    hash: &'a mut Sha256,
}

impl Read for Tee<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// The tar writer, hashing as it goes.
struct TarSink<W: Write> {
    hasher: Hasher,
    tar: tar::Builder<W>,
    options: PackOptions,
}

impl<W: Write> Sink for TarSink<W> {
    fn entry(
        &mut self,
        entry: &Entry<'_>,
        size: u64,
        content: Option<&mut dyn Read>,
        target: Option<&[u8]>,
    ) -> Result<(), ContextError> {
        self.hasher.entry(entry);
        let mut header = tar::Header::new_gnu();
        header.set_uid(self.options.uid);
        header.set_gid(self.options.gid);
        header.set_mtime(u64::try_from(entry.mtime).unwrap_or(0));
        let mode = match entry.kind {
            Kind::Symlink => 0o777,
            _ => self.options.chmod.unwrap_or(entry.mode),
        };
        header.set_mode(mode);
        let name = Path::new(OsStr::from_bytes(entry.name));
        let written = match entry.kind {
            Kind::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                self.tar.append_data(&mut header, name, io::empty())
            }
            Kind::Symlink => {
                let target = target.unwrap_or_default();
                self.hasher.bytes(target);
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                self.tar
                    .append_link(&mut header, name, Path::new(OsStr::from_bytes(target)))
            }
            Kind::File | Kind::Other => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(size);
                self.hasher.u64(size);
                let Some(content) = content else {
                    return Ok(());
                };
                let mut tee = Tee {
                    inner: Exact {
                        inner: content,
                        left: size,
                        short: false,
                    },
                    hash: &mut self.hasher.0,
                };
                let result = self.tar.append_data(&mut header, name, &mut tee);
                if tee.inner.short {
                    return Err(ContextError::Changed {
                        path: shown(entry.path),
                    });
                }
                result
            }
        };
        written.map_err(ContextError::Write)
    }
}

/// The walk's running counts.
struct Counts {
    entries: usize,
    bytes: u64,
    listed: usize,
    skipped: usize,
}

/// The directory a COPY's stream is named relative to, and the name of
/// its one file when the destination is a file: with a directory
/// destination (see [`Context::pack_sources`]) `dest` itself and no name.
fn layout(dest: &str, options: &PackOptions, all: &[Vec<Match>]) -> (String, Option<String>) {
    let total: usize = all.iter().map(Vec::len).sum();
    let dir_form = dest.ends_with('/')
        || total > 1
        || options.dest_is_dir
        || all.iter().flatten().any(|m| kind(&m.stat) == Kind::Dir);
    let cleaned = resolve_path("/", dest);
    if dir_form {
        (cleaned, None)
    } else {
        let at = cleaned.rfind('/').unwrap_or(0);
        let parent = if at == 0 { "/" } else { &cleaned[..at] };
        (parent.to_owned(), Some(cleaned[at + 1..].to_owned()))
    }
}

/// How a match's entries are named in the destination directory.
enum Naming<'a> {
    /// A directory: its contents go in, its own entry does not.
    Contents,
    /// A file or symlink, as this name.
    As(&'a [u8]),
}

impl Context {
    /// Opens `dir` as a build context, with its `.dockerignore`.
    pub fn open(dir: &Path, limits: Limits) -> Result<Context, ContextError> {
        let root = rustix::fs::open(dir, DIR_FLAGS, Mode::empty()).map_err(|errno| {
            ContextError::OpenContext {
                path: dir.to_owned(),
                source: errno.into(),
            }
        })?;
        let ignore = match openat2(&root, ".dockerignore", FILE_FLAGS, Mode::empty(), RESOLVE) {
            Ok(fd) => {
                let stat = fstat(&fd).map_err(|e| ContextError::ReadIgnore(e.into()))?;
                if kind(&stat) != Kind::File {
                    Ignore::default()
                } else {
                    let mut text = String::new();
                    std::fs::File::from(fd)
                        .take(MAX_IGNORE_BYTES + 1)
                        .read_to_string(&mut text)
                        .map_err(ContextError::ReadIgnore)?;
                    if text.len() as u64 > MAX_IGNORE_BYTES {
                        return Err(ContextError::IgnoreTooLarge);
                    }
                    Ignore::parse(&text)?
                }
            }
            Err(Errno::NOENT) => Ignore::default(),
            Err(errno) => return Err(ContextError::ReadIgnore(errno.into())),
        };
        Ok(Context {
            root,
            ignore,
            limits,
        })
    }

    /// The digest of what `sources` select (see the module
    /// documentation).
    pub fn hash_sources(&self, sources: &[String]) -> Result<SourcesDigest, ContextError> {
        let mut hasher = Hasher::new();
        let mut counts = Counts {
            entries: 0,
            bytes: 0,
            listed: 0,
            skipped: 0,
        };
        for source in sources {
            let matches = self.resolve(source, &mut counts)?;
            hasher.bytes(b"source");
            hasher.bytes(source.as_bytes());
            for m in &matches {
                let naming = match kind(&m.stat) {
                    Kind::Dir => Naming::Contents,
                    _ => Naming::As(b""),
                };
                self.walk_match(m, &naming, &mut hasher, &mut counts)?;
            }
        }
        Ok(SourcesDigest {
            digest: hasher.finish(),
            entries: counts.entries,
            bytes: counts.bytes,
            skipped: counts.skipped,
        })
    }

    /// Writes what `sources` select to `out` as a tar stream, named for
    /// the absolute destination `dest` (resolved against the working
    /// directory, [`crate::spec::RunConfig::resolve_dest`]) as COPY places
    /// them: with a directory destination (`dest` ending with `/`, more
    /// than one match, a directory among them, or
    /// [`PackOptions::dest_is_dir`]) a directory's contents and each
    /// file by its name go into `dest`; else the one file goes to `dest`.
    /// No device, FIFO or socket is written, and no hard link.
    pub fn pack_sources<W: Write>(
        &self,
        sources: &[String],
        dest: &str,
        options: &PackOptions,
        out: W,
    ) -> Result<Packed, ContextError> {
        if !dest.starts_with('/') {
            return Err(ContextError::Destination {
                dest: dest.chars().take(256).collect(),
            });
        }
        let mut counts = Counts {
            entries: 0,
            bytes: 0,
            listed: 0,
            skipped: 0,
        };
        let mut all = Vec::with_capacity(sources.len());
        for source in sources {
            all.push(self.resolve(source, &mut counts)?);
        }
        let (dir, file_name) = layout(dest, options, &all);
        let mut sink = TarSink {
            hasher: Hasher::new(),
            tar: tar::Builder::new(out),
            options: *options,
        };
        for (source, matches) in sources.iter().zip(&all) {
            sink.hasher.bytes(b"source");
            sink.hasher.bytes(source.as_bytes());
            for m in matches {
                let base = m.path.rsplit(|&b| b == b'/').next().unwrap_or_default();
                let naming = match (&file_name, kind(&m.stat)) {
                    (_, Kind::Dir) => Naming::Contents,
                    (Some(name), _) => Naming::As(name.as_bytes()),
                    (None, _) => Naming::As(base),
                };
                self.walk_match(m, &naming, &mut sink, &mut counts)?;
            }
        }
        sink.tar.finish().map_err(ContextError::Write)?;
        Ok(Packed {
            dir,
            digest: SourcesDigest {
                digest: sink.hasher.finish(),
                entries: counts.entries,
                bytes: counts.bytes,
                skipped: counts.skipped,
            },
        })
    }

    /// The directory [`Context::pack_sources`] names its entries relative
    /// to for these sources and destination (what the executor unpacks
    /// the stream into), known before the stream is written.
    pub fn pack_dir(
        &self,
        sources: &[String],
        dest: &str,
        options: &PackOptions,
    ) -> Result<String, ContextError> {
        if !dest.starts_with('/') {
            return Err(ContextError::Destination {
                dest: dest.chars().take(256).collect(),
            });
        }
        let mut counts = Counts {
            entries: 0,
            bytes: 0,
            listed: 0,
            skipped: 0,
        };
        let mut all = Vec::with_capacity(sources.len());
        for source in sources {
            all.push(self.resolve(source, &mut counts)?);
        }
        Ok(layout(dest, options, &all).0)
    }

    /// The matches of one source, sorted, checked.
    fn resolve(&self, source: &str, counts: &mut Counts) -> Result<Vec<Match>, ContextError> {
        let path = source.as_bytes();
        if let Some(why) = source_problem(source) {
            return Err(ContextError::Source {
                path: shown(path),
                why,
            });
        }
        if source.len() > MAX_PATH_BYTES {
            return Err(ContextError::PathTooLong { path: shown(path) });
        }
        let parts: Vec<&str> = source
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        let Some((last, parents)) = parts.split_last() else {
            // The whole context.
            let stat = fstat(&self.root).map_err(read_err(b""))?;
            return Ok(vec![Match {
                path: Vec::new(),
                stat,
            }]);
        };
        let parent_path = parents.join("/");
        for part in parents {
            if Pattern::new(part).is_ok_and(|p| p.is_glob()) || part.contains(['*', '?', '[']) {
                return Err(ContextError::Glob { path: shown(path) });
            }
        }
        let parent = self.open_dir(parent_path.as_bytes(), source)?;
        let glob = Pattern::new(last)
            .ok()
            .filter(|p| p.is_glob() && last.contains(['*', '?', '[']));
        let mut matches = Vec::new();
        match glob {
            None => {
                let name = Pattern::new(last)
                    .ok()
                    .map(|_| unescape(last))
                    .unwrap_or_else(|| last.as_bytes().to_vec());
                let full = join(parent_path.as_bytes(), &name);
                let stat =
                    match statat(&parent, OsStr::from_bytes(&name), AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(stat) => stat,
                        Err(Errno::NOENT | Errno::NOTDIR) => {
                            return Err(ContextError::NotFound { path: shown(path) })
                        }
                        Err(errno) => return Err(read_err(&full)(errno)),
                    };
                if self.ignore.is_excluded(&full) {
                    return Err(ContextError::Excluded { path: shown(path) });
                }
                matches.push(Match { path: full, stat });
            }
            Some(glob) => {
                for name in self.list(&parent, parent_path.as_bytes(), counts)? {
                    if !glob.matches(&name) {
                        continue;
                    }
                    let full = join(parent_path.as_bytes(), &name);
                    if self.ignore.is_excluded(&full) {
                        continue;
                    }
                    let stat = match statat(
                        &parent,
                        OsStr::from_bytes(&name),
                        AtFlags::SYMLINK_NOFOLLOW,
                    ) {
                        Ok(stat) => stat,
                        Err(Errno::NOENT) => continue,
                        Err(errno) => return Err(read_err(&full)(errno)),
                    };
                    matches.push(Match { path: full, stat });
                }
                if matches.is_empty() {
                    return Err(ContextError::NoMatch { path: shown(path) });
                }
            }
        }
        for m in &matches {
            if kind(&m.stat) == Kind::Symlink {
                let target = self.link_target(&parent, &m.path)?;
                if escapes(&m.path, &target) {
                    return Err(ContextError::SymlinkEscapes {
                        path: shown(&m.path),
                        target: shown(&target),
                    });
                }
            }
        }
        Ok(matches)
    }

    /// The directory at `path` beneath the context, through no symlink.
    fn open_dir(&self, path: &[u8], source: &str) -> Result<OwnedFd, ContextError> {
        let at = if path.is_empty() {
            b".".as_slice()
        } else {
            path
        };
        openat2(
            &self.root,
            OsStr::from_bytes(at),
            DIR_FLAGS,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|errno| match errno {
            Errno::LOOP | Errno::XDEV => ContextError::ThroughSymlink {
                path: shown(source.as_bytes()),
            },
            Errno::NOENT | Errno::NOTDIR => ContextError::NotFound {
                path: shown(source.as_bytes()),
            },
            errno => read_err(path)(errno),
        })
    }

    /// The sorted names in `dir`.
    fn list(
        &self,
        dir: &OwnedFd,
        path: &[u8],
        counts: &mut Counts,
    ) -> Result<Vec<Vec<u8>>, ContextError> {
        let mut names = Vec::new();
        for entry in Dir::read_from(dir).map_err(read_err(path))? {
            let entry = entry.map_err(read_err(path))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            counts.listed += 1;
            if counts.listed > MAX_LISTED {
                return Err(ContextError::TooManyListed);
            }
            names.push(name.to_vec());
        }
        names.sort();
        Ok(names)
    }

    fn link_target(&self, parent: &OwnedFd, path: &[u8]) -> Result<Vec<u8>, ContextError> {
        let name = path.rsplit(|&b| b == b'/').next().unwrap_or_default();
        let target =
            readlinkat(parent, OsStr::from_bytes(name), Vec::new()).map_err(read_err(path))?;
        let target = target.into_bytes();
        if target.len() > MAX_PATH_BYTES {
            return Err(ContextError::PathTooLong { path: shown(path) });
        }
        Ok(target)
    }

    fn count(&self, counts: &mut Counts, size: u64) -> Result<(), ContextError> {
        counts.entries += 1;
        if counts.entries > self.limits.max_entries {
            return Err(ContextError::TooManyEntries {
                max: self.limits.max_entries,
            });
        }
        counts.bytes = counts.bytes.saturating_add(size);
        if counts.bytes > self.limits.max_bytes {
            return Err(ContextError::TooLarge {
                max: self.limits.max_bytes,
            });
        }
        Ok(())
    }

    /// Hands a match's entries to `sink`.
    fn walk_match(
        &self,
        m: &Match,
        naming: &Naming<'_>,
        sink: &mut dyn Sink,
        counts: &mut Counts,
    ) -> Result<(), ContextError> {
        let parent_path = match m.path.iter().rposition(|&b| b == b'/') {
            Some(at) => &m.path[..at],
            None => b"".as_slice(),
        };
        match (naming, kind(&m.stat)) {
            (Naming::Contents, _) => {
                let dir = self.open_dir(&m.path, &shown(&m.path))?;
                let mut pending = Vec::new();
                self.walk_dir(&dir, &m.path, b"", 0, &mut pending, sink, counts)
            }
            (Naming::As(name), _) => {
                let parent = self.open_dir(parent_path, &shown(&m.path))?;
                let base = m.path.rsplit(|&b| b == b'/').next().unwrap_or_default();
                let name = if name.is_empty() { base } else { name };
                self.emit(&parent, &m.path, base, name, &m.stat, sink, counts)
            }
        }
    }

    /// One entry (`base` in the directory `parent`), named `name`.
    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        parent: &OwnedFd,
        path: &[u8],
        base: &[u8],
        name: &[u8],
        stat: &Stat,
        sink: &mut dyn Sink,
        counts: &mut Counts,
    ) -> Result<(), ContextError> {
        if path.len() > MAX_PATH_BYTES || name.len() > MAX_PATH_BYTES {
            return Err(ContextError::PathTooLong { path: shown(path) });
        }
        let entry = Entry {
            path,
            name,
            kind: kind(stat),
            mode: mode_bits(stat),
            mtime: stat.st_mtime,
        };
        match entry.kind {
            Kind::Other => {
                counts.skipped += 1;
                Ok(())
            }
            Kind::Dir => {
                self.count(counts, 0)?;
                sink.entry(&entry, 0, None, None)
            }
            Kind::Symlink => {
                self.count(counts, 0)?;
                let target = self.link_target(parent, path)?;
                sink.entry(&entry, 0, None, Some(&target))
            }
            Kind::File => {
                let size = u64::try_from(stat.st_size).unwrap_or(0);
                self.count(counts, size)?;
                let fd = openat2(
                    parent,
                    OsStr::from_bytes(base),
                    FILE_FLAGS,
                    Mode::empty(),
                    RESOLVE,
                )
                .map_err(|errno| match errno {
                    Errno::LOOP | Errno::XDEV | Errno::NOENT => {
                        ContextError::Changed { path: shown(path) }
                    }
                    errno => read_err(path)(errno),
                })?;
                let now = fstat(&fd).map_err(read_err(path))?;
                if kind(&now) != Kind::File
                    || now.st_ino != stat.st_ino
                    || now.st_dev != stat.st_dev
                {
                    return Err(ContextError::Changed { path: shown(path) });
                }
                let mut file = std::fs::File::from(fd);
                sink.entry(&entry, size, Some(&mut file), None)
            }
        }
    }

    /// The entries beneath the directory `dir` (at `path` in the context,
    /// named `prefix` in the destination), depth first, names sorted.
    /// `pending` holds excluded directories above, written only once
    /// something beneath them is.
    #[allow(clippy::too_many_arguments)]
    fn walk_dir(
        &self,
        dir: &OwnedFd,
        path: &[u8],
        prefix: &[u8],
        depth: usize,
        pending: &mut Vec<(Vec<u8>, Vec<u8>, Stat)>,
        sink: &mut dyn Sink,
        counts: &mut Counts,
    ) -> Result<(), ContextError> {
        if depth >= MAX_DEPTH {
            return Err(ContextError::TooDeep { path: shown(path) });
        }
        for name in self.list(dir, path, counts)? {
            let child = join(path, &name);
            let child_name = join(prefix, &name);
            if child.len() > MAX_PATH_BYTES {
                return Err(ContextError::PathTooLong {
                    path: shown(&child),
                });
            }
            let stat = match statat(dir, OsStr::from_bytes(&name), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                // Gone since it was listed.
                Err(Errno::NOENT) => continue,
                Err(errno) => return Err(read_err(&child)(errno)),
            };
            let excluded = self.ignore.is_excluded(&child);
            if kind(&stat) == Kind::Dir {
                if excluded && !self.ignore.may_include_beneath(&child) {
                    continue;
                }
                let sub = openat2(
                    dir,
                    OsStr::from_bytes(&name),
                    DIR_FLAGS,
                    Mode::empty(),
                    RESOLVE,
                )
                .map_err(|errno| match errno {
                    Errno::LOOP | Errno::XDEV | Errno::NOTDIR | Errno::NOENT => {
                        ContextError::Changed {
                            path: shown(&child),
                        }
                    }
                    errno => read_err(&child)(errno),
                })?;
                if excluded {
                    pending.push((child.clone(), child_name.clone(), stat));
                    self.walk_dir(&sub, &child, &child_name, depth + 1, pending, sink, counts)?;
                    // Popped unwritten if nothing beneath was written.
                    if pending.last().is_some_and(|(p, ..)| *p == child) {
                        pending.pop();
                    }
                } else {
                    self.flush(pending, sink, counts)?;
                    self.emit(dir, &child, &name, &child_name, &stat, sink, counts)?;
                    self.walk_dir(&sub, &child, &child_name, depth + 1, pending, sink, counts)?;
                }
            } else if !excluded {
                self.flush(pending, sink, counts)?;
                self.emit(dir, &child, &name, &child_name, &stat, sink, counts)?;
            }
        }
        Ok(())
    }

    /// Writes the excluded directories above an entry about to be written.
    fn flush(
        &self,
        pending: &mut Vec<(Vec<u8>, Vec<u8>, Stat)>,
        sink: &mut dyn Sink,
        counts: &mut Counts,
    ) -> Result<(), ContextError> {
        for (path, name, stat) in pending.drain(..) {
            let entry = Entry {
                path: &path,
                name: &name,
                kind: Kind::Dir,
                mode: mode_bits(&stat),
                mtime: stat.st_mtime,
            };
            self.count(counts, 0)?;
            sink.entry(&entry, 0, None, None)?;
        }
        Ok(())
    }
}

/// A literal last component with its `\` escapes removed.
fn unescape(name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len());
    let mut bytes = name.bytes();
    while let Some(b) = bytes.next() {
        if b == b'\\' {
            if let Some(next) = bytes.next() {
                out.push(next);
            }
        } else {
            out.push(b);
        }
    }
    out
}

/// Whether the symlink at `path` (relative to the context) with `target`
/// resolves, lexically, outside the context.
fn escapes(path: &[u8], target: &[u8]) -> bool {
    if target.starts_with(b"/") {
        return true;
    }
    let mut depth: usize = path.iter().filter(|&&b| b == b'/').count();
    for part in target.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                if depth == 0 {
                    return true;
                }
                depth -= 1;
            }
            _ => depth += 1,
        }
    }
    false
}

/// [`Context::hash_sources`] of `context_dir` with the default limits.
pub fn hash_sources(context_dir: &Path, sources: &[String]) -> Result<SourcesDigest, ContextError> {
    Context::open(context_dir, Limits::default())?.hash_sources(sources)
}

/// [`Context::pack_sources`] of `context_dir` with the default limits.
pub fn pack_sources<W: Write>(
    context_dir: &Path,
    sources: &[String],
    dest: &str,
    options: &PackOptions,
    out: W,
) -> Result<Packed, ContextError> {
    Context::open(context_dir, Limits::default())?.pack_sources(sources, dest, options, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlink_escapes() {
        assert!(escapes(b"a", b"/etc/passwd"));
        assert!(escapes(b"a", b"../x"));
        assert!(!escapes(b"d/a", b"../x"));
        assert!(escapes(b"d/a", b"../../x"));
        assert!(!escapes(b"a", b"b/../c"));
        assert!(escapes(b"a", b"b/../../c"));
        assert!(!escapes(b"a", b"."));
    }
}
