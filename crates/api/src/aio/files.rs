//! AIO file calls: read, write, replace, search, list, find, glob, grep,
//! upload and download (the editor is [`super::editor`]), through the daemon's file operations (the agent, inside the
//! sandbox): the host never opens a path a sandbox names.

use super::sandbox::{daemon_failed, Aio, AioJson, Target};
use super::{failed, ok};
use crate::RequestId;
use airlock_daemon::files::WriteMode;
use airlock_daemon::DaemonError;
use airlock_protocol::{FileInfo, FileKind};
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine;
use serde::Deserialize;
use serde_json::json;

/// Largest file a read or grep loads whole into an answer.
pub(super) const MAX_READ: usize = 16 << 20;
/// Most entries a listing walks.
const MAX_ENTRIES: usize = 50_000;
/// Most bytes one grep reads, over all its files (past it the answer is
/// `truncated`).
const MAX_GREP_BYTES: usize = 256 << 20;

/// The whole of `path`, at most `limit` bytes (`TooLarge` past it).
pub(super) async fn read_whole(
    aio: &Aio,
    id: &str,
    path: &str,
    limit: usize,
    request_id: &str,
) -> Result<Vec<u8>, DaemonError> {
    let mut reader = aio.api.daemon.read_file(id, path, request_id).await?;
    let mut bytes = Vec::new();
    while let Some(chunk) = reader.next_chunk().await {
        bytes.extend_from_slice(&chunk?);
        if bytes.len() > limit {
            return Err(DaemonError::TooLarge(format!(
                "{path} is larger than {limit} bytes"
            )));
        }
    }
    Ok(bytes)
}

#[derive(Deserialize)]
pub(super) struct Read {
    file: String,
    start_line: Option<i64>,
    end_line: Option<i64>,
}

/// `POST /v1/file/read`: lines `start_line` (0-based) to `end_line`
/// (exclusive) when given.
pub(super) async fn read(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    AioJson(request): AioJson<Read>,
) -> Response {
    let content = match read_whole(&aio, &id, &request.file, MAX_READ, &request_id.0).await {
        Ok(content) => String::from_utf8_lossy(&content).into_owned(),
        Err(e) => return daemon_failed(e),
    };
    let content = match (request.start_line, request.end_line) {
        (None, None) => content,
        (start, end) => {
            let lines: Vec<&str> = content.split_inclusive('\n').collect();
            let clamp = |n: i64| usize::try_from(n.max(0)).unwrap_or(0).min(lines.len());
            let from = clamp(start.unwrap_or(0));
            let to = end.map_or(lines.len(), clamp).max(from);
            lines[from..to].concat()
        }
    };
    ok(json!({"content": content, "file": request.file}))
}

#[derive(Deserialize)]
pub(super) struct Write {
    file: String,
    content: String,
    encoding: Option<String>,
    #[serde(default)]
    append: bool,
    #[serde(default)]
    leading_newline: bool,
    #[serde(default)]
    trailing_newline: bool,
}

/// `POST /v1/file/write`: UTF-8 or base64, replacing or appending;
/// parents are made.
pub(super) async fn write(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    AioJson(request): AioJson<Write>,
) -> Response {
    let mut data = match request.encoding.as_deref() {
        None | Some("utf-8") | Some("utf8") | Some("raw") => request.content.into_bytes(),
        Some("base64") => match base64::engine::general_purpose::STANDARD.decode(request.content) {
            Ok(data) => data,
            Err(e) => {
                return failed(
                    StatusCode::BAD_REQUEST,
                    format!("content is not base64: {e}"),
                )
            }
        },
        Some(other) => {
            return failed(
                StatusCode::BAD_REQUEST,
                format!("encoding {other} is not one of utf-8, base64, raw"),
            )
        }
    };
    if request.leading_newline {
        data.insert(0, b'\n');
    }
    if request.trailing_newline {
        data.push(b'\n');
    }
    if request.append {
        match read_whole(&aio, &id, &request.file, MAX_READ, &request_id.0).await {
            Ok(mut before) => {
                before.extend_from_slice(&data);
                data = before;
            }
            Err(DaemonError::NotFound(_)) => {}
            Err(e) => return daemon_failed(e),
        }
    }
    let written = data.len();
    match write_whole(&aio, &id, &request.file, data, &request_id.0).await {
        Ok(()) => ok(json!({"file": request.file, "bytes_written": written})),
        Err(e) => daemon_failed(e),
    }
}

/// Writes `data` as the whole of `path`, atomically (parents made), within
/// the daemon's upload limit.
pub(super) async fn write_whole(
    aio: &Aio,
    id: &str,
    path: &str,
    data: Vec<u8>,
    request_id: &str,
) -> Result<(), DaemonError> {
    let limit = aio.api.daemon.config().max_upload_bytes;
    let stream = futures_util::stream::iter([Ok::<Vec<u8>, std::io::Error>(data)]);
    aio.api
        .daemon
        .write_file(
            id,
            path,
            None,
            None,
            WriteMode::Atomic,
            None,
            stream,
            limit,
            request_id,
        )
        .await
        .map(|_| ())
}

#[derive(Deserialize)]
pub(super) struct Replace {
    file: String,
    old_str: String,
    new_str: String,
}

/// `POST /v1/file/replace`: every occurrence of `old_str` becomes
/// `new_str` (bytes for bytes: a file that is not UTF-8 keeps the rest of
/// its bytes), written back atomically; `replaced_count` says how many.
/// A file without `old_str` is left untouched.
pub(super) async fn replace(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    AioJson(request): AioJson<Replace>,
) -> Response {
    if request.old_str.is_empty() {
        return failed(StatusCode::BAD_REQUEST, "old_str must not be empty");
    }
    let content = match read_whole(&aio, &id, &request.file, MAX_READ, &request_id.0).await {
        Ok(content) => content,
        Err(e) => return daemon_failed(e),
    };
    let (replaced, count) = replace_all(
        &content,
        request.old_str.as_bytes(),
        request.new_str.as_bytes(),
    );
    if count == 0 {
        return ok(json!({"file": request.file, "replaced_count": 0}));
    }
    match write_whole(&aio, &id, &request.file, replaced, &request_id.0).await {
        Ok(()) => ok(json!({"file": request.file, "replaced_count": count})),
        Err(e) => daemon_failed(e),
    }
}

/// `content` with every `old` (not overlapping, left to right) replaced by
/// `new`, and how many there were.
fn replace_all(content: &[u8], old: &[u8], new: &[u8]) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(content.len());
    let mut count = 0;
    let mut rest = content;
    while let Some(at) = memchr::memmem::find(rest, old) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(new);
        rest = &rest[at + old.len()..];
        count += 1;
    }
    out.extend_from_slice(rest);
    (out, count)
}

#[derive(Deserialize)]
pub(super) struct Search {
    file: String,
    regex: String,
}

/// `POST /v1/file/search`: the lines of `file` that match `regex`, and
/// their numbers (1-based, as `grep -n` and this API's grep count).
pub(super) async fn search(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    AioJson(request): AioJson<Search>,
) -> Response {
    let matcher = match regex::RegexBuilder::new(&request.regex)
        .size_limit(1 << 20)
        .build()
    {
        Ok(matcher) => matcher,
        Err(e) => return failed(StatusCode::BAD_REQUEST, format!("regex: {e}")),
    };
    let content = match read_whole(&aio, &id, &request.file, MAX_READ, &request_id.0).await {
        Ok(content) => content,
        Err(e) => return daemon_failed(e),
    };
    let text = String::from_utf8_lossy(&content);
    let (mut matches, mut numbers) = (Vec::new(), Vec::new());
    for (number, line) in text.lines().enumerate() {
        if matcher.is_match(line) {
            matches.push(line);
            numbers.push(number + 1);
        }
    }
    ok(json!({"file": request.file, "matches": matches, "line_numbers": numbers}))
}

#[derive(Deserialize)]
pub(super) struct List {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default = "yes")]
    show_hidden: bool,
    file_types: Option<Vec<String>>,
    max_depth: Option<u32>,
}

fn yes() -> bool {
    true
}

fn is_hidden(root: &str, entry: &FileInfo) -> bool {
    entry
        .path
        .strip_prefix(root)
        .unwrap_or(&entry.path)
        .split('/')
        .any(|part| part.starts_with('.'))
}

fn info(entry: &FileInfo) -> serde_json::Value {
    let modified = std::time::UNIX_EPOCH
        + std::time::Duration::from_nanos(u64::try_from(entry.mtime_ns).unwrap_or(0));
    json!({
        "name": entry.name,
        "path": entry.path,
        "is_directory": entry.kind == FileKind::Dir,
        "size": entry.size,
        "modified_time": super::shell::rfc3339(modified),
        "permissions": format!("{:o}", entry.mode & 0o7777),
        "extension": std::path::Path::new(&entry.name).extension().map(|e| e.to_string_lossy().into_owned()),
    })
}

/// Every entry under `path`, `depth` levels down (at most
/// [`MAX_ENTRIES`]).
pub(super) async fn walk(
    aio: &Aio,
    id: &str,
    path: &str,
    depth: u32,
) -> Result<Vec<FileInfo>, DaemonError> {
    let mut entries = aio.api.daemon.list_dir_all(id, path, depth, None).await?;
    entries.truncate(MAX_ENTRIES);
    Ok(entries)
}

/// `POST /v1/file/list`.
pub(super) async fn list(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    AioJson(request): AioJson<List>,
) -> Response {
    let depth = if request.recursive {
        request
            .max_depth
            .unwrap_or(airlock_protocol::MAX_LIST_DEPTH)
    } else {
        1
    }
    .clamp(1, airlock_protocol::MAX_LIST_DEPTH);
    let root = request.path.trim_end_matches('/').to_owned();
    let entries = match walk(&aio, &id, &request.path, depth).await {
        Ok(entries) => entries,
        Err(e) => return daemon_failed(e),
    };
    let files: Vec<serde_json::Value> = entries
        .iter()
        .filter(|e| request.show_hidden || !is_hidden(&root, e))
        .filter(|e| {
            request.file_types.as_ref().is_none_or(|types| {
                e.kind == FileKind::Dir || types.iter().any(|t| e.name.ends_with(t.as_str()))
            })
        })
        .map(info)
        .collect();
    let directories = files.iter().filter(|f| f["is_directory"] == true).count();
    ok(json!({
        "path": request.path,
        "files": files,
        "total_count": files.len(),
        "directory_count": directories,
        "file_count": files.len() - directories,
    }))
}

#[derive(Deserialize)]
pub(super) struct Find {
    path: String,
    glob: String,
}

/// Whether `text` matches the shell glob `pattern` (`*`, `?`, `[...]`;
/// `**/` matches any number of directories, `*` none of `/`).
pub(super) fn glob_matches(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some(b'*') if p.get(1) == Some(&b'*') => {
                // `**/` (or a trailing `**`): any run of whole directories.
                let rest = if p.get(2) == Some(&b'/') {
                    &p[3..]
                } else {
                    &p[2..]
                };
                if go(rest, t) {
                    return true;
                }
                t.iter()
                    .enumerate()
                    .filter(|(_, b)| **b == b'/')
                    .any(|(i, _)| go(rest, &t[i + 1..]))
                    || (rest.is_empty())
            }
            Some(b'*') => (0..=t.len())
                .take_while(|i| *i == 0 || t[i - 1] != b'/')
                .any(|i| go(&p[1..], &t[i..])),
            Some(b'?') => t.first().is_some_and(|c| *c != b'/') && go(&p[1..], &t[1..]),
            Some(b'[') => {
                let Some(end) = p.iter().skip(1).position(|b| *b == b']').map(|i| i + 1) else {
                    return t.first() == Some(&b'[') && go(&p[1..], &t[1..]);
                };
                let Some(c) = t.first() else { return false };
                let class = &p[1..end];
                let (negated, class) = match class.first() {
                    Some(b'!') | Some(b'^') => (true, &class[1..]),
                    _ => (false, class),
                };
                let mut hit = false;
                let mut i = 0;
                while i < class.len() {
                    if i + 2 < class.len() && class[i + 1] == b'-' {
                        hit |= (class[i]..=class[i + 2]).contains(c);
                        i += 3;
                    } else {
                        hit |= class[i] == *c;
                        i += 1;
                    }
                }
                hit != negated && go(&p[end + 1..], &t[1..])
            }
            Some(b) => t.first() == Some(b) && go(&p[1..], &t[1..]),
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

/// `POST /v1/file/find`: files under `path` whose path relative to it
/// matches `glob` (a pattern without `/` matches names at any depth).
pub(super) async fn find(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    AioJson(request): AioJson<Find>,
) -> Response {
    let root = request.path.trim_end_matches('/').to_owned();
    let entries = match walk(&aio, &id, &request.path, airlock_protocol::MAX_LIST_DEPTH).await {
        Ok(entries) => entries,
        Err(e) => return daemon_failed(e),
    };
    let files: Vec<&str> = entries
        .iter()
        .filter(|e| e.kind == FileKind::File)
        .filter(|e| {
            let relative = e
                .path
                .strip_prefix(&root)
                .unwrap_or(&e.path)
                .trim_start_matches('/');
            if request.glob.contains('/') {
                glob_matches(&request.glob, relative)
            } else {
                glob_matches(&request.glob, &e.name)
            }
        })
        .map(|e| e.path.as_str())
        .collect();
    ok(json!({"path": request.path, "files": files}))
}

#[derive(Deserialize)]
pub(super) struct Glob {
    path: String,
    pattern: String,
    exclude: Option<Vec<String>>,
    include_hidden: Option<bool>,
    files_only: Option<bool>,
    include_metadata: Option<bool>,
    max_results: Option<i64>,
    sort_by: Option<String>,
    sort_desc: Option<bool>,
}

/// Most results a glob answers with.
const MAX_GLOB_RESULTS: i64 = 50_000;

/// `POST /v1/file/glob`: entries under `path` whose path relative to it
/// matches `pattern` as a shell glob would (`*` stays within a directory,
/// `**/` crosses any number), sorted and at most `max_results`.
pub(super) async fn glob(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    AioJson(request): AioJson<Glob>,
) -> Response {
    let max_results = request.max_results.unwrap_or(5000);
    if !(1..=MAX_GLOB_RESULTS).contains(&max_results) {
        return failed(
            StatusCode::BAD_REQUEST,
            format!("max_results: 1 to {MAX_GLOB_RESULTS}"),
        );
    }
    let sort_by = request.sort_by.as_deref().unwrap_or("path");
    if !["path", "name", "size", "modified"].contains(&sort_by) {
        return failed(
            StatusCode::BAD_REQUEST,
            "sort_by: one of path, name, size, modified",
        );
    }
    let pattern = request.pattern.trim_start_matches("./");
    if pattern.is_empty() || pattern.starts_with('/') {
        return failed(
            StatusCode::BAD_REQUEST,
            "pattern: a non-empty glob relative to path",
        );
    }
    // Only as deep as the pattern reaches, unless it has `**`.
    let depth = if pattern.contains("**") {
        airlock_protocol::MAX_LIST_DEPTH
    } else {
        u32::try_from(pattern.split('/').count())
            .unwrap_or(airlock_protocol::MAX_LIST_DEPTH)
            .clamp(1, airlock_protocol::MAX_LIST_DEPTH)
    };
    let root = request.path.trim_end_matches('/').to_owned();
    let entries = match walk(&aio, &id, &request.path, depth).await {
        Ok(entries) => entries,
        Err(e) => return daemon_failed(e),
    };
    let walked_all = entries.len() < MAX_ENTRIES;
    let files_only = request.files_only.unwrap_or(true);
    let include_hidden = request.include_hidden.unwrap_or(false);
    let excluded = |relative: &str, name: &str| {
        request.exclude.as_ref().is_some_and(|globs| {
            globs
                .iter()
                .any(|g| glob_matches(g, relative) || glob_matches(g, name))
        })
    };
    let mut found: Vec<&FileInfo> = entries
        .iter()
        .filter(|e| !files_only || e.kind != FileKind::Dir)
        .filter(|e| include_hidden || !is_hidden(&root, e))
        .filter(|e| {
            let relative = e
                .path
                .strip_prefix(&root)
                .unwrap_or(&e.path)
                .trim_start_matches('/');
            glob_matches(pattern, relative) && !excluded(relative, &e.name)
        })
        .collect();
    match sort_by {
        "name" => found.sort_by(|a, b| a.name.cmp(&b.name).then(a.path.cmp(&b.path))),
        "size" => found.sort_by(|a, b| a.size.cmp(&b.size).then(a.path.cmp(&b.path))),
        "modified" => found.sort_by(|a, b| a.mtime_ns.cmp(&b.mtime_ns).then(a.path.cmp(&b.path))),
        _ => found.sort_by(|a, b| a.path.cmp(&b.path)),
    }
    if request.sort_desc.unwrap_or(false) {
        found.reverse();
    }
    let total = found.len();
    let keep = usize::try_from(max_results).unwrap_or(usize::MAX);
    let metadata = request.include_metadata.unwrap_or(true);
    let files: Vec<serde_json::Value> = found
        .iter()
        .take(keep)
        .map(|e| {
            let mut entry = json!({
                "path": e.path,
                "name": e.name,
                "is_directory": e.kind == FileKind::Dir,
            });
            if metadata {
                let shown = info(e);
                entry["size"] = json!(e.size);
                entry["modified_time"] = shown["modified_time"].clone();
            }
            entry
        })
        .collect();
    ok(json!({
        "path": request.path,
        "pattern": request.pattern,
        "files": files,
        "total_count": total,
        "truncated": total > keep || !walked_all,
    }))
}

/// One field of a form.
#[derive(Debug)]
struct FormPart<'a> {
    name: String,
    filename: Option<String>,
    data: &'a [u8],
}

/// The fields of a `multipart/form-data` body held whole.
fn form_parts<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<FormPart<'a>>, String> {
    let delimiter = format!("--{boundary}");
    let between = format!("\r\n--{boundary}");
    let mut at = if body.starts_with(delimiter.as_bytes()) {
        delimiter.len()
    } else {
        memchr::memmem::find(body, between.as_bytes())
            .map(|i| i + between.len())
            .ok_or("the multipart body has no delimiter")?
    };
    let mut parts = Vec::new();
    loop {
        let rest = &body[at..];
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        let rest = rest
            .strip_prefix(b"\r\n")
            .ok_or("a multipart delimiter is not followed by CRLF")?;
        let head_end = memchr::memmem::find(rest, b"\r\n\r\n")
            .ok_or("a multipart part has no headers' end")?;
        let head = String::from_utf8_lossy(&rest[..head_end]);
        let disposition = head
            .split("\r\n")
            .find(|line| {
                line.split(':')
                    .next()
                    .is_some_and(|k| k.trim().eq_ignore_ascii_case("content-disposition"))
            })
            .and_then(|line| line.split_once(':').map(|(_, v)| v.to_owned()))
            .ok_or("a multipart part has no Content-Disposition")?;
        let data_start = head_end + 4;
        let data_len = memchr::memmem::find(&rest[data_start..], between.as_bytes())
            .ok_or("the multipart body ends early")?;
        parts.push(FormPart {
            name: crate::form::disposition_param(&disposition, "name").unwrap_or_default(),
            filename: crate::form::disposition_param(&disposition, "filename"),
            data: &rest[data_start..data_start + data_len],
        });
        at = body.len() - rest.len() + data_start + data_len + between.len();
    }
}

/// [`form_parts`] for the fuzz targets: each field's name, file name and
/// bytes.
#[cfg(feature = "fuzzing")]
pub fn fuzz_form_parts(
    body: &[u8],
    boundary: &str,
) -> Result<Vec<(String, Option<String>, Vec<u8>)>, String> {
    form_parts(body, boundary).map(|parts| {
        parts
            .into_iter()
            .map(|p| (p.name, p.filename, p.data.to_vec()))
            .collect()
    })
}

/// `POST /v1/file/upload`: a `multipart/form-data` body with the file's
/// bytes as `file` and where it goes as `path` (by default the home
/// directory, under the part's file name); written atomically, parents
/// made. The body is read whole, so at most what the dialect buffers.
pub(super) async fn upload(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let Some(boundary) = crate::form::multipart_boundary(content_type) else {
        return failed(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the body must be multipart/form-data with a file field",
        );
    };
    let parts = match form_parts(&body, boundary) {
        Ok(parts) => parts,
        Err(e) => return failed(StatusCode::BAD_REQUEST, e),
    };
    let Some(file) = parts.iter().find(|p| p.name == "file") else {
        return failed(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the file field is required",
        );
    };
    let named = parts
        .iter()
        .find(|p| p.name == "path")
        .map(|p| String::from_utf8_lossy(p.data).trim().to_owned())
        .filter(|p| !p.is_empty());
    let path = match named {
        Some(path) => path,
        None => {
            let name = file
                .filename
                .as_deref()
                .and_then(|f| f.rsplit(['/', '\\']).next())
                .filter(|f| !f.is_empty() && *f != "." && *f != "..");
            match name {
                Some(name) => format!("/home/user/{name}"),
                None => {
                    return failed(
                        StatusCode::BAD_REQUEST,
                        "path is required when the file has no usable name",
                    )
                }
            }
        }
    };
    let size = file.data.len();
    match write_whole(&aio, &id, &path, file.data.to_vec(), &request_id.0).await {
        Ok(()) => ok(json!({"file_path": path, "file_size": size, "success": true})),
        Err(e) => daemon_failed(e),
    }
}

#[derive(Deserialize)]
pub(super) struct Grep {
    path: String,
    pattern: String,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default)]
    fixed_strings: bool,
    max_results: Option<usize>,
    max_file_size: Option<String>,
    include: Option<Vec<String>>,
    exclude: Option<Vec<String>>,
    #[serde(default = "yes")]
    recursive: bool,
}

/// `"1M"`, `"500K"`, `"2048"` in bytes.
fn size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let n: usize = digits.parse().ok()?;
    let unit = match unit.trim().to_ascii_uppercase().trim_end_matches('B') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(unit)
}

/// `POST /v1/file/grep`: matching lines of the text files under `path`.
pub(super) async fn grep(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    AioJson(request): AioJson<Grep>,
) -> Response {
    let max_results = request.max_results.unwrap_or(500).clamp(1, 10_000);
    let max_size = match request.max_file_size.as_deref().map(size) {
        None => 1 << 20,
        Some(Some(n)) => n.min(MAX_READ),
        Some(None) => return failed(StatusCode::BAD_REQUEST, "max_file_size: e.g. 1M or 500K"),
    };
    let source = if request.fixed_strings {
        regex::escape(&request.pattern)
    } else {
        request.pattern.clone()
    };
    let matcher = match regex::RegexBuilder::new(&source)
        .case_insensitive(request.case_insensitive)
        .size_limit(1 << 20)
        .build()
    {
        Ok(matcher) => matcher,
        Err(e) => return failed(StatusCode::BAD_REQUEST, format!("pattern: {e}")),
    };
    let depth = if request.recursive {
        airlock_protocol::MAX_LIST_DEPTH
    } else {
        1
    };
    let entries = match walk(&aio, &id, &request.path, depth).await {
        Ok(entries) => entries,
        Err(e) => return daemon_failed(e),
    };
    let wanted = |name: &str| {
        request
            .include
            .as_ref()
            .is_none_or(|globs| globs.iter().any(|g| glob_matches(g, name)))
            && !request
                .exclude
                .as_ref()
                .is_some_and(|globs| globs.iter().any(|g| glob_matches(g, name)))
    };
    let mut matches = Vec::new();
    let (mut searched, mut matched_files, mut truncated) = (0usize, 0usize, false);
    let mut read_so_far = 0usize;
    'files: for entry in entries.iter().filter(|e| e.kind == FileKind::File) {
        if entry.size as usize > max_size || !wanted(&entry.name) {
            continue;
        }
        if read_so_far + entry.size as usize > MAX_GREP_BYTES {
            truncated = true;
            break;
        }
        let Ok(content) = read_whole(&aio, &id, &entry.path, max_size, &request_id.0).await else {
            continue;
        };
        read_so_far += content.len();
        // Binary files are skipped, as grep does by default.
        if content.contains(&0) {
            continue;
        }
        searched += 1;
        let text = String::from_utf8_lossy(&content);
        let mut hit = false;
        for (number, line) in text.lines().enumerate() {
            if matcher.is_match(line) {
                if matches.len() == max_results {
                    truncated = true;
                    break 'files;
                }
                hit = true;
                matches.push(json!({
                    "file": entry.path,
                    "line_number": number + 1,
                    "line_content": line,
                }));
            }
        }
        matched_files += usize::from(hit);
    }
    ok(json!({
        "path": request.path,
        "pattern": request.pattern,
        "matches": matches,
        "match_count": matches.len(),
        "files_searched": searched,
        "files_matched": matched_files,
        "truncated": truncated,
    }))
}

#[derive(Deserialize)]
pub(super) struct Download {
    path: String,
}

/// `GET /v1/file/download?path=`: the bytes, streamed.
pub(super) async fn download(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    query: Result<Query<Download>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(request)) = query else {
        return failed(StatusCode::UNPROCESSABLE_ENTITY, "path is required");
    };
    let reader = match aio
        .api
        .daemon
        .read_file(&id, &request.path, &request_id.0)
        .await
    {
        Ok(reader) => reader,
        Err(e) => return daemon_failed(e),
    };
    let stream = futures_util::stream::unfold(reader, |mut reader| async move {
        match reader.next_chunk().await? {
            Ok(chunk) => Some((Ok::<Bytes, std::io::Error>(Bytes::from(chunk)), reader)),
            // Headers are gone: break the body off rather than end it short.
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), reader)),
        }
    });
    (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn replace_all_counts_and_keeps_other_bytes() {
        let (out, n) = super::replace_all(b"a-b-a\xff-aa", b"a", b"xy");
        assert_eq!(n, 4);
        assert_eq!(out, b"xy-b-xy\xff-xyxy");
        let (out, n) = super::replace_all(b"aaa", b"aa", b"b");
        assert_eq!((out.as_slice(), n), (&b"ba"[..], 1));
        let (out, n) = super::replace_all(b"none", b"zz", b"y");
        assert_eq!((out.as_slice(), n), (&b"none"[..], 0));
    }

    use super::*;

    #[test]
    fn globs_match_as_a_shell_would() {
        assert!(glob_matches("*.py", "a.py"));
        assert!(!glob_matches("*.py", "dir/a.py"));
        assert!(glob_matches("**/*.py", "dir/sub/a.py"));
        assert!(glob_matches("**/*.py", "a.py"));
        assert!(glob_matches("src/**", "src/a/b"));
        assert!(glob_matches("file?.[ct]xt", "file1.txt"));
        assert!(!glob_matches("file?.[!ct]xt", "file1.txt"));
        assert!(glob_matches("[a-c]*", "beta"));
        assert!(!glob_matches("a*b", "a/b"));
    }

    #[test]
    fn multipart_fields_are_read() {
        let body = b"--XY\r\nContent-Disposition: form-data; name=\"path\"\r\n\r\n/tmp/a b\r\n--XY\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n\x00\r\n--X\xff\r\n--XY--\r\n";
        let parts = form_parts(body, "XY").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "path");
        assert_eq!(parts[0].data, b"/tmp/a b");
        assert_eq!(parts[1].filename.as_deref(), Some("f.bin"));
        assert_eq!(parts[1].data, b"\x00\r\n--X\xff");
        assert!(form_parts(
            b"--XY\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nno end",
            "XY"
        )
        .is_err());
        assert!(form_parts(b"nothing", "XY").is_err());
        assert_eq!(
            crate::form::multipart_boundary("multipart/form-data; boundary=\"abc\""),
            Some("abc")
        );
        assert_eq!(crate::form::multipart_boundary("application/json"), None);
    }

    #[test]
    fn sizes_read_as_grep_takes_them() {
        assert_eq!(size("1M"), Some(1 << 20));
        assert_eq!(size("500K"), Some(500 << 10));
        assert_eq!(size("2048"), Some(2048));
        assert_eq!(size("1Q"), None);
    }
}
