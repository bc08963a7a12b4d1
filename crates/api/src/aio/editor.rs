//! `POST /v1/file/str_replace_editor`: the Anthropic-style text editor
//! (`view`, `create`, `str_replace`, `insert`, `undo_edit`), through the
//! daemon's file operations like the other file calls. Its undo history is
//! kept here, with the dialect, per sandbox and file, bounded: at most
//! [`MAX_UNDO`] edits a file, [`MAX_HISTORY_BYTES`] in all (the oldest go
//! first), and it is forgotten with the sandbox's shell sessions.

use super::files::{read_whole, walk, write_whole};
use super::sandbox::{daemon_failed, Aio, AioJson, Target};
use super::{failed, ok};
use crate::RequestId;
use airlock_daemon::DaemonError;
use airlock_protocol::FileKind;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use serde_json::json;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Largest file the editor works on (and keeps a copy of to undo).
const MAX_EDIT: usize = 1 << 20;
/// Edits of one file that can be undone.
const MAX_UNDO: usize = 10;
/// Bytes the undo history of every sandbox keeps in all.
const MAX_HISTORY_BYTES: usize = 64 << 20;
/// Largest old or new content an answer carries back (past it, null).
const MAX_CONTENT_SHOWN: usize = 256 << 10;
/// Lines around an edit that its answer shows.
const SNIPPET_LINES: usize = 4;

/// A file's contents before its edits, oldest first, each with its place
/// in the order of all edits.
type Versions = VecDeque<(u64, Vec<u8>)>;

/// Contents before each edit, by sandbox and path.
#[derive(Default)]
struct Kept {
    files: HashMap<(String, String), Versions>,
    bytes: usize,
    next: u64,
    /// One edit at a time in each sandbox: a read, a change and a write.
    locks: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
}

/// The editor's undo history of every sandbox.
#[derive(Clone, Default)]
pub struct History {
    inner: Arc<Mutex<Kept>>,
}

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn key(sandbox: &str, path: &str) -> (String, String) {
        (sandbox.to_owned(), path.to_owned())
    }

    /// The lock edits in `sandbox` take.
    fn edits(&self, sandbox: &str) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(self.lock().locks.entry(sandbox.to_owned()).or_default())
    }

    /// Keeps `content` as what `path` was before its latest edit.
    fn push(&self, sandbox: &str, path: &str, content: Vec<u8>) {
        let mut kept = self.lock();
        let kept = &mut *kept;
        let seq = kept.next;
        kept.next += 1;
        kept.bytes += content.len();
        let versions = kept.files.entry(Self::key(sandbox, path)).or_default();
        versions.push_back((seq, content));
        if versions.len() > MAX_UNDO {
            if let Some((_, gone)) = versions.pop_front() {
                kept.bytes -= gone.len();
            }
        }
        // The oldest of all go first.
        while kept.bytes > MAX_HISTORY_BYTES {
            let oldest = kept
                .files
                .iter()
                .filter_map(|(k, v)| v.front().map(|(seq, _)| (*seq, k.clone())))
                .min();
            let Some((_, key)) = oldest else { break };
            if let Some(versions) = kept.files.get_mut(&key) {
                if let Some((_, gone)) = versions.pop_front() {
                    kept.bytes -= gone.len();
                }
                if versions.is_empty() {
                    kept.files.remove(&key);
                }
            }
        }
    }

    /// What `path` was before its latest edit not undone yet.
    fn pop(&self, sandbox: &str, path: &str) -> Option<Vec<u8>> {
        let mut kept = self.lock();
        let key = Self::key(sandbox, path);
        let versions = kept.files.get_mut(&key)?;
        let (_, content) = versions.pop_back()?;
        if versions.is_empty() {
            kept.files.remove(&key);
        }
        kept.bytes -= content.len();
        Some(content)
    }

    /// Forgets what every sandbox `live` says is gone kept.
    pub fn prune(&self, live: impl Fn(&str) -> bool) {
        let mut kept = self.lock();
        let kept = &mut *kept;
        let mut freed = 0;
        kept.files.retain(|(s, _), versions| {
            let keep = live(s);
            if !keep {
                freed += versions.iter().map(|(_, c)| c.len()).sum::<usize>();
            }
            keep
        });
        kept.bytes -= freed;
        kept.locks.retain(|s, _| live(s));
    }
}

#[derive(Deserialize)]
pub(super) struct Edit {
    command: String,
    path: String,
    file_text: Option<String>,
    old_str: Option<String>,
    new_str: Option<String>,
    insert_line: Option<i64>,
    view_range: Option<Vec<i64>>,
    replace_mode: Option<String>,
}

/// Why an edit was refused: a 400 whose message says what to change.
#[derive(Debug, thiserror::Error)]
enum EditError {
    #[error("{0}")]
    Bad(String),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
}

fn bad(message: impl Into<String>) -> EditError {
    EditError::Bad(message.into())
}

/// `POST /v1/file/str_replace_editor`.
pub(super) async fn str_replace_editor(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    AioJson(request): AioJson<Edit>,
) -> Response {
    let history = aio.sessions.history.clone();
    let lock = history.edits(&id);
    let _edits = lock.lock().await;
    match edit(&aio, &history, &id, &request, &request_id.0).await {
        Ok(data) => ok(data),
        Err(EditError::Bad(message)) => failed(StatusCode::BAD_REQUEST, message),
        Err(EditError::Daemon(e)) => daemon_failed(e),
    }
}

async fn edit(
    aio: &Aio,
    history: &History,
    id: &str,
    request: &Edit,
    request_id: &str,
) -> Result<serde_json::Value, EditError> {
    let path = request.path.as_str();
    if !path.starts_with('/') {
        return Err(bad(format!(
            "The path {path} is not an absolute path, it should start with `/`."
        )));
    }
    let answer = |output: String, prev_exist: bool, old: Option<&str>, new: Option<&str>| {
        let shown = |c: Option<&str>| {
            c.filter(|c| c.len() <= MAX_CONTENT_SHOWN)
                .map(str::to_owned)
        };
        json!({
            "output": output,
            "error": null,
            "path": path,
            "prev_exist": prev_exist,
            "old_content": shown(old),
            "new_content": shown(new),
        })
    };
    match request.command.as_str() {
        "view" => {
            let info = aio.api.daemon.stat(id, path).await?;
            if info.kind == FileKind::Dir {
                if request.view_range.as_ref().is_some_and(|r| !r.is_empty()) {
                    return Err(bad(
                        "The `view_range` parameter is not allowed when `path` points to a directory.",
                    ));
                }
                let root = path.trim_end_matches('/');
                let mut entries: Vec<String> = walk(aio, id, path, 2)
                    .await?
                    .into_iter()
                    .filter(|e| {
                        !e.path
                            .strip_prefix(root)
                            .unwrap_or(&e.path)
                            .split('/')
                            .any(|part| part.starts_with('.'))
                    })
                    .map(|e| e.path)
                    .collect();
                entries.sort();
                let output = format!(
                    "Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n{}\n",
                    std::iter::once(path.to_owned()).chain(entries).collect::<Vec<_>>().join("\n")
                );
                return Ok(answer(output, true, None, None));
            }
            let text = read_text(aio, id, path, request_id).await?;
            let lines: Vec<&str> = text.split('\n').collect();
            let (from, shown) = match request.view_range.as_deref() {
                None | Some([]) => (1, text.clone()),
                Some(&[start, end]) => {
                    let n = lines.len() as i64;
                    if start < 1 || start > n {
                        return Err(bad(format!("Invalid `view_range`: [{start}, {end}]. Its first element `{start}` should be within the range of lines of the file: [1, {n}]")));
                    }
                    if end != -1 && (end < start || end > n) {
                        return Err(bad(format!("Invalid `view_range`: [{start}, {end}]. Its second element `{end}` should be -1 or within [{start}, {n}]")));
                    }
                    let to = if end == -1 { n } else { end };
                    let (a, b) = (index(start - 1), index(to));
                    (index(start), lines[a..b].join("\n"))
                }
                Some(_) => return Err(bad("`view_range` should be a list of two integers.")),
            };
            Ok(answer(numbered(&shown, path, from), true, Some(&text), None))
        }
        "create" => {
            let Some(text) = request.file_text.as_deref() else {
                return Err(bad("Parameter `file_text` is required for command: create"));
            };
            if text.len() > MAX_EDIT {
                return Err(bad(format!("file_text: at most {MAX_EDIT} bytes")));
            }
            match aio.api.daemon.stat(id, path).await {
                Ok(_) => {
                    return Err(bad(format!(
                        "File already exists at: {path}. Cannot overwrite files using command `create`."
                    )))
                }
                Err(DaemonError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            write_whole(aio, id, path, text.as_bytes().to_vec(), request_id).await?;
            Ok(answer(
                format!("File created successfully at: {path}"),
                false,
                None,
                Some(text),
            ))
        }
        "str_replace" => {
            let Some(old) = request.old_str.as_deref() else {
                return Err(bad("Parameter `old_str` is required for command: str_replace"));
            };
            if old.is_empty() {
                return Err(bad("Parameter `old_str` must not be empty"));
            }
            let new = request.new_str.as_deref().unwrap_or("");
            let text = read_text(aio, id, path, request_id).await?;
            let at: Vec<usize> = text.match_indices(old).map(|(i, _)| i).collect();
            let chosen: Vec<usize> = match (request.replace_mode.as_deref(), at.as_slice()) {
                (_, []) => {
                    return Err(bad(format!(
                        "No replacement was performed, old_str `{old}` did not appear verbatim in {path}."
                    )))
                }
                (None, [one]) => vec![*one],
                (None, many) => {
                    let lines: Vec<String> = many
                        .iter()
                        .map(|i| (text[..*i].matches('\n').count() + 1).to_string())
                        .collect();
                    return Err(bad(format!(
                        "No replacement was performed. Multiple occurrences of old_str `{old}` in lines [{}]. Please ensure it is unique.",
                        lines.join(", ")
                    )));
                }
                (Some("ALL"), all) => all.to_vec(),
                (Some("FIRST"), all) => all[..1].to_vec(),
                (Some("LAST"), all) => all[all.len() - 1..].to_vec(),
                (Some(other), _) => {
                    return Err(bad(format!(
                        "replace_mode {other} is not one of ALL, FIRST, LAST"
                    )))
                }
            };
            let mut edited = String::with_capacity(text.len());
            let mut from = 0;
            for i in &chosen {
                edited.push_str(&text[from..*i]);
                edited.push_str(new);
                from = i + old.len();
            }
            edited.push_str(&text[from..]);
            if edited.len() > MAX_EDIT {
                return Err(bad(format!("the edited file would be larger than {MAX_EDIT} bytes")));
            }
            write_whole(aio, id, path, edited.clone().into_bytes(), request_id).await?;
            history.push(id, path, text.clone().into_bytes());
            let first = text[..chosen[0]].matches('\n').count();
            let start = first.saturating_sub(SNIPPET_LINES);
            let end = first + SNIPPET_LINES + new.matches('\n').count();
            let snippet: Vec<&str> = edited.split('\n').skip(start).take(end + 1 - start).collect();
            let output = format!(
                "The file {path} has been edited. {}Review the changes and make sure they are as expected. Edit the file again if necessary.",
                numbered(&snippet.join("\n"), &format!("a snippet of {path}"), start + 1)
            );
            Ok(answer(output, true, Some(&text), Some(&edited)))
        }
        "insert" => {
            let Some(line) = request.insert_line else {
                return Err(bad("Parameter `insert_line` is required for command: insert"));
            };
            let Some(new) = request.new_str.as_deref() else {
                return Err(bad("Parameter `new_str` is required for command: insert"));
            };
            let text = read_text(aio, id, path, request_id).await?;
            let lines: Vec<&str> = text.split('\n').collect();
            let n = lines.len() as i64;
            if line < 0 || line > n {
                return Err(bad(format!(
                    "Invalid `insert_line` parameter: {line}. It should be within the range of lines of the file: [0, {n}]"
                )));
            }
            let line = index(line);
            let inserted: Vec<&str> = new.split('\n').collect();
            let edited_lines: Vec<&str> = lines[..line]
                .iter()
                .chain(inserted.iter())
                .chain(lines[line..].iter())
                .copied()
                .collect();
            let edited = edited_lines.join("\n");
            if edited.len() > MAX_EDIT {
                return Err(bad(format!("the edited file would be larger than {MAX_EDIT} bytes")));
            }
            write_whole(aio, id, path, edited.clone().into_bytes(), request_id).await?;
            history.push(id, path, text.clone().into_bytes());
            let start = line.saturating_sub(SNIPPET_LINES);
            let end = (line + inserted.len() + SNIPPET_LINES).min(edited_lines.len());
            let output = format!(
                "The file {path} has been edited. {}Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). Edit the file again if necessary.",
                numbered(&edited_lines[start..end].join("\n"), "a snippet of the edited file", start + 1)
            );
            Ok(answer(output, true, Some(&text), Some(&edited)))
        }
        "undo_edit" => {
            let Some(before) = history.pop(id, path) else {
                return Err(bad(format!("No edit history found for {path}.")));
            };
            if let Err(e) = write_whole(aio, id, path, before.clone(), request_id).await {
                history.push(id, path, before);
                return Err(e.into());
            }
            let before = String::from_utf8_lossy(&before).into_owned();
            let output = format!(
                "Last edit to {path} undone successfully. {}",
                numbered(&before, path, 1)
            );
            Ok(answer(output, true, None, Some(&before)))
        }
        other => Err(bad(format!(
            "Unrecognized command {other}. The allowed commands are: view, create, str_replace, insert, undo_edit"
        ))),
    }
}

/// A line number from the wire (checked to be in range) as an index.
fn index(n: i64) -> usize {
    usize::try_from(n).unwrap_or(0)
}

/// The whole of `path` as text (at most [`MAX_EDIT`] bytes).
async fn read_text(aio: &Aio, id: &str, path: &str, request_id: &str) -> Result<String, EditError> {
    let bytes = match read_whole(aio, id, path, MAX_EDIT, request_id).await {
        Ok(bytes) => bytes,
        Err(DaemonError::TooLarge(_)) => {
            return Err(bad(format!(
                "{path} is larger than {MAX_EDIT} bytes: the editor works on smaller files"
            )))
        }
        Err(e) => return Err(e.into()),
    };
    String::from_utf8(bytes).map_err(|_| bad(format!("{path} is not UTF-8 text")))
}

/// `text` as `cat -n` shows it, numbered from `first`.
fn numbered(text: &str, descriptor: &str, first: usize) -> String {
    let lines: Vec<String> = text
        .split('\n')
        .enumerate()
        .map(|(i, line)| format!("{:6}\t{line}", i + first))
        .collect();
    format!(
        "Here's the result of running `cat -n` on {descriptor}:\n{}\n",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_numbered_as_cat_n() {
        assert_eq!(
            numbered("a\nb", "f", 9),
            "Here's the result of running `cat -n` on f:\n     9\ta\n    10\tb\n"
        );
    }

    #[test]
    fn history_is_bounded_and_undone_last_first() {
        let history = History::default();
        for i in 0..(MAX_UNDO + 3) {
            history.push("sbx-1", "/f", vec![i as u8]);
        }
        let mut undone = Vec::new();
        while let Some(content) = history.pop("sbx-1", "/f") {
            undone.push(content[0] as usize);
        }
        let expected: Vec<usize> = (3..MAX_UNDO + 3).rev().collect();
        assert_eq!(undone, expected);
        assert_eq!(history.lock().bytes, 0);
    }

    #[test]
    fn history_drops_the_oldest_past_its_bytes() {
        let history = History::default();
        let big = MAX_HISTORY_BYTES / 4 + 1;
        history.push("sbx-1", "/a", vec![1; big]);
        history.push("sbx-2", "/b", vec![2; big]);
        history.push("sbx-1", "/c", vec![3; big]);
        history.push("sbx-2", "/d", vec![4; big]);
        assert!(history.lock().bytes <= MAX_HISTORY_BYTES);
        assert!(history.pop("sbx-1", "/a").is_none());
        assert!(history.pop("sbx-2", "/d").is_some());
        history.prune(|s| s != "sbx-2");
        assert!(history.pop("sbx-2", "/b").is_none());
        assert!(history.pop("sbx-1", "/c").is_some());
        assert_eq!(history.lock().bytes, 0);
    }
}
