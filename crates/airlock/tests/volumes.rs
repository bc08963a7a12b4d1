//! Named volumes through the daemon, on every tier: a volume outlives its
//! sandboxes and carries files between them, with the owners the sandbox
//! gave them whatever host ids each tier maps; it holds no more than its
//! quota; read-only mounts are read-only; a mounted volume cannot be
//! deleted; its files can be read and written from the host API, where
//! links a sandbox planted never reach the host's files; and deleting it
//! leaves nothing on disk. Needs root, btrfs-progs and busybox-static.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::*;
use common::images::{busybox_layer, config, docker_save, layer, Entry};
use common::store::import_ok;
use serde_json::{json, Value};

const TIERS: [&str; 3] = ["process", "oci", "gvisor"];

/// Imports template `tiny`: busybox with a few more tools.
fn tiny(daemon: &TestDaemon) {
    let dir = tempfile::tempdir().unwrap();
    let tools: Vec<String> = ["stat", "dd", "ln", "id", "touch"]
        .iter()
        .map(|tool| format!("bin/{tool}"))
        .collect();
    let entries: Vec<Entry> = tools
        .iter()
        .map(|tool| Entry::Symlink(tool, "busybox"))
        .collect();
    let layers = vec![busybox_layer(), layer(&entries)];
    let archive = dir.path().join("tiny.tar");
    let image = docker_save(&layers, &config(&layers, &["PATH=/bin"], "/"), "tiny:1");
    std::fs::write(&archive, image).unwrap();
    import_ok(daemon, &archive, "tiny");
}

fn volume_dirs(daemon: &TestDaemon) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(daemon.data_dir().join("disk/volumes"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn entry(daemon: &TestDaemon, volume: &str, path: &str) -> (u16, Value) {
    let answer = daemon.call(
        "GET",
        &format!("/v1/volumes/{volume}/path?path={path}"),
        None,
    );
    let body = if answer.status == 200 {
        answer.json()
    } else {
        Value::Null
    };
    (answer.status, body)
}

#[test]
fn a_volume_carries_files_between_sandboxes_under_its_quota_on_every_tier() {
    let _serial = serial();
    let cleanup = SupervisorCleanup::default();
    let daemon = TestDaemon::start(&[]);
    tiny(&daemon);
    let made = daemon.call(
        "POST",
        "/v1/volumes",
        Some(json!({"name": "data", "quota": "8M"})),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let volume = made.json()["id"].as_str().unwrap().to_owned();
    assert!(volume.starts_with("vol-"), "{volume}");
    assert_eq!(made.json()["quota_bytes"], 8 << 20);
    assert_eq!(volume_dirs(&daemon), std::slice::from_ref(&volume));
    // A name is the key's own: taken twice is 409; another key sees none.
    let again = daemon.call("POST", "/v1/volumes", Some(json!({"name": "data"})));
    assert_eq!(again.status, 409, "{}", again.text());
    let bad = daemon.call("POST", "/v1/volumes", Some(json!({"name": "../x"})));
    assert_eq!(bad.status, 400, "{}", bad.text());
    let other = daemon.new_key("other");
    let other_key = other["key"].as_str().unwrap().to_owned();
    let theirs = daemon.call_as(
        Some(&other_key),
        "POST",
        "/v1/sandboxes",
        Some(
            json!({"template": "tiny", "volumes": [{"name": volume, "path": "/mnt/data"}]})
                .to_string()
                .as_bytes(),
        ),
        Some("application/json"),
        &[],
    );
    assert_eq!(theirs.status, 404, "{}", theirs.text());

    let mut previous: Option<&str> = None;
    for tier in TIERS {
        let id = id_of(&daemon.create(json!({
            "tier": tier, "template": "tiny",
            "volumes": [{"name": "data", "path": "/mnt/data"}],
        })));
        cleanup.add(&id);
        // What the sandbox before wrote, as it wrote it, owned by `user`.
        if let Some(before) = previous {
            let seen = daemon.sh_ok(
                &id,
                "cat /mnt/data/from-$(echo x); stat -c '%u %g' /mnt/data/hello",
            );
            assert_eq!(seen, format!("{before}\n1000 1000\n"), "{tier}");
        }
        daemon.sh_ok(
            &id,
            &format!(
                "id -u; echo hi > /mnt/data/hello; echo {tier} > /mnt/data/from-x; \
                 stat -c '%u %g' /mnt/data/hello"
            ),
        );
        assert_eq!(
            daemon.sh_ok(&id, "stat -c '%u' /mnt/data/hello"),
            "1000\n",
            "{tier}"
        );
        // The quota holds: a write past it fails in the sandbox.
        let (out, code) = daemon.sh_out(
            &id,
            "dd if=/dev/zero of=/mnt/data/big bs=1M count=16 2>&1; echo; rm -f /mnt/data/big",
        );
        assert!(
            out.contains("quota") || out.contains("space"),
            "{tier}: {code}: {out}"
        );
        // Mounted: it cannot be deleted.
        let busy = daemon.call("DELETE", &format!("/v1/volumes/{volume}"), None);
        assert_eq!(busy.status, 409, "{tier}: {}", busy.text());
        assert_eq!(
            daemon.call("GET", "/v1/volumes/data", None).json()["mounted_by"],
            json!(id)
        );
        let gone = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
        assert_eq!(gone.status, 204, "{}", gone.text());
        previous = Some(tier);
    }
    // Read-only, in a sandbox running as root: nothing can be written.
    let id = id_of(&daemon.create(json!({
        "template": "tiny", "user": "root",
        "volumes": [{"name": volume, "path": "/srv/ro", "read_only": true}],
    })));
    cleanup.add(&id);
    let (out, code) = daemon.sh_out(&id, "cat /srv/ro/hello; touch /srv/ro/new 2>&1");
    assert_ne!(code, 0, "{out}");
    assert!(
        out.starts_with("hi\n") && out.contains("Read-only"),
        "{out}"
    );
    assert_eq!(
        daemon
            .call("DELETE", &format!("/v1/sandboxes/{id}"), None)
            .status,
        204
    );

    // The host API: files in and out without a sandbox.
    let put = daemon.call_as(
        Some(&daemon.key),
        "PUT",
        "/v1/volumes/data/file?path=/in/host.txt",
        Some(b"from the host"),
        Some("application/octet-stream"),
        &[],
    );
    assert_eq!(put.status, 404, "no parent: {}", put.text());
    let dir = daemon.call("POST", "/v1/volumes/data/dir?path=/in&mode=448", None);
    assert_eq!(dir.status, 201, "{}", dir.text());
    assert_eq!(dir.json()["mode"], 0o700);
    assert_eq!(dir.json()["uid"], 1000);
    let put = daemon.call_as(
        Some(&daemon.key),
        "PUT",
        "/v1/volumes/data/file?path=/in/host.txt&mode=420",
        Some(b"from the host"),
        Some("application/octet-stream"),
        &[],
    );
    assert_eq!(put.status, 201, "{}", put.text());
    assert_eq!(put.json()["size"], 13);
    assert_eq!(put.json()["mode"], 0o644);
    let twice = daemon.call_as(
        Some(&daemon.key),
        "PUT",
        "/v1/volumes/data/file?path=/in/host.txt",
        Some(b"x"),
        None,
        &[],
    );
    assert_eq!(twice.status, 409, "{}", twice.text());
    let read = daemon.call("GET", "/v1/volumes/data/file?path=/in/host.txt", None);
    assert_eq!(read.text(), "from the host");
    let listed = daemon.call("GET", "/v1/volumes/data/dir?path=/&depth=2", None);
    let paths: Vec<String> = listed
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        paths,
        ["/from-x", "/hello", "/in", "/in/host.txt"],
        "{paths:?}"
    );

    // Links a sandbox plants stay inside the volume.
    let id = id_of(&daemon.create(json!({
        "template": "tiny", "user": "root",
        "volumes": [{"name": "data", "path": "/mnt/data"}],
    })));
    cleanup.add(&id);
    daemon.sh_ok(
        &id,
        "ln -s /etc/shadow /mnt/data/shadow && ln -s / /mnt/data/root && \
         ln -s ../../../../etc/passwd /mnt/data/up && cat /mnt/data/in/host.txt",
    );
    let shadow_mode = std::fs::metadata("/etc/shadow").map(|m| m.len());
    for path in ["/shadow", "/up", "/root/etc/passwd", "/../../etc/passwd"] {
        let read = daemon.call("GET", &format!("/v1/volumes/data/file?path={path}"), None);
        assert_eq!(read.status, 404, "{path}: {}", read.text());
    }
    let chmod = daemon.call_as(
        Some(&daemon.key),
        "PATCH",
        "/v1/volumes/data/path?path=/shadow",
        Some(br#"{"mode": 511}"#),
        Some("application/json"),
        &[],
    );
    assert_eq!(chmod.status, 400, "{}", chmod.text());
    let (status, link) = entry(&daemon, "data", "/shadow");
    assert_eq!(status, 200);
    assert_eq!(link["type"], "symlink");
    assert_eq!(link["target"], "/etc/shadow");
    let removed = daemon.call("DELETE", "/v1/volumes/data/path?path=/root", None);
    assert_eq!(removed.status, 204, "{}", removed.text());
    assert!(std::path::Path::new("/etc/passwd").exists());
    assert_eq!(
        std::fs::metadata("/etc/shadow").map(|m| m.len()).ok(),
        shadow_mode.ok()
    );
    let removed = daemon.call("DELETE", "/v1/volumes/data/path?path=/in", None);
    assert_eq!(removed.status, 204, "{}", removed.text());
    assert_eq!(entry(&daemon, "data", "/in").0, 404);
    assert_eq!(
        daemon
            .call("DELETE", &format!("/v1/sandboxes/{id}"), None)
            .status,
        204
    );

    // Deleted, it leaves nothing; its id is gone.
    let deleted = daemon.call("DELETE", "/v1/volumes/data", None);
    assert_eq!(deleted.status, 204, "{}", deleted.text());
    assert!(
        volume_dirs(&daemon).is_empty(),
        "{:?}",
        volume_dirs(&daemon)
    );
    assert_eq!(
        daemon
            .call("GET", &format!("/v1/volumes/{volume}"), None)
            .status,
        404
    );
    let refused = daemon.call(
        "POST",
        "/v1/sandboxes",
        Some(json!({"template": "tiny", "volumes": [{"name": "data", "path": "/mnt/data"}]})),
    );
    assert_eq!(refused.status, 404, "{}", refused.text());
}
