//! The real [`RootfsSys`]: mounts and files beneath the new root, resolved by
//! descriptor.
//!
//! Every path is opened with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`
//! relative to the new root's descriptor, so `..` and absolute symlinks stay
//! inside it. Mounts target `/proc/self/fd/N` of the resolved descriptor
//! (the runc fix for CVE-2021-30465), so a symlink swapped in after the check
//! cannot redirect them.

use crate::rootfs::{FileRead, Flags, NodeKind, RootfsSys};
use rustix::fs::{
    fchmod, fchown, mkdirat, openat, openat2, symlinkat, unlinkat, AtFlags, Gid, Mode, OFlags,
    ResolveFlags, Uid, CWD,
};
use rustix::io::Errno;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// A setup step failed.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path} failed: {errno}")]
pub struct SetupError {
    pub step: &'static str,
    pub path: String,
    pub errno: Errno,
}

fn fail<'a>(step: &'static str, path: &'a str) -> impl FnOnce(Errno) -> SetupError + 'a {
    move |errno| SetupError {
        step,
        path: path.to_owned(),
        errno,
    }
}

/// Host paths the setup binds, opened while the sandbox init still has the
/// launcher's host credentials (so a root-only host directory can be bound)
/// and used later through their `/proc/self/fd` links.
#[derive(Default)]
pub struct HostSources {
    opened: Vec<(std::path::PathBuf, OwnedFd)>,
}

impl HostSources {
    /// Opens each path with `O_PATH`.
    pub fn open<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Result<HostSources, SetupError> {
        let mut opened = Vec::new();
        for path in paths {
            let display = path.to_string_lossy().into_owned();
            let fd = openat(CWD, path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
                .map_err(fail("open host path", &display))?;
            opened.push((path.to_owned(), fd));
        }
        Ok(HostSources { opened })
    }

    /// The `/proc/self/fd` link of an opened path, or the path itself.
    pub fn link(&self, path: &Path) -> Option<String> {
        self.opened
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, fd)| fd_path(fd))
    }
}

/// The new root, as a directory descriptor.
pub struct RootDir {
    root: OwnedFd,
    sources: HostSources,
    /// The host uid and gid of the sandbox's root when the root is set up
    /// from outside the sandbox's user namespace (the oci tier's runc maps
    /// its root there): what the setup makes is owned by `base + id` for
    /// the id the sandbox should see. 0 when the setup runs inside it.
    owner_base: u32,
    /// Detached mounts [`RootfsSys::attach_tree`] attaches, each once.
    trees: Vec<Option<OwnedFd>>,
}

impl RootDir {
    /// Opens the directory that will become `/`.
    pub fn open(path: &Path, sources: HostSources) -> Result<RootDir, SetupError> {
        let display = path.to_string_lossy().into_owned();
        let root = openat(
            CWD,
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(fail("open root", &display))?;
        Ok(RootDir {
            root,
            sources,
            owner_base: 0,
            trees: Vec::new(),
        })
    }

    /// The same root, given the detached mounts the plan's
    /// [`crate::rootfs::SetupOp::AttachTree`] steps attach, by index.
    pub fn with_trees(mut self, trees: Vec<OwnedFd>) -> RootDir {
        self.trees = trees.into_iter().map(Some).collect();
        self
    }

    /// The same root, whose sandbox sees host id `base + n` as `n`: what the
    /// setup creates is owned accordingly (root's files by `base`).
    pub fn owned_from(mut self, base: u32) -> RootDir {
        self.owner_base = base;
        self
    }

    /// The host id of the sandbox's id `id`.
    fn host_id(&self, id: u32) -> u32 {
        self.owner_base.saturating_add(id)
    }

    /// Gives `fd` (just created) to the sandbox's root, when that is not
    /// the host's.
    fn own(&self, fd: &OwnedFd) -> Result<(), Errno> {
        if self.owner_base == 0 {
            return Ok(());
        }
        let id = self.host_id(0);
        fchown(fd, Some(Uid::from_raw(id)), Some(Gid::from_raw(id)))
    }

    fn resolve(&self, path: &str, flags: OFlags) -> Result<OwnedFd, Errno> {
        let path = if path.is_empty() { "." } else { path };
        openat2(
            &self.root,
            path,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )
    }

    /// The directory holding `path` and the last component.
    fn parent<'p>(&self, path: &'p str) -> Result<(OwnedFd, &'p str), Errno> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        Ok((self.resolve(dir, OFlags::PATH | OFlags::DIRECTORY)?, name))
    }

    /// Creates every missing directory of `path` (0755, owned by the
    /// sandbox's root). The
    /// parent is looked at first: in the common case it exists and this is
    /// one resolution and one mkdirat.
    fn mkdir_all(&self, path: &str) -> Result<(), Errno> {
        let path = path.trim_matches('/');
        if path.is_empty() {
            return Ok(());
        }
        let (parent, name) = match self.parent(path) {
            Ok(found) => found,
            Err(Errno::NOENT) => {
                let (dir, _) = path.rsplit_once('/').ok_or(Errno::NOENT)?;
                self.mkdir_all(dir)?;
                self.parent(path)?
            }
            Err(e) => return Err(e),
        };
        match mkdirat(&parent, name, Mode::from_raw_mode(0o755)) {
            Ok(()) if self.owner_base != 0 => {
                let made = openat2(
                    &parent,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                    ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
                )?;
                self.own(&made)
            }
            Ok(()) | Err(Errno::EXIST) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Mounts over the resolved `path` through its `/proc/self/fd` link.
    fn mount_on(
        &self,
        source: Option<&str>,
        path: &str,
        fstype: Option<&str>,
        flags: libc::c_ulong,
        data: Option<&str>,
    ) -> Result<(), Errno> {
        let target = self.resolve(path, OFlags::PATH)?;
        raw_mount(source, &fd_path(&target), fstype, flags, data)
    }

    /// What to mount for the host path `source`: its opened descriptor's
    /// link (see [`HostSources`]), or the path itself.
    fn source(&self, source: &Path) -> Result<String, Errno> {
        match self.sources.link(source) {
            Some(link) => Ok(link),
            None => source.to_str().map(str::to_owned).ok_or(Errno::INVAL),
        }
    }

    /// Remounts the mount at `path` read-only (plus `extra`), keeping the
    /// flags the kernel locks for mounts that came from the host.
    fn remount(&self, path: &str, read_only: bool, extra: Flags) -> Result<(), Errno> {
        let target = self.resolve(path, OFlags::PATH)?;
        let mut flags = libc::MS_REMOUNT | libc::MS_BIND | locked_flags(&target)? | ms_flags(extra);
        if read_only {
            flags |= libc::MS_RDONLY;
        }
        raw_mount(None, &fd_path(&target), None, flags, None)
    }
}

/// The magic link of a descriptor.
pub fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

fn ms_flags(flags: Flags) -> libc::c_ulong {
    let mut out = 0;
    if flags.nosuid {
        out |= libc::MS_NOSUID;
    }
    if flags.nodev {
        out |= libc::MS_NODEV;
    }
    if flags.noexec {
        out |= libc::MS_NOEXEC;
    }
    out
}

/// The per-mount flags of the mount holding `fd`; a remount inside a user
/// namespace must repeat them or the kernel refuses it.
fn locked_flags(fd: &OwnedFd) -> Result<libc::c_ulong, Errno> {
    let stat = rustix::fs::fstatvfs(fd)?;
    let f = stat.f_flag;
    let mut out = 0;
    for (st, ms) in [
        (rustix::fs::StatVfsMountFlags::RDONLY, libc::MS_RDONLY),
        (rustix::fs::StatVfsMountFlags::NOSUID, libc::MS_NOSUID),
        (rustix::fs::StatVfsMountFlags::NODEV, libc::MS_NODEV),
        (rustix::fs::StatVfsMountFlags::NOEXEC, libc::MS_NOEXEC),
        (rustix::fs::StatVfsMountFlags::NOATIME, libc::MS_NOATIME),
        (
            rustix::fs::StatVfsMountFlags::NODIRATIME,
            libc::MS_NODIRATIME,
        ),
        (rustix::fs::StatVfsMountFlags::RELATIME, libc::MS_RELATIME),
    ] {
        if f.contains(st) {
            out |= ms;
        }
    }
    Ok(out)
}

/// `Ok` for a system call that returned 0, else the errno it left.
fn zero_or_errno(rc: i64) -> Result<(), Errno> {
    if rc == 0 {
        return Ok(());
    }
    let raw = std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO);
    Err(Errno::from_raw_os_error(raw))
}

/// mount(2) with optional strings.
pub fn raw_mount(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), Errno> {
    let cstr = |s: &str| CString::new(s).map_err(|_| Errno::INVAL);
    let source = source.map(cstr).transpose()?;
    let target = cstr(target)?;
    let fstype = fstype.map(cstr).transpose()?;
    let data = data.map(cstr).transpose()?;
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is either null (allowed by mount(2) for source,
    // fstype and data) or points at a NUL-terminated CString that outlives
    // the call; the kernel only reads them.
    let rc = unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    zero_or_errno(rc.into())
}

impl RootfsSys for RootDir {
    type Error = SetupError;

    fn mkdir(&mut self, path: &str, mode: u32, uid: u32, gid: u32) -> Result<(), SetupError> {
        self.mkdir_all(path).map_err(fail("mkdir", path))?;
        let dir = self
            .resolve(path, OFlags::RDONLY | OFlags::DIRECTORY)
            .map_err(fail("open dir", path))?;
        fchown(
            &dir,
            Some(Uid::from_raw(self.host_id(uid))),
            Some(Gid::from_raw(self.host_id(gid))),
        )
        .map_err(fail("chown", path))?;
        fchmod(&dir, Mode::from_raw_mode(mode)).map_err(fail("chmod", path))
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<(), SetupError> {
        let (parent, name) = self.parent(path).map_err(fail("open parent of", path))?;
        match symlinkat(target, &parent, name) {
            Ok(()) if self.owner_base != 0 => {
                let id = self.host_id(0);
                rustix::fs::chownat(
                    &parent,
                    name,
                    Some(Uid::from_raw(id)),
                    Some(Gid::from_raw(id)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(fail("chown", path))
            }
            Ok(()) | Err(Errno::EXIST) => Ok(()),
            Err(e) => Err(fail("symlink", path)(e)),
        }
    }

    fn write_file(&mut self, path: &str, contents: &[u8], mode: u32) -> Result<(), SetupError> {
        let (parent, name) = self.parent(path).map_err(fail("open parent of", path))?;
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let file = match openat(&parent, name, flags, Mode::from_raw_mode(mode)) {
            // A template's file may be a symlink; replace it rather than follow it.
            Err(Errno::LOOP) => {
                unlinkat(&parent, name, AtFlags::empty()).map_err(fail("replace", path))?;
                openat(&parent, name, flags, Mode::from_raw_mode(mode))
            }
            other => other,
        }
        .map_err(fail("create", path))?;
        let mut written = 0;
        while written < contents.len() {
            written +=
                rustix::io::write(&file, &contents[written..]).map_err(fail("write", path))?;
        }
        self.own(&file).map_err(fail("chown", path))?;
        fchmod(&file, Mode::from_raw_mode(mode)).map_err(fail("chmod", path))
    }

    fn bind_host(
        &mut self,
        source: &Path,
        path: &str,
        kind: NodeKind,
        read_only: bool,
        flags: Flags,
    ) -> Result<(), SetupError> {
        match kind {
            NodeKind::Dir => self
                .mkdir_all(path)
                .map_err(fail("create mount point", path))?,
            NodeKind::File => {
                if let Some((dir, _)) = path.rsplit_once('/') {
                    self.mkdir_all(dir)
                        .map_err(fail("create mount point", path))?;
                }
                let (parent, name) = self.parent(path).map_err(fail("open parent of", path))?;
                match openat(
                    &parent,
                    name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                ) {
                    Ok(_) | Err(Errno::ISDIR) | Err(Errno::LOOP) => {}
                    Err(e) => return Err(fail("create mount point", path)(e)),
                }
            }
        }
        let source = self.source(source).map_err(fail("bind", path))?;
        self.mount_on(Some(&source), path, None, libc::MS_BIND, None)
            .map_err(fail("bind", path))?;
        if !read_only && flags == Flags::default() {
            return Ok(());
        }
        self.remount(path, read_only, flags)
            .map_err(fail("remount", path))
    }

    fn cover_file(&mut self, source: &Path, path: &str) -> Result<(), SetupError> {
        // Looked at without following a last symlink: only a regular file
        // of the image is covered, and the mount lands on that file.
        let target = match self.resolve(path, OFlags::PATH | OFlags::NOFOLLOW) {
            Ok(target) => target,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(()),
            Err(e) => return Err(fail("open", path)(e)),
        };
        let stat = rustix::fs::fstat(&target).map_err(fail("stat", path))?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
            return Ok(());
        }
        let source = self.source(source).map_err(fail("cover", path))?;
        raw_mount(Some(&source), &fd_path(&target), None, libc::MS_BIND, None)
            .map_err(fail("cover", path))?;
        self.remount(
            path,
            true,
            Flags {
                nosuid: true,
                nodev: true,
                noexec: false,
            },
        )
        .map_err(fail("remount", path))
    }

    fn attach_tree(&mut self, path: &str, tree: usize) -> Result<(), SetupError> {
        let tree = self
            .trees
            .get_mut(tree)
            .and_then(Option::take)
            .ok_or(Errno::BADF)
            .map_err(fail("find the mount to attach at", path))?;
        self.mkdir_all(path)
            .map_err(fail("create mount point", path))?;
        let target = self
            .resolve(path, OFlags::PATH | OFlags::DIRECTORY)
            .map_err(fail("open mount point", path))?;
        rustix::mount::move_mount(
            &tree,
            "",
            &target,
            "",
            rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH
                | rustix::mount::MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
        )
        .map_err(fail("attach", path))
    }

    fn mount_fs(
        &mut self,
        fstype: &str,
        path: &str,
        options: &str,
        flags: Flags,
    ) -> Result<(), SetupError> {
        // A tmpfs mounted from outside the sandbox's user namespace is
        // given to its root, as one mounted inside would be.
        let owned;
        let options = if fstype == "tmpfs" && self.owner_base != 0 {
            let id = self.host_id(0);
            owned = if options.is_empty() {
                format!("uid={id},gid={id}")
            } else {
                format!("{options},uid={id},gid={id}")
            };
            owned.as_str()
        } else {
            options
        };
        let data = if options.is_empty() {
            None
        } else {
            Some(options)
        };
        self.mount_on(Some(fstype), path, Some(fstype), ms_flags(flags), data)
            .map_err(fail("mount", path))
    }

    fn exists(&mut self, path: &str) -> bool {
        self.resolve(path, OFlags::PATH).is_ok()
    }

    fn read_file(&mut self, path: &str, max: u64) -> Result<FileRead, SetupError> {
        let (parent, name) = self.parent(path).map_err(fail("open parent of", path))?;
        let file = match openat(
            &parent,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(file) => file,
            Err(Errno::NOENT) => return Ok(FileRead::Missing),
            // A symlink or something else: not an account file to amend.
            Err(Errno::LOOP) => return Ok(FileRead::TooLarge),
            Err(e) => return Err(fail("open", path)(e)),
        };
        let stat = rustix::fs::fstat(&file).map_err(fail("stat", path))?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile
            || stat.st_size as u64 > max
        {
            return Ok(FileRead::TooLarge);
        }
        let mut contents = Vec::with_capacity(stat.st_size as usize);
        let mut buf = [0u8; 8192];
        loop {
            let n = rustix::io::read(&file, &mut buf).map_err(fail("read", path))?;
            if n == 0 {
                break;
            }
            contents.extend_from_slice(&buf[..n]);
            if contents.len() as u64 > max {
                return Ok(FileRead::TooLarge);
            }
        }
        Ok(FileRead::Contents(contents))
    }

    fn mask_file(&mut self, path: &str) -> Result<(), SetupError> {
        self.mount_on(Some("/dev/null"), path, None, libc::MS_BIND, None)
            .map_err(fail("mask", path))
    }

    fn read_only(&mut self, path: &str) -> Result<(), SetupError> {
        let target = self
            .resolve(path, OFlags::PATH)
            .map_err(fail("open", path))?;
        let target_path = fd_path(&target);
        raw_mount(
            Some(&target_path),
            &target_path,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )
        .map_err(fail("bind", path))?;
        // The path is now the root of the new bind: seal it and its subtree.
        self.seal_tree(path)
    }

    fn seal_tree(&mut self, path: &str) -> Result<(), SetupError> {
        let tree = self
            .resolve(path, OFlags::PATH)
            .map_err(fail("open", path))?;
        set_mount_attributes(&tree, READ_ONLY_ATTRS, true).map_err(fail("make read-only", path))
    }

    fn seal_mount(&mut self, path: &str) -> Result<(), SetupError> {
        let mount = self
            .resolve(path, OFlags::PATH)
            .map_err(fail("open", path))?;
        set_mount_attributes(&mount, MOUNT_ATTR_RDONLY, false).map_err(fail("make read-only", path))
    }
}

// From <linux/mount.h>; the libc crate does not carry them.
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const READ_ONLY_ATTRS: u64 = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// `struct mount_attr` of mount_setattr(2), version 0.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Sets mount attributes on the mount at `fd` (and every mount below it
/// when `recursive`) with mount_setattr(2): one call for a whole tree.
fn set_mount_attributes(fd: &OwnedFd, attrs: u64, recursive: bool) -> Result<(), Errno> {
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    // SAFETY: `fd` is an open descriptor, the path is an empty C string with
    // AT_EMPTY_PATH, and `attr` is a valid, initialized mount_attr whose size
    // is passed alongside; the kernel only reads it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    zero_or_errno(rc)
}
