//! e2b's snapshots and forks, on the daemon's (`airlock_daemon::snapshots`):
//!
//! | route | answer |
//! |---|---|
//! | `POST /sandboxes/{id}/snapshots` `{name?, memory?}` | 201 `SnapshotInfo` |
//! | `GET /snapshots?sandboxID&name&limit&nextToken` | 200 `[SnapshotInfo]`, `x-next-token` when more |
//! | `DELETE /templates/{id}` naming a snapshot | 204 (see `templates::delete`) |
//! | `POST /sandboxes/{id}/fork` `{timeout?, count?}` | 201 `[{sandbox} \| {error}]` |
//!
//! `Sandbox.create(snapshot_id)` sends the snapshot's id as the template:
//! the daemon resolves a caller's snapshot where no template has the name.
//! A snapshot's `snapshotID` is its name when it has one, else its id,
//! with e2b's `:default` tag (accepted back with or without it). No tier
//! here captures memory, so `memory: true` (the SDKs' default, "full")
//! takes the files only: sandboxes from it start fresh processes. Forks
//! default to e2b's 15 s lifetime.

use super::{body_of, key_of, live_row, query_of, wants_interpreter, E2bError, Result};
use crate::auth::Caller;
use crate::{Api, RequestId};
use airlock_daemon::snapshots::{ForkRequest, SnapshotRequest};
use airlock_store::SnapshotRow;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

/// e2b's `SandboxSnapshotRequest` (its `memory` is accepted either way
/// and not read: see the module doc).
#[derive(Debug, Default, Deserialize)]
struct SnapshotBody {
    name: Option<String>,
}

/// e2b's `SnapshotInfo`.
#[derive(Debug, Serialize)]
struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

impl SnapshotInfo {
    fn of(row: &SnapshotRow) -> SnapshotInfo {
        SnapshotInfo {
            snapshot_id: format!("{}:default", row.name.as_deref().unwrap_or(&row.id)),
            names: row
                .name
                .iter()
                .map(|name| format!("{name}:default"))
                .collect(),
        }
    }
}

pub(super) async fn create(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let key = key_of(&caller)?;
    let body: SnapshotBody = body_of(&body)?;
    live_row(&api, key, &id)?;
    let row = api
        .daemon
        .snapshot(key, &id, SnapshotRequest { name: body.name }, &request_id.0)
        .await?;
    Ok((StatusCode::CREATED, Json(SnapshotInfo::of(&row))).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListParams {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<u32>,
    next_token: Option<String>,
}

pub(super) async fn list(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    params: std::result::Result<Query<ListParams>, QueryRejection>,
) -> Result<Response> {
    let key = key_of(&caller)?;
    let params = query_of(params)?;
    let limit = match params.limit {
        None => 100,
        Some(n @ 1..=100) => n as usize,
        Some(_) => return Err(E2bError::bad_request("limit: must be between 1 and 100")),
    };
    let rows = api
        .daemon
        .snapshots(key, params.sandbox_id.as_deref(), params.name.as_deref())?;
    // Oldest first; a page starts after the id its token names.
    let start = match &params.next_token {
        None => 0,
        Some(token) => rows
            .iter()
            .position(|r| &r.id == token)
            .map(|i| i + 1)
            .ok_or_else(|| E2bError::bad_request("nextToken: not a token of this listing"))?,
    };
    let page: Vec<&SnapshotRow> = rows.iter().skip(start).take(limit).collect();
    let more = start + page.len() < rows.len();
    let next = page.last().filter(|_| more).map(|r| r.id.clone());
    let items: Vec<SnapshotInfo> = page.into_iter().map(SnapshotInfo::of).collect();
    let mut response = Json(items).into_response();
    if let Some(token) = next.and_then(|t| HeaderValue::from_str(&t).ok()) {
        response.headers_mut().insert("x-next-token", token);
    }
    Ok(response)
}

/// e2b's `SandboxForkRequest`.
#[derive(Debug, Default, Deserialize)]
struct ForkBody {
    timeout: Option<u64>,
    count: Option<u32>,
}

/// e2b's `SandboxForkResult`.
#[derive(Debug, Serialize)]
struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<super::SandboxWire>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorInfo>,
}

#[derive(Debug, Serialize)]
struct ErrorInfo {
    code: u16,
    message: String,
}

/// e2b forks live 15 s unless told (`SandboxForkRequest.timeout`).
const FORK_TIMEOUT_S: u64 = 15;

pub(super) async fn fork(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let key = key_of(&caller)?;
    let body: ForkBody = body_of(&body)?;
    let row = live_row(&api, key, &id)?;
    let count = body.count.unwrap_or(1);
    let max = api.daemon.config().max_timeout.as_secs();
    let timeout_s = match body.timeout.unwrap_or(FORK_TIMEOUT_S) {
        0 => FORK_TIMEOUT_S,
        t => t.min(max),
    };
    let children = api
        .daemon
        .fork(
            key,
            &id,
            ForkRequest {
                count,
                timeout_ms: timeout_s * 1000,
            },
            &request_id.0,
        )
        .await?;
    let interpreter = wants_interpreter(&row.template);
    let results: Vec<ForkResult> = children
        .into_iter()
        .map(|child| match child {
            Ok(created) => {
                if interpreter {
                    let daemon = api.daemon.clone();
                    let id = created.row.id.clone();
                    tokio::spawn(async move {
                        daemon
                            .prepare_code_context(
                                &id,
                                airlock_daemon::interpreter::Language::Python,
                            )
                            .await;
                    });
                }
                ForkResult {
                    sandbox: Some(
                        super::SandboxWire::of(
                            &created.row,
                            Some(created.access_token),
                            Some(api.daemon.traffic_token(&created.row.id)),
                        )
                        .on_domain(api.daemon.config().sandbox_domain.as_deref()),
                    ),
                    error: None,
                }
            }
            Err(e) => {
                let e = E2bError::from(e);
                ForkResult {
                    sandbox: None,
                    error: Some(ErrorInfo {
                        code: e.status.as_u16(),
                        message: e.message,
                    }),
                }
            }
        })
        .collect();
    Ok((StatusCode::CREATED, Json(results)).into_response())
}
