//! The layer's directory tree, reached only through descriptors: every
//! path of an entry is resolved beneath the descriptor of the layer's root
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)`, and every node is made by an `*at` call on the
//! descriptor of its parent with a single-component name.

use rustix::fs::{
    fchmod, fchown, fsetxattr, mkdirat, mknodat, openat, openat2, statat, unlinkat, AtFlags, Dir,
    FileType, Mode, OFlags, ResolveFlags, XattrFlags, CWD,
};
use rustix::io::Errno;
use rustix::process::{Gid, Uid};
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

/// How every multi-component path is resolved: beneath the root, through
/// no symlink at all (the layer's own symlinks are for the sandbox to
/// resolve in its root, never for us) and no /proc magic link.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// How directories are opened: readable (fchmod, fsetxattr and readdir need
/// more than `O_PATH`), never through a final symlink.
const DIR_FLAGS: OFlags = BENEATH_FLAGS.union(OFlags::NOFOLLOW);

/// [`DIR_FLAGS`] for `openat2`, where `RESOLVE_NO_SYMLINKS` refuses a final
/// symlink with `ELOOP` (`O_NOFOLLOW` would make it `ENOTDIR`, which could
/// not be told from a regular file).
const BENEATH_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::CLOEXEC);

/// The xattr that makes a directory opaque to the layers below it, for an
/// overlayfs mounted with `userxattr` (as the sandboxes mount it).
pub(crate) const OPAQUE_XATTR: &str = "user.overlay.opaque";

/// Why a path could not be resolved.
#[derive(Debug)]
pub(crate) enum TreeError {
    /// A component is a symlink (`ELOOP`) or the resolution left the root
    /// (`EXDEV`).
    Escape,
    /// A component is neither a directory nor a whiteout to replace.
    NotDirectory,
    /// Any other failure of the step named.
    Io(&'static str, io::Error),
}

fn io_err(what: &'static str) -> impl FnOnce(Errno) -> TreeError {
    move |errno| TreeError::Io(what, errno.into())
}

/// What is already at a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Existing {
    Dir,
    /// A character device 0:0: a whiteout made by this layer (the layer's
    /// own devices are skipped, so it can be nothing else).
    Whiteout,
    Other,
}

/// The layer's root and what was done to it beyond its entries.
pub(crate) struct Tree {
    root: OwnedFd,
    /// Directories made opaque (by an opaque marker, a whiteout of a
    /// directory of this layer, or a directory over a whiteout).
    pub(crate) opaque_dirs: u64,
}

impl Tree {
    /// Opens the layer's root directory (the caller's path, trusted).
    pub(crate) fn open(into: &Path) -> io::Result<Self> {
        Ok(Self {
            root: openat(CWD, into, DIR_FLAGS, Mode::empty())?,
            opaque_dirs: 0,
        })
    }

    /// The directory at `path` (normalized, relative to the root; empty for
    /// the root itself), made with its missing parents (0755, root-owned)
    /// when `create`.
    pub(crate) fn dir(&mut self, path: &[u8], create: bool) -> Result<OwnedFd, TreeError> {
        if path.is_empty() {
            return openat(&self.root, ".", DIR_FLAGS, Mode::empty())
                .map_err(io_err("open the layer's root"));
        }
        match open_beneath(&self.root, path) {
            Err(Errno::NOENT | Errno::NOTDIR) if create => self.walk(path),
            result => result.map_err(beneath_error),
        }
    }

    /// [`Tree::dir`] one component at a time, making what is missing.
    fn walk(&mut self, path: &[u8]) -> Result<OwnedFd, TreeError> {
        let mut dir = self.dir(b"", false)?;
        for name in path.split(|b| *b == b'/') {
            dir = match open_beneath(&dir, name) {
                Ok(next) => next,
                Err(Errno::NOENT) => make_dir(&dir, name, false)?,
                Err(Errno::NOTDIR) if self.existing(&dir, name)? == Some(Existing::Whiteout) => {
                    // An entry below a name an earlier entry whited out:
                    // the directory comes back, without what lies below.
                    unlinkat(&dir, name, AtFlags::empty()).map_err(io_err("remove a whiteout"))?;
                    let made = make_dir(&dir, name, true)?;
                    self.opaque_dirs += 1;
                    made
                }
                Err(errno) => return Err(beneath_error(errno)),
            };
        }
        Ok(dir)
    }

    /// What is at `name` in `dir`, without following it.
    pub(crate) fn existing(
        &self,
        dir: &OwnedFd,
        name: &[u8],
    ) -> Result<Option<Existing>, TreeError> {
        match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(match FileType::from_raw_mode(stat.st_mode) {
                FileType::Directory => Existing::Dir,
                FileType::CharacterDevice if stat.st_rdev == 0 => Existing::Whiteout,
                _ => Existing::Other,
            })),
            Err(Errno::NOENT) => Ok(None),
            Err(errno) => Err(TreeError::Io("look at an existing node", errno.into())),
        }
    }

    /// Removes whatever is at `name` in `dir` (a directory with its tree).
    pub(crate) fn clear(
        &self,
        dir: &OwnedFd,
        name: &[u8],
        existing: Existing,
    ) -> Result<(), TreeError> {
        match existing {
            Existing::Dir => remove_tree(dir, name),
            Existing::Whiteout | Existing::Other => {
                unlinkat(dir, name, AtFlags::empty()).map_err(io_err("remove an earlier entry"))
            }
        }
    }

    /// Marks the directory `dir` opaque.
    pub(crate) fn set_opaque(&mut self, dir: &OwnedFd) -> Result<(), TreeError> {
        fsetxattr(dir, OPAQUE_XATTR, b"y", XattrFlags::empty())
            .map_err(io_err("mark a directory opaque"))?;
        self.opaque_dirs += 1;
        Ok(())
    }
}

/// `openat2` of the directory at `path` beneath `dir`.
fn open_beneath(dir: &OwnedFd, path: &[u8]) -> Result<OwnedFd, Errno> {
    loop {
        match openat2(dir, path, BENEATH_FLAGS, Mode::empty(), RESOLVE) {
            // The kernel could not rule out a race with a rename; nothing
            // renames in a layer being unpacked, so try again.
            Err(Errno::AGAIN) => continue,
            result => return result,
        }
    }
}

fn beneath_error(errno: Errno) -> TreeError {
    match errno {
        Errno::LOOP | Errno::XDEV => TreeError::Escape,
        Errno::NOTDIR => TreeError::NotDirectory,
        errno => TreeError::Io("open a parent directory", errno.into()),
    }
}

/// Makes the directory `name` in `dir` (0755, root's), opaque when asked.
fn make_dir(dir: &OwnedFd, name: &[u8], opaque: bool) -> Result<OwnedFd, TreeError> {
    mkdirat(dir, name, Mode::from_raw_mode(0o700)).map_err(io_err("make a parent directory"))?;
    let made =
        openat(dir, name, DIR_FLAGS, Mode::empty()).map_err(io_err("open a parent directory"))?;
    if opaque {
        fsetxattr(&made, OPAQUE_XATTR, b"y", XattrFlags::empty())
            .map_err(io_err("mark a directory opaque"))?;
    }
    fchown(&made, Some(Uid::ROOT), Some(Gid::ROOT))
        .map_err(io_err("set a parent directory's owner"))?;
    fchmod(&made, Mode::from_raw_mode(0o755)).map_err(io_err("set a parent directory's mode"))?;
    Ok(made)
}

/// Makes and opens a directory `name` in `dir`, owned by root with mode 0700
/// until the caller applies the entry's metadata.
pub(crate) fn new_dir(dir: &OwnedFd, name: &[u8]) -> Result<OwnedFd, TreeError> {
    mkdirat(dir, name, Mode::from_raw_mode(0o700)).map_err(io_err("make a directory"))?;
    open_dir(dir, name)
}

/// Opens the directory `name` of `dir`, not through a symlink.
pub(crate) fn open_dir(dir: &OwnedFd, name: &[u8]) -> Result<OwnedFd, TreeError> {
    openat(dir, name, DIR_FLAGS, Mode::empty()).map_err(io_err("open a directory"))
}

/// Removes the directory `name` of `dir` and everything below it, by
/// descriptor, depth first. It holds one directory open at a time (a tree
/// as deep as a 4 KiB path allows would otherwise need thousands of
/// descriptors) and reopens the way back up from `dir` by its names.
fn remove_tree(dir: &OwnedFd, name: &[u8]) -> Result<(), TreeError> {
    // The names from `dir` down to the directory being emptied.
    let mut names: Vec<Vec<u8>> = vec![name.to_vec()];
    let mut current = open_dir(dir, name)?;
    loop {
        match empty_but_one(&current)? {
            Some(sub) => {
                current = open_dir(&current, &sub)?;
                names.push(sub);
            }
            None => {
                let Some(leaf) = names.pop() else {
                    return Ok(());
                };
                let parent = if names.is_empty() {
                    openat(dir, ".", DIR_FLAGS, Mode::empty())
                        .map_err(io_err("open a directory"))?
                } else {
                    open_beneath(dir, &names.join(&b'/')).map_err(beneath_error)?
                };
                unlinkat(&parent, leaf.as_slice(), AtFlags::REMOVEDIR)
                    .map_err(io_err("remove a replaced directory"))?;
                if names.is_empty() {
                    return Ok(());
                }
                current = parent;
            }
        }
    }
}

/// Removes every non-directory in `dir` and returns the name of a
/// subdirectory, if it has one.
fn empty_but_one(dir: &OwnedFd) -> Result<Option<Vec<u8>>, TreeError> {
    for entry in Dir::read_from(dir).map_err(io_err("read a replaced directory"))? {
        let entry = entry.map_err(io_err("read a replaced directory"))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => matches!(
                statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|s| FileType::from_raw_mode(s.st_mode)),
                Ok(FileType::Directory)
            ),
            _ => false,
        };
        if is_dir {
            return Ok(Some(name.to_vec()));
        }
        unlinkat(dir, name, AtFlags::empty()).map_err(io_err("remove a replaced node"))?;
    }
    Ok(None)
}

/// Makes a whiteout (a character device 0:0, root's) at `name` in `dir`.
pub(crate) fn make_whiteout(dir: &OwnedFd, name: &[u8]) -> Result<(), TreeError> {
    mknodat(
        dir,
        name,
        FileType::CharacterDevice,
        Mode::empty(),
        rustix::fs::makedev(0, 0),
    )
    .map_err(io_err("make a whiteout"))
}
