//! The `process` isolation tier: everything between the host and a sandboxed
//! process tree, and the only crate of airlock with much `unsafe`.
//!
//! - [`rootfs`]: the root filesystem as a pure plan of setup steps.
//! - [`kernel`]: those steps against the kernel, resolved by descriptor.
//! - [`cgroup`]: memory, CPU and pids limits (v1 and v2), kill and usage.
//! - [`disk`]: writable layers on disk, each a btrfs subvolume under a quota.
//! - [`seccomp`]: the syscall filter, a reviewed table with a test per rule.
//! - [`landlock`]: write confinement to the sandbox's writable paths.
//! - [`runtime`]: uid slots and records that survive a crashed launcher.
//! - [`launch`]: namespaces, the clone, and the idempotent teardown.
//! - `offline_net`: the network namespace of a sandbox without network,
//!   made beside its setup.

pub mod cgroup;
pub mod disk;
pub mod kernel;
pub mod landlock;
pub mod launch;
pub mod loopback;
pub mod net;
mod offline_net;
pub mod priority;
pub mod rootfs;
pub mod runtime;
pub mod seccomp;

pub use launch::{Jail, LaunchError};

use std::io::{self, Read};
use std::path::Path;

/// Pauses between looks at something that usually ends at once (a killed
/// process's exit): 100 us first, doubling to at most 2 ms.
#[derive(Debug)]
pub struct Backoff {
    pause: std::time::Duration,
}

impl Backoff {
    /// The first pause is the shortest.
    pub fn new() -> Backoff {
        Backoff {
            pause: std::time::Duration::from_micros(100),
        }
    }

    /// Sleeps for the current pause and doubles the next (up to 2 ms).
    pub fn sleep(&mut self) {
        std::thread::sleep(self.pause);
        self.pause = (self.pause * 2).min(std::time::Duration::from_millis(2));
    }
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new()
    }
}

/// A small file of procfs, sysfs or cgroupfs as text, read in one go.
///
/// Such files report a size of 0, so `fs::read_to_string` sizes its buffer
/// by probing (reads of 32, 32, 64, 128... bytes: eight system calls for a
/// 1 KiB file, each a trap to the hypervisor on a virtual machine). This
/// reads into 8 KiB at once: one read and the one that says the end.
pub fn read_kernel_text(path: impl AsRef<Path>) -> io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut buffer = vec![0u8; 8192];
    let mut len = 0;
    loop {
        if len == buffer.len() {
            buffer.resize(len * 2, 0);
        }
        match file.read(&mut buffer[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buffer.truncate(len);
    String::from_utf8(buffer).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
