//! `filesystem.Filesystem`: file operations in the sandbox, translated onto
//! the daemon's (carried out by the agent inside). Entries are envd's
//! `EntryInfo` in protobuf JSON: camelCase names, enums by name, `size` (an
//! int64) as a string, `modifiedTime` as an RFC 3339 timestamp, and
//! `metadata` the file's `user.e2b.*` extended attributes without the
//! prefix (what an upload's `X-Metadata-*` headers set, see [`super::files`]).
//!
//! Watches (`WatchDir`, `CreateWatcher`) attach the entry to `create`,
//! `write` and `chmod` events when asked (`includeEntry`, as envd 0.6.3
//! does; `remove` and `rename` never carry one), and refuse a directory on
//! a network filesystem unless `allowNetworkMounts` (envd 0.6.4). Volumes
//! and `/mnt/user-data` are bind mounts of local directories, so they are
//! watched like any other directory.

use super::connect::{self, Code, ConnectError, StreamOptions};
use super::{absolute, basic_user, Target, METADATA_XATTR_PREFIX};
use crate::Api;
use airlock_daemon::files::{Change, WatchOptions};
use airlock_protocol::{FileInfo, FileKind, FsEventKind};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

type Result<T> = std::result::Result<T, ConnectError>;

/// The requests of the service (each uses some of these fields).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct FsRequest {
    path: String,
    source: String,
    destination: String,
    depth: u32,
    recursive: bool,
    #[serde(alias = "include_entry")]
    include_entry: bool,
    #[serde(alias = "allow_network_mounts")]
    allow_network_mounts: bool,
    #[serde(alias = "watcher_id")]
    watcher_id: String,
}

impl FsRequest {
    /// What a `WatchDir` or `CreateWatcher` asks of the watch.
    fn watch_options(&self) -> WatchOptions {
        WatchOptions {
            recursive: self.recursive,
            entries: self.include_entry,
            xattrs: Some(METADATA_XATTR_PREFIX.to_owned()),
            local_only: !self.allow_network_mounts,
        }
    }
}

/// The prefix of the attributes an entry reports.
const XATTRS: Option<&str> = Some(METADATA_XATTR_PREFIX);

/// Serves `POST /filesystem.Filesystem/{method}`.
pub async fn call(
    State(api): State<Api>,
    Extension(target): Extension<Target>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let id = target.id.as_str();
    let answer = if method == "WatchDir" {
        watch_dir(&api, id, &headers, body).await
    } else {
        unary(&api, id, &method, &headers, body).await
    };
    answer.unwrap_or_else(IntoResponse::into_response)
}

async fn unary(
    api: &Api,
    id: &str,
    method: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response> {
    let known = [
        "Stat",
        "MakeDir",
        "Move",
        "ListDir",
        "Remove",
        "CreateWatcher",
        "GetWatcherEvents",
        "RemoveWatcher",
    ];
    if !known.contains(&method) {
        return Err(ConnectError::unimplemented(format!(
            "filesystem.Filesystem has no method {method}"
        )));
    }
    let request: FsRequest = connect::unary_request(headers, body).await?;
    let user = basic_user(headers)?;
    let daemon = &api.daemon;
    let answer = match method {
        "Stat" => {
            let path = absolute(&request.path, user)?;
            json!({"entry": entry(&daemon.stat_with_xattrs(id, &path, XATTRS).await?)})
        }
        "MakeDir" => {
            let path = absolute(&request.path, user)?;
            if daemon.stat(id, &path).await.is_ok() {
                return Err(ConnectError::new(
                    Code::AlreadyExists,
                    format!("{path} exists already"),
                ));
            }
            daemon.make_dir(id, &path, true, user).await?;
            json!({"entry": entry(&daemon.stat_with_xattrs(id, &path, XATTRS).await?)})
        }
        "Move" => {
            let from = absolute(&request.source, user)?;
            let to = absolute(&request.destination, user)?;
            json!({"entry": entry(&daemon.move_path(id, &from, &to, XATTRS).await?)})
        }
        "ListDir" => {
            // envd has no pages: the whole listing, up to the daemon's cap,
            // encoded entry by entry without a second copy as JSON values.
            let path = absolute(&request.path, user)?;
            let entries = daemon
                .list_dir_all(id, &path, request.depth.max(1), XATTRS)
                .await?;
            return Ok(connect::unary_response(&ListDirResponse {
                entries: &entries,
            }));
        }
        "Remove" => {
            let path = absolute(&request.path, user)?;
            daemon.remove(id, &path, true, "").await?;
            json!({})
        }
        "CreateWatcher" => {
            let path = absolute(&request.path, user)?;
            let watcher_id = daemon
                .create_watcher(id, &path, &request.watch_options())
                .await?;
            json!({"watcherId": format!("{watcher_id}:{path}")})
        }
        "GetWatcherEvents" => {
            // The id carries the watched directory, so names can be made
            // relative to it without keeping anything here.
            let (watcher_id, dir) = request
                .watcher_id
                .split_once(':')
                .ok_or_else(|| ConnectError::new(Code::NotFound, "no such watcher"))?;
            let polls = daemon.watcher_changes(id, watcher_id)?;
            let events: Vec<Value> = polls
                .changes
                .iter()
                .filter(|change| !is_upload_temp(&change.path))
                .map(|change| fs_event(dir, change))
                .collect();
            json!({ "events": events })
        }
        _ => {
            let watcher_id = request
                .watcher_id
                .split_once(':')
                .map_or(request.watcher_id.as_str(), |(w, _)| w);
            daemon.remove_watcher(id, watcher_id)?;
            json!({})
        }
    };
    Ok(connect::unary_response(&answer))
}

async fn watch_dir(api: &Api, id: &str, headers: &HeaderMap, body: Body) -> Result<Response> {
    let request: FsRequest = connect::stream_request(headers, body).await?;
    let user = basic_user(headers)?;
    let dir = absolute(&request.path, user)?;
    let deadline = connect::timeout(headers)?;
    let watcher = api.daemon.watch(id, &dir, &request.watch_options()).await?;
    let start = futures_util::stream::once(async { Ok(json!({"start": {}})) });
    let id = id.to_owned();
    let changes = futures_util::stream::unfold(Some(watcher), move |watcher| {
        let id = id.clone();
        let dir = dir.clone();
        async move {
            let mut watcher = watcher?;
            let mut next = watcher.next().await;
            while matches!(&next, Some(Ok(change)) if is_upload_temp(&change.path)) {
                next = watcher.next().await;
            }
            match next {
                Some(Ok(change)) => {
                    let event = fs_event(&dir, &change);
                    Some((Ok(json!({ "filesystem": event })), Some(watcher)))
                }
                Some(Err(e)) => Some((Err(ConnectError::from(e)), None)),
                None => Some((
                    Err(ConnectError::new(
                        Code::Unavailable,
                        format!("The sandbox {id} was not found, or the watch ended"),
                    )),
                    None,
                )),
            }
        }
    });
    Ok(connect::stream_response(
        Box::pin(futures_util::StreamExt::chain(start, changes)),
        StreamOptions {
            keepalive: connect::keepalive_interval(headers)
                .map(|every| (every, json!({"keepalive": {}}))),
            deadline,
        },
    ))
}

/// Whether `path` is the temporary name of an upload in progress (the
/// daemon writes uploads beside their target and renames them into place);
/// envd has none, so their events are not shown.
fn is_upload_temp(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|name| name.starts_with('.') && name.contains(".airlock-upload-"))
}

/// A `FilesystemEvent`; `name` is relative to the watched directory, and
/// `entry` is there when the watch asked for entries and the change has one.
fn fs_event(dir: &str, change: &Change) -> Value {
    let prefix = format!("{}/", dir.trim_end_matches('/'));
    let name = change
        .path
        .strip_prefix(&prefix)
        .unwrap_or(&change.path)
        .to_owned();
    let kind = match change.kind {
        FsEventKind::Create => "EVENT_TYPE_CREATE",
        FsEventKind::Write => "EVENT_TYPE_WRITE",
        FsEventKind::Remove => "EVENT_TYPE_REMOVE",
        FsEventKind::Rename => "EVENT_TYPE_RENAME",
        FsEventKind::Chmod => "EVENT_TYPE_CHMOD",
    };
    let mut event = json!({"name": name, "type": kind});
    if let Some(info) = &change.entry {
        event["entry"] = entry(info);
    }
    event
}

/// The name of a uid or gid inside the sandbox.
fn account(id: u32) -> String {
    match id {
        0 => "root".into(),
        1000 => "user".into(),
        other => other.to_string(),
    }
}

/// Permission bits as Go's `FileMode.String` writes them (`drwxr-xr-x`).
fn permissions(kind: FileKind, mode: u32) -> String {
    let mut text = String::with_capacity(10);
    text.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'L',
        _ => '-',
    });
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

fn timestamp(ns: i64) -> String {
    crate::types::rfc3339_ns(i128::from(ns)).unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

/// envd's `EntryInfo` in protobuf JSON.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct EntryInfo<'a> {
    name: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    path: &'a str,
    size: String,
    mode: u32,
    permissions: String,
    owner: String,
    group: String,
    modified_time: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    is_symlink: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    symlink_target: Option<&'a str>,
    /// The `user.e2b.*` attributes without the prefix; left out when there
    /// are none (as protobuf JSON leaves out an empty map).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<&'a str, &'a str>,
}

impl<'a> From<&'a FileInfo> for EntryInfo<'a> {
    fn from(info: &'a FileInfo) -> EntryInfo<'a> {
        EntryInfo {
            name: &info.name,
            kind: match info.kind {
                FileKind::File => "FILE_TYPE_FILE",
                FileKind::Dir => "FILE_TYPE_DIRECTORY",
                FileKind::Symlink => "FILE_TYPE_SYMLINK",
                FileKind::Other => "FILE_TYPE_UNSPECIFIED",
            },
            path: &info.path,
            size: info.size.to_string(),
            mode: info.mode & 0o7777,
            permissions: permissions(info.kind, info.mode),
            owner: account(info.uid),
            group: account(info.gid),
            modified_time: timestamp(info.mtime_ns),
            is_symlink: info.kind == FileKind::Symlink,
            symlink_target: info.symlink_target.as_deref(),
            metadata: info
                .xattrs
                .iter()
                .filter_map(|(name, value)| {
                    let key = name.strip_prefix(METADATA_XATTR_PREFIX)?;
                    Some((key, value.as_str()))
                })
                .collect(),
        }
    }
}

/// A `ListDirResponse`, each entry made an `EntryInfo` as it is written.
#[derive(Serialize)]
struct ListDirResponse<'a> {
    #[serde(serialize_with = "entry_infos")]
    entries: &'a [FileInfo],
}

fn entry_infos<S: serde::Serializer>(
    entries: &&[FileInfo],
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    serializer.collect_seq(entries.iter().map(EntryInfo::from))
}

/// An `EntryInfo`.
pub fn entry(info: &FileInfo) -> Value {
    serde_json::to_value(EntryInfo::from(info)).unwrap_or_else(|_| json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(kind: FileKind) -> FileInfo {
        FileInfo {
            path: "/home/user/a.txt".into(),
            name: "a.txt".into(),
            kind,
            size: 12,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            mtime_ns: 1_700_000_000_123_000_000,
            symlink_target: None,
            xattrs: BTreeMap::new(),
        }
    }

    #[test]
    fn entries_are_envd_entry_infos() {
        let value = entry(&info(FileKind::File));
        assert_eq!(
            value,
            json!({"name": "a.txt", "type": "FILE_TYPE_FILE", "path": "/home/user/a.txt",
                   "size": "12", "mode": 420, "permissions": "-rw-r--r--", "owner": "user",
                   "group": "user", "modifiedTime": "2023-11-14T22:13:20.123Z"})
        );
        let mut dir = info(FileKind::Dir);
        dir.mode = 0o755;
        assert_eq!(entry(&dir)["permissions"], "drwxr-xr-x");
        let mut link = info(FileKind::Symlink);
        link.symlink_target = Some("/etc".into());
        let link = entry(&link);
        assert_eq!(link["type"], "FILE_TYPE_SYMLINK");
        assert_eq!(link["isSymlink"], true);
        assert_eq!(link["symlinkTarget"], "/etc");
    }

    #[test]
    fn a_listing_is_written_as_entry_infos() {
        let entries = [info(FileKind::File), info(FileKind::Dir)];
        let written: Value = serde_json::to_value(ListDirResponse { entries: &entries }).unwrap();
        assert_eq!(
            written,
            json!({"entries": [entry(&entries[0]), entry(&entries[1])]})
        );
    }

    #[test]
    fn events_name_paths_under_the_watched_directory() {
        let mut change = Change {
            kind: FsEventKind::Create,
            path: "/home/user/d/sub/f".into(),
            entry: None,
        };
        assert_eq!(
            fs_event("/home/user/d/", &change),
            json!({"name": "sub/f", "type": "EVENT_TYPE_CREATE"})
        );
        change.entry = Some(info(FileKind::File));
        let event = fs_event("/home/user/d", &change);
        assert_eq!(event["entry"], entry(&info(FileKind::File)));
    }

    #[test]
    fn metadata_is_the_e2b_attributes_without_their_prefix() {
        let mut tagged = info(FileKind::File);
        tagged.xattrs = BTreeMap::from([
            ("user.e2b.author".to_owned(), "me".to_owned()),
            ("user.e2b.purpose".to_owned(), "a test".to_owned()),
        ]);
        let value = entry(&tagged);
        assert_eq!(
            value["metadata"],
            json!({"author": "me", "purpose": "a test"})
        );
        assert!(entry(&info(FileKind::File)).get("metadata").is_none());
    }

    #[test]
    fn watches_refuse_network_mounts_unless_allowed() {
        let plain: FsRequest = connect::decode(br#"{"path":"/a","includeEntry":true}"#).unwrap();
        let options = plain.watch_options();
        assert!(options.local_only && options.entries);
        assert_eq!(options.xattrs.as_deref(), Some("user.e2b."));
        let allowed: FsRequest =
            connect::decode(br#"{"path":"/a","allowNetworkMounts":true}"#).unwrap();
        assert!(!allowed.watch_options().local_only);
        assert!(!allowed.watch_options().entries);
    }

    #[test]
    fn requests_take_camel_and_snake_case() {
        let a: FsRequest = connect::decode(br#"{"watcherId":"w-1:/x"}"#).unwrap();
        let b: FsRequest = connect::decode(br#"{"watcher_id":"w-1:/x"}"#).unwrap();
        assert_eq!(a.watcher_id, b.watcher_id);
        let c: FsRequest =
            connect::decode(br#"{"path":"/a","depth":2,"includeEntry":true}"#).unwrap();
        assert!(c.include_entry);
        assert_eq!(c.depth, 2);
    }
}
