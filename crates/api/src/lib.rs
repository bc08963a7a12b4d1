//! The HTTP face of the daemon.
//!
//! [`router`] builds every route. The native `/v1` routes are registered
//! through `utoipa-axum`, which records each route's path and method in the
//! OpenAPI document as it adds it to the router, so `/v1/openapi.json`
//! describes exactly what is served; a test walks the document against the
//! router to keep it that way.
//!
//! Every request gets an id (`X-Request-Id`, generated unless the client
//! sent a sane one) that ties its audit events together; every `/v1` call
//! is authenticated before routing and recorded in the access stream.
//! Errors are JSON `{code, message}` (see [`error`]), including unknown
//! routes (404), wrong methods (405) and bodies over 1 MiB (413).
#![forbid(unsafe_code)]

pub mod aio;
pub mod auth;
pub mod dialect;
pub mod e2b;
pub mod error;
mod files;
mod form;
mod native;
mod pools;
pub mod ports;
pub mod server;
mod snapshots;
mod templates;
pub mod types;
mod volumes;

use airlock_daemon::Daemon;
use airlock_store::Stream;
use auth::Caller;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;
use std::time::Instant;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Largest JSON body.
pub const MAX_JSON_BYTES: usize = 1 << 20;
/// Time a body read whole before authentication (up to
/// [`MAX_JSON_BYTES`]) may take to arrive: a stranger trickling one must
/// not hold the connection.
pub const SMALL_BODY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a small body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SmallBodyError {
    /// Larger than [`MAX_JSON_BYTES`].
    TooLarge,
    /// Not framed as its headers say, or broken off.
    Unreadable,
    /// Not all there within [`SMALL_BODY_DEADLINE`].
    TooSlow,
}

/// Reads a body whole, up to [`MAX_JSON_BYTES`] within
/// [`SMALL_BODY_DEADLINE`].
pub(crate) async fn read_small_body(
    body: axum::body::Body,
) -> Result<bytes::Bytes, SmallBodyError> {
    match tokio::time::timeout(
        SMALL_BODY_DEADLINE,
        axum::body::to_bytes(body, MAX_JSON_BYTES),
    )
    .await
    {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) if error::too_long(&e) => Err(SmallBodyError::TooLarge),
        Ok(Err(_)) => Err(SmallBodyError::Unreadable),
        Err(_) => Err(SmallBodyError::TooSlow),
    }
}

/// State shared by the handlers.
#[derive(Clone)]
pub struct Api {
    pub daemon: Daemon,
    /// Kept-alive connections to sandboxes' ports.
    ports: ports::PortPool,
}

impl Api {
    pub fn new(daemon: Daemon) -> Api {
        let ports = ports::PortPool::new(daemon.clone());
        Api { daemon, ports }
    }
}

/// Whether `id` has the shape of a sandbox id (`sbx-` and hex digits):
/// what the dialects check before they look an id up.
pub(crate) fn is_sandbox_id(id: &str) -> bool {
    id.strip_prefix("sbx-").is_some_and(|hex| {
        (1..=32).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// The id of the request being served.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

#[derive(OpenApi)]
#[openapi(
    info(title = "airlock native API", version = "1", description = "Sandboxes for untrusted, model-generated code. Errors are always {code, message}."),
    modifiers(&Security),
    security(("api_key" = []), ("bearer" = []), ("access_token" = [])),
    tags(
        (name = "sandboxes", description = "Lifecycle"),
        (name = "processes", description = "Running commands"),
        (name = "files", description = "Files inside a sandbox"),
        (name = "audit", description = "The audit trail"),
        (name = "templates", description = "Templates and the layer store"),
        (name = "snapshots", description = "Snapshots and forks of sandboxes"),
        (name = "pools", description = "Warm pools of started sandboxes (admin)"),
        (name = "volumes", description = "Named volumes that outlive sandboxes"),
        (name = "operations", description = "Health and metrics"),
    )
)]
struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "access_token",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-Access-Token"))),
        );
    }
}

/// Liveness.
#[utoipa::path(get, path = "/healthz", tag = "operations", security(()),
    responses((status = 200, description = "Serving", body = types::Health)))]
async fn healthz() -> Json<types::Health> {
    Json(types::Health {
        status: "ok".into(),
    })
}

/// Prometheus metrics of the whole daemon, every tenant's sandboxes
/// together: admin keys only.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String),
        (status = 401, description = "No valid API key", body = error::ErrorBody),
        (status = 403, description = "Not an admin key", body = error::ErrorBody),
    ))]
async fn metrics(
    State(api): State<Api>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> Response {
    if let Err(refused) = caller.admin() {
        return refused.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        api.daemon.scrape_metrics().await,
    )
        .into_response()
}

/// The routes and their OpenAPI document.
fn parts(api: Api) -> (Router, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(native::create_sandbox, native::list_sandboxes))
        .routes(routes!(native::get_sandbox, native::delete_sandbox))
        .routes(routes!(native::set_timeout))
        .routes(routes!(native::pause_sandbox))
        .routes(routes!(native::resume_sandbox))
        .routes(routes!(snapshots::create_snapshot))
        .routes(routes!(snapshots::fork_sandbox))
        .routes(routes!(snapshots::collect_outputs))
        .routes(routes!(snapshots::list_snapshots))
        .routes(routes!(snapshots::get_snapshot, snapshots::delete_snapshot))
        .routes(routes!(pools::list_pools))
        .routes(routes!(
            pools::get_pool,
            pools::set_pool,
            pools::delete_pool
        ))
        .routes(routes!(volumes::create_volume, volumes::list_volumes))
        .routes(routes!(volumes::get_volume, volumes::delete_volume))
        .routes(routes!(volumes::list_dir, volumes::make_dir))
        .routes(routes!(volumes::read_file, volumes::write_file))
        .routes(routes!(
            volumes::stat_path,
            volumes::set_metadata,
            volumes::remove_path
        ))
        .routes(routes!(native::get_network, native::set_network))
        .routes(routes!(native::exec))
        .routes(routes!(native::list_processes))
        .routes(routes!(native::get_process))
        .routes(routes!(native::process_output))
        .routes(routes!(native::write_stdin))
        .routes(routes!(native::close_stdin))
        .routes(routes!(native::signal_process))
        .routes(routes!(native::sandbox_events))
        .routes(routes!(
            files::read_file,
            files::write_file,
            files::remove_file
        ))
        .routes(routes!(files::stat))
        .routes(routes!(files::list_dir))
        .routes(routes!(files::make_dir))
        .routes(routes!(files::move_path))
        .routes(routes!(files::watch))
        .routes(routes!(native::list_tiers))
        .routes(routes!(templates::list_templates))
        .routes(routes!(
            templates::get_template,
            templates::patch_template,
            templates::delete_template
        ))
        .routes(routes!(templates::import_template))
        .routes(routes!(templates::pull_template))
        .routes(routes!(templates::bootstrap_template))
        .routes(routes!(templates::build_template))
        .routes(routes!(templates::template_sbom))
        .routes(routes!(templates::collect_garbage))
        .routes(routes!(metrics))
        .routes(routes!(healthz))
        .with_state(api)
        .split_for_parts()
}

/// The OpenAPI document of the native API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// Every route of the daemon, its dialects with their default settings.
pub fn router(daemon: Daemon) -> Router {
    router_with(daemon, Dialects::default())
}

/// What the operator sets for the dialects.
#[derive(Debug, Clone, Default)]
pub struct Dialects {
    pub aio: aio::Settings,
}

/// Every route of the daemon.
pub fn router_with(daemon: Daemon, dialects: Dialects) -> Router {
    let api = Api::new(daemon);
    // The dialects, asked in this order: e2b's first (its envd `/health`
    // carries its headers; DeerFlow's provisioner `/health` does not; a
    // host naming envd's port is e2b's, any other sandbox port is the
    // ports dialect's, whatever its path).
    let served = dialect::Dialects::new(vec![
        std::sync::Arc::new(e2b::Routers::new(api.clone())),
        std::sync::Arc::new(ports::Ports::new(api.clone())),
        std::sync::Arc::new(aio::Routers::new(api.clone(), dialects.aio)),
    ]);
    let (routes, document) = parts(api.clone());
    let document = std::sync::Arc::new(document);
    routes
        .route(
            "/v1/openapi.json",
            axum::routing::get(move || {
                let document = std::sync::Arc::clone(&document);
                async move { Json(document.as_ref().clone()) }
            }),
        )
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .layer(DefaultBodyLimit::max(MAX_JSON_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            authenticate,
        ))
        .layer(axum::middleware::from_fn(read_whole_body))
        .layer(axum::middleware::from_fn_with_state(
            served.clone(),
            dialect::demux,
        ))
        .layer(axum::middleware::from_fn_with_state((api, served), observe))
}

/// Whether the request streams its body to the handler (uploads).
fn is_streamed_upload(request: &Request) -> bool {
    let path = request.uri().path();
    (request.method() == axum::http::Method::PUT && path.ends_with("/files"))
        || (request.method() == axum::http::Method::PUT
            && path.starts_with("/v1/volumes/")
            && path.ends_with("/file"))
        || (request.method() == axum::http::Method::POST
            && path.starts_with("/v1/templates/")
            && (path.ends_with("/import") || path.ends_with("/build")))
}

/// Reads every request body (but uploads) whole, up to 1 MiB, before
/// anything answers. An answer sent while a body is still unread makes the
/// server drop the connection after it, which a client that reuses
/// connections sees as a broken request; reading first keeps every answer
/// on a healthy connection. A larger body answers 413 and closes the
/// connection (saying so), as does any error answer to an upload.
async fn read_whole_body(request: Request, next: Next) -> Response {
    if is_streamed_upload(&request) {
        let response = next.run(request).await;
        if response.status().is_client_error() || response.status().is_server_error() {
            return closing(response);
        }
        return response;
    }
    match buffered(request).await {
        Ok(request) => next.run(request).await,
        Err(too_large) => too_large,
    }
}

/// The request with its body read whole (up to [`MAX_JSON_BYTES`]), or the
/// answer that closes the connection: 413 past the limit, 400 for a body
/// that is not framed as its headers say.
pub(crate) async fn buffered(request: Request) -> Result<Request, Response> {
    let (parts, body) = request.into_parts();
    match read_small_body(body).await {
        Ok(bytes) => Ok(Request::from_parts(parts, axum::body::Body::from(bytes))),
        Err(SmallBodyError::Unreadable) => Err(closing(error::unreadable_body().into_response())),
        Err(SmallBodyError::TooLarge) => Err(closing(
            error::ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the body is larger than 1 MiB",
            )
            .into_response(),
        )),
        Err(SmallBodyError::TooSlow) => Err(closing(
            error::ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the body did not arrive in time",
            )
            .into_response(),
        )),
    }
}

/// Marks an answer as the last on its connection (its request body may be
/// unread).
pub(crate) fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Routes that need no credentials.
fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/v1/openapi.json")
}

/// Authenticates every non-public request and puts the [`Caller`] into its
/// extensions (and a copy into the response's, for the access log).
async fn authenticate(State(api): State<Api>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    if is_public(&path) {
        return next.run(request).await;
    }
    let caller = match auth::authenticate(&api.daemon, request.method(), &path, request.headers()) {
        Ok(caller) => caller,
        Err(e) => return e.into_response(),
    };
    server::trust(&request);
    request.extensions_mut().insert(caller.clone());
    let mut response = next.run(request).await;
    response.extensions_mut().insert(caller);
    response
}

fn request_id_of(request: &Request) -> String {
    request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            (1..=64).contains(&v.len())
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
        .map(str::to_owned)
        .unwrap_or_else(|| {
            airlock_store::new_secret("req-")
                .map(|s| s.chars().take(20).collect())
                .unwrap_or_else(|_| "req-unknown".into())
        })
}

/// Gives each request its id, records it in the access stream and the
/// response metrics.
async fn observe(
    State((api, dialects)): State<(Api, dialect::Dialects)>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let id = request_id_of(&request);
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    // A dialect's request is recorded as the dialect says.
    let by_dialect = dialects.audited(&path, request.headers());
    let audited = (path.starts_with("/v1/") && path != "/v1/openapi.json") || by_dialect.is_some();
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).await;
    let status = response.status();
    api.daemon
        .metrics()
        .http_responses
        .get_or_create(&airlock_daemon::metrics::StatusLabel {
            code: status.as_u16(),
        })
        .inc();
    if audited {
        let sandbox = path
            .strip_prefix("/v1/sandboxes/")
            .map(|rest| rest.split('/').next().unwrap_or(rest))
            .or(by_dialect.as_ref().and_then(|a| a.sandbox.as_deref()))
            .filter(|id| {
                id.strip_prefix("sbx-").is_some_and(|hex| {
                    (1..=32).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit())
                })
            });
        let caller = response.extensions().get::<Caller>().map(Caller::label);
        let stream = if status == StatusCode::UNAUTHORIZED {
            Stream::Security
        } else {
            Stream::Access
        };
        api.daemon.audit().record(
            stream,
            if stream == Stream::Security {
                "auth.denied"
            } else {
                "api.call"
            },
            sandbox,
            Some(&id),
            json!({
                "method": method,
                "path": by_dialect.as_ref().map_or(path.as_str(), |a| a.path.as_str()),
                "status": status.as_u16(),
                "caller": caller,
                "duration_ms": started.elapsed().as_millis() as u64,
            }),
        );
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}
