//! The audit trail: three JSONL streams and their queryable copy.
//!
//! Every event goes to `<data-dir>/audit/<stream>.jsonl` (one JSON object a
//! line: `at`, `stream`, `kind`, `sandbox_id`, `request_id`, `detail`) and
//! to the store's `events` table, which `GET /v1/sandboxes/{id}/events`
//! reads. One writer task does both, off the request path: recording an
//! event is a channel send. [`Audit::flush`] waits until everything sent
//! before it is written, for readers that must see their own events.
//!
//! - **access**: API calls (method, route, status, key id), file reads and
//!   writes with path and bytes.
//! - **security**: policy denials, OOM kills, pids-limit hits, timeout kills.
//! - **runtime**: lifecycle changes, exec start and exit with code and duration.

use crate::SharedStore;
use airlock_store::{NewEvent, Stream};
use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};

/// Events queued for the writer before senders drop them (and count it).
const QUEUE: usize = 16_384;

enum Message {
    Event(NewEvent),
    Flush(oneshot::Sender<()>),
}

/// Where audit events go. Cheap to clone.
#[derive(Clone)]
pub struct Audit {
    queue: mpsc::Sender<Message>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Audit {
    /// Opens the three streams under `dir` (created 0700) and starts the writer.
    pub fn start(dir: &Path, store: SharedStore) -> std::io::Result<Audit> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let open = |name: &str| -> std::io::Result<File> {
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(dir.join(format!("{name}.jsonl")))
        };
        let mut files = [open("access")?, open("security")?, open("runtime")?];
        let (queue, mut inbox) = mpsc::channel::<Message>(QUEUE);
        // A plain thread: the writes are blocking file and SQLite I/O.
        std::thread::Builder::new()
            .name("audit".into())
            .spawn(move || {
                while let Some(message) = inbox.blocking_recv() {
                    let mut batch = vec![message];
                    while let Ok(more) = inbox.try_recv() {
                        batch.push(more);
                        if batch.len() >= 512 {
                            break;
                        }
                    }
                    let mut waiters = Vec::new();
                    let mut events = Vec::new();
                    for message in batch {
                        match message {
                            Message::Event(event) => events.push(event),
                            Message::Flush(done) => waiters.push(done),
                        }
                    }
                    write_batch(&mut files, &store, &events);
                    for done in waiters {
                        let _ = done.send(());
                    }
                }
            })?;
        Ok(Audit {
            queue,
            dropped: Default::default(),
        })
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
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn write_batch(files: &mut [File; 3], store: &SharedStore, events: &[NewEvent]) {
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
            if let Err(e) = file.write_all(bytes) {
                tracing::error!("cannot append to an audit stream: {e}");
            }
        }
    }
    let store = store.lock().unwrap_or_else(|p| p.into_inner());
    for event in events {
        // Events about no sandbox (e.g. a rejected API call) live only in
        // the files; the table is the per-sandbox query.
        if event.sandbox_id.is_some() {
            if let Err(e) = store.append_event(event) {
                tracing::error!("cannot store an audit event: {e}");
            }
        }
    }
}
