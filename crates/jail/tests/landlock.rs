//! Landlock write confinement against the running kernel.
//!
//! Each test prepares directories in the test process, then forks a child
//! that sets no_new_privs, restricts itself and checks what it can still do.
//! The child reports a failure as text through a shared page and exits; the
//! test process itself is never restricted. Landlock needs no privileges, and
//! it confines root just the same, so these pass as root and as any user.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

use airlock_jail::landlock::{
    kernel_support, restrict_writes, KernelSupport, LandlockCompat, LandlockError, LandlockStatus,
};

// -------------------------------------------------------------------------
// Harness.

const PAGE: usize = 4096;

/// A page shared between the test process and its forked child.
struct Shared {
    ptr: *mut u8,
}

impl Shared {
    fn new() -> Self {
        // SAFETY: an anonymous shared mapping of one fresh page; no existing
        // memory is touched and the result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap: {}",
            io::Error::last_os_error()
        );
        Shared { ptr: ptr.cast() }
    }

    /// Stores `text` (truncated to fit) as a length-prefixed string.
    fn write(&self, text: &str) {
        let bytes = &text.as_bytes()[..text.len().min(PAGE - 2)];
        let len = u16::try_from(bytes.len()).unwrap().to_ne_bytes();
        // SAFETY: the page is PAGE bytes long and mapped until `drop`; we
        // write 2 + at most PAGE - 2 bytes from its start, from buffers that
        // cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(len.as_ptr(), self.ptr, 2);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(2), bytes.len());
        }
    }

    fn read(&self) -> String {
        // SAFETY: the page is mapped until `drop`, and a child that has
        // exited no longer writes to it; `write` keeps the length in bounds.
        let bytes = unsafe {
            let len = u16::from_ne_bytes([*self.ptr, *self.ptr.add(1)]);
            std::slice::from_raw_parts(self.ptr.add(2), usize::from(len).min(PAGE - 2))
        };
        String::from_utf8_lossy(bytes).into_owned()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the page mapped in `new`; nothing borrowed
        // from it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), PAGE) };
    }
}

/// Runs `check` in a forked child with no_new_privs set and returns its
/// verdict. glibc keeps malloc usable after fork, so the child may allocate.
fn in_child(check: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    let shared = Shared::new();
    shared.write("the child ended without a verdict");
    // SAFETY: the child runs `check` and leaves through `_exit`; it never
    // returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        let verdict = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: PR_SET_NO_NEW_PRIVS takes integers only.
            if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                return Err(format!("no_new_privs: {}", io::Error::last_os_error()));
            }
            check()
        }));
        let code = match verdict {
            Ok(Ok(())) => 0,
            Ok(Err(message)) => {
                shared.write(&message);
                1
            }
            Err(_) => {
                shared.write("the check panicked");
                2
            }
        };
        // SAFETY: ends the child at once, without running destructors or
        // atexit handlers of state it shares with the test process.
        unsafe { libc::_exit(code) }
    }
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer and `pid` is our child.
    while unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EINTR));
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(shared.read())
    }
}

/// Expects `result` to fail with one of `errnos`.
fn denied<T>(what: &str, result: io::Result<T>, errnos: &[i32]) -> Result<(), String> {
    match result {
        Ok(_) => Err(format!("{what}: succeeded, want it denied")),
        Err(e) if errnos.contains(&e.raw_os_error().unwrap_or(0)) => Ok(()),
        Err(e) => Err(format!("{what}: failed with {e}, want {errnos:?}")),
    }
}

fn allowed<T>(what: &str, result: io::Result<T>) -> Result<(), String> {
    result.map(drop).map_err(|e| format!("{what}: {e}"))
}

fn full(writable: &[&Path]) -> Result<(), String> {
    match restrict_writes(writable, LandlockCompat::Required) {
        Ok(LandlockStatus::Full) => Ok(()),
        other => Err(format!("restrict_writes: {other:?}")),
    }
}

fn mkfifo(path: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that lives across the call.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// These tests assert full enforcement; they need Landlock ABI 3. Without
/// it they fail loudly rather than pass vacuously.
fn kernel_has_abi_3() -> bool {
    match kernel_support() {
        KernelSupport::Abi(v) if v >= 3 => true,
        other => {
            panic!("these tests need Landlock ABI 3 or later in the kernel; this one has {other}")
        }
    }
}

const EACCES: i32 = libc::EACCES;
const EXDEV: i32 = libc::EXDEV;

// -------------------------------------------------------------------------
// Tests.

#[test]
fn writes_inside_work_and_writes_elsewhere_fail() {
    if !kernel_has_abi_3() {
        return;
    }
    let inside = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("existing"), b"before").unwrap();
    let (i, o) = (inside.path(), outside.path());

    in_child(|| {
        full(&[i])?;
        // Inside: create, write, mkdir, symlink, fifo, remove.
        allowed("create inside", fs::write(i.join("new"), b"x"))?;
        allowed("mkdir inside", fs::create_dir(i.join("dir")))?;
        allowed("write below a new dir", fs::write(i.join("dir/deep"), b"x"))?;
        allowed("symlink inside", symlink("new", i.join("link")))?;
        allowed("mkfifo inside", mkfifo(&i.join("fifo")))?;
        allowed("unlink inside", fs::remove_file(i.join("link")))?;
        // Outside: every kind of creation and change is EACCES.
        denied("create outside", fs::write(o.join("new"), b"x"), &[EACCES])?;
        denied("mkdir outside", fs::create_dir(o.join("dir")), &[EACCES])?;
        denied("symlink outside", symlink("x", o.join("link")), &[EACCES])?;
        denied("mkfifo outside", mkfifo(&o.join("fifo")), &[EACCES])?;
        denied(
            "unlink outside",
            fs::remove_file(o.join("existing")),
            &[EACCES],
        )?;
        // Reading is not restricted.
        match fs::read(o.join("existing")) {
            Ok(bytes) if bytes == b"before" => Ok(()),
            other => Err(format!("reading outside: {other:?}")),
        }
    })
    .unwrap();
    assert!(!o.join("new").exists() && o.join("existing").exists());
}

#[test]
fn existing_files_outside_cannot_be_opened_for_writing_or_truncated() {
    if !kernel_has_abi_3() {
        return;
    }
    let inside = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    fs::write(&victim, b"keep me").unwrap();
    let i = inside.path();
    let v = victim.as_path();

    in_child(|| {
        full(&[i])?;
        denied(
            "open outside for writing",
            OpenOptions::new().write(true).open(v),
            &[EACCES],
        )?;
        denied(
            "open outside for append",
            OpenOptions::new().append(true).open(v),
            &[EACCES],
        )?;
        // truncate(2) by path: the Truncate right.
        let c = std::ffi::CString::new(v.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that lives across the call.
        let rc = unsafe { libc::truncate(c.as_ptr(), 0) };
        let result = if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
        denied("truncate outside", result, &[EACCES])?;
        allowed("open outside for reading", fs::File::open(v))
    })
    .unwrap();
    assert_eq!(fs::read(&victim).unwrap(), b"keep me");
}

#[test]
fn files_cannot_be_moved_or_linked_out_of_the_writable_tree() {
    if !kernel_has_abi_3() {
        return;
    }
    let inside = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::create_dir(inside.path().join("a")).unwrap();
    fs::create_dir(inside.path().join("b")).unwrap();
    fs::write(inside.path().join("a/file"), b"x").unwrap();
    fs::write(outside.path().join("foreign"), b"y").unwrap();
    let (i, o) = (inside.path(), outside.path());

    in_child(|| {
        full(&[i])?;
        // Out of the tree: Refer (EXDEV) or the missing Make* right (EACCES).
        denied(
            "rename inside → outside",
            fs::rename(i.join("a/file"), o.join("file")),
            &[EACCES, EXDEV],
        )?;
        denied(
            "link inside → outside",
            fs::hard_link(i.join("a/file"), o.join("file")),
            &[EACCES, EXDEV],
        )?;
        denied(
            "rename outside → inside",
            fs::rename(o.join("foreign"), i.join("foreign")),
            &[EACCES, EXDEV],
        )?;
        // Within the tree, across directories: needs Refer, which is granted.
        allowed(
            "rename a/ → b/",
            fs::rename(i.join("a/file"), i.join("b/file")),
        )?;
        allowed(
            "link b/ → a/",
            fs::hard_link(i.join("b/file"), i.join("a/again")),
        )
    })
    .unwrap();
    assert!(!o.join("file").exists());
    assert!(o.join("foreign").exists());
}

#[test]
fn a_file_rule_allows_that_file_only() {
    if !kernel_has_abi_3() {
        return;
    }
    let inside = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let allowed_file = other.path().join("allowed");
    let sibling = other.path().join("sibling");
    fs::write(&allowed_file, b"old").unwrap();
    fs::write(&sibling, b"old").unwrap();
    let (i, a, s, dir) = (
        inside.path(),
        allowed_file.as_path(),
        sibling.as_path(),
        other.path(),
    );
    let devnull = Path::new("/dev/null");

    in_child(|| {
        full(&[i, a, devnull])?;
        let mut file = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(a)
            .map_err(|e| format!("open the allowed file: {e}"))?;
        allowed("write the allowed file", file.write_all(b"new"))?;
        allowed("write /dev/null", fs::write(devnull, b"discarded"))?;
        denied(
            "write the sibling",
            OpenOptions::new().write(true).open(s),
            &[EACCES],
        )?;
        denied(
            "create next to the allowed file",
            fs::write(dir.join("new"), b"x"),
            &[EACCES],
        )?;
        // The file's own rule does not cover its directory's rights.
        denied("unlink the allowed file", fs::remove_file(a), &[EACCES])?;
        denied(
            "write /dev/zero",
            OpenOptions::new().write(true).open("/dev/zero"),
            &[EACCES],
        )
    })
    .unwrap();
    assert_eq!(fs::read(&allowed_file).unwrap(), b"new");
    assert_eq!(fs::read(&sibling).unwrap(), b"old");
}

#[test]
fn the_restriction_is_inherited_across_fork_and_exec() {
    if !kernel_has_abi_3() {
        return;
    }
    let inside = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let (i, o) = (inside.path(), outside.path());

    in_child(|| {
        // /dev/null too: spawning with a null stderr opens it for writing.
        full(&[i, Path::new("/dev/null")])?;
        // A shell (fork + exec) writes one file inside and one outside.
        let sh_write = |path: &Path| {
            Command::new("/bin/sh")
                .args(["-c", "echo x > \"$1\"", "sh"])
                .arg(path)
                .stderr(std::process::Stdio::null())
                .status()
                .map_err(|e| format!("/bin/sh: {e}"))
        };
        if !sh_write(&i.join("in"))?.success() {
            return Err("the shell could not write inside".into());
        }
        if sh_write(&o.join("out"))?.success() {
            return Err("the shell wrote outside".into());
        }
        Ok(())
    })
    .unwrap();
    assert!(i.join("in").exists());
    assert!(!o.join("out").exists());
}

#[test]
fn nothing_is_writable_without_rules() {
    if !kernel_has_abi_3() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    in_child(|| {
        full(&[])?;
        denied("create anywhere", fs::write(d.join("x"), b"x"), &[EACCES])
    })
    .unwrap();
}

#[test]
fn a_missing_writable_path_is_an_error_and_restricts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let missing = d.join("missing");
    let m = missing.as_path();
    in_child(|| {
        match restrict_writes(&[m], LandlockCompat::UnsafeBestEffort) {
            Err(LandlockError::OpenPath { path, .. }) if path == m => {}
            other => return Err(format!("restrict_writes: {other:?}")),
        }
        allowed(
            "write after the failed call",
            fs::write(d.join("still"), b"x"),
        )
    })
    .unwrap();
}

#[test]
fn best_effort_reports_what_the_kernel_enforces() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let expected = kernel_support().write_status();
    in_child(
        || match restrict_writes(&[d], LandlockCompat::UnsafeBestEffort) {
            Ok(status) if status == expected => Ok(()),
            other => Err(format!("restrict_writes: {other:?}, want Ok({expected:?})")),
        },
    )
    .unwrap();
}

#[test]
fn required_fails_exactly_when_the_kernel_falls_short() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kernel = kernel_support();
    in_child(|| {
        match (
            kernel.write_status(),
            restrict_writes(&[d], LandlockCompat::Required),
        ) {
            (LandlockStatus::Full, Ok(LandlockStatus::Full)) => Ok(()),
            (
                status,
                Err(LandlockError::NotFullyEnforced {
                    status: reported, ..
                }),
            ) if status != LandlockStatus::Full && reported == status => Ok(()),
            (status, other) => Err(format!(
                "kernel {kernel} ({status:?}): restrict_writes gave {other:?}"
            )),
        }
    })
    .unwrap();
}

/// The launch order: no_new_privs → seccomp → landlock. The seccomp filter
/// must leave the Landlock syscalls alone.
#[cfg(target_arch = "x86_64")]
#[test]
fn landlock_works_under_the_seccomp_filter() {
    if !kernel_has_abi_3() {
        return;
    }
    let program = airlock_jail::seccomp::sandbox_filter().unwrap();
    let inside = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let (i, o) = (inside.path(), outside.path());
    in_child(|| {
        airlock_jail::seccomp::install(&program).map_err(|e| format!("seccomp: {e}"))?;
        full(&[i])?;
        allowed("create inside", fs::write(i.join("x"), b"x"))?;
        denied("create outside", fs::write(o.join("x"), b"x"), &[EACCES])
    })
    .unwrap();
}
