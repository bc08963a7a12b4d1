//! The AIO API of one sandbox, under `/aio/{sandbox id}/{access token}/`.
//!
//! The token in the path is the sandbox's access token: a request whose
//! token is not that sandbox's is answered 404, exactly as one for a
//! sandbox that does not exist (nothing tells which it was).

use super::shell::{Sessions, ShellError, Shot, Timeouts, WriteError, IMPLICIT};
use super::{failed, ok};
use crate::{Api, RequestId};
use airlock_daemon::DaemonError;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// Where every sandbox's AIO API is served.
pub const PREFIX: &str = "/aio/";

/// What the handlers share.
#[derive(Clone)]
pub(super) struct Aio {
    pub api: Api,
    pub sessions: Sessions,
}

/// The sandbox a request is for, once its token is checked.
#[derive(Clone)]
pub(super) struct Target(pub String);

pub(super) fn router(api: Api, sessions: Sessions) -> Router {
    let aio = Aio { api, sessions };
    let v1 = Router::new()
        .route("/v1/sandbox", get(context))
        .route("/v1/shell/exec", post(shell_exec))
        .route("/v1/shell/sessions/create", post(create_session))
        .route("/v1/shell/sessions", get(list_sessions).delete(cleanup_all))
        .route("/v1/shell/sessions/{session}", delete(cleanup_session))
        .route("/v1/shell/kill", post(kill_session))
        .route("/v1/shell/view", post(view_session))
        .route("/v1/shell/wait", post(wait_session))
        .route("/v1/shell/write", post(write_session))
        .route("/v1/bash/exec", post(super::bash::exec))
        .route("/v1/bash/output", post(super::bash::output))
        .route("/v1/bash/write", post(super::bash::write))
        .route("/v1/bash/kill", post(super::bash::kill))
        .route("/v1/bash/sessions", get(super::bash::list))
        .route("/v1/bash/sessions/create", post(super::bash::create))
        .route(
            "/v1/bash/sessions/{session}/close",
            post(super::bash::close),
        )
        .route("/v1/file/read", post(super::files::read))
        .route("/v1/file/write", post(super::files::write))
        .route("/v1/file/replace", post(super::files::replace))
        .route("/v1/file/search", post(super::files::search))
        .route("/v1/file/list", post(super::files::list))
        .route("/v1/file/find", post(super::files::find))
        .route("/v1/file/grep", post(super::files::grep))
        .route("/v1/file/glob", post(super::files::glob))
        .route("/v1/file/upload", post(super::files::upload))
        .route(
            "/v1/file/str_replace_editor",
            post(super::editor::str_replace_editor),
        )
        .route("/v1/file/download", get(super::files::download));
    Router::new()
        .nest("/aio/{id}/{token}", v1)
        .fallback(no_route)
        .layer(axum::middleware::from_fn_with_state(aio.clone(), authorize))
        .with_state(aio)
}

async fn no_route() -> Response {
    failed(StatusCode::NOT_FOUND, "Not Found")
}

/// Checks the token in the path against the sandbox's.
async fn authorize(State(aio): State<Aio>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let mut parts = path.strip_prefix(PREFIX).unwrap_or_default().splitn(3, '/');
    let (Some(id), Some(token)) = (parts.next(), parts.next()) else {
        return no_route().await;
    };
    // One that ended is gone for this API (a paused one is there, and
    // its calls answer 409 until it is resumed).
    let known = crate::is_sandbox_id(id)
        && aio.api.daemon.access_token_matches(id, token)
        && (aio.api.daemon.running(id).is_ok() || aio.api.daemon.is_paused(id));
    if !known {
        return failed(StatusCode::NOT_FOUND, "Sandbox not found");
    }
    let id = id.to_owned();
    request.extensions_mut().insert(Target(id.clone()));
    let mut response = next.run(request).await;
    // The audit trail names the sandbox's token as the caller.
    response
        .extensions_mut()
        .insert(crate::auth::Caller::Sandbox(id));
    response
}

/// The body as `T`; an absent body is `{}` (the client sends none when
/// every field is left out).
pub(super) fn body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, BadBody> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| BadBody(e.to_string()))
}

/// The request's JSON body as `T` (see [`body`]); a bad one is answered
/// with [`BadBody`].
pub(super) struct AioJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for AioJson<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(IntoResponse::into_response)?;
        body(&bytes)
            .map(AioJson)
            .map_err(IntoResponse::into_response)
    }
}

/// A body that is not the request's JSON: FastAPI's 422, which the
/// client reads.
#[derive(Debug)]
pub(super) struct BadBody(String);

impl IntoResponse for BadBody {
    fn into_response(self) -> Response {
        let detail = json!({"detail": [{"loc": ["body"], "msg": self.0, "type": "value_error"}]});
        (StatusCode::UNPROCESSABLE_ENTITY, Json(detail)).into_response()
    }
}

/// A daemon error as an AIO answer.
pub(super) fn daemon_failed(e: DaemonError) -> Response {
    let e = crate::error::ApiError::from(e);
    failed(e.status, e.message)
}

/// `GET /v1/sandbox`: readiness and what the sandbox is (at the top level,
/// not in `data`).
async fn context(State(aio): State<Aio>, Extension(Target(id)): Extension<Target>) -> Response {
    if let Err(e) = aio.api.daemon.running(&id) {
        return daemon_failed(e);
    }
    Json(json!({
        "success": true,
        "message": "Operation successful",
        "home_dir": "/home/user",
        "workspace": "/mnt/user-data/workspace",
        "version": env!("CARGO_PKG_VERSION"),
        "detail": {
            "system": {
                "os": "linux",
                "os_version": "",
                "arch": std::env::consts::ARCH,
                "user": "user",
                "home_dir": "/home/user",
                "workspace": "/mnt/user-data/workspace",
                "timezone": "UTC",
                "occupied_ports": [],
            },
            "runtime": {"python": [], "nodejs": []},
            "utils": [],
        },
    }))
    .into_response()
}

#[derive(Deserialize)]
struct ShellExec {
    command: String,
    id: Option<String>,
    exec_dir: Option<String>,
    no_change_timeout: Option<f64>,
    hard_timeout: Option<f64>,
    timeout: Option<f64>,
    #[serde(default = "yes")]
    truncate: bool,
}

fn yes() -> bool {
    true
}

/// Seconds from the wire, within reason.
pub(super) fn seconds(value: Option<f64>) -> Option<Duration> {
    value
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| Duration::from_secs_f64(s.min(86_400.0)))
}

/// Most characters of output an answer carries when `truncate` is on.
const TRUNCATE_AT: usize = 30_000;

/// The first and last halves of `text` past `limit` characters.
pub(super) fn middle_cut(text: String, limit: usize) -> String {
    let count = text.chars().count();
    if limit == 0 || count <= limit {
        return text;
    }
    let head: String = text.chars().take(limit / 2).collect();
    let tail: String = text.chars().skip(count - limit / 2).collect();
    format!(
        "{head}\n... [{} characters truncated] ...\n{tail}",
        count - limit
    )
}

/// `POST /v1/shell/exec`.
async fn shell_exec(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    AioJson(request): AioJson<ShellExec>,
) -> Response {
    let session = match &request.id {
        Some(name) => match aio.sessions.get(&id, name) {
            Some(session) => session,
            None => return failed(StatusCode::NOT_FOUND, "Session not found"),
        },
        None => aio.sessions.open(&id, IMPLICIT, request.exec_dir.clone()),
    };
    let command = match &request.exec_dir {
        Some(dir) => format!("cd {} && {}", shell_quote(dir), request.command),
        None => request.command.clone(),
    };
    let timeouts = Timeouts {
        no_change: seconds(request.no_change_timeout)
            .or(seconds(request.timeout))
            .unwrap_or(Duration::from_secs(120)),
        hard: seconds(request.hard_timeout),
        patience: None,
    };
    match session
        .run(&aio.api, &id, &command, &timeouts, &request_id.0)
        .await
    {
        Ok(ran) => {
            let output = if request.truncate {
                middle_cut(ran.output, TRUNCATE_AT)
            } else {
                ran.output
            };
            ok(json!({
                "session_id": session.id,
                "command": request.command,
                "status": ran.status.as_str(),
                "output": output,
                "console": [{"ps1": format!("{} $", session.working_dir()), "command": request.command, "output": output}],
                "exit_code": ran.exit_code,
            }))
        }
        Err(e) => shell_failed(&aio, &id, e),
    }
}

/// `'text'` for a POSIX shell.
pub(super) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

#[derive(Deserialize)]
struct CreateSession {
    id: Option<String>,
    exec_dir: Option<String>,
}

pub(super) fn is_session_id(text: &str) -> bool {
    (1..=128).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// `POST /v1/shell/sessions/create`: idempotent for an id that exists.
async fn create_session(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    AioJson(request): AioJson<CreateSession>,
) -> Response {
    let name = request
        .id
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    if !is_session_id(&name) {
        return failed(
            StatusCode::BAD_REQUEST,
            "id: 1 to 128 letters, digits, '-', '_' or '.'",
        );
    }
    if let Err(e) = aio.api.daemon.running(&id) {
        return daemon_failed(e);
    }
    let session = aio.sessions.open(&id, &name, request.exec_dir);
    ok(json!({"session_id": session.id, "working_dir": session.working_dir()}))
}

/// `GET /v1/shell/sessions`.
async fn list_sessions(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
) -> Response {
    let sessions: serde_json::Map<String, serde_json::Value> = aio
        .sessions
        .of(&id)
        .iter()
        .map(|s| (s.id.clone(), s.info()))
        .collect();
    ok(json!({"sessions": sessions}))
}

/// `DELETE /v1/shell/sessions/{session}`.
async fn cleanup_session(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Path(params): Path<BTreeMap<String, String>>,
) -> Response {
    let name = params.get("session").cloned().unwrap_or_default();
    match aio.sessions.remove(&id, &name) {
        Some(session) => {
            session.kill(&aio.api, &id).await;
            ok(json!(null))
        }
        None => failed(StatusCode::NOT_FOUND, "Session not found"),
    }
}

/// `DELETE /v1/shell/sessions`.
async fn cleanup_all(State(aio): State<Aio>, Extension(Target(id)): Extension<Target>) -> Response {
    for session in aio.sessions.of(&id) {
        aio.sessions.remove(&id, &session.id);
        session.kill(&aio.api, &id).await;
    }
    ok(json!(null))
}

#[derive(Deserialize)]
struct KillSession {
    id: String,
}

/// `POST /v1/shell/kill`: ends what the session runs (and the session's
/// shell; its next command starts a fresh one).
async fn kill_session(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    AioJson(request): AioJson<KillSession>,
) -> Response {
    match aio.sessions.remove(&id, &request.id) {
        Some(session) => {
            session.kill(&aio.api, &id).await;
            ok(json!({"status": "terminated", "exit_code": null, "returncode": null}))
        }
        None => failed(StatusCode::NOT_FOUND, "Session not found"),
    }
}

#[derive(Deserialize)]
struct ViewSession {
    id: String,
}

/// A session's last (or running) command as the AIO API shows it.
fn shown(session: &str, working_dir: &str, shot: Shot) -> serde_json::Value {
    let output = middle_cut(shot.output, TRUNCATE_AT);
    let console = shot.command.as_ref().map(|command| {
        json!([{"ps1": format!("{working_dir} $"), "command": command, "output": output}])
    });
    json!({
        "session_id": session,
        "command": shot.command,
        "status": shot.status.as_str(),
        "output": output,
        "console": console,
        "exit_code": shot.exit_code,
    })
}

/// A shell error as an AIO answer (a sandbox that is gone takes its
/// sessions with it).
fn shell_failed(aio: &Aio, id: &str, e: ShellError) -> Response {
    match e {
        ShellError::NoSession => failed(StatusCode::NOT_FOUND, "Session not found"),
        ShellError::Daemon(e) => daemon_failed_for(aio, id, e),
    }
}

/// A daemon error of a call on sandbox `id` as an AIO answer; a sandbox
/// that is gone takes its sessions with it.
pub(super) fn daemon_failed_for(aio: &Aio, id: &str, e: DaemonError) -> Response {
    if matches!(e, DaemonError::NotRunning(_) | DaemonError::NotFound(_)) {
        forget_if_gone(aio, id);
    }
    daemon_failed(e)
}

/// Forgets the sessions of sandbox `id` if it is gone (neither running
/// nor paused: a paused one keeps them for its resume).
pub(super) fn forget_if_gone(aio: &Aio, id: &str) {
    if aio.api.daemon.running(id).is_err() && !aio.api.daemon.is_paused(id) {
        aio.sessions.forget_sandbox(id);
    }
}

/// `POST /v1/shell/view`: the output of the session's last (or running)
/// command so far.
async fn view_session(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    AioJson(request): AioJson<ViewSession>,
) -> Response {
    let Some(session) = aio.sessions.get(&id, &request.id) else {
        return failed(StatusCode::NOT_FOUND, "Session not found");
    };
    match session.view(&aio.api, &id).await {
        Ok(shot) => ok(shown(&session.id, &session.working_dir(), shot)),
        Err(e) => shell_failed(&aio, &id, e),
    }
}

#[derive(Deserialize)]
struct WaitSession {
    id: String,
    seconds: Option<i64>,
    max_wait_seconds: Option<i64>,
}

/// How long a wait that names no time waits, and the most any waits.
const WAIT_DEFAULT: u64 = 30;
const WAIT_MAX: u64 = 600;

/// `POST /v1/shell/wait`: waits (at most the smaller of `seconds` and
/// `max_wait_seconds`) for the session's running command to end; its
/// status, and its output and exit code beside.
async fn wait_session(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    AioJson(request): AioJson<WaitSession>,
) -> Response {
    let limits = [request.seconds, request.max_wait_seconds];
    if limits.iter().flatten().any(|s| *s < 0) {
        return failed(
            StatusCode::BAD_REQUEST,
            "seconds and max_wait_seconds must not be negative",
        );
    }
    let limit = limits
        .iter()
        .flatten()
        .map(|s| s.unsigned_abs())
        .min()
        .unwrap_or(WAIT_DEFAULT)
        .min(WAIT_MAX);
    let Some(session) = aio.sessions.get(&id, &request.id) else {
        return failed(StatusCode::NOT_FOUND, "Session not found");
    };
    match session
        .wait(&aio.api, &id, Duration::from_secs(limit))
        .await
    {
        Ok(shot) => ok(shown(&session.id, &session.working_dir(), shot)),
        Err(e) => shell_failed(&aio, &id, e),
    }
}

#[derive(Deserialize)]
struct WriteSession {
    id: String,
    input: String,
    press_enter: bool,
}

/// Most bytes one write sends (a FIFO's buffer: the command need not
/// read before the write returns).
pub(super) const MAX_INPUT: usize = 64 << 10;

/// `POST /v1/shell/write`: input for the command running in the session
/// (a newline after it with `press_enter`).
async fn write_session(
    State(aio): State<Aio>,
    Extension(Target(id)): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    AioJson(request): AioJson<WriteSession>,
) -> Response {
    let mut input = request.input.into_bytes();
    if request.press_enter {
        input.push(b'\n');
    }
    if input.len() > MAX_INPUT {
        return failed(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("input: at most {MAX_INPUT} bytes at a time"),
        );
    }
    let Some(session) = aio.sessions.get(&id, &request.id) else {
        return failed(StatusCode::NOT_FOUND, "Session not found");
    };
    match session.write(&aio.api, &id, input, &request_id.0).await {
        Ok(status) => ok(json!({"status": status.as_str()})),
        Err(WriteError::Daemon(e)) => shell_failed(&aio, &id, ShellError::Daemon(e)),
        Err(e @ WriteError::NoSession) => failed(StatusCode::NOT_FOUND, e.to_string()),
        Err(e @ WriteError::Busy) => failed(StatusCode::CONFLICT, e.to_string()),
        Err(e @ (WriteError::NotRunning | WriteError::NoInput | WriteError::NotReading(_))) => {
            failed(StatusCode::CONFLICT, e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_output_loses_its_middle() {
        assert_eq!(middle_cut("short".into(), 10), "short");
        let cut = middle_cut("a".repeat(50) + &"b".repeat(50), 20);
        assert!(cut.starts_with("aaaaaaaaaa\n"));
        assert!(cut.ends_with("\nbbbbbbbbbb"));
        assert!(cut.contains("80 characters truncated"));
    }

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(shell_quote("/a b/it's"), "'/a b/it'\\''s'");
    }

    #[test]
    fn an_empty_body_is_an_empty_object() {
        #[derive(Deserialize)]
        struct Opt {
            id: Option<String>,
        }
        assert!(body::<Opt>(b"").unwrap().id.is_none());
        assert!(body::<Opt>(b"{\"id\":\"x\"}").unwrap().id.is_some());
        assert!(body::<Opt>(b"[").is_err());
    }
}
