//! A failed request: the protocol error kind and a message for the host.

use airlock_protocol::{ErrorKind, Event};
use std::io;

/// Why a request failed, ready to become a final `Event::Error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) kind: ErrorKind,
    pub(crate) message: String,
}

impl Failure {
    /// A failure with an explicit kind.
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }

    /// A request that makes no sense (bad path, bad id, bad signal ...).
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Failure::new(ErrorKind::InvalidArgument, message)
    }

    /// An OS error while doing `what` (e.g. "cannot read /home/user/a").
    pub(crate) fn io(what: impl std::fmt::Display, error: &io::Error) -> Self {
        Failure::new(kind_of(error), format!("{what}: {}", reason(error)))
    }

    /// The final event that reports this failure.
    pub(crate) fn into_event(self) -> Event {
        Event::Error {
            kind: self.kind,
            message: self.message,
        }
    }
}

/// Maps an OS error onto the stable protocol error kinds.
pub(crate) fn kind_of(error: &io::Error) -> ErrorKind {
    if let Some(errno) = error.raw_os_error() {
        return match errno {
            libc::ENOENT | libc::ESRCH => ErrorKind::NotFound,
            libc::EEXIST => ErrorKind::AlreadyExists,
            libc::EACCES | libc::EPERM | libc::EROFS => ErrorKind::PermissionDenied,
            libc::ENOTDIR => ErrorKind::NotADirectory,
            libc::EISDIR => ErrorKind::IsADirectory,
            libc::ENOTEMPTY => ErrorKind::DirectoryNotEmpty,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ErrorKind::NoSpace,
            libc::EINVAL
            | libc::ENAMETOOLONG
            | libc::ELOOP
            | libc::EXDEV
            | libc::ENXIO
            | libc::E2BIG => ErrorKind::InvalidArgument,
            libc::EBUSY | libc::ETXTBSY => ErrorKind::Busy,
            libc::EPIPE => ErrorKind::Closed,
            _ => ErrorKind::Io,
        };
    }
    match error.kind() {
        io::ErrorKind::NotFound => ErrorKind::NotFound,
        io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
        io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => ErrorKind::InvalidArgument,
        _ => ErrorKind::Io,
    }
}

/// The human part of an OS error, without the "(os error N)" suffix.
pub(crate) fn reason(error: &io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error") {
        Some(end) => text[..end].to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_maps_to_kinds() {
        let cases = [
            (libc::ENOENT, ErrorKind::NotFound),
            (libc::EEXIST, ErrorKind::AlreadyExists),
            (libc::EACCES, ErrorKind::PermissionDenied),
            (libc::EPERM, ErrorKind::PermissionDenied),
            (libc::ENOTDIR, ErrorKind::NotADirectory),
            (libc::EISDIR, ErrorKind::IsADirectory),
            (libc::ENOTEMPTY, ErrorKind::DirectoryNotEmpty),
            (libc::ENOSPC, ErrorKind::NoSpace),
            (libc::EIO, ErrorKind::Io),
        ];
        for (errno, kind) in cases {
            assert_eq!(
                kind_of(&io::Error::from_raw_os_error(errno)),
                kind,
                "{errno}"
            );
        }
    }

    #[test]
    fn message_has_no_errno_suffix() {
        let failure = Failure::io(
            "cannot read /x",
            &io::Error::from_raw_os_error(libc::ENOENT),
        );
        assert_eq!(failure.message, "cannot read /x: No such file or directory");
        assert_eq!(failure.kind, ErrorKind::NotFound);
    }
}
