//! Templates pulled from a real registry (Debian's `docker-registry` on
//! loopback, images pushed by `skopeo`): a pulled image runs with its
//! files and config, a second pull fetches nothing, pulls outside the
//! operator's allow-list or of unknown images or from a registry that is
//! down are refused clearly and leave nothing, credentials come from a
//! `docker login` file, a pull killed with -9 leaves nothing once the
//! collector has run, and with a signing key only images signed by it
//! (cosign's format) are pulled. Needs root, busybox-static,
//! docker-registry, skopeo and apache2-utils.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::TestDaemon;
use common::images::{busybox_layer, config, layer, oci_layout, sha256, Entry};
use common::registry::Registry;
use common::store::{layer_dirs, staging_entries, unowned};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn image_layers() -> Vec<Vec<u8>> {
    vec![
        busybox_layer(),
        layer(&[
            Entry::Dir("srv", 0o755, 0, 0),
            Entry::File("srv/hello", b"from the registry\n", 0o644, 0, 0),
            Entry::File("srv/mine", b"the user's\n", 0o600, 1000, 1000),
        ]),
    ]
}

/// An OCI-layout archive of `layers` tagged `v1`, in `dir`.
fn archive(dir: &Path, name: &str, layers: &[Vec<u8>]) -> PathBuf {
    let path = dir.join(name);
    let config = config(layers, &["PULLED=yes", "PATH=/bin:/usr/bin"], "/srv");
    std::fs::write(&path, oci_layout(layers, &config, "v1")).unwrap();
    path
}

/// `POST /v1/templates/NAME/pull`: the status and the NDJSON events.
fn pull(daemon: &TestDaemon, name: &str, image: &str) -> (u16, Vec<Value>) {
    let answer = daemon.call(
        "POST",
        &format!("/v1/templates/{name}/pull"),
        Some(json!({ "image": image })),
    );
    let status = answer.status;
    if status != 200 {
        return (status, vec![answer.json()]);
    }
    (status, answer.lines())
}

fn last(events: &[Value]) -> &Value {
    events.last().expect("no events")
}

fn pull_ok(daemon: &TestDaemon, name: &str, image: &str) -> Vec<Value> {
    let (status, events) = pull(daemon, name, image);
    assert_eq!(status, 200, "{events:?}");
    assert_eq!(last(&events)["type"], "done", "pull {image}: {events:?}");
    events
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

fn insecure(registry: &Registry) -> [String; 2] {
    ["--insecure-registry".into(), registry.addr.clone()]
}

fn start(args: &[String]) -> TestDaemon {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    TestDaemon::start(&args)
}

#[test]
fn a_pulled_image_runs_with_its_files_and_config_and_a_second_pull_fetches_nothing() {
    let registry = Registry::start();
    let layers = image_layers();
    let image = registry.push(
        &archive(&registry.scratch(), "app.tar", &layers),
        "v1",
        "team/app:v1",
    );
    let daemon = start(&insecure(&registry));

    let events = pull_ok(&daemon, "app", &image);
    let resolved = of_type(&events, "resolved");
    assert_eq!(resolved.len(), 1, "{events:?}");
    assert_eq!(resolved[0]["layers"], 2);
    assert_eq!(of_type(&events, "unpacked").len(), 2, "{events:?}");
    assert!(!of_type(&events, "downloading").is_empty(), "{events:?}");
    let template = &last(&events)["template"];
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256(l)).collect();
    let listed: Vec<&str> = template["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["diff_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, diff_ids);
    let source = template["source"].as_str().unwrap();
    assert!(
        source.starts_with(&format!("registry {image} (sha256:")),
        "{source}"
    );

    // The image's files, owners and config in a sandbox of it.
    let created = daemon.create(json!({"template": "app"}));
    let id = created["id"].as_str().unwrap();
    let (out, code) = daemon.sh_out(
        id,
        "cat /srv/hello; stat -c '%U %a' /srv/hello /srv/mine; echo $PULLED; pwd",
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out, "from the registry\nroot 644\nuser 600\nyes\n/srv\n",
        "the pulled image's files, owners, env and workdir"
    );

    // The same image again, under another name: every layer is cached.
    let again = pull_ok(&daemon, "app-again", &image);
    assert_eq!(of_type(&again, "cached").len(), 2, "{again:?}");
    assert!(of_type(&again, "downloading").is_empty(), "{again:?}");
    assert_eq!(of_type(&again, "resolved")[0]["bytes"], 0, "{again:?}");
    assert_eq!(layer_dirs(&daemon).len(), 2);

    // A digest pin: the manifest digest the first pull reported.
    let manifest = resolved[0]["manifest_digest"].as_str().unwrap();
    let pinned = format!("{}/team/app@{manifest}", registry.addr);
    pull_ok(&daemon, "app-pinned", &pinned);
    let wrong = format!("{}/team/app@sha256:{}", registry.addr, "0".repeat(64));
    let (_, events) = pull(&daemon, "app-wrong", &wrong);
    assert_eq!(last(&events)["type"], "error", "{events:?}");
    assert_eq!(last(&events)["code"], "not_found", "{events:?}");

    daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert!(unowned(&daemon).ends_with(" 0"), "{}", unowned(&daemon));
}

#[test]
fn pulls_the_daemon_may_not_make_are_refused_clearly_and_leave_nothing() {
    let mut registry = Registry::start();
    let image = registry.push(
        &archive(&registry.scratch(), "app.tar", &image_layers()),
        "v1",
        "app:v1",
    );

    // No registry configured: every pull is refused, saying how to allow.
    let closed = TestDaemon::start(&[]);
    let (status, body) = pull(&closed, "app", &image);
    assert_eq!(status, 403, "{body:?}");
    assert_eq!(body[0]["code"], "forbidden");
    assert!(
        body[0]["message"].as_str().unwrap().contains("--registry"),
        "{body:?}"
    );
    drop(closed);

    let daemon = start(
        &[
            insecure(&registry).to_vec(),
            vec!["--max-image".into(), "64K".into()],
        ]
        .concat(),
    );
    // Another registry than the one allowed.
    let (status, body) = pull(&daemon, "app", "127.0.0.1:1/app:v1");
    assert_eq!(status, 403, "{body:?}");
    assert!(
        body[0]["message"]
            .as_str()
            .unwrap()
            .contains(&registry.addr),
        "the refusal names what is allowed: {body:?}"
    );
    // A reference without a registry, and bad names.
    for (name, image) in [
        ("app", "app:v1"),
        ("app", "localhost/UPPER"),
        ("host", image.as_str()),
    ] {
        let (status, body) = pull(&daemon, name, image);
        assert_eq!(status, 400, "{name} {image}: {body:?}");
        assert_eq!(body[0]["code"], "bad_request");
    }
    // An image the registry does not have.
    let (_, events) = pull(&daemon, "app", &format!("{}/nothing:here", registry.addr));
    assert_eq!(last(&events)["code"], "not_found", "{events:?}");
    // Over the image size limit (busybox alone is larger than 64 KiB).
    let (_, events) = pull(&daemon, "app", &image);
    assert_eq!(last(&events)["code"], "payload_too_large", "{events:?}");
    // The registry down.
    registry.stop();
    let (_, events) = pull(&daemon, "app", &image);
    assert_eq!(last(&events)["code"], "upstream_failed", "{events:?}");
    assert!(
        last(&events)["message"]
            .as_str()
            .unwrap()
            .contains("cannot be reached"),
        "{events:?}"
    );

    assert_eq!(layer_dirs(&daemon).len(), 0);
    assert_eq!(staging_entries(&daemon), 0);
    let listed = daemon.call("GET", "/v1/templates", None).json();
    assert_eq!(listed["items"], json!([]));
    assert!(unowned(&daemon).ends_with(" 0"), "{}", unowned(&daemon));
}

#[test]
fn a_registry_that_requires_credentials_is_pulled_from_with_a_docker_login_file() {
    let registry = Registry::start_with_auth("alice", "s3cr3t");
    let image = registry.push(
        &archive(&registry.scratch(), "app.tar", &image_layers()),
        "v1",
        "private/app:v1",
    );

    let anonymous = start(&insecure(&registry));
    let (_, events) = pull(&anonymous, "app", &image);
    assert_eq!(last(&events)["code"], "upstream_failed", "{events:?}");
    assert!(
        last(&events)["message"]
            .as_str()
            .unwrap()
            .contains("refused the credentials"),
        "{events:?}"
    );
    drop(anonymous);

    use base64::Engine;
    let auth = registry.scratch().join("auth.json");
    let token = base64::engine::general_purpose::STANDARD.encode("alice:s3cr3t");
    std::fs::write(
        &auth,
        json!({"auths": {(registry.addr.clone()): {"auth": token}}}).to_string(),
    )
    .unwrap();
    let daemon = start(
        &[
            insecure(&registry).to_vec(),
            vec!["--registry-auth".into(), auth.display().to_string()],
        ]
        .concat(),
    );
    pull_ok(&daemon, "app", &image);
    let created = daemon.create(json!({"template": "app"}));
    let (out, _) = daemon.sh_out(created["id"].as_str().unwrap(), "cat /srv/hello");
    assert_eq!(out, "from the registry\n");
}

#[test]
fn a_pull_killed_with_9_leaves_nothing_once_the_collector_has_run() {
    let registry = Registry::start();
    // A layer of incompressible bytes, large enough to be mid-way when the
    // daemon is killed.
    let mut noise = vec![0u8; 96 << 20];
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for chunk in noise.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    let layers = vec![
        busybox_layer(),
        layer(&[Entry::File("noise", &noise, 0o644, 0, 0)]),
    ];
    drop(noise);
    let image = registry.push(
        &archive(&registry.scratch(), "big.tar", &layers),
        "v1",
        "big:v1",
    );
    let mut daemon = start(&insecure(&registry));

    // The CLI follows the pull; the daemon dies at its first progress.
    let mut cli = Command::new(common::binary())
        .args(["template", "pull", &image, "--json", "--url", &daemon.url])
        .args(["--api-key", &daemon.key])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(cli.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines {
        let line = line.unwrap();
        let event: Value = serde_json::from_str(&line).unwrap();
        seen.push(event.clone());
        if event["type"] == "downloading" || event["type"] == "unpacked" {
            break;
        }
    }
    daemon.kill9();
    let _ = cli.wait();
    assert!(
        staging_entries(&daemon) + layer_dirs(&daemon).len() > 0,
        "the pull was killed before it staged anything: {seen:?}"
    );
    daemon.restart();
    // The collector runs at start: what the killed pull staged or
    // committed without recording goes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while staging_entries(&daemon) + layer_dirs(&daemon).len() != 0 {
        assert!(
            Instant::now() < deadline,
            "the killed pull's leftovers were not collected: {} staged, {} layers",
            staging_entries(&daemon),
            layer_dirs(&daemon).len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(unowned(&daemon).ends_with(" 0"), "{}", unowned(&daemon));
    // And the pull works after it.
    pull_ok(&daemon, "big", &image);
}

mod signing {
    use super::*;
    use base64::Engine;
    use p256::ecdsa::signature::Signer;
    use p256::ecdsa::{Signature, SigningKey};
    use p256::pkcs8::{EncodePublicKey, LineEnding};

    pub fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32].into()).unwrap()
    }

    pub fn public_pem(key: &SigningKey) -> String {
        key.verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap()
    }

    /// An OCI-layout archive of the signature cosign writes for the
    /// manifest `digest` of `repository`, signed by `key`.
    pub fn signature_archive(
        dir: &Path,
        repository: &str,
        digest: &str,
        key: &SigningKey,
    ) -> PathBuf {
        let payload = serde_json::to_vec(&json!({
            "critical": {
                "identity": {"docker-reference": repository},
                "image": {"docker-manifest-digest": digest},
                "type": "cosign container image signature",
            },
            "optional": null,
        }))
        .unwrap();
        let signature: Signature = key.sign(&payload);
        let signature =
            base64::engine::general_purpose::STANDARD.encode(signature.to_der().as_bytes());
        let config = serde_json::to_vec(&json!({
            "architecture": "", "os": "", "config": {},
            "rootfs": {"type": "layers", "diff_ids": [sha256(&payload)]},
        }))
        .unwrap();
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        let mut blob = |bytes: &[u8]| {
            let digest = sha256(bytes);
            files.push((format!("blobs/sha256/{}", &digest[7..]), bytes.to_vec()));
            (digest, bytes.len())
        };
        let (config_digest, config_len) = blob(&config);
        let (payload_digest, payload_len) = blob(&payload);
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_len},
            "layers": [{
                "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                "digest": payload_digest, "size": payload_len,
                "annotations": {"dev.cosignproject.cosign/signature": signature},
            }],
        }))
        .unwrap();
        let (manifest_digest, manifest_len) = blob(&manifest);
        files.push((
            "index.json".into(),
            serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest, "size": manifest_len,
                "annotations": {"org.opencontainers.image.ref.name": "sig"},
            }]}))
            .unwrap(),
        ));
        files.push((
            "oci-layout".into(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ));
        let mut builder = tar::Builder::new(Vec::new());
        for (name, bytes) in &files {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            header.set_cksum();
            builder
                .append_data(&mut header, name, bytes.as_slice())
                .unwrap();
        }
        let path = dir.join(format!("sig-{}.tar", &digest[7..19]));
        std::fs::write(&path, builder.into_inner().unwrap()).unwrap();
        path
    }
}

#[test]
fn with_a_signing_key_only_images_signed_by_it_are_pulled() {
    let registry = Registry::start();
    let scratch = registry.scratch();
    let push = |name: &str, marker: &[u8]| {
        let mut layers = image_layers();
        layers.push(layer(&[Entry::File("marker", marker, 0o644, 0, 0)]));
        registry.push(
            &archive(&scratch, &format!("{name}.tar"), &layers),
            "v1",
            &format!("{name}:v1"),
        )
    };
    let signed = push("signed", b"signed");
    let unsigned = push("unsigned", b"unsigned");
    let forged = push("forged", b"forged");
    let trusted = signing::key(7);
    let key_file = scratch.join("cosign.pub");
    std::fs::write(&key_file, signing::public_pem(&trusted)).unwrap();

    // The manifest digests, as a daemon without a key pulls them.
    let open = start(&insecure(&registry));
    let digest_of = |image: &str| -> String {
        let events = pull_ok(&open, "probe", image);
        of_type(&events, "resolved")[0]["manifest_digest"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let signed_digest = digest_of(&signed);
    let forged_digest = digest_of(&forged);
    drop(open);
    let sign = |repository: &str, digest: &str, key: &p256::ecdsa::SigningKey| {
        let archive = signing::signature_archive(
            &scratch,
            &format!("{}/{repository}", registry.addr),
            digest,
            key,
        );
        registry.push(
            &archive,
            "sig",
            &format!("{repository}:{}.sig", digest.replacen(':', "-", 1)),
        );
    };
    sign("signed", &signed_digest, &trusted);
    // Signed, but by another key.
    sign("forged", &forged_digest, &signing::key(9));

    let daemon = start(
        &[
            insecure(&registry).to_vec(),
            vec!["--image-signing-key".into(), key_file.display().to_string()],
        ]
        .concat(),
    );
    pull_ok(&daemon, "signed", &signed);
    let (_, events) = pull(&daemon, "unsigned", &unsigned);
    assert_eq!(last(&events)["code"], "forbidden", "{events:?}");
    assert!(
        last(&events)["message"]
            .as_str()
            .unwrap()
            .contains("no signature"),
        "{events:?}"
    );
    let (_, events) = pull(&daemon, "forged", &forged);
    assert_eq!(last(&events)["code"], "forbidden", "{events:?}");
    assert!(
        last(&events)["message"]
            .as_str()
            .unwrap()
            .contains("no signature of the image verifies"),
        "{events:?}"
    );
    let names: Vec<String> = daemon.call("GET", "/v1/templates", None).json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["signed"]);
}

/// A build context holding only `dockerfile`, as a tar.
fn context_tar(dockerfile: &str) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(dockerfile.len() as u64);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_cksum();
    builder
        .append_data(&mut header, "Dockerfile", dockerfile.as_bytes())
        .unwrap();
    builder.into_inner().unwrap()
}

/// `POST /v1/templates/NAME/build` of `dockerfile`: its NDJSON lines.
fn build(daemon: &TestDaemon, name: &str, dockerfile: &str) -> Vec<Value> {
    let body = context_tar(dockerfile);
    let answer = daemon.call_as(
        Some(&daemon.key),
        "POST",
        &format!("/v1/templates/{name}/build"),
        Some(&body),
        Some("application/x-tar"),
        &[],
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.lines()
}

#[test]
fn a_dockerfile_builds_from_an_image_of_an_allowed_registry_only() {
    let registry = Registry::start();
    let layers = image_layers();
    let image = registry.push(
        &archive(&registry.scratch(), "app.tar", &layers),
        "v1",
        "team/app:v1",
    );
    let daemon = start(&insecure(&registry));
    let lines = build(
        &daemon,
        "built",
        &format!("FROM {image}\nENV PATH=/usr/local/bin:$PATH\nRUN cat /srv/hello > /srv/copy\n"),
    );
    assert_eq!(last(&lines)["type"], "done", "{lines:?}");
    assert_eq!(of_type(&lines, "base")[0]["base"], image, "{lines:?}");
    let created = daemon.create(json!({"template": "built"}));
    let id = created["id"].as_str().unwrap();
    let (out, code) = daemon.sh_out(id, "cat /srv/copy; echo $PULLED $PATH");
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "from the registry\nyes /usr/local/bin:/bin:/usr/bin\n");
    daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);

    // The base's layers are the build cache's: a collection keeps them,
    // and the next build of the same base pulls nothing new.
    let collected = daemon.call("POST", "/v1/gc", None).json();
    assert_eq!(collected["layers"], json!([]), "{collected}");
    assert_eq!(
        daemon.call("DELETE", "/v1/templates/built", None).status,
        204
    );
    let emptied = daemon.call("POST", "/v1/gc?build_cache=true", None).json();
    assert_eq!(
        emptied["layers"].as_array().unwrap().len(),
        3,
        "the image's two layers and the RUN's: {emptied}"
    );

    // A base on a registry the daemon does not pull from.
    let refused = build(
        &daemon,
        "elsewhere",
        "FROM 192.0.2.9:5000/team/app:v1\nRUN true\n",
    );
    assert_eq!(last(&refused)["type"], "error", "{refused:?}");
    assert_eq!(last(&refused)["code"], "forbidden", "{refused:?}");
    assert_eq!(
        daemon.call("GET", "/v1/templates/elsewhere", None).status,
        404
    );
    assert!(unowned(&daemon).ends_with(" 0"), "{}", unowned(&daemon));
}
