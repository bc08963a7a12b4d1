//! The native volume routes: `POST|GET /v1/volumes`,
//! `GET|DELETE /v1/volumes/{volume}`, and a volume's files without a
//! sandbox: `GET|POST /v1/volumes/{volume}/dir`,
//! `GET|PUT /v1/volumes/{volume}/file`,
//! `GET|PATCH|DELETE /v1/volumes/{volume}/path`, each taking `?path=`.
//! What a volume is, and how its files are reached safely from the host,
//! is `airlock_daemon::volumes`'s and `airlock_daemon::volume_files`'s to
//! say. The e2b dialect's `/volumes` and `/volumecontent` routes answer
//! with the same entries ([`content`]).

use crate::auth::Caller;
use crate::error::{query, ApiError, ErrorBody};
use crate::{Api, RequestId};
use airlock_daemon::volume_files::{EntryKind, Metadata, Placement, VolumeEntry};
use airlock_store::VolumeRow;
use axum::body::Body;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

type Result<T> = std::result::Result<T, ApiError>;

/// Body of `POST /v1/volumes`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// Unique among the key's volumes: 1 to 128 letters, digits, `_`, `-`.
    pub name: String,
    /// Most it may hold: bytes, or a size such as `10G` (default: the
    /// daemon's, 1 GiB unless `serve --volume-size` says otherwise).
    #[schema(value_type = Option<Object>)]
    pub quota: Option<crate::types::Size>,
}

/// A volume.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VolumeInfo {
    /// `vol-…`.
    pub id: String,
    pub name: String,
    /// Most bytes it may hold.
    pub quota_bytes: u64,
    /// RFC 3339.
    pub created_at: String,
    /// A sandbox that is not dead and mounts it (it cannot be deleted
    /// until that one is).
    pub mounted_by: Option<String>,
}

impl VolumeInfo {
    fn of(api: &Api, row: VolumeRow) -> VolumeInfo {
        let mounted_by = api.daemon.volume_user(&row.id).ok().flatten();
        VolumeInfo {
            id: row.id,
            name: row.name,
            quota_bytes: row.quota_bytes,
            created_at: crate::types::rfc3339(row.created_at),
            mounted_by,
        }
    }
}

/// The volumes of a key.
#[derive(Debug, Serialize, ToSchema)]
pub struct VolumeList {
    pub items: Vec<VolumeInfo>,
}

/// Makes a volume: a directory that outlives sandboxes, mounted by those
/// created with `volumes: [{"name", "path"}]`, holding at most its quota.
#[utoipa::path(post, path = "/v1/volumes", tag = "volumes",
    request_body = CreateVolume,
    responses(
        (status = 201, description = "Made", body = VolumeInfo),
        (status = 400, description = "Bad name or quota", body = ErrorBody),
        (status = 403, description = "The key has as many volumes as it may keep", body = ErrorBody),
        (status = 409, description = "The key has a volume of that name", body = ErrorBody),
        (status = 501, description = "The daemon keeps no disk store", body = ErrorBody),
    ))]
pub async fn create_volume(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    body: std::result::Result<Json<CreateVolume>, JsonRejection>,
) -> Result<(StatusCode, Json<VolumeInfo>)> {
    let key = caller.key()?;
    let Json(body) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let quota = body
        .quota
        .as_ref()
        .map(|q| q.bytes("quota"))
        .transpose()
        .map_err(ApiError::bad_request)?;
    let row = api
        .daemon
        .create_volume(key, &body.name, quota, &request_id.0)?;
    Ok((StatusCode::CREATED, Json(VolumeInfo::of(&api, row))))
}

/// The key's volumes (an admin's: every one), oldest first.
#[utoipa::path(get, path = "/v1/volumes", tag = "volumes",
    responses((status = 200, description = "The volumes", body = VolumeList)))]
pub async fn list_volumes(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<VolumeList>> {
    let key = caller.key()?;
    let items = api
        .daemon
        .volumes(key)?
        .into_iter()
        .map(|row| VolumeInfo::of(&api, row))
        .collect();
    Ok(Json(VolumeList { items }))
}

/// One volume, by id or name.
#[utoipa::path(get, path = "/v1/volumes/{volume}", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name")),
    responses(
        (status = 200, description = "The volume", body = VolumeInfo),
        (status = 404, description = "No such volume", body = ErrorBody),
    ))]
pub async fn get_volume(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(volume): Path<String>,
) -> Result<Json<VolumeInfo>> {
    let row = api.daemon.find_volume(caller.key()?, &volume)?;
    Ok(Json(VolumeInfo::of(&api, row)))
}

/// Deletes a volume and its files.
#[utoipa::path(delete, path = "/v1/volumes/{volume}", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "A sandbox that is not dead mounts it", body = ErrorBody),
    ))]
pub async fn delete_volume(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Extension(request_id): Extension<RequestId>,
    Path(volume): Path<String>,
) -> Result<StatusCode> {
    api.daemon
        .delete_volume(caller.key()?, &volume, &request_id.0)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The shapes and steps both dialects' volume content routes share.
pub mod content {
    use super::*;

    /// One file or directory of a volume (e2b's `VolumeEntryStat`).
    #[derive(Debug, Clone, Serialize, ToSchema)]
    pub struct EntryView {
        /// Its last component.
        pub name: String,
        /// `file`, `directory`, `symlink` or `unknown`.
        #[serde(rename = "type")]
        pub kind: &'static str,
        /// From the volume's root, starting with `/`.
        pub path: String,
        pub size: u64,
        /// Permission bits.
        pub mode: u32,
        pub uid: u32,
        pub gid: u32,
        /// RFC 3339.
        pub atime: String,
        pub mtime: String,
        pub ctime: String,
        /// Where a symlink points.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub target: Option<String>,
    }

    impl From<VolumeEntry> for EntryView {
        fn from(e: VolumeEntry) -> EntryView {
            let time = |ns: i128| crate::types::rfc3339_ns(ns).unwrap_or_default();
            EntryView {
                name: e.name,
                kind: match e.kind {
                    EntryKind::File => "file",
                    EntryKind::Directory => "directory",
                    EntryKind::Symlink => "symlink",
                    EntryKind::Other => "unknown",
                },
                path: e.path,
                size: e.size,
                mode: e.mode,
                uid: e.uid,
                gid: e.gid,
                atime: time(e.atime_ns),
                mtime: time(e.mtime_ns),
                ctime: time(e.ctime_ns),
                target: e.target,
            }
        }
    }

    /// `?path=` of a volume content route.
    #[derive(Debug, Deserialize, IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct PathQuery {
        /// From the volume's root (`/a/b`; `..` stops at the root).
        pub path: String,
    }

    /// `?path=&depth=` of a listing.
    #[derive(Debug, Deserialize, IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct ListQuery {
        pub path: String,
        /// Levels below the directory (default 1: its children).
        pub depth: Option<u32>,
    }

    /// `?path=&uid=&gid=&mode=&force=` of a write or a new directory.
    #[derive(Debug, Deserialize, IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct PlaceQuery {
        pub path: String,
        /// Owner as sandboxes see it (default 1000, `user`).
        pub uid: Option<u32>,
        pub gid: Option<u32>,
        /// Permission bits (default 0644 for a file, 0755 for a directory).
        pub mode: Option<u32>,
        /// A file: replace one that is there (else 409). A directory: make
        /// missing parents, and one that exists is no error.
        pub force: Option<bool>,
    }

    impl PlaceQuery {
        fn placement(&self) -> Placement {
            Placement {
                uid: self.uid,
                gid: self.gid,
                mode: self.mode,
                force: self.force.unwrap_or(false),
            }
        }
    }

    /// Body of a metadata change.
    #[derive(Debug, Default, Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub struct MetadataBody {
        pub uid: Option<u32>,
        pub gid: Option<u32>,
        pub mode: Option<u32>,
    }

    pub async fn list(api: &Api, volume: &VolumeRow, q: ListQuery) -> Result<Vec<EntryView>> {
        let entries = api
            .daemon
            .volume_list(volume, &q.path, q.depth.unwrap_or(1))
            .await?;
        Ok(entries.into_iter().map(EntryView::from).collect())
    }

    pub async fn make_dir(api: &Api, volume: &VolumeRow, q: PlaceQuery) -> Result<EntryView> {
        Ok(api
            .daemon
            .volume_make_dir(volume, &q.path, q.placement())
            .await?
            .into())
    }

    pub async fn stat(api: &Api, volume: &VolumeRow, q: PathQuery) -> Result<EntryView> {
        Ok(api.daemon.volume_stat(volume, &q.path).await?.into())
    }

    pub async fn set_metadata(
        api: &Api,
        volume: &VolumeRow,
        q: PathQuery,
        body: &[u8],
    ) -> Result<EntryView> {
        let body: MetadataBody =
            crate::error::optional_body(body, "a JSON object of uid, gid and mode")?;
        let metadata = Metadata {
            uid: body.uid,
            gid: body.gid,
            mode: body.mode,
        };
        Ok(api
            .daemon
            .volume_set_metadata(volume, &q.path, metadata)
            .await?
            .into())
    }

    pub async fn remove(api: &Api, volume: &VolumeRow, q: PathQuery) -> Result<()> {
        Ok(api.daemon.volume_remove(volume, &q.path).await?)
    }

    /// The file's bytes, streamed.
    pub async fn read(api: &Api, volume: &VolumeRow, q: PathQuery) -> Result<Response> {
        let (file, size) = api.daemon.volume_open(volume, &q.path).await?;
        let stream = futures_util::stream::unfold(Some(file), |file| async move {
            use tokio::io::AsyncReadExt;
            let mut file = file?;
            let mut chunk = vec![0u8; 64 << 10];
            match file.read(&mut chunk).await {
                Ok(0) => None,
                Ok(n) => {
                    chunk.truncate(n);
                    Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from(chunk)),
                        Some(file),
                    ))
                }
                Err(e) => Some((Err(e), None)),
            }
        });
        Ok((
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                (header::CONTENT_LENGTH, size.to_string()),
            ],
            Body::from_stream(stream),
        )
            .into_response())
    }

    /// Writes the file from `body`, streamed, up to the daemon's upload
    /// limit (and the volume's quota).
    pub async fn write(
        api: &Api,
        volume: &VolumeRow,
        q: PlaceQuery,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<EntryView> {
        let limit = api.daemon.config().max_upload_bytes;
        crate::files::within_upload_limit(headers, limit)?;
        let stream = body.into_data_stream();
        Ok(api
            .daemon
            .volume_write(volume, &q.path, q.placement(), stream, limit)
            .await?
            .into())
    }
}

use content::{EntryView, ListQuery, MetadataBody, PathQuery, PlaceQuery};

fn volume_of(api: &Api, caller: &Caller, volume: &str) -> Result<VolumeRow> {
    Ok(api.daemon.find_volume(caller.key()?, volume)?)
}

/// The entries under a directory of a volume, by path.
#[utoipa::path(get, path = "/v1/volumes/{volume}/dir", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name"), ListQuery),
    responses(
        (status = 200, description = "The entries", body = [EntryView]),
        (status = 404, description = "No such volume or directory", body = ErrorBody),
    ))]
pub async fn list_dir(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(volume): Path<String>,
    q: std::result::Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Vec<EntryView>>> {
    let volume = volume_of(&api, &caller, &volume)?;
    Ok(Json(content::list(&api, &volume, query(q)?).await?))
}

/// Makes a directory in a volume.
#[utoipa::path(post, path = "/v1/volumes/{volume}/dir", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name"), PlaceQuery),
    responses(
        (status = 201, description = "Made", body = EntryView),
        (status = 404, description = "No such volume, or a parent is missing (without force)", body = ErrorBody),
        (status = 409, description = "It exists (without force), or a parent is not a directory", body = ErrorBody),
    ))]
pub async fn make_dir(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(volume): Path<String>,
    q: std::result::Result<Query<PlaceQuery>, QueryRejection>,
) -> Result<(StatusCode, Json<EntryView>)> {
    let volume = volume_of(&api, &caller, &volume)?;
    let made = content::make_dir(&api, &volume, query(q)?).await?;
    Ok((StatusCode::CREATED, Json(made)))
}

/// Downloads a file of a volume.
#[utoipa::path(get, path = "/v1/volumes/{volume}/file", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name"), PathQuery),
    responses(
        (status = 200, description = "The bytes", content_type = "application/octet-stream", body = String),
        (status = 404, description = "No such volume or file", body = ErrorBody),
        (status = 409, description = "A directory", body = ErrorBody),
    ))]
pub async fn read_file(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(volume): Path<String>,
    q: std::result::Result<Query<PathQuery>, QueryRejection>,
) -> Result<Response> {
    let volume = volume_of(&api, &caller, &volume)?;
    content::read(&api, &volume, query(q)?).await
}

/// Uploads a file into a volume (streamed; its directory must exist).
#[utoipa::path(put, path = "/v1/volumes/{volume}/file", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name"), PlaceQuery),
    request_body(content = String, content_type = "application/octet-stream"),
    responses(
        (status = 201, description = "Written", body = EntryView),
        (status = 404, description = "No such volume, or its directory is missing", body = ErrorBody),
        (status = 409, description = "A file is there (without force), or a directory", body = ErrorBody),
        (status = 413, description = "Over the upload limit; nothing kept", body = ErrorBody),
        (status = 507, description = "The volume is full; nothing kept", body = ErrorBody),
    ))]
pub async fn write_file(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(volume): Path<String>,
    q: std::result::Result<Query<PlaceQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<EntryView>)> {
    let volume = volume_of(&api, &caller, &volume)?;
    let written = content::write(&api, &volume, query(q)?, &headers, body).await?;
    Ok((StatusCode::CREATED, Json(written)))
}

/// What is at a path of a volume (a link is not followed).
#[utoipa::path(get, path = "/v1/volumes/{volume}/path", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name"), PathQuery),
    responses(
        (status = 200, description = "The entry", body = EntryView),
        (status = 404, description = "No such volume or path", body = ErrorBody),
    ))]
pub async fn stat_path(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(volume): Path<String>,
    q: std::result::Result<Query<PathQuery>, QueryRejection>,
) -> Result<Json<EntryView>> {
    let volume = volume_of(&api, &caller, &volume)?;
    Ok(Json(content::stat(&api, &volume, query(q)?).await?))
}

/// Changes the owner or mode of a path of a volume.
#[utoipa::path(patch, path = "/v1/volumes/{volume}/path", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name"), PathQuery),
    request_body = MetadataBody,
    responses(
        (status = 200, description = "The entry as it is now", body = EntryView),
        (status = 400, description = "An id or mode out of range", body = ErrorBody),
        (status = 404, description = "No such volume or path", body = ErrorBody),
    ))]
pub async fn set_metadata(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(volume): Path<String>,
    q: std::result::Result<Query<PathQuery>, QueryRejection>,
    body: axum::body::Bytes,
) -> Result<Json<EntryView>> {
    let volume = volume_of(&api, &caller, &volume)?;
    Ok(Json(
        content::set_metadata(&api, &volume, query(q)?, &body).await?,
    ))
}

/// Removes a path of a volume (a directory with everything in it).
#[utoipa::path(delete, path = "/v1/volumes/{volume}/path", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name"), PathQuery),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, description = "No such volume or path", body = ErrorBody),
    ))]
pub async fn remove_path(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(volume): Path<String>,
    q: std::result::Result<Query<PathQuery>, QueryRejection>,
) -> Result<StatusCode> {
    let volume = volume_of(&api, &caller, &volume)?;
    content::remove(&api, &volume, query(q)?).await?;
    Ok(StatusCode::NO_CONTENT)
}
