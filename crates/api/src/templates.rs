//! `/v1/templates` and `/v1/gc`: templates as the native API shows them,
//! importing an image archive, pulling an image from a registry, removing
//! a template, collecting layers.
//!
//! Every key may list and read templates (they are the machine's, not a
//! tenant's); importing, removing and collecting need an admin key.

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::types::rfc3339;
use crate::Api;
use airlock_daemon::builds::{BuildEvent, BuildRequest};
use airlock_daemon::templates::Collected;
use airlock_layers::bootstrap::BootstrapProgress;
use airlock_layers::ImportProgress;
use airlock_registry::PullProgress;
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
    /// The tier its sandboxes run on when a create names none; absent
    /// when it has none of its own (the daemon's `--template-tier` or
    /// `--default-tier` then applies).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}

/// Body of `PATCH /v1/templates/{name}`: the settings to change; a field
/// left out stays as it is.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplatePatch {
    /// The tier its sandboxes run on when a create names none (`process`,
    /// `oci`, `gvisor`), or `null` to fall back to the daemon's default.
    /// It need not be available on this host: a create then answers 400
    /// with the tier's reason.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, nullable)]
    pub tier: Option<Option<String>>,
}

/// A field that is present, `null` included (`Some(None)`), as against
/// absent (`None`, by `default`).
fn present<'de, D, T>(deserializer: D) -> std::result::Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
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
    /// Build cache entries evicted.
    pub build_steps: usize,
    /// Snapshot archives no snapshot recorded.
    pub archives: usize,
    /// Collected outputs past their TTL (`serve --outputs-ttl`).
    pub outputs: usize,
}

/// Query of `POST /v1/gc`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct GcParams {
    /// Evict the whole build cache first (by default only entries unused
    /// for longer than the daemon's `--build-cache-ttl`), so the layers
    /// only it held go too.
    #[serde(default)]
    pub build_cache: bool,
}

/// One line of an import's or a pull's NDJSON answer.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TemplateEvent {
    /// The archive arrived whole (import).
    Received { bytes: u64 },
    /// The image's manifest is read: `layers` layers, of which those not
    /// in the store already (each reported `cached` before this) are
    /// `bytes` compressed bytes to fetch (pull).
    Resolved {
        manifest_digest: String,
        layers: usize,
        bytes: u64,
    },
    /// Layer `layer` (from 1) of `of` has arrived up to `bytes` of `total`
    /// (pull).
    Downloading {
        layer: usize,
        of: usize,
        bytes: u64,
        total: u64,
    },
    /// Layer `layer` of `of` is whole, checked and in the store (pull).
    Unpacked { layer: usize, of: usize },
    /// What a bootstrap is doing (mmdebstrap's own words).
    Step { message: String },
    /// Bytes of a bootstrapped system unpacked so far.
    Written { bytes: u64 },
    /// Layer `layer` (from 1) of `of` is being unpacked.
    Unpacking { layer: usize, of: usize, bytes: u64 },
    /// Layer `layer` of `of` was in the store already.
    Cached { layer: usize, of: usize },
    /// The template, recorded.
    Done { template: TemplateView },
    /// The import failed; nothing was recorded.
    Error { code: String, message: String },
}

/// Body of `POST /v1/templates/{name}/pull`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// `HOST[:PORT]/REPOSITORY[:TAG][@sha256:DIGEST]`, in a registry the
    /// daemon is configured to pull from.
    pub image: String,
    /// The tier its sandboxes run on when a create names none (`process`,
    /// `oci`, `gvisor`), recorded with it [default: the one a template of
    /// that name had, else none].
    pub tier: Option<String>,
}

/// Body of `POST /v1/templates/{name}/bootstrap`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BootstrapRequest {
    /// Debian packages beyond the essential ones; the `base` template's
    /// (bash, coreutils, python3 with pip and venv, git, curl,
    /// ca-certificates, procps, sudo, nodejs, npm) when absent.
    pub packages: Option<Vec<String>>,
    /// The tier its sandboxes run on when a create names none (`process`,
    /// `oci`, `gvisor`), recorded with it [default: the one a template of
    /// that name had, else none].
    pub tier: Option<String>,
}

/// Query of `POST /v1/templates/{name}/import`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ImportParams {
    /// Which image of an archive holding several (a tag it lists).
    pub image: Option<String>,
    /// The tier its sandboxes run on when a create names none (`process`,
    /// `oci`, `gvisor`), recorded with it [default: the one a template of
    /// that name had, else none].
    pub tier: Option<String>,
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
    let tier = airlock_daemon::templates::recorded_tier(&row).map(|t| t.as_str().to_owned());
    TemplateView {
        name: row.name,
        digest: row.digest,
        source: row.source,
        bytes: layers.iter().map(|l| l.bytes).sum(),
        layers,
        config: row.config,
        created_at: rfc3339(row.created_at),
        tier,
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

/// Changes a template's settings (admin): today its tier.
#[utoipa::path(patch, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    request_body = TemplatePatch,
    responses(
        (status = 200, description = "The template, changed", body = TemplateView),
        (status = 400, description = "Not a tier, or a malformed body", body = ErrorBody),
        (status = 403, description = "Not an admin key", body = ErrorBody),
        (status = 404, description = "No such template", body = ErrorBody),
    ))]
pub async fn patch_template(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: std::result::Result<Json<TemplatePatch>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<TemplateView>> {
    caller.admin()?;
    let Json(patch) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if let Some(tier) = patch.tier {
        api.daemon
            .set_template_tier(&name, tier_param(tier.as_deref())?)?;
    }
    let row = api.daemon.template(&name)?;
    Ok(Json(view(&api, row)))
}

/// The template's software bill of materials: a CycloneDX 1.5 JSON
/// document of the dpkg, apk, Python and npm packages its layers hold
/// (derived from the layers; the same template gives the same bytes).
#[utoipa::path(get, path = "/v1/templates/{name}/sbom", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    responses(
        (status = 200, description = "The CycloneDX document", content_type = "application/vnd.cyclonedx+json", body = Object),
        (status = 404, description = "No such template", body = ErrorBody),
    ))]
pub async fn template_sbom(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response> {
    caller.key()?;
    let daemon = api.daemon.clone();
    let document = tokio::task::spawn_blocking(move || daemon.template_sbom(&name))
        .await
        .map_err(|e| {
            airlock_daemon::DaemonError::Internal(format!("the SBOM task failed: {e}"))
        })??;
    Ok((
        [(header::CONTENT_TYPE, "application/vnd.cyclonedx+json")],
        document,
    )
        .into_response())
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
        (status = 200, description = "NDJSON progress, then the template or an error", content_type = "application/x-ndjson", body = TemplateEvent),
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
    let tier = tier_param(params.tier.as_deref())?;
    if !airlock_daemon::templates::is_template_name(&name) || name == "host" {
        return Err(ApiError::bad_request(format!(
            "{name:?} cannot name a template: use 1 to 128 letters, digits and ._-: (not `host`)"
        )));
    }
    let (staging, archive_path, received) = receive_upload(
        &api,
        &headers,
        body,
        api.daemon.config().max_image_bytes,
        "the archive",
    )
    .await?;

    let (events, receiver) = tokio::sync::mpsc::channel::<TemplateEvent>(64);
    let _ = events.try_send(TemplateEvent::Received { bytes: received });
    let daemon = api.daemon.clone();
    tokio::task::spawn_blocking(move || {
        let progress_events = events.clone();
        let mut progress = |p: ImportProgress| {
            let event = match p {
                ImportProgress::Unpacking {
                    position,
                    of,
                    bytes,
                } => TemplateEvent::Unpacking {
                    layer: position + 1,
                    of,
                    bytes,
                },
                ImportProgress::Cached { position, of } => TemplateEvent::Cached {
                    layer: position + 1,
                    of,
                },
            };
            let _ = progress_events.blocking_send(event);
        };
        let imported =
            daemon.import_template(&name, &archive_path, params.image.as_deref(), &mut progress);
        drop(staging);
        let _ = events.blocking_send(outcome(Api::new(daemon), imported, tier));
    });
    Ok(ndjson(receiver))
}

/// Receives an upload into a file of the layer store's staging area (a
/// crash leaves it for the collector; dropping the staging removes it):
/// the staging, the file and its length. Over `limit` bytes is 413.
async fn receive_upload(
    api: &Api,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
    what: &str,
) -> Result<(airlock_layers::store::Staging, std::path::PathBuf, u64)> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("{what} is larger than the limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let staging = api.daemon.layer_store()?.stage().map_err(|e| {
        airlock_daemon::DaemonError::Internal(format!("cannot stage an upload: {e}"))
    })?;
    let path = staging.path().join("upload");
    let mut file = std::fs::File::create(&path).map_err(|e| {
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
    Ok((staging, path, received))
}

/// One line of a build's NDJSON answer.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BuildLine {
    /// The base is ready: its name or image reference, and its digest.
    Base { base: String, digest: String },
    /// Step `index` (from 1) of `total` starts; `cached`: its layer comes
    /// from the build cache and nothing runs.
    Step {
        index: usize,
        total: usize,
        instruction: String,
        cached: bool,
    },
    /// Output of step `index`'s command (`stream`: `stdout` or `stderr`).
    Output {
        index: usize,
        stream: String,
        text: String,
    },
    /// Step `index` made a layer in `ms` milliseconds.
    Layer {
        index: usize,
        diff_id: String,
        bytes: u64,
        ms: u64,
    },
    /// Something the Dockerfile says that changes nothing (sent first).
    Warning { message: String },
    /// The template, recorded.
    Done { template: TemplateView },
    /// The build failed (the message names the step); no template was
    /// recorded.
    Error { code: String, message: String },
}

impl From<BuildEvent> for BuildLine {
    fn from(event: BuildEvent) -> BuildLine {
        match event {
            BuildEvent::Base { base, digest } => BuildLine::Base { base, digest },
            BuildEvent::Step {
                index,
                total,
                instruction,
                cached,
            } => BuildLine::Step {
                index,
                total,
                instruction,
                cached,
            },
            BuildEvent::Output {
                index,
                stream,
                text,
            } => BuildLine::Output {
                index,
                stream: stream.to_owned(),
                text,
            },
            BuildEvent::Layer {
                index,
                diff_id,
                bytes,
                ms,
            } => BuildLine::Layer {
                index,
                diff_id,
                bytes,
                ms,
            },
        }
    }
}

/// Query of `POST /v1/templates/{name}/build`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct BuildParams {
    /// The Dockerfile's path in the context (`Dockerfile` when absent).
    /// `.airlock-dockerfile` (what the CLI sends for a Dockerfile outside
    /// the context) is removed from the context once read.
    pub dockerfile: Option<String>,
    /// `ARG` values: a JSON object of strings.
    pub build_args: Option<String>,
    /// Run every step, even those the build cache holds.
    #[serde(default)]
    pub no_cache: bool,
    /// The tier its sandboxes run on when a create names none (`process`,
    /// `oci`, `gvisor`), recorded with it [default: the one a template of
    /// that name had, else none].
    pub tier: Option<String>,
}

/// The Dockerfile name the CLI gives a Dockerfile from outside the context.
pub const SENT_DOCKERFILE: &str = ".airlock-dockerfile";
/// The largest Dockerfile read.
const MAX_DOCKERFILE_BYTES: u64 = 1 << 20;

/// Builds template `name` from a Dockerfile (admin), replacing one of
/// that name once the build succeeds. The body is the build context as a
/// tar (plain, gzip or zstd) holding the Dockerfile. Each RUN runs in a
/// sandbox of the build under the operator's build network policy; each
/// RUN and COPY makes a layer, cached by its inputs. The answer is NDJSON:
/// `base`, then per step `step` (with `cached`), `output` lines and
/// `layer`, then `done` with the template or `error` naming the step. A
/// Dockerfile that cannot be built is refused (400) before anything runs,
/// naming its line.
#[utoipa::path(post, path = "/v1/templates/{name}/build", tag = "templates",
    params(("name" = String, Path, description = "Template name"), BuildParams),
    request_body(content = String, content_type = "application/octet-stream", description = "The build context: a tar (plain, gzip or zstd) holding the Dockerfile"),
    responses(
        (status = 200, description = "NDJSON progress, then the template or an error", content_type = "application/x-ndjson", body = BuildLine),
        (status = 400, description = "Bad name, context or Dockerfile", body = ErrorBody),
        (status = 403, description = "Not an admin key", body = ErrorBody),
        (status = 409, description = "The template is being built already", body = ErrorBody),
        (status = 413, description = "Over the upload size limit", body = ErrorBody),
    ))]
pub async fn build_template(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    params: std::result::Result<Query<BuildParams>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    let owner = caller.admin()?.clone();
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let tier = tier_param(params.tier.as_deref())?;
    airlock_daemon::templates::check_new_template_name(&name)?;
    let build_args: std::collections::BTreeMap<String, String> = match &params.build_args {
        None => Default::default(),
        Some(json) => serde_json::from_str(json).map_err(|e| {
            ApiError::bad_request(format!("build_args must be a JSON object of strings: {e}"))
        })?,
    };
    let dockerfile = params
        .dockerfile
        .clone()
        .unwrap_or_else(|| "Dockerfile".to_owned());
    if airlock_build::spec::source_problem(&dockerfile).is_some() || dockerfile.contains('*') {
        return Err(ApiError::bad_request(format!(
            "dockerfile: {dockerfile:?} is not a path inside the context"
        )));
    }
    let (upload, archive, _) = receive_upload(
        &api,
        &headers,
        body,
        api.daemon.config().max_upload_bytes,
        "the build context",
    )
    .await?;
    let context = api.daemon.stage_build_context()?;
    let daemon = api.daemon.clone();
    let shown = dockerfile.clone();
    let (context, text) = tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&archive).map_err(|e| {
            airlock_daemon::DaemonError::Internal(format!("cannot read an upload: {e}"))
        })?;
        daemon.unpack_build_context(&context, file, airlock_build::context::DEFAULT_MAX_BYTES)?;
        drop(upload);
        let text = read_dockerfile(context.path(), &dockerfile)?;
        if dockerfile == SENT_DOCKERFILE {
            let _ = std::fs::remove_file(context.path().join(SENT_DOCKERFILE));
        }
        Ok::<_, airlock_daemon::DaemonError>((context, text))
    })
    .await
    .map_err(|e| {
        airlock_daemon::DaemonError::Internal(format!("the context's unpacking was lost: {e}"))
    })??;
    let parsed = airlock_build::dockerfile::parse(&text, &build_args)
        .map_err(|e| ApiError::bad_request(format!("{shown}: {e}")))?;
    let request = BuildRequest {
        name,
        spec: parsed.spec.clone(),
        context: Some(context.path().to_owned()),
        step_contexts: Default::default(),
        no_cache: params.no_cache,
        dockerfile: Some(airlock_daemon::builds::DockerfileSource {
            name: shown.clone(),
            text,
            args: build_args,
        }),
        start_cmd: None,
        ready_cmd: None,
        source: "dockerfile".to_owned(),
    };
    let (lines, receiver) = tokio::sync::mpsc::channel::<BuildLine>(256);
    for warning in &parsed.warnings {
        let _ = lines.try_send(BuildLine::Warning {
            message: format!("{shown}: {warning}"),
        });
    }
    let progress = lines.clone();
    let events: airlock_daemon::builds::BuildEvents = std::sync::Arc::new(move |event| {
        // A slow reader loses output and progress, never the result.
        let _ = progress.try_send(BuildLine::from(event));
    });
    let daemon = api.daemon.clone();
    // The build goes on if the client goes away; its step sandboxes are
    // removed either way.
    tokio::spawn(async move {
        let built = daemon.build_template(&owner, request, events).await;
        drop(context);
        let line = match outcome(Api::new(daemon), built, tier) {
            TemplateEvent::Done { template } => BuildLine::Done { template },
            TemplateEvent::Error { code, message } => BuildLine::Error { code, message },
            _ => return,
        };
        let _ = lines.send(line).await;
    });
    Ok(ndjson(receiver))
}

/// The Dockerfile `name` of the context `dir`, at most 1 MiB of UTF-8,
/// resolved beneath `dir` through no symlink (the context is the
/// client's).
fn read_dockerfile(
    dir: &std::path::Path,
    name: &str,
) -> std::result::Result<String, airlock_daemon::DaemonError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    use std::io::Read;
    let bad = |why: &str| airlock_daemon::DaemonError::BadInput(format!("{name}: {why}"));
    let root = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        airlock_daemon::DaemonError::Internal(format!("cannot open the build context: {e}"))
    })?;
    let fd = rustix::fs::openat2(
        &root,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|_| bad("there is no such file in the build context (symlinks are not followed)"))?;
    let file = std::fs::File::from(fd);
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err(bad("not a regular file"));
    }
    let mut text = String::new();
    file.take(MAX_DOCKERFILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|_| bad("not UTF-8 text"))?;
    if text.len() as u64 > MAX_DOCKERFILE_BYTES {
        return Err(bad("larger than 1 MiB"));
    }
    Ok(text)
}

/// The events from `receiver`, one JSON document a line.
fn ndjson<T: Serialize + Send + 'static>(receiver: tokio::sync::mpsc::Receiver<T>) -> Response {
    let lines = tokio_stream::wrappers::ReceiverStream::new(receiver).map(|event| {
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Ok::<Bytes, Infallible>(Bytes::from(line))
    });
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(lines),
    )
        .into_response()
}

/// The last event of an import or a pull.
/// A request's `tier`, or what is wrong with it (400).
fn tier_param(tier: Option<&str>) -> Result<Option<airlock_policy::Tier>> {
    tier.map(str::parse)
        .transpose()
        .map_err(|e: airlock_policy::UnknownTier| {
            ApiError::bad_request(format!("tier: {e} (see GET /v1/tiers)"))
        })
}

/// The last event of an import, pull, bootstrap or build: the template,
/// with `tier` recorded when one was asked for, or the error.
fn outcome(
    api: Api,
    result: std::result::Result<TemplateRow, airlock_daemon::DaemonError>,
    tier: Option<airlock_policy::Tier>,
) -> TemplateEvent {
    let result = result.and_then(|mut row| {
        if let Some(tier) = tier {
            api.daemon.set_template_tier(&row.name, Some(tier))?;
            row.tier = Some(tier.as_str().to_owned());
        }
        Ok(row)
    });
    match result {
        Ok(row) => TemplateEvent::Done {
            template: view(&api, row),
        },
        Err(e) => {
            let error = ApiError::from(e);
            TemplateEvent::Error {
                code: error.code.to_owned(),
                message: error.message,
            }
        }
    }
}

/// Builds a Debian system from the host's apt sources (mmdebstrap, in
/// user namespaces of its own) as template `name` (admin), replacing one
/// of that name: what the `base` template is. Minutes; the answer is
/// NDJSON: `step` (what is being done) and `written` (bytes unpacked)
/// events, then `done` with the template or `error`. One build of a name
/// at a time (`conflict` otherwise).
#[utoipa::path(post, path = "/v1/templates/{name}/bootstrap", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    request_body = BootstrapRequest,
    responses(
        (status = 200, description = "NDJSON progress, then the template or an error", content_type = "application/x-ndjson", body = TemplateEvent),
        (status = 400, description = "Bad name or package", body = ErrorBody),
        (status = 403, description = "Not an admin key", body = ErrorBody),
    ))]
pub async fn bootstrap_template(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response> {
    caller.admin()?;
    let request: BootstrapRequest = crate::error::optional_body(&body, "a bootstrap request")?;
    airlock_daemon::templates::check_new_template_name(&name)?;
    let tier = tier_param(request.tier.as_deref())?;
    // Refused before the answer starts streaming.
    airlock_layers::bootstrap::check_packages(request.packages.as_deref().unwrap_or_default())
        .map_err(|e| ApiError::bad_request(format!("packages: {e}")))?;
    let (events, receiver) = tokio::sync::mpsc::channel::<TemplateEvent>(64);
    let daemon = api.daemon.clone();
    tokio::task::spawn_blocking(move || {
        let progress_events = events.clone();
        let mut progress = |p: BootstrapProgress| {
            let event = match p {
                BootstrapProgress::Step(message) => TemplateEvent::Step { message },
                BootstrapProgress::Unpacking { bytes } => TemplateEvent::Written { bytes },
            };
            let _ = progress_events.try_send(event);
        };
        let built = daemon.bootstrap_template(&name, request.packages, &mut progress);
        let _ = events.blocking_send(outcome(Api::new(daemon), built, tier));
    });
    Ok(ndjson(receiver))
}

/// Pulls an image from a registry the daemon is configured to pull from
/// as template `name` (admin), replacing one of that name. The answer is
/// NDJSON: `resolved`, then `cached` or `downloading`.../`unpacked` per
/// layer, then `done` with the template or `error` (a refused registry is
/// `forbidden`, an unknown image `not_found`, a registry that fails
/// `upstream_failed`).
#[utoipa::path(post, path = "/v1/templates/{name}/pull", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    request_body = PullRequest,
    responses(
        (status = 200, description = "NDJSON progress, then the template or an error", content_type = "application/x-ndjson", body = TemplateEvent),
        (status = 400, description = "Bad name or image reference", body = ErrorBody),
        (status = 403, description = "Not an admin key, or a registry this daemon does not pull from", body = ErrorBody),
    ))]
pub async fn pull_template(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: std::result::Result<Json<PullRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response> {
    caller.admin()?;
    let Json(request) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    // A bad reference or a refused registry is refused before the answer
    // starts streaming.
    api.daemon.check_pull(&name, &request.image)?;
    let tier = tier_param(request.tier.as_deref())?;
    let (events, receiver) = tokio::sync::mpsc::channel::<TemplateEvent>(64);
    let progress_events = events.clone();
    let progress = std::sync::Arc::new(move |p: PullProgress| {
        let event = match p {
            PullProgress::Resolved {
                manifest_digest,
                layers,
                bytes,
            } => TemplateEvent::Resolved {
                manifest_digest,
                layers,
                bytes,
            },
            PullProgress::Cached { position, of } => TemplateEvent::Cached {
                layer: position + 1,
                of,
            },
            PullProgress::Downloading {
                position,
                of,
                bytes,
                total,
            } => TemplateEvent::Downloading {
                layer: position + 1,
                of,
                bytes,
                total,
            },
            PullProgress::Unpacked { position, of } => TemplateEvent::Unpacked {
                layer: position + 1,
                of,
            },
        };
        // A full channel (a slow reader) drops progress, never the result.
        let _ = progress_events.try_send(event);
    });
    let daemon = api.daemon.clone();
    // The pull goes on if the client goes away: what it brought in is
    // recorded (or, on failure, removed) either way.
    tokio::spawn(async move {
        let pulled = daemon.pull_template(&name, &request.image, progress).await;
        let _ = events.send(outcome(Api::new(daemon), pulled, tier)).await;
    });
    Ok(ndjson(receiver))
}

/// Removes every layer that no template, no live sandbox and no build
/// cache entry references, and whatever the layer store holds that no
/// record names (admin), after evicting stale build cache entries (all
/// with `build_cache=true`).
#[utoipa::path(post, path = "/v1/gc", tag = "templates",
    params(GcParams),
    responses(
        (status = 200, description = "What was removed", body = CollectedView),
        (status = 403, description = "Not an admin key", body = ErrorBody),
    ))]
pub async fn collect_garbage(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    params: std::result::Result<Query<GcParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<CollectedView>> {
    caller.admin()?;
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let daemon = api.daemon.clone();
    let Collected {
        layers,
        abandoned,
        strays,
        build_steps,
        archives,
    } = tokio::task::spawn_blocking(move || daemon.collect_garbage_with(params.build_cache))
        .await
        .map_err(|e| {
            airlock_daemon::DaemonError::Internal(format!("the collector failed: {e}"))
        })??;
    let outputs = api.daemon.sweep_outputs().await?;
    Ok(Json(CollectedView {
        layers,
        abandoned,
        strays,
        build_steps,
        archives,
        outputs,
    }))
}
