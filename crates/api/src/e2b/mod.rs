//! The e2b dialect: what the unmodified `e2b` SDKs (Python and JS) and
//! `e2b-code-interpreter` call, served on the daemon's one port.
//!
//! With `E2B_API_URL` and `E2B_SANDBOX_URL` both pointing at the daemon, the
//! SDKs send two kinds of requests, told apart here (see [`Routers`], the
//! dialect's [`crate::dialect::Dialect`]):
//!
//! - the **control plane** (`/sandboxes…`, `/v2/sandboxes…`): create, list,
//!   connect, kill, timeouts, metrics — [`control`];
//! - calls **into one sandbox**, marked by the `E2b-Sandbox-Id` header (and
//!   `E2b-Sandbox-Port`: envd's 49983 or the code interpreter's 49999):
//!   envd's `/files`, `/health` and Connect services
//!   (`/process.Process/*`, `/filesystem.Filesystem/*`), and the code
//!   interpreter's `/execute` and `/contexts` — [`sandbox`].
//!
//! Like every dialect it is thin: each handler translates to a call on
//! `airlock_daemon::Daemon` and back, and keeps no state of its own. The
//! wire facts come from the public specifications in
//! `shared/reference/e2b/` and from reading the SDKs; the definitions here
//! are our own.

pub mod control;
pub mod sandbox;
pub mod volumes;

use crate::Api;
use axum::extract::Request;
use axum::response::Response;
use axum::Router;
use tower::ServiceExt;

/// Header naming the sandbox a request is for.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// Header naming the port inside the sandbox a request is for.
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";

/// Whether `path` is one of the e2b control plane's.
pub fn is_control_path(path: &str) -> bool {
    [
        "/sandboxes",
        "/v2/sandboxes",
        "/v3/sandboxes",
        "/templates",
        "/v2/templates",
        "/v3/templates",
        "/snapshots",
        "/volumes",
    ]
    .iter()
    .any(|prefix| path == *prefix || path.starts_with(&format!("{prefix}/")))
}

/// Whether `path` is one only envd serves (its Connect services and its
/// REST routes), so a request for it without `E2b-Sandbox-Id` is still
/// meant for a sandbox.
fn is_envd_path(path: &str) -> bool {
    path.starts_with("/process.Process/")
        || path.starts_with("/filesystem.Filesystem/")
        || path == "/files"
        || path == "/health"
}

/// The e2b routers, built once.
#[derive(Clone)]
pub struct Routers {
    control: Router,
    upload: Router,
    sandbox: Router,
    volumes: Router,
    daemon: airlock_daemon::Daemon,
    api: Api,
}

impl Routers {
    pub fn new(api: Api) -> Routers {
        let config = api.daemon.config();
        let builds = std::sync::Arc::new(control::builds::Builds::new(
            control::builds::Limits::for_daemon(config.max_upload_bytes, config.max_image_bytes),
        ));
        Routers {
            control: control::router(api.clone(), std::sync::Arc::clone(&builds)),
            upload: control::upload_router(api.clone(), builds),
            sandbox: sandbox::router(api.clone()),
            volumes: volumes::content_router(api.clone()),
            daemon: api.daemon.clone(),
            api,
        }
    }
}

/// The sandbox a request names in `E2b-Sandbox-Id`, if any.
fn named_sandbox(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get(SANDBOX_ID_HEADER).and_then(|v| v.to_str().ok())
}

/// The sandbox a control-plane path is about (`/sandboxes/{id}…`).
fn sandbox_in_path(path: &str) -> Option<&str> {
    path.strip_prefix("/sandboxes/")
        .or_else(|| path.strip_prefix("/v2/sandboxes/"))
        .map(|rest| rest.split('/').next().unwrap_or(rest))
}

impl crate::dialect::Dialect for Routers {
    /// Template uploads, volume content, the control plane, and calls into
    /// a sandbox: those that carry `E2b-Sandbox-Id`, and envd's own paths
    /// whose access token (or signed URL) names the sandbox (e2b 2.7 to
    /// 2.25 drop the header after `Sandbox.connect`), which get the header
    /// here.
    fn claim(&self, request: &mut Request) -> bool {
        // `PORT-ID.DOMAIN`, the host the SDKs reach envd and the code
        // interpreter at when no `E2B_SANDBOX_URL` is set (behind the
        // operator's wildcard DNS and TLS): for envd's ports it is the
        // headers' form; any other port is the ports dialect's.
        let domain = self.daemon.config().sandbox_domain.clone();
        if let Some(target) = crate::ports::by_host(request.headers(), domain.as_deref()) {
            if target.port != sandbox::ENVD_PORT && target.port != sandbox::CODE_INTERPRETER_PORT {
                return false;
            }
            let id = axum::http::HeaderValue::from_str(&target.id);
            let port = axum::http::HeaderValue::from(target.port);
            if let Ok(id) = id {
                request.headers_mut().insert(SANDBOX_ID_HEADER, id);
                request.headers_mut().insert(SANDBOX_PORT_HEADER, port);
            }
        }
        let path = request.uri().path();
        if control::templates::is_upload(request.method(), path)
            || volumes::is_content_path(path)
            || is_control_path(path)
        {
            return true;
        }
        if !request.headers().contains_key(SANDBOX_ID_HEADER) && is_envd_path(path) {
            let sandbox = request
                .headers()
                .get("x-access-token")
                .and_then(|v| v.to_str().ok())
                .and_then(|token| self.daemon.sandbox_with_token(token))
                .and_then(|id| axum::http::HeaderValue::from_str(&id).ok());
            // A signed `/files` URL fetched with nothing but the URL: the
            // sandbox whose token signed it.
            let sandbox = sandbox.or_else(|| {
                if path != "/files" || !sandbox::files_signed(request.uri()) {
                    return None;
                }
                sandbox::files_signer(&self.api, request.uri(), request.method())
                    .and_then(|id| axum::http::HeaderValue::from_str(&id).ok())
            });
            if let Some(id) = sandbox {
                request.headers_mut().insert(SANDBOX_ID_HEADER, id);
            }
        }
        request.headers().contains_key(SANDBOX_ID_HEADER)
    }

    fn audited(
        &self,
        path: &str,
        headers: &axum::http::HeaderMap,
    ) -> Option<crate::dialect::Audited> {
        let named = named_sandbox(headers);
        if named.is_none() && !is_control_path(path) {
            return None;
        }
        Some(crate::dialect::Audited {
            sandbox: sandbox_in_path(path).or(named).map(str::to_owned),
            path: path.to_owned(),
        })
    }

    fn serve(&self, request: Request) -> futures_util::future::BoxFuture<'static, Response> {
        let routers = self.clone();
        Box::pin(async move { routers.route(request).await })
    }
}

impl Routers {
    /// Sends a request the dialect claimed to its router. The e2b routers
    /// authenticate the e2b way and stream their own bodies (Connect
    /// client streams end only when the client ends them).
    async fn route(self, request: Request) -> Response {
        // A template build's files: streamed, authorised by their URL.
        if control::templates::is_upload(request.method(), request.uri().path()) {
            return closing_on_error(oneshot(self.upload, request).await);
        }
        // A volume's files: streamed, authorised by the volume's token.
        if volumes::is_content_path(request.uri().path()) {
            return oneshot(self.volumes, request).await;
        }
        // Control paths first: some SDK versions also send `E2b-Sandbox-Id`
        // on control-plane calls such as `POST /sandboxes/{id}/connect`.
        if is_control_path(request.uri().path()) {
            return oneshot(self.control, request).await;
        }
        if let Some(id) = named_sandbox(request.headers()) {
            // A sandbox paused at its timeout with auto-resume wakes for a
            // call that carries its access token (no one else may wake it).
            let token = request
                .headers()
                .get("x-access-token")
                .and_then(|v| v.to_str().ok());
            if self.daemon.is_paused(id)
                && token.is_some_and(|t| self.daemon.access_token_matches(id, t))
            {
                self.daemon.wake(id).await;
            }
        }
        // Bodies here are streamed (uploads, Connect client streams), so an
        // error answer may leave one unread: close the connection after it.
        closing_on_error(oneshot(self.sandbox, request).await)
    }
}

async fn oneshot(router: Router, request: Request) -> Response {
    match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

fn closing_on_error(response: Response) -> Response {
    if response.status().is_client_error() || response.status().is_server_error() {
        return crate::closing(response);
    }
    response
}
