//! The audit trail: three JSONL streams and their queryable copy.
//!
//! Every event goes to `<data-dir>/audit/<stream>.jsonl` (one JSON object a
//! line: `at`, `stream`, `kind`, `sandbox_id`, `request_id`, `detail`) and
//! to the store's `events` table, which `GET /v1/sandboxes/{id}/events`
//! reads. One writer thread does both, off the request path: recording an
//! event is a channel send. [`Audit::flush`] waits until everything sent
//! before it is written, for readers that must see their own events.
//!
//! - **access**: API calls (method, route, status, key id), file reads and
//!   writes with path and bytes.
//! - **security**: policy denials, OOM kills, pids-limit hits, timeout kills.
//! - **runtime**: lifecycle changes, exec start and exit with code and duration.
//!
//! What a sandbox (or a stranger) can make the trail write is bounded, so
//! no flood grows the disk or the daemon's memory without bound
//! ([`AuditLimits`]):
//!
//! - Security events are **aggregated** per interval: each sandbox (and
//!   the events of no sandbox) gets the first few of each kind in full, and
//!   all of them share a budget; the rest are counted by kind, reason and
//!   destination and written as one `audit.suppressed` event when the
//!   interval ends ([`Throttle`]).
//! - Each stream **rotates** past a size (`security.jsonl.1` … `.N`), so a
//!   stream never holds more than `(N + 1) ×` that size.
//! - The events table has a **retention** (age and row count), pruned every
//!   minute.

use crate::SharedStore;
use airlock_store::{NewEvent, Stream};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};

/// Events queued for the writer before senders drop them (and count it).
const QUEUE: usize = 16_384;
/// How often the writer wakes with nothing sent (to end intervals).
const TICK: Duration = Duration::from_secs(1);
/// Ticks between prunings of the events table.
const PRUNE_EVERY_TICKS: u32 = 60;

/// What the audit trail may write, whatever floods it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditLimits {
    /// Length of an aggregation interval.
    pub interval: Duration,
    /// Security events of one kind about one sandbox written in full per
    /// interval; the rest are counted.
    pub full_per_kind: u32,
    /// Security events written in full per interval, all kinds and
    /// sandboxes together.
    pub full_total: u32,
    /// Sandbox and kind pairs counted separately per interval; past it,
    /// events are counted together.
    pub counted_pairs: usize,
    /// Kind, reason and destination triples named in one summary; the rest
    /// are summed as `other`.
    pub summary_entries: usize,
    /// Size past which a stream file rotates.
    pub file_bytes: u64,
    /// Rotated files kept per stream.
    pub files_kept: u32,
    /// Age past which events leave the table.
    pub retention: Duration,
    /// Rows the table keeps at most (the oldest go first).
    pub max_rows: u64,
}

impl Default for AuditLimits {
    /// 20 of a kind and 500 in all in full per 10 s; 64 MiB files, 4 kept
    /// (320 MiB a stream at most); 30 days or a million rows in the table.
    fn default() -> Self {
        AuditLimits {
            interval: Duration::from_secs(10),
            full_per_kind: 20,
            full_total: 500,
            counted_pairs: 256,
            summary_entries: 16,
            file_bytes: 64 << 20,
            files_kept: 4,
            retention: Duration::from_secs(30 * 24 * 3600),
            max_rows: 1_000_000,
        }
    }
}

enum Message {
    Event(NewEvent),
    Flush(oneshot::Sender<()>),
    Tick,
}

/// Counters the writer keeps, read by the metrics.
#[derive(Default)]
struct Counters {
    dropped: AtomicU64,
    suppressed: AtomicU64,
}

/// Where audit events go. Cheap to clone.
#[derive(Clone)]
pub struct Audit {
    queue: mpsc::Sender<Message>,
    counters: Arc<Counters>,
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Audit {
    /// Opens the three streams under `dir` (created 0700) and starts the
    /// writer, with the default [`AuditLimits`].
    pub fn start(dir: &Path, store: SharedStore) -> std::io::Result<Audit> {
        Audit::start_with(dir, store, AuditLimits::default())
    }

    /// [`Audit::start`] with other limits.
    pub fn start_with(
        dir: &Path,
        store: SharedStore,
        limits: AuditLimits,
    ) -> std::io::Result<Audit> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let mut files = [
            StreamFile::open(dir, "access", limits)?,
            StreamFile::open(dir, "security", limits)?,
            StreamFile::open(dir, "runtime", limits)?,
        ];
        let (queue, mut inbox) = mpsc::channel::<Message>(QUEUE);
        let counters = Arc::new(Counters::default());
        let written = Arc::clone(&counters);
        // Plain threads: the writes are blocking file and SQLite I/O.
        std::thread::Builder::new()
            .name("audit".into())
            .spawn(move || {
                let mut throttle = Throttle::new(limits);
                let mut ticks = 0u32;
                while let Some(message) = inbox.blocking_recv() {
                    let mut batch = vec![message];
                    while let Ok(more) = inbox.try_recv() {
                        batch.push(more);
                        if batch.len() >= 512 {
                            break;
                        }
                    }
                    let mut waiters = Vec::new();
                    let mut events = throttle.roll(now_ms());
                    let mut prune = false;
                    for message in batch {
                        match message {
                            Message::Event(event) => {
                                events.extend(throttle.roll(event.at));
                                match throttle.admit(event) {
                                    Some(event) => events.push(event),
                                    None => {
                                        written.suppressed.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            }
                            Message::Flush(done) => waiters.push(done),
                            Message::Tick => {
                                ticks += 1;
                                if ticks.is_multiple_of(PRUNE_EVERY_TICKS) {
                                    prune = true;
                                }
                            }
                        }
                    }
                    write_batch(&mut files, &store, &events);
                    if prune {
                        prune_table(&store, limits);
                    }
                    for done in waiters {
                        let _ = done.send(());
                    }
                }
            })?;
        let ticker = queue.clone();
        std::thread::Builder::new()
            .name("audit-tick".into())
            .spawn(move || loop {
                std::thread::sleep(TICK);
                match ticker.try_send(Message::Tick) {
                    Err(mpsc::error::TrySendError::Closed(_)) => break,
                    _ => continue,
                }
            })?;
        Ok(Audit { queue, counters })
    }

    /// Records one event (never blocks; a full queue drops and counts it).
    pub fn record(
        &self,
        stream: Stream,
        kind: &str,
        sandbox_id: Option<&str>,
        request_id: Option<&str>,
        detail: Value,
    ) {
        let event = NewEvent {
            sandbox_id: sandbox_id.map(str::to_owned),
            request_id: request_id.map(str::to_owned),
            stream,
            kind: kind.to_owned(),
            at: now_ms(),
            detail,
        };
        if self.queue.try_send(Message::Event(event)).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits until every event recorded before the call is written.
    pub async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.queue.send(Message::Flush(done)).await.is_ok() {
            let _ = written.await;
        }
    }

    /// Events dropped because the writer fell behind (a metric; should be 0).
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    /// Security events counted into an `audit.suppressed` summary instead
    /// of being written in full.
    pub fn suppressed(&self) -> u64 {
        self.counters.suppressed.load(Ordering::Relaxed)
    }
}

/// What one sandbox and kind (or, past the pairs counted separately, all
/// the rest) had suppressed in the current interval.
#[derive(Default)]
struct Tally {
    written: u32,
    suppressed: u64,
    by: BTreeMap<(String, String, String), u64>,
    other: u64,
}

/// Decides which security events are written in full and sums up the rest
/// per interval. Pure: time comes from the events and the caller.
pub struct Throttle {
    limits: AuditLimits,
    /// Start of the current interval, unix ms.
    from_ms: i64,
    written: u32,
    /// By sandbox (`None`: no sandbox) and kind (`None`: past
    /// `counted_pairs`, every kind together).
    tallies: HashMap<(Option<String>, Option<String>), Tally>,
}

impl Throttle {
    pub fn new(limits: AuditLimits) -> Throttle {
        Throttle {
            limits,
            from_ms: 0,
            written: 0,
            tallies: HashMap::new(),
        }
    }

    fn interval_ms(&self) -> i64 {
        (self.limits.interval.as_millis() as i64).max(1)
    }

    /// Ends the interval if `now_ms` is past it: the summaries of what it
    /// suppressed, to be written before anything later.
    pub fn roll(&mut self, now_ms: i64) -> Vec<NewEvent> {
        let interval = self.interval_ms();
        let start = now_ms - now_ms.rem_euclid(interval);
        if start <= self.from_ms {
            return Vec::new();
        }
        let to_ms = self.from_ms + interval;
        let mut summaries: Vec<NewEvent> = std::mem::take(&mut self.tallies)
            .into_iter()
            .filter(|(_, tally)| tally.suppressed > 0)
            .map(|((sandbox_id, kind), tally)| NewEvent {
                sandbox_id,
                request_id: None,
                stream: Stream::Security,
                kind: "audit.suppressed".into(),
                at: to_ms,
                detail: json!({
                    "kind": kind,
                    "from_ms": self.from_ms,
                    "to_ms": to_ms,
                    "suppressed": tally.suppressed,
                    "by": tally.by.iter().map(|((kind, reason, destination), count)| json!({
                        "kind": kind,
                        "reason": reason,
                        "destination": destination,
                        "count": count,
                    })).collect::<Vec<_>>(),
                    "other": tally.other,
                }),
            })
            .collect();
        summaries.sort_by(|a, b| a.sandbox_id.cmp(&b.sandbox_id));
        self.from_ms = start;
        self.written = 0;
        summaries
    }

    /// The event if it is to be written now; `None` if it was counted.
    pub fn admit(&mut self, event: NewEvent) -> Option<NewEvent> {
        if event.stream != Stream::Security {
            return Some(event);
        }
        let mut key = (event.sandbox_id.clone(), Some(event.kind.clone()));
        if !self.tallies.contains_key(&key) && self.tallies.len() >= self.limits.counted_pairs {
            key = (None, None);
        }
        let limits = self.limits;
        let budget_left = self.written < limits.full_total;
        let tally = self.tallies.entry(key).or_default();
        if budget_left && tally.written < limits.full_per_kind {
            tally.written += 1;
            self.written += 1;
            return Some(event);
        }
        tally.suppressed += 1;
        let text = |name: &str| {
            event
                .detail
                .get(name)
                .and_then(Value::as_str)
                .map(|v| v.chars().take(256).collect::<String>())
                .unwrap_or_default()
        };
        let destination = match text("destination") {
            d if d.is_empty() => text("path"),
            d => d,
        };
        let entry = (event.kind.clone(), text("reason"), destination);
        if let Some(count) = tally.by.get_mut(&entry) {
            *count += 1;
        } else if tally.by.len() < limits.summary_entries {
            tally.by.insert(entry, 1);
        } else {
            tally.other += 1;
        }
        None
    }
}

/// One stream's file, rotated past its size.
struct StreamFile {
    path: PathBuf,
    file: File,
    bytes: u64,
    limits: AuditLimits,
}

impl StreamFile {
    fn open(dir: &Path, name: &str, limits: AuditLimits) -> std::io::Result<StreamFile> {
        let path = dir.join(format!("{name}.jsonl"));
        let file = Self::open_file(&path)?;
        let bytes = file.metadata()?.len();
        Ok(StreamFile {
            path,
            file,
            bytes,
            limits,
        })
    }

    fn open_file(path: &Path) -> std::io::Result<File> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
    }

    fn rotated(&self, n: u32) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    /// `x.jsonl` becomes `x.jsonl.1`, `.1` becomes `.2`, … and the oldest
    /// beyond `files_kept` goes.
    fn rotate(&mut self) -> std::io::Result<()> {
        let kept = self.limits.files_kept;
        if kept == 0 {
            self.file.set_len(0)?;
            self.bytes = 0;
            return Ok(());
        }
        let _ = std::fs::remove_file(self.rotated(kept));
        for n in (1..kept).rev() {
            let _ = std::fs::rename(self.rotated(n), self.rotated(n + 1));
        }
        std::fs::rename(&self.path, self.rotated(1))?;
        self.file = Self::open_file(&self.path)?;
        self.bytes = 0;
        Ok(())
    }

    fn append(&mut self, bytes: &[u8]) {
        if self.bytes > 0 && self.bytes + bytes.len() as u64 > self.limits.file_bytes {
            if let Err(e) = self.rotate() {
                tracing::error!("cannot rotate {}: {e}", self.path.display());
            }
        }
        match self.file.write_all(bytes) {
            Ok(()) => self.bytes += bytes.len() as u64,
            Err(e) => tracing::error!("cannot append to {}: {e}", self.path.display()),
        }
    }
}

fn write_batch(files: &mut [StreamFile; 3], store: &SharedStore, events: &[NewEvent]) {
    if events.is_empty() {
        return;
    }
    let mut lines: [Vec<u8>; 3] = Default::default();
    for event in events {
        let line = json!({
            "at": event.at,
            "stream": event.stream.as_str(),
            "kind": event.kind,
            "sandbox_id": event.sandbox_id,
            "request_id": event.request_id,
            "detail": event.detail,
        });
        let index = match event.stream {
            Stream::Access => 0,
            Stream::Security => 1,
            Stream::Runtime => 2,
        };
        let _ = serde_json::to_writer(&mut lines[index], &line);
        lines[index].push(b'\n');
    }
    for (file, bytes) in files.iter_mut().zip(lines.iter()) {
        if !bytes.is_empty() {
            file.append(bytes);
        }
    }
    let store = store.lock().unwrap_or_else(|p| p.into_inner());
    // Events about no sandbox (e.g. a rejected API call) live only in the
    // files; the table is the per-sandbox query.
    let about_sandboxes = events.iter().filter(|e| e.sandbox_id.is_some());
    if let Err(e) = store.append_events(about_sandboxes) {
        tracing::error!("cannot store {} audit events: {e}", events.len());
    }
}

fn prune_table(store: &SharedStore, limits: AuditLimits) {
    let before = now_ms().saturating_sub(limits.retention.as_millis() as i64);
    let store = store.lock().unwrap_or_else(|p| p.into_inner());
    match store.prune_events(before, limits.max_rows) {
        Ok(0) => {}
        Ok(n) => tracing::debug!("pruned {n} audit events from the table"),
        Err(e) => tracing::error!("cannot prune audit events: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(sandbox: Option<&str>, destination: &str, at: i64) -> NewEvent {
        NewEvent {
            sandbox_id: sandbox.map(str::to_owned),
            request_id: None,
            stream: Stream::Security,
            kind: "egress.denied".into(),
            at,
            detail: json!({"reason": "not_allowlisted", "destination": destination}),
        }
    }

    fn limits() -> AuditLimits {
        AuditLimits {
            interval: Duration::from_secs(10),
            full_per_kind: 3,
            full_total: 5,
            counted_pairs: 2,
            summary_entries: 2,
            ..AuditLimits::default()
        }
    }

    #[test]
    fn a_flood_is_written_in_full_up_to_its_share_then_summed() {
        let mut throttle = Throttle::new(limits());
        assert!(throttle.roll(10_000).is_empty());
        let written = (0..1000)
            .filter_map(|n| {
                throttle.admit(denied(
                    Some("sbx-1"),
                    &format!("n{}.example", n % 3),
                    10_000 + n,
                ))
            })
            .count();
        assert_eq!(written, 3, "the first of the kind in full");
        assert!(
            throttle.roll(19_999).is_empty(),
            "the interval has not ended"
        );
        let summaries = throttle.roll(20_000);
        assert_eq!(summaries.len(), 1);
        let summary = &summaries[0];
        assert_eq!(summary.kind, "audit.suppressed");
        assert_eq!(summary.sandbox_id.as_deref(), Some("sbx-1"));
        assert_eq!(summary.at, 20_000);
        assert_eq!(summary.detail["suppressed"], 997);
        assert_eq!(summary.detail["kind"], "egress.denied");
        let by = summary.detail["by"].as_array().unwrap();
        assert_eq!(by.len(), 2, "at most summary_entries destinations named");
        let named: u64 = by.iter().map(|e| e["count"].as_u64().unwrap()).sum();
        assert_eq!(named + summary.detail["other"].as_u64().unwrap(), 997);
        // A new interval writes in full again.
        assert!(throttle.admit(denied(Some("sbx-1"), "x", 20_001)).is_some());
    }

    #[test]
    fn the_total_budget_and_the_pairs_counted_are_bounded() {
        let mut throttle = Throttle::new(limits());
        throttle.roll(0);
        // Five sandboxes, two events each: the total budget (5) binds.
        let written = (0..10)
            .filter_map(|n| throttle.admit(denied(Some(&format!("sbx-{}", n / 2)), "x", n)))
            .count();
        assert_eq!(written, 5);
        // Only two pairs are counted apart; the rest share one tally.
        let summaries = throttle.roll(10_000);
        assert!(summaries.len() <= 3, "{summaries:?}");
        let total: u64 = summaries
            .iter()
            .map(|s| s.detail["suppressed"].as_u64().unwrap())
            .sum();
        assert_eq!(total, 5);
        assert!(summaries
            .iter()
            .any(|s| s.sandbox_id.is_none() && s.detail["kind"].is_null()));
    }

    #[test]
    fn other_streams_are_never_held_back() {
        let mut throttle = Throttle::new(limits());
        let mut event = denied(Some("sbx-1"), "x", 0);
        event.stream = Stream::Runtime;
        assert_eq!(
            (0..100)
                .filter_map(|_| throttle.admit(event.clone()))
                .count(),
            100
        );
    }

    #[test]
    fn streams_rotate_and_keep_a_bounded_number_of_files() {
        let dir = tempfile::tempdir().unwrap();
        let limits = AuditLimits {
            file_bytes: 100,
            files_kept: 2,
            ..AuditLimits::default()
        };
        let mut file = StreamFile::open(dir.path(), "security", limits).unwrap();
        for _ in 0..50 {
            file.append(&[b'x'; 39]);
            file.append(b"\n");
        }
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["security.jsonl", "security.jsonl.1", "security.jsonl.2"]
        );
        for name in names {
            let len = std::fs::metadata(dir.path().join(&name)).unwrap().len();
            assert!(len <= 100, "{name} is {len} bytes");
        }
    }
}
