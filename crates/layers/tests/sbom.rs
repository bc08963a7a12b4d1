//! The SBOM of a stack of layer directories built here by hand, whiteouts
//! and opaque directories in the overlay form the unpacker leaves. Needs
//! root (the whiteouts' mknod, `user.` xattrs on tmpfs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_layers::sbom::{sbom, Sbom, SbomError, Subject, MAX_FILE_BYTES};
use rustix::fs::{FileType, Mode, XattrFlags, CWD};
use std::fs;
use std::path::{Path, PathBuf};

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the sbom tests need root (they mknod whiteouts and set overlay xattrs): run them as root"
    );
}

/// `count` empty layer directories `l0` (the bottom) .. in a temp dir.
struct Stack {
    dir: tempfile::TempDir,
    count: usize,
}

impl Stack {
    fn new(count: usize) -> Stack {
        require_root();
        let dir = tempfile::tempdir().expect("a temp dir");
        for n in 0..count {
            fs::create_dir(dir.path().join(format!("l{n}"))).unwrap();
        }
        Stack { dir, count }
    }

    fn at(&self, layer: usize, path: &str) -> PathBuf {
        self.dir.path().join(format!("l{layer}")).join(path)
    }

    fn write(&self, layer: usize, path: &str, contents: impl AsRef<[u8]>) {
        let path = self.at(layer, path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    /// A whiteout of `path`: a character device 0:0.
    fn whiteout(&self, layer: usize, path: &str) {
        let path = self.at(layer, path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        rustix::fs::mknodat(CWD, &path, FileType::CharacterDevice, Mode::empty(), 0)
            .expect("mknod a whiteout");
    }

    fn opaque(&self, layer: usize, path: &str) {
        let path = self.at(layer, path);
        fs::create_dir_all(&path).unwrap();
        rustix::fs::setxattr(&path, "user.overlay.opaque", b"y", XattrFlags::empty())
            .expect("set user.overlay.opaque");
    }

    fn symlink(&self, layer: usize, path: &str, target: impl AsRef<Path>) {
        let path = self.at(layer, path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, path).unwrap();
    }

    fn layers(&self) -> Vec<PathBuf> {
        (0..self.count)
            .map(|n| self.dir.path().join(format!("l{n}")))
            .collect()
    }

    fn sbom(&self) -> Sbom {
        sbom(&self.layers(), &subject(self.count)).expect("an sbom")
    }
}

fn diff_id(n: usize) -> String {
    format!("sha256:{n:064x}")
}

const DIGEST: &str = "sha256:c0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ff";

fn subject(layers: usize) -> Subject {
    Subject {
        name: "python".into(),
        digest: DIGEST.into(),
        layers: (0..layers).map(diff_id).collect(),
    }
}

fn purls(sbom: &Sbom) -> Vec<String> {
    sbom.components
        .iter()
        .map(|c| c.purl.clone().unwrap_or_default())
        .collect()
}

fn property<'a>(properties: &'a [airlock_layers::sbom::Property], name: &str) -> Vec<&'a str> {
    properties
        .iter()
        .filter(|p| p.name == name)
        .map(|p| p.value.as_str())
        .collect()
}

fn stanza(package: &str, version: &str, status: &str) -> String {
    format!("Package: {package}\nStatus: {status}\nArchitecture: amd64\nVersion: {version}\nDescription: x\n more\n\n")
}

#[test]
fn an_upper_layers_dpkg_status_replaces_the_lower_ones() {
    let stack = Stack::new(2);
    stack.write(
        0,
        "etc/os-release",
        "NAME=\"Ubuntu\"\nID=ubuntu\nVERSION_ID=\"24.04\"\n",
    );
    stack.write(
        0,
        "var/lib/dpkg/status",
        stanza("libc6", "2.36-9", "install ok installed")
            + &stanza("old-only", "1.0", "install ok installed"),
    );
    stack.write(
        1,
        "var/lib/dpkg/status",
        stanza("libc6", "2.36-9+deb12u4", "install ok installed")
            + &stanza("removed", "1.0", "deinstall ok config-files")
            + "Package: bash\nStatus: install ok installed\nVersion: 5.2\nSource: bash-src (5.2-1)\n",
    );
    let doc = stack.sbom();
    assert_eq!(
        purls(&doc),
        [
            "pkg:deb/ubuntu/bash@5.2",
            "pkg:deb/ubuntu/libc6@2.36-9%2Bdeb12u4?arch=amd64",
        ]
    );
    let libc = &doc.components[1];
    assert_eq!(libc.name, "libc6");
    assert_eq!(libc.version.as_deref(), Some("2.36-9+deb12u4"));
    assert_eq!(
        property(&libc.properties, "airlock:path"),
        ["/var/lib/dpkg/status"]
    );
    assert_eq!(property(&libc.properties, "airlock:layer"), [diff_id(1)]);
    assert_eq!(
        property(&doc.components[0].properties, "airlock:dpkg:source"),
        ["bash-src (5.2-1)"]
    );
    assert_eq!(
        property(&doc.metadata.component.properties, "airlock:os-release:id"),
        ["ubuntu"]
    );

    // Distroless's status.d: no Status lines, md5sums files beside.
    stack.write(
        1,
        "var/lib/dpkg/status.d/tzdata",
        "Package: tzdata\nVersion: 2024a-0+deb12u1\nArchitecture: all\n",
    );
    stack.write(
        1,
        "var/lib/dpkg/status.d/tzdata.md5sums",
        "Package: not-a-package\nVersion: 1\n",
    );
    let doc = stack.sbom();
    assert!(
        purls(&doc).contains(&"pkg:deb/ubuntu/tzdata@2024a-0%2Bdeb12u1?arch=all".to_owned()),
        "{:?}",
        purls(&doc)
    );
    assert_eq!(doc.components.len(), 3);
}

#[test]
fn a_whiteout_hides_a_lower_layers_dist_info() {
    let stack = Stack::new(2);
    let site = "usr/lib/python3.12/site-packages";
    stack.write(
        0,
        &format!("{site}/Foo_Bar-1.0.dist-info/METADATA"),
        "Metadata-Version: 2.1\nName: Foo_Bar\nVersion: 1.0\n\nbody\n",
    );
    stack.write(
        0,
        &format!("{site}/requests-2.31.0.dist-info/METADATA"),
        "Name: requests\nVersion: 2.31.0\n",
    );
    stack.write(
        0,
        "usr/local/lib/python3.12/dist-packages/six-1.16.0.egg-info",
        "Name: six\nVersion: 1.16.0\n",
    );
    // Without the whiteout both are there.
    assert_eq!(
        purls(&stack.sbom()),
        [
            "pkg:pypi/foo-bar@1.0",
            "pkg:pypi/requests@2.31.0",
            "pkg:pypi/six@1.16.0"
        ]
    );
    stack.whiteout(1, &format!("{site}/Foo_Bar-1.0.dist-info"));
    let doc = stack.sbom();
    assert_eq!(
        purls(&doc),
        ["pkg:pypi/requests@2.31.0", "pkg:pypi/six@1.16.0"]
    );
    assert_eq!(
        property(&doc.components[0].properties, "airlock:path"),
        [format!("/{site}/requests-2.31.0.dist-info/METADATA")]
    );
    assert_eq!(
        property(&doc.components[0].properties, "airlock:layer"),
        [diff_id(0)]
    );
}

#[test]
fn an_opaque_node_modules_hides_the_lower_layers_packages() {
    let stack = Stack::new(2);
    let modules = "usr/local/lib/node_modules";
    stack.write(
        0,
        &format!("{modules}/left-pad/package.json"),
        r#"{"name":"left-pad","version":"1.3.0"}"#,
    );
    stack.write(
        0,
        &format!("{modules}/@types/node/package.json"),
        r#"{"name":"@types/node","version":"20.0.0"}"#,
    );
    stack.write(
        1,
        &format!("{modules}/npm/package.json"),
        r#"{"name":"npm","version":"10.2.4"}"#,
    );
    stack.write(
        1,
        &format!("{modules}/npm/node_modules/@npmcli/arborist/package.json"),
        r#"{"name":"@npmcli/arborist","version":"7.2.1"}"#,
    );
    stack.write(
        1,
        &format!("{modules}/npm/node_modules/abbrev/package.json"),
        r#"{"name":"abbrev","version":"2.0.0"}"#,
    );
    // Deeper than one nested level: not read.
    stack.write(
        1,
        &format!("{modules}/npm/node_modules/abbrev/node_modules/deep/package.json"),
        r#"{"name":"deep","version":"1.0.0"}"#,
    );
    stack.write(1, &format!("{modules}/.package-lock.json"), "{}");
    assert_eq!(
        purls(&stack.sbom()),
        [
            "pkg:npm/%40npmcli/arborist@7.2.1",
            "pkg:npm/%40types/node@20.0.0",
            "pkg:npm/abbrev@2.0.0",
            "pkg:npm/left-pad@1.3.0",
            "pkg:npm/npm@10.2.4",
        ]
    );
    stack.opaque(1, modules);
    let doc = stack.sbom();
    assert_eq!(
        purls(&doc),
        [
            "pkg:npm/%40npmcli/arborist@7.2.1",
            "pkg:npm/abbrev@2.0.0",
            "pkg:npm/npm@10.2.4",
        ]
    );
    assert_eq!(doc.components[0].name, "@npmcli/arborist");
}

#[test]
fn apk_packages_are_read_with_the_distro_of_os_release() {
    let stack = Stack::new(1);
    stack.write(0, "etc/os-release", "ID=alpine\nVERSION_ID=3.19.1\n");
    stack.write(
        0,
        "lib/apk/db/installed",
        "C:Q1abc=\nP:musl\nV:1.2.4_git20230717-r4\nA:x86_64\no:musl\nF:lib\nR:libc.musl-x86_64.so.1\n\n\
         P:busybox\nV:1.36.1-r15\nA:x86_64\no:busybox\n\nnot an apk line\n",
    );
    let doc = stack.sbom();
    assert_eq!(
        purls(&doc),
        [
            "pkg:apk/alpine/busybox@1.36.1-r15?arch=x86_64",
            "pkg:apk/alpine/musl@1.2.4_git20230717-r4?arch=x86_64",
        ]
    );
    assert_eq!(
        property(&doc.components[1].properties, "airlock:apk:origin"),
        ["musl"]
    );
    assert_eq!(doc.skipped.malformed, 1);
}

#[test]
fn a_symlinked_path_component_never_leads_out_of_the_stack() {
    let stack = Stack::new(2);
    // A dpkg database on the host, beside the layers.
    let host = stack.dir.path().join("host");
    fs::create_dir(&host).unwrap();
    fs::write(
        host.join("status"),
        stanza("host-secret", "1.0", "install ok installed"),
    )
    .unwrap();
    // Relative: from l1/var/lib, ../../../host is the host directory.
    stack.symlink(1, "var/lib/dpkg", "../../../host");
    assert!(
        stack.at(1, "var/lib/dpkg/status").exists(),
        "the host would follow it"
    );
    assert_eq!(purls(&stack.sbom()), Vec::<String>::new());

    // Absolute: the host's path of it, and the host's /etc.
    fs::remove_file(stack.at(1, "var/lib/dpkg")).unwrap();
    stack.symlink(1, "var/lib/dpkg", &host);
    assert!(purls(&stack.sbom()).is_empty());
    fs::remove_file(stack.at(1, "var/lib/dpkg")).unwrap();
    stack.symlink(1, "var/lib/dpkg", "/etc");
    stack.symlink(1, "usr/lib/python3", "/usr/lib/python3");
    stack.symlink(1, "usr/local/lib/node_modules", "/usr/lib/node_modules");
    assert!(purls(&stack.sbom()).is_empty());

    // Within the stack a symlink is followed, as the sandbox would: to
    // a lower layer's directory, absolute and through `..`.
    stack.write(
        0,
        "etc/status",
        stanza("in-image", "2.0", "install ok installed"),
    );
    assert_eq!(
        purls(&stack.sbom()),
        ["pkg:deb/debian/in-image@2.0?arch=amd64"]
    );
    fs::remove_file(stack.at(1, "var/lib/dpkg")).unwrap();
    stack.symlink(1, "var/lib/dpkg", "../../../../../../../../etc");
    assert_eq!(
        purls(&stack.sbom()),
        ["pkg:deb/debian/in-image@2.0?arch=amd64"]
    );

    // A loop ends, as nothing found.
    fs::remove_file(stack.at(1, "var/lib/dpkg")).unwrap();
    stack.symlink(1, "var/lib/dpkg", "/var/lib/loop");
    stack.symlink(1, "var/lib/loop", "dpkg");
    assert!(purls(&stack.sbom()).is_empty());
}

#[test]
fn an_oversized_metadata_is_skipped_and_counted() {
    let stack = Stack::new(1);
    let site = "usr/lib/python3/dist-packages";
    let mut big = b"Name: big\nVersion: 1.0\n\n".to_vec();
    big.resize(usize::try_from(MAX_FILE_BYTES).unwrap() + 1, b'x');
    stack.write(0, &format!("{site}/big-1.0.dist-info/METADATA"), &big);
    stack.write(
        0,
        &format!("{site}/small-1.0.dist-info/METADATA"),
        "Name: small\nVersion: 1.0\n",
    );
    stack.write(
        0,
        &format!("{site}/broken-1.0.dist-info/METADATA"),
        "Version: 1.0\n",
    );
    let doc = stack.sbom();
    assert_eq!(purls(&doc), ["pkg:pypi/small@1.0"]);
    assert_eq!(doc.skipped.oversized, 1);
    assert_eq!(doc.skipped.malformed, 1);
    assert_eq!(
        property(&doc.metadata.properties, "airlock:skipped:oversized"),
        ["1"]
    );
    // One byte less is read.
    big.truncate(usize::try_from(MAX_FILE_BYTES).unwrap());
    stack.write(0, &format!("{site}/big-1.0.dist-info/METADATA"), &big);
    assert_eq!(
        purls(&stack.sbom()),
        ["pkg:pypi/big@1.0", "pkg:pypi/small@1.0"]
    );
}

/// A stack with a package of each ecosystem, in several layers.
fn mixed() -> Stack {
    let stack = Stack::new(3);
    stack.write(0, "etc/os-release", "ID=debian\nVERSION_ID=\"12\"\n");
    stack.write(
        0,
        "var/lib/dpkg/status",
        stanza("zlib1g", "1:1.2.13.dfsg-1", "install ok installed")
            + &stanza("bash", "5.2.15-2+b2", "install ok installed"),
    );
    stack.write(
        1,
        "usr/lib/python3/dist-packages/PyYAML-6.0.1.dist-info/METADATA",
        "Name: PyYAML\nVersion: 6.0.1\n",
    );
    stack.write(
        2,
        "usr/lib/node_modules/@scope/Pkg/package.json",
        r#"{"name":"@scope/Pkg","version":"1.0.0-beta+1"}"#,
    );
    stack.write(2, "lib/apk/db/installed", "P:musl\nV:1.2.4-r2\n");
    stack
}

#[test]
fn the_document_has_cyclonedx_fields_and_is_the_same_bytes_every_run() {
    let stack = mixed();
    let first = stack.sbom().to_json().unwrap();
    let second = stack.sbom().to_json().unwrap();
    assert_eq!(first, second);

    let json: serde_json::Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(json["bomFormat"], "CycloneDX");
    assert_eq!(json["specVersion"], "1.5");
    assert_eq!(json["version"], 1);
    let serial = json["serialNumber"].as_str().unwrap();
    let uuid = serial.strip_prefix("urn:uuid:").unwrap();
    assert_eq!(uuid.len(), 36);
    assert_eq!(&uuid[14..15], "5", "a name-based UUID: {serial}");
    // Another digest, another serial number.
    let mut other = subject(3);
    other.digest = format!("sha256:{}", "1".repeat(64));
    assert_ne!(sbom(&stack.layers(), &other).unwrap().serial_number, serial);

    let subject_json = &json["metadata"]["component"];
    assert_eq!(subject_json["type"], "container");
    assert_eq!(subject_json["name"], "python");
    assert_eq!(subject_json["bom-ref"], DIGEST);
    assert_eq!(subject_json["hashes"][0]["alg"], "SHA-256");
    assert_eq!(
        subject_json["hashes"][0]["content"],
        &DIGEST["sha256:".len()..]
    );
    assert_eq!(subject_json["properties"][0]["name"], "airlock:layer:0");
    assert_eq!(subject_json["properties"][2]["value"], diff_id(2));
    assert_eq!(
        json["metadata"]["tools"]["components"][0]["name"],
        "airlock"
    );

    let components = json["components"].as_array().unwrap();
    let purls: Vec<&str> = components
        .iter()
        .map(|c| c["purl"].as_str().unwrap())
        .collect();
    assert_eq!(
        purls,
        [
            "pkg:apk/debian/musl@1.2.4-r2",
            "pkg:deb/debian/bash@5.2.15-2%2Bb2?arch=amd64",
            "pkg:deb/debian/zlib1g@1:1.2.13.dfsg-1?arch=amd64",
            "pkg:npm/%40scope/pkg@1.0.0-beta%2B1",
            "pkg:pypi/pyyaml@6.0.1",
        ]
    );
    for component in components {
        assert_eq!(component["type"], "library");
        assert_eq!(component["bom-ref"], component["purl"]);
        assert!(component["name"].is_string() && component["version"].is_string());
        assert_eq!(component["properties"][0]["name"], "airlock:path");
        assert_eq!(component["properties"][1]["name"], "airlock:layer");
    }
    assert_eq!(components[3]["name"], "@scope/Pkg");
    assert_eq!(components[4]["name"], "PyYAML");
}

#[test]
fn a_small_document_is_exactly_the_golden_one() {
    let stack = Stack::new(1);
    stack.write(
        0,
        "var/lib/dpkg/status",
        stanza("base-files", "12.4+deb12u5", "install ok installed"),
    );
    let json = String::from_utf8(stack.sbom().to_json().unwrap()).unwrap();
    let expected = r#"{
  "bomFormat": "CycloneDX",
  "specVersion": "1.5",
  "serialNumber": "urn:uuid:a2b4a223-22d6-5d57-be4c-253029c2be08",
  "version": 1,
  "metadata": {
    "tools": {
      "components": [
        {
          "type": "application",
          "name": "airlock",
          "version": "VERSION"
        }
      ]
    },
    "component": {
      "type": "container",
      "bom-ref": "sha256:c0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ff",
      "name": "python",
      "hashes": [
        {
          "alg": "SHA-256",
          "content": "c0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ff"
        }
      ],
      "properties": [
        {
          "name": "airlock:layer:0",
          "value": "sha256:0000000000000000000000000000000000000000000000000000000000000000"
        }
      ]
    },
    "properties": [
      {
        "name": "airlock:skipped:oversized",
        "value": "0"
      },
      {
        "name": "airlock:skipped:over-read-budget",
        "value": "0"
      },
      {
        "name": "airlock:skipped:malformed",
        "value": "0"
      },
      {
        "name": "airlock:skipped:over-component-limit",
        "value": "0"
      },
      {
        "name": "airlock:skipped:truncated-listings",
        "value": "0"
      }
    ]
  },
  "components": [
    {
      "type": "library",
      "bom-ref": "pkg:deb/debian/base-files@12.4%2Bdeb12u5?arch=amd64",
      "name": "base-files",
      "version": "12.4+deb12u5",
      "purl": "pkg:deb/debian/base-files@12.4%2Bdeb12u5?arch=amd64",
      "properties": [
        {
          "name": "airlock:path",
          "value": "/var/lib/dpkg/status"
        },
        {
          "name": "airlock:layer",
          "value": "sha256:0000000000000000000000000000000000000000000000000000000000000000"
        }
      ]
    }
  ]
}"#
    // The version 5 UUID of the digest in airlock's namespace
    // c98e5df5-d944-432d-8fc4-8c0da606552a, as Python's uuid.uuid5 gives it.
    .replace("VERSION", env!("CARGO_PKG_VERSION"));
    assert_eq!(json, expected);
}

#[test]
fn a_missing_layer_directory_or_a_wrong_layer_count_is_an_error() {
    let stack = Stack::new(1);
    let mut layers = stack.layers();
    layers.push(stack.dir.path().join("missing"));
    assert!(matches!(
        sbom(&layers, &subject(2)),
        Err(SbomError::OpenLayer { .. })
    ));
    assert!(matches!(
        sbom(&layers, &subject(1)),
        Err(SbomError::LayerCount {
            layers: 2,
            diff_ids: 1
        })
    ));
    // An empty image is an empty document, not an error.
    assert!(stack.sbom().components.is_empty());
}
