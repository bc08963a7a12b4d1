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

pub mod cgroup;
pub mod disk;
pub mod kernel;
pub mod landlock;
pub mod launch;
pub mod net;
pub mod rootfs;
pub mod runtime;
pub mod seccomp;

pub use launch::{Jail, LaunchError};
