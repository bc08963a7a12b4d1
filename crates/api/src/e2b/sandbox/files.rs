//! envd's `/files`: download (`GET`, streamed) and upload (`POST`,
//! `multipart/form-data` with one or more files, or
//! `application/octet-stream`), both streamed through the daemon, whose
//! uploads create parents and appear whole or not at all.
//!
//! An upload's `X-Metadata-<key>: <value>` headers are the metadata of
//! every file it writes, kept as the file's `user.e2b.<key>` extended
//! attributes (keys lowercased, both printable ASCII, a key at most 246
//! bytes and all of it at most 4096, as envd takes them): an upload
//! replaces the file's whole set, so one without such headers clears it,
//! and a rename keeps it. The answer's entries carry it as `metadata`.
//! A filesystem without user extended attributes (every file of a gVisor
//! sandbox) cannot keep metadata: such an upload is refused (501) and
//! leaves the file as it was, where envd would write the file without it.
//!
//! Errors are envd's `{"code": <HTTP status>, "message"}`. A URL may be
//! *signed* instead of carrying credentials, as the SDKs' `download_url`
//! and `upload_url` make them: `signature=v1_<base64 of SHA-256 of
//! "path:operation:username:access_token[:expiration]">`, with
//! `signature_expiration` in Unix seconds when it expires.

use super::{absolute, run_as, Target, METADATA_XATTR_PREFIX};
use crate::error::ApiError;
use crate::{Api, RequestId};
use airlock_daemon::tokens::same_secret;
use airlock_daemon::DaemonError;
use airlock_policy::RunAs;
use airlock_protocol::Xattrs;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// An envd `/files` error answer.
#[derive(Debug)]
pub struct FilesError {
    status: StatusCode,
    message: String,
}

impl FilesError {
    fn new(status: StatusCode, message: impl Into<String>) -> FilesError {
        FilesError {
            status,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> FilesError {
        FilesError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<DaemonError> for FilesError {
    fn from(e: DaemonError) -> FilesError {
        if let DaemonError::NotRunning(id) = &e {
            // As e2b's proxy answers for a sandbox that is gone.
            return FilesError::new(
                StatusCode::BAD_GATEWAY,
                format!("The sandbox {id} was not found"),
            );
        }
        let api = ApiError::from(e);
        FilesError::new(api.status, api.message)
    }
}

impl IntoResponse for FilesError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"code": self.status.as_u16(), "message": self.message})),
        )
            .into_response()
    }
}

type Result<T> = std::result::Result<T, FilesError>;

/// The header prefix of an upload's metadata entries.
const METADATA_HEADER_PREFIX: &str = "x-metadata-";
/// Longest metadata key: the kernel's 255-byte attribute name less the
/// prefix.
const MAX_METADATA_KEY: usize = 255 - METADATA_XATTR_PREFIX.len();
/// Most bytes of one file's metadata, counted as envd does: the prefixed
/// name and the value of every entry (what one ext4 block holds).
const MAX_METADATA_BYTES: usize = 4096;

/// The metadata of an upload, from its `X-Metadata-<key>` headers (the
/// first of a repeated one): keys lowercased, checked as envd checks them.
fn metadata_of(headers: &HeaderMap) -> Result<BTreeMap<String, String>> {
    let invalid = |why: String| FilesError::bad(format!("invalid metadata: {why}"));
    let mut metadata = BTreeMap::new();
    for (name, value) in headers {
        // Header names are lowercase tokens already.
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER_PREFIX) else {
            continue;
        };
        if key.is_empty() || metadata.contains_key(key) {
            continue;
        }
        if key.len() > MAX_METADATA_KEY {
            return Err(invalid(format!(
                "metadata key {key:?} exceeds {MAX_METADATA_KEY} bytes"
            )));
        }
        let bytes = value.as_bytes();
        if let Some(at) = bytes.iter().position(|b| !(0x20..=0x7e).contains(b)) {
            return Err(invalid(format!(
                "metadata value for key {key:?} contains non-printable-ASCII byte \
                 0x{:02x} at offset {at}",
                bytes[at]
            )));
        }
        let value = String::from_utf8_lossy(bytes).into_owned();
        metadata.insert(key.to_owned(), value);
    }
    let total: usize = metadata
        .iter()
        .map(|(key, value)| METADATA_XATTR_PREFIX.len() + key.len() + value.len())
        .sum();
    if total > MAX_METADATA_BYTES {
        return Err(invalid(format!(
            "total metadata size {total} exceeds {MAX_METADATA_BYTES} bytes"
        )));
    }
    Ok(metadata)
}

/// [`metadata_of`] for the fuzz targets: the metadata, or the 400's text.
#[cfg(feature = "fuzzing")]
pub fn fuzz_metadata(headers: &HeaderMap) -> std::result::Result<BTreeMap<String, String>, String> {
    metadata_of(headers).map_err(|e| e.message)
}

/// The query of `/files`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<i64>,
}

/// Whether a URL carries a signature (checked by the handler).
pub fn is_signed(uri: &Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|p| p.starts_with("signature=")))
}

/// The running sandbox whose access token signed this `/files` URL, for a
/// signed URL fetched without `E2b-Sandbox-Id` (a browser, `curl`: the
/// URL alone must work, as e2b's do). Every running sandbox is tried, so
/// this is for header-less signed requests only.
pub fn signer(api: &Api, uri: &Uri, method: &axum::http::Method) -> Option<String> {
    let query = query_of(uri).ok()?;
    let given = query.signature.as_deref()?;
    if query
        .signature_expiration
        .is_some_and(|at| at < time::OffsetDateTime::now_utc().unix_timestamp())
    {
        return None;
    }
    let operation = if method == axum::http::Method::GET {
        "read"
    } else {
        "write"
    };
    api.daemon.running_ids().into_iter().find(|id| {
        let expected = signature(
            query.path.as_deref().unwrap_or(""),
            operation,
            query.username.as_deref().unwrap_or(""),
            &api.daemon.derived_access_token(id),
            query.signature_expiration,
        );
        same_secret(given, &expected)
    })
}

/// The signature of a file URL, as the SDKs compute it.
fn signature(
    path: &str,
    operation: &str,
    user: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let raw = match expiration {
        Some(at) => format!("{path}:{operation}:{user}:{token}:{at}"),
        None => format!("{path}:{operation}:{user}:{token}"),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// Checks the signature of a request that came without credentials.
fn check_signature(
    api: &Api,
    id: &str,
    query: &FilesQuery,
    operation: &str,
    credentialed: bool,
) -> Result<()> {
    if credentialed {
        return Ok(());
    }
    let unauthorized = || {
        FilesError::new(
            StatusCode::UNAUTHORIZED,
            "the URL's signature is not valid or has expired",
        )
    };
    let given = query.signature.as_deref().ok_or_else(unauthorized)?;
    if let Some(at) = query.signature_expiration {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        if at < now {
            return Err(unauthorized());
        }
    }
    let token = api.daemon.access_token(id).ok_or_else(unauthorized)?;
    let expected = signature(
        query.path.as_deref().unwrap_or(""),
        operation,
        query.username.as_deref().unwrap_or(""),
        &token,
        query.signature_expiration,
    );
    if same_secret(given, &expected) {
        Ok(())
    } else {
        Err(unauthorized())
    }
}

fn user_of(query: &FilesQuery) -> Result<Option<RunAs>> {
    run_as(query.username.as_deref())
        .map_err(|e| FilesError::new(StatusCode::UNAUTHORIZED, e.message))
}

fn resolve(path: &str, user: Option<RunAs>) -> Result<String> {
    absolute(path, user).map_err(|e| FilesError::bad(e.message))
}

fn query_of(uri: &Uri) -> Result<FilesQuery> {
    Query::<FilesQuery>::try_from_uri(uri)
        .map(|Query(q)| q)
        .map_err(|e| FilesError::bad(e.body_text()))
}

fn credentialed(response_caller: Option<&Extension<crate::auth::Caller>>) -> bool {
    response_caller.is_some()
}

/// `GET /files`: the file's bytes.
pub async fn download(
    State(api): State<Api>,
    Extension(target): Extension<Target>,
    caller: Option<Extension<crate::auth::Caller>>,
    request_id: Option<Extension<RequestId>>,
    uri: Uri,
) -> Response {
    let answer: Result<Response> = async {
        let query = query_of(&uri)?;
        check_signature(
            &api,
            &target.id,
            &query,
            "read",
            credentialed(caller.as_ref()),
        )?;
        let user = user_of(&query)?;
        let path = resolve(
            query
                .path
                .as_deref()
                .ok_or_else(|| FilesError::bad("path is required"))?,
            user,
        )?;
        let request_id = request_id.map(|Extension(r)| r.0).unwrap_or_default();
        let reader = api.daemon.read_file(&target.id, &path, &request_id).await?;
        let stream = futures_util::stream::unfold(reader, |mut reader| async move {
            match reader.next_chunk().await? {
                Ok(chunk) => Some((Ok::<Bytes, std::io::Error>(Bytes::from(chunk)), reader)),
                // Headers are gone: break the body off so the client sees
                // a failed transfer, not a short file.
                Err(e) => Some((Err(std::io::Error::other(e.to_string())), reader)),
            }
        });
        let name = path.rsplit('/').next().unwrap_or("file").replace('"', "");
        let mut response = (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            Body::from_stream(stream),
        )
            .into_response();
        if let Ok(value) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
            response
                .headers_mut()
                .insert(header::CONTENT_DISPOSITION, value);
        }
        Ok(response)
    }
    .await;
    answer.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /files`: writes the uploaded file(s); answers the entries written.
pub async fn upload(
    State(api): State<Api>,
    Extension(target): Extension<Target>,
    caller: Option<Extension<crate::auth::Caller>>,
    request_id: Option<Extension<RequestId>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer: Result<Response> = async {
        let query = query_of(&uri)?;
        check_signature(
            &api,
            &target.id,
            &query,
            "write",
            credentialed(caller.as_ref()),
        )?;
        let user = user_of(&query)?;
        let metadata = metadata_of(&headers)?;
        let request_id = request_id.map(|Extension(r)| r.0).unwrap_or_default();
        let gzipped = match headers
            .get(header::CONTENT_ENCODING)
            .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
            .as_deref()
        {
            None | Some("") | Some("identity") => false,
            Some("gzip") | Some("x-gzip") => true,
            Some(_) => {
                return Err(FilesError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "the only Content-Encoding an upload may have is gzip",
                ))
            }
        };
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let limit = api.daemon.config().max_upload_bytes;
        let mut written = Vec::new();
        let write = Writer {
            api: &api,
            id: &target.id,
            user,
            limit,
            request_id: &request_id,
            metadata: &metadata,
            // envd writes uploads in place (watchers see a write, not a
            // rename); a gzip body can turn out corrupt halfway, so it goes
            // to a temporary name first and leaves the old file alone.
            mode: if gzipped {
                airlock_daemon::files::WriteMode::Atomic
            } else {
                airlock_daemon::files::WriteMode::InPlace
            },
        };
        let body = if gzipped {
            let encoded = body
                .into_data_stream()
                .map(|r| r.map_err(|e| e.to_string()));
            Body::from_stream(
                super::gzip::gunzip(Box::pin(encoded)).map(|r| r.map_err(std::io::Error::other)),
            )
        } else {
            body
        };
        if let Some(boundary) = crate::form::multipart_boundary(&content_type) {
            let mut parts = Multipart::new(body, boundary);
            while let Some(part) = parts.next_part().await? {
                let name = query
                    .path
                    .clone()
                    .or(part.filename)
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| {
                        FilesError::bad(
                            "each file needs a path (the part's filename or the path parameter)",
                        )
                    })?;
                let path = resolve(&name, user)?;
                let data = futures_util::stream::unfold(&mut parts, |parts| async move {
                    parts.next_chunk().await.map(|chunk| (chunk, parts))
                });
                written.push(write.write(path, Box::pin(data)).await?);
            }
        } else {
            let essence = content_type
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            if essence != "application/octet-stream" && !essence.is_empty() {
                return Err(FilesError::bad(
                    "the body must be multipart/form-data or application/octet-stream",
                ));
            }
            let path = resolve(
                query.path.as_deref().ok_or_else(|| {
                    FilesError::bad("path is required for an application/octet-stream upload")
                })?,
                user,
            )?;
            let data = body
                .into_data_stream()
                .map(|r| r.map_err(|e| e.to_string()));
            written.push(write.write(path, Box::pin(data)).await?);
        }
        // The metadata is on each file as asked (a write that could not set
        // it failed), so it is answered without reading it back.
        let entries: Vec<serde_json::Value> = written
            .iter()
            .map(|path| {
                let name = path.rsplit('/').next().unwrap_or(path);
                let mut entry = json!({"path": path, "name": name, "type": "file"});
                if !metadata.is_empty() {
                    entry["metadata"] = json!(metadata);
                }
                entry
            })
            .collect();
        Ok((StatusCode::OK, Json(entries)).into_response())
    }
    .await;
    answer.unwrap_or_else(IntoResponse::into_response)
}

/// Writes uploaded files through the daemon.
struct Writer<'a> {
    api: &'a Api,
    id: &'a str,
    user: Option<RunAs>,
    limit: u64,
    request_id: &'a str,
    mode: airlock_daemon::files::WriteMode,
    /// The metadata every file written is left with (none clears it).
    metadata: &'a BTreeMap<String, String>,
}

impl Writer<'_> {
    async fn write<S>(&self, path: String, data: S) -> Result<String>
    where
        S: Stream<Item = std::result::Result<Bytes, String>> + Unpin,
    {
        self.api
            .daemon
            .write_file(
                self.id,
                &path,
                None,
                self.user,
                self.mode,
                Some(Xattrs {
                    prefix: METADATA_XATTR_PREFIX.to_owned(),
                    attrs: self
                        .metadata
                        .iter()
                        .map(|(key, value)| {
                            (format!("{METADATA_XATTR_PREFIX}{key}"), value.clone())
                        })
                        .collect(),
                }),
                data,
                self.limit,
                self.request_id,
            )
            .await?;
        Ok(path)
    }
}

/// Headers of one part of a multipart body.
#[derive(Debug)]
struct Part {
    filename: Option<String>,
}

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    /// Looking for the first delimiter.
    Preamble,
    /// Just past a delimiter: `--` ends the body, CRLF starts a part.
    AfterDelimiter,
    /// Inside a part's data.
    Data,
    /// Past the closing delimiter.
    Done,
}

/// A streaming `multipart/form-data` reader: parts one after another, each
/// part's data in chunks as the body arrives.
///
/// Ours, not `multer` (axum's multipart reader), because multer does not
/// keep within the bounds this one holds: it buffers the preamble and each
/// part's header block until it finds the boundary or the blank line,
/// limited only by a size limit on the whole body (here the upload limit,
/// gigabytes), and it takes every chunk the body has ready before handing
/// any out, so a gzip upload, whose decoder always has the next chunk
/// ready, would be inflated into memory whole. This reader holds at most
/// [`MAX_PART_HEADERS`] of preamble or headers and, of a part's data, the
/// chunk that arrived plus 64 KiB. It is fuzzed (`fuzz/`, target
/// `e2b_multipart`).
struct Multipart<S> {
    body: S,
    buffer: BytesMut,
    delimiter: Vec<u8>,
    phase: Phase,
    eof: bool,
    /// Leading bytes of `buffer` already searched for what the current
    /// phase looks for: a body sent in tiny chunks is scanned once, not
    /// once per chunk.
    searched: usize,
}

/// Largest header block of one part.
const MAX_PART_HEADERS: usize = 16 << 10;

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    // SIMD substring search: the delimiter scan is the multipart parser's
    // hot loop (a byte-by-byte `windows` scan held uploads near 200 MiB/s).
    memchr::memmem::find(haystack, needle)
}

/// [`find`] from `*searched` on; on a miss, moves `*searched` to where the
/// next search must start (a match may straddle the end).
fn find_after(haystack: &[u8], needle: &[u8], searched: &mut usize) -> Option<usize> {
    let from = (*searched).min(haystack.len());
    match find(&haystack[from..], needle) {
        Some(at) => {
            *searched = 0;
            Some(from + at)
        }
        None => {
            *searched = haystack
                .len()
                .saturating_sub(needle.len().saturating_sub(1));
            None
        }
    }
}

impl Multipart<axum::body::BodyDataStream> {
    fn new(body: Body, boundary: &str) -> Self {
        Multipart::over(body.into_data_stream(), boundary)
    }
}

impl<S> Multipart<S> {
    fn over(body: S, boundary: &str) -> Self {
        let mut buffer = BytesMut::new();
        // The first delimiter has no CRLF before it; lend it one.
        buffer.extend_from_slice(b"\r\n");
        Multipart {
            body,
            buffer,
            delimiter: format!("\r\n--{boundary}").into_bytes(),
            phase: Phase::Preamble,
            eof: false,
            searched: 0,
        }
    }
}

impl<S> Multipart<S>
where
    S: Stream<Item = std::result::Result<Bytes, axum::Error>> + Unpin,
{
    /// Reads more of the body; `false` at its end.
    async fn fill(&mut self) -> Result<bool> {
        if self.eof {
            return Ok(false);
        }
        match self.body.next().await {
            Some(Ok(bytes)) => {
                self.buffer.extend_from_slice(&bytes);
                Ok(true)
            }
            Some(Err(_)) => Err(FilesError::bad("the upload broke off")),
            None => {
                self.eof = true;
                Ok(false)
            }
        }
    }

    fn truncated() -> FilesError {
        FilesError::bad("the multipart body ends early")
    }

    /// The next part's headers; `None` after the last part. Data of the
    /// current part that was not read is skipped.
    async fn next_part(&mut self) -> Result<Option<Part>> {
        loop {
            match self.phase {
                Phase::Done => return Ok(None),
                Phase::Preamble => {
                    match find_after(&self.buffer, &self.delimiter, &mut self.searched) {
                        Some(at) => {
                            self.buffer.advance(at + self.delimiter.len());
                            self.phase = Phase::AfterDelimiter;
                        }
                        None => {
                            if self.buffer.len() > MAX_PART_HEADERS {
                                return Err(FilesError::bad("the multipart preamble is too long"));
                            }
                            if !self.fill().await? {
                                return Err(Self::truncated());
                            }
                        }
                    }
                }
                Phase::Data => {
                    while self
                        .next_chunk()
                        .await
                        .transpose()
                        .map_err(FilesError::bad)?
                        .is_some()
                    {}
                }
                Phase::AfterDelimiter => {
                    if self.buffer.len() < 2 {
                        if !self.fill().await? {
                            return Err(Self::truncated());
                        }
                        continue;
                    }
                    if self.buffer.starts_with(b"--") {
                        self.phase = Phase::Done;
                        return Ok(None);
                    }
                    let Some(end) = find_after(&self.buffer, b"\r\n\r\n", &mut self.searched)
                    else {
                        if self.buffer.len() > MAX_PART_HEADERS {
                            return Err(FilesError::bad("a part's headers are too long"));
                        }
                        if !self.fill().await? {
                            return Err(Self::truncated());
                        }
                        continue;
                    };
                    let block = self.buffer.split_to(end + 4);
                    let text = String::from_utf8_lossy(&block);
                    let filename = text.split("\r\n").find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        if !name.trim().eq_ignore_ascii_case("content-disposition") {
                            return None;
                        }
                        crate::form::disposition_param(value, "filename")
                    });
                    self.phase = Phase::Data;
                    return Ok(Some(Part { filename }));
                }
            }
        }
    }

    /// The next chunk of the current part's data; `None` at its end.
    async fn next_chunk(&mut self) -> Option<std::result::Result<Bytes, String>> {
        loop {
            if self.phase != Phase::Data {
                return None;
            }
            if let Some(at) = find_after(&self.buffer, &self.delimiter, &mut self.searched) {
                let chunk = self.buffer.split_to(at).freeze();
                self.buffer.advance(self.delimiter.len());
                self.phase = Phase::AfterDelimiter;
                if chunk.is_empty() {
                    return None;
                }
                return Some(Ok(chunk));
            }
            let keep = self.delimiter.len() - 1;
            if self.buffer.len() > keep + (64 << 10) {
                let chunk = self.buffer.split_to(self.buffer.len() - keep).freeze();
                self.searched = 0;
                return Some(Ok(chunk));
            }
            match self.fill().await {
                Ok(true) => {}
                Ok(false) => {
                    self.phase = Phase::Done;
                    return Some(Err("the multipart body ends early".into()));
                }
                Err(e) => {
                    self.phase = Phase::Done;
                    return Some(Err(e.message));
                }
            }
        }
    }
}

/// Reads `chunks` as a multipart body with `boundary` the way an upload
/// does, for the fuzzer (`fuzz/`, target `e2b_multipart`): each part's
/// file name and data, or the first error's message. Panics if the
/// reader ever holds more than its bounds allow.
#[cfg(feature = "fuzzing")]
pub async fn fuzz_multipart(
    chunks: Vec<Bytes>,
    boundary: &str,
) -> std::result::Result<Vec<(Option<String>, Vec<u8>)>, String> {
    let largest = chunks.iter().map(Bytes::len).max().unwrap_or(0);
    let stream = futures_util::stream::iter(chunks.into_iter().map(Ok::<Bytes, axum::Error>));
    let mut multipart = Multipart::over(stream, boundary);
    let bound = MAX_PART_HEADERS.max(multipart.delimiter.len() + (64 << 10)) + largest + 2;
    let held = |multipart: &Multipart<_>| {
        assert!(
            multipart.buffer.len() <= bound,
            "the multipart reader holds {} bytes, over its bound of {bound}",
            multipart.buffer.len()
        );
    };
    let mut parts = Vec::new();
    loop {
        let part = multipart.next_part().await.map_err(|e| e.message);
        held(&multipart);
        let Some(part) = part? else {
            return Ok(parts);
        };
        let mut data = Vec::new();
        while let Some(chunk) = multipart.next_chunk().await {
            held(&multipart);
            data.extend_from_slice(&chunk?);
        }
        parts.push((part.filename, data));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parts_of(body: &[u8], cut: usize) -> Vec<(Option<String>, Vec<u8>)> {
        let chunks: Vec<std::result::Result<Bytes, axum::Error>> = body
            .chunks(cut)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let mut multipart = Multipart::over(futures_util::stream::iter(chunks), "XyZ");
        let mut out = Vec::new();
        while let Some(part) = multipart.next_part().await.unwrap() {
            let mut data = Vec::new();
            while let Some(chunk) = multipart.next_chunk().await {
                data.extend_from_slice(&chunk.unwrap());
            }
            out.push((part.filename, data));
        }
        out
    }

    #[tokio::test]
    async fn multipart_bodies_split_into_files_wherever_they_are_cut() {
        let big = vec![b'\r'; 200_000];
        let mut body = Vec::new();
        body.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--X\r\n");
        body.extend_from_slice(
            b"\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"b\"\r\n\r\n",
        );
        body.extend_from_slice(&big);
        body.extend_from_slice(b"\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"empty\"\r\n\r\n\r\n--XyZ--\r\n");
        for cut in [1, 7, 1000, body.len()] {
            let parts = parts_of(&body, cut).await;
            assert_eq!(parts.len(), 3, "cut {cut}");
            assert_eq!(parts[0].0.as_deref(), Some("/home/user/a.txt"));
            assert_eq!(parts[0].1, b"hello\r\n--X\r\n");
            assert_eq!(parts[1].1, big);
            assert_eq!(parts[2], (Some("empty".into()), Vec::new()));
        }
    }

    #[test]
    fn file_names_may_hold_semicolons_quotes_and_backslashes() {
        for (value, name) in [
            (
                r#"form-data; name="file"; filename="/home/user/a;b.txt""#,
                "/home/user/a;b.txt",
            ),
            (
                r#"form-data; filename="say \"hi\"; now"; name="file""#,
                r#"say "hi"; now"#,
            ),
            (
                r#"form-data; name="file"; filename="c:\\tmp\\x""#,
                r"c:\tmp\x",
            ),
            (
                r#"form-data; name="a;filename=evil"; filename=plain"#,
                "plain",
            ),
            ("form-data; FileName=plain.txt", "plain.txt"),
        ] {
            assert_eq!(
                crate::form::disposition_param(value, "filename").as_deref(),
                Some(name),
                "{value}"
            );
        }
        assert_eq!(
            crate::form::disposition_param(r#"form-data; name="file""#, "filename"),
            None
        );
    }

    #[tokio::test]
    async fn endless_headers_and_preambles_are_refused_at_their_bound() {
        let chunk = Bytes::from(vec![b'a'; 4096]);
        for start in [&b""[..], b"--XyZ\r\nX-Long: "] {
            let mut chunks = vec![Ok::<Bytes, axum::Error>(Bytes::copy_from_slice(start))];
            chunks.extend((0..1000).map(|_| Ok(chunk.clone())));
            let mut multipart = Multipart::over(futures_util::stream::iter(chunks), "XyZ");
            let error = multipart.next_part().await.unwrap_err();
            assert!(error.message.contains("too long"), "{}", error.message);
            assert!(multipart.buffer.len() <= MAX_PART_HEADERS + chunk.len() + 2);
        }
    }

    #[test]
    fn metadata_headers_are_checked_as_envd_checks_them() {
        let mut headers = HeaderMap::new();
        assert!(metadata_of(&headers).unwrap().is_empty());
        headers.insert("X-Metadata-Author", "Mish U".parse().unwrap());
        headers.append("x-metadata-author", "second".parse().unwrap());
        headers.insert("x-metadata-", "no key".parse().unwrap());
        headers.insert("x-other", "x".parse().unwrap());
        assert_eq!(
            metadata_of(&headers).unwrap(),
            BTreeMap::from([("author".to_owned(), "Mish U".to_owned())])
        );
        let mut tab = HeaderMap::new();
        tab.insert("x-metadata-k", HeaderValue::from_bytes(b"a\tb").unwrap());
        let error = metadata_of(&tab).unwrap_err();
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert!(
            error.message.starts_with("invalid metadata: "),
            "{}",
            error.message
        );
        let mut long = HeaderMap::new();
        let key = format!("x-metadata-{}", "k".repeat(MAX_METADATA_KEY + 1));
        long.insert(
            axum::http::HeaderName::from_bytes(key.as_bytes()).unwrap(),
            "v".parse().unwrap(),
        );
        assert!(metadata_of(&long)
            .unwrap_err()
            .message
            .contains("exceeds 246 bytes"));
        let mut big = HeaderMap::new();
        for i in 0..5 {
            let name = format!("x-metadata-k{i}");
            big.insert(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(&"v".repeat(1000)).unwrap(),
            );
        }
        assert!(metadata_of(&big)
            .unwrap_err()
            .message
            .contains("exceeds 4096 bytes"));
    }

    #[test]
    fn signatures_match_the_sdks() {
        // Python: get_signature("/home/user/a.txt", "read", None, "tok")
        let s = signature("/home/user/a.txt", "read", "", "tok", None);
        let digest = Sha256::digest(b"/home/user/a.txt:read::tok");
        let expected = format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD
                .encode(digest)
                .trim_end_matches('=')
        );
        assert_eq!(s, expected);
        assert_ne!(s, signature("/home/user/a.txt", "write", "", "tok", None));
        assert_ne!(s, signature("/home/user/a.txt", "read", "", "tok", Some(1)));
        assert!(same_secret(&s, &expected));
        assert!(!same_secret(&s, "v1_"));
        assert_eq!(
            crate::form::multipart_boundary("multipart/form-data; boundary=\"abc\""),
            Some("abc")
        );
        assert_eq!(
            crate::form::multipart_boundary("application/octet-stream"),
            None
        );
    }
}
