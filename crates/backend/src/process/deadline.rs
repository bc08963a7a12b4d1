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
//! - `<id>.memory`: what the daemon asks of a gVisor sandbox's memory
//!   ([`MemoryRequest`]: save it to disk, or bring it back), a JSON object
//!   renamed into place before the supervisor is nudged; and
//!   `<id>.memory.done`, the supervisor's [`MemoryAnswer`] to it, by the
//!   request's sequence number.
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

/// The memory request file of the sandbox served on `socket`.
pub fn memory_request_file(socket: &Path) -> PathBuf {
    socket.with_extension("memory")
}

/// The memory answer file of the sandbox served on `socket`.
pub fn memory_answer_file(socket: &Path) -> PathBuf {
    socket.with_extension("memory.done")
}

/// Every file of the sandbox served on `socket`, the socket included.
pub fn files_of(socket: &Path) -> [PathBuf; 8] {
    [
        socket.to_owned(),
        deadline_file(socket),
        socket.with_extension("deadline.new"),
        ending_file(socket),
        memory_request_file(socket),
        socket.with_extension("memory.new"),
        memory_answer_file(socket),
        socket.with_extension("memory.done.new"),
    ]
}

/// The sandbox id a file of this directory belongs to, if it is one.
pub fn id_of_file(name: &str) -> Option<&str> {
    [
        ".sock",
        ".deadline",
        ".deadline.new",
        ".ended",
        ".memory",
        ".memory.new",
        ".memory.done",
        ".memory.done.new",
    ]
    .into_iter()
    .find_map(|suffix| name.strip_suffix(suffix))
}

/// What happens to a sandbox's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryOp {
    /// Saved to disk; its processes let go.
    Checkpoint,
    /// Brought back from disk; its processes go on.
    Restore,
}

/// The daemon's request, numbered so its answer is told from an older one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryRequest {
    pub seq: u64,
    pub op: MemoryOp,
}

/// The supervisor's answer to request `seq`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryAnswer {
    pub seq: u64,
    /// Why it failed; `None` when it was done.
    pub error: Option<String>,
    /// The image's bytes (a checkpoint).
    pub bytes: u64,
}

/// Writes `value` as JSON to `file` (a new file renamed over it).
pub fn write_json(file: &Path, value: &impl serde::Serialize) -> std::io::Result<()> {
    let mut fresh = file.as_os_str().to_owned();
    fresh.push(".new");
    let text = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    replace_whole(file, Path::new(&fresh), &text)
}

/// Writes `bytes` to `fresh` (0600) and renames it over `file`, so a
/// reader sees the old content or the new, never part of it.
fn replace_whole(file: &Path, fresh: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(fresh)?;
    out.write_all(bytes)?;
    drop(out);
    std::fs::rename(fresh, file)
}

/// The JSON value in `file`, if it is there and one of type `T`.
pub fn read_json<T: serde::de::DeserializeOwned>(file: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(file).ok()?).ok()
}

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Replaces the deadline in `file` (a whole new file renamed over it).
pub fn write_deadline(file: &Path, at_ms: i64) -> std::io::Result<()> {
    replace_whole(
        file,
        &file.with_extension("deadline.new"),
        at_ms.to_string().as_bytes(),
    )
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
            "sbx-1.memory",
            "sbx-1.memory.done",
        ] {
            assert_eq!(id_of_file(name), Some("sbx-1"), "{name}");
        }
        assert_eq!(id_of_file("sbx-1.txt"), None);
        let request = MemoryRequest {
            seq: 3,
            op: MemoryOp::Checkpoint,
        };
        write_json(&memory_request_file(&socket), &request).unwrap();
        assert_eq!(read_json(&memory_request_file(&socket)), Some(request));
        assert!(files_of(&socket)
            .iter()
            .all(|f| id_of_file(&f.file_name().unwrap().to_string_lossy()) == Some("sbx-1")));
    }
}
