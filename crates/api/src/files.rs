//! The file routes of the native API. Paths are resolved by the agent
//! inside the sandbox, never on the host.

use crate::auth::Caller;
use crate::error::{json_body, query, ApiError, ErrorBody};
use crate::types::*;
use crate::{Api, RequestId};
use axum::body::Body;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use futures_util::StreamExt;

type Result<T> = std::result::Result<T, ApiError>;

/// Downloads a file.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathParams),
    responses(
        (status = 200, description = "The bytes", content_type = "application/octet-stream", body = String),
        (status = 400, description = "Not a file", body = ErrorBody),
        (status = 404, description = "No such sandbox or file", body = ErrorBody),
    ))]
pub async fn read_file(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
    params: std::result::Result<Query<PathParams>, QueryRejection>,
) -> Result<Response> {
    caller.may_use(&api.daemon, &id)?;
    let params = query(params)?;
    let reader = api
        .daemon
        .read_file(&id, &params.path, &request_id.0)
        .await?;
    let stream = futures_util::stream::unfold(reader, |mut reader| async move {
        match reader.next_chunk().await? {
            Ok(chunk) => Some((Ok::<Bytes, std::io::Error>(Bytes::from(chunk)), reader)),
            // Headers are gone already: break the body off, so the client
            // sees a failed transfer, not a short file.
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), reader)),
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// 413 for an upload whose declared length is over `limit` (one that
/// declares none is cut off at it as it streams).
pub(crate) fn within_upload_limit(headers: &HeaderMap, limit: u64) -> Result<()> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the upload is larger than the limit of {limit} bytes"),
        ));
    }
    Ok(())
}

/// Uploads a file (streamed; parents created; appears whole or not at all).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), WriteParams),
    request_body(content = String, content_type = "application/octet-stream"),
    responses(
        (status = 201, description = "Written", body = Written),
        (status = 400, description = "Bad path", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 413, description = "Over the upload limit; nothing written", body = ErrorBody),
    ))]
pub async fn write_file(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
    params: std::result::Result<Query<WriteParams>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    caller.may_use(&api.daemon, &id)?;
    let params = query(params)?;
    let limit = api.daemon.config().max_upload_bytes;
    within_upload_limit(&headers, limit)?;
    let mode = match params.mode.as_deref() {
        None => None,
        Some(text) => Some(
            u32::from_str_radix(text, 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| {
                    ApiError::bad_request("mode: must be octal permission bits such as 644")
                })?,
        ),
    };
    let stream = body
        .into_data_stream()
        .map(|r| r.map_err(|e| e.to_string()));
    let bytes = api
        .daemon
        .write_file(
            &id,
            &params.path,
            mode,
            params.user.map(Into::into),
            airlock_daemon::files::WriteMode::Atomic,
            None,
            Box::pin(stream),
            limit,
            &request_id.0,
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(Written {
            path: params.path,
            bytes,
        }),
    )
        .into_response())
}

/// Removes a file, or a directory (`recursive` for a non-empty one).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), RemoveParams),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Bad path or a non-empty directory", body = ErrorBody),
        (status = 404, description = "No such sandbox or path", body = ErrorBody),
    ))]
pub async fn remove_file(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
    params: std::result::Result<Query<RemoveParams>, QueryRejection>,
) -> Result<StatusCode> {
    caller.may_use(&api.daemon, &id)?;
    let params = query(params)?;
    api.daemon
        .remove(&id, &params.path, params.recursive, &request_id.0)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Metadata of a path.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PathParams),
    responses(
        (status = 200, description = "Metadata", body = FileView),
        (status = 404, description = "No such sandbox or path", body = ErrorBody),
    ))]
pub async fn stat(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    params: std::result::Result<Query<PathParams>, QueryRejection>,
) -> Result<Json<FileView>> {
    caller.may_use(&api.daemon, &id)?;
    let params = query(params)?;
    Ok(Json(api.daemon.stat(&id, &params.path).await?.into()))
}

/// Lists a directory to `depth` levels, one page at a time, sorted by path.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), ListDirParams),
    responses(
        (status = 200, description = "A page of entries", body = Entries),
        (status = 400, description = "Not a directory, or a bad depth, limit or cursor", body = ErrorBody),
        (status = 404, description = "No such sandbox or path", body = ErrorBody),
    ))]
pub async fn list_dir(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    params: std::result::Result<Query<ListDirParams>, QueryRejection>,
) -> Result<Json<Entries>> {
    caller.may_use(&api.daemon, &id)?;
    let params = query(params)?;
    let page = api
        .daemon
        .list_dir_page(
            &id,
            &params.path,
            params.depth.unwrap_or(1),
            params.cursor.as_deref(),
            params
                .limit
                .unwrap_or(airlock_daemon::files::LIST_PAGE_DEFAULT),
        )
        .await?;
    Ok(Json(Entries {
        entries: page.entries.into_iter().map(Into::into).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// Creates a directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = MakeDirBody,
    responses(
        (status = 201, description = "Created", body = FileView),
        (status = 404, description = "No such sandbox or parent", body = ErrorBody),
        (status = 409, description = "It exists", body = ErrorBody),
    ))]
pub async fn make_dir(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: std::result::Result<Json<MakeDirBody>, JsonRejection>,
) -> Result<Response> {
    caller.may_use(&api.daemon, &id)?;
    let body = json_body(body)?;
    api.daemon
        .make_dir(&id, &body.path, body.parents, body.user.map(Into::into))
        .await?;
    let info: FileView = api.daemon.stat(&id, &body.path).await?.into();
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

/// Renames a path.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/move", tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = MoveBody,
    responses(
        (status = 200, description = "Moved; metadata of the new path", body = FileView),
        (status = 404, description = "No such sandbox or path", body = ErrorBody),
    ))]
pub async fn move_path(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: std::result::Result<Json<MoveBody>, JsonRejection>,
) -> Result<Json<FileView>> {
    caller.may_use(&api.daemon, &id)?;
    let body = json_body(body)?;
    Ok(Json(
        api.daemon
            .move_path(&id, &body.from, &body.to, None)
            .await?
            .into(),
    ))
}

/// Query of a watch.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WatchParams {
    /// Absolute path of a directory inside the sandbox.
    #[param(pattern = "^/")]
    pub path: String,
    /// Watch subdirectories too, including ones created later.
    #[serde(default)]
    pub recursive: bool,
}

/// One line of a watch stream (NDJSON).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct WatchEvent {
    /// `create`, `write`, `remove`, `rename` or `chmod`; `error` when the
    /// watch broke (then `code` and `message` are set and the stream ends).
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Streams changes under a directory until the client goes away.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/watch", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), WatchParams),
    responses(
        (status = 200, description = "NDJSON changes", content_type = "application/x-ndjson", body = WatchEvent),
        (status = 400, description = "Not a directory", body = ErrorBody),
        (status = 404, description = "No such sandbox or directory", body = ErrorBody),
    ))]
pub async fn watch(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    params: std::result::Result<Query<WatchParams>, QueryRejection>,
) -> Result<Response> {
    caller.may_use(&api.daemon, &id)?;
    let params = query(params)?;
    let watcher = api
        .daemon
        .watch(
            &id,
            &params.path,
            &airlock_daemon::files::WatchOptions {
                recursive: params.recursive,
                ..Default::default()
            },
        )
        .await?;
    let stream = futures_util::stream::unfold(Some(watcher), |watcher| async move {
        let mut watcher = watcher?;
        let event = match watcher.next().await? {
            Ok(change) => WatchEvent {
                kind: serde_json::to_value(change.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                path: Some(change.path),
                code: None,
                message: None,
            },
            Err(e) => {
                let error = ApiError::from(e);
                WatchEvent {
                    kind: "error".into(),
                    path: None,
                    code: Some(error.code.to_owned()),
                    message: Some(error.message),
                }
            }
        };
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Some((
            Ok::<Bytes, std::convert::Infallible>(Bytes::from(line)),
            Some(watcher),
        ))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}
