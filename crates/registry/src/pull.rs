//! Pulling an image: its manifest and configuration from the registry,
//! then each layer streamed from the registry straight into the layer
//! store's unpacker (no copy of the compressed blob is kept), a few layers
//! at a time.
//!
//! Checked on the way in: the manifest has the digest a pinned reference
//! names; the configuration has the digest the manifest names; every layer
//! has the digest its descriptor names, is no larger than the descriptor
//! says, and has the `diff_id` the configuration lists for its position;
//! the image's compressed size is within the caller's limit before any
//! layer is fetched. A layer already in the store is not fetched again.

use crate::{ImageRef, PullError, Registries};
use airlock_layers::archive::{ImportedImage, ImportedLayer};
use airlock_layers::unpack::{unpack_layer, UnpackLimits};
use airlock_layers::{is_sha256_digest, ImageConfig, LayerStore};
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use oci_client::manifest::OciDescriptor;
use oci_spec::image::ImageConfiguration;
use std::io::Read;
use std::sync::Arc;

/// Layers fetched at once.
const CONCURRENT_LAYERS: usize = 3;
/// Chunks in flight between a download and its unpacker.
const CHUNKS_IN_FLIGHT: usize = 32;
/// How often a download reports its bytes.
const PROGRESS_EVERY: u64 = 1 << 20;

/// What a pull may bring in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullLimits {
    /// The most compressed bytes of all the image's layers.
    pub max_image_bytes: u64,
    /// What one layer may unpack to.
    pub layer: UnpackLimits,
}

/// What a pull reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullProgress {
    /// The manifest is read: `layers` layers, of which those not in the
    /// store already are `bytes` compressed bytes to fetch. (Each layer
    /// found in the store was reported [`PullProgress::Cached`] before.)
    Resolved {
        manifest_digest: String,
        layers: usize,
        bytes: u64,
    },
    /// Layer `position` of `of` was in the store already.
    Cached { position: usize, of: usize },
    /// Layer `position` has arrived up to `bytes` of `total`.
    Downloading {
        position: usize,
        of: usize,
        bytes: u64,
        total: u64,
    },
    /// Layer `position` is whole, checked and in the store.
    Unpacked { position: usize, of: usize },
}

/// The image a pull brought in.
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// Its configuration digest, configuration and layers (as an import
    /// gives them).
    pub image: ImportedImage,
    /// `sha256:` digest of the manifest pulled.
    pub manifest_digest: String,
}

/// A blocking reader over the chunks a download sends.
struct Chunks {
    receiver: tokio::sync::mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.receiver.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current = self.current.slice(n..);
        Ok(n)
    }
}

/// A layer to fetch.
struct Wanted {
    position: usize,
    of: usize,
    descriptor: OciDescriptor,
    diff_id: String,
}

impl Registries {
    /// Pulls `image` into `store` (`have` says which diff_ids the state
    /// database records already).
    pub async fn pull(
        &self,
        image: &ImageRef,
        store: &LayerStore,
        have: &(dyn Fn(&str) -> bool + Sync),
        limits: PullLimits,
        progress: Arc<dyn Fn(PullProgress) + Send + Sync>,
    ) -> Result<PulledImage, PullError> {
        self.check_allowed(image)?;
        let reference = image.to_oci();
        let auth = self.auth_for(&image.registry);
        let (manifest, manifest_digest, config) = self
            .client
            .pull_manifest_and_config(&reference, &auth)
            .await
            .map_err(|e| PullError::from_registry(image, e))?;
        if let Some(pinned) = &image.digest {
            if *pinned != manifest_digest {
                return Err(PullError::DigestMismatch {
                    what: "the manifest".into(),
                    expected: pinned.clone(),
                    actual: manifest_digest,
                });
            }
        }
        if let Some(trust) = &self.trust {
            trust
                .verify(&self.client, &reference, &auth, &manifest_digest)
                .await?;
        }
        let configuration: ImageConfiguration =
            serde_json::from_str(&config).map_err(|e| PullError::BadImage {
                message: format!("its configuration is not an OCI image configuration: {e}"),
            })?;
        let diff_ids = configuration.rootfs().diff_ids().clone();
        if diff_ids.len() != manifest.layers.len() {
            return Err(PullError::BadImage {
                message: format!(
                    "its manifest lists {} layers but its configuration {} diff_ids",
                    manifest.layers.len(),
                    diff_ids.len()
                ),
            });
        }
        let mut total: u64 = 0;
        for layer in &manifest.layers {
            let size = u64::try_from(layer.size).map_err(|_| PullError::BadImage {
                message: format!("layer {} has a negative size", layer.digest),
            })?;
            if !is_sha256_digest(&layer.digest) {
                return Err(PullError::BadImage {
                    message: format!("layer digest {:?} is not a sha256 digest", layer.digest),
                });
            }
            total = total.saturating_add(size);
        }
        if total > limits.max_image_bytes {
            return Err(PullError::TooLarge {
                bytes: total,
                limit: limits.max_image_bytes,
            });
        }
        let of = manifest.layers.len();
        let mut wanted = Vec::new();
        let mut layers: Vec<Option<ImportedLayer>> = vec![None; of];
        for (position, (descriptor, diff_id)) in manifest.layers.iter().zip(&diff_ids).enumerate() {
            if !is_sha256_digest(diff_id) {
                return Err(PullError::BadImage {
                    message: format!("diff_id {diff_id:?} is not a sha256 digest"),
                });
            }
            if have(diff_id) && store.has(diff_id) {
                progress(PullProgress::Cached { position, of });
                layers[position] = Some(ImportedLayer {
                    diff_id: diff_id.clone(),
                    unpacked: None,
                });
            } else {
                wanted.push(Wanted {
                    position,
                    of,
                    descriptor: descriptor.clone(),
                    diff_id: diff_id.clone(),
                });
            }
        }
        progress(PullProgress::Resolved {
            manifest_digest: manifest_digest.clone(),
            layers: of,
            bytes: wanted
                .iter()
                .map(|w| u64::try_from(w.descriptor.size).unwrap_or(0))
                .sum(),
        });
        let fetched: Vec<(usize, ImportedLayer)> = futures_util::stream::iter(wanted)
            .map(|layer| self.fetch_layer(image, &reference, store, limits.layer, layer, &progress))
            .buffer_unordered(CONCURRENT_LAYERS)
            .try_collect()
            .await?;
        for (position, layer) in fetched {
            layers[position] = Some(layer);
        }
        Ok(PulledImage {
            image: ImportedImage {
                digest: manifest.config.digest.clone(),
                config: ImageConfig::from_oci(&configuration),
                layers: layers.into_iter().flatten().collect(),
                tags: vec![image.to_string()],
            },
            manifest_digest,
        })
    }

    async fn fetch_layer(
        &self,
        image: &ImageRef,
        reference: &oci_client::Reference,
        store: &LayerStore,
        limits: UnpackLimits,
        layer: Wanted,
        progress: &Arc<dyn Fn(PullProgress) + Send + Sync>,
    ) -> Result<(usize, ImportedLayer), PullError> {
        let Wanted {
            position,
            of,
            descriptor,
            diff_id,
        } = layer;
        let declared = u64::try_from(descriptor.size).unwrap_or(0);
        let staging = store.stage().map_err(PullError::Store)?;
        let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(CHUNKS_IN_FLIGHT);
        let unpacking = tokio::task::spawn_blocking(move || {
            let reader = Chunks {
                receiver,
                current: Bytes::new(),
            };
            let unpacked = unpack_layer(reader, staging.path(), &limits);
            (staging, unpacked)
        });
        let downloaded = async {
            let mut stream = self
                .client
                .pull_blob_stream(reference, &descriptor)
                .await
                .map_err(|e| PullError::from_registry(image, e))?;
            let mut bytes = 0u64;
            let mut reported = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|source| PullError::Transfer {
                    registry: image.registry.clone(),
                    source,
                })?;
                bytes += chunk.len() as u64;
                if bytes > declared {
                    return Err(PullError::DigestMismatch {
                        what: format!("layer {}", position + 1),
                        expected: format!("{} bytes ({})", declared, descriptor.digest),
                        actual: "more bytes".into(),
                    });
                }
                if bytes - reported >= PROGRESS_EVERY {
                    reported = bytes;
                    progress(PullProgress::Downloading {
                        position,
                        of,
                        bytes,
                        total: declared,
                    });
                }
                if sender.send(chunk).await.is_err() {
                    // The unpacker stopped: its error says why.
                    break;
                }
            }
            drop(sender);
            progress(PullProgress::Downloading {
                position,
                of,
                bytes,
                total: declared,
            });
            Ok::<(), PullError>(())
        }
        .await;
        let (staging, unpacked) = unpacking.await.map_err(|e| {
            PullError::Store(std::io::Error::other(format!("the unpacker failed: {e}")))
        })?;
        // A download that failed explains an unpacker that saw the stream end.
        downloaded?;
        let unpacked = unpacked.map_err(|source| PullError::Layer {
            position: position + 1,
            digest: descriptor.digest.clone(),
            source,
        })?;
        if unpacked.digest != descriptor.digest {
            return Err(PullError::DigestMismatch {
                what: format!("layer {}", position + 1),
                expected: descriptor.digest.clone(),
                actual: unpacked.digest,
            });
        }
        if unpacked.diff_id != diff_id {
            return Err(PullError::DigestMismatch {
                what: format!("layer {} (uncompressed)", position + 1),
                expected: diff_id,
                actual: unpacked.diff_id,
            });
        }
        let committing = store.clone();
        let id = diff_id.clone();
        tokio::task::spawn_blocking(move || committing.commit(staging, &id))
            .await
            .map_err(|e| PullError::Store(std::io::Error::other(e.to_string())))?
            .map_err(PullError::Store)?;
        progress(PullProgress::Unpacked { position, of });
        Ok((
            position,
            ImportedLayer {
                diff_id,
                unpacked: Some(unpacked),
            },
        ))
    }
}
