//! The e2b Template SDK's routes on a real daemon, as the SDK calls them,
//! without running a build: requesting builds, upload URLs, the uploads
//! themselves (good, hostile, too large), the build body's refusals, the
//! status of a build not started, aliases. The builds themselves run in
//! `tests/e2b/test_template_build.py` (the `e2b_sdk` harness).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{e2b, Answer, TestDaemon};
use common::store::{staging_entries, unowned};
use serde_json::{json, Value};
use std::io::Write;

const HASH: &str = "5f36b2ea290645ee34d943220a14b54ee5ea5be5f1c2a4c1d7a7b1a1f4e1e7de";

fn assert_e2b_error(answer: &Answer, status: u16, needle: &str) {
    assert_eq!(answer.status, status, "{}", answer.text());
    let body = answer.json();
    assert_eq!(body["code"], status, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
}

/// A tar of `entries` (name, contents), gzipped when `gzip`.
fn archive(entries: &[(&str, &[u8])], gzip: bool) -> Vec<u8> {
    archive_of(entries, &[], gzip)
}

/// A tar of `entries` (name, contents) after symbolic links (name,
/// target), gzipped when `gzip`.
fn archive_of(entries: &[(&str, &[u8])], links: &[(&str, &str)], gzip: bool) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, target) in links {
        let mut header = tar::Header::new_ustar();
        header.set_size(0);
        header.set_mode(0o777);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_link_name(target).unwrap();
        header.set_path(name).unwrap();
        header.set_cksum();
        builder.append(&header, std::io::empty()).unwrap();
    }
    for (name, data) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_uid(1000);
        header.set_gid(1000);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        // Written by hand: `set_path` refuses the hostile names on purpose.
        let bytes = header.as_mut_bytes();
        bytes[..100].fill(0);
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        header.set_cksum();
        builder.append(&header, *data).unwrap();
    }
    let tar = builder.into_inner().unwrap();
    if !gzip {
        return tar;
    }
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(&tar).unwrap();
    encoder.finish().unwrap()
}

/// `POST /v3/templates` for `name`: its answer.
fn request_build(daemon: &TestDaemon, body: Value) -> Value {
    let answer = e2b(daemon, "POST", "/v3/templates", Some(body));
    assert_eq!(answer.status, 202, "{}", answer.text());
    answer.json()
}

/// The upload URL's path and query for `hash` of template `id`.
fn upload_path(daemon: &TestDaemon, id: &str, hash: &str) -> String {
    let answer = e2b(
        daemon,
        "GET",
        &format!("/templates/{id}/files/{hash}"),
        None,
    );
    assert_eq!(answer.status, 201, "{}", answer.text());
    let body = answer.json();
    assert_eq!(body["present"], false);
    let url = body["url"].as_str().unwrap();
    assert!(
        url.starts_with(&daemon.url),
        "{url} is not absolute on {}",
        daemon.url
    );
    assert!(url.contains("token="), "{url}");
    url[daemon.url.len()..].to_owned()
}

/// A PUT as the new SDKs send it: no API key.
fn put(daemon: &TestDaemon, path: &str, body: &[u8]) -> Answer {
    daemon.call_as(None, "PUT", path, Some(body), None, &[])
}

#[test]
fn builds_are_requested_with_stable_template_ids_and_fresh_build_ids() {
    let daemon = TestDaemon::start(&[]);
    let first = request_build(
        &daemon,
        json!({"name": "tpl-a", "cpuCount": 2, "memoryMB": 1024}),
    );
    for field in [
        "templateID",
        "buildID",
        "public",
        "names",
        "tags",
        "aliases",
    ] {
        assert!(first.get(field).is_some(), "{field} missing from {first}");
    }
    assert_eq!(first["names"], json!(["tpl-a"]));
    assert_eq!(first["tags"], json!(["default"]));
    // e2b 2.7's `alias`, a tag in the name, unknown fields.
    let second = request_build(
        &daemon,
        json!({"alias": "tpl-a:v2", "minFreeDiskMb": 0, "teamID": "x"}),
    );
    assert_eq!(second["templateID"], first["templateID"]);
    assert_ne!(second["buildID"], first["buildID"]);
    assert_eq!(second["tags"], json!(["v2"]));
    let build_id = first["buildID"].as_str().unwrap();
    assert_eq!(build_id.len(), 36, "{build_id} is not a UUID");

    // Not started: waiting, no logs.
    let id = first["templateID"].as_str().unwrap();
    let status = e2b(
        &daemon,
        "GET",
        &format!("/templates/{id}/builds/{build_id}/status?logsOffset=0&limit=100"),
        None,
    );
    assert_eq!(status.status, 200, "{}", status.text());
    let status = status.json();
    assert_eq!(status["status"], "waiting");
    assert_eq!(status["logs"], json!([]));
    assert_eq!(status["logEntries"], json!([]));

    for (body, needle) in [
        (json!({}), "name is required"),
        (json!({"name": "team/tpl"}), "namespaced"),
        (json!({"name": "host"}), "cannot name a template"),
        (json!({"name": "x", "tags": ["a b"]}), "is not a tag"),
    ] {
        assert_e2b_error(
            &e2b(&daemon, "POST", "/v3/templates", Some(body)),
            400,
            needle,
        );
    }
    // Unknown builds and templates.
    assert_e2b_error(
        &e2b(
            &daemon,
            "GET",
            &format!("/templates/{id}/builds/0f8e5a52-8a3c-4d6e-9b1f-2c3d4e5f6a7b/status"),
            None,
        ),
        404,
        "not found",
    );
    assert_e2b_error(
        &e2b(&daemon, "GET", "/templates/aliases/tpl-a", None),
        404,
        "not found",
    );
    assert_e2b_error(
        &e2b(&daemon, "DELETE", "/templates/nope", None),
        404,
        "not found",
    );
    // Without a key.
    let answer = daemon.call_as(
        None,
        "POST",
        "/v3/templates",
        Some(br#"{"name":"x"}"#),
        Some("application/json"),
        &[],
    );
    assert_eq!(answer.status, 401);
}

#[test]
fn uploads_take_their_token_refuse_hostile_and_oversized_archives_and_leave_nothing() {
    let daemon = TestDaemon::start(&["--max-upload", "64K"]);
    let build = request_build(&daemon, json!({"name": "tpl-up"}));
    let id = build["templateID"].as_str().unwrap();

    assert_e2b_error(
        &e2b(
            &daemon,
            "GET",
            &format!("/templates/{id}/files/not-a-hash"),
            None,
        ),
        400,
        "Invalid files hash",
    );
    assert_e2b_error(
        &e2b(
            &daemon,
            "GET",
            &format!("/templates/{id}/files/{}", HASH.to_uppercase()),
            None,
        ),
        400,
        "Invalid files hash",
    );
    assert_e2b_error(
        &e2b(
            &daemon,
            "GET",
            &format!("/templates/tnope/files/{HASH}"),
            None,
        ),
        404,
        "not found",
    );

    let path = upload_path(&daemon, id, HASH);
    let good = archive(&[("hello.txt", b"hello\n")], true);
    // No token, a wrong one.
    let bare = path.split('?').next().unwrap().to_owned();
    assert_eq!(put(&daemon, &bare, &good).status, 401);
    assert_eq!(
        put(&daemon, &format!("{bare}?token=upl-wrong"), &good).status,
        403
    );

    // Hostile entries: refused, nothing kept, the URL used up.
    for hostile in [
        archive(&[("../evil", b"x")], true),
        archive(&[("a/../../evil", b"x")], false),
        archive_of(&[("out/evil", b"x")], &[("out", "/tmp")], false),
        b"not a tar at all, just bytes".repeat(40),
    ] {
        let path = upload_path(&daemon, id, HASH);
        let answer = put(&daemon, &path, &hostile);
        assert_e2b_error(&answer, 400, "the build context");
        assert_eq!(put(&daemon, &path, &good).status, 403, "a token works once");
        assert_eq!(staging_entries(&daemon), 0, "a refused upload left files");
    }
    assert!(!daemon.data_dir().join("evil").exists());
    assert!(!std::path::Path::new("/tmp/evil").exists());

    // Over --max-upload as sent: 413 (small enough past the limit that the
    // client has sent it all before the answer closes the connection).
    let big: Vec<u8> = (0..70_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let oversized = archive(&[("big.bin", &big)], false);
    let path = upload_path(&daemon, id, HASH);
    assert_e2b_error(&put(&daemon, &path, &oversized), 413, "larger than");
    assert_eq!(staging_entries(&daemon), 0);
    // Small as sent, over the limit unpacked (a gzip of zeros): refused.
    let zeros = vec![0u8; 4 << 20];
    let bomb = archive(&[("zeros.bin", &zeros)], true);
    assert!(bomb.len() < 64 << 10, "{} bytes", bomb.len());
    let path = upload_path(&daemon, id, HASH);
    assert_e2b_error(&put(&daemon, &path, &bomb), 400, "the build context");
    assert_eq!(staging_entries(&daemon), 0);

    // A good one, plain or gzip: present afterwards.
    let path = upload_path(&daemon, id, HASH);
    let answer = put(&daemon, &path, &good);
    assert_eq!(answer.status, 204, "{}", answer.text());
    let present = e2b(
        &daemon,
        "GET",
        &format!("/templates/{id}/files/{HASH}"),
        None,
    );
    assert_eq!(present.status, 201);
    assert_eq!(present.json(), json!({"present": true}));
    let other = HASH.replace('5', "6");
    let path = upload_path(&daemon, id, &other);
    assert_eq!(
        put(&daemon, &path, &archive(&[("a/b.txt", b"b")], false)).status,
        204
    );
    // Held by the dialect for the build: owned, not strays.
    assert!(unowned(&daemon).ends_with(" 0"), "{}", unowned(&daemon));
}

#[test]
fn build_bodies_are_checked_before_anything_runs() {
    let daemon = TestDaemon::start(&[]);
    let build = request_build(&daemon, json!({"name": "tpl-steps"}));
    let id = build["templateID"].as_str().unwrap();
    let build_id = build["buildID"].as_str().unwrap();
    let route = format!("/v2/templates/{id}/builds/{build_id}");
    let start = |body: Value| e2b(&daemon, "POST", &route, Some(body));

    assert_e2b_error(
        &start(json!({"fromImage": "e2bdev/base", "steps": [
            {"type": "RUN", "args": ["true"], "force": false},
            {"type": "HEALTHCHECK", "args": ["x"], "force": false}]})),
        400,
        "step 2: the step type \"HEALTHCHECK\" is not supported",
    );
    assert_e2b_error(
        &start(json!({"steps": []})),
        400,
        "exactly one of fromImage and fromTemplate",
    );
    assert_e2b_error(
        &start(json!({"fromTemplate": "no-such-template"})),
        400,
        "no-such-template",
    );
    assert_e2b_error(
        &start(json!({"fromImage": "e2bdev/base", "steps": [
            {"type": "COPY", "args": ["a", "/a"], "filesHash": HASH, "force": false}]})),
        400,
        "were not uploaded",
    );
    assert_e2b_error(
        &start(json!({"fromImage": "e2bdev/base", "steps": [
            {"type": "ENV", "args": ["ODD"], "force": false}]})),
        400,
        "step 1: ENV takes an even number",
    );
    assert_e2b_error(&e2b(&daemon, "POST", &route, None), 400, "exactly one of");
    // Still waiting: nothing ran.
    let status = e2b(
        &daemon,
        "GET",
        &format!("/templates/{id}/builds/{build_id}/status"),
        None,
    );
    assert_eq!(status.json()["status"], "waiting");
    assert_e2b_error(
        &e2b(
            &daemon,
            "POST",
            &format!("/v2/templates/{id}/builds/0f8e5a52-8a3c-4d6e-9b1f-2c3d4e5f6a7b"),
            Some(json!({"fromImage": "e2bdev/base"})),
        ),
        404,
        "not found",
    );
}
