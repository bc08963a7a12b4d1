//! The files through which the daemon and a supervisor share a sandbox's
//! deadline and its ending, beside the supervisor's socket in the daemon's
//! directory under `/run/airlock/sockets` (root's, mode 0600, in the host's
//! mount namespace: no path inside a sandbox leads there).
//!
//! - `<id>.deadline`: when the supervisor ends the sandbox on its own, in
//!   unix milliseconds, one decimal number. Written by the daemon (a new
//!   file renamed over the old, so a reader never sees half of one), then
//!   the supervisor is nudged with [`NUDGE`]; the supervisor also reads it
//!   again before it acts. Until the file exists, or when it cannot be
//!   read, the supervisor keeps the last deadline it knew, at first its
//!   launch plus the spec's timeout: it never runs without one.
//! - `<id>.ended`: the supervisor's exit code, written before it exits, so
//!   a daemon that is not its parent (it adopted the sandbox, or started
//!   after the sandbox ended) still learns how it ended.
//!
//! The deadline is whichever applies to the sandbox now: a running
//! sandbox's `expires_at` today; a paused sandbox's TTL goes through the
//! same file once pausing exists.

use crate::Ending;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long after its deadline a supervisor waits before it ends the
/// sandbox itself: long enough that a running daemon's reaper (which looks
/// every 100 ms) acts first and records the timeout with its audit event.
pub const GRACE: Duration = Duration::from_secs(3);

/// The signal that tells a supervisor to read its deadline again. Its
/// default action is to ignore it, so a supervisor of an older build that
/// installed no handler is not killed by it.
pub const NUDGE: rustix::process::Signal = rustix::process::Signal::WINCH;

/// Supervisor exit code: it ended the sandbox at its deadline.
pub const EXIT_SANDBOX_EXPIRED: i32 = 5;
/// Supervisor exit code: the agent died with the OOM killer active.
pub const EXIT_SANDBOX_OOM: i32 = 3;
/// Supervisor exit code: the agent died otherwise.
pub const EXIT_SANDBOX_DIED: i32 = 4;

/// The deadline file of the sandbox served on `socket`.
pub fn deadline_file(socket: &Path) -> PathBuf {
    socket.with_extension("deadline")
}

/// The ending file of the sandbox served on `socket`.
pub fn ending_file(socket: &Path) -> PathBuf {
    socket.with_extension("ended")
}

/// Every file of the sandbox served on `socket`, the socket included.
pub fn files_of(socket: &Path) -> [PathBuf; 4] {
    [
        socket.to_owned(),
        deadline_file(socket),
        socket.with_extension("deadline.new"),
        ending_file(socket),
    ]
}

/// The sandbox id a file of this directory belongs to, if it is one.
pub fn id_of_file(name: &str) -> Option<&str> {
    [".sock", ".deadline", ".deadline.new", ".ended"]
        .into_iter()
        .find_map(|suffix| name.strip_suffix(suffix))
}

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Replaces the deadline in `file` (a whole new file renamed over it).
pub fn write_deadline(file: &Path, at_ms: i64) -> std::io::Result<()> {
    let fresh = file.with_extension("deadline.new");
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&fresh)?;
    out.write_all(at_ms.to_string().as_bytes())?;
    drop(out);
    std::fs::rename(&fresh, file)
}

/// The deadline in `file`; `None` when it is missing or not a deadline.
pub fn read_deadline(file: &Path) -> Option<i64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Leaves the supervisor's exit code in `file` (best effort: without it a
/// later daemon knows only that the sandbox is gone).
pub fn write_ending(file: &Path, code: u8) {
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(file)
        .and_then(|mut out| out.write_all(code.to_string().as_bytes()));
}

/// How a supervisor that left `file` ended, if it did.
pub fn read_ending(file: &Path) -> Option<Ending> {
    let code: i32 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    Some(ending_of(code))
}

/// How the sandbox ended, by its supervisor's exit code.
pub fn ending_of(code: i32) -> Ending {
    match code {
        0 => Ending::Stopped,
        EXIT_SANDBOX_OOM => Ending::Oom,
        EXIT_SANDBOX_EXPIRED => Ending::Expired,
        _ => Ending::Crashed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_and_endings_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sbx-1.sock");
        let file = deadline_file(&socket);
        assert_eq!(read_deadline(&file), None, "missing");
        write_deadline(&file, 1_700_000_000_123).unwrap();
        assert_eq!(read_deadline(&file), Some(1_700_000_000_123));
        write_deadline(&file, 42).unwrap();
        assert_eq!(read_deadline(&file), Some(42), "replaced");
        std::fs::write(&file, b"soon").unwrap();
        assert_eq!(read_deadline(&file), None, "not a deadline");
        let ended = ending_file(&socket);
        assert_eq!(read_ending(&ended), None);
        write_ending(&ended, EXIT_SANDBOX_EXPIRED as u8);
        assert_eq!(read_ending(&ended), Some(Ending::Expired));
        for name in [
            "sbx-1.sock",
            "sbx-1.deadline",
            "sbx-1.deadline.new",
            "sbx-1.ended",
        ] {
            assert_eq!(id_of_file(name), Some("sbx-1"), "{name}");
        }
        assert_eq!(id_of_file("sbx-1.txt"), None);
    }
}
