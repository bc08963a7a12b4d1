//! Image archives built by tests: layers as tars written entry by entry,
//! packed as `docker save` output or as an OCI image layout.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::io::Write;

/// One entry of a layer.
pub enum Entry<'a> {
    Dir(&'a str, u32, u32, u32),
    File(&'a str, &'a [u8], u32, u32, u32),
    Symlink(&'a str, &'a str),
    /// `.wh.NAME` in the entry's directory: NAME is deleted.
    Whiteout(&'a str),
    /// `DIR/.wh..wh..opq`: DIR hides what lower layers hold.
    Opaque(&'a str),
}

fn header(kind: tar::EntryType, mode: u32, uid: u32, gid: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid.into());
    h.set_gid(gid.into());
    h.set_size(size);
    h.set_mtime(1_700_000_000);
    h
}

/// An uncompressed layer tar.
pub fn layer(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        match entry {
            Entry::Dir(path, mode, uid, gid) => {
                let mut h = header(tar::EntryType::Directory, *mode, *uid, *gid, 0);
                builder.append_data(&mut h, path, &[][..]).unwrap();
            }
            Entry::File(path, contents, mode, uid, gid) => {
                let mut h = header(
                    tar::EntryType::Regular,
                    *mode,
                    *uid,
                    *gid,
                    contents.len() as u64,
                );
                builder.append_data(&mut h, path, *contents).unwrap();
            }
            Entry::Symlink(path, target) => {
                let mut h = header(tar::EntryType::Symlink, 0o777, 0, 0, 0);
                builder.append_link(&mut h, path, target).unwrap();
            }
            Entry::Whiteout(path) => {
                let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
                let wh = if dir.is_empty() {
                    format!(".wh.{name}")
                } else {
                    format!("{dir}/.wh.{name}")
                };
                let mut h = header(tar::EntryType::Regular, 0o644, 0, 0, 0);
                builder.append_data(&mut h, wh, &[][..]).unwrap();
            }
            Entry::Opaque(dir) => {
                let mut h = header(tar::EntryType::Regular, 0o644, 0, 0, 0);
                builder
                    .append_data(&mut h, format!("{dir}/.wh..wh..opq"), &[][..])
                    .unwrap();
            }
        }
    }
    builder.into_inner().unwrap()
}

/// A layer holding a static busybox as /bin/sh and the usual tools, an
/// /etc with `root` and `user`, and the directories a sandbox needs.
pub fn busybox_layer() -> Vec<u8> {
    let busybox = std::fs::read("/bin/busybox")
        .expect("the busybox-static package is needed (CI installs it)");
    let mut entries = vec![
        Entry::Dir("bin", 0o755, 0, 0),
        Entry::File("bin/busybox", &busybox, 0o755, 0, 0),
        Entry::Dir("etc", 0o755, 0, 0),
        Entry::File(
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
            0o644,
            0,
            0,
        ),
        Entry::File("etc/group", b"root:x:0:\nuser:x:1000:\n", 0o644, 0, 0),
        Entry::Dir("usr", 0o755, 0, 0),
        Entry::Dir("usr/bin", 0o755, 0, 0),
    ];
    let tools = [
        "sh", "ls", "cat", "stat", "id", "echo", "touch", "rm", "env", "pwd", "test", "mkdir", "wc",
    ];
    let names: Vec<String> = tools.iter().map(|t| format!("bin/{t}")).collect();
    for name in &names {
        entries.push(Entry::Symlink(name, "busybox"));
    }
    layer(&entries)
}

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// An image configuration for `layers` (uncompressed tars).
pub fn config(layers: &[Vec<u8>], env: &[&str], workdir: &str) -> Vec<u8> {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256(l)).collect();
    serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": env, "WorkingDir": workdir, "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap()
}

fn archive(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, bytes) in files {
        let mut h = header(tar::EntryType::Regular, 0o644, 0, 0, bytes.len() as u64);
        builder.append_data(&mut h, name, bytes.as_slice()).unwrap();
    }
    builder.into_inner().unwrap()
}

/// `docker save` output of one image tagged `tag`.
pub fn docker_save(layers: &[Vec<u8>], config: &[u8], tag: &str) -> Vec<u8> {
    let config_name = format!("{}.json", &sha256(config)[7..]);
    let mut files = vec![(config_name.clone(), config.to_vec())];
    let mut names = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let name = format!("layer{i}/layer.tar");
        names.push(name.clone());
        files.push((name, layer.clone()));
    }
    let manifest = json!([{"Config": config_name, "RepoTags": [tag], "Layers": names}]);
    files.push((
        "manifest.json".into(),
        serde_json::to_vec(&manifest).unwrap(),
    ));
    archive(&files)
}

/// An OCI image layout of one image named `tag`, its layers gzipped.
pub fn oci_layout(layers: &[Vec<u8>], config: &[u8], tag: &str) -> Vec<u8> {
    let mut files = Vec::new();
    let blob = |bytes: Vec<u8>, files: &mut Vec<(String, Vec<u8>)>| -> (String, usize) {
        let digest = sha256(&bytes);
        let len = bytes.len();
        files.push((format!("blobs/sha256/{}", &digest[7..]), bytes));
        (digest, len)
    };
    let (config_digest, config_len) = blob(config.to_vec(), &mut files);
    let mut descriptors: Vec<Value> = Vec::new();
    for layer in layers {
        let (digest, len) = blob(gzip(layer), &mut files);
        descriptors.push(json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest, "size": len,
        }));
    }
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_len},
        "layers": descriptors,
    }))
    .unwrap();
    let (manifest_digest, manifest_len) = blob(manifest, &mut files);
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_len,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    });
    files.push(("index.json".into(), serde_json::to_vec(&index).unwrap()));
    files.push((
        "oci-layout".into(),
        br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
    ));
    archive(&files)
}
