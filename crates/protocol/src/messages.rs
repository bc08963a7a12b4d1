//! The messages of the protocol (version 4; see [`crate::PROTOCOL_VERSION`]
//! for what changed since 1).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Who a process runs as, or who owns a file the agent creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum Identity {
    /// uid/gid 1000 (`user`), no capabilities.
    #[default]
    User,
    /// uid 0 of the sandbox's user namespace, with a reduced capability set.
    Root,
}

/// Resource limits the agent applies to every process it spawns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessLimits {
    /// RLIMIT_NOFILE, soft and hard.
    pub nofile: u64,
    /// RLIMIT_FSIZE in bytes, soft and hard.
    pub fsize_bytes: u64,
}

/// Deepest listing `list_dir_page` and `list_dir_stream` walk.
pub const MAX_LIST_DEPTH: u32 = 32;
/// Most entries one `list_dir_page` answers.
pub const MAX_LIST_PAGE: u32 = 10_000;
/// Most entries a `list_dir_page` walks to find its page.
pub const MAX_LIST_WALK: u64 = 1_000_000;
/// Most bytes of extended attributes (full names and values) one
/// [`FileInfo`] reports, and a `write_file` sets; attributes past it are
/// left out. What e2b's envd lets an upload set fits it.
pub const MAX_XATTR_BYTES: usize = 4096;

/// Whether a flag is off (its default), so it is left out of the JSON.
fn is_false(flag: &bool) -> bool {
    !*flag
}

/// Host → agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// First request on a stream: the versions the host speaks, `oldest`
    /// to `version`. Answered by [`Event::Hello`] with the newest version
    /// both sides speak, or by an `unsupported_version` error. `oldest` is
    /// absent when the host speaks only `version` (hosts of version 1 sent
    /// no range; agents of version 1 refuse a greeting that has one, see
    /// `AgentClient::connect`).
    Hello {
        version: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        oldest: Option<u32>,
    },
    /// Starts a process. Answered by `started`, then `stdout`/`stderr`
    /// chunks (`pty` chunks for a process with a terminal), then a final
    /// `exited` (or a final `error` if it could not start).
    Spawn(SpawnRequest),
    /// Appends the payload to the stdin of `pid`; for a process with a
    /// terminal, to the terminal's input (as if typed). Answered by `done`.
    WriteStdin { pid: u32 },
    /// Closes the stdin of `pid`. Answered by `done`. A terminal's input
    /// cannot be closed (`invalid_argument`): write `^D` (0x04) to it, which
    /// a program reading the terminal sees as the end of its input.
    CloseStdin { pid: u32 },
    /// Sets the size of the terminal of `pid` (started with `pty`); the
    /// kernel sends SIGWINCH to the terminal's foreground process group.
    /// Answered by `done`; `invalid_argument` for a process without a
    /// terminal or a size with a zero.
    Resize { pid: u32, cols: u16, rows: u16 },
    /// Sends `signal` to the process group of `pid`. Answered by `done`.
    Signal { pid: u32, signal: i32 },
    /// Lists the processes the agent started that are still running.
    ListProcesses,
    /// Waits for `pid` to exit. Answered by a final `exited`.
    Wait { pid: u32 },
    /// Streams a file: `file_data` chunks, then a final `file_end`.
    ReadFile {
        path: String,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        length: Option<u64>,
    },
    /// Opens a file for writing. The content follows in `write_data` frames
    /// with the same id, then `write_end`; the final answer is `written`.
    WriteFile {
        path: String,
        #[serde(default)]
        mode: Option<u32>,
        #[serde(default)]
        create_parents: bool,
        #[serde(default)]
        append: bool,
        #[serde(default)]
        owner: Identity,
        /// The extended attributes the file is left with (see [`Xattrs`]),
        /// set before any of its content is written: when they cannot be
        /// set, the write fails and the file is as it was (one it created
        /// is removed). Absent, the file's attributes are left alone.
        /// Added in version 4: an older agent refuses a write with it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        xattrs: Option<Xattrs>,
    },
    /// A chunk of the file opened by the `write_file` (or the stream of the
    /// `extract`) with this id (payload).
    WriteData,
    /// The end of the file opened by the `write_file` (or the stream of the
    /// `extract`) with this id.
    WriteEnd,
    /// Unpacks a tar stream into `dir` (made with its parents when
    /// missing), as root inside the sandbox: entries keep the modes,
    /// numeric owners and modification times the stream gives, and stay
    /// inside `dir` as it resolves in the sandbox. The stream follows in
    /// `write_data` frames with the same id, then `write_end`; the final
    /// answer is `written` with the stream's length. What a template
    /// build's COPY sends. Added in version 3: an older agent refuses it.
    Extract { dir: String },
    /// Answered by a final `stat` (an `lstat`: a symlink is reported as
    /// itself).
    Stat {
        path: String,
        /// Report the extended attributes whose names start with this
        /// prefix (which must start with `user.`) in the entry's `xattrs`,
        /// read through a symlink to its target. Added in version 4: an
        /// older agent refuses a `stat` with it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        xattrs: Option<String>,
    },
    /// Lists a directory to `depth` levels (1 = direct children). Answered by
    /// `entries`, which must fit one frame: a large directory is refused.
    /// [`Request::ListDirPage`] and [`Request::ListDirStream`] list any size.
    ListDir { path: String, depth: u32 },
    /// One page of the listing of a directory to `depth` levels (1 to
    /// [`MAX_LIST_DEPTH`]), in the byte order of the entries' paths.
    /// Answered by a final `entries_page`: the first entries whose paths
    /// come after `after` (the `next` of the previous page; absent for the
    /// first), at most `limit` (1 to [`MAX_LIST_PAGE`]) and fewer when
    /// their metadata would not fit one frame; `next` is absent on the last
    /// page. Each page walks the whole tree again, holding only the page:
    /// `invalid_argument` past [`MAX_LIST_WALK`] entries. Symlinks are
    /// listed, never followed (a symlink named by `path` itself is).
    /// Added after version 1: an agent of version 1 refuses it.
    ListDirPage {
        path: String,
        depth: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        limit: u32,
    },
    /// The whole listing of a directory to `depth` levels (1 to
    /// [`MAX_LIST_DEPTH`]) in one walk, in no particular order: non-final
    /// `entries_chunk`s (each well under one frame), then a final
    /// `entries_end`. At most `limit` entries are sent; when the tree holds
    /// more, `entries_end` says `truncated`. The agent holds one chunk at a
    /// time. Added after version 1: an agent of version 1 refuses it.
    ListDirStream {
        path: String,
        depth: u32,
        limit: u64,
        /// Report each entry's extended attributes with this prefix, as
        /// `stat` does. Added in version 4.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        xattrs: Option<String>,
    },
    /// Creates a directory. Answered by `done`; `already_exists` error when it does.
    MakeDir {
        path: String,
        #[serde(default)]
        parents: bool,
        #[serde(default)]
        mode: Option<u32>,
        #[serde(default)]
        owner: Identity,
    },
    /// Removes a file, or a directory with everything in it when `recursive`.
    Remove {
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    /// Renames `from` to `to`, replacing `to` if it is a file.
    Rename { from: String, to: String },
    /// Liveness check, answered by `pong`.
    Ping,
    /// Watches a directory for changes until cancelled. Answered by
    /// non-final `fs_event`s (one per kernel event, not coalesced) and ends
    /// only with a final event: `done` after a `cancel` of this id, or
    /// `error` when the watch cannot start (`not_found`, `not_a_directory`,
    /// `permission_denied`; `invalid_argument` past 64 open watches per
    /// stream or 8192 directories per watch) or breaks. It breaks when the
    /// watched directory itself is removed or moved (a non-final `fs_event`
    /// `remove` or `rename` of `path`, then a final `error` `not_found`),
    /// when its filesystem is unmounted (`not_found`), when a recursive
    /// watch grows past 8192 directories (`invalid_argument`) and when
    /// events came faster than they were read (`io`, "too many events; the
    /// watch was dropped"). The watch is in place before the agent reads the
    /// next request of the stream, so a change made after the answer to a
    /// later request (e.g. `ping`) is reported.
    Watch {
        /// The directory; relative paths are joined to the user's home, like
        /// every file path. Watching a file is `not_a_directory`.
        path: String,
        /// Also watch every subdirectory, those present at the start and
        /// those created or moved in later (symlinks are not followed). The
        /// `create` or `rename` of a new directory is sent once it is
        /// watched; entries already inside it by then follow as `create`
        /// (an entry made just as its watch was added may be reported twice).
        #[serde(default)]
        recursive: bool,
        /// Attach the `entry` of what a `create`, `write` or `chmod` is
        /// about, as `stat` reports it then (absent when it is already
        /// gone). `remove` and `rename` never carry one: their path names
        /// what is no longer there. Added in version 4.
        #[serde(default, skip_serializing_if = "is_false")]
        entries: bool,
        /// With `entries`, the prefix of the extended attributes the
        /// entries report, as for `stat`. Added in version 4.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        xattrs: Option<String>,
        /// Refuse (`invalid_argument`) to watch a directory on a network
        /// filesystem (NFS, CIFS/SMB, FUSE), whose changes made elsewhere
        /// inotify does not see. Added in version 4.
        #[serde(default, skip_serializing_if = "is_false")]
        local_only: bool,
    },
    /// Cancels the open request whose id is `target` (a `watch`): its stream
    /// ends with a final `done`. A no-op for any other or an unknown id.
    /// Answered by `done`, sent after the target's final event.
    Cancel {
        /// The id of the request to cancel.
        target: u64,
    },
    /// Opens a TCP connection to `port` on the sandbox's own loopback
    /// (127.0.0.1, then ::1 when nothing listens there): how a port a
    /// process inside listens on is reached from outside. Answered by a
    /// non-final `connected`; then the bytes the sandbox's end sends come
    /// as non-final `stream_data` (payload), and a non-final `stream_end`
    /// when it stops sending; the request ends with a final `done` once
    /// both directions are closed. The host's bytes follow in `write_data`
    /// frames with this id; `write_end` ends its direction (a half close);
    /// `cancel` of this id closes the connection at once (final `done`).
    /// A final `error` instead of `connected`: `refused` (nothing listens
    /// on the port), `invalid_argument` (port 0), `busy` (too many
    /// connections open on this stream). Added in version 5.
    Connect {
        /// The TCP port, 1 to 65535.
        port: u16,
    },
}

/// What to run and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnRequest {
    /// Program to run; looked up in the `PATH` of `env` when it has no `/`.
    pub cmd: String,
    /// Arguments after the program name.
    #[serde(default)]
    pub args: Vec<String>,
    /// The whole environment of the process.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory; the identity's home when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Identity of the process.
    #[serde(default)]
    pub user: Identity,
    /// Whether stdin is a pipe fed by `write_stdin` (otherwise /dev/null).
    /// Ignored with `pty`: the terminal is always the input.
    #[serde(default)]
    pub stdin: bool,
    /// Run the process on a new terminal of this size instead of pipes: the
    /// terminal is its stdin, stdout, stderr and controlling terminal, and
    /// its output comes as `pty` events. Omitted when absent, so a request
    /// without a terminal reads the same as before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Kill the process group after this many milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Cap on bytes forwarded per stream; past it the stream is cut and the
    /// `exited` event says so.
    pub output_limit: u64,
    /// Resource limits of the process.
    pub limits: ProcessLimits,
}

/// The size of a terminal, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

/// Agent → host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    /// Answer to `hello` (final): the version both sides speak from here on.
    Hello { version: u32, agent_version: String },
    /// A spawned process is running.
    Started { pid: u32 },
    /// Output chunk (payload).
    Stdout,
    /// Output chunk (payload).
    Stderr,
    /// Output chunk of a process with a terminal (payload): what the
    /// terminal shows, stdout and stderr merged and the echo of the input
    /// included, so it is neither stream. Counts as stdout for
    /// `output_limit` and `stdout_truncated`; at the limit the terminal
    /// hangs up (its processes get SIGHUP, as when a terminal closes).
    Pty,
    /// A process ended (final for `spawn` and `wait`).
    Exited(ExitStatus),
    /// Answer to `list_processes` (final).
    Processes { processes: Vec<ProcessInfo> },
    /// A chunk of a file being read (payload).
    FileData,
    /// End of a file read (final).
    FileEnd { bytes: u64 },
    /// A write finished (final).
    Written { bytes: u64 },
    /// Answer to `stat` (final).
    Stat(FileInfo),
    /// Answer to `list_dir` (final).
    Entries { entries: Vec<FileInfo> },
    /// Answer to `list_dir_page` (final): the page, sorted by path, and the
    /// `after` of the next page, absent on the last.
    EntriesPage {
        entries: Vec<FileInfo>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// Entries of a `list_dir_stream` (not final).
    EntriesChunk { entries: Vec<FileInfo> },
    /// The end of a `list_dir_stream` (final): how many entries were sent,
    /// and whether the tree holds more than the request's `limit`.
    EntriesEnd { count: u64, truncated: bool },
    /// A request without a result succeeded (final).
    Done,
    /// A request failed (final).
    Error { kind: ErrorKind, message: String },
    /// Sent by the agent on id 0 at a fixed interval while the stream is idle.
    Keepalive,
    /// Answer to `ping` (final).
    Pong,
    /// The connection of a `connect` is open (not final).
    Connected,
    /// Bytes the sandbox's end of a `connect` sent (payload; not final).
    StreamData,
    /// The sandbox's end of a `connect` sends no more (not final).
    StreamEnd,
    /// A change under a `watch` (not final).
    FsEvent {
        /// What happened.
        kind: FsEventKind,
        /// Absolute path inside the sandbox of the entry it happened to.
        path: String,
        /// What the entry is now, when the `watch` asked for `entries`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entry: Option<FileInfo>,
    },
}

impl Event {
    /// True for the event that ends a request; no other event with its id follows.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            Event::Started { .. }
                | Event::Stdout
                | Event::Stderr
                | Event::Pty
                | Event::FileData
                | Event::EntriesChunk { .. }
                | Event::Keepalive
                | Event::FsEvent { .. }
                | Event::Connected
                | Event::StreamData
                | Event::StreamEnd
        )
    }
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExitStatus {
    pub pid: u32,
    /// Exit code when the process exited by itself.
    pub code: Option<i32>,
    /// Signal number when a signal ended it.
    pub signal: Option<i32>,
    /// The sandbox's memory limit killed it. The agent cannot always know;
    /// the host corrects this from the cgroup.
    pub oom: bool,
    /// The per-exec timeout killed it.
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

impl ExitStatus {
    /// The shell convention: the exit code, or 128 + the signal number.
    pub fn shell_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 255,
        }
    }
}

/// A process the agent started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessInfo {
    pub pid: u32,
    pub cmd: String,
    pub args: Vec<String>,
    pub user: Identity,
}

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Metadata of one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileInfo {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Last path component.
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits (e.g. 0o644).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// Target of a symlink, as stored.
    pub symlink_target: Option<String>,
    /// The extended attributes the request asked for (by prefix), full
    /// names to values; only those whose name and value are UTF-8, and at
    /// most [`MAX_XATTR_BYTES`] of them. Left out when empty (always, for
    /// a request that asked for none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
}

/// The extended attributes a `write_file` leaves on its file: of the
/// attributes whose names start with `prefix` (which must start with
/// `user.`), exactly `attrs` (full names, each starting with `prefix`, to
/// values); others under the prefix are removed, and attributes outside
/// it are left alone. An empty `attrs` clears the prefix (a filesystem
/// without extended attributes then has nothing to clear); setting one
/// where the filesystem has none fails with `unsupported`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Xattrs {
    pub prefix: String,
    #[serde(default)]
    pub attrs: BTreeMap<String, String>,
}

/// What an `fs_event` reports. Each kernel (inotify) event becomes one
/// `fs_event`; the agent merges or deduplicates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FsEventKind {
    /// An entry (file, directory, symlink, …) was created.
    Create,
    /// A file's content was modified: one event per write to it (the
    /// kernel merges an event identical to the one queued just before it).
    Write,
    /// An entry was removed.
    Remove,
    /// An entry was renamed or moved: one `rename` with the old path (when it
    /// was inside the watch), then one with the new path (when it is inside
    /// the watch).
    Rename,
    /// An entry's metadata changed: mode, owner, timestamps, link count or
    /// extended attributes.
    Chmod,
}

/// Stable error kinds the host maps onto API errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    PermissionDenied,
    InvalidArgument,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    NoSpace,
    UnsupportedVersion,
    /// The program could not be executed (not executable, bad format).
    NotExecutable,
    /// The target is busy or its queue is full (EBUSY, a full stdin queue);
    /// retrying later may work.
    Busy,
    /// The other end is closed (a process closed its stdin or exited).
    Closed,
    Io,
    /// The filesystem cannot do what was asked (EOPNOTSUPP): extended
    /// attributes where it has none. Sent only for what version 4 added.
    Unsupported,
    /// Nothing accepts connections on the port a `connect` named. Sent
    /// only for what version 5 added.
    Refused,
}
