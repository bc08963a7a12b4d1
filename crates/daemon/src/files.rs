//! File operations. The agent resolves every path inside the sandbox; the
//! daemon never touches a sandbox path on the host, so `..`, symlinks and
//! NUL tricks meet the agent's rules, not the host's filesystem.
//!
//! Uploads are written to a temporary name beside the target and renamed
//! into place once complete, so a failed or oversized upload leaves no file.

use crate::{closed, identity, unexpected, Daemon, DaemonError, LiveSandbox};
use airlock_policy::RunAs;
use airlock_protocol::{
    Event, Events, FileInfo, FsEventKind, Request, Xattrs, MAX_LIST_DEPTH, MAX_LIST_PAGE,
    MAX_PAYLOAD_BYTES,
};
use airlock_store::Stream;
use futures_util::{Stream as AsyncStream, StreamExt};
use serde_json::json;

/// Largest `write_data` frame an upload is sent in.
const WRITE_FRAME: usize = if MAX_PAYLOAD_BYTES < 1 << 20 {
    MAX_PAYLOAD_BYTES
} else {
    1 << 20
};

/// Entries of a page of [`Daemon::list_dir_page`] unless asked otherwise.
pub const LIST_PAGE_DEFAULT: u32 = 1000;
/// Most entries of a page of [`Daemon::list_dir_page`].
pub const LIST_PAGE_MAX: u32 = MAX_LIST_PAGE;
/// Most entries [`Daemon::list_dir_all`] assembles.
pub const LIST_ALL_MAX_ENTRIES: u64 = 200_000;
/// Most bytes of paths, names and link targets [`Daemon::list_dir_all`]
/// assembles (what it holds is a small multiple of this).
pub const LIST_ALL_MAX_BYTES: usize = 64 << 20;
/// Longest cursor of a listing: the agent's resume token for a path of
/// PATH_MAX bytes, in base64.
const MAX_CURSOR: usize = 6000;
/// The first protocol version whose agents page and stream listings
/// (`ListDirPage`, `ListDirStream`); older agents answer one frame.
const LISTING_PROTOCOL: u32 = 2;
/// The first protocol version whose agents read and write extended
/// attributes, attach entries to a watch's events and refuse network
/// filesystems on request. Older agents get none of these: what they are
/// asked to read reads as none, entries are stat'ed here, and a write that
/// would set attributes is refused.
const XATTR_PROTOCOL: u32 = 4;

/// A page of a listing.
#[derive(Debug)]
pub struct DirPage {
    /// Sorted by path.
    pub entries: Vec<FileInfo>,
    /// The cursor of the next page; `None` on the last.
    pub next_cursor: Option<String>,
}

fn check_depth(depth: u32) -> Result<(), DaemonError> {
    if (1..=MAX_LIST_DEPTH).contains(&depth) {
        Ok(())
    } else {
        Err(DaemonError::BadInput(format!(
            "depth must be between 1 and {MAX_LIST_DEPTH}"
        )))
    }
}

fn check_path(path: &str) -> Result<(), DaemonError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(DaemonError::BadInput(
            "path must be an absolute path inside the sandbox, without NUL".into(),
        ));
    }
    Ok(())
}

/// How [`Daemon::write_file`] puts a file in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Written under a temporary name, renamed into place when complete:
    /// the file appears whole or not at all.
    Atomic,
    /// Written where it belongs, as it arrives.
    InPlace,
}

/// A file being read, chunk by chunk.
pub struct FileReader {
    first: Option<Vec<u8>>,
    events: Events,
    daemon: Daemon,
    sandbox_id: String,
    path: String,
    request_id: String,
    bytes: u64,
    done: bool,
}

impl FileReader {
    /// The next chunk; `None` at the end.
    pub async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, DaemonError>> {
        if let Some(first) = self.first.take() {
            self.bytes += first.len() as u64;
            return Some(Ok(first));
        }
        if self.done {
            return None;
        }
        match self.events.next().await {
            Ok(Some(frame)) => match frame.msg {
                Event::FileData => {
                    self.bytes += frame.payload.len() as u64;
                    Some(Ok(frame.payload))
                }
                Event::FileEnd { .. } => {
                    self.finish();
                    None
                }
                Event::Error { kind, message } => {
                    self.done = true;
                    Some(Err(DaemonError::from_agent(kind, message)))
                }
                other => {
                    self.done = true;
                    Some(Err(unexpected(&other)))
                }
            },
            Ok(None) => {
                self.finish();
                None
            }
            Err(_) => {
                self.done = true;
                Some(Err(DaemonError::NotRunning(self.sandbox_id.clone())))
            }
        }
    }

    fn finish(&mut self) {
        self.done = true;
        self.daemon.audit().record(
            Stream::Access,
            "file.read",
            Some(&self.sandbox_id),
            Some(&self.request_id),
            json!({"path": self.path, "bytes": self.bytes}),
        );
    }
}

impl Daemon {
    /// Opens `path` for reading. Fails before the first byte if it cannot
    /// be read, so the API can answer with a proper status.
    pub async fn read_file(
        &self,
        id: &str,
        path: &str,
        request_id: &str,
    ) -> Result<FileReader, DaemonError> {
        check_path(path)?;
        let sandbox = self.running(id)?;
        self.read_file_of(&sandbox, path, request_id).await
    }

    /// [`Daemon::read_file`] of a sandbox in any state whose agent
    /// answers (outputs are collected from one being stopped).
    pub(crate) async fn read_file_of(
        &self,
        sandbox: &LiveSandbox,
        path: &str,
        request_id: &str,
    ) -> Result<FileReader, DaemonError> {
        let id = sandbox.id.as_str();
        let mut events = sandbox
            .agent()
            .request(Request::ReadFile {
                path: path.to_owned(),
                offset: 0,
                length: None,
            })
            .await
            .map_err(closed(id))?;
        // The first event decides the answer: data, an empty file, or an error.
        let first = match events
            .next()
            .await
            .map_err(closed(id))?
            .map(|f| (f.msg, f.payload))
        {
            Some((Event::FileData, payload)) => Some(payload),
            Some((Event::FileEnd { .. }, _)) => None,
            Some((Event::Error { kind, message }, _)) => {
                return Err(DaemonError::from_agent(kind, message))
            }
            Some((other, _)) => return Err(unexpected(&other)),
            None => return Err(DaemonError::NotRunning(id.to_owned())),
        };
        let empty = first.is_none();
        let mut reader = FileReader {
            first,
            events,
            daemon: self.clone(),
            sandbox_id: id.to_owned(),
            path: path.to_owned(),
            request_id: request_id.to_owned(),
            bytes: 0,
            done: false,
        };
        if empty {
            reader.finish();
        }
        Ok(reader)
    }

    /// Writes `path` from `body`, creating parent directories. With
    /// [`WriteMode::Atomic`] the content goes to a temporary name and is
    /// renamed into place once complete; [`WriteMode::InPlace`] writes the
    /// file itself, as e2b's envd does (a watcher then sees it created and
    /// written under its own name). More than `limit` bytes → `TooLarge`
    /// and the file is removed. With `xattrs`, the file is left with those
    /// extended attributes under their prefix (see [`Xattrs`]), set before
    /// its content: a filesystem without them fails the write with
    /// `Unsupported` and leaves the file as it was, and so does an agent
    /// that predates them (unless there are none to set: the write then
    /// goes without).
    #[allow(clippy::too_many_arguments)]
    pub async fn write_file<S, B, E>(
        &self,
        id: &str,
        path: &str,
        mode: Option<u32>,
        user: Option<RunAs>,
        write_mode: WriteMode,
        xattrs: Option<Xattrs>,
        mut body: S,
        limit: u64,
        request_id: &str,
    ) -> Result<u64, DaemonError>
    where
        S: AsyncStream<Item = Result<B, E>> + Unpin,
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        check_path(path)?;
        if path.ends_with('/') {
            return Err(DaemonError::BadInput("path names a directory".into()));
        }
        let sandbox = self.running(id)?;
        let user = user.unwrap_or(sandbox.spec.user);
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let temp = match write_mode {
            WriteMode::Atomic => format!(
                "{dir}/.{name}.airlock-upload-{}",
                airlock_store::new_secret("")
                    .map_err(DaemonError::from)?
                    .get(..12)
                    .unwrap_or("0")
            ),
            WriteMode::InPlace => path.to_owned(),
        };
        let agent = sandbox.agent();
        let xattrs = match xattrs {
            Some(set) if agent.version() < XATTR_PROTOCOL => {
                if !set.attrs.is_empty() {
                    return Err(DaemonError::Unsupported(format!(
                        "the agent of sandbox {id} (protocol version {}) predates extended \
                         attributes, so it cannot keep file metadata; sandboxes created \
                         since the daemon's upgrade can",
                        agent.version()
                    )));
                }
                None
            }
            other => other,
        };
        let events = agent
            .request(Request::WriteFile {
                path: temp.clone(),
                mode,
                create_parents: true,
                append: false,
                owner: identity(user),
                xattrs,
            })
            .await
            .map_err(closed(id))?;
        let write_id = events.id();
        let mut written: u64 = 0;
        let mut failure: Option<DaemonError> = None;
        // Body chunks (often a few KiB) are gathered into frames of up to
        // WRITE_FRAME bytes from what is already there: each frame costs a
        // relay through the supervisor and a write in the agent, so fewer
        // and larger ones move more bytes, without waiting for any.
        let mut frame: Vec<u8> = Vec::new();
        let mut ended = false;
        while !ended {
            let mut next = body.next().await;
            loop {
                match next {
                    None => {
                        ended = true;
                        break;
                    }
                    Some(Err(e)) => {
                        failure = Some(DaemonError::BadInput(format!("the upload broke off: {e}")));
                        ended = true;
                        break;
                    }
                    Some(Ok(chunk)) => {
                        let bytes = chunk.as_ref();
                        written += bytes.len() as u64;
                        if written > limit {
                            failure = Some(DaemonError::TooLarge(format!(
                                "the upload is larger than the limit of {limit} bytes"
                            )));
                            ended = true;
                            break;
                        }
                        frame.extend_from_slice(bytes);
                    }
                }
                if frame.len() >= WRITE_FRAME {
                    break;
                }
                match futures_util::FutureExt::now_or_never(body.next()) {
                    Some(ready) => next = ready,
                    None => break,
                }
            }
            if failure.is_some() {
                break;
            }
            while !frame.is_empty() {
                let rest = if frame.len() > WRITE_FRAME {
                    frame.split_off(WRITE_FRAME)
                } else {
                    Vec::new()
                };
                let piece = std::mem::replace(&mut frame, rest);
                agent
                    .send(write_id, Request::WriteData, piece)
                    .await
                    .map_err(closed(id))?;
            }
        }
        agent
            .send(write_id, Request::WriteEnd, Vec::new())
            .await
            .map_err(closed(id))?;
        let outcome = events.finish().await.map_err(closed(id))?;
        let result = match (failure, outcome) {
            (Some(failure), _) => Err(failure),
            (None, Event::Written { bytes }) if write_mode == WriteMode::InPlace => Ok(bytes),
            (None, Event::Written { bytes }) => {
                match self
                    .done(
                        id,
                        Request::Rename {
                            from: temp.clone(),
                            to: path.to_owned(),
                        },
                        Vec::new(),
                    )
                    .await
                {
                    Ok(()) => Ok(bytes),
                    Err(e) => Err(e),
                }
            }
            (None, Event::Error { kind, message }) => {
                Err(with_tier(DaemonError::from_agent(kind, message), &sandbox))
            }
            (None, other) => Err(unexpected(&other)),
        };
        if result.is_err() {
            let _ = self
                .done(
                    id,
                    Request::Remove {
                        path: temp,
                        recursive: false,
                    },
                    Vec::new(),
                )
                .await;
        }
        if let Ok(bytes) = result {
            self.audit().record(
                Stream::Access,
                "file.write",
                Some(id),
                Some(request_id),
                json!({"path": path, "bytes": bytes}),
            );
        }
        result
    }

    /// Metadata of `path`.
    pub async fn stat(&self, id: &str, path: &str) -> Result<FileInfo, DaemonError> {
        self.stat_with_xattrs(id, path, None).await
    }

    /// Metadata of `path` with its extended attributes whose names start
    /// with `xattrs` (which must start with `user.`); none from an agent
    /// that predates them.
    pub async fn stat_with_xattrs(
        &self,
        id: &str,
        path: &str,
        xattrs: Option<&str>,
    ) -> Result<FileInfo, DaemonError> {
        check_path(path)?;
        let xattrs = self.xattrs_for(id, xattrs)?;
        match self
            .final_answer(
                id,
                Request::Stat {
                    path: path.to_owned(),
                    xattrs,
                },
                Vec::new(),
            )
            .await?
        {
            Event::Stat(info) => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// The entries under `path`, `depth` levels down (1 = children), in
    /// one agent answer: what an agent of protocol version 1 can do (about
    /// 6,000 entries fit). [`Daemon::list_dir_page`] and
    /// [`Daemon::list_dir_all`] list any size from later agents.
    pub async fn list_dir(
        &self,
        id: &str,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileInfo>, DaemonError> {
        check_path(path)?;
        check_depth(depth)?;
        match self
            .final_answer(
                id,
                Request::ListDir {
                    path: path.to_owned(),
                    depth,
                },
                Vec::new(),
            )
            .await?
        {
            Event::Entries { entries } => Ok(entries),
            other => Err(unexpected(&other)),
        }
    }

    /// [`Daemon::list_dir`] sorted by path: the whole listing an agent of
    /// protocol version 1 can give.
    async fn list_dir_sorted(
        &self,
        id: &str,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileInfo>, DaemonError> {
        let mut entries = self.list_dir(id, path, depth).await?;
        entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        Ok(entries)
    }

    /// One page of the entries under `path`, `depth` levels down (1 =
    /// children), sorted by path: at most `limit` entries (fewer when their
    /// metadata would not fit one agent frame) after `cursor`, the
    /// `next_cursor` of the page before (`None` for the first). The daemon
    /// holds this one page; the agent walks the tree again for each.
    pub async fn list_dir_page(
        &self,
        id: &str,
        path: &str,
        depth: u32,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<DirPage, DaemonError> {
        check_path(path)?;
        check_depth(depth)?;
        if !(1..=MAX_LIST_PAGE).contains(&limit) {
            return Err(DaemonError::BadInput(format!(
                "limit must be between 1 and {MAX_LIST_PAGE}"
            )));
        }
        if let Some(cursor) = cursor {
            let valid = !cursor.is_empty()
                && cursor.len() <= MAX_CURSOR
                && cursor
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !valid {
                return Err(DaemonError::BadInput("the cursor is not valid".into()));
            }
        }
        if self.running(id)?.agent().version() < LISTING_PROTOCOL {
            // An agent of version 1 (a sandbox from before an upgrade)
            // cannot page: its whole listing is the one page.
            if cursor.is_some() {
                return Err(DaemonError::BadInput("the cursor is not valid".into()));
            }
            return Ok(DirPage {
                entries: self.list_dir_sorted(id, path, depth).await?,
                next_cursor: None,
            });
        }
        match self
            .final_answer(
                id,
                Request::ListDirPage {
                    path: path.to_owned(),
                    depth,
                    after: cursor.map(str::to_owned),
                    limit,
                },
                Vec::new(),
            )
            .await?
        {
            Event::EntriesPage { entries, next } => Ok(DirPage {
                entries,
                next_cursor: next,
            }),
            other => Err(unexpected(&other)),
        }
    }

    /// Every entry under `path`, `depth` levels down, sorted by path,
    /// assembled from the agent's stream in one walk: at most
    /// [`LIST_ALL_MAX_ENTRIES`] entries and [`LIST_ALL_MAX_BYTES`] of
    /// paths, names, link targets and attributes, `TooLarge` past either
    /// (for dialects such as e2b's that have no pages). Each entry reports
    /// its extended attributes under `xattrs`, as
    /// [`Daemon::stat_with_xattrs`] does.
    pub async fn list_dir_all(
        &self,
        id: &str,
        path: &str,
        depth: u32,
        xattrs: Option<&str>,
    ) -> Result<Vec<FileInfo>, DaemonError> {
        check_path(path)?;
        check_depth(depth)?;
        let sandbox = self.running(id)?;
        if sandbox.agent().version() < LISTING_PROTOCOL {
            return self.list_dir_sorted(id, path, depth).await;
        }
        let xattrs = self.xattrs_for(id, xattrs)?;
        list_all_of(&sandbox, path, depth, xattrs).await
    }

    /// The prefix of the attributes a request to the agent of `id` may
    /// ask for: none for an agent that predates them.
    fn xattrs_for(&self, id: &str, xattrs: Option<&str>) -> Result<Option<String>, DaemonError> {
        let Some(prefix) = xattrs else {
            return Ok(None);
        };
        Ok((self.running(id)?.agent().version() >= XATTR_PROTOCOL).then(|| prefix.to_owned()))
    }

    /// Creates a directory (and its parents with `parents`).
    pub async fn make_dir(
        &self,
        id: &str,
        path: &str,
        parents: bool,
        user: Option<RunAs>,
    ) -> Result<(), DaemonError> {
        check_path(path)?;
        let user = user.unwrap_or(self.running(id)?.spec.user);
        self.done(
            id,
            Request::MakeDir {
                path: path.to_owned(),
                parents,
                mode: None,
                owner: identity(user),
            },
            Vec::new(),
        )
        .await
    }

    /// Renames `from` to `to`; answers what `to` is then, with its
    /// extended attributes under `xattrs` (which a rename keeps).
    pub async fn move_path(
        &self,
        id: &str,
        from: &str,
        to: &str,
        xattrs: Option<&str>,
    ) -> Result<FileInfo, DaemonError> {
        check_path(from)?;
        check_path(to)?;
        self.done(
            id,
            Request::Rename {
                from: from.to_owned(),
                to: to.to_owned(),
            },
            Vec::new(),
        )
        .await?;
        self.stat_with_xattrs(id, to, xattrs).await
    }

    /// Removes `path` (a directory only with `recursive`, or when empty).
    pub async fn remove(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
        request_id: &str,
    ) -> Result<(), DaemonError> {
        check_path(path)?;
        self.done(
            id,
            Request::Remove {
                path: path.to_owned(),
                recursive,
            },
            Vec::new(),
        )
        .await?;
        self.audit().record(
            Stream::Access,
            "file.remove",
            Some(id),
            Some(request_id),
            json!({"path": path, "recursive": recursive}),
        );
        Ok(())
    }
}

/// An `Unsupported` failure of the agent of `sandbox`, naming its tier.
fn with_tier(error: DaemonError, sandbox: &LiveSandbox) -> DaemonError {
    match error {
        DaemonError::Unsupported(message) => DaemonError::Unsupported(format!(
            "{message} (a sandbox of the {} tier)",
            sandbox.spec.tier.as_str()
        )),
        other => other,
    }
}

/// What a watch reports beyond the changes under one directory.
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    /// The directories below it too.
    pub recursive: bool,
    /// Each `create`, `write` and `chmod` carries the [`FileInfo`] of its
    /// entry as it was then (none when it is already gone); `remove` and
    /// `rename` never do.
    pub entries: bool,
    /// With `entries`, the prefix of the extended attributes they report
    /// (see [`Daemon::stat_with_xattrs`]).
    pub xattrs: Option<String>,
    /// Refuse a directory on a network filesystem (NFS, SMB, FUSE), whose
    /// changes made elsewhere are not seen (`BadInput`). Agents that
    /// predate the check watch it anyway.
    pub local_only: bool,
}

/// A live watch of a directory; cancelled in the agent when dropped.
pub struct Watcher {
    /// A change that arrived while the watch was being confirmed.
    pending: Option<Change>,
    events: Events,
    agent: airlock_protocol::AgentClient,
    ended: bool,
    /// Entries to stat here, for an agent that predates attaching them.
    stat_entries: bool,
}

/// One change under a watched directory.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Change {
    /// `create`, `write`, `remove`, `rename` or `chmod`.
    #[serde(rename = "type")]
    pub kind: FsEventKind,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// What the entry was when the change was seen, for a watch that asked
    /// for entries ([`WatchOptions::entries`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<FileInfo>,
}

impl Change {
    /// About what the change holds in memory: its path and its entry's
    /// text.
    fn weight(&self) -> usize {
        let entry = self.entry.as_ref().map_or(0, |info| {
            info.path.len()
                + info.name.len()
                + info.symlink_target.as_ref().map_or(0, String::len)
                + info
                    .xattrs
                    .iter()
                    .map(|(name, value)| name.len() + value.len())
                    .sum::<usize>()
        });
        self.path.len() + entry
    }
}

/// Whether a change of `kind` may carry an entry: what it names is still
/// there (a `remove` or `rename` names what is gone, and a stat could only
/// find whatever took its place).
fn carries_entry(kind: FsEventKind) -> bool {
    matches!(
        kind,
        FsEventKind::Create | FsEventKind::Write | FsEventKind::Chmod
    )
}

impl Watcher {
    /// The next change; `None` when the watch ended (an `Err` says why it
    /// broke, e.g. the directory was removed).
    pub async fn next(&mut self) -> Option<Result<Change, DaemonError>> {
        if let Some(change) = self.pending.take() {
            return Some(Ok(self.completed(change).await));
        }
        if self.ended {
            return None;
        }
        loop {
            match self.events.next().await {
                Ok(Some(frame)) => match frame.msg {
                    Event::FsEvent { kind, path, entry } => {
                        let change = Change { kind, path, entry };
                        return Some(Ok(self.completed(change).await));
                    }
                    Event::Error { kind, message } => {
                        self.ended = true;
                        return Some(Err(DaemonError::from_agent(kind, message)));
                    }
                    Event::Done => {
                        self.ended = true;
                        return None;
                    }
                    _ => continue,
                },
                Ok(None) | Err(_) => {
                    self.ended = true;
                    return None;
                }
            }
        }
    }

    /// `change` with its entry stat'ed here when the agent attaches none
    /// itself (one gone by now goes without).
    async fn completed(&self, mut change: Change) -> Change {
        if !self.stat_entries || !carries_entry(change.kind) {
            return change;
        }
        let stat = Request::Stat {
            path: change.path.clone(),
            xattrs: None,
        };
        if let Ok(events) = self.agent.request(stat).await {
            if let Ok(Event::Stat(info)) = events.finish().await {
                change.entry = Some(info);
            }
        }
        change
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let agent = self.agent.clone();
        let target = self.events.id();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Ok(answer) = agent.request(Request::Cancel { target }).await {
                    let _ = answer.finish().await;
                }
            });
        }
    }
}

impl Daemon {
    /// Watches directory `path` (see [`WatchOptions`]). Fails before
    /// returning if the watch cannot start; once it returns, every later
    /// change is reported.
    pub async fn watch(
        &self,
        id: &str,
        path: &str,
        options: &WatchOptions,
    ) -> Result<Watcher, DaemonError> {
        check_path(path)?;
        let sandbox = self.running(id)?;
        let agent = sandbox.agent().clone();
        // What version 4 added goes only to agents that speak it.
        let current = agent.version() >= XATTR_PROTOCOL;
        let entries = current && options.entries;
        let request = Request::Watch {
            path: path.to_owned(),
            recursive: options.recursive,
            entries,
            xattrs: options.xattrs.clone().filter(|_| entries),
            local_only: current && options.local_only,
        };
        let mut events = agent.request(request).await.map_err(closed(id))?;
        // The agent sets the watch up before it reads the next request, so
        // once the ping is answered the watch is live, or its error is
        // already waiting.
        agent
            .request(Request::Ping)
            .await
            .map_err(closed(id))?
            .finish()
            .await
            .map_err(closed(id))?;
        let mut pending = None;
        if let Some(first) = futures_util::FutureExt::now_or_never(events.next()) {
            match first.map_err(closed(id))?.map(|frame| frame.msg) {
                Some(Event::Error { kind, message }) => {
                    return Err(DaemonError::from_agent(kind, message))
                }
                Some(Event::FsEvent { kind, path, entry }) => {
                    pending = Some(Change { kind, path, entry })
                }
                Some(_) => {}
                None => return Err(DaemonError::NotRunning(id.to_owned())),
            }
        }
        Ok(Watcher {
            pending,
            events,
            agent,
            ended: false,
            stat_entries: options.entries && !current,
        })
    }
}

/// Changes kept per named watcher between two polls; past it the oldest
/// are dropped (and the next poll says so).
pub const WATCHER_CHANGES_KEPT: usize = 4096;
/// Bytes of paths and entries kept per named watcher between two polls
/// (entries carry attributes, so a count alone would let a sandbox make
/// each one large); past it the oldest changes are dropped too.
pub const WATCHER_BYTES_KEPT: usize = 4 << 20;
/// Named watchers one sandbox may hold at once.
pub const WATCHERS_PER_SANDBOX: usize = 64;

/// The named watchers of one sandbox (see [`Daemon::create_watcher`]).
#[derive(Default)]
pub struct NamedWatchers {
    by_id: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Polled>>>,
}

/// A watcher whose changes wait in a bounded buffer for the next poll.
struct Polled {
    state: std::sync::Mutex<PolledState>,
    task: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

#[derive(Default)]
struct PolledState {
    changes: std::collections::VecDeque<Change>,
    /// What `changes` hold, by [`Change::weight`].
    bytes: usize,
    dropped: u64,
    error: Option<DaemonError>,
    ended: bool,
}

impl PolledState {
    /// Keeps `change` for the next poll, dropping the oldest past
    /// [`WATCHER_CHANGES_KEPT`] changes or [`WATCHER_BYTES_KEPT`] bytes
    /// (never the newest).
    fn keep(&mut self, change: Change) {
        self.bytes += change.weight();
        self.changes.push_back(change);
        while self.changes.len() > WATCHER_CHANGES_KEPT
            || (self.bytes > WATCHER_BYTES_KEPT && self.changes.len() > 1)
        {
            let Some(oldest) = self.changes.pop_front() else {
                break;
            };
            self.bytes -= oldest.weight();
            self.dropped += 1;
        }
    }
}

impl Drop for Polled {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
    }
}

/// What one poll of a named watcher returns.
#[derive(Debug)]
pub struct Polls {
    /// Changes since the last poll, oldest first.
    pub changes: Vec<Change>,
    /// Changes dropped since the last poll because nobody polled in time.
    pub dropped: u64,
}

impl NamedWatchers {
    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, std::sync::Arc<Polled>>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Daemon {
    /// Starts a watch of directory `path` (see [`WatchOptions`]) whose
    /// changes are kept for [`Daemon::watcher_changes`]; returns its id. It
    /// ends with the sandbox, on [`Daemon::remove_watcher`], or when the
    /// watch breaks.
    pub async fn create_watcher(
        &self,
        id: &str,
        path: &str,
        options: &WatchOptions,
    ) -> Result<String, DaemonError> {
        let sandbox = self.running(id)?;
        if sandbox.watchers.map().len() >= WATCHERS_PER_SANDBOX {
            return Err(DaemonError::Conflict(format!(
                "a sandbox may hold at most {WATCHERS_PER_SANDBOX} watchers; remove one first"
            )));
        }
        let mut watcher = self.watch(id, path, options).await?;
        let watcher_id = airlock_store::new_secret("w-")
            .map_err(DaemonError::from)?
            .chars()
            .take(26)
            .collect::<String>();
        let polled = std::sync::Arc::new(Polled {
            state: std::sync::Mutex::new(PolledState::default()),
            task: std::sync::Mutex::new(None),
        });
        let weak = std::sync::Arc::downgrade(&polled);
        let task = tokio::spawn(async move {
            loop {
                let next = watcher.next().await;
                let Some(polled) = weak.upgrade() else { return };
                let mut state = polled.state.lock().unwrap_or_else(|p| p.into_inner());
                match next {
                    Some(Ok(change)) => state.keep(change),
                    Some(Err(e)) => {
                        state.error = Some(e);
                        state.ended = true;
                        return;
                    }
                    None => {
                        state.ended = true;
                        return;
                    }
                }
            }
        });
        *polled.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.abort_handle());
        let mut map = sandbox.watchers.map();
        if map.len() >= WATCHERS_PER_SANDBOX {
            return Err(DaemonError::Conflict(format!(
                "a sandbox may hold at most {WATCHERS_PER_SANDBOX} watchers; remove one first"
            )));
        }
        map.insert(watcher_id.clone(), polled);
        Ok(watcher_id)
    }

    /// The changes a named watcher saw since the last call. A watch that
    /// broke answers its error once and is then forgotten.
    pub fn watcher_changes(&self, id: &str, watcher_id: &str) -> Result<Polls, DaemonError> {
        let sandbox = self.running(id)?;
        let polled = sandbox
            .watchers
            .map()
            .get(watcher_id)
            .cloned()
            .ok_or_else(|| DaemonError::NotFound(format!("no watcher {watcher_id}")))?;
        let (polls, error, ended) = {
            let mut state = polled.state.lock().unwrap_or_else(|p| p.into_inner());
            state.bytes = 0;
            let polls = Polls {
                changes: state.changes.drain(..).collect(),
                dropped: std::mem::take(&mut state.dropped),
            };
            (polls, state.error.take(), state.ended)
        };
        if let Some(error) = error {
            sandbox.watchers.map().remove(watcher_id);
            return Err(error);
        }
        if ended && polls.changes.is_empty() {
            sandbox.watchers.map().remove(watcher_id);
            return Err(DaemonError::NotFound(format!(
                "watcher {watcher_id} has ended"
            )));
        }
        Ok(polls)
    }

    /// Stops and forgets a named watcher.
    pub fn remove_watcher(&self, id: &str, watcher_id: &str) -> Result<(), DaemonError> {
        let sandbox = self.running(id)?;
        let removed = sandbox.watchers.map().remove(watcher_id);
        match removed {
            Some(_) => Ok(()),
            None => Err(DaemonError::NotFound(format!("no watcher {watcher_id}"))),
        }
    }
}

/// Every entry under `path`, `depth` levels down, sorted by path, from
/// the agent of `sandbox` (of protocol [`LISTING_PROTOCOL`] or later) in
/// one walk, whatever the sandbox's state: at most
/// [`LIST_ALL_MAX_ENTRIES`] entries and [`LIST_ALL_MAX_BYTES`] of names.
pub(crate) async fn list_all_of(
    sandbox: &LiveSandbox,
    path: &str,
    depth: u32,
    xattrs: Option<String>,
) -> Result<Vec<FileInfo>, DaemonError> {
    let id = sandbox.id.as_str();
    let too_large = || {
        DaemonError::TooLarge(format!(
            "{path} holds more than {LIST_ALL_MAX_ENTRIES} entries (or \
             {} MiB of names) to depth {depth}; list a deeper path or with \
             a smaller depth",
            LIST_ALL_MAX_BYTES >> 20
        ))
    };
    let mut events = sandbox
        .agent()
        .request(Request::ListDirStream {
            path: path.to_owned(),
            depth,
            limit: LIST_ALL_MAX_ENTRIES,
            xattrs,
        })
        .await
        .map_err(closed(id))?;
    let mut entries: Vec<FileInfo> = Vec::new();
    let mut bytes = 0usize;
    loop {
        let frame = events
            .next()
            .await
            .map_err(closed(id))?
            .ok_or_else(|| DaemonError::NotRunning(id.to_owned()))?;
        match frame.msg {
            Event::EntriesChunk { entries: chunk } => {
                for entry in chunk {
                    bytes += entry.path.len()
                        + entry.name.len()
                        + entry.symlink_target.as_ref().map_or(0, String::len)
                        + entry
                            .xattrs
                            .iter()
                            .map(|(name, value)| name.len() + value.len())
                            .sum::<usize>();
                    if bytes > LIST_ALL_MAX_BYTES || entries.len() as u64 >= LIST_ALL_MAX_ENTRIES {
                        return Err(too_large());
                    }
                    entries.push(entry);
                }
            }
            Event::EntriesEnd { truncated, .. } => {
                if truncated {
                    return Err(too_large());
                }
                break;
            }
            Event::Error { kind, message } => return Err(DaemonError::from_agent(kind, message)),
            other => return Err(unexpected(&other)),
        }
    }
    entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn change(name: &str, attrs: usize) -> Change {
        let path = format!("/home/user/{name}");
        let entry = FileInfo {
            path: path.clone(),
            name: name.to_owned(),
            kind: airlock_protocol::FileKind::File,
            size: 0,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            mtime_ns: 0,
            symlink_target: None,
            xattrs: std::collections::BTreeMap::from([(
                "user.e2b.k".to_owned(),
                "v".repeat(attrs),
            )]),
        };
        Change {
            kind: FsEventKind::Write,
            path,
            entry: Some(entry),
        }
    }

    #[test]
    fn polled_watchers_keep_a_bounded_count_and_size() {
        let mut state = PolledState::default();
        for i in 0..WATCHER_CHANGES_KEPT + 10 {
            state.keep(change(&format!("f{i}"), 0));
        }
        assert_eq!(state.changes.len(), WATCHER_CHANGES_KEPT);
        assert_eq!(state.dropped, 10);
        assert_eq!(state.changes[0].path, "/home/user/f10");

        // Large entries are dropped by size, oldest first, never the newest.
        let mut state = PolledState::default();
        let big = change("big", 4000);
        let per = big.weight();
        for _ in 0..(WATCHER_BYTES_KEPT / per + 5) {
            state.keep(big.clone());
        }
        assert!(state.bytes <= WATCHER_BYTES_KEPT, "{}", state.bytes);
        assert_eq!(state.bytes, state.changes.len() * per);
        assert!(state.dropped >= 5);
        let mut huge = PolledState::default();
        huge.keep(change("huge", WATCHER_BYTES_KEPT * 2));
        assert_eq!(huge.changes.len(), 1);
    }

    #[test]
    fn only_what_is_still_there_carries_an_entry() {
        use FsEventKind::*;
        assert!(carries_entry(Create) && carries_entry(Write) && carries_entry(Chmod));
        assert!(!carries_entry(Remove) && !carries_entry(Rename));
    }
}
