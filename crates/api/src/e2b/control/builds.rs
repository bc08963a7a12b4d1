//! What the e2b template routes remember between calls: the builds the
//! SDK asked for (by build id, with their logs) and the COPY files it
//! uploaded for them (by template id and files hash, unpacked in the layer
//! store's staging area).
//!
//! Everything here is bounded: at most [`Limits::max_builds`] builds and
//! [`Limits::max_uploads`] uploads, the uploads' files together at most
//! [`Limits::upload_bytes`] on disk (an upload in flight reserves its
//! whole allowance until it is unpacked and measured), each build's log
//! at most [`Limits::log_entries`] entries and [`Limits::log_bytes`]
//! bytes (then one entry saying the rest is left out: indices stay stable,
//! as the SDK's log offsets need). A finished build, an upload and a build
//! never started are forgotten after [`Limits::ttl`]; a build's uploads go
//! when it ends. A daemon restart forgets it all (the templates built are
//! in the store).

use airlock_daemon::builds::{BuildEvent, ContextDir};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The bounds of [`Builds`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_builds: usize,
    pub max_uploads: usize,
    /// Bytes of files all uploads together may hold.
    pub upload_bytes: u64,
    /// Bytes of files one upload may hold.
    pub upload_each: u64,
    pub ttl: Duration,
    pub log_entries: usize,
    pub log_bytes: usize,
    /// Longest log message, bytes (longer ones are cut).
    pub message_bytes: usize,
}

impl Limits {
    /// The bounds for a daemon whose uploads may be `max_upload` bytes and
    /// images `max_image` bytes.
    pub fn for_daemon(max_upload: u64, max_image: u64) -> Limits {
        Limits {
            max_builds: 64,
            max_uploads: 256,
            upload_bytes: max_image,
            upload_each: max_upload.min(max_image),
            ttl: Duration::from_secs(3600),
            log_entries: 10_000,
            log_bytes: 1 << 20,
            message_bytes: 4096,
        }
    }
}

/// Where a build is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Asked for (`POST /v3/templates`), not started.
    Waiting,
    Building,
    Ready,
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Waiting => "waiting",
            Status::Building => "building",
            Status::Ready => "ready",
            Status::Error => "error",
        }
    }
}

/// One log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub timestamp_ms: i64,
    pub level: &'static str,
    pub message: String,
    /// `base`, the SDK's step number, or `finalize`.
    pub step: Option<String>,
}

/// Why a build failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    pub message: String,
    pub step: Option<String>,
    /// The failed step's last output.
    pub entries: Vec<Entry>,
}

/// Output entries of the current step kept for a failure's reason.
const STEP_TAIL: usize = 20;

#[derive(Debug)]
struct Log {
    status: Status,
    entries: Vec<Entry>,
    bytes: usize,
    truncated: bool,
    reason: Option<Reason>,
    finished: Option<Instant>,
    /// The SDK's step number of each spec step (see `steps::Converted`).
    origin: Vec<Option<usize>>,
    /// The step running (its label) and its last output entries.
    step: Option<String>,
    step_tail: VecDeque<Entry>,
}

/// A build the SDK asked for.
#[derive(Debug)]
pub struct Build {
    pub id: String,
    pub template_id: String,
    pub name: String,
    pub tags: Vec<String>,
    pub owner_key_id: String,
    pub created_ms: i64,
    created: Instant,
    limits: Limits,
    log: Mutex<Log>,
}

/// A build's state as the status route shows it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub status: Status,
    pub entries: Vec<Entry>,
    pub reason: Option<Reason>,
}

fn now_ms() -> i64 {
    airlock_daemon::audit::now_ms()
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// An executor's message `step N (…) …` with the SDK's number of spec
/// step N (the steps airlock adds first are `the e2b setup`).
fn renumbered(message: &str, origin: &[Option<usize>]) -> String {
    let Some(rest) = message.strip_prefix("step ") else {
        return message.to_owned();
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let Ok(number) = rest[..digits].parse::<usize>() else {
        return message.to_owned();
    };
    if !rest[digits..].starts_with(" (") {
        return message.to_owned();
    }
    match origin.get(number.wrapping_sub(1)) {
        Some(Some(sdk)) => format!("step {sdk}{}", &rest[digits..]),
        Some(None) => format!("the e2b setup step{}", &rest[digits..]),
        None => message.to_owned(),
    }
}

impl Build {
    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its status, and up to `limit` log entries from `offset` on.
    pub fn snapshot(&self, offset: usize, limit: usize) -> Snapshot {
        let log = self.lock();
        Snapshot {
            status: log.status,
            entries: log
                .entries
                .iter()
                .skip(offset)
                .take(limit)
                .cloned()
                .collect(),
            reason: log.reason.clone(),
        }
    }

    pub fn status(&self) -> Status {
        self.lock().status
    }

    /// Starts it, if it is waiting: `false` if it was started before.
    pub fn start(&self, origin: Vec<Option<usize>>) -> bool {
        let mut log = self.lock();
        if log.status != Status::Waiting {
            return false;
        }
        log.status = Status::Building;
        log.origin = origin;
        true
    }

    fn push(
        log: &mut Log,
        limits: &Limits,
        level: &'static str,
        message: &str,
        step: Option<String>,
    ) {
        let entry = Entry {
            timestamp_ms: now_ms(),
            level,
            message: cut(message, limits.message_bytes),
            step,
        };
        if log.step.is_some() && log.step == entry.step {
            log.step_tail.push_back(entry.clone());
            while log.step_tail.len() > STEP_TAIL {
                log.step_tail.pop_front();
            }
        }
        if log.truncated {
            return;
        }
        if log.entries.len() + 1 >= limits.log_entries
            || log.bytes + entry.message.len() > limits.log_bytes
        {
            log.truncated = true;
            log.entries.push(Entry {
                timestamp_ms: entry.timestamp_ms,
                level: "warn",
                message: "the build's log is longer than this daemon keeps; the rest is left out"
                    .into(),
                step: None,
            });
            return;
        }
        log.bytes += entry.message.len();
        log.entries.push(entry);
    }

    /// The label of spec step `index` (from 1): the SDK's number, or
    /// `base` for the steps airlock adds before the SDK's.
    fn label(log: &Log, index: usize) -> String {
        match log.origin.get(index.wrapping_sub(1)) {
            Some(Some(number)) => number.to_string(),
            _ => "base".to_owned(),
        }
    }

    /// Logs what the executor reports.
    pub fn record(&self, event: BuildEvent) {
        let mut log = self.lock();
        let limits = self.limits;
        match event {
            BuildEvent::Base { base, digest } => {
                log.step = Some("base".into());
                log.step_tail.clear();
                Build::push(
                    &mut log,
                    &limits,
                    "info",
                    &format!("[base] {base} ({digest})"),
                    Some("base".into()),
                );
            }
            BuildEvent::Step {
                index,
                total,
                instruction,
                cached,
            } => {
                let label = Build::label(&log, index);
                log.step = Some(label.clone());
                log.step_tail.clear();
                let cached = if cached { " (cached)" } else { "" };
                Build::push(
                    &mut log,
                    &limits,
                    "info",
                    &format!("[{index}/{total}] {instruction}{cached}"),
                    Some(label),
                );
            }
            BuildEvent::Output { index, text, .. } => {
                let label = Build::label(&log, index);
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    Build::push(&mut log, &limits, "info", line, Some(label.clone()));
                }
            }
            BuildEvent::Layer {
                index,
                diff_id,
                bytes,
                ms,
            } => {
                let label = Build::label(&log, index);
                Build::push(
                    &mut log,
                    &limits,
                    "debug",
                    &format!("layer {diff_id}: {bytes} bytes in {ms} ms"),
                    Some(label),
                );
            }
        }
    }

    /// Ends it: ready, or failed with `message`.
    pub fn finish(&self, outcome: Result<(), String>) {
        let mut log = self.lock();
        let limits = self.limits;
        match outcome {
            Ok(()) => {
                Build::push(
                    &mut log,
                    &limits,
                    "info",
                    &format!("template {} is ready", self.name),
                    Some("finalize".into()),
                );
                log.status = Status::Ready;
            }
            Err(message) => {
                let message = renumbered(&message, &log.origin);
                let step = log.step.clone();
                let mut entries: Vec<Entry> = log.step_tail.iter().cloned().collect();
                // The failed command's output, when the message does not
                // carry it already.
                let output: Vec<&str> = entries
                    .iter()
                    .filter(|e| e.level == "info" && !e.message.starts_with('['))
                    .map(|e| e.message.as_str())
                    .collect();
                let mut full = message.clone();
                if let Some(last) = output.last() {
                    if !message.contains(*last) {
                        full = cut(
                            &format!("{message}\n{}", output.join("\n")),
                            8 * limits.message_bytes,
                        );
                    }
                }
                for entry in &mut entries {
                    entry.level = "error";
                }
                Build::push(&mut log, &limits, "error", &full, step.clone());
                log.reason = Some(Reason {
                    message: full,
                    step,
                    entries,
                });
                log.status = Status::Error;
            }
        }
        log.finished = Some(Instant::now());
    }

    fn expired(&self, ttl: Duration) -> bool {
        let log = self.lock();
        match (log.status, log.finished) {
            (Status::Waiting, _) => self.created.elapsed() > ttl,
            (_, Some(finished)) => finished.elapsed() > ttl,
            _ => false,
        }
    }

    fn finished(&self) -> bool {
        matches!(self.status(), Status::Ready | Status::Error)
    }
}

enum Upload {
    /// Asked for; the PUT must carry the token (its hash kept).
    Pending { token: [u8; 32], since: Instant },
    /// Being received.
    Receiving,
    Stored {
        dir: Arc<ContextDir>,
        bytes: u64,
        since: Instant,
    },
}

#[derive(Default)]
struct State {
    builds: HashMap<String, Arc<Build>>,
    uploads: HashMap<(String, String), Upload>,
    /// Bytes reserved by uploads in flight.
    reserved: u64,
}

impl State {
    fn stored_bytes(&self) -> u64 {
        self.uploads
            .values()
            .map(|u| match u {
                Upload::Stored { bytes, .. } => *bytes,
                _ => 0,
            })
            .sum()
    }
}

/// Why the registry refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "this daemon is tracking {0} template builds already; try again once some have finished"
    )]
    TooManyBuilds(usize),
    #[error("this daemon holds {0} uploads already; try again once builds have used them")]
    TooManyUploads(usize),
    #[error("the uploads waiting for builds fill this daemon's allowance; try again once builds have used them")]
    NoRoom,
    #[error("this upload URL is not valid (or was used already); ask for a new one")]
    BadToken,
}

/// What `GET /templates/{id}/files/{hash}` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Files {
    Present,
    /// Upload them with this token.
    Upload {
        token: String,
    },
}

/// Bytes reserved for an upload in flight; given back when dropped.
pub struct Reservation {
    builds: Arc<Builds>,
    key: (String, String),
    pub bytes: u64,
    stored: bool,
}

impl Reservation {
    /// The upload arrived whole: its files are kept for the builds.
    pub fn store(mut self, dir: ContextDir, bytes: u64) {
        let mut state = self.builds.lock();
        state.reserved = state.reserved.saturating_sub(self.bytes);
        self.bytes = 0;
        state.uploads.insert(
            self.key.clone(),
            Upload::Stored {
                dir: Arc::new(dir),
                bytes,
                since: Instant::now(),
            },
        );
        self.stored = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut state = self.builds.lock();
        state.reserved = state.reserved.saturating_sub(self.bytes);
        if !self.stored {
            // A failed upload: the client asks for a new URL.
            if matches!(state.uploads.get(&self.key), Some(Upload::Receiving)) {
                state.uploads.remove(&self.key);
            }
        }
    }
}

fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The registry (see the module doc).
pub struct Builds {
    limits: Limits,
    state: Mutex<State>,
}

impl Builds {
    pub fn new(limits: Limits) -> Builds {
        Builds {
            limits,
            state: Mutex::default(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets what expired.
    fn sweep(&self, state: &mut State) {
        let ttl = self.limits.ttl;
        state.builds.retain(|_, b| !b.expired(ttl));
        state.uploads.retain(|_, u| match u {
            Upload::Pending { since, .. } | Upload::Stored { since, .. } => since.elapsed() <= ttl,
            Upload::Receiving => true,
        });
    }

    /// A new build of template `template_id` named `name`.
    pub fn add(
        &self,
        id: String,
        template_id: String,
        name: String,
        tags: Vec<String>,
        owner_key_id: String,
    ) -> Result<Arc<Build>, Refused> {
        let mut state = self.lock();
        self.sweep(&mut state);
        if state.builds.len() >= self.limits.max_builds {
            // The oldest finished build makes room.
            let oldest = state
                .builds
                .values()
                .filter(|b| b.finished())
                .min_by_key(|b| b.created)
                .map(|b| b.id.clone());
            match oldest {
                Some(id) => {
                    state.builds.remove(&id);
                }
                None => return Err(Refused::TooManyBuilds(state.builds.len())),
            }
        }
        let build = Arc::new(Build {
            id: id.clone(),
            template_id,
            name,
            tags,
            owner_key_id,
            created_ms: now_ms(),
            created: Instant::now(),
            limits: self.limits,
            log: Mutex::new(Log {
                status: Status::Waiting,
                entries: Vec::new(),
                bytes: 0,
                truncated: false,
                reason: None,
                finished: None,
                origin: Vec::new(),
                step: None,
                step_tail: VecDeque::new(),
            }),
        });
        state.builds.insert(id, Arc::clone(&build));
        Ok(build)
    }

    pub fn build(&self, id: &str) -> Option<Arc<Build>> {
        let mut state = self.lock();
        self.sweep(&mut state);
        state.builds.get(id).cloned()
    }

    /// The builds of template `template_id`, oldest first.
    pub fn builds_of(&self, template_id: &str) -> Vec<Arc<Build>> {
        let mut state = self.lock();
        self.sweep(&mut state);
        let mut builds: Vec<Arc<Build>> = state
            .builds
            .values()
            .filter(|b| b.template_id == template_id)
            .cloned()
            .collect();
        builds.sort_by_key(|b| b.created);
        builds
    }

    /// The name of template `template_id`, if a build knows it.
    pub fn name_of(&self, template_id: &str) -> Option<String> {
        self.lock()
            .builds
            .values()
            .find(|b| b.template_id == template_id)
            .map(|b| b.name.clone())
    }

    /// Whether a build of `name` declared `tag`.
    pub fn has_tag(&self, name: &str, tag: &str) -> bool {
        self.lock()
            .builds
            .values()
            .any(|b| b.name == name && b.tags.iter().any(|t| t == tag))
    }

    /// Whether the files `hash` of template `template_id` are stored, or
    /// a token to upload them with.
    pub fn files(&self, template_id: &str, hash: &str) -> Result<Files, Refused> {
        let mut state = self.lock();
        self.sweep(&mut state);
        let key = (template_id.to_owned(), hash.to_owned());
        if let Some(Upload::Stored { .. }) = state.uploads.get(&key) {
            return Ok(Files::Present);
        }
        if !state.uploads.contains_key(&key) && state.uploads.len() >= self.limits.max_uploads {
            return Err(Refused::TooManyUploads(state.uploads.len()));
        }
        let token = airlock_store::new_secret("upl-").map_err(|_| Refused::NoRoom)?;
        // A new token replaces one handed out before (and a PUT under way
        // keeps its own).
        if !matches!(state.uploads.get(&key), Some(Upload::Receiving)) {
            state.uploads.insert(
                key,
                Upload::Pending {
                    token: token_hash(&token),
                    since: Instant::now(),
                },
            );
        }
        Ok(Files::Upload { token })
    }

    /// Starts receiving the files `hash` of `template_id` under `token`
    /// (used up), reserving the allowance of one upload.
    pub fn receive(
        self: &Arc<Self>,
        template_id: &str,
        hash: &str,
        token: &str,
    ) -> Result<Reservation, Refused> {
        let mut state = self.lock();
        self.sweep(&mut state);
        let key = (template_id.to_owned(), hash.to_owned());
        match state.uploads.get(&key) {
            Some(Upload::Pending {
                token: expected, ..
            }) if *expected == token_hash(token) => {}
            _ => return Err(Refused::BadToken),
        }
        let bytes = self.limits.upload_each;
        if state.stored_bytes() + state.reserved + bytes > self.limits.upload_bytes {
            return Err(Refused::NoRoom);
        }
        state.reserved += bytes;
        state.uploads.insert(key.clone(), Upload::Receiving);
        Ok(Reservation {
            builds: Arc::clone(self),
            key,
            bytes,
            stored: false,
        })
    }

    /// The stored files of `template_id` for each hash (by the same key),
    /// or the first hash that has none.
    pub fn contexts(
        &self,
        template_id: &str,
        hashes: &BTreeMap<usize, String>,
    ) -> Result<BTreeMap<usize, Arc<ContextDir>>, (usize, String)> {
        let state = self.lock();
        let mut out = BTreeMap::new();
        for (index, hash) in hashes {
            match state.uploads.get(&(template_id.to_owned(), hash.clone())) {
                Some(Upload::Stored { dir, .. }) => {
                    out.insert(*index, Arc::clone(dir));
                }
                _ => return Err((*index, hash.clone())),
            }
        }
        Ok(out)
    }

    /// Forgets the uploads of a build that ended (its files go once no
    /// other build holds them).
    pub fn release(&self, template_id: &str, hashes: &BTreeMap<usize, String>) {
        let mut state = self.lock();
        for hash in hashes.values() {
            state
                .uploads
                .remove(&(template_id.to_owned(), hash.clone()));
        }
    }

    /// Uploads held (stored or on their way), and their bytes stored and
    /// reserved.
    pub fn usage(&self) -> (usize, u64) {
        let state = self.lock();
        (state.uploads.len(), state.stored_bytes() + state.reserved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_builds: 2,
            max_uploads: 2,
            upload_bytes: 100,
            upload_each: 60,
            ttl: Duration::from_secs(3600),
            log_entries: 5,
            log_bytes: 1000,
            message_bytes: 10,
        }
    }

    fn add(builds: &Builds, id: &str) -> Result<Arc<Build>, Refused> {
        builds.add(id.into(), "tpl".into(), "name".into(), vec![], "key".into())
    }

    #[test]
    fn builds_are_bounded_and_finished_ones_make_room() {
        let builds = Builds::new(limits());
        let a = add(&builds, "a").unwrap();
        add(&builds, "b").unwrap();
        assert_eq!(add(&builds, "c").unwrap_err(), Refused::TooManyBuilds(2));
        a.start(vec![]);
        a.finish(Ok(()));
        add(&builds, "c").unwrap();
        assert!(builds.build("a").is_none());
        assert!(builds.build("c").is_some());
    }

    #[test]
    fn logs_keep_stable_indices_and_stop_at_their_bound() {
        let builds = Builds::new(limits());
        let build = add(&builds, "a").unwrap();
        assert!(build.start(vec![None, Some(1)]));
        assert!(!build.start(vec![]));
        build.record(BuildEvent::Step {
            index: 2,
            total: 2,
            instruction: "RUN x".into(),
            cached: false,
        });
        build.record(BuildEvent::Output {
            index: 2,
            stream: "stdout",
            text: "one\ntwo\nthree\nfour\nfive\nsix that is long\n".into(),
        });
        let all = build.snapshot(0, 100).entries;
        assert_eq!(all.len(), 5, "{all:?}");
        assert_eq!(all[0].step.as_deref(), Some("1"));
        assert_eq!(all[1].message, "one");
        assert_eq!(all[4].level, "warn");
        assert_eq!(build.snapshot(3, 100).entries, all[3..].to_vec());
        assert_eq!(build.snapshot(1, 2).entries, all[1..3].to_vec());
        assert!(build.snapshot(9, 100).entries.is_empty());
        // The failure carries the step's output, even past the log's bound.
        build.finish(Err("step 1 failed".into()));
        let snapshot = build.snapshot(0, 100);
        assert_eq!(snapshot.status, Status::Error);
        let reason = snapshot.reason.unwrap();
        assert_eq!(reason.step.as_deref(), Some("1"));
        assert!(
            reason.message.starts_with("step 1 failed\none\ntwo"),
            "{}",
            reason.message
        );
        assert!(reason.message.contains("six that i…"), "{}", reason.message);
        assert!(reason.entries.iter().all(|e| e.level == "error"));
    }

    #[test]
    fn executor_step_numbers_become_the_sdks() {
        let origin = [None, None, Some(1), Some(2)];
        assert_eq!(
            renumbered("step 4 (RUN x) failed: boom", &origin),
            "step 2 (RUN x) failed: boom"
        );
        assert_eq!(
            renumbered("step 1 (USER user): no", &origin),
            "the e2b setup step (USER user): no"
        );
        assert_eq!(renumbered("step 9 (RUN x)", &origin), "step 9 (RUN x)");
        assert_eq!(renumbered("stepping", &origin), "stepping");
        assert_eq!(renumbered("step 3 of", &origin), "step 3 of");
    }

    #[test]
    fn uploads_need_their_token_once_and_stay_within_their_allowance() {
        let builds = Arc::new(Builds::new(limits()));
        let Files::Upload { token } = builds.files("tpl", "h1").unwrap() else {
            panic!("nothing was uploaded yet")
        };
        assert_eq!(
            builds.receive("tpl", "h1", "wrong").err(),
            Some(Refused::BadToken)
        );
        assert_eq!(
            builds.receive("other", "h1", &token).err(),
            Some(Refused::BadToken)
        );
        let reservation = builds.receive("tpl", "h1", &token).unwrap();
        assert_eq!(builds.usage(), (1, 60));
        // Used up.
        assert_eq!(
            builds.receive("tpl", "h1", &token).err(),
            Some(Refused::BadToken)
        );
        // A second upload would pass the allowance while the first is in
        // flight.
        let Files::Upload { token: second } = builds.files("tpl", "h2").unwrap() else {
            panic!()
        };
        assert_eq!(
            builds.receive("tpl", "h2", &second).err(),
            Some(Refused::NoRoom)
        );
        // At most two uploads held.
        assert_eq!(
            builds.files("tpl", "h3").unwrap_err(),
            Refused::TooManyUploads(2)
        );
        // A failed upload leaves nothing.
        drop(reservation);
        assert_eq!(builds.usage(), (1, 0));
        assert_eq!(
            builds
                .contexts("tpl", &BTreeMap::from([(3, "h1".to_owned())]))
                .err(),
            Some((3, "h1".to_owned()))
        );
    }
}
