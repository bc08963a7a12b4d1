//! The native warm pool routes (admin): `GET /v1/pools`,
//! `GET|PUT|DELETE /v1/pools/{name}`. What a pool is, is
//! `airlock_daemon::pools`'s to say.

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::Api;
use airlock_daemon::pools::{PoolSettings, PoolView};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

type Result<T> = std::result::Result<T, ApiError>;

/// Body of `PUT /v1/pools/{name}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPool {
    /// The template its members run (a create of it is served by the pool).
    pub template: String,
    /// The tier they run on (default: the template's).
    pub tier: Option<String>,
    /// Whether members have an egress path, to serve creates whose network
    /// policy is not `none` (default: false).
    #[serde(default)]
    pub networked: bool,
    /// Members kept ready.
    pub min_ready: u32,
    /// Most members at once, ready and starting (default: `min_ready`, at
    /// least 1); misses raise the number kept ready up to it.
    pub max: Option<u32>,
    /// Most members starting at once (default 2).
    pub refill: Option<u32>,
}

/// A warm pool and how it is doing.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PoolInfo {
    pub name: String,
    pub template: String,
    pub tier: Option<String>,
    pub networked: bool,
    pub min_ready: u32,
    pub max: u32,
    pub refill: u32,
    /// Members ready to be claimed, and being started.
    pub ready: u32,
    pub starting: u32,
    /// How many it keeps ready now (`min_ready`, raised by misses).
    pub target: u32,
    /// Creates it served; creates that found it empty.
    pub claims: u64,
    pub misses: u64,
    /// Members started; members that failed to start.
    pub started: u64,
    pub failed: u64,
    /// Why the last member failed to start, or why it cannot fill.
    pub last_error: Option<String>,
}

impl From<PoolView> for PoolInfo {
    fn from(v: PoolView) -> PoolInfo {
        PoolInfo {
            name: v.name,
            template: v.template,
            tier: v.tier,
            networked: v.networked,
            min_ready: v.min_ready,
            max: v.max,
            refill: v.refill,
            ready: v.ready,
            starting: v.starting,
            target: v.target,
            claims: v.claims,
            misses: v.misses,
            started: v.started,
            failed: v.failed,
            last_error: v.last_error,
        }
    }
}

/// Every pool.
#[derive(Debug, Serialize, ToSchema)]
pub struct PoolList {
    pub items: Vec<PoolInfo>,
}

/// Every warm pool (admin).
#[utoipa::path(get, path = "/v1/pools", tag = "pools",
    responses(
        (status = 200, description = "The pools", body = PoolList),
        (status = 403, description = "Not an admin key", body = ErrorBody),
    ))]
pub async fn list_pools(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<PoolList>> {
    caller.admin()?;
    Ok(Json(PoolList {
        items: api
            .daemon
            .pools()?
            .into_iter()
            .map(PoolInfo::from)
            .collect(),
    }))
}

/// One warm pool (admin).
#[utoipa::path(get, path = "/v1/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 200, description = "The pool", body = PoolInfo),
        (status = 403, description = "Not an admin key", body = ErrorBody),
        (status = 404, description = "No such pool", body = ErrorBody),
    ))]
pub async fn get_pool(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<PoolInfo>> {
    caller.admin()?;
    Ok(Json(api.daemon.pool(&name)?.into()))
}

/// Sets a warm pool (admin), replacing one of that name: the daemon keeps
/// `min_ready` sandboxes of the template started, and a create that fits
/// them is handed one.
#[utoipa::path(put, path = "/v1/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name")),
    request_body = SetPool,
    responses(
        (status = 200, description = "The pool", body = PoolInfo),
        (status = 400, description = "Bad sizes, name, tier or body", body = ErrorBody),
        (status = 403, description = "Not an admin key", body = ErrorBody),
        (status = 404, description = "No such template", body = ErrorBody),
    ))]
pub async fn set_pool(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: std::result::Result<Json<SetPool>, JsonRejection>,
) -> Result<Json<PoolInfo>> {
    caller.admin()?;
    let Json(body) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let tier = body.tier.as_deref().map(str::parse).transpose().map_err(
        |e: airlock_policy::UnknownTier| {
            ApiError::bad_request(format!("tier: {e} (see GET /v1/tiers)"))
        },
    )?;
    let settings = PoolSettings {
        template: body.template,
        tier,
        networked: body.networked,
        min_ready: body.min_ready,
        max: body.max,
        refill: body.refill,
    };
    Ok(Json(api.daemon.set_pool(&name, settings)?.into()))
}

/// Removes a warm pool (admin); its ready members are torn down.
#[utoipa::path(delete, path = "/v1/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 204, description = "Removed"),
        (status = 403, description = "Not an admin key", body = ErrorBody),
        (status = 404, description = "No such pool", body = ErrorBody),
    ))]
pub async fn delete_pool(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<StatusCode> {
    caller.admin()?;
    api.daemon.delete_pool(&name)?;
    Ok(StatusCode::NO_CONTENT)
}
