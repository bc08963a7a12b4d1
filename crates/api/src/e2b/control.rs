//! The e2b control plane: what the SDKs' `Sandbox.create`, `connect`,
//! `kill`, `set_timeout`, `get_info`, `list`, `pause` and `get_metrics`
//! send to `E2B_API_URL`.
//!
//! | route | answer |
//! |---|---|
//! | `POST /sandboxes`, `POST /v2/sandboxes` | 201 `Sandbox` |
//! | `GET /sandboxes` (running only, no pages) | 200 `[ListedSandbox]` |
//! | `GET /v2/sandboxes?state&metadata&template&startedAfter&limit&nextToken` | 200 `[ListedSandbox]`, `x-next-token` when more |
//! | `GET /sandboxes/{id}` | 200 `SandboxDetail` |
//! | `DELETE /sandboxes/{id}` | 204 |
//! | `POST /sandboxes/{id}/timeout` | 204 |
//! | `POST /sandboxes/{id}/connect`, `POST /v2/sandboxes/{id}/connect` | 200 `Sandbox` (TTL extended), 201 when it was paused and is resumed |
//! | `POST /sandboxes/{id}/resume` | 201 `Sandbox` (connect semantics) |
//! | `POST /sandboxes/{id}/pause` | 204 paused (its cgroup frozen, memory kept); 409 when it is paused already; 501 naming a tier or host that cannot pause |
//! | `GET /sandboxes/{id}/metrics`, `GET /sandboxes/metrics?sandbox_ids` | 200 `[SandboxMetric]`, `{"sandboxes": {id: SandboxMetric}}` |
//! | `PUT /sandboxes/{id}/network` | 204; the policy replaced (409 for a sandbox created without network) |
//! | `POST /sandboxes/{id}/snapshots`, `GET /snapshots`, `POST /sandboxes/{id}/fork` | see [`snapshots`] |
//! | `POST /volumes`, `GET /volumes`, `GET|DELETE /volumes/{id}` | see [`super::volumes`] |
//! | refreshes, logs | 501 after the sandbox is found |
//!
//! A sandbox that was killed, timed out or died is gone, as on e2b: every
//! route answers 404 for it. Errors are e2b's `{"code": <status>,
//! "message": "..."}`, which the SDKs turn into their exceptions (401 →
//! `AuthenticationException`, 404 → `SandboxNotFoundException` / `false`
//! from `kill`, 429 → `RateLimitException` after retrying on
//! `Retry-After`, anything else → `SandboxException("<status>: <message>")`).
//!
//! The e2b API key is an airlock API key (`X-API-Key: e2b_…`, the shape
//! every e2b SDK 2.x accepts, or an older `al_…`; or a bearer token); a non-admin key sees only its own sandboxes. The answer to
//! create, connect and get carries the sandbox's access token as
//! `envdAccessToken`, and `domain` (the daemon's sandbox domain, else null); the SDK reaches the sandbox
//! through `E2B_SANDBOX_URL` (this same port).

pub mod builds;
mod snapshots;
pub mod steps;
pub mod templates;
pub mod wire;

use crate::auth::{self, Caller};
use crate::error::ApiError;
use crate::{Api, RequestId};
use airlock_core::DeadReason;
use airlock_daemon::DaemonError;
use airlock_store::{KeyRow, SandboxRow};
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Serialize;
use std::time::Duration;
use wire::*;

type Result<T> = std::result::Result<T, E2bError>;

/// An error answer in e2b's shape: `{"code": <HTTP status>, "message"}`.
#[derive(Debug)]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u64>,
}

#[derive(Serialize)]
struct ErrorWire<'a> {
    code: u16,
    message: &'a str,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::BAD_REQUEST, message)
    }

    /// A sandbox that does not exist, is not the caller's, or is gone.
    pub fn sandbox_not_found(id: &str) -> E2bError {
        E2bError::new(StatusCode::NOT_FOUND, format!("sandbox \"{id}\" not found"))
    }

    /// A feature no tier has yet (501), with a hint.
    pub fn not_supported(what: &str, hint: &str) -> E2bError {
        E2bError::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("{what} is not supported by this airlock daemon yet (on any tier){hint}"),
        )
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> E2bError {
        E2bError {
            status: e.status,
            message: e.message,
            retry_after: e.retry_after,
        }
    }
}

impl From<DaemonError> for E2bError {
    fn from(e: DaemonError) -> E2bError {
        match e {
            // Gone, in e2b's terms.
            DaemonError::NotRunning(id) => E2bError::sandbox_not_found(&id),
            other => ApiError::from(other).into(),
        }
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = ErrorWire {
            code: self.status.as_u16(),
            message: &self.message,
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

/// The control-plane routes (the template builds' state in `builds`).
pub fn router(api: Api, builds: std::sync::Arc<builds::Builds>) -> Router {
    Router::new()
        .route("/sandboxes", post(create_v1).get(list_v1))
        .route("/v2/sandboxes", post(create_v2).get(list_v2))
        .route("/sandboxes/metrics", get(metrics_batch))
        .route("/sandboxes/{id}", get(get_sandbox).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/snapshots", get(snapshots::list))
        .route(
            "/volumes",
            post(super::volumes::create).get(super::volumes::list),
        )
        .route(
            "/volumes/{id}",
            get(super::volumes::get_one).delete(super::volumes::delete),
        )
        .route("/sandboxes/{id}/network", axum::routing::put(set_network))
        .route("/sandboxes/{id}/refreshes", post(not_served))
        .route("/sandboxes/{id}/logs", get(not_served))
        .route("/v2/sandboxes/{id}/logs", get(not_served))
        .route("/v3/templates", post(templates::request_build))
        .route("/templates", get(templates::list))
        .route(
            "/templates/{id}",
            get(templates::get).delete(templates::delete),
        )
        .route("/templates/{id}/tags", get(templates::tags))
        .route("/templates/aliases/{name}", get(templates::alias))
        .route("/templates/{id}/files/{hash}", get(templates::files))
        .route(
            "/v2/templates/{id}/builds/{build}",
            post(templates::start_build),
        )
        .route(
            "/templates/{id}/builds/{build}/status",
            get(templates::build_status),
        )
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::from_fn_with_state(api.clone(), admit))
        .layer(Extension(builds))
        .with_state(api)
}

/// The upload of a template build's files (`PUT /templates/{id}/files/{hash}`):
/// authorised by the token of its URL, its body streamed (not read whole
/// as [`admit`] reads the others).
pub fn upload_router(api: Api, builds: std::sync::Arc<builds::Builds>) -> Router {
    Router::new()
        .route(
            "/templates/{id}/files/{hash}",
            axum::routing::put(templates::upload),
        )
        .fallback(no_route)
        .layer(Extension(builds))
        .with_state(api)
}

async fn no_route() -> E2bError {
    E2bError::new(StatusCode::NOT_FOUND, "no such route")
}

async fn wrong_method() -> E2bError {
    E2bError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "this route does not take that method",
    )
}

/// Reads the body whole (up to 1 MiB, so every answer leaves the
/// connection healthy, as the native API does), then authenticates the
/// e2b way: the API key in `X-API-Key` (or a bearer token). Sandbox access
/// tokens open nothing here.
async fn admit(State(api): State<Api>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    // Read whole before any answer, so an early error never leaves a body
    // unread on a keep-alive connection.
    let bytes = match crate::read_small_body(body).await {
        Ok(bytes) => bytes,
        Err(crate::SmallBodyError::Unreadable) => {
            return crate::closing(
                E2bError::new(
                    StatusCode::BAD_REQUEST,
                    crate::error::unreadable_body().message,
                )
                .into_response(),
            )
        }
        Err(crate::SmallBodyError::TooLarge) => {
            return crate::closing(
                E2bError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the body is larger than 1 MiB",
                )
                .into_response(),
            )
        }
        Err(crate::SmallBodyError::TooSlow) => {
            return crate::closing(
                E2bError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "the body did not arrive in time",
                )
                .into_response(),
            )
        }
    };
    let caller =
        match auth::authenticate(&api.daemon, &parts.method, parts.uri.path(), &parts.headers) {
            Ok(caller @ Caller::Key(_)) => caller,
            _ => {
                return E2bError::new(
                    StatusCode::UNAUTHORIZED,
                    "a valid API key is required in X-API-Key (an airlock API key, e2b_…)",
                )
                .into_response()
            }
        };
    let mut request = Request::from_parts(parts, axum::body::Body::from(bytes));
    crate::server::trust(&request);
    request.extensions_mut().insert(caller.clone());
    let mut response = next.run(request).await;
    response.extensions_mut().insert(caller);
    response
}

/// The API key of an admitted request.
fn key_of(caller: &Caller) -> Result<&KeyRow> {
    caller.key().map_err(E2bError::from)
}

/// A JSON body that may be empty (then `T::default()`).
fn body_of<T: serde::de::DeserializeOwned + Default>(bytes: &Bytes) -> Result<T> {
    crate::error::optional_body(bytes, "valid JSON for this route").map_err(E2bError::from)
}

fn query_of<T>(q: std::result::Result<Query<T>, QueryRejection>) -> Result<T> {
    q.map(|Query(t)| t)
        .map_err(|e| E2bError::bad_request(e.body_text()))
}

/// The sandbox `id` if the caller may see it and it is not gone.
fn live_row(api: &Api, key: &KeyRow, id: &str) -> Result<SandboxRow> {
    match api.daemon.get(key, id) {
        Ok(row) if e2b_state(row.state).is_some() => Ok(row),
        Ok(_) | Err(DaemonError::NotFound(_)) => Err(E2bError::sandbox_not_found(id)),
        Err(e) => Err(e.into()),
    }
}

/// Which create route was called: they differ only in the status of an
/// unknown template (the v2 route documents 404, the first one 400).
#[derive(Clone, Copy)]
enum CreateRoute {
    V1,
    V2,
}

async fn create_v1(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Extension(builds): Extension<std::sync::Arc<builds::Builds>>,
    body: Bytes,
) -> Result<Response> {
    create(api, caller, request_id, &builds, body, CreateRoute::V1).await
}

async fn create_v2(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Extension(builds): Extension<std::sync::Arc<builds::Builds>>,
    body: Bytes,
) -> Result<Response> {
    create(api, caller, request_id, &builds, body, CreateRoute::V2).await
}

/// Whether `name` is a template registered with the daemon or one of
/// `key`'s snapshots.
fn is_registered(api: &Api, key: &KeyRow, name: &str) -> bool {
    api.daemon.resolve_template_for(key, name).is_ok()
}

/// Whether a template name is one of the code interpreter's.
fn wants_interpreter(template: &str) -> bool {
    template.starts_with("code-interpreter")
}

/// Creates a sandbox: 201 and e2b's `Sandbox`.
async fn create(
    api: Api,
    caller: Caller,
    request_id: RequestId,
    builds: &builds::Builds,
    body: Bytes,
    route: CreateRoute,
) -> Result<Response> {
    let key = key_of(&caller)?.clone();
    let body: NewSandbox = body_of(&body)?;
    let name = body.template_name()?.to_owned();
    // A template built through the e2b routes, by its id or `name:tag`.
    let lookup = templates::native_name(&api, Some(builds), &name).unwrap_or_else(|| name.clone());
    let native_template = match template_choice(&lookup) {
        TemplateChoice::Host => "host".to_owned(),
        TemplateChoice::Registered(name) if is_registered(&api, &key, &name) => name,
        TemplateChoice::Registered(name) => {
            let status = match route {
                CreateRoute::V1 => StatusCode::BAD_REQUEST,
                CreateRoute::V2 => StatusCode::NOT_FOUND,
            };
            return Err(E2bError::new(
                status,
                format!("template '{name}' not found"),
            ));
        }
    };
    let interpreter = wants_interpreter(&name);
    let config = api.daemon.config();
    let native = body.to_native(
        &native_template,
        config.default_timeout.as_secs(),
        config.max_timeout.as_secs(),
        config.e2b_internet,
    )?;
    let (mut request, startup) =
        native
            .into_request(&api.daemon, &key)
            .map_err(|e| match e.status {
                StatusCode::NOT_FOUND => E2bError::new(StatusCode::NOT_FOUND, e.message),
                _ => E2bError::bad_request(e.message),
            })?;
    // Recorded as the client named it: `templateID` reads back.
    request.template_name = name;
    let created = api
        .daemon
        .create_started(&key, request, startup, &request_id.0)
        .await?;
    if interpreter {
        // The code interpreter's templates: its default Python context is
        // started now, off the create path, so the first `run_code` finds
        // it running (as e2b's Jupyter is).
        let daemon = api.daemon.clone();
        let id = created.row.id.clone();
        tokio::spawn(async move {
            daemon
                .prepare_code_context(&id, airlock_daemon::interpreter::Language::Python)
                .await;
        });
    }
    Ok((
        StatusCode::CREATED,
        Json(
            SandboxWire::of(
                &created.row,
                Some(created.access_token),
                Some(api.daemon.traffic_token(&created.row.id)),
            )
            .on_domain(api.daemon.config().sandbox_domain.as_deref()),
        ),
    )
        .into_response())
}

/// `GET /sandboxes`: every running sandbox, no pages (e2b's deprecated list).
async fn list_v1(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    params: std::result::Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Vec<ListedWire>>> {
    let key = key_of(&caller)?;
    let params = query_of(params)?;
    let mut plan = list_plan(&ListParams {
        metadata: params.metadata,
        state: Some("running".into()),
        ..ListParams::default()
    })?;
    let mut items = Vec::new();
    loop {
        let page = api.daemon.list(key, plan.query.clone())?;
        items.extend(page.items.iter().filter_map(ListedWire::of));
        match page.next_cursor {
            Some(cursor) => plan.query.cursor = Some(cursor),
            None => break,
        }
    }
    Ok(Json(items))
}

/// `GET /v2/sandboxes`: one page, oldest first; `x-next-token` names the
/// next one. `order` is accepted and the order stays oldest first.
async fn list_v2(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    params: std::result::Result<Query<ListParams>, QueryRejection>,
) -> Result<Response> {
    let key = key_of(&caller)?;
    let plan = list_plan(&query_of(params)?)?;
    let page = api.daemon.list(key, plan.query.clone())?;
    let items: Vec<ListedWire> = page
        .items
        .iter()
        .filter(|row| plan.keeps(row))
        .filter_map(ListedWire::of)
        .collect();
    let mut response = Json(items).into_response();
    if let Some(token) = page
        .next_cursor
        .and_then(|c| HeaderValue::from_str(&c).ok())
    {
        response.headers_mut().insert("x-next-token", token);
    }
    Ok(response)
}

/// `GET /sandboxes/{id}`: e2b's `SandboxDetail`, with the access token.
async fn get_sandbox(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ListedWire>> {
    let row = live_row(&api, key_of(&caller)?, &id)?;
    ListedWire::detail(&row, api.daemon.access_token(&id))
        .map(|mut wire| {
            wire.domain = Some(api.daemon.config().sandbox_domain.clone());
            Json(wire)
        })
        .ok_or_else(|| E2bError::sandbox_not_found(&id))
}

/// `DELETE /sandboxes/{id}`: 204 once everything it held is released.
async fn kill(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    live_row(&api, key_of(&caller)?, &id)?;
    // e2b's kill answers once the sandbox is going; its teardown follows
    // off the request path.
    api.daemon
        .stop_in_background(&id, DeadReason::Deleted, Some(&request_id.0))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The timeout of a body, in whole seconds.
fn timeout_secs(body: &TimeoutBody) -> Result<Option<Duration>> {
    match body.timeout {
        None => Ok(None),
        Some(t) if t >= 0 => Ok(Some(Duration::from_secs(t as u64))),
        Some(_) => Err(E2bError::bad_request("timeout must not be negative")),
    }
}

/// `POST /sandboxes/{id}/timeout` `{"timeout": seconds}`: expires that
/// long from now (shorter or longer); 204.
async fn set_timeout(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode> {
    let key = key_of(&caller)?;
    let body: TimeoutBody = body_of(&body)?;
    let timeout =
        timeout_secs(&body)?.ok_or_else(|| E2bError::bad_request("timeout is required"))?;
    live_row(&api, key, &id)?;
    api.daemon.set_timeout(key, &id, timeout)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /sandboxes/{id}/network` (SandboxNetworkUpdateConfig): replaces the
/// running sandbox's policy (see `wire::network_input` for the mapping);
/// 204. A sandbox created without network has no egress path: 409.
async fn set_network(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode> {
    let key = key_of(&caller)?;
    let body: wire::NetworkConfig = body_of(&body)?;
    live_row(&api, key, &id)?;
    let input = wire::network_input(
        body.allow_internet_access,
        Some(&body),
        api.daemon.config().e2b_internet,
    )?;
    let policy = input.policy().map_err(E2bError::bad_request)?;
    api.daemon
        .set_network_policy(key, &id, policy, &request_id.0)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Connect semantics: the running sandbox's `Sandbox`, its lifetime
/// extended to `timeout` from now if that is later than it was.
/// Connect and resume: a paused sandbox is resumed (then `true`), the
/// timeout extended when the body asks for more than is left.
async fn attach(api: &Api, key: &KeyRow, id: &str, body: &Bytes) -> Result<(SandboxWire, bool)> {
    let body: TimeoutBody = body_of(body)?;
    let timeout = timeout_secs(&body)?;
    let mut row = live_row(api, key, id)?;
    let resumed = row.state == airlock_store::State::Paused;
    if resumed {
        match body.memory {
            Some(false) => api.daemon.reboot(key, id).await?,
            _ => api.daemon.resume(key, id).await?,
        }
        row = live_row(api, key, id)?;
    }
    if let Some(timeout) = timeout.filter(|t| !t.is_zero()) {
        let wanted = airlock_daemon::audit::now_ms()
            .saturating_add(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX));
        if wanted > row.expires_at {
            row = api.daemon.set_timeout(key, id, timeout)?;
        }
    }
    let wire = SandboxWire::of(
        &row,
        api.daemon.access_token(id),
        Some(api.daemon.traffic_token(id)),
    )
    .on_domain(api.daemon.config().sandbox_domain.as_deref());
    Ok((wire, resumed))
}

/// `POST /sandboxes/{id}/connect` and `/v2/…/connect`: 200 when it was
/// running, 201 when it was paused and is resumed (as e2b answers).
async fn connect(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let (wire, resumed) = attach(&api, key_of(&caller)?, &id, &body).await?;
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(wire)).into_response())
}

/// `POST /sandboxes/{id}/resume` (the SDKs' older call): connect,
/// answered 201 as e2b answers a resume.
async fn resume(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let (wire, _) = attach(&api, key_of(&caller)?, &id, &body).await?;
    Ok((StatusCode::CREATED, Json(wire)).into_response())
}

/// Body of `POST /sandboxes/{id}/pause` (SDKs of 2025 on send it).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PauseBody {
    /// `false`: keep only the filesystem; otherwise memory too.
    memory: Option<bool>,
    /// Whether the guest must be healthy first (ours always answers).
    #[allow(dead_code)]
    require_healthy_guest: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: 204 once paused; 409 when it is paused
/// already (what e2b answers, and the SDKs take as success); 501 naming a
/// tier or host that cannot pause, rather than e2b's 409, which the SDKs
/// would report as success.
async fn pause(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode> {
    let key = key_of(&caller)?;
    let body: PauseBody = body_of(&body)?;
    let row = live_row(&api, key, &id)?;
    if row.state == airlock_store::State::Paused {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is already paused"),
        ));
    }
    let mode = match body.memory {
        Some(false) => airlock_daemon::PauseMode::Filesystem,
        _ => airlock_daemon::PauseMode::Memory,
    };
    match api.daemon.pause(key, &id, mode).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(DaemonError::Unsupported(message)) => Err(E2bError::new(
            StatusCode::NOT_IMPLEMENTED,
            format!(
                "{message}; the sandbox keeps running (kill it, or extend it with set_timeout)"
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// Sandbox operations this daemon does not serve (yet): 404 for a sandbox
/// the caller cannot see, 501 with what to do instead otherwise.
async fn not_served(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    route: axum::extract::MatchedPath,
) -> Result<StatusCode> {
    live_row(&api, key_of(&caller)?, &id)?;
    Err(
        match route.as_str().rsplit('/').next().unwrap_or_default() {
            "refreshes" => E2bError::not_supported("refreshing", "; use set_timeout"),
            _ => E2bError::not_supported(
                "reading sandbox logs",
                "; see the native /v1/sandboxes/{id}/events",
            ),
        },
    )
}

/// One metric sample of a visible, live sandbox.
async fn sample(api: &Api, row: &SandboxRow) -> MetricWire {
    let measured = api
        .daemon
        .usage(&row.id)
        .await
        .map(|u| Measured {
            cpu_time_ns: u.cpu_time_ns,
            peak_memory_bytes: u.peak_memory_bytes,
        })
        .unwrap_or_default();
    metric_of(row, measured, airlock_daemon::audit::now_ms())
}

/// `GET /sandboxes/{id}/metrics`: one sample, now (`start`/`end` are
/// accepted; there is no history).
async fn metrics(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Vec<MetricWire>>> {
    let row = live_row(&api, key_of(&caller)?, &id)?;
    Ok(Json(vec![sample(&api, &row).await]))
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: a sample of each one the
/// caller may see and that is live; others are left out.
async fn metrics_batch(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    params: std::result::Result<Query<MetricsParams>, QueryRejection>,
) -> Result<Json<MetricsBatchWire>> {
    let key = key_of(&caller)?;
    let ids = metric_ids(&query_of(params)?)?;
    let mut sandboxes = std::collections::BTreeMap::new();
    for id in ids {
        if let Ok(row) = live_row(&api, key, &id) {
            let measured = sample(&api, &row).await;
            sandboxes.insert(id, measured);
        }
    }
    Ok(Json(MetricsBatchWire { sandboxes }))
}
