//! The native snapshot and fork routes: `POST /v1/sandboxes/{id}/snapshots`,
//! `GET /v1/snapshots`, `GET|DELETE /v1/snapshots/{id}` and
//! `POST /v1/sandboxes/{id}/fork`. What a snapshot is, is
//! `airlock_daemon::snapshots`'s to say.

use crate::auth::Caller;
use crate::error::{optional_body, query, ApiError, ErrorBody};
use crate::types::SandboxView;
use crate::{Api, RequestId};
use airlock_daemon::snapshots::{ForkRequest, SnapshotRequest};
use airlock_store::SnapshotRow;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

type Result<T> = std::result::Result<T, ApiError>;

/// Body of `POST /v1/sandboxes/{id}/snapshots` (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// Unique among your snapshots (1 to 128 of letters, digits and
    /// `._-`); taking one under a name you used replaces it, keeping its
    /// id.
    pub name: Option<String>,
}

/// A snapshot: a sandbox's files frozen into layers, from which sandboxes
/// are created as from a template (`"template": ID or NAME`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SnapshotView {
    /// `snap-` and 16 hex digits.
    pub id: String,
    pub name: Option<String>,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// The template that sandbox was created from.
    pub template: String,
    /// The tier sandboxes created from it run on unless a create names one.
    pub tier: String,
    /// How many layers it stacks (the template's and the sandbox's changes).
    pub layers: usize,
    /// The sandbox's changes: entries and bytes of regular files.
    pub entries: u64,
    pub bytes: u64,
    /// The changes as an uncompressed tar, and as kept (zstd).
    pub tar_bytes: u64,
    pub archive_bytes: u64,
    /// `archive_bytes / tar_bytes` (0 for no changes).
    pub ratio: f64,
    pub archive_digest: Option<String>,
    pub zstd_level: i32,
    /// Milliseconds it took, the sandbox frozen meanwhile.
    pub took_ms: u64,
    /// Whether it holds processes and memory (no tier here captures
    /// them yet: sandboxes created from it start fresh processes).
    pub memory: bool,
    /// RFC 3339.
    pub created_at: String,
}

impl SnapshotView {
    pub fn of(row: &SnapshotRow) -> SnapshotView {
        SnapshotView {
            id: row.id.clone(),
            name: row.name.clone(),
            sandbox_id: row.sandbox_id.clone(),
            template: row.template.clone(),
            tier: row.tier.clone(),
            layers: row.layers.len(),
            entries: row.entries,
            bytes: row.bytes,
            tar_bytes: row.tar_bytes,
            archive_bytes: row.archive_bytes,
            ratio: if row.tar_bytes == 0 {
                0.0
            } else {
                row.archive_bytes as f64 / row.tar_bytes as f64
            },
            archive_digest: row.archive_digest.clone(),
            zstd_level: row.zstd_level,
            took_ms: row.took_ms,
            memory: false,
            created_at: crate::types::rfc3339(row.created_at),
        }
    }
}

/// Takes a snapshot of a sandbox's files (it is frozen meanwhile, and
/// runs on after). A paused sandbox can be snapshotted too.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateSnapshot,
    responses(
        (status = 201, description = "Taken", body = SnapshotView),
        (status = 400, description = "Bad name, or changes that cannot be a layer", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not running, not on a layered template, or the name is a template's", body = ErrorBody),
    ))]
pub async fn create_snapshot(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let key = caller.key()?;
    let request: CreateSnapshot = optional_body(&body, "a snapshot request")?;
    let row = api
        .daemon
        .snapshot(
            key,
            &id,
            SnapshotRequest { name: request.name },
            &request_id.0,
        )
        .await?;
    Ok((StatusCode::CREATED, Json(SnapshotView::of(&row))).into_response())
}

/// Query of `GET /v1/snapshots`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SnapshotParams {
    /// Only snapshots of this sandbox.
    pub sandbox_id: Option<String>,
    /// Only the snapshot with this id or name.
    pub name: Option<String>,
}

/// A list of snapshots, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotList {
    pub items: Vec<SnapshotView>,
}

/// Your snapshots (an admin sees every key's).
#[utoipa::path(get, path = "/v1/snapshots", tag = "snapshots",
    params(SnapshotParams),
    responses(
        (status = 200, description = "The snapshots", body = SnapshotList),
        (status = 400, description = "Bad query", body = ErrorBody),
    ))]
pub async fn list_snapshots(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    params: std::result::Result<Query<SnapshotParams>, QueryRejection>,
) -> Result<Json<SnapshotList>> {
    let key = caller.key()?;
    let params = query(params)?;
    let rows = api
        .daemon
        .snapshots(key, params.sandbox_id.as_deref(), params.name.as_deref())?;
    Ok(Json(SnapshotList {
        items: rows.iter().map(SnapshotView::of).collect(),
    }))
}

fn no_snapshot(id: &str) -> ApiError {
    ApiError::not_found(format!("there is no snapshot {id:?}"))
}

/// One snapshot, by id or name.
#[utoipa::path(get, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id or name")),
    responses(
        (status = 200, description = "The snapshot", body = SnapshotView),
        (status = 404, description = "No such snapshot", body = ErrorBody),
    ))]
pub async fn get_snapshot(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SnapshotView>> {
    let key = caller.key()?;
    let row = api
        .daemon
        .find_snapshot(key, &id)?
        .ok_or_else(|| no_snapshot(&id))?;
    Ok(Json(SnapshotView::of(&row)))
}

/// Deletes a snapshot. Sandboxes created from it keep running; its layers
/// go once nothing uses them.
#[utoipa::path(delete, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id or name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such snapshot", body = ErrorBody),
    ))]
pub async fn delete_snapshot(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    let key = caller.key()?;
    api.daemon.delete_snapshot(key, &id, &request_id.0)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Body of `POST /v1/sandboxes/{id}/fork` (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSandbox {
    /// How many children (1 to 100; default 1).
    pub count: Option<u32>,
    /// Each child's lifetime in seconds (default: the daemon's default).
    pub timeout_s: Option<u64>,
}

/// One child of a fork: its sandbox, or why it did not start.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// The children of a fork, in no particular order.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkList {
    pub items: Vec<ForkResult>,
}

/// Forks a sandbox: its files are frozen once (it is paused meanwhile
/// and runs on after) and `count` new sandboxes start on them, sharing
/// them copy-on-write, each with its own id, hostname and access token.
/// Each child succeeds or fails alone; a non-201 answer means none was
/// attempted.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ForkSandbox,
    responses(
        (status = 201, description = "The children", body = ForkList),
        (status = 400, description = "Bad count or timeout", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not running, or not on a layered template", body = ErrorBody),
    ))]
pub async fn fork_sandbox(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let key = caller.key()?;
    let request: ForkSandbox = optional_body(&body, "a fork request")?;
    let count = request.count.unwrap_or(1);
    let timeout_s = request
        .timeout_s
        .unwrap_or(api.daemon.config().default_timeout.as_secs());
    let children = api
        .daemon
        .fork(
            key,
            &id,
            ForkRequest {
                count,
                timeout_ms: timeout_s.saturating_mul(1000),
            },
            &request_id.0,
        )
        .await?;
    let items = children
        .into_iter()
        .map(|child| match child {
            Ok(created) => ForkResult {
                sandbox: Some(SandboxView::of(&created.row, Some(created.access_token))),
                error: None,
            },
            Err(e) => {
                let e = ApiError::from(e);
                ForkResult {
                    sandbox: None,
                    error: Some(ErrorBody {
                        code: e.code,
                        message: e.message,
                    }),
                }
            }
        })
        .collect();
    Ok((StatusCode::CREATED, Json(ForkList { items })).into_response())
}

/// A file an outputs collection copied.
#[derive(Debug, Serialize, ToSchema)]
pub struct CollectedFileView {
    /// Its path under `/mnt/user-data/outputs`.
    pub path: String,
    pub bytes: u64,
    /// `sha256:` and 64 hex digits.
    pub sha256: String,
}

/// What an outputs collection copied, and where.
#[derive(Debug, Serialize, ToSchema)]
pub struct CollectedView {
    /// The store's URL and the sandbox's prefix in it.
    pub location: String,
    pub files: Vec<CollectedFileView>,
    pub bytes: u64,
    /// Symlinks, special files and files past the bounds, not copied.
    pub left_out: u64,
}

/// Copies the sandbox's `/mnt/user-data/outputs` to the daemon's object
/// store now (each regular file at `<sandbox id>/<path>`, replacing what
/// an earlier collection put there).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/outputs", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "What was copied", body = CollectedView),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not running", body = ErrorBody),
        (status = 502, description = "The object store failed", body = ErrorBody),
    ))]
pub async fn collect_outputs(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
) -> Result<Json<CollectedView>> {
    let key = caller.key()?;
    let collected = api.daemon.collect_outputs(key, &id, &request_id.0).await?;
    Ok(Json(CollectedView {
        location: collected.location,
        files: collected
            .files
            .into_iter()
            .map(|f| CollectedFileView {
                path: f.path,
                bytes: f.bytes,
                sha256: f.sha256,
            })
            .collect(),
        bytes: collected.bytes,
        left_out: collected.left_out,
    }))
}
