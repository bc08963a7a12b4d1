//! The merged view of a stack of unpacked layers, as overlayfs would show
//! it, read by descriptor.
//!
//! - A path's top-most layer wins. A character device 0:0 (a whiteout)
//!   hides the lower layers' node at its path; a directory with
//!   `user.overlay.opaque=y` hides the lower layers' contents of that
//!   directory; a non-directory above a directory hides it, and a
//!   directory merges only with the directories right below it, down to the
//!   first layer where the path is something else (as overlayfs's lookup
//!   stops there). The layers' roots always merge (overlayfs ignores an
//!   opaque root).
//! - Every component is looked up by us, one name at a time, with
//!   `fstatat(AT_SYMLINK_NOFOLLOW)` and `openat(O_NOFOLLOW)` on the
//!   descriptor of its parent in that layer: the host's path resolution
//!   never walks a layer's path, so nothing a layer holds can lead the
//!   reader out of it. `..` is ours too: it goes to the merged parent, and
//!   the root's parent is the root.
//! - A **symlink is resolved within the merged view**, as the sandbox would
//!   see it: an absolute target starts again at the merged root, a
//!   relative one at the symlink's directory, and `..` never climbs above
//!   the root. At most [`MAX_SYMLINKS`] are followed in one lookup (a loop
//!   ends there, as not found).
//! - Listings are bounded: at most [`MAX_LISTING`] names a directory, and
//!   [`MAX_WALKED`] directory entries read in all; past either a listing is
//!   cut short and counted.

use super::SbomError;
use rustix::fs::{
    fgetxattr, fstat, openat, readlinkat, statat, AtFlags, Dir, FileType, Mode, OFlags,
};
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::rc::Rc;

/// The most symlinks one lookup follows (the kernel's own limit).
pub(crate) const MAX_SYMLINKS: usize = 40;
/// The most names one merged directory listing holds.
pub(crate) const MAX_LISTING: usize = 200_000;
/// The most directory entries read over one stack, all listings together.
pub(crate) const MAX_WALKED: u64 = 2_000_000;

/// The xattr of an opaque directory (the sandboxes mount overlayfs with
/// `userxattr`, so only the `user.` form counts).
const OPAQUE_XATTR: &str = "user.overlay.opaque";

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);
/// Regular files only, never a FIFO's blocking open or a controlling tty.
const FILE_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// The layers, opened once.
pub(crate) struct Stack {
    /// Each layer's root, top-most first, with its index (bottom first).
    roots: Vec<(usize, Rc<OwnedFd>)>,
    /// Directory entries read so far.
    walked: std::cell::Cell<u64>,
    /// Listings cut short by a bound.
    pub(crate) truncated_listings: std::cell::Cell<u64>,
}

/// A directory of the merged view: its path from the root (no symlinks,
/// no `.` or `..`) and its descriptor in each layer it merges, top first.
#[derive(Clone)]
pub(crate) struct MergedDir {
    path: Vec<Vec<u8>>,
    layers: Vec<(usize, Rc<OwnedFd>)>,
}

impl MergedDir {
    /// The path, `/`-separated and absolute, for properties and errors.
    pub(crate) fn display(&self) -> String {
        let mut out = String::new();
        for name in &self.path {
            out.push('/');
            out.push_str(&String::from_utf8_lossy(name));
        }
        if out.is_empty() {
            out.push('/');
        }
        out
    }

    fn display_child(&self, name: &[u8]) -> String {
        let mut out = self.display();
        if !out.ends_with('/') {
            out.push('/');
        }
        out.push_str(&String::from_utf8_lossy(name));
        out
    }
}

/// A regular file of the merged view.
pub(crate) struct MergedFile {
    /// The index (bottom first) of the layer it is in.
    pub(crate) layer: usize,
    /// Its path in the merged view (after symlinks).
    pub(crate) path: String,
    pub(crate) file: File,
    pub(crate) size: u64,
}

/// What a path of the merged view is.
pub(crate) enum Found {
    Dir(MergedDir),
    File(MergedFile),
}

/// What one name of a directory is in the merged view.
enum Child {
    Dir(MergedDir),
    File(MergedFile),
    Symlink(Vec<u8>),
    /// A FIFO, socket or device (not a whiteout): nothing to read.
    Other,
}

/// Errors that mean "not there" in a layer rather than a failing store.
fn absent(errno: Errno) -> bool {
    matches!(
        errno,
        Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::NAMETOOLONG
    )
}

fn is_whiteout(stat: &rustix::fs::Stat) -> bool {
    FileType::from_raw_mode(stat.st_mode) == FileType::CharacterDevice && stat.st_rdev == 0
}

fn is_opaque(dir: &OwnedFd) -> bool {
    let mut value = [0u8; 4];
    matches!(fgetxattr(dir, OPAQUE_XATTR, &mut value[..]), Ok(1) if value[0] == b'y')
}

impl Stack {
    /// Opens the layers' directories (`layers` bottom first, as a template
    /// lists them).
    pub(crate) fn open(layers: &[PathBuf]) -> Result<Stack, SbomError> {
        let mut roots = Vec::with_capacity(layers.len());
        for (index, path) in layers.iter().enumerate().rev() {
            let fd = rustix::fs::open(path, DIR_FLAGS, Mode::empty()).map_err(|errno| {
                SbomError::OpenLayer {
                    path: path.clone(),
                    source: errno.into(),
                }
            })?;
            roots.push((index, Rc::new(fd)));
        }
        Ok(Stack {
            roots,
            walked: std::cell::Cell::new(0),
            truncated_listings: std::cell::Cell::new(0),
        })
    }

    pub(crate) fn root(&self) -> MergedDir {
        MergedDir {
            path: Vec::new(),
            layers: self.roots.clone(),
        }
    }

    /// The node at `path` (absolute, or relative to `start`), symlinks
    /// resolved within the stack; `None` if there is none, or it is not a
    /// directory or a regular file.
    pub(crate) fn lookup(
        &self,
        start: &MergedDir,
        path: &[u8],
    ) -> Result<Option<Found>, SbomError> {
        let mut current = if path.starts_with(b"/") {
            self.root()
        } else {
            start.clone()
        };
        let mut todo: Vec<Vec<u8>> = components(path).rev().collect();
        let mut links = 0;
        while let Some(name) = todo.pop() {
            if name == b".." {
                match self.parent(&current)? {
                    Some(parent) => current = parent,
                    None => return Ok(None),
                }
                continue;
            }
            match self.child(&current, &name)? {
                None | Some(Child::Other) => return Ok(None),
                Some(Child::Dir(dir)) => current = dir,
                Some(Child::File(file)) if todo.is_empty() => return Ok(Some(Found::File(file))),
                Some(Child::File(_)) => return Ok(None),
                Some(Child::Symlink(target)) => {
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Ok(None);
                    }
                    if target.starts_with(b"/") {
                        current = self.root();
                    }
                    todo.extend(components(&target).rev());
                }
            }
        }
        Ok(Some(Found::Dir(current)))
    }

    /// The directory at `path`, if it is one.
    pub(crate) fn dir(
        &self,
        start: &MergedDir,
        path: &[u8],
    ) -> Result<Option<MergedDir>, SbomError> {
        Ok(match self.lookup(start, path)? {
            Some(Found::Dir(dir)) => Some(dir),
            _ => None,
        })
    }

    /// The regular file at `path`, if it is one.
    pub(crate) fn file(
        &self,
        start: &MergedDir,
        path: &[u8],
    ) -> Result<Option<MergedFile>, SbomError> {
        Ok(match self.lookup(start, path)? {
            Some(Found::File(file)) => Some(file),
            _ => None,
        })
    }

    /// The merged parent of `dir` (the root's is the root), found again
    /// from the root along `dir`'s own path.
    fn parent(&self, dir: &MergedDir) -> Result<Option<MergedDir>, SbomError> {
        let mut current = self.root();
        let Some((_, ancestors)) = dir.path.split_last() else {
            return Ok(Some(current));
        };
        for name in ancestors {
            match self.child(&current, name)? {
                Some(Child::Dir(next)) => current = next,
                _ => return Ok(None),
            }
        }
        Ok(Some(current))
    }

    /// What `name` is in `dir`, through the layers `dir` merges.
    fn child(&self, dir: &MergedDir, name: &[u8]) -> Result<Option<Child>, SbomError> {
        let os_name = OsStr::from_bytes(name);
        let failed = |layer: usize| {
            let path = dir.display_child(name);
            move |errno: Errno| SbomError::Read {
                layer,
                path,
                source: errno.into(),
            }
        };
        let mut dirs = Vec::new();
        for (layer, fd) in &dir.layers {
            let stat = match statat(fd, os_name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(errno) if absent(errno) => continue,
                Err(errno) => return Err(failed(*layer)(errno)),
            };
            if is_whiteout(&stat) {
                break;
            }
            let kind = FileType::from_raw_mode(stat.st_mode);
            if kind == FileType::Directory {
                let opened = match openat(fd, os_name, DIR_FLAGS, Mode::empty()) {
                    Ok(opened) => opened,
                    Err(errno) if absent(errno) => break,
                    Err(errno) => return Err(failed(*layer)(errno)),
                };
                let opaque = is_opaque(&opened);
                dirs.push((*layer, Rc::new(opened)));
                if opaque {
                    break;
                }
                continue;
            }
            if !dirs.is_empty() {
                // A non-directory below a directory ends the merge.
                break;
            }
            return Ok(Some(match kind {
                FileType::RegularFile => {
                    let opened = match openat(fd, os_name, FILE_FLAGS, Mode::empty()) {
                        Ok(opened) => opened,
                        Err(errno) if absent(errno) => return Ok(None),
                        Err(errno) => return Err(failed(*layer)(errno)),
                    };
                    let stat = fstat(&opened).map_err(failed(*layer))?;
                    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
                        return Ok(None);
                    }
                    Child::File(MergedFile {
                        layer: *layer,
                        path: dir.display_child(name),
                        file: File::from(opened),
                        size: u64::try_from(stat.st_size).unwrap_or(0),
                    })
                }
                FileType::Symlink => match readlinkat(fd, os_name, Vec::new()) {
                    Ok(target) => Child::Symlink(target.into_bytes()),
                    Err(errno) if absent(errno) || errno == Errno::INVAL => return Ok(None),
                    Err(errno) => return Err(failed(*layer)(errno)),
                },
                _ => Child::Other,
            }));
        }
        if dirs.is_empty() {
            return Ok(None);
        }
        let mut path = dir.path.clone();
        path.push(name.to_vec());
        Ok(Some(Child::Dir(MergedDir { path, layers: dirs })))
    }

    /// The names in `dir`, merged and sorted, whiteouts and what they hide
    /// left out; cut short (and counted) past the bounds.
    pub(crate) fn list(&self, dir: &MergedDir) -> Result<Vec<Vec<u8>>, SbomError> {
        // The top-most layer that has a name decides whether it is there.
        let mut seen: BTreeMap<Vec<u8>, bool> = BTreeMap::new();
        'layers: for (layer, fd) in &dir.layers {
            let failed = |errno: Errno| SbomError::Read {
                layer: *layer,
                path: dir.display(),
                source: errno.into(),
            };
            for entry in Dir::read_from(fd).map_err(failed)? {
                let entry = entry.map_err(failed)?;
                let name = entry.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                let walked = self.walked.get() + 1;
                self.walked.set(walked);
                if walked > MAX_WALKED {
                    self.truncated_listings
                        .set(self.truncated_listings.get() + 1);
                    break 'layers;
                }
                if seen.contains_key(name) {
                    continue;
                }
                if seen.len() >= MAX_LISTING {
                    self.truncated_listings
                        .set(self.truncated_listings.get() + 1);
                    break 'layers;
                }
                let whiteout = match entry.file_type() {
                    FileType::CharacterDevice | FileType::Unknown => {
                        match statat(fd, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW) {
                            Ok(stat) => is_whiteout(&stat),
                            Err(errno) if absent(errno) => continue,
                            Err(errno) => return Err(failed(errno)),
                        }
                    }
                    _ => false,
                };
                seen.insert(name.to_vec(), !whiteout);
            }
        }
        Ok(seen
            .into_iter()
            .filter_map(|(name, visible)| visible.then_some(name))
            .collect())
    }
}

/// A path's names, without empty and `.` components.
fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = Vec<u8>> + '_ {
    path.split(|&b| b == b'/')
        .filter(|name| !name.is_empty() && *name != b".")
        .map(<[u8]>::to_vec)
}
