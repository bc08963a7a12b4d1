//! Image signatures in the form `cosign sign --key` writes (and `skopeo
//! copy --sign-by-sigstore-private-key` with sigstore attachments): for a
//! manifest of digest `sha256:HEX`, the tag `sha256-HEX.sig` of the same
//! repository holds a manifest whose layers are "simple signing" payloads
//! (`application/vnd.dev.cosign.simplesigning.v1+json`), each carrying its
//! signature, base64 of an ASN.1 ECDSA P-256/SHA-256 signature over the
//! payload, in the annotation `dev.cosignproject.cosign/signature`.
//!
//! An image verifies when one payload is signed by the operator's public
//! key (PEM, as `cosign generate-key-pair` writes `cosign.pub`) and names
//! the pulled manifest's digest in `critical.image.docker-manifest-digest`.
//! The signature binds the content (the digest), not the repository it is
//! pulled from, so an image signed at its origin verifies from a mirror.
//! Keyless (Fulcio certificate) signatures are not accepted: there is no
//! transparency log to ask offline.

use crate::PullError;
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey;

/// The media type of a simple signing payload.
pub const PAYLOAD_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation holding a payload's signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The `critical.type` of a container image signature.
pub const PAYLOAD_TYPE: &str = "cosign container image signature";
/// Largest payload read.
const MAX_PAYLOAD_BYTES: i64 = 64 << 10;
/// Most signatures tried.
const MAX_SIGNATURES: usize = 16;

/// Why a public key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the signing key {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a PEM ECDSA P-256 public key (as `cosign generate-key-pair` writes cosign.pub)")]
    Format { path: String },
}

/// Why an image's signature did not verify.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    #[error("the image has no signature (no tag {tag}); this daemon pulls only images signed by its key")]
    Unsigned { tag: String },
    #[error("no signature of the image verifies with this daemon's key")]
    NoValidSignature,
    #[error("the image's signature manifest cannot be read: {message}")]
    Unreadable { message: String },
}

/// The key every pulled image must be signed with.
#[derive(Debug, Clone)]
pub struct Trust {
    key: VerifyingKey,
}

#[derive(serde::Deserialize)]
struct Payload {
    critical: Critical,
}

#[derive(serde::Deserialize)]
struct Critical {
    image: PayloadImage,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(serde::Deserialize)]
struct PayloadImage {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// The tag that holds the signatures of the manifest `digest`.
pub fn signature_tag(manifest_digest: &str) -> String {
    format!("{}.sig", manifest_digest.replacen(':', "-", 1))
}

impl Trust {
    /// The key in the PEM text `pem` (`shown` names it in errors).
    pub fn from_pem(pem: &str, shown: &str) -> Result<Trust, KeyError> {
        let key = VerifyingKey::from_public_key_pem(pem.trim()).map_err(|_| KeyError::Format {
            path: shown.to_owned(),
        })?;
        Ok(Trust { key })
    }

    /// The key in the file `path`.
    pub fn from_file(path: &std::path::Path) -> Result<Trust, KeyError> {
        let shown = path.display().to_string();
        let pem = std::fs::read_to_string(path).map_err(|source| KeyError::Read {
            path: shown.clone(),
            source,
        })?;
        Trust::from_pem(&pem, &shown)
    }

    /// Whether `payload`, with the base64 `signature`, is a signature by
    /// this key of the manifest `manifest_digest`.
    pub fn verifies(&self, payload: &[u8], signature: &str, manifest_digest: &str) -> bool {
        use base64::Engine;
        let Ok(der) = base64::engine::general_purpose::STANDARD.decode(signature.trim()) else {
            return false;
        };
        let Ok(signature) = Signature::from_der(&der) else {
            return false;
        };
        if self.key.verify(payload, &signature).is_err() {
            return false;
        }
        // Only a signed payload is read.
        serde_json::from_slice::<Payload>(payload).is_ok_and(|p| {
            p.critical.kind == PAYLOAD_TYPE
                && p.critical.image.docker_manifest_digest == manifest_digest
        })
    }

    /// Fetches the signatures of `manifest_digest` next to `reference`
    /// and checks that one of them verifies.
    pub(crate) async fn verify(
        &self,
        client: &oci_client::Client,
        reference: &oci_client::Reference,
        auth: &RegistryAuth,
        manifest_digest: &str,
    ) -> Result<(), PullError> {
        let tag = signature_tag(manifest_digest);
        let signatures = oci_client::Reference::with_tag(
            reference.registry().to_owned(),
            reference.repository().to_owned(),
            tag.clone(),
        );
        let manifest = match client.pull_image_manifest(&signatures, auth).await {
            Ok((manifest, _)) => manifest,
            Err(e) if crate::is_not_found(&e) => {
                return Err(SignatureError::Unsigned { tag }.into())
            }
            Err(e) => {
                return Err(SignatureError::Unreadable {
                    message: crate::registry_message(&e),
                }
                .into())
            }
        };
        for layer in manifest.layers.iter().take(MAX_SIGNATURES) {
            if !self.candidate(layer) {
                continue;
            }
            let Some(signature) = layer
                .annotations
                .as_ref()
                .and_then(|a| a.get(SIGNATURE_ANNOTATION))
            else {
                continue;
            };
            let mut payload = Vec::new();
            if client
                .pull_blob(&signatures, layer, &mut payload)
                .await
                .is_err()
            {
                continue;
            }
            if self.verifies(&payload, signature, manifest_digest) {
                return Ok(());
            }
        }
        Err(SignatureError::NoValidSignature.into())
    }

    fn candidate(&self, layer: &OciDescriptor) -> bool {
        layer.media_type == PAYLOAD_MEDIA_TYPE && (0..=MAX_PAYLOAD_BYTES).contains(&layer.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer;
    use p256::ecdsa::SigningKey;
    use p256::pkcs8::{EncodePublicKey, LineEnding};

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32].into()).unwrap()
    }

    fn trust_of(signing: &SigningKey) -> Trust {
        let pem = signing
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap();
        Trust::from_pem(&pem, "cosign.pub").unwrap()
    }

    fn sign(signing: &SigningKey, payload: &[u8]) -> String {
        use base64::Engine;
        let signature: Signature = signing.sign(payload);
        base64::engine::general_purpose::STANDARD.encode(signature.to_der().as_bytes())
    }

    fn payload(digest: &str) -> Vec<u8> {
        format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"localhost:5000/app"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"{PAYLOAD_TYPE}"}},"optional":null}}"#
        )
        .into_bytes()
    }

    #[test]
    fn a_payload_verifies_only_with_its_key_and_its_digest() {
        let digest = format!("sha256:{}", "1".repeat(64));
        let other = format!("sha256:{}", "2".repeat(64));
        let signing = key(7);
        let trust = trust_of(&signing);
        let body = payload(&digest);
        let signature = sign(&signing, &body);
        assert!(trust.verifies(&body, &signature, &digest));
        // Another manifest.
        assert!(!trust.verifies(&body, &signature, &other));
        // Another key.
        assert!(!trust_of(&key(8)).verifies(&body, &signature, &digest));
        // A changed payload.
        let mut changed = body.clone();
        changed[10] ^= 1;
        assert!(!trust.verifies(&changed, &signature, &digest));
        // Not a signature at all.
        assert!(!trust.verifies(&body, "bm90IGEgc2lnbmF0dXJl", &digest));
        assert!(!trust.verifies(&body, "%%%", &digest));
        // A signed document that is not an image signature.
        let other_kind = br#"{"critical":{"image":{"docker-manifest-digest":"x"},"type":"other"}}"#;
        assert!(!trust.verifies(other_kind, &sign(&signing, other_kind), &digest));
    }

    #[test]
    fn keys_and_tags_have_the_cosign_forms() {
        assert!(matches!(
            Trust::from_pem("not pem", "k"),
            Err(KeyError::Format { .. })
        ));
        assert_eq!(
            signature_tag(&format!("sha256:{}", "ab".repeat(32))),
            format!("sha256-{}.sig", "ab".repeat(32))
        );
    }
}
