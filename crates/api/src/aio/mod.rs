//! The AIO dialect: what DeerFlow (bytedance/deer-flow) calls, served on
//! the daemon's one port.
//!
//! DeerFlow's `AioSandboxProvider` asks a *provisioner* for a sandbox per
//! thread and then drives the *All-in-One sandbox API* at the URL it got
//! back. Both are here:
//!
//! - the **provisioner** ([`provisioner`]): `GET /health` and
//!   `/api/sandboxes…`, authenticated by `X-API-Key` (an airlock API key);
//! - the **AIO API** of one sandbox ([`sandbox`]) under
//!   `/aio/{sandbox id}/{access token}/`: `GET /v1/sandbox`, shell sessions
//!   (`/v1/shell/…`), bash sessions (`/v1/bash/…`, [`bash`]) and files
//!   (`/v1/file/…`). The AIO client sends no credentials, so the URL
//!   itself is one: it carries the sandbox's access token, and a wrong one
//!   is a 404, as an unknown sandbox is.
//!
//! Like every dialect it translates to calls on `airlock_daemon::Daemon`;
//! the shell and bash sessions (the one piece of state the AIO API has)
//! are kept here, with the dialect. The wire facts come from the AIO specification
//! in `shared/reference/aio/`, the `agent-sandbox` client and DeerFlow's
//! provider; the definitions are our own.

mod bash;
mod editor;
mod files;
/// The parsers the fuzz targets drive.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    pub use super::files::fuzz_form_parts as form_parts;
}
pub mod provisioner;
pub mod sandbox;
mod shell;
mod table;

use crate::Api;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::path::PathBuf;
use tower::ServiceExt;

/// What the operator sets for the AIO dialect (`serve --deerflow-…`).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// DeerFlow's base directory on this host (`DEER_FLOW_HOST_BASE_DIR`):
    /// a thread's `/mnt/user-data` and the skills are mounted from under
    /// it, and extra mounts may only come from under it. Without one, a
    /// sandbox's `/mnt/user-data` is its own and extra mounts are refused.
    pub base_dir: Option<PathBuf>,
    /// The template DeerFlow's sandboxes start from (`None`: the daemon's
    /// `host`); its tier, if it records one, is theirs too.
    pub template: Option<String>,
}

/// The AIO routers, built once.
#[derive(Clone)]
pub struct Routers {
    provisioner: Router,
    sandbox: Router,
}

impl Routers {
    pub fn new(api: Api, settings: Settings) -> Routers {
        let sessions = shell::Sessions::default();
        sessions.prune_every(&api, std::time::Duration::from_secs(60));
        Routers {
            provisioner: provisioner::router(api.clone(), settings, sessions.clone()),
            sandbox: sandbox::router(api, sessions),
        }
    }
}

/// Whether `path` is the provisioner's.
pub fn is_provisioner_path(path: &str) -> bool {
    path == "/health" || path == "/api/sandboxes" || path.starts_with("/api/sandboxes/")
}

/// Whether `path` is under a sandbox's AIO prefix.
pub fn is_sandbox_path(path: &str) -> bool {
    path.starts_with(sandbox::PREFIX)
}

/// The sandbox id an AIO request names in its path, for the audit trail.
pub fn sandbox_of(path: &str) -> Option<&str> {
    path.strip_prefix(sandbox::PREFIX)
        .and_then(|rest| rest.split('/').next())
}

/// `path` as the audit trail keeps it: a sandbox's AIO path without its
/// access token.
pub fn redacted(path: &str) -> std::borrow::Cow<'_, str> {
    let Some(rest) = path.strip_prefix(sandbox::PREFIX) else {
        return path.into();
    };
    let mut parts = rest.splitn(3, '/');
    let id = parts.next().unwrap_or_default();
    let _token = parts.next();
    let tail = parts.next().unwrap_or_default();
    format!("{}{id}/-/{tail}", sandbox::PREFIX).into()
}

impl crate::dialect::Dialect for Routers {
    /// The provisioner's paths and everything under a sandbox's prefix.
    fn claim(&self, request: &mut Request) -> bool {
        let path = request.uri().path();
        is_provisioner_path(path) || is_sandbox_path(path)
    }

    fn audited(
        &self,
        path: &str,
        _headers: &axum::http::HeaderMap,
    ) -> Option<crate::dialect::Audited> {
        if path.starts_with("/api/") {
            return Some(crate::dialect::Audited {
                sandbox: None,
                path: path.to_owned(),
            });
        }
        is_sandbox_path(path).then(|| crate::dialect::Audited {
            sandbox: sandbox_of(path).map(str::to_owned),
            path: redacted(path).into_owned(),
        })
    }

    /// Their bodies are small JSON read whole here; the provisioner
    /// authenticates with `X-API-Key`, a sandbox's API by its URL.
    fn serve(&self, request: Request) -> futures_util::future::BoxFuture<'static, Response> {
        let router = if is_provisioner_path(request.uri().path()) {
            self.provisioner.clone()
        } else {
            self.sandbox.clone()
        };
        Box::pin(async move {
            let request = match crate::buffered(request).await {
                Ok(request) => request,
                Err(refused) => return refused,
            };
            match router.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        })
    }
}

/// An answer in the AIO envelope: `{success, message, data}` with `status`.
pub(crate) fn envelope(
    status: axum::http::StatusCode,
    message: &str,
    data: serde_json::Value,
) -> Response {
    (
        status,
        axum::Json(serde_json::json!({
            "success": status.is_success(),
            "message": message,
            "data": data,
        })),
    )
        .into_response()
}

/// A successful answer carrying `data`.
pub(crate) fn ok(data: serde_json::Value) -> Response {
    envelope(axum::http::StatusCode::OK, "Operation successful", data)
}

/// A failed answer: `status` and a message for the model to read.
pub(crate) fn failed(status: axum::http::StatusCode, message: impl AsRef<str>) -> Response {
    envelope(status, message.as_ref(), serde_json::Value::Null)
}
