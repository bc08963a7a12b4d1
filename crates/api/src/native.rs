//! The native `/v1` routes. Each handler checks who may call it, turns the
//! request into one daemon call and the answer into JSON or a stream.

use crate::auth::Caller;
use crate::error::{json_body, query, ApiError, ErrorBody};
use crate::types::*;
use crate::{Api, RequestId};
use airlock_core::DeadReason;
use airlock_daemon::processes::ExecRequest;
use airlock_daemon::{Attached, Output};
use airlock_store::{ListQuery, State as StoredState};
use axum::body::Body;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::time::Duration;

type Result<T> = std::result::Result<T, ApiError>;

const NDJSON: &str = "application/x-ndjson";

/// Creates a sandbox.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body = CreateSandbox,
    responses(
        (status = 201, description = "Running", body = SandboxView),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No valid API key", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 429, description = "At a cap or the queue is full; see Retry-After", body = ErrorBody),
    ))]
pub async fn create_sandbox(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    body: std::result::Result<Json<CreateSandbox>, JsonRejection>,
) -> Result<Response> {
    let key = caller.key()?.clone();
    let body = json_body(body)?;
    let (request, startup) = body.into_request(&api.daemon, &key)?;
    let created = api
        .daemon
        .create_started(&key, request, startup, &request_id.0)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(SandboxView::of(&created.row, Some(created.access_token))),
    )
        .into_response())
}

fn parse_metadata(text: &str) -> Result<BTreeMap<String, String>> {
    let mut pairs = BTreeMap::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            ApiError::bad_request("metadata: expected URL-encoded key=value pairs")
        })?;
        let decode = |s: &str| -> Result<String> {
            percent_decode(s, true)
                .ok_or_else(|| ApiError::bad_request("metadata: bad percent-encoding"))
        };
        pairs.insert(decode(k)?, decode(v)?);
    }
    Ok(pairs)
}

/// Lists sandboxes, oldest first.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", params(ListParams),
    responses(
        (status = 200, description = "A page", body = SandboxPage),
        (status = 400, description = "Bad filter or cursor", body = ErrorBody),
        (status = 401, description = "No valid API key", body = ErrorBody),
    ))]
pub async fn list_sandboxes(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    params: std::result::Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<SandboxPage>> {
    let key = caller.key()?;
    let params = query(params)?;
    let states = match &params.state {
        None => None,
        Some(text) => {
            let mut set = BTreeSet::new();
            for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                set.insert(
                    name.parse::<StoredState>()
                        .map_err(|e| ApiError::bad_request(format!("state: {e}")))?,
                );
            }
            Some(set)
        }
    };
    let metadata = match &params.metadata {
        Some(text) => parse_metadata(text)?,
        None => BTreeMap::new(),
    };
    let page = api.daemon.list(
        key,
        ListQuery {
            states,
            metadata,
            owner_key_id: None,
            except_owner_key_id: None,
            limit: params.limit,
            cursor: params.cursor.clone(),
        },
    )?;
    Ok(Json(SandboxPage {
        items: page
            .items
            .iter()
            .map(|r| SandboxView::of(r, None))
            .collect(),
        next_cursor: page.next_cursor,
    }))
}

/// A tier of this daemon.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct TierView {
    /// `process`, …: what a create's `tier` names.
    pub tier: String,
    /// Whether sandboxes can run on it here.
    pub available: bool,
    /// Why not, in a sentence that says what would fix it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The tiers.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct TierList {
    pub items: Vec<TierView>,
}

/// The isolation tiers this daemon knows, each available or not and why
/// not (any key). A create for a tier that is not available answers 400
/// with the same sentence.
#[utoipa::path(get, path = "/v1/tiers", tag = "sandboxes",
    responses((status = 200, description = "The tiers", body = TierList)))]
pub async fn list_tiers(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<TierList>> {
    caller.key()?;
    let items = api
        .daemon
        .tiers()
        .into_iter()
        .map(|t| TierView {
            tier: t.tier.as_str().to_owned(),
            available: t.available,
            reason: t.reason,
        })
        .collect();
    Ok(Json(TierList { items }))
}

/// One sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The sandbox", body = SandboxView),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ))]
pub async fn get_sandbox(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SandboxView>> {
    caller.may_use(&api.daemon, &id)?;
    let row = api
        .daemon
        .with_store(|s| s.get_sandbox(&id))
        .map_err(airlock_daemon::DaemonError::from)?
        .ok_or_else(|| ApiError::not_found(format!("no sandbox {id}")))?;
    Ok(Json(SandboxView::of(&row, None)))
}

/// Stops a sandbox and releases everything it holds; answers once done.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 204, description = "Gone (also if it was already dead)"),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ))]
pub async fn delete_sandbox(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    let key = caller.key()?;
    api.daemon.get(key, &id)?;
    api.daemon
        .stop(&id, DeadReason::Deleted, Some(&request_id.0))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets the sandbox to expire `timeout_s` seconds from now.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SetTimeout,
    responses(
        (status = 200, description = "New expiry", body = SandboxView),
        (status = 400, description = "Out of range", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not running", body = ErrorBody),
    ))]
pub async fn set_timeout(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: std::result::Result<Json<SetTimeout>, JsonRejection>,
) -> Result<Json<SandboxView>> {
    let key = caller.key()?;
    let body = json_body(body)?;
    let row = api
        .daemon
        .set_timeout(key, &id, Duration::from_secs(body.timeout_s))?;
    Ok(Json(SandboxView::of(&row, None)))
}

/// Body of `POST /v1/sandboxes/{id}/pause` (optional).
#[derive(Debug, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseSandbox {
    /// `memory` (the default): its processes and memory are kept and
    /// continue on resume; `filesystem`: only its files are kept.
    pub mode: Option<String>,
}

/// Pauses a running sandbox: it uses no CPU until resumed, and refuses
/// calls into it (409) meanwhile. Each tier does it as it can; one that
/// cannot answers 501 naming itself.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = PauseSandbox,
    responses(
        (status = 200, description = "Paused", body = SandboxView),
        (status = 400, description = "Not a pause mode", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not running", body = ErrorBody),
        (status = 501, description = "The sandbox's tier cannot pause", body = ErrorBody),
    ))]
pub async fn pause_sandbox(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<SandboxView>> {
    let key = caller.key()?;
    let request: PauseSandbox = crate::error::optional_body(&body, "a pause request")?;
    let mode = match request.mode.as_deref() {
        None | Some("memory") => airlock_daemon::PauseMode::Memory,
        Some("filesystem") => airlock_daemon::PauseMode::Filesystem,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "mode: {other:?} is not a pause mode (memory, filesystem)"
            )))
        }
    };
    api.daemon.pause(key, &id, mode).await?;
    let row = api.daemon.get(key, &id)?;
    Ok(Json(SandboxView::of(&row, None)))
}

/// Body of `POST /v1/sandboxes/{id}/resume` (optional).
#[derive(Debug, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeSandbox {
    /// `restore` (the default): it continues as its pause kept it;
    /// `reboot`: fresh processes start on its files, whatever the pause
    /// kept.
    pub on_resume: Option<String>,
}

/// Resumes a paused sandbox: one paused with its memory continues where
/// it was, one paused keeping only its files boots again on them.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ResumeSandbox,
    responses(
        (status = 200, description = "Running again", body = SandboxView),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 400, description = "Not a way to resume", body = ErrorBody),
        (status = 409, description = "Not paused", body = ErrorBody),
        (status = 429, description = "No room to boot it again", body = ErrorBody),
        (status = 501, description = "The sandbox's tier cannot resume", body = ErrorBody),
    ))]
pub async fn resume_sandbox(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<SandboxView>> {
    let key = caller.key()?;
    let request: ResumeSandbox = crate::error::optional_body(&body, "a resume request")?;
    match request.on_resume.as_deref() {
        None | Some("restore") => api.daemon.resume(key, &id).await?,
        Some("reboot") => api.daemon.reboot(key, &id).await?,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "on_resume: {other:?} is not a way to resume (restore, reboot)"
            )))
        }
    }
    let row = api.daemon.get(key, &id)?;
    Ok(Json(SandboxView::of(&row, None)))
}

/// The sandbox's network policy.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The policy in force", body = NetworkView),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not running", body = ErrorBody),
    ))]
pub async fn get_network(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<NetworkView>> {
    let key = caller.key()?;
    let policy = api.daemon.network_policy(key, &id)?;
    Ok(Json(NetworkView::of(&policy)))
}

/// Replaces the sandbox's network policy while it runs: new connections and
/// DNS lookups follow it at once. A sandbox created with `none` cannot be
/// given network (409).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = NetworkInput,
    responses(
        (status = 200, description = "The policy now in force", body = NetworkView),
        (status = 400, description = "Bad mode or rule", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not running, or created without an egress path", body = ErrorBody),
    ))]
pub async fn set_network(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
    body: std::result::Result<Json<NetworkInput>, JsonRejection>,
) -> Result<Json<NetworkView>> {
    let key = caller.key()?;
    let body = json_body(body)?;
    let policy = body.policy().map_err(ApiError::bad_request)?;
    let policy = api
        .daemon
        .set_network_policy(key, &id, policy, &request_id.0)?;
    Ok(Json(NetworkView::of(&policy)))
}

/// Valid UTF-8 text of a byte stream cut into chunks at arbitrary points.
#[derive(Default)]
struct Utf8Carry {
    pending: [Vec<u8>; 2],
}

impl Utf8Carry {
    /// The `data`/`data_b64` pair for a chunk of stream `index`.
    fn decode(&mut self, index: usize, chunk: Vec<u8>) -> Option<(Option<String>, Option<String>)> {
        let mut bytes = std::mem::take(&mut self.pending[index]);
        bytes.extend_from_slice(&chunk);
        match String::from_utf8(bytes) {
            Ok(text) if text.is_empty() => None,
            Ok(text) => Some((Some(text), None)),
            Err(e) => {
                let error = e.utf8_error();
                let bytes = e.into_bytes();
                if error.error_len().is_none() && bytes.len() - error.valid_up_to() < 4 {
                    // Cut inside a character: keep its start for the next chunk.
                    let (text, rest) = bytes.split_at(error.valid_up_to());
                    self.pending[index] = rest.to_vec();
                    let text = String::from_utf8_lossy(text).into_owned();
                    (!text.is_empty()).then_some((Some(text), None))
                } else {
                    Some((
                        None,
                        Some(base64::engine::general_purpose::STANDARD.encode(&bytes)),
                    ))
                }
            }
        }
    }

    /// Whatever is still held at the end, as base64.
    fn flush(&mut self, index: usize) -> Option<String> {
        let bytes = std::mem::take(&mut self.pending[index]);
        (!bytes.is_empty()).then(|| base64::engine::general_purpose::STANDARD.encode(bytes))
    }
}

fn line(event: &StreamEvent) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// The NDJSON lines of one output item.
fn lines_of(item: Output, carry: &mut Utf8Carry) -> Vec<u8> {
    match item {
        Output::Stdout(chunk) => carry
            .decode(0, chunk)
            .map(|(data, data_b64)| line(&StreamEvent::Stdout { data, data_b64 }))
            .unwrap_or_default(),
        Output::Stderr(chunk) => carry
            .decode(1, chunk)
            .map(|(data, data_b64)| line(&StreamEvent::Stderr { data, data_b64 }))
            .unwrap_or_default(),
        Output::Exited(info) => {
            let mut out = Vec::new();
            if let Some(rest) = carry.flush(0) {
                out.extend(line(&StreamEvent::Stdout {
                    data: None,
                    data_b64: Some(rest),
                }));
            }
            if let Some(rest) = carry.flush(1) {
                out.extend(line(&StreamEvent::Stderr {
                    data: None,
                    data_b64: Some(rest),
                }));
            }
            out.extend(line(&StreamEvent::Exited {
                pid: info.pid,
                exit_code: info.exit_code,
                signal: info.signal,
                oom: info.oom,
                timed_out: info.timed_out,
                duration_ms: info.duration_ms,
                stdout_truncated: info.stdout_truncated,
                stderr_truncated: info.stderr_truncated,
            }));
            out
        }
        Output::Error { code, message } => line(&StreamEvent::Error {
            code: code.to_owned(),
            message,
        }),
    }
}

/// An NDJSON response of a process's output, led by `first`.
fn output_response(first: Option<StreamEvent>, attached: Attached) -> Response {
    let lead = first.map(|e| line(&e));
    let stream = futures_util::stream::unfold(
        (lead, attached, Utf8Carry::default()),
        |(mut lead, mut attached, mut carry)| async move {
            if let Some(bytes) = lead.take() {
                return Some((
                    Ok::<Bytes, Infallible>(Bytes::from(bytes)),
                    (None, attached, carry),
                ));
            }
            loop {
                let item = attached.next().await?;
                let bytes = lines_of(item, &mut carry);
                if !bytes.is_empty() {
                    return Some((Ok(Bytes::from(bytes)), (None, attached, carry)));
                }
            }
        },
    );
    (
        [
            (header::CONTENT_TYPE, NDJSON),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Runs a process; streams its output as NDJSON, or with `background`
/// answers its pid at once.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecBody,
    responses(
        (status = 200, description = "NDJSON: started, stdout/stderr, exited", content_type = "application/x-ndjson", body = StreamEvent),
        (status = 201, description = "Started in the background", body = Pid),
        (status = 400, description = "Bad input or not executable", body = ErrorBody),
        (status = 404, description = "No such sandbox or program", body = ErrorBody),
        (status = 409, description = "Sandbox not running", body = ErrorBody),
    ))]
pub async fn exec(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
    body: std::result::Result<Json<ExecBody>, JsonRejection>,
) -> Result<Response> {
    caller.may_use(&api.daemon, &id)?;
    let body = json_body(body)?;
    let timeout_ms = match body.timeout_s {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Some((s * 1000.0).ceil() as u64),
        Some(_) => {
            return Err(ApiError::bad_request(
                "timeout_s: must be between 0 and 86400",
            ))
        }
    };
    let (hub, attached) = api
        .daemon
        .exec(
            &id,
            ExecRequest {
                cmd: body.cmd,
                args: body.args,
                env: body.env,
                cwd: body.cwd,
                user: body.user.map(Into::into),
                timeout_ms,
                stdin: body.stdin,
                // The native API starts no terminals; one started through
                // another dialect streams here as stdout (see the hub).
                pty: None,
                tag: None,
            },
            &request_id.0,
        )
        .await?;
    if body.background {
        drop(attached);
        return Ok((StatusCode::CREATED, Json(Pid { pid: hub.pid })).into_response());
    }
    Ok(output_response(
        Some(StreamEvent::Started { pid: hub.pid }),
        attached,
    ))
}

fn item(view: airlock_daemon::ProcessView) -> ProcessItem {
    ProcessItem {
        pid: view.pid,
        cmd: view.cmd,
        args: view.args,
        user: serde_json::to_value(view.user)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        running: view.running,
        exit_code: view.exit_code,
        signal: view.signal,
    }
}

/// Processes started in the sandbox (running and recently ended).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Processes", body = ProcessList),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Sandbox not running", body = ErrorBody),
    ))]
pub async fn list_processes(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ProcessList>> {
    caller.may_use(&api.daemon, &id)?;
    let processes = api.daemon.processes(&id).await?;
    Ok(Json(ProcessList {
        processes: processes.into_iter().map(item).collect(),
    }))
}

fn pid_of(text: &str) -> Result<u32> {
    text.parse::<u32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::not_found(format!("no process {text}")))
}

/// One process.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = String, Path, description = "Process id")),
    responses(
        (status = 200, description = "The process", body = ProcessItem),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
    ))]
pub async fn get_process(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, String)>,
) -> Result<Json<ProcessItem>> {
    caller.may_use(&api.daemon, &id)?;
    let hub = api.daemon.process(&id, pid_of(&pid)?)?;
    Ok(Json(item(hub.view())))
}

/// Re-attaches to a process: the kept output, then live output, then its exit.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/output", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = String, Path, description = "Process id")),
    responses(
        (status = 200, description = "NDJSON output", content_type = "application/x-ndjson", body = StreamEvent),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
    ))]
pub async fn process_output(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, String)>,
) -> Result<Response> {
    caller.may_use(&api.daemon, &id)?;
    let hub = api.daemon.process(&id, pid_of(&pid)?)?;
    Ok(output_response(None, hub.attach()))
}

/// Appends the raw body to the process's stdin.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = String, Path, description = "Process id")),
    request_body(content = String, content_type = "application/octet-stream"),
    responses(
        (status = 204, description = "Written"),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
        (status = 413, description = "Over 1 MiB", body = ErrorBody),
    ))]
pub async fn write_stdin(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, String)>,
    body: std::result::Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<StatusCode> {
    caller.may_use(&api.daemon, &id)?;
    let body = body.map_err(|e| match e {
        axum::extract::rejection::BytesRejection::FailedToBufferBody(e)
            if !crate::error::too_long(&e) =>
        {
            crate::error::unreadable_body()
        }
        _ => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "stdin writes are limited to 1 MiB each",
        ),
    })?;
    api.daemon
        .write_stdin(&id, pid_of(&pid)?, body.to_vec())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Closes the process's stdin.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin/close", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = String, Path, description = "Process id")),
    responses(
        (status = 204, description = "Closed"),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
    ))]
pub async fn close_stdin(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, String)>,
) -> Result<StatusCode> {
    caller.may_use(&api.daemon, &id)?;
    api.daemon.close_stdin(&id, pid_of(&pid)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sends a signal to the process's group.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = String, Path, description = "Process id")),
    request_body = SignalBody,
    responses(
        (status = 204, description = "Sent"),
        (status = 400, description = "Unknown signal", body = ErrorBody),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
    ))]
pub async fn signal_process(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, String)>,
    body: std::result::Result<Json<SignalBody>, JsonRejection>,
) -> Result<StatusCode> {
    caller.may_use(&api.daemon, &id)?;
    let body = json_body(body)?;
    let signal = body
        .signal
        .number()
        .ok_or_else(|| ApiError::bad_request("signal: not a known signal name or number"))?;
    api.daemon.signal(&id, pid_of(&pid)?, signal).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Audit events of the sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/events", tag = "audit",
    params(("id" = String, Path, description = "Sandbox id"), EventParams),
    responses(
        (status = 200, description = "A page of events", body = EventPage),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ))]
pub async fn sandbox_events(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    params: std::result::Result<Query<EventParams>, QueryRejection>,
) -> Result<Json<EventPage>> {
    caller.may_use(&api.daemon, &id)?;
    let params = query(params)?;
    let stream = match params.stream.as_deref() {
        None => None,
        Some(name) => Some(
            name.parse::<airlock_store::Stream>()
                .map_err(|e| ApiError::bad_request(format!("stream: {e}")))?,
        ),
    };
    let limit = params.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request("limit: must be between 1 and 1000"));
    }
    api.daemon.audit().flush().await;
    let mut after = params.after.unwrap_or(0).max(0);
    let mut items = Vec::new();
    let mut more = false;
    'pages: loop {
        let rows = api
            .daemon
            .with_store(|s| s.events_for_sandbox(&id, after, 1000))
            .map_err(airlock_daemon::DaemonError::from)?;
        let last_page = rows.len() < 1000;
        for row in rows {
            after = row.seq;
            if stream.is_some_and(|s| s != row.stream) {
                continue;
            }
            if items.len() == limit as usize {
                more = true;
                break 'pages;
            }
            items.push(EventView {
                seq: row.seq,
                stream: row.stream.as_str().to_owned(),
                kind: row.kind,
                at: rfc3339(row.at),
                request_id: row.request_id,
                detail: row.detail,
            });
        }
        if last_page {
            break;
        }
    }
    let next_cursor = if more {
        items.last().map(|e| e.seq)
    } else {
        None
    };
    Ok(Json(EventPage { items, next_cursor }))
}
