//! Images from archives: `docker save` output and OCI image layouts packed
//! in a tar (`oci-archive`), read in place.
//!
//! The archive is indexed once (name → offset and size of each file; tar
//! is not random access, but a file is), then its JSON documents are read
//! and checked and its layers unpacked straight from their place in the
//! archive: nothing is extracted to a temporary copy.
//!
//! Checked on the way in: every blob of an OCI layout has the digest its
//! descriptor names (manifest, configuration, layers); every layer, in
//! either format, has the `diff_id` the configuration lists for its
//! position; the documents are small (at most [`MAX_DOCUMENT_BYTES`]).
//! A layer already in the store (by `diff_id`) is not unpacked again.

use crate::store::{is_sha256_digest, LayerStore};
use crate::unpack::{unpack_layer, UnpackError, UnpackLimits, Unpacked};
use crate::ImageConfig;
use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest, MediaType};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Largest JSON document (index, manifest, configuration) read.
pub const MAX_DOCUMENT_BYTES: u64 = 4 << 20;
/// Most files an archive may hold.
pub const MAX_ARCHIVE_FILES: usize = 100_000;

/// Why an archive could not be imported. Nothing is left in the store's
/// layers by a failed import but whole layers with checked digests.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read the archive")]
    Read(#[source] std::io::Error),
    #[error("the archive is not a tar file, or is truncated")]
    NotTar(#[source] std::io::Error),
    #[error("the archive holds more than {MAX_ARCHIVE_FILES} files")]
    TooManyFiles,
    #[error("the archive is neither a docker-save archive (manifest.json) nor an OCI image layout (oci-layout, index.json)")]
    UnknownFormat,
    #[error("the archive has no file {0}")]
    Missing(String),
    #[error("{0} is larger than {MAX_DOCUMENT_BYTES} bytes")]
    DocumentTooLarge(String),
    #[error("{name} is not a valid {what}: {message}")]
    BadDocument {
        name: String,
        what: &'static str,
        message: String,
    },
    #[error("{name} has digest {actual}, not {expected} as its descriptor says")]
    DigestMismatch {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("the archive holds no image for linux/amd64")]
    NoImage,
    #[error("the archive holds {0} images; name one with --image (a tag it lists)")]
    WhichImage(usize),
    #[error("the image lists {layers} layers but its configuration {diff_ids} diff_ids")]
    LayerCount { layers: usize, diff_ids: usize },
    #[error("layer {position} ({name}) is not valid")]
    Layer {
        position: usize,
        name: String,
        #[source]
        source: UnpackError,
    },
    #[error("the layer store failed")]
    Store(#[source] std::io::Error),
}

/// One layer of an imported image.
#[derive(Debug, Clone)]
pub struct ImportedLayer {
    /// Its content digest (of the uncompressed tar).
    pub diff_id: String,
    /// Unpacked now (`Some`) or found in the store (`None`).
    pub unpacked: Option<Unpacked>,
}

/// An image read from an archive, its layers in the store.
#[derive(Debug, Clone)]
pub struct ImportedImage {
    /// `sha256:` digest of its configuration document.
    pub digest: String,
    /// How its containers start.
    pub config: ImageConfig,
    /// Bottom first.
    pub layers: Vec<ImportedLayer>,
    /// The tags the archive gives it (docker-save `RepoTags`, OCI
    /// `org.opencontainers.image.ref.name`).
    pub tags: Vec<String>,
}

/// What an import reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportProgress {
    /// Layer `position` of `of` is being unpacked, `bytes` of archive.
    Unpacking {
        position: usize,
        of: usize,
        bytes: u64,
    },
    /// Layer `position` was in the store already.
    Cached { position: usize, of: usize },
}

#[derive(Debug, Clone, Copy)]
struct Member {
    offset: u64,
    size: u64,
}

struct Archive {
    file: File,
    members: HashMap<String, Member>,
}

fn normalize(name: &str) -> String {
    name.trim_start_matches("./")
        .trim_start_matches('/')
        .to_owned()
}

impl Archive {
    fn open(path: &Path) -> Result<Archive, ImportError> {
        let file = File::open(path).map_err(ImportError::Read)?;
        let mut members = HashMap::new();
        {
            let mut archive = tar::Archive::new(&file);
            let entries = archive.entries_with_seek().map_err(ImportError::NotTar)?;
            for entry in entries {
                let entry = entry.map_err(ImportError::NotTar)?;
                if entry.header().entry_type() != tar::EntryType::Regular {
                    continue;
                }
                let name = normalize(&String::from_utf8_lossy(&entry.path_bytes()));
                members.insert(
                    name,
                    Member {
                        offset: entry.raw_file_position(),
                        size: entry.size(),
                    },
                );
                if members.len() > MAX_ARCHIVE_FILES {
                    return Err(ImportError::TooManyFiles);
                }
            }
        }
        Ok(Archive { file, members })
    }

    fn member(&self, name: &str) -> Result<Member, ImportError> {
        self.members
            .get(&normalize(name))
            .copied()
            .ok_or_else(|| ImportError::Missing(name.to_owned()))
    }

    fn reader(&self, member: Member) -> Result<impl Read + '_, ImportError> {
        let mut file = &self.file;
        file.seek(SeekFrom::Start(member.offset))
            .map_err(ImportError::Read)?;
        Ok(file.take(member.size))
    }

    fn document(&self, name: &str) -> Result<Vec<u8>, ImportError> {
        let member = self.member(name)?;
        if member.size > MAX_DOCUMENT_BYTES {
            return Err(ImportError::DocumentTooLarge(name.to_owned()));
        }
        let mut bytes = Vec::with_capacity(member.size as usize);
        self.reader(member)?
            .read_to_end(&mut bytes)
            .map_err(ImportError::Read)?;
        Ok(bytes)
    }
}

fn sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(71);
    out.push_str("sha256:");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

fn parse<T: serde::de::DeserializeOwned>(
    name: &str,
    what: &'static str,
    bytes: &[u8],
) -> Result<T, ImportError> {
    serde_json::from_slice(bytes).map_err(|e| ImportError::BadDocument {
        name: name.to_owned(),
        what,
        message: e.to_string(),
    })
}

fn blob_name(digest: &str) -> Result<String, ImportError> {
    if !is_sha256_digest(digest) {
        return Err(ImportError::BadDocument {
            name: digest.to_owned(),
            what: "sha256 digest",
            message: "only sha256 digests are supported".into(),
        });
    }
    Ok(format!("blobs/sha256/{}", &digest["sha256:".len()..]))
}

/// A blob of an OCI layout, checked against its digest.
fn checked_blob(archive: &Archive, digest: &str) -> Result<Vec<u8>, ImportError> {
    let name = blob_name(digest)?;
    let bytes = archive.document(&name)?;
    let actual = sha256(&bytes);
    if actual != digest {
        return Err(ImportError::DigestMismatch {
            name,
            expected: digest.to_owned(),
            actual,
        });
    }
    Ok(bytes)
}

/// Where a layer is in the archive and what it must hash to.
struct LayerSource {
    name: String,
    /// The blob digest the descriptor names (OCI only).
    digest: Option<String>,
}

/// Reads the image in the archive at `path` and brings its layers into
/// `store` (`have` says which diff_ids the store has recorded already).
/// `image` picks one of several images by tag.
pub fn import(
    path: &Path,
    image: Option<&str>,
    store: &LayerStore,
    have: &dyn Fn(&str) -> bool,
    limits: &UnpackLimits,
    progress: &mut dyn FnMut(ImportProgress),
) -> Result<ImportedImage, ImportError> {
    let archive = Archive::open(path)?;
    let (config_bytes, config_digest, sources, tags) = if archive.members.contains_key("index.json")
        && archive.members.contains_key("oci-layout")
    {
        oci_layout(&archive, image)?
    } else if archive.members.contains_key("manifest.json") {
        docker_save(&archive, image)?
    } else {
        return Err(ImportError::UnknownFormat);
    };
    let configuration: ImageConfiguration = parse(
        "the image configuration",
        "image configuration",
        &config_bytes,
    )?;
    let diff_ids = configuration.rootfs().diff_ids().clone();
    if diff_ids.len() != sources.len() {
        return Err(ImportError::LayerCount {
            layers: sources.len(),
            diff_ids: diff_ids.len(),
        });
    }
    let of = sources.len();
    let mut layers = Vec::with_capacity(of);
    for (position, (source, diff_id)) in sources.iter().zip(&diff_ids).enumerate() {
        if !is_sha256_digest(diff_id) {
            return Err(ImportError::BadDocument {
                name: "the image configuration".into(),
                what: "image configuration",
                message: format!("diff_id {diff_id:?} is not a sha256 digest"),
            });
        }
        if have(diff_id) && store.has(diff_id) {
            progress(ImportProgress::Cached { position, of });
            layers.push(ImportedLayer {
                diff_id: diff_id.clone(),
                unpacked: None,
            });
            continue;
        }
        let member = archive.member(&source.name)?;
        progress(ImportProgress::Unpacking {
            position,
            of,
            bytes: member.size,
        });
        let staging = store.stage().map_err(ImportError::Store)?;
        let layer_error = |source_error| ImportError::Layer {
            position,
            name: source.name.clone(),
            source: source_error,
        };
        let unpacked =
            unpack_layer(archive.reader(member)?, staging.path(), limits).map_err(layer_error)?;
        if let Some(expected) = &source.digest {
            if &unpacked.digest != expected {
                return Err(ImportError::DigestMismatch {
                    name: source.name.clone(),
                    expected: expected.clone(),
                    actual: unpacked.digest.clone(),
                });
            }
        }
        if &unpacked.diff_id != diff_id {
            return Err(ImportError::DigestMismatch {
                name: format!("{} (uncompressed)", source.name),
                expected: diff_id.clone(),
                actual: unpacked.diff_id.clone(),
            });
        }
        store.commit(staging, diff_id).map_err(ImportError::Store)?;
        layers.push(ImportedLayer {
            diff_id: diff_id.clone(),
            unpacked: Some(unpacked),
        });
    }
    Ok(ImportedImage {
        digest: config_digest,
        config: ImageConfig::from_oci(&configuration),
        layers,
        tags,
    })
}

type Found = (Vec<u8>, String, Vec<LayerSource>, Vec<String>);

fn docker_save(archive: &Archive, image: Option<&str>) -> Result<Found, ImportError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Entry {
        config: String,
        #[serde(default)]
        repo_tags: Option<Vec<String>>,
        layers: Vec<String>,
    }
    let entries: Vec<Entry> = parse(
        "manifest.json",
        "docker-save manifest",
        &archive.document("manifest.json")?,
    )?;
    let entry = pick(entries, image, |e| e.repo_tags.clone().unwrap_or_default())?;
    let config = archive.document(&entry.config)?;
    let digest = sha256(&config);
    let sources = entry
        .layers
        .iter()
        .map(|name| LayerSource {
            name: name.clone(),
            digest: None,
        })
        .collect();
    Ok((config, digest, sources, entry.repo_tags.unwrap_or_default()))
}

fn pick<T>(
    mut entries: Vec<T>,
    image: Option<&str>,
    tags: impl Fn(&T) -> Vec<String>,
) -> Result<T, ImportError> {
    match image {
        Some(wanted) => {
            let at = entries
                .iter()
                .position(|e| tags(e).iter().any(|t| t == wanted))
                .ok_or_else(|| ImportError::Missing(format!("an image tagged {wanted}")))?;
            Ok(entries.swap_remove(at))
        }
        None if entries.len() == 1 => Ok(entries.remove(0)),
        None if entries.is_empty() => Err(ImportError::NoImage),
        None => Err(ImportError::WhichImage(entries.len())),
    }
}

const REF_NAME: &str = "org.opencontainers.image.ref.name";

fn oci_layout(archive: &Archive, image: Option<&str>) -> Result<Found, ImportError> {
    let index: ImageIndex = parse(
        "index.json",
        "OCI image index",
        &archive.document("index.json")?,
    )?;
    let mut manifests = Vec::new();
    for descriptor in index.manifests() {
        let tag = descriptor
            .annotations()
            .as_ref()
            .and_then(|a| a.get(REF_NAME))
            .cloned();
        match descriptor.media_type() {
            MediaType::ImageManifest => manifests.push((descriptor.digest().to_string(), tag)),
            MediaType::ImageIndex => {
                // A multi-platform image: its linux/amd64 manifest.
                let nested: ImageIndex = parse(
                    &blob_name(descriptor.digest().as_ref())?,
                    "OCI image index",
                    &checked_blob(archive, descriptor.digest().as_ref())?,
                )?;
                let chosen = nested.manifests().iter().find(|m| {
                    m.platform().as_ref().is_some_and(|p| {
                        p.os().to_string() == "linux" && p.architecture().to_string() == "amd64"
                    })
                });
                match chosen {
                    Some(m) => manifests.push((m.digest().to_string(), tag)),
                    None => return Err(ImportError::NoImage),
                }
            }
            _ => {}
        }
    }
    let (manifest_digest, tag) = pick(manifests, image, |(_, tag)| tag.iter().cloned().collect())?;
    let manifest_name = blob_name(&manifest_digest)?;
    let manifest: ImageManifest = parse(
        &manifest_name,
        "OCI image manifest",
        &checked_blob(archive, &manifest_digest)?,
    )?;
    let config_digest = manifest.config().digest().to_string();
    let config = checked_blob(archive, &config_digest)?;
    let mut sources = Vec::new();
    for layer in manifest.layers() {
        let digest = layer.digest().to_string();
        sources.push(LayerSource {
            name: blob_name(&digest)?,
            digest: Some(digest),
        });
    }
    Ok((config, config_digest, sources, tag.into_iter().collect()))
}
