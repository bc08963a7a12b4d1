//! The e2b Template SDK's routes: `Template.build`, `build_in_background`,
//! `get_build_status`, `exists`, `get_tags`, and the CLI's list, get and
//! delete, building airlock templates (`Daemon::build_template`).
//!
//! | route | answer |
//! |---|---|
//! | `POST /v3/templates` `{name \| alias, tags?, cpuCount?, memoryMB?}` | 202 `{templateID, buildID, public, names, tags, aliases}` |
//! | `GET /templates/{id}/files/{hash}` | 201 `{present}`, or `{present: false, url}`: an upload URL on this daemon with a one-time token |
//! | `PUT <that url>` (tar or gzip tar, no API key) | 204, once unpacked |
//! | `POST /v2/templates/{id}/builds/{buildID}` (steps, see [`super::steps`]) | 202; the build runs |
//! | `GET /templates/{id}/builds/{buildID}/status?logsOffset&limit` | 200 `{status, logEntries, reason?}` |
//! | `GET /templates/aliases/{name}` | 200 `{templateID, public}`, 404 |
//! | `GET /templates`, `GET /templates/{id}`, `GET /templates/{id}/tags` | 200 |
//! | `DELETE /templates/{id}` | 204, 404 |
//!
//! Templates are the machine's: any key reads them, building and removing
//! need an admin key (as the native `/v1/templates` routes do). A
//! template's e2b id is derived from its name ([`template_id`]), so a
//! rebuild keeps it; `name:tag` and the id both name the template where
//! the SDK passes them (`Sandbox.create`, `fromTemplate`). Tags other
//! than `default` are accepted and echoed, not kept apart: every tag names
//! the template's latest build.

use super::builds::{Build, Builds, Files, Refused, Status};
use super::steps::{self, BuildBody};
use super::{body_of, key_of, E2bError, Result};
use crate::auth::Caller;
use crate::types::rfc3339;
use crate::Api;
use airlock_daemon::builds::{BuildEvents, BuildRequest};
use airlock_store::{KeyRow, TemplateRow};
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// The e2b id of the template `name`: `t` and 19 hex digits of a hash of
/// the name (stable across rebuilds and restarts).
pub fn template_id(name: &str) -> String {
    let digest = Sha256::digest(format!("airlock e2b template {name}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("t{}", &hex[..19])
}

/// A UUID made of the first 16 bytes of `digest` (a `sha256:` digest),
/// for the build id of a template whose build this daemon no longer
/// tracks.
fn uuid_of_digest(digest: &str) -> String {
    let hex = digest.trim_start_matches("sha256:");
    let mut bytes = [0u8; 16];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = hex
            .get(2 * i..2 * i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .unwrap_or(0);
    }
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// Whether `tag` may be a tag: 1 to 64 of letters, digits and `._-`.
fn is_tag(tag: &str) -> bool {
    (1..=64).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The airlock template an e2b name, `name:tag` or template id names, if
/// it exists.
pub fn native_name(api: &Api, builds: Option<&Builds>, name: &str) -> Option<String> {
    let (bare, tag) = match name.split_once(':') {
        Some((bare, tag)) => (bare, Some(tag)),
        None => (name, None),
    };
    let templates = api.daemon.templates().ok()?;
    let found = templates
        .iter()
        .find(|t| t.name == bare)
        .or_else(|| templates.iter().find(|t| template_id(&t.name) == bare))
        .map(|t| t.name.clone())?;
    match tag {
        None | Some("default") => Some(found),
        Some(tag) if builds.is_some_and(|b| b.has_tag(&found, tag)) => Some(found),
        Some(_) => None,
    }
}

/// The name of template `id` (an e2b id, or a name), for routes that name
/// a template being built: one in the store, or one a build knows.
fn name_of(api: &Api, builds: &Builds, id: &str) -> Option<String> {
    native_name(api, Some(builds), id).or_else(|| builds.name_of(id))
}

fn not_found(what: &str) -> E2bError {
    E2bError::new(
        StatusCode::NOT_FOUND,
        format!("template '{what}' not found"),
    )
}

fn refused(e: Refused) -> E2bError {
    let status = match e {
        Refused::BadToken => StatusCode::FORBIDDEN,
        _ => StatusCode::TOO_MANY_REQUESTS,
    };
    let mut error = E2bError::new(status, e.to_string());
    if status == StatusCode::TOO_MANY_REQUESTS {
        error.retry_after = Some(5);
    }
    error
}

/// Building and removing templates needs an admin key.
fn admin(caller: &Caller) -> Result<&KeyRow> {
    let key = key_of(caller)?;
    if !key.is_admin {
        return Err(E2bError::new(
            StatusCode::FORBIDDEN,
            "building and removing templates needs an admin API key on this daemon",
        ));
    }
    Ok(key)
}

/// Body of `POST /v3/templates`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewTemplate {
    name: Option<String>,
    /// e2b 2.7's spelling of `name`.
    alias: Option<String>,
    tags: Option<Vec<String>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewTemplateWire {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    names: Vec<String>,
    tags: Vec<String>,
    aliases: Vec<String>,
}

/// `POST /v3/templates`: a build of the template, waiting for its steps.
pub async fn request_build(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(builds): Extension<Arc<Builds>>,
    body: Bytes,
) -> Result<Response> {
    let key = admin(&caller)?;
    let body: NewTemplate = body_of(&body)?;
    let full = body
        .name
        .or(body.alias)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| E2bError::bad_request("name is required"))?;
    let (name, tag) = match full.split_once(':') {
        Some((name, tag)) => (name.to_owned(), Some(tag.to_owned())),
        None => (full.clone(), None),
    };
    if name.contains('/') {
        return Err(E2bError::bad_request(format!(
            "{full:?}: namespaced template names (namespace/name) are not supported here"
        )));
    }
    airlock_daemon::templates::check_new_template_name(&name).map_err(E2bError::from)?;
    let mut tags: Vec<String> = tag
        .into_iter()
        .chain(body.tags.unwrap_or_default())
        .collect();
    if tags.len() > 16 {
        return Err(E2bError::bad_request("at most 16 tags"));
    }
    if let Some(bad) = tags.iter().find(|t| !is_tag(t)) {
        return Err(E2bError::bad_request(format!(
            "{bad:?} is not a tag (1 to 64 letters, digits and ._-)"
        )));
    }
    if tags.is_empty() {
        tags.push("default".into());
    }
    tags.dedup();
    let id = template_id(&name);
    let build = builds
        .add(
            uuid::Uuid::new_v4().to_string(),
            id.clone(),
            name.clone(),
            tags.clone(),
            key.id.clone(),
        )
        .map_err(refused)?;
    drop(api);
    Ok((
        StatusCode::ACCEPTED,
        Json(NewTemplateWire {
            template_id: id,
            build_id: build.id.clone(),
            public: false,
            names: vec![name.clone()],
            tags,
            aliases: vec![name],
        }),
    )
        .into_response())
}

/// The URL this daemon is reached at, from the request's `Host` (and
/// `X-Forwarded-Proto`, behind a proxy that terminates TLS).
fn base_url(headers: &HeaderMap) -> Option<String> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b))
    {
        return None;
    }
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
    {
        Some("https") => "https",
        _ => "http",
    };
    Some(format!("{scheme}://{host}"))
}

/// `GET /templates/{id}/files/{hash}`: 201 `{present}`, with an upload URL
/// when the files are not here.
pub async fn files(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(builds): Extension<Arc<Builds>>,
    Path((id, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response> {
    admin(&caller)?;
    if !steps::is_files_hash(&hash) {
        return Err(E2bError::bad_request(
            "Invalid files hash: it must be 64 lowercase hex digits",
        ));
    }
    if name_of(&api, &builds, &id).is_none() {
        return Err(not_found(&id));
    }
    let answer = match builds.files(&id, &hash).map_err(refused)? {
        Files::Present => json!({"present": true}),
        Files::Upload { token } => {
            let base = base_url(&headers)
                .ok_or_else(|| E2bError::bad_request("the request has no usable Host header"))?;
            json!({
                "present": false,
                "url": format!("{base}/templates/{id}/files/{hash}?token={token}"),
            })
        }
    };
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// Query of the upload.
#[derive(Debug, Default, Deserialize)]
pub struct UploadParams {
    token: Option<String>,
}

/// Whether a request is an upload of build files (`PUT
/// /templates/{id}/files/{hash}`), which is authorised by the token in
/// its URL and streams its body (see [`upload`]).
pub fn is_upload(method: &axum::http::Method, path: &str) -> bool {
    if method != axum::http::Method::PUT {
        return false;
    }
    let parts: Vec<&str> = path.split('/').collect();
    matches!(parts.as_slice(), ["", "templates", _, "files", _])
}

/// A blocking reader of the chunks an async task sends.
struct ChannelReader {
    chunks: tokio::sync::mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Bytes of the files under `dir` (not following links).
fn bytes_under(dir: &std::path::Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => total = total.saturating_add(m.len()),
                Err(_) => {}
            }
        }
    }
    total
}

/// Why an upload's stream ended early.
enum Cut {
    TooLarge,
    Broken,
    /// The unpacker stopped reading (it refused the archive).
    Refused,
}

/// `PUT /templates/{id}/files/{hash}?token=…`: the files of a COPY, a tar
/// (plain, gzip or zstd) streamed into the layer store's staging area
/// and unpacked as a layer is (hostile entries refused: 400, nothing
/// kept), at most the daemon's upload size compressed and its upload
/// allowance unpacked. 204 once unpacked.
pub async fn upload(
    State(api): State<Api>,
    Extension(builds): Extension<Arc<Builds>>,
    Path((id, hash)): Path<(String, String)>,
    params: std::result::Result<Query<UploadParams>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode> {
    let token = params.ok().and_then(|Query(p)| p.token).ok_or_else(|| {
        E2bError::new(
            StatusCode::UNAUTHORIZED,
            "the upload URL's token is missing",
        )
    })?;
    if !steps::is_files_hash(&hash) {
        return Err(E2bError::bad_request(
            "Invalid files hash: it must be 64 lowercase hex digits",
        ));
    }
    let reservation = builds.receive(&id, &hash, &token).map_err(refused)?;
    let limit = api.daemon.config().max_upload_bytes;
    let too_large = || {
        E2bError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the upload is larger than this daemon's limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let dir = api.daemon.stage_build_context()?;
    let (sender, chunks) = tokio::sync::mpsc::channel::<Bytes>(16);
    let daemon = api.daemon.clone();
    let max_bytes = reservation.bytes;
    let unpacking = tokio::task::spawn_blocking(move || {
        let reader = ChannelReader {
            chunks,
            current: Bytes::new(),
        };
        let result = daemon.unpack_build_context(&dir, reader, max_bytes);
        (dir, result)
    });
    let mut received = 0u64;
    let mut stream = body.into_data_stream();
    let mut cut = None;
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            cut = Some(Cut::Broken);
            break;
        };
        received += chunk.len() as u64;
        if received > limit {
            cut = Some(Cut::TooLarge);
            break;
        }
        if sender.send(chunk).await.is_err() {
            cut = Some(Cut::Refused);
            break;
        }
    }
    // The reader sees the end (or the cut) and finishes.
    drop(sender);
    let (dir, unpacked) = unpacking.await.map_err(|e| {
        E2bError::from(airlock_daemon::DaemonError::Internal(format!(
            "the upload's unpacking failed: {e}"
        )))
    })?;
    match cut {
        // The unpacker's own error says why it stopped.
        Some(Cut::Refused) | None => {}
        Some(Cut::TooLarge) => return Err(too_large()),
        Some(Cut::Broken) => return Err(E2bError::bad_request("the upload was cut off")),
    }
    // A refused archive drops `dir` (and the reservation) here: nothing
    // stays.
    unpacked.map_err(E2bError::from)?;
    let path = dir.path().to_path_buf();
    let bytes = tokio::task::spawn_blocking(move || bytes_under(&path))
        .await
        .unwrap_or(max_bytes);
    reservation.store(dir, bytes);
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v2/templates/{id}/builds/{buildID}`: converts the steps and
/// runs the build in the background; 202.
pub async fn start_build(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(builds): Extension<Arc<Builds>>,
    Path((id, build_id)): Path<(String, String)>,
    body: Bytes,
) -> Result<StatusCode> {
    let key = admin(&caller)?.clone();
    let build = builds
        .build(&build_id)
        .filter(|b| b.template_id == id)
        .ok_or_else(|| {
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!("build '{build_id}' of template '{id}' not found"),
            )
        })?;
    let body: BuildBody = body_of(&body)?;
    let converted = steps::convert(&body, &|name| native_name(&api, Some(&builds), name))
        .map_err(|e| E2bError::bad_request(e.to_string()))?;
    let contexts = builds
        .contexts(&id, &converted.copies)
        .map_err(|(index, hash)| {
            let step = converted.origin.get(index).copied().flatten().unwrap_or(0);
            E2bError::bad_request(format!(
            "step {step}: the files of COPY (filesHash {hash}) were not uploaded to this daemon"
        ))
        })?;
    let request = BuildRequest {
        name: build.name.clone(),
        spec: converted.spec,
        context: None,
        step_contexts: contexts
            .iter()
            .map(|(index, dir)| (*index, dir.path().to_path_buf()))
            .collect(),
        no_cache: converted.no_cache,
        dockerfile: None,
        start_cmd: converted.start_cmd,
        ready_cmd: converted.ready_cmd,
        source: "e2b".into(),
    };
    if !build.start(converted.origin) {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("build '{build_id}' was started already"),
        ));
    }
    let daemon = api.daemon.clone();
    let hashes = converted.copies;
    tokio::spawn(async move {
        let recorder = Arc::clone(&build);
        let events: BuildEvents = Arc::new(move |event| recorder.record(event));
        let outcome = daemon.build_template(&key, request, events).await;
        build.finish(
            outcome
                .map(|_| ())
                .map_err(|e| crate::error::ApiError::from(e).message),
        );
        // The build's files go now (unless another build holds them).
        drop(contexts);
        builds.release(&build.template_id, &hashes);
    });
    Ok(StatusCode::ACCEPTED)
}

/// Query of the status route.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusParams {
    logs_offset: Option<u64>,
    limit: Option<u64>,
    level: Option<String>,
}

fn entry_wire(e: &super::builds::Entry) -> Value {
    let mut entry = json!({
        "timestamp": rfc3339(e.timestamp_ms),
        "level": e.level,
        "message": e.message,
    });
    if let Some(step) = &e.step {
        entry["step"] = json!(step);
    }
    entry
}

/// Whether `caller` may see `build`: its owner, or an admin.
fn may_see(key: &KeyRow, build: &Build) -> bool {
    key.is_admin || key.id == build.owner_key_id
}

/// `GET /templates/{id}/builds/{buildID}/status`: where the build is, and
/// its log entries from `logsOffset` on (at most `limit`, 100 by default).
pub async fn build_status(
    Extension(caller): Extension<Caller>,
    Extension(builds): Extension<Arc<Builds>>,
    Path((id, build_id)): Path<(String, String)>,
    params: std::result::Result<Query<StatusParams>, QueryRejection>,
) -> Result<Json<Value>> {
    let key = key_of(&caller)?;
    let params = super::query_of(params)?;
    let _ = params.level;
    let build = builds
        .build(&build_id)
        .filter(|b| b.template_id == id && may_see(key, b))
        .ok_or_else(|| {
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!("build '{build_id}' of template '{id}' not found"),
            )
        })?;
    let offset = usize::try_from(params.logs_offset.unwrap_or(0)).unwrap_or(usize::MAX);
    let limit = params.limit.unwrap_or(100).clamp(1, 100) as usize;
    let snapshot = build.snapshot(offset, limit);
    let mut answer = json!({
        "templateID": build.template_id,
        "buildID": build.id,
        "status": snapshot.status.as_str(),
        "logs": [],
        "logEntries": snapshot.entries.iter().map(entry_wire).collect::<Vec<_>>(),
    });
    if let Some(reason) = snapshot.reason {
        let mut wire = json!({
            "message": reason.message,
            "logEntries": reason.entries.iter().map(entry_wire).collect::<Vec<_>>(),
        });
        if let Some(step) = reason.step {
            wire["step"] = json!(step);
        }
        answer["reason"] = wire;
    }
    Ok(Json(answer))
}

/// `GET /templates/aliases/{name}`: 200 if the template exists, else 404.
pub async fn alias(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(builds): Extension<Arc<Builds>>,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    key_of(&caller)?;
    let found = native_name(&api, Some(&builds), &name).ok_or_else(|| not_found(&name))?;
    Ok(Json(
        json!({"templateID": template_id(&found), "public": false}),
    ))
}

/// e2b's `Template` of a stored template (with `builds` for the detail).
fn template_wire(row: &TemplateRow, builds: &Builds, detail: bool) -> Value {
    let id = template_id(&row.name);
    let known = builds.builds_of(&id);
    let latest = known.iter().rev().find(|b| b.status() == Status::Ready);
    let build_id = latest.map_or_else(|| uuid_of_digest(&row.digest), |b| b.id.clone());
    let created = rfc3339(row.created_at);
    let mut wire = json!({
        "templateID": id,
        "buildID": build_id,
        "cpuCount": 2,
        "memoryMB": 1024,
        "diskSizeMB": 0,
        "public": false,
        "aliases": [row.name],
        "names": [row.name],
        "createdAt": created,
        "updatedAt": created,
        "createdBy": null,
        "lastSpawnedAt": null,
        "spawnCount": 0,
        "buildCount": known.len().max(1),
        "envdVersion": super::wire::ENVD_VERSION,
        "buildStatus": "ready",
    });
    if detail {
        let mut list: Vec<Value> = known
            .iter()
            .map(|b| {
                json!({
                    "buildID": b.id,
                    "status": b.status().as_str(),
                    "createdAt": rfc3339(b.created_ms),
                    "updatedAt": rfc3339(b.created_ms),
                    "cpuCount": 2,
                    "memoryMB": 1024,
                })
            })
            .collect();
        if list.is_empty() {
            list.push(json!({
                "buildID": build_id, "status": "ready", "createdAt": created,
                "updatedAt": created, "cpuCount": 2, "memoryMB": 1024,
            }));
        }
        wire["builds"] = Value::Array(list);
    }
    wire
}

/// `GET /templates`: every template of the daemon.
pub async fn list(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(builds): Extension<Arc<Builds>>,
) -> Result<Json<Vec<Value>>> {
    key_of(&caller)?;
    let rows = api.daemon.templates()?;
    Ok(Json(
        rows.iter()
            .map(|row| template_wire(row, &builds, false))
            .collect(),
    ))
}

/// `GET /templates/{id}`: one, with its builds.
pub async fn get(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(builds): Extension<Arc<Builds>>,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    key_of(&caller)?;
    let name = native_name(&api, Some(&builds), &id).ok_or_else(|| not_found(&id))?;
    let row = api.daemon.template(&name)?;
    Ok(Json(template_wire(&row, &builds, true)))
}

/// `GET /templates/{id}/tags`: the `default` tag and the tags its builds
/// declared, each naming the latest build.
pub async fn tags(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(builds): Extension<Arc<Builds>>,
    Path(id): Path<String>,
) -> Result<Json<Vec<Value>>> {
    key_of(&caller)?;
    let name = native_name(&api, Some(&builds), &id).ok_or_else(|| not_found(&id))?;
    let row = api.daemon.template(&name)?;
    let wire = template_wire(&row, &builds, false);
    let mut names: Vec<String> = vec!["default".into()];
    for build in builds.builds_of(&template_id(&name)) {
        for tag in &build.tags {
            if !names.contains(tag) {
                names.push(tag.clone());
            }
        }
    }
    Ok(Json(
        names
            .into_iter()
            .map(|tag| json!({"tag": tag, "buildID": wire["buildID"], "createdAt": wire["createdAt"]}))
            .collect(),
    ))
}

/// `DELETE /templates/{id}` (admin): 204; 404 for none (the SDK's `false`).
pub async fn delete(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(builds): Extension<Arc<Builds>>,
    Extension(request_id): Extension<crate::RequestId>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    // A snapshot is a template to e2b (`Sandbox.delete_snapshot`): the
    // caller's own, no admin needed.
    let Some(name) = native_name(&api, Some(&builds), &id) else {
        let key = key_of(&caller)?;
        return match api.daemon.delete_snapshot(key, &id, &request_id.0) {
            Ok(_) => Ok(StatusCode::NO_CONTENT),
            Err(airlock_daemon::DaemonError::NotFound(_)) => Err(not_found(&id)),
            Err(e) => Err(e.into()),
        };
    };
    admin(&caller)?;
    api.daemon.delete_template(&name)?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_ids_are_stable_and_distinct() {
        assert_eq!(template_id("a"), template_id("a"));
        assert_ne!(template_id("a"), template_id("b"));
        assert_eq!(template_id("a").len(), 20);
        assert!(template_id("a").starts_with('t'));
    }

    #[test]
    fn uploads_are_told_apart_by_method_and_path() {
        use axum::http::Method;
        assert!(is_upload(&Method::PUT, "/templates/t1/files/abc"));
        assert!(!is_upload(&Method::GET, "/templates/t1/files/abc"));
        assert!(!is_upload(&Method::PUT, "/templates/t1/files/abc/x"));
        assert!(!is_upload(&Method::PUT, "/v1/templates/t1/files/abc"));
    }

    #[test]
    fn uuids_of_digests() {
        let a = uuid_of_digest("sha256:00112233445566778899aabbccddeeff00");
        assert_eq!(a.len(), 36);
        assert!(uuid::Uuid::parse_str(&a).is_ok());
    }

    #[test]
    fn base_urls_come_from_the_host_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(base_url(&headers), None);
        headers.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(base_url(&headers).as_deref(), Some("http://127.0.0.1:8080"));
        headers.insert("x-forwarded-proto", "https".parse().unwrap());
        assert_eq!(
            base_url(&headers).as_deref(),
            Some("https://127.0.0.1:8080")
        );
        headers.insert(header::HOST, "evil/path".parse().unwrap());
        assert_eq!(base_url(&headers), None);
    }
}
