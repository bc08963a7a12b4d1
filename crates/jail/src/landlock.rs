//! Write confinement with Landlock: the sandbox may write only beneath the
//! paths the launch plan marks writable.
//!
//! [`restrict_writes`] runs in the sandbox's init, after the seccomp filter
//! and right before the agent is exec'd (no_new_privs → seccomp → landlock →
//! exec). It restricts the calling thread; the restriction is inherited by
//! every child and survives `execve`, and nothing inside can lift it.
//!
//! Only *write-type* rights are handled, so reading and executing stay
//! governed by the mount namespace alone, which already decides what exists.
//! The handled set is that of Landlock ABI 3, [`AccessFs::from_write`] of
//! [`TARGET_ABI`]: `WriteFile`, `RemoveDir`, `RemoveFile`, the nine `Make*`
//! rights, `Refer` (ABI 2: link or rename across directories) and `Truncate`
//! (ABI 3). Two rights that later ABIs count as "write" are left out on
//! purpose: `IoctlDev` (ABI 5) would forbid ioctls on every device outside
//! the writable paths (terminals included), and `ResolveUnix` (ABI 9) governs
//! connecting to Unix sockets, not writing. On older kernels the `landlock`
//! crate handles the subset the kernel knows and reports partial enforcement.
//!
//! `landlock_restrict_self` requires `no_new_privs` (or `CAP_SYS_ADMIN`). The
//! caller sets it first as part of the launch order; the `landlock` crate
//! sets it again before restricting, which is idempotent.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use landlock::{
    AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, ABI,
};

/// The Landlock ABI whose write rights are handled: 3, the first with both
/// `Refer` and `Truncate`.
pub const TARGET_ABI: ABI = ABI::V3;

/// The same ABI as a number, for the kernel probe.
const TARGET_ABI_VERSION: u32 = 3;

/// What to do when the kernel cannot fully enforce the write rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockCompat {
    /// Fail unless every handled right is enforced. The default.
    Required,
    /// Enforce what the kernel supports and report how much that was; the
    /// caller logs it. Writes may then be unconfined.
    UnsafeBestEffort,
}

/// How much of the write confinement the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockStatus {
    /// Nothing: Landlock is missing or disabled.
    NotEnforced,
    /// Some rights: the kernel's Landlock ABI is older than [`TARGET_ABI`]
    /// (ABI 1 lacks `Refer`, but forbids cross-directory links and renames
    /// outright; ABIs 1 and 2 lack `Truncate`).
    Partial,
    /// Every handled right.
    Full,
}

impl fmt::Display for LandlockStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LandlockStatus::NotEnforced => "not confined",
            LandlockStatus::Partial => "only partly confined",
            LandlockStatus::Full => "fully confined",
        })
    }
}

/// Landlock support of the running kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSupport {
    /// The kernel is built without Landlock (`ENOSYS`).
    NotBuilt,
    /// Landlock is built in but not enabled at boot (`EOPNOTSUPP`).
    Disabled,
    /// Landlock is enabled with this ABI version.
    Abi(u32),
}

impl KernelSupport {
    /// The confinement [`restrict_writes`] achieves on such a kernel.
    pub fn write_status(self) -> LandlockStatus {
        match self {
            KernelSupport::NotBuilt | KernelSupport::Disabled => LandlockStatus::NotEnforced,
            KernelSupport::Abi(version) if version >= TARGET_ABI_VERSION => LandlockStatus::Full,
            KernelSupport::Abi(_) => LandlockStatus::Partial,
        }
    }
}

impl fmt::Display for KernelSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelSupport::NotBuilt => f.write_str("the kernel is built without Landlock"),
            KernelSupport::Disabled => {
                f.write_str("Landlock is not enabled at boot (it is missing from the lsm= list)")
            }
            KernelSupport::Abi(version) => write!(f, "the kernel has Landlock ABI {version}"),
        }
    }
}

/// Errors of [`restrict_writes`].
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// [`LandlockCompat::Required`] and the kernel cannot fully enforce.
    #[error("Landlock write confinement is required, but {kernel}; full confinement needs ABI {TARGET_ABI_VERSION} or later, so writes would be {status}")]
    NotFullyEnforced {
        /// What the kernel offers.
        kernel: KernelSupport,
        /// What would be (or was) enforced.
        status: LandlockStatus,
    },
    /// A writable path could not be opened.
    #[error("could not open the writable path {path}")]
    OpenPath {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: landlock::PathFdError,
    },
    /// A writable path could not be inspected.
    #[error("could not inspect the writable path {path}")]
    StatPath {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Building or applying the ruleset failed.
    #[error("could not build or apply the Landlock ruleset")]
    Ruleset(#[source] landlock::RulesetError),
}

/// Asks the kernel for its Landlock ABI version.
pub fn kernel_support() -> KernelSupport {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    // is the documented version query: the kernel reads no attribute (size 0),
    // creates no descriptor and returns the ABI version or an error.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if version >= 0 {
        return KernelSupport::Abi(u32::try_from(version).unwrap_or(u32::MAX));
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EOPNOTSUPP) => KernelSupport::Disabled,
        _ => KernelSupport::NotBuilt,
    }
}

/// `LANDLOCK_CREATE_RULESET_VERSION` from `<linux/landlock.h>`.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;

/// The handled rights: every write right of [`TARGET_ABI`].
fn write_access() -> BitFlags<AccessFs> {
    AccessFs::from_write(TARGET_ABI)
}

/// Restricts the calling thread (and so everything it later forks or execs)
/// to writing beneath `writable`.
///
/// A directory grants every handled right beneath it; a non-directory (a
/// file, or a device such as `/dev/null`) grants the rights that apply to
/// files, `WriteFile` and `Truncate`, to that file only — it can be written
/// but not removed or replaced, since that is a right of its directory.
/// Every path must exist: a missing one is an error, not silently dropped.
///
/// With [`LandlockCompat::Required`], a kernel that cannot enforce every
/// handled right is an error before anything is restricted; should the
/// result still fall short (which the probe rules out), the error comes after
/// restricting and the caller must not go on to exec. With
/// [`LandlockCompat::UnsafeBestEffort`], whatever the kernel enforces is
/// applied and reported.
///
/// Requires `no_new_privs` (see the module docs); must run single threaded,
/// since only the calling thread is restricted.
pub fn restrict_writes(
    writable: &[&Path],
    compat: LandlockCompat,
) -> Result<LandlockStatus, LandlockError> {
    let kernel = kernel_support();
    if compat == LandlockCompat::Required && kernel.write_status() != LandlockStatus::Full {
        return Err(LandlockError::NotFullyEnforced {
            kernel,
            status: kernel.write_status(),
        });
    }

    let access = write_access();
    let file_access = access & AccessFs::from_file(TARGET_ABI);
    let mut rules = Vec::with_capacity(writable.len());
    for &path in writable {
        let fd = PathFd::new(path).map_err(|source| LandlockError::OpenPath {
            path: path.to_path_buf(),
            source,
        })?;
        let stat = rustix::fs::fstat(&fd).map_err(|errno| LandlockError::StatPath {
            path: path.to_path_buf(),
            source: errno.into(),
        })?;
        let is_dir = rustix::fs::FileType::from_raw_mode(stat.st_mode).is_dir();
        rules.push(PathBeneath::new(
            fd,
            if is_dir { access } else { file_access },
        ));
    }

    let level = match compat {
        LandlockCompat::Required => CompatLevel::HardRequirement,
        LandlockCompat::UnsafeBestEffort => CompatLevel::BestEffort,
    };
    let mut ruleset = Ruleset::default()
        .set_compatibility(level)
        .handle_access(access)
        .and_then(Ruleset::create)
        .map_err(LandlockError::Ruleset)?;
    for rule in rules {
        ruleset = ruleset.add_rule(rule).map_err(LandlockError::Ruleset)?;
    }
    let restricted = ruleset.restrict_self().map_err(LandlockError::Ruleset)?;

    let status = match restricted.ruleset {
        RulesetStatus::FullyEnforced => LandlockStatus::Full,
        RulesetStatus::PartiallyEnforced => LandlockStatus::Partial,
        RulesetStatus::NotEnforced => LandlockStatus::NotEnforced,
    };
    if compat == LandlockCompat::Required && status != LandlockStatus::Full {
        return Err(LandlockError::NotFullyEnforced { kernel, status });
    }
    Ok(status)
}

/// Takes every filesystem right of [`TARGET_ABI`] (reads and executes as
/// well as writes) from the calling thread and the threads and processes it
/// makes from now on: for a process that needs no file once it runs, such
/// as the egress worker. Requires `no_new_privs`; best effort on kernels
/// without Landlock (the status says what was enforced).
pub fn forbid_filesystem() -> Result<LandlockStatus, LandlockError> {
    let restricted = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(<AccessFs as landlock::Access>::from_all(TARGET_ABI))
        .and_then(Ruleset::create)
        .and_then(|ruleset| ruleset.restrict_self())
        .map_err(LandlockError::Ruleset)?;
    Ok(match restricted.ruleset {
        RulesetStatus::FullyEnforced => LandlockStatus::Full,
        RulesetStatus::PartiallyEnforced => LandlockStatus::Partial,
        RulesetStatus::NotEnforced => LandlockStatus::NotEnforced,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    //! Pure checks; the behaviour under a real kernel is tested in
    //! `tests/landlock.rs`, in forked children.

    use super::*;
    use landlock::make_bitflags;

    #[test]
    fn handles_exactly_the_write_rights_of_abi_3() {
        let expected = make_bitflags!(AccessFs::{
            WriteFile | RemoveDir | RemoveFile | MakeChar | MakeDir | MakeReg | MakeSock
                | MakeFifo | MakeBlock | MakeSym | Refer | Truncate
        });
        assert_eq!(write_access(), expected);
        assert!(!write_access().contains(AccessFs::ReadFile));
        assert!(!write_access().contains(AccessFs::Execute));
        assert!(!write_access().contains(AccessFs::IoctlDev));
    }

    #[test]
    fn files_get_write_and_truncate_only() {
        let file_access = write_access() & AccessFs::from_file(TARGET_ABI);
        assert_eq!(file_access, AccessFs::WriteFile | AccessFs::Truncate);
    }

    #[test]
    fn status_follows_the_kernel_abi() {
        assert_eq!(
            KernelSupport::NotBuilt.write_status(),
            LandlockStatus::NotEnforced
        );
        assert_eq!(
            KernelSupport::Disabled.write_status(),
            LandlockStatus::NotEnforced
        );
        assert_eq!(
            KernelSupport::Abi(1).write_status(),
            LandlockStatus::Partial
        );
        assert_eq!(
            KernelSupport::Abi(2).write_status(),
            LandlockStatus::Partial
        );
        assert_eq!(KernelSupport::Abi(3).write_status(), LandlockStatus::Full);
        assert_eq!(KernelSupport::Abi(7).write_status(), LandlockStatus::Full);
    }

    #[test]
    fn errors_say_what_is_missing() {
        let err = LandlockError::NotFullyEnforced {
            kernel: KernelSupport::Abi(2),
            status: LandlockStatus::Partial,
        };
        assert_eq!(
            err.to_string(),
            "Landlock write confinement is required, but the kernel has Landlock ABI 2; \
             full confinement needs ABI 3 or later, so writes would be only partly confined"
        );
    }
}
