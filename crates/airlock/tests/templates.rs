//! Templates from image archives: `airlock template import` of docker-save
//! and OCI-layout archives built here, sandboxes on them (owners kept,
//! whiteouts and opaque directories honoured, the image's env and working
//! directory applied, the shared layers never written), one copy of a
//! layer two templates share, digests checked, and a collector that
//! removes exactly what nothing references, including what an import
//! killed half-way left. Needs root and busybox-static.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::TestDaemon;
use common::images::{busybox_layer, config, docker_save, layer, oci_layout, sha256, Entry};
use common::store::{import, import_ok, layer_dirs, staging_entries, unowned};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The layers of the test image: busybox and /etc, then data with a
/// secret only root may read, then a layer deleting and hiding some of it.
fn image_layers() -> Vec<Vec<u8>> {
    vec![
        busybox_layer(),
        layer(&[
            Entry::Dir("data", 0o755, 1000, 1000),
            Entry::File("data/keep", b"kept\n", 0o644, 1000, 1000),
            Entry::File("data/gone", b"deleted above\n", 0o644, 0, 0),
            Entry::Dir("odir", 0o755, 0, 0),
            Entry::File("odir/old", b"hidden above\n", 0o644, 0, 0),
            Entry::File("etc/secret", b"root only\n", 0o600, 0, 0),
            Entry::File("etc/motd", b"from the image\n", 0o644, 0, 0),
        ]),
        layer(&[
            Entry::Whiteout("data/gone"),
            Entry::Opaque("odir"),
            Entry::File("odir/new", b"new\n", 0o644, 0, 0),
        ]),
    ]
}

fn image_config(layers: &[Vec<u8>]) -> Vec<u8> {
    config(layers, &["FROM_IMAGE=yes", "PATH=/bin:/usr/bin"], "/data")
}

fn write_archive(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
    path
}

fn exec(daemon: &TestDaemon, id: &str, user: &str, script: &str) -> (String, String, i64) {
    let answer = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": "/bin/sh", "args": ["-c", script], "user": user})),
    );
    assert_eq!(answer.status, 200, "exec: {}", answer.text());
    let (mut out, mut err, mut code) = (String::new(), String::new(), -1);
    for line in answer.text().lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        match event["type"].as_str() {
            Some("stdout") => out.push_str(event["data"].as_str().unwrap_or_default()),
            Some("stderr") => err.push_str(event["data"].as_str().unwrap_or_default()),
            Some("exited") => code = event["exit_code"].as_i64().unwrap_or(-1),
            _ => {}
        }
    }
    (out, err, code)
}

fn gc(daemon: &TestDaemon) -> Value {
    let answer = daemon.call("POST", "/v1/gc", None);
    assert_eq!(answer.status, 200, "gc: {}", answer.text());
    answer.json()
}

#[test]
fn an_imported_image_runs_with_its_owners_whiteouts_env_and_workdir() {
    let daemon = TestDaemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let layers = image_layers();
    let archive = write_archive(
        dir.path(),
        "demo.tar",
        &docker_save(&layers, &image_config(&layers), "demo:1"),
    );
    import_ok(&daemon, &archive, "demo");

    let shown = daemon.call("GET", "/v1/templates/demo", None);
    assert_eq!(shown.status, 200, "{}", shown.text());
    let shown = shown.json();
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256(l)).collect();
    let listed: Vec<&str> = shown["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["diff_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, diff_ids);

    let created = daemon.create(json!({"template": "demo"}));
    let id = created["id"].as_str().unwrap();
    // Root-owned files are root's inside (not nobody's), the user's the
    // user's; what the top layer deleted or hid is gone.
    let (out, err, code) = exec(
        &daemon,
        id,
        "user",
        "stat -c '%u:%g %a %n' /etc/secret /data/keep /bin/busybox; \
         test -e /data/gone || echo gone-is-gone; ls /odir; echo $FROM_IMAGE; pwd; \
         cat /etc/secret",
    );
    assert_eq!(
        out,
        "0:0 600 /etc/secret\n1000:1000 644 /data/keep\n0:0 755 /bin/busybox\n\
         gone-is-gone\nnew\nyes\n/data\n",
        "stderr: {err}"
    );
    assert_ne!(code, 0, "the user read a root-only file: {err}");
    assert!(err.contains("Permission denied"), "{err}");
    let (out, err, code) = exec(
        &daemon,
        id,
        "root",
        "cat /etc/secret && echo changed > /etc/motd && cat /etc/motd && id -u",
    );
    assert_eq!(
        (out.as_str(), code),
        ("root only\nchanged\n0\n", 0),
        "{err}"
    );

    // The write went to the sandbox's own layer; the shared one is as
    // imported.
    let motd_layer = daemon
        .data_dir()
        .join("layers/sha256")
        .join(&diff_ids[1][7..])
        .join("etc/motd");
    assert_eq!(
        std::fs::read_to_string(motd_layer).unwrap(),
        "from the image\n"
    );
    let answer = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(answer.status, 204);
    assert!(unowned(&daemon).ends_with(" 0"), "{}", unowned(&daemon));
}

#[test]
fn two_templates_share_one_copy_and_the_collector_removes_only_the_unreferenced() {
    let daemon = TestDaemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let layers = image_layers();
    let one = write_archive(
        dir.path(),
        "one.tar",
        &docker_save(&layers, &image_config(&layers), "one:1"),
    );
    // The same first two layers, gzipped in an OCI layout, and one of its own.
    let mut other_layers = layers[..2].to_vec();
    other_layers.push(layer(&[Entry::File("other", b"other\n", 0o644, 0, 0)]));
    let other = write_archive(
        dir.path(),
        "other.tar",
        &oci_layout(&other_layers, &image_config(&other_layers), "other:1"),
    );
    import_ok(&daemon, &one, "one");
    import_ok(&daemon, &other, "other");
    let all: Vec<String> = {
        let mut ids: Vec<String> = layers
            .iter()
            .chain(&other_layers[2..])
            .map(|l| sha256(l))
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(
        layer_dirs(&daemon),
        all,
        "a shared layer was unpacked twice"
    );

    // A sandbox of `other` keeps its layers after the template goes.
    let created = daemon.create(json!({"template": "other"}));
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(
        daemon.call("DELETE", "/v1/templates/other", None).status,
        204
    );
    assert_eq!(daemon.call("GET", "/v1/templates/other", None).status, 404);
    let collected = gc(&daemon);
    assert_eq!(collected["layers"], json!([]), "{collected}");
    assert_eq!(layer_dirs(&daemon), all);
    let (out, _, _) = exec(&daemon, &id, "user", "cat /other");
    assert_eq!(out, "other\n");

    // Once it is gone, only the layer no other template stacks goes.
    assert_eq!(
        daemon
            .call("DELETE", &format!("/v1/sandboxes/{id}"), None)
            .status,
        204
    );
    let collected = gc(&daemon);
    assert_eq!(
        collected["layers"],
        json!([sha256(&other_layers[2])]),
        "{collected}"
    );
    let mut kept: Vec<String> = layers.iter().map(|l| sha256(l)).collect();
    kept.sort();
    assert_eq!(layer_dirs(&daemon), kept);

    // And the rest with the last template.
    let out = Command::new(common::binary())
        .args([
            "template",
            "rm",
            "one",
            "--url",
            &daemon.url,
            "--api-key",
            &daemon.key,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let collected = gc(&daemon);
    assert_eq!(
        collected["layers"].as_array().unwrap().len(),
        3,
        "{collected}"
    );
    assert!(layer_dirs(&daemon).is_empty());
    assert_eq!(staging_entries(&daemon), 0);
    assert!(unowned(&daemon).ends_with(" 0"), "{}", unowned(&daemon));
}

#[test]
fn an_archive_whose_blob_does_not_match_its_digest_is_refused_and_leaves_nothing() {
    let daemon = TestDaemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let layers = image_layers();
    let mut bytes = oci_layout(&layers, &image_config(&layers), "bad:1");
    // Change one byte inside the last layer's gzip stream (the archive's
    // files are in order: config, then the layers).
    let gz = common::images::gzip(&layers[2]);
    let at = bytes
        .windows(gz.len())
        .position(|w| w == gz.as_slice())
        .expect("the layer is in the archive");
    bytes[at + gz.len() / 2] ^= 0x55;
    let archive = write_archive(dir.path(), "bad.tar", &bytes);
    let out = import(&daemon, &archive, "bad");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("digest") || stderr.contains("corrupt") || stderr.contains("not valid"),
        "{stderr}"
    );
    assert_eq!(daemon.call("GET", "/v1/templates/bad", None).status, 404);
    assert_eq!(
        staging_entries(&daemon),
        0,
        "the failed import left staging behind"
    );
    // The layers before the bad one were whole and checked: recorded, and
    // referenced by nothing, so the collector takes them.
    gc(&daemon);
    assert!(layer_dirs(&daemon).is_empty());
    assert!(unowned(&daemon).ends_with(" 0"), "{}", unowned(&daemon));

    // Not an image at all.
    let junk = write_archive(dir.path(), "junk.tar", b"not a tar at all");
    assert!(!import(&daemon, &junk, "junk").status.success());
    assert_eq!(staging_entries(&daemon), 0);
}

#[test]
fn an_unknown_template_is_404_and_a_pinned_digest_must_match() {
    let daemon = TestDaemon::start(&[]);
    let answer = daemon.call("POST", "/v1/sandboxes", Some(json!({"template": "nope"})));
    assert_eq!(answer.status, 404, "{}", answer.text());
    let dir = tempfile::tempdir().unwrap();
    let layers = vec![busybox_layer()];
    let config = image_config(&layers);
    let archive = write_archive(
        dir.path(),
        "pin.tar",
        &docker_save(&layers, &config, "pin:1"),
    );
    import_ok(&daemon, &archive, "pin");
    let digest = sha256(&config);
    let created = daemon.create(json!({"template": format!("pin@{digest}")}));
    let id = created["id"].as_str().unwrap();
    assert_eq!(
        daemon
            .call("DELETE", &format!("/v1/sandboxes/{id}"), None)
            .status,
        204
    );
    let wrong = format!("pin@sha256:{}", "0".repeat(64));
    let answer = daemon.call("POST", "/v1/sandboxes", Some(json!({"template": wrong})));
    assert_eq!(answer.status, 404, "{}", answer.text());
}

#[test]
fn an_import_killed_half_way_leaves_nothing_after_the_restart() {
    let mut daemon = TestDaemon::start(&[]);
    // An upload that never finishes: its staging entry exists, locked.
    let address = daemon.url.trim_start_matches("http://").to_owned();
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    write!(
        stream,
        "POST /v1/templates/half/import HTTP/1.1\r\nHost: x\r\nX-API-Key: {}\r\n\
         Content-Type: application/x-tar\r\nContent-Length: 100000000\r\n\r\n",
        daemon.key
    )
    .unwrap();
    stream.write_all(&vec![0u8; 4 << 20]).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while staging_entries(&daemon) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the upload was never staged"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    daemon.kill9();
    drop(stream);
    assert_eq!(
        staging_entries(&daemon),
        1,
        "the killed import's staging is there"
    );
    daemon.restart();
    // The collector runs at start.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while staging_entries(&daemon) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned upload was not collected"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(unowned(&daemon).ends_with(" 0"), "{}", unowned(&daemon));
}

#[test]
fn a_templates_sbom_lists_the_packages_its_layers_hold() {
    let daemon = TestDaemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let status = b"Package: tzdata\nStatus: install ok installed\nArchitecture: all\nVersion: 2024a-0+deb12u1\n\n\
Package: removed\nStatus: deinstall ok config-files\nArchitecture: amd64\nVersion: 1\n\n";
    let layers = vec![
        busybox_layer(),
        layer(&[
            Entry::Dir("var", 0o755, 0, 0),
            Entry::Dir("var/lib", 0o755, 0, 0),
            Entry::Dir("var/lib/dpkg", 0o755, 0, 0),
            Entry::File("var/lib/dpkg/status", status, 0o644, 0, 0),
            Entry::File(
                "etc/os-release",
                b"ID=debian\nVERSION_ID=\"12\"\n",
                0o644,
                0,
                0,
            ),
            Entry::Dir("usr/lib/python3", 0o755, 0, 0),
            Entry::Dir("usr/lib/python3/dist-packages", 0o755, 0, 0),
            Entry::Dir(
                "usr/lib/python3/dist-packages/Requests-2.28.1.dist-info",
                0o755,
                0,
                0,
            ),
            Entry::File(
                "usr/lib/python3/dist-packages/Requests-2.28.1.dist-info/METADATA",
                b"Metadata-Version: 2.1\nName: Requests\nVersion: 2.28.1\n",
                0o644,
                0,
                0,
            ),
        ]),
    ];
    let archive = write_archive(
        dir.path(),
        "pkgs.tar",
        &docker_save(&layers, &image_config(&layers), "pkgs:1"),
    );
    import_ok(&daemon, &archive, "pkgs");
    let answer = daemon.call("GET", "/v1/templates/pkgs/sbom", None);
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        answer.content_type.as_deref(),
        Some("application/vnd.cyclonedx+json")
    );
    let document = answer.json();
    assert_eq!(document["bomFormat"], "CycloneDX");
    let purls: Vec<&str> = document["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["purl"].as_str().unwrap())
        .collect();
    assert_eq!(
        purls,
        [
            "pkg:deb/debian/tzdata@2024a-0%2Bdeb12u1?arch=all",
            "pkg:pypi/requests@2.28.1"
        ]
    );
    // The same template, the same document.
    assert_eq!(
        daemon.call("GET", "/v1/templates/pkgs/sbom", None).body,
        answer.body
    );
    let missing = daemon.call("GET", "/v1/templates/nothing/sbom", None);
    assert_eq!(missing.status, 404, "{}", missing.text());
}

#[test]
fn an_image_without_the_user_account_gains_it_and_keeps_its_own() {
    let daemon = TestDaemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    // Like python:slim: root and a service account, no uid 1000.
    let layers = vec![
        busybox_layer(),
        layer(&[
            Entry::File(
                "etc/passwd",
                b"root:x:0:0:root:/root:/bin/sh\nsvc:x:999:999::/srv:/bin/sh",
                0o644,
                0,
                0,
            ),
            Entry::File("etc/group", b"root:x:0:\nsvc:x:999:\n", 0o644, 0, 0),
        ]),
    ];
    let archive = write_archive(
        dir.path(),
        "nouser.tar",
        &docker_save(
            &layers,
            &config(&layers, &["PATH=/bin:/usr/bin"], "/"),
            "nouser:1",
        ),
    );
    import_ok(&daemon, &archive, "nouser");
    let created = daemon.create(json!({"template": "nouser"}));
    let id = created["id"].as_str().unwrap();
    let (out, err, code) = exec(
        &daemon,
        id,
        "user",
        "id -un; id -gn; cat /etc/passwd /etc/group",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out,
        "user\nuser\nroot:x:0:0:root:/root:/bin/sh\nsvc:x:999:999::/srv:/bin/sh\n\
         user:x:1000:1000:user:/home/user:/bin/sh\nroot:x:0:\nsvc:x:999:\nuser:x:1000:\n"
    );
    // The template's own files are untouched: the account is the sandbox's.
    let store = daemon.data_dir().join("layers/sha256");
    let passwd = store.join(&sha256(&layers[1])[7..]).join("etc/passwd");
    assert!(!std::fs::read_to_string(passwd)
        .unwrap()
        .contains("user:x:1000"));
    daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
}
