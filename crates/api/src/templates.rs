//! `/v1/templates` and `/v1/gc`: templates as the native API shows them,
//! importing an image archive, removing a template, collecting layers.
//!
//! Every key may list and read templates (they are the machine's, not a
//! tenant's); importing, removing and collecting need an admin key.

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::types::rfc3339;
use crate::Api;
use airlock_daemon::templates::Collected;
use airlock_layers::ImportProgress;
use airlock_store::TemplateRow;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::convert::Infallible;
use std::io::Write;
use utoipa::{IntoParams, ToSchema};

type Result<T> = std::result::Result<T, ApiError>;

/// A layer of a template.
#[derive(Debug, Serialize, ToSchema)]
pub struct LayerView {
    /// `sha256:` digest of its uncompressed tar.
    pub diff_id: String,
    /// Bytes of its files.
    pub bytes: u64,
}

/// A template.
#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateView {
    pub name: String,
    /// `sha256:` digest of its image configuration: create with
    /// `NAME@DIGEST` to pin it.
    pub digest: String,
    /// What it came from.
    pub source: String,
    /// Bottom first.
    pub layers: Vec<LayerView>,
    /// Bytes of all its layers' files.
    pub bytes: u64,
    /// How its sandboxes start: `env`, `workdir`, `user`, `entrypoint`,
    /// `cmd`.
    #[schema(value_type = Object)]
    pub config: serde_json::Value,
    /// RFC 3339.
    pub created_at: String,
}

/// Templates.
#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateList {
    pub items: Vec<TemplateView>,
}

/// What a collection removed.
#[derive(Debug, Serialize, ToSchema)]
pub struct CollectedView {
    /// Layers nothing referenced.
    pub layers: Vec<String>,
    /// Half-done imports found abandoned.
    pub abandoned: usize,
    /// Entries of the store that no record named.
    pub strays: usize,
}

/// One line of an import's NDJSON answer.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImportEvent {
    /// The archive arrived whole.
    Received { bytes: u64 },
    /// Layer `layer` (from 1) of `of` is being unpacked.
    Unpacking { layer: usize, of: usize, bytes: u64 },
    /// Layer `layer` of `of` was in the store already.
    Cached { layer: usize, of: usize },
    /// The template, recorded.
    Done { template: TemplateView },
    /// The import failed; nothing was recorded.
    Error { code: String, message: String },
}

/// Query of `POST /v1/templates/{name}/import`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ImportParams {
    /// Which image of an archive holding several (a tag it lists).
    pub image: Option<String>,
}

fn view(api: &Api, row: TemplateRow) -> TemplateView {
    let layers: Vec<LayerView> = row
        .layers
        .iter()
        .map(|diff_id| LayerView {
            diff_id: diff_id.clone(),
            bytes: api
                .daemon
                .with_store(|s| s.get_layer(diff_id))
                .ok()
                .flatten()
                .map_or(0, |l| l.bytes),
        })
        .collect();
    TemplateView {
        name: row.name,
        digest: row.digest,
        source: row.source,
        bytes: layers.iter().map(|l| l.bytes).sum(),
        layers,
        config: row.config,
        created_at: rfc3339(row.created_at),
    }
}

/// Lists the templates (`host` is built in and not listed).
#[utoipa::path(get, path = "/v1/templates", tag = "templates",
    responses(
        (status = 200, description = "Templates by name", body = TemplateList),
        (status = 401, description = "No valid API key", body = ErrorBody),
    ))]
pub async fn list_templates(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<TemplateList>> {
    caller.key()?;
    let rows = api.daemon.templates()?;
    Ok(Json(TemplateList {
        items: rows.into_iter().map(|row| view(&api, row)).collect(),
    }))
}

/// One template.
#[utoipa::path(get, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    responses(
        (status = 200, description = "The template", body = TemplateView),
        (status = 404, description = "No such template", body = ErrorBody),
    ))]
pub async fn get_template(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<TemplateView>> {
    caller.key()?;
    let row = api.daemon.template(&name)?;
    Ok(Json(view(&api, row)))
}

/// Removes a template (admin). Sandboxes running on it keep their layers;
/// the collector removes them once nothing references them.
#[utoipa::path(delete, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    responses(
        (status = 204, description = "Removed"),
        (status = 403, description = "Not an admin key", body = ErrorBody),
        (status = 404, description = "No such template", body = ErrorBody),
    ))]
pub async fn delete_template(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<StatusCode> {
    caller.admin()?;
    api.daemon.delete_template(&name)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Imports an image archive (`docker save` output or an OCI image layout
/// as a tar) as template `name` (admin), replacing one of that name. The
/// answer is NDJSON: `received`, then `unpacking`/`cached` per layer, then
/// `done` with the template or `error`.
#[utoipa::path(post, path = "/v1/templates/{name}/import", tag = "templates",
    params(("name" = String, Path, description = "Template name"), ImportParams),
    request_body(content = String, content_type = "application/octet-stream", description = "The archive: a tar (docker save output, or an OCI image layout)"),
    responses(
        (status = 200, description = "NDJSON progress, then the template or an error", content_type = "application/x-ndjson", body = ImportEvent),
        (status = 400, description = "Bad name", body = ErrorBody),
        (status = 403, description = "Not an admin key", body = ErrorBody),
        (status = 413, description = "Over the image size limit", body = ErrorBody),
    ))]
pub async fn import_template(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    params: std::result::Result<Query<ImportParams>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    caller.admin()?;
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if !airlock_daemon::templates::is_template_name(&name) || name == "host" {
        return Err(ApiError::bad_request(format!(
            "{name:?} cannot name a template: use 1 to 128 letters, digits and ._-: (not `host`)"
        )));
    }
    let limit = api.daemon.config().max_image_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the archive is larger than the limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    // The upload lands in the store's staging area: a crash leaves it for
    // the collector, a failure removes it.
    let staging = api.daemon.layer_store()?.stage().map_err(|e| {
        airlock_daemon::DaemonError::Internal(format!("cannot stage an upload: {e}"))
    })?;
    let archive_path = staging.path().join("archive.tar");
    let mut file = std::fs::File::create(&archive_path).map_err(|e| {
        airlock_daemon::DaemonError::Internal(format!("cannot stage an upload: {e}"))
    })?;
    let mut received = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| ApiError::bad_request("the upload was cut off"))?;
        received += chunk.len() as u64;
        if received > limit {
            return Err(too_large());
        }
        // Small writes to a local file: not worth a blocking thread each.
        file.write_all(&chunk).map_err(|e| {
            airlock_daemon::DaemonError::Internal(format!("cannot stage an upload: {e}"))
        })?;
    }
    drop(file);

    let (events, receiver) = tokio::sync::mpsc::channel::<ImportEvent>(64);
    let _ = events.try_send(ImportEvent::Received { bytes: received });
    let daemon = api.daemon.clone();
    tokio::task::spawn_blocking(move || {
        let progress_events = events.clone();
        let mut progress = |p: ImportProgress| {
            let event = match p {
                ImportProgress::Unpacking {
                    position,
                    of,
                    bytes,
                } => ImportEvent::Unpacking {
                    layer: position + 1,
                    of,
                    bytes,
                },
                ImportProgress::Cached { position, of } => ImportEvent::Cached {
                    layer: position + 1,
                    of,
                },
            };
            let _ = progress_events.blocking_send(event);
        };
        let imported =
            daemon.import_template(&name, &archive_path, params.image.as_deref(), &mut progress);
        drop(staging);
        let last = match imported {
            Ok(row) => ImportEvent::Done {
                template: view(&Api { daemon }, row),
            },
            Err(e) => {
                let error = ApiError::from(e);
                ImportEvent::Error {
                    code: error.code.to_owned(),
                    message: error.message,
                }
            }
        };
        let _ = events.blocking_send(last);
    });
    let lines = tokio_stream::wrappers::ReceiverStream::new(receiver).map(|event| {
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Ok::<Bytes, Infallible>(Bytes::from(line))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(lines),
    )
        .into_response())
}

/// Removes every layer that no template and no live sandbox references,
/// and whatever the layer store holds that no record names (admin).
#[utoipa::path(post, path = "/v1/gc", tag = "templates",
    responses(
        (status = 200, description = "What was removed", body = CollectedView),
        (status = 403, description = "Not an admin key", body = ErrorBody),
    ))]
pub async fn collect_garbage(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<CollectedView>> {
    caller.admin()?;
    let daemon = api.daemon.clone();
    let Collected {
        layers,
        abandoned,
        strays,
    } = tokio::task::spawn_blocking(move || daemon.collect_garbage())
        .await
        .map_err(|e| {
            airlock_daemon::DaemonError::Internal(format!("the collector failed: {e}"))
        })??;
    Ok(Json(CollectedView {
        layers,
        abandoned,
        strays,
    }))
}
