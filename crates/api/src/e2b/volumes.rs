//! e2b's volumes: what the SDKs' `Volume` class sends.
//!
//! | route | answer |
//! |---|---|
//! | `POST /volumes` `{"name"}` | 201 `VolumeAndToken` (409 for a name the key has) |
//! | `GET /volumes` | 200 `[Volume]` |
//! | `GET /volumes/{volumeID}` | 200 `VolumeAndToken` |
//! | `DELETE /volumes/{volumeID}` | 204 (409 while a sandbox mounts it) |
//! | `GET /volumecontent/{volumeID}/dir?path&depth` | 200 `[VolumeEntryStat]` |
//! | `POST /volumecontent/{volumeID}/dir?path&uid&gid&mode&force` | 201 `VolumeEntryStat` |
//! | `GET /volumecontent/{volumeID}/file?path` | 200, the bytes |
//! | `PUT /volumecontent/{volumeID}/file?path&uid&gid&mode&force` | 201 `VolumeEntryStat` |
//! | `GET /volumecontent/{volumeID}/path?path` | 200 `VolumeEntryStat` |
//! | `PATCH /volumecontent/{volumeID}/path?path` `{uid, gid, mode}` | 200 `VolumeEntryStat` |
//! | `DELETE /volumecontent/{volumeID}/path?path` | 204 |
//!
//! The control routes take the API key (they are in the control router);
//! the content routes take the volume's token as `Authorization: Bearer`
//! (what `VolumeAndToken.token` gave out; the SDK sends nothing else) or
//! the owner's API key. The answer has no `domain`: the SDK then sends
//! content calls to `E2B_VOLUME_API_URL`, this same port. Errors are
//! `{"code", "message"}`, which the SDK needs to parse before it maps 404
//! to `VolumePathNotFoundException`. `Sandbox.create(volume_mounts=…)`
//! names volumes by name; see `wire::NewSandbox`.

use super::control::E2bError;
use crate::auth::{self, Caller};
use crate::volumes::content::{self, ListQuery, PathQuery, PlaceQuery};
use crate::{Api, RequestId};
use airlock_store::VolumeRow;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};

type Result<T> = std::result::Result<T, E2bError>;

/// `Volume`.
#[derive(Debug, Serialize)]
struct VolumeWire {
    #[serde(rename = "volumeID")]
    volume_id: String,
    name: String,
}

/// `VolumeAndToken`.
#[derive(Debug, Serialize)]
struct VolumeAndTokenWire {
    #[serde(rename = "volumeID")]
    volume_id: String,
    name: String,
    token: String,
}

fn with_token(api: &Api, row: VolumeRow) -> VolumeAndTokenWire {
    VolumeAndTokenWire {
        token: api.daemon.volume_token(&row.id),
        volume_id: row.id,
        name: row.name,
    }
}

/// `NewVolume`.
#[derive(Debug, Default, Deserialize)]
struct NewVolume {
    name: Option<String>,
}

fn key_of(caller: &Caller) -> Result<&airlock_store::KeyRow> {
    caller.key().map_err(E2bError::from)
}

/// A volume the caller may not see is one that does not exist.
fn not_found(e: airlock_daemon::DaemonError) -> E2bError {
    match e {
        airlock_daemon::DaemonError::NotFound(m) => E2bError::new(StatusCode::NOT_FOUND, m),
        other => other.into(),
    }
}

/// `POST /volumes`.
pub async fn create(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<impl Serialize>)> {
    let key = key_of(&caller)?;
    let body: NewVolume = crate::error::optional_body(&body, "a JSON object with a name")?;
    let Some(name) = body.name else {
        return Err(E2bError::bad_request("name is required"));
    };
    let row = api.daemon.create_volume(key, &name, None, &request_id.0)?;
    Ok((StatusCode::CREATED, Json(with_token(&api, row))))
}

/// `GET /volumes`.
pub async fn list(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<impl Serialize>> {
    let rows = api.daemon.volumes(key_of(&caller)?)?;
    Ok(Json(
        rows.into_iter()
            .map(|row| VolumeWire {
                volume_id: row.id,
                name: row.name,
            })
            .collect::<Vec<_>>(),
    ))
}

/// `GET /volumes/{volumeID}`.
pub async fn get_one(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<impl Serialize>> {
    let row = api
        .daemon
        .find_volume(key_of(&caller)?, &id)
        .map_err(not_found)?;
    Ok(Json(with_token(&api, row)))
}

/// `DELETE /volumes/{volumeID}`.
pub async fn delete(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    api.daemon
        .delete_volume(key_of(&caller)?, &id, &request_id.0)
        .await
        .map_err(not_found)?;
    Ok(StatusCode::NO_CONTENT)
}

/// The content routes, their bodies streamed (see [`admit_content`]).
pub fn content_router(api: Api) -> Router {
    Router::new()
        .route("/volumecontent/{id}/dir", get(list_dir).post(make_dir))
        .route("/volumecontent/{id}/file", get(read_file).put(write_file))
        .route(
            "/volumecontent/{id}/path",
            get(stat).patch(set_metadata).delete(remove),
        )
        .fallback(|| async { E2bError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            E2bError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "this route does not take that method",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            admit_content,
        ))
        .with_state(api)
}

/// Whether `path` is one of the content routes'.
pub fn is_content_path(path: &str) -> bool {
    path.starts_with("/volumecontent/")
}

/// The volume a content call is for, when its token (or its owner's API
/// key) opens it: put into the request's extensions. Anything else is 401
/// for a call without credentials and 404 for one whose credentials do
/// not open that volume (so a token tells nothing of other volumes).
async fn admit_content(
    State(api): State<Api>,
    mut request: Request,
    next: axum::middleware::Next,
) -> Response {
    let id = request
        .uri()
        .path()
        .trim_start_matches("/volumecontent/")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let found = match bearer.filter(|b| !airlock_store::is_key_secret(b)) {
        Some(token) => api.daemon.volume_for_token(&id, token),
        None => {
            match auth::authenticate(&api.daemon, request.method(), request.uri().path(), headers) {
                Ok(caller @ Caller::Key(_)) => match caller.key() {
                    Ok(key) => api.daemon.find_volume(key, &id),
                    Err(e) => return E2bError::from(e).into_response(),
                },
                _ => return E2bError::new(
                    StatusCode::UNAUTHORIZED,
                    "a volume token is required as Authorization: Bearer (VolumeAndToken.token)",
                )
                .into_response(),
            }
        }
    };
    let volume = match found {
        Ok(volume) => volume,
        Err(e) => return crate::closing(not_found(e).into_response()),
    };
    crate::server::trust(&request);
    request.extensions_mut().insert(volume);
    let response = next.run(request).await;
    if response.status().is_client_error() || response.status().is_server_error() {
        return crate::closing(response);
    }
    response
}

fn query_of<T>(q: std::result::Result<Query<T>, QueryRejection>) -> Result<T> {
    q.map(|Query(t)| t)
        .map_err(|e| E2bError::bad_request(e.body_text()))
}

async fn list_dir(
    State(api): State<Api>,
    Extension(volume): Extension<VolumeRow>,
    q: std::result::Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response> {
    let entries = content::list(&api, &volume, query_of(q)?).await?;
    Ok(Json(entries).into_response())
}

async fn make_dir(
    State(api): State<Api>,
    Extension(volume): Extension<VolumeRow>,
    q: std::result::Result<Query<PlaceQuery>, QueryRejection>,
) -> Result<Response> {
    let made = content::make_dir(&api, &volume, query_of(q)?).await?;
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

async fn read_file(
    State(api): State<Api>,
    Extension(volume): Extension<VolumeRow>,
    q: std::result::Result<Query<PathQuery>, QueryRejection>,
) -> Result<Response> {
    Ok(content::read(&api, &volume, query_of(q)?).await?)
}

async fn write_file(
    State(api): State<Api>,
    Extension(volume): Extension<VolumeRow>,
    q: std::result::Result<Query<PlaceQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    let written = content::write(&api, &volume, query_of(q)?, &headers, body).await?;
    Ok((StatusCode::CREATED, Json(written)).into_response())
}

async fn stat(
    State(api): State<Api>,
    Extension(volume): Extension<VolumeRow>,
    q: std::result::Result<Query<PathQuery>, QueryRejection>,
) -> Result<Response> {
    Ok(Json(content::stat(&api, &volume, query_of(q)?).await?).into_response())
}

async fn set_metadata(
    State(api): State<Api>,
    Extension(volume): Extension<VolumeRow>,
    q: std::result::Result<Query<PathQuery>, QueryRejection>,
    body: Body,
) -> Result<Response> {
    let q = query_of(q)?;
    let body = crate::read_small_body(body)
        .await
        .map_err(|_| E2bError::bad_request("the body is not a JSON object under 1 MiB"))?;
    Ok(Json(content::set_metadata(&api, &volume, q, &body).await?).into_response())
}

async fn remove(
    State(api): State<Api>,
    Extension(volume): Extension<VolumeRow>,
    q: std::result::Result<Query<PathQuery>, QueryRejection>,
) -> Result<StatusCode> {
    content::remove(&api, &volume, query_of(q)?).await?;
    Ok(StatusCode::NO_CONTENT)
}
