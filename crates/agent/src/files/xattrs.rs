//! Extended attributes under a `user.` prefix a request names: read into
//! [`FileInfo::xattrs`](airlock_protocol::FileInfo) by `stat`,
//! `list_dir_stream` and a watch's entries, and replaced by `write_file`.
//!
//! Reads are best effort, as the rest of an entry's metadata is: a file
//! whose filesystem has no extended attributes, or whose attributes
//! cannot be read, reports none. Names or values that are not UTF-8 are
//! left out (the protocol carries text), and so is what does not fit
//! [`MAX_XATTR_BYTES`]. Writes fail instead: a write asked to leave
//! attributes on a file either does or says why not.

use crate::failure::{reason, Failure};
use airlock_protocol::{ErrorKind, Xattrs, MAX_XATTR_BYTES};
use rustix::fs::XattrFlags;
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The namespace every prefix must be in: the one whose attributes the
/// owner of a regular file may set without privileges.
const USER_NAMESPACE: &str = "user.";
/// Longest attribute name the kernel takes (`XATTR_NAME_MAX`).
const MAX_NAME: usize = 255;
/// Bytes of names read at first; a file with more is asked for the size.
const FIRST_LIST: usize = 1024;
/// Times the names are read again when they grew between the size query
/// and the read.
const LIST_TRIES: usize = 3;

/// Checks the prefix of the attributes a request names.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), Failure> {
    if !prefix.starts_with(USER_NAMESPACE) || prefix.len() > MAX_NAME || prefix.contains('\0') {
        return Err(Failure::invalid(format!(
            "the attribute prefix {prefix:?} must start with \"user.\" and be at most \
             {MAX_NAME} bytes, without NUL"
        )));
    }
    Ok(())
}

/// Checks the attributes a write is to leave: names under the prefix and
/// within the kernel's bound, and no more than a [`FileInfo`] reports.
///
/// [`FileInfo`]: airlock_protocol::FileInfo
pub(crate) fn check(set: &Xattrs) -> Result<(), Failure> {
    check_prefix(&set.prefix)?;
    let mut total = 0usize;
    for (name, value) in &set.attrs {
        if !name.starts_with(&set.prefix)
            || name.len() == set.prefix.len()
            || name.len() > MAX_NAME
            || name.contains('\0')
        {
            return Err(Failure::invalid(format!(
                "the attribute name {name:?} must be longer than its prefix {:?}, start \
                 with it and be at most {MAX_NAME} bytes, without NUL",
                set.prefix
            )));
        }
        total += name.len() + value.len();
    }
    if total > MAX_XATTR_BYTES {
        return Err(Failure::invalid(format!(
            "the attributes of a file may hold at most {MAX_XATTR_BYTES} bytes of names \
             and values, not {total}"
        )));
    }
    Ok(())
}

/// The attribute names `list` reads (NUL-separated), asking `size` for the
/// room they need when the first read is too small.
fn names(
    list: impl Fn(&mut [u8]) -> Result<usize, Errno>,
    size: impl Fn() -> Result<usize, Errno>,
) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; FIRST_LIST];
    for _ in 0..LIST_TRIES {
        match list(&mut buf) {
            Ok(len) => {
                buf.truncate(len);
                return Ok(buf);
            }
            Err(Errno::RANGE) => {
                let wanted = size()?.max(buf.len() * 2);
                buf.resize(wanted, 0);
            }
            Err(errno) => return Err(errno),
        }
    }
    Err(Errno::RANGE)
}

/// Each name of a NUL-separated list.
fn each(names: &[u8]) -> impl Iterator<Item = &[u8]> {
    names
        .split(|byte| *byte == 0)
        .filter(|name| !name.is_empty())
}

/// The attributes of `path` (through a symlink to its target) whose names
/// start with `prefix`: full names to values, UTF-8 only, at most
/// [`MAX_XATTR_BYTES`] of them. Blocking.
pub(crate) fn read(path: &Path, prefix: &str) -> BTreeMap<String, String> {
    read_within(path, prefix, MAX_XATTR_BYTES)
}

/// [`read`] with at most `budget` bytes of names and values.
fn read_within(path: &Path, prefix: &str, budget: usize) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let Ok(list) = names(
        |buf| rustix::fs::listxattr(path, buf),
        || rustix::fs::listxattr_query(path),
    ) else {
        return found;
    };
    let mut left = budget;
    for raw in each(&list) {
        let Ok(name) = std::str::from_utf8(raw) else {
            continue;
        };
        // A value must fit what is left after its name (and an empty
        // buffer would ask for the size instead of the value).
        if !name.starts_with(prefix) || name.len() >= left {
            continue;
        }
        let mut value = vec![0u8; left - name.len()];
        // ERANGE: larger than what is left, so left out; ENODATA: removed
        // since the list was read.
        let Ok(len) = rustix::fs::getxattr(path, name, &mut value[..]) else {
            continue;
        };
        value.truncate(len);
        let Ok(value) = String::from_utf8(value) else {
            continue;
        };
        left -= name.len() + value.len();
        found.insert(name.to_owned(), value);
    }
    found
}

/// Whether the filesystem of `path` (not a symlink) may hold attributes
/// under `prefix`: false only when it says it has none (`EOPNOTSUPP` for a
/// name it would otherwise lack, as gVisor's gofer answers where
/// `listxattr` answers an empty list at the cost of a round trip).
/// Blocking.
pub(crate) fn supported(path: &Path, prefix: &str) -> bool {
    !matches!(
        rustix::fs::getxattr(path, prefix, &mut [0u8; 1][..]),
        Err(errno) if unsupported(errno)
    )
}

/// Whether an error says the filesystem has no extended attributes.
fn unsupported(errno: Errno) -> bool {
    errno == Errno::OPNOTSUPP || errno == Errno::NOTSUP
}

/// The failure of setting or removing attribute `name` of `shown`.
fn set_failure(shown: &str, name: &str, errno: Errno) -> Failure {
    let error = io::Error::from(errno);
    let what = format!("cannot set the extended attribute {name} of {shown}");
    if unsupported(errno) {
        return Failure::new(
            ErrorKind::Unsupported,
            format!("{what}: its filesystem does not support user extended attributes"),
        );
    }
    if errno == Errno::TOOBIG || errno == Errno::RANGE {
        return Failure::new(
            ErrorKind::NoSpace,
            format!(
                "{what}: its filesystem has no room for it ({})",
                reason(&error)
            ),
        );
    }
    Failure::io(what, &error)
}

/// Leaves `file` with exactly the attributes of `set` under its prefix.
/// With none to set, a filesystem without attributes has nothing to
/// clear. Blocking.
pub(crate) fn replace(file: &File, set: &Xattrs, shown: &str) -> Result<(), Failure> {
    let list = match names(
        |buf| rustix::fs::flistxattr(file, buf),
        || rustix::fs::flistxattr_query(file),
    ) {
        Ok(list) => list,
        Err(errno) if unsupported(errno) && set.attrs.is_empty() => return Ok(()),
        Err(errno) if unsupported(errno) => {
            let name = set.attrs.keys().next().map_or("", String::as_str);
            return Err(set_failure(shown, name, errno));
        }
        Err(errno) => {
            return Err(Failure::io(
                format!("cannot list the extended attributes of {shown}"),
                &io::Error::from(errno),
            ))
        }
    };
    for raw in each(&list) {
        let keep = std::str::from_utf8(raw).is_ok_and(|name| set.attrs.contains_key(name));
        if !raw.starts_with(set.prefix.as_bytes()) || keep {
            continue;
        }
        match rustix::fs::fremovexattr(file, OsStr::from_bytes(raw)) {
            Ok(()) | Err(Errno::NODATA) => {}
            Err(errno) => {
                let name = String::from_utf8_lossy(raw);
                return Err(set_failure(shown, &name, errno));
            }
        }
    }
    for (name, value) in &set.attrs {
        rustix::fs::fsetxattr(file, name.as_str(), value.as_bytes(), XattrFlags::empty())
            .map_err(|errno| set_failure(shown, name, errno))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn set(prefix: &str, attrs: &[(&str, &str)]) -> Xattrs {
        Xattrs {
            prefix: prefix.into(),
            attrs: attrs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn prefixes_and_names_are_checked() {
        assert!(check_prefix("user.e2b.").is_ok());
        for bad in ["trusted.x.", "security.", "", "user.\0"] {
            assert_eq!(
                check_prefix(bad).unwrap_err().kind,
                ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
        assert!(check(&set("user.p.", &[("user.p.a", "1")])).is_ok());
        for bad in [
            set("user.p.", &[("user.q.a", "1")]),
            set("user.p.", &[("user.p.", "1")]),
            set("user.p.", &[(&format!("user.p.{}", "k".repeat(250)), "1")]),
            set("user.p.", &[("user.p.a", &"v".repeat(MAX_XATTR_BYTES))]),
        ] {
            assert_eq!(check(&bad).unwrap_err().kind, ErrorKind::InvalidArgument);
        }
    }

    #[test]
    fn a_write_replaces_the_attributes_under_its_prefix_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        rustix::fs::fsetxattr(&file, "user.other", b"kept", XattrFlags::empty()).unwrap();
        let first = set("user.p.", &[("user.p.a", "1"), ("user.p.b", "2")]);
        replace(&file, &first, "f").unwrap();
        assert_eq!(read(&path, "user.p."), first.attrs);
        replace(&file, &set("user.p.", &[("user.p.b", "3")]), "f").unwrap();
        assert_eq!(
            read(&path, "user.p."),
            BTreeMap::from([("user.p.b".to_owned(), "3".to_owned())])
        );
        replace(&file, &set("user.p.", &[]), "f").unwrap();
        assert!(read(&path, "user.p.").is_empty());
        assert_eq!(
            read(&path, "user."),
            BTreeMap::from([("user.other".to_owned(), "kept".to_owned())])
        );
    }

    #[test]
    fn filesystems_with_attributes_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        assert!(supported(dir.path(), "user.p."));
        // procfs has no user attributes.
        assert!(!supported(Path::new("/proc/self/comm"), "user.p."));
    }

    #[test]
    fn reads_leave_out_what_is_not_text_or_does_not_fit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        rustix::fs::setxattr(&path, "user.p.bin", b"\xff\xfe", XattrFlags::empty()).unwrap();
        rustix::fs::setxattr(&path, "user.p.ok", b"fine", XattrFlags::empty()).unwrap();
        rustix::fs::setxattr(&path, "user.p.big", &[b'v'; 100], XattrFlags::empty()).unwrap();
        assert_eq!(
            read_within(&path, "user.p.", 64),
            BTreeMap::from([("user.p.ok".to_owned(), "fine".to_owned())])
        );
        assert_eq!(read(&path, "user.p.").len(), 2);
        // Through a symlink, to its target.
        std::os::unix::fs::symlink(&path, dir.path().join("link")).unwrap();
        assert_eq!(read(&dir.path().join("link"), "user.p.").len(), 2);
        assert!(read(&dir.path().join("missing"), "user.p.").is_empty());
    }
}
