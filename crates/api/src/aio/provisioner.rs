//! DeerFlow's provisioner API: a sandbox per thread, found again by the
//! id DeerFlow chose for it.
//!
//! Every `/api/…` call needs `X-API-Key` (an airlock API key; 401 without
//! a valid one) and sees only the sandboxes that key made here. DeerFlow's
//! `sandbox_id` is kept as the metadata entry [`SANDBOX_ID`]; a create for
//! an id that runs already answers that sandbox (idempotent).

use super::{shell::Sessions, Settings};
use crate::auth::Caller;
use crate::types::CreateSandbox;
use crate::{Api, RequestId};
use airlock_core::DeadReason;
use airlock_store::{KeyRow, ListQuery, SandboxRow, State as StoredState};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path as FsPath, PathBuf};

/// Metadata entry holding DeerFlow's id of the sandbox.
pub const SANDBOX_ID: &str = "deerflow.sandbox_id";
/// Metadata entries holding the thread and user it was made for.
const THREAD_ID: &str = "deerflow.thread_id";
const USER_ID: &str = "deerflow.user_id";
/// Most extra mounts a create may ask for.
const MAX_EXTRA_MOUNTS: usize = 10;
/// The sandbox paths an extra mount may target: DeerFlow's own list.
const EXTRA_MOUNT_TARGETS: &[&str] = &[
    "/mnt/acp-workspace",
    "/mnt/skills/custom",
    "/mnt/skills/integrations",
    "/mnt/integrations/lark-cli/config",
    "/mnt/integrations/lark-cli/config/locks",
    "/mnt/integrations/lark-cli/data",
    "/mnt/integrations/lark-cli/runtime",
];

#[derive(Clone)]
struct Provisioner {
    api: Api,
    settings: Settings,
    sessions: Sessions,
}

pub(super) fn router(api: Api, settings: Settings, sessions: Sessions) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/api/sandboxes", get(list).post(create))
        .route("/api/sandboxes/{id}", get(show).delete(delete))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            authenticate,
        ))
        .with_state(Provisioner {
            api,
            settings,
            sessions,
        })
}

/// A FastAPI-style error body, which DeerFlow's client reads.
fn detail(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "detail": message.into() }))).into_response()
}

async fn not_found() -> Response {
    detail(StatusCode::NOT_FOUND, "Not Found")
}

/// `X-API-Key` on everything under `/api/`.
async fn authenticate(
    State(api): State<Api>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !request.uri().path().starts_with("/api/") {
        return next.run(request).await;
    }
    let key = request
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let row = key.and_then(|secret| {
        api.daemon
            .with_store(|s| s.verify_key(&secret))
            .ok()
            .flatten()
    });
    let Some(row) = row else {
        return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    };
    let caller = Caller::Key(row);
    request.extensions_mut().insert(caller.clone());
    let mut response = next.run(request).await;
    response.extensions_mut().insert(caller);
    response
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

#[derive(Debug, Deserialize)]
struct CreateBody {
    sandbox_id: String,
    thread_id: Option<String>,
    user_id: Option<String>,
    #[serde(default)]
    extra_mounts: Vec<ExtraMount>,
}

#[derive(Debug, Deserialize)]
struct ExtraMount {
    host_path: String,
    container_path: String,
    #[serde(default)]
    read_only: bool,
}

/// A FastAPI-style validation failure (422) on `field`.
fn invalid(field: &str, message: &str) -> Response {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        Json(json!({"detail": [{"loc": ["body", field], "msg": message, "type": "value_error"}]})),
    )
        .into_response()
}

fn is_thread_id(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn is_user_id(text: &str) -> bool {
    (1..=128).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `POST /api/sandboxes`.
async fn create(
    State(p): State<Provisioner>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Ok(key) = caller.key() else {
        return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    };
    let body: CreateBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => return invalid("body", &e.to_string()),
    };
    if body.sandbox_id.is_empty() || body.sandbox_id.len() > 128 {
        return invalid("sandbox_id", "must be 1 to 128 characters");
    }
    let thread_id = body.thread_id.clone().unwrap_or(body.sandbox_id.clone());
    if !is_thread_id(&thread_id) {
        return invalid(
            "thread_id",
            "string should match pattern '^[A-Za-z0-9_-]{1,64}$'",
        );
    }
    let user_id = body.user_id.clone().unwrap_or_else(|| "default".into());
    if !is_user_id(&user_id) {
        return invalid(
            "user_id",
            "string should match pattern '^[A-Za-z0-9_\\-]+$'",
        );
    }
    if let Some(row) = find(&p.api, key, &body.sandbox_id) {
        return answer(&p.api, &headers, &row, &body.sandbox_id);
    }
    let mounts = match mounts_for(&p.settings, &user_id, &thread_id, &body.extra_mounts) {
        Ok(mounts) => mounts,
        Err(message) => return detail(StatusCode::BAD_REQUEST, message),
    };
    let metadata = BTreeMap::from([
        (SANDBOX_ID.to_owned(), body.sandbox_id.clone()),
        (THREAD_ID.to_owned(), thread_id),
        (USER_ID.to_owned(), user_id),
    ]);
    // DeerFlow ends its sandboxes itself (idle timeout, then DELETE): the
    // longest life the daemon allows, not its short default.
    let mut spec = json!({
        "timeout_s": p.api.daemon.config().max_timeout.as_secs(),
        "metadata": metadata,
        "mounts": mounts,
    });
    if let Some(template) = &p.settings.template {
        spec["template"] = json!(template);
    }
    let request: CreateSandbox = match serde_json::from_value(spec) {
        Ok(request) => request,
        Err(e) => return detail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let created = match request.into_request(&p.api.daemon, key) {
        Ok((request, startup)) => {
            p.api
                .daemon
                .create_started(key, request, startup, &request_id.0)
                .await
        }
        Err(e) => return detail(e.status, e.message),
    };
    match created {
        Ok(created) => answer(&p.api, &headers, &created.row, &body.sandbox_id),
        Err(e) => {
            let e = crate::error::ApiError::from(e);
            detail(e.status, e.message)
        }
    }
}

/// The sandboxes `key` made here that are not dead, by DeerFlow's id
/// (`None`: all of them).
fn live_rows(api: &Api, key: &KeyRow, sandbox_id: Option<&str>) -> Vec<SandboxRow> {
    let mut query = ListQuery {
        states: Some(BTreeSet::from([
            StoredState::Creating,
            StoredState::Running,
            StoredState::Paused,
        ])),
        owner_key_id: Some(key.id.clone()),
        limit: Some(ListQuery::MAX_LIMIT),
        ..ListQuery::default()
    };
    if let Some(id) = sandbox_id {
        query.metadata.insert(SANDBOX_ID.to_owned(), id.to_owned());
    }
    let mut rows = Vec::new();
    loop {
        let Ok(page) = api.daemon.list(key, query.clone()) else {
            return rows;
        };
        rows.extend(
            page.items
                .into_iter()
                .filter(|row| row.metadata.contains_key(SANDBOX_ID)),
        );
        match page.next_cursor {
            Some(cursor) => query.cursor = Some(cursor),
            None => return rows,
        }
    }
}

fn find(api: &Api, key: &KeyRow, sandbox_id: &str) -> Option<SandboxRow> {
    live_rows(api, key, Some(sandbox_id)).into_iter().next()
}

/// The sandbox's view for DeerFlow: its AIO URL on this daemon, as the
/// client reached it, and a pod-like phase.
fn view(api: &Api, headers: &HeaderMap, row: &SandboxRow, sandbox_id: &str) -> serde_json::Value {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| {
            h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .unwrap_or("127.0.0.1");
    let token = api.daemon.access_token(&row.id).unwrap_or_default();
    let status = match row.state {
        StoredState::Running => "Running",
        _ => "Pending",
    };
    json!({
        "sandbox_id": sandbox_id,
        "sandbox_url": format!("http://{host}{}{}/{token}", super::sandbox::PREFIX, row.id),
        "status": status,
    })
}

fn answer(api: &Api, headers: &HeaderMap, row: &SandboxRow, sandbox_id: &str) -> Response {
    Json(view(api, headers, row, sandbox_id)).into_response()
}

/// `GET /api/sandboxes/{id}`.
async fn show(
    State(p): State<Provisioner>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(sandbox_id): Path<String>,
) -> Response {
    let Ok(key) = caller.key() else {
        return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    };
    match find(&p.api, key, &sandbox_id) {
        Some(row) => answer(&p.api, &headers, &row, &sandbox_id),
        None => detail(
            StatusCode::NOT_FOUND,
            format!("Sandbox '{sandbox_id}' not found"),
        ),
    }
}

/// `GET /api/sandboxes`.
async fn list(
    State(p): State<Provisioner>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
) -> Response {
    let Ok(key) = caller.key() else {
        return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    };
    let sandboxes: Vec<serde_json::Value> = live_rows(&p.api, key, None)
        .iter()
        .map(|row| {
            let id = row.metadata.get(SANDBOX_ID).cloned().unwrap_or_default();
            view(&p.api, &headers, row, &id)
        })
        .collect();
    Json(json!({"count": sandboxes.len(), "sandboxes": sandboxes})).into_response()
}

/// `DELETE /api/sandboxes/{id}`: ends it (and any others of that id);
/// one already gone is a success.
async fn delete(
    State(p): State<Provisioner>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(sandbox_id): Path<String>,
) -> Response {
    let Ok(key) = caller.key() else {
        return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    };
    for row in live_rows(&p.api, key, Some(&sandbox_id)) {
        p.sessions.forget_sandbox(&row.id);
        if let Err(e) = p
            .api
            .daemon
            .stop(&row.id, DeadReason::Deleted, Some(&request_id.0))
            .await
        {
            let e = crate::error::ApiError::from(e);
            return detail(e.status, format!("Partial cleanup: {}", e.message));
        }
    }
    Json(json!({"ok": true, "sandbox_id": sandbox_id})).into_response()
}

/// The binds of a thread's sandbox: its user data and the skills from
/// under the operator's base directory, then the extra mounts DeerFlow
/// asked for (only to its own list of paths, only from under the base).
fn mounts_for(
    settings: &Settings,
    user_id: &str,
    thread_id: &str,
    extra: &[ExtraMount],
) -> Result<Vec<serde_json::Value>, String> {
    if extra.len() > MAX_EXTRA_MOUNTS {
        return Err(format!("at most {MAX_EXTRA_MOUNTS} extra mounts"));
    }
    let Some(base) = &settings.base_dir else {
        if extra.is_empty() {
            return Ok(Vec::new());
        }
        return Err("extra mounts need the daemon's --deerflow-base-dir".into());
    };
    let base = base
        .canonicalize()
        .map_err(|e| format!("the DeerFlow base directory is not usable: {e}"))?;
    let bind = |source: &FsPath, target: &str, read_only: bool| json!({"source": source.to_string_lossy(), "target": target, "read_only": read_only});
    let mut mounts = Vec::new();
    let thread = base
        .join("users")
        .join(user_id)
        .join("threads")
        .join(thread_id);
    for part in ["workspace", "uploads", "outputs"] {
        let dir = thread.join("user-data").join(part);
        make_shared_dir(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        mounts.push(bind(&dir, &format!("/mnt/user-data/{part}"), false));
    }
    let optional: [(PathBuf, &str); 3] = [
        (
            base.join("skills_view").join("public"),
            "/mnt/skills/public",
        ),
        (
            base.join("users")
                .join(user_id)
                .join("skills_view")
                .join("custom"),
            "/mnt/skills/custom",
        ),
        (thread.join("acp-workspace"), "/mnt/acp-workspace"),
    ];
    let mut targets = BTreeSet::new();
    for extra in extra {
        let target = extra.container_path.trim_end_matches('/');
        if !EXTRA_MOUNT_TARGETS.contains(&target) {
            return Err(format!(
                "container_path {} is not one an extra mount may target",
                extra.container_path
            ));
        }
        if !targets.insert(target.to_owned()) {
            return Err(format!("container_path {target} is mounted twice"));
        }
        let source = FsPath::new(&extra.host_path);
        if !source.is_absolute() {
            return Err(format!("host_path {} is not absolute", extra.host_path));
        }
        let source = source
            .canonicalize()
            .map_err(|e| format!("host_path {}: {e}", extra.host_path))?;
        if !source.starts_with(&base) || !source.is_dir() {
            return Err(format!(
                "host_path {} is not a directory under the DeerFlow base directory",
                extra.host_path
            ));
        }
        mounts.push(bind(&source, target, extra.read_only));
    }
    for (source, target) in optional {
        if source.is_dir() && !targets.contains(target) {
            mounts.push(bind(&source, target, true));
        }
    }
    Ok(mounts)
}

/// Makes `dir` (and its parents) writable by the sandbox's user, whose
/// host uid is an unprivileged one of its own, and by DeerFlow's gateway.
fn make_shared_dir(dir: &FsPath) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_deerflows_patterns() {
        assert!(is_thread_id("thread_1-a"));
        assert!(!is_thread_id(""));
        assert!(!is_thread_id("../etc"));
        assert!(!is_thread_id(&"a".repeat(65)));
        assert!(is_user_id("default"));
        assert!(!is_user_id("a/b"));
    }

    #[test]
    fn extra_mounts_stay_on_deerflows_paths_under_the_base() {
        let base = tempfile::tempdir().unwrap();
        let inside = base.path().join("acp");
        std::fs::create_dir(&inside).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let settings = Settings {
            base_dir: Some(base.path().to_owned()),
            template: None,
        };
        let mount = |host: &FsPath, target: &str| ExtraMount {
            host_path: host.to_string_lossy().into_owned(),
            container_path: target.into(),
            read_only: true,
        };
        let ok = mounts_for(&settings, "u", "t", &[mount(&inside, "/mnt/acp-workspace")]).unwrap();
        assert!(ok.iter().any(|m| m["target"] == "/mnt/acp-workspace"));
        assert!(ok.iter().any(|m| m["target"] == "/mnt/user-data/outputs"));
        assert!(base
            .path()
            .join("users/u/threads/t/user-data/uploads")
            .is_dir());
        for bad in [
            vec![mount(outside.path(), "/mnt/acp-workspace")],
            vec![mount(&inside.join("../../"), "/mnt/acp-workspace")],
            vec![mount(&inside, "/etc")],
            vec![mount(&inside, "/mnt/skills/public")],
            vec![
                mount(&inside, "/mnt/acp-workspace"),
                mount(&inside, "/mnt/acp-workspace/"),
            ],
            (0..11)
                .map(|_| mount(&inside, "/mnt/acp-workspace"))
                .collect(),
        ] {
            assert!(mounts_for(&settings, "u", "t", &bad).is_err());
        }
        let none = Settings::default();
        assert!(mounts_for(&none, "u", "t", &[]).unwrap().is_empty());
        assert!(mounts_for(&none, "u", "t", &[mount(&inside, "/mnt/acp-workspace")]).is_err());
    }
}
