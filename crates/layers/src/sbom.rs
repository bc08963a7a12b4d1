//! A software bill of materials of a template: the packages its stack of
//! unpacked layers holds, as a CycloneDX 1.5 JSON document.
//!
//! [`sbom`] reads the **merged view** of the layers (given bottom first),
//! as the template's sandboxes see their root: a path's top-most layer
//! wins, a whiteout (character device 0:0) hides the lower layers' path, an
//! opaque directory (`user.overlay.opaque=y`) hides the lower layers'
//! contents of it. It runs as host root on hostile layers, so it is built
//! to be led nowhere:
//!
//! - **No host path resolution.** Every component of every path is looked
//!   up one name at a time on the descriptor of its parent in its layer
//!   (`fstatat(AT_SYMLINK_NOFOLLOW)`, `openat(O_NOFOLLOW)`); `..` is ours
//!   and stops at the root. A **symlink is resolved within the stack**, as
//!   the sandbox would resolve it (an absolute target from the merged
//!   root, at most 40 a lookup), so `/var/lib/dpkg -> /etc` reads the
//!   image's `/etc`, never the host's. Only regular files are opened
//!   (`O_NONBLOCK`, so a FIFO cannot stall the reader).
//! - **Pure and blocking**: no clock, no randomness, no writes. The same
//!   stack and subject give the same bytes; `serialNumber` is a name-based
//!   (version 5) UUID of the subject's digest.
//!
//! # What it reads
//!
//! | ecosystem | file | components |
//! |---|---|---|
//! | dpkg | `/var/lib/dpkg/status` (paragraphs with `Status: install ok installed`) and each file of `/var/lib/dpkg/status.d/` (distroless; no `Status:` needed, `*.md5sums` and dot files skipped) | `pkg:deb/ID/NAME@VERSION?arch=ARCH` |
//! | apk | `/lib/apk/db/installed` (`P:`, `V:`, `A:`, `o:`) | `pkg:apk/ID/NAME@VERSION?arch=ARCH` |
//! | Python | `*.dist-info/METADATA`, `*.egg-info/PKG-INFO` and `*.egg-info` files in `/usr/lib/python3*/{site,dist}-packages` and `/usr/local/lib/python3*/{site,dist}-packages` | `pkg:pypi/NAME@VERSION`, the name normalised per PEP 503 |
//! | npm | `package.json` of `node_modules/NAME` and `node_modules/@SCOPE/NAME` in `/usr/lib/node_modules` and `/usr/local/lib/node_modules`, and of the same one level down (each global package's own `node_modules`) | `pkg:npm/NAME@VERSION`, `pkg:npm/%40SCOPE/NAME@VERSION` |
//!
//! `ID` is `/etc/os-release`'s (else `/usr/lib/os-release`'s) `ID` when it
//! has one, else `debian` for deb and `alpine` for apk. Purl parts are
//! percent-encoded (all but ASCII letters, digits and `.-_~:`), so `+` in a
//! version is `%2B`. Each component has `bom-ref` = its purl and the
//! properties `airlock:path` (the file it was found in, as merged) and
//! `airlock:layer` (that file's layer, by `diff_id`); a purl found in more
//! than one file is one component with a pair for each. dpkg's `Source:`
//! is `airlock:dpkg:source`, apk's origin `airlock:apk:origin`.
//! Components are sorted by purl.
//!
//! `metadata.component` is the template: a `container` with its name,
//! `bom-ref` = the image config digest, that digest as a `SHA-256` hash,
//! and properties `airlock:layer:N` (its layers' `diff_id`s, `N` = 0 the
//! bottom) and `airlock:os-release:id` / `:version-id` when known.
//!
//! # What it skips, and its bounds
//!
//! Malformed records and files (a paragraph with a line that is no field,
//! a missing name or version, a name or version that is not one printable
//! token of at most 256 bytes, a `package.json` that is not JSON with
//! string `name` and `version`, a Python name not of PEP 508's form) are
//! left out. Not read: other ecosystems (RPM, Go binaries, jars, gems),
//! `/opt`, virtualenvs, and npm trees deeper than one nested level.
//! Bounds, all counted in `metadata.properties` (`airlock:skipped:*`) and
//! [`Sbom::skipped`] when they bite:
//!
//! - status files (dpkg, apk) of more than [`MAX_STATUS_BYTES`], other
//!   files (`METADATA`, `package.json`, os-release) of more than
//!   [`MAX_FILE_BYTES`]: skipped whole (`oversized`);
//! - [`MAX_READ_BYTES`] read in all; files past it are skipped
//!   (`over-read-budget`);
//! - [`MAX_COMPONENTS`] components; more are dropped
//!   (`over-component-limit`);
//! - a directory listing of more than 200,000 names, or past 2,000,000
//!   directory entries read in all, is cut short (`truncated-listings`).
//!
//! A missing file or directory is no error (an image without dpkg has no
//! deb components); [`SbomError`] is only a layer that cannot be opened or
//! a read of the store that fails.

mod parse;
mod stack;

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};
use stack::{MergedDir, MergedFile, Stack};
use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::PathBuf;

/// The most components one document holds.
pub const MAX_COMPONENTS: usize = 200_000;
/// The largest dpkg or apk status file read, in bytes (64 MiB).
pub const MAX_STATUS_BYTES: u64 = 64 << 20;
/// The largest `METADATA`, `PKG-INFO`, `package.json` or os-release file
/// read, in bytes (1 MiB).
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// The most bytes read over one document (1 GiB).
pub const MAX_READ_BYTES: u64 = 1 << 30;

/// The namespace of the name-based UUIDs that are the documents' serial
/// numbers (the name is the subject's digest).
const SERIAL_NAMESPACE: [u8; 16] = [
    0xc9, 0x8e, 0x5d, 0xf5, 0xd9, 0x44, 0x43, 0x2d, 0x8f, 0xc4, 0x8c, 0x0d, 0xa6, 0x06, 0x55, 0x2a,
];

/// What the document is about: a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// The template's name.
    pub name: String,
    /// Its image configuration's digest (`sha256:<hex>`).
    pub digest: String,
    /// Its layers' `diff_id`s, bottom first, one for each layer directory
    /// given to [`sbom`].
    pub layers: Vec<String>,
}

/// Why no document could be made: the store failed, never the image.
#[derive(Debug, thiserror::Error)]
pub enum SbomError {
    #[error("the subject names {diff_ids} layers but {layers} layer directories were given")]
    LayerCount { layers: usize, diff_ids: usize },
    #[error("the layer directory {path} could not be opened")]
    OpenLayer {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading {path} in layer {layer} (counting from the bottom) failed")]
    Read {
        layer: usize,
        path: String,
        #[source]
        source: io::Error,
    },
}

/// A CycloneDX 1.5 document (the subset this module writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sbom {
    /// `CycloneDX`.
    pub bom_format: String,
    /// `1.5`.
    pub spec_version: String,
    /// `urn:uuid:` and a UUID derived from the subject's digest.
    pub serial_number: String,
    /// `1`.
    pub version: u32,
    pub metadata: Metadata,
    pub components: Vec<Component>,
    /// What the bounds left out (also in `metadata.properties`).
    #[serde(skip)]
    pub skipped: Skipped,
}

/// `metadata`: the tool and the subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    pub tools: Tools,
    pub component: Component,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<Property>,
}

/// `metadata.tools`, in CycloneDX 1.5's object form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tools {
    pub components: Vec<Component>,
}

/// A component: the subject, a tool or a package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    /// `container`, `application` or `library`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(rename = "bom-ref", default, skip_serializing_if = "Option::is_none")]
    pub bom_ref: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purl: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hashes: Vec<Hash>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<Property>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hash {
    /// `SHA-256`.
    pub alg: String,
    /// Lowercase hex.
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Property {
    pub name: String,
    pub value: String,
}

impl Property {
    fn new(name: impl Into<String>, value: impl Into<String>) -> Property {
        Property {
            name: name.into(),
            value: value.into(),
        }
    }
}

/// What the bounds and the checks left out of a document.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Files over their size bound.
    pub oversized: u64,
    /// Files past [`MAX_READ_BYTES`].
    pub over_read_budget: u64,
    /// Records and files that are not well formed.
    pub malformed: u64,
    /// Components past [`MAX_COMPONENTS`].
    pub over_component_limit: u64,
    /// Directory listings cut short.
    pub truncated_listings: u64,
}

impl Sbom {
    /// The document as pretty-printed JSON (the same bytes for the same
    /// document).
    pub fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec_pretty(self)
    }
}

/// The bill of materials of the stack `layers` (unpacked layer
/// directories, bottom first) for `subject`.
pub fn sbom(layers: &[PathBuf], subject: &Subject) -> Result<Sbom, SbomError> {
    if layers.len() != subject.layers.len() {
        return Err(SbomError::LayerCount {
            layers: layers.len(),
            diff_ids: subject.layers.len(),
        });
    }
    let mut collector = Collector {
        stack: Stack::open(layers)?,
        subject,
        components: BTreeMap::new(),
        skipped: Skipped::default(),
        read: 0,
    };
    let release = collector.os_release()?;
    collector.dpkg(release.id.as_deref().unwrap_or("debian"))?;
    collector.apk(release.id.as_deref().unwrap_or("alpine"))?;
    collector.python()?;
    collector.npm()?;
    collector.skipped.truncated_listings = collector.stack.truncated_listings.get();
    Ok(collector.finish(&release))
}

/// The deterministic serial number: a version 5 UUID (SHA-1, RFC 4122 §4.3)
/// of the digest in [`SERIAL_NAMESPACE`].
fn serial_number(digest: &str) -> String {
    let mut hasher = Sha1::new();
    hasher.update(SERIAL_NAMESPACE);
    hasher.update(digest.as_bytes());
    let hash = hasher.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hash[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x50;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

struct Collector<'a> {
    stack: Stack,
    subject: &'a Subject,
    /// By purl, which is also the order of the document.
    components: BTreeMap<String, Component>,
    skipped: Skipped,
    /// Bytes read so far.
    read: u64,
}

/// A package found, before it is a component.
struct Package<'a> {
    purl: String,
    name: String,
    version: String,
    file: &'a MergedFile,
    extra: Vec<Property>,
}

impl Collector<'_> {
    /// The whole of `file` if it is within `limit` and the read budget;
    /// `None` (counted) if not.
    fn read(&mut self, file: &mut MergedFile, limit: u64) -> Result<Option<Vec<u8>>, SbomError> {
        if file.size > limit {
            self.skipped.oversized += 1;
            return Ok(None);
        }
        let budget = MAX_READ_BYTES.saturating_sub(self.read);
        if file.size > budget {
            self.skipped.over_read_budget += 1;
            return Ok(None);
        }
        let mut bytes = Vec::new();
        // One byte past the bound tells a file that grew from one that did not.
        let taken = (&file.file)
            .take(limit.min(budget).saturating_add(1))
            .read_to_end(&mut bytes);
        if let Err(source) = taken {
            return Err(SbomError::Read {
                layer: file.layer,
                path: file.path.clone(),
                source,
            });
        }
        self.read = self.read.saturating_add(bytes.len() as u64);
        if bytes.len() as u64 > limit.min(budget) {
            self.skipped.oversized += 1;
            return Ok(None);
        }
        Ok(Some(bytes))
    }

    /// The regular file at `path` below `start`, read within `limit`.
    fn read_at(
        &mut self,
        start: &MergedDir,
        path: &[u8],
        limit: u64,
    ) -> Result<Option<(MergedFile, Vec<u8>)>, SbomError> {
        let Some(mut file) = self.stack.file(start, path)? else {
            return Ok(None);
        };
        Ok(self.read(&mut file, limit)?.map(|bytes| (file, bytes)))
    }

    fn add(&mut self, package: Package<'_>) {
        let mut located = vec![Property::new("airlock:path", package.file.path.clone())];
        if let Some(diff_id) = self.subject.layers.get(package.file.layer) {
            located.push(Property::new("airlock:layer", diff_id.clone()));
        }
        if let Some(existing) = self.components.get_mut(&package.purl) {
            let known = existing
                .properties
                .windows(located.len())
                .any(|pair| pair == located.as_slice());
            if !known {
                existing.properties.extend(located);
            }
            return;
        }
        if self.components.len() >= MAX_COMPONENTS {
            self.skipped.over_component_limit += 1;
            return;
        }
        located.extend(package.extra);
        self.components.insert(
            package.purl.clone(),
            Component {
                kind: "library".into(),
                bom_ref: Some(package.purl.clone()),
                name: package.name,
                version: Some(package.version),
                purl: Some(package.purl),
                hashes: Vec::new(),
                properties: located,
            },
        );
    }

    fn os_release(&mut self) -> Result<parse::OsRelease, SbomError> {
        let root = self.stack.root();
        for path in [&b"/etc/os-release"[..], b"/usr/lib/os-release"] {
            if let Some((_, bytes)) = self.read_at(&root, path, MAX_FILE_BYTES)? {
                return Ok(parse::os_release(&bytes));
            }
        }
        Ok(parse::OsRelease::default())
    }

    fn dpkg(&mut self, distro: &str) -> Result<(), SbomError> {
        let root = self.stack.root();
        if let Some((file, bytes)) =
            self.read_at(&root, b"/var/lib/dpkg/status", MAX_STATUS_BYTES)?
        {
            self.debs(distro, &file, &bytes, true);
        }
        let Some(dir) = self.stack.dir(&root, b"/var/lib/dpkg/status.d")? else {
            return Ok(());
        };
        for name in self.stack.list(&dir)? {
            if name.starts_with(b".") || name.ends_with(b".md5sums") {
                continue;
            }
            if let Some((file, bytes)) = self.read_at(&dir, &name, MAX_STATUS_BYTES)? {
                self.debs(distro, &file, &bytes, false);
            }
        }
        Ok(())
    }

    fn debs(&mut self, distro: &str, file: &MergedFile, bytes: &[u8], status_required: bool) {
        let parsed = parse::dpkg_status(bytes, status_required);
        self.skipped.malformed += parsed.malformed;
        for deb in parsed.items {
            let mut purl = format!(
                "pkg:deb/{}/{}@{}",
                parse::purl_encode(distro),
                parse::purl_encode(&deb.package),
                parse::purl_encode(&deb.version)
            );
            if let Some(arch) = &deb.architecture {
                purl.push_str(&format!("?arch={}", parse::purl_encode(arch)));
            }
            let extra = deb
                .source
                .map(|source| vec![Property::new("airlock:dpkg:source", source)])
                .unwrap_or_default();
            self.add(Package {
                purl,
                name: deb.package,
                version: deb.version,
                file,
                extra,
            });
        }
    }

    fn apk(&mut self, distro: &str) -> Result<(), SbomError> {
        let root = self.stack.root();
        let Some((file, bytes)) =
            self.read_at(&root, b"/lib/apk/db/installed", MAX_STATUS_BYTES)?
        else {
            return Ok(());
        };
        let parsed = parse::apk_installed(&bytes);
        self.skipped.malformed += parsed.malformed;
        for apk in parsed.items {
            let mut purl = format!(
                "pkg:apk/{}/{}@{}",
                parse::purl_encode(distro),
                parse::purl_encode(&apk.package),
                parse::purl_encode(&apk.version)
            );
            if let Some(arch) = &apk.architecture {
                purl.push_str(&format!("?arch={}", parse::purl_encode(arch)));
            }
            let extra = apk
                .origin
                .map(|origin| vec![Property::new("airlock:apk:origin", origin)])
                .unwrap_or_default();
            self.add(Package {
                purl,
                name: apk.package,
                version: apk.version,
                file: &file,
                extra,
            });
        }
        Ok(())
    }

    fn python(&mut self) -> Result<(), SbomError> {
        let root = self.stack.root();
        for base in [&b"/usr/lib"[..], b"/usr/local/lib"] {
            let Some(lib) = self.stack.dir(&root, base)? else {
                continue;
            };
            for python in self.stack.list(&lib)? {
                if !python.starts_with(b"python3") {
                    continue;
                }
                for packages in [&b"site-packages"[..], b"dist-packages"] {
                    let mut path = python.clone();
                    path.push(b'/');
                    path.extend_from_slice(packages);
                    if let Some(dir) = self.stack.dir(&lib, &path)? {
                        self.site_packages(&dir)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn site_packages(&mut self, dir: &MergedDir) -> Result<(), SbomError> {
        for name in self.stack.list(dir)? {
            let metadata: &[u8] = if name.ends_with(b".dist-info") {
                b"METADATA"
            } else if name.ends_with(b".egg-info") {
                b"PKG-INFO"
            } else {
                continue;
            };
            let found = match self.stack.lookup(dir, &name)? {
                Some(stack::Found::Dir(info)) => self.read_at(&info, metadata, MAX_FILE_BYTES)?,
                // An `.egg-info` may be the PKG-INFO file itself.
                Some(stack::Found::File(mut file)) if metadata == b"PKG-INFO" => self
                    .read(&mut file, MAX_FILE_BYTES)?
                    .map(|bytes| (file, bytes)),
                _ => None,
            };
            let Some((file, bytes)) = found else {
                continue;
            };
            let Some((name, version)) = parse::python_metadata(&bytes) else {
                self.skipped.malformed += 1;
                continue;
            };
            let purl = format!(
                "pkg:pypi/{}@{}",
                parse::purl_encode(&parse::pep503(&name)),
                parse::purl_encode(&version)
            );
            self.add(Package {
                purl,
                name,
                version,
                file: &file,
                extra: Vec::new(),
            });
        }
        Ok(())
    }

    fn npm(&mut self) -> Result<(), SbomError> {
        let root = self.stack.root();
        for base in [
            &b"/usr/lib/node_modules"[..],
            b"/usr/local/lib/node_modules",
        ] {
            if let Some(dir) = self.stack.dir(&root, base)? {
                self.node_modules(&dir, true)?;
            }
        }
        Ok(())
    }

    /// The packages of a `node_modules` directory, and of each package's
    /// own `node_modules` if `nested`.
    fn node_modules(&mut self, dir: &MergedDir, nested: bool) -> Result<(), SbomError> {
        for name in self.stack.list(dir)? {
            if name.starts_with(b".") {
                continue;
            }
            if name.starts_with(b"@") {
                let Some(scope) = self.stack.dir(dir, &name)? else {
                    continue;
                };
                for scoped in self.stack.list(&scope)? {
                    if !scoped.starts_with(b".") {
                        self.npm_package(&scope, &scoped, nested)?;
                    }
                }
            } else {
                self.npm_package(dir, &name, nested)?;
            }
        }
        Ok(())
    }

    fn npm_package(
        &mut self,
        parent: &MergedDir,
        name: &[u8],
        nested: bool,
    ) -> Result<(), SbomError> {
        let Some(dir) = self.stack.dir(parent, name)? else {
            return Ok(());
        };
        if let Some((file, bytes)) = self.read_at(&dir, b"package.json", MAX_FILE_BYTES)? {
            match parse::npm_package(&bytes) {
                Some((scope, name, version)) => {
                    let (purl_name, full) = match &scope {
                        Some(scope) => (
                            format!(
                                "{}/{}",
                                parse::purl_encode(&format!("@{}", scope.to_lowercase())),
                                parse::purl_encode(&name.to_lowercase())
                            ),
                            format!("@{scope}/{name}"),
                        ),
                        None => (parse::purl_encode(&name.to_lowercase()), name),
                    };
                    let purl = format!("pkg:npm/{purl_name}@{}", parse::purl_encode(&version));
                    self.add(Package {
                        purl,
                        name: full,
                        version,
                        file: &file,
                        extra: Vec::new(),
                    });
                }
                None => self.skipped.malformed += 1,
            }
        }
        if nested {
            if let Some(inner) = self.stack.dir(&dir, b"node_modules")? {
                self.node_modules(&inner, false)?;
            }
        }
        Ok(())
    }

    fn finish(self, release: &parse::OsRelease) -> Sbom {
        let subject = self.subject;
        let mut properties: Vec<Property> = subject
            .layers
            .iter()
            .enumerate()
            .map(|(n, diff_id)| Property::new(format!("airlock:layer:{n}"), diff_id.clone()))
            .collect();
        if let Some(id) = &release.id {
            properties.push(Property::new("airlock:os-release:id", id.clone()));
        }
        if let Some(version_id) = &release.version_id {
            properties.push(Property::new(
                "airlock:os-release:version-id",
                version_id.clone(),
            ));
        }
        let hashes = match subject.digest.strip_prefix("sha256:") {
            Some(hex) if crate::is_sha256_digest(&subject.digest) => vec![Hash {
                alg: "SHA-256".into(),
                content: hex.to_owned(),
            }],
            _ => Vec::new(),
        };
        let skipped = self.skipped;
        let counts = [
            ("oversized", skipped.oversized),
            ("over-read-budget", skipped.over_read_budget),
            ("malformed", skipped.malformed),
            ("over-component-limit", skipped.over_component_limit),
            ("truncated-listings", skipped.truncated_listings),
        ];
        Sbom {
            bom_format: "CycloneDX".into(),
            spec_version: "1.5".into(),
            serial_number: serial_number(&subject.digest),
            version: 1,
            metadata: Metadata {
                tools: Tools {
                    components: vec![Component {
                        kind: "application".into(),
                        bom_ref: None,
                        name: "airlock".into(),
                        version: Some(env!("CARGO_PKG_VERSION").into()),
                        purl: None,
                        hashes: Vec::new(),
                        properties: Vec::new(),
                    }],
                },
                component: Component {
                    kind: "container".into(),
                    bom_ref: Some(subject.digest.clone()),
                    name: subject.name.clone(),
                    version: None,
                    purl: None,
                    hashes,
                    properties,
                },
                properties: counts
                    .iter()
                    .map(|(name, n)| {
                        Property::new(format!("airlock:skipped:{name}"), n.to_string())
                    })
                    .collect(),
            },
            components: self.components.into_values().collect(),
            skipped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serial_number_is_a_version_5_uuid_of_the_digest() {
        let a = serial_number("sha256:00");
        assert_eq!(a, serial_number("sha256:00"));
        assert_ne!(a, serial_number("sha256:01"));
        let uuid = a.strip_prefix("urn:uuid:").unwrap_or_default();
        let groups: Vec<&str> = uuid.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(groups[2].starts_with('5'), "{a}");
        assert!(
            matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'),
            "{a}"
        );
    }
}
