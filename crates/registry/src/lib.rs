//! Images from OCI registries (the distribution spec), for templates.
//!
//! - [`reference`]: image references, which always name their registry,
//!   and the operator's allow-list of registries and repository prefixes.
//! - [`auth`]: registry credentials from a `docker login`-style file.
//! - [`pull`]: a pull streamed into the layer store, every digest checked.
//! - [`signature`]: cosign-style signatures checked against the
//!   operator's public key, when one is configured.
//!
//! A registry is untrusted input like an archive: its layers go through
//! the same unpacker ([`airlock_layers::unpack`]), and nothing it sends
//! is trusted before its digest is checked. The daemon pulls only from
//! registries the operator listed; there is no default registry.

pub mod auth;
pub mod pull;
pub mod reference;
pub mod signature;

pub use auth::{read_auth_file, AuthFileError, Credential};
pub use pull::{PullLimits, PullProgress, PulledImage};
pub use reference::{Allowed, ImageRef, ReferenceError};
pub use signature::{KeyError, SignatureError, Trust};

use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use std::collections::HashMap;
use std::time::Duration;

/// How long connecting to a registry may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a registry may leave a response without a byte.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a pull failed. Nothing is left in the store's layers by a failed
/// pull but whole layers with checked digests.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("this daemon pulls from no registry: start it with --registry HOST[:PORT] (or --insecure-registry for one served over plain HTTP)")]
    NoRegistries,
    #[error("{image} is not in a registry this daemon pulls from ({allowed})")]
    NotAllowed { image: String, allowed: String },
    #[error("the registry {registry} cannot be reached")]
    Unreachable {
        registry: String,
        #[source]
        source: oci_client::errors::OciDistributionError,
    },
    #[error("the registry {registry} refused the credentials (or their absence) for {image}")]
    Unauthorized { registry: String, image: String },
    #[error("{image} does not exist in its registry")]
    NotFound { image: String },
    #[error("the registry {registry} failed: {message}")]
    Registry { registry: String, message: String },
    #[error("the transfer from {registry} broke off")]
    Transfer {
        registry: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the image is not valid: {message}")]
    BadImage { message: String },
    #[error("the image's layers are {bytes} bytes compressed, over the limit of {limit}")]
    TooLarge { bytes: u64, limit: u64 },
    #[error("{what} has digest {actual}, not {expected}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("layer {position} ({digest}) is not valid")]
    Layer {
        position: usize,
        digest: String,
        #[source]
        source: airlock_layers::unpack::UnpackError,
    },
    #[error("the image's signature does not verify")]
    Signature(#[from] SignatureError),
    #[error("the layer store failed")]
    Store(#[source] std::io::Error),
}

/// The part of a registry's error worth showing: its own words, without
/// the transport's internals.
pub(crate) fn registry_message(error: &OciDistributionError) -> String {
    match error {
        OciDistributionError::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .map(|e| format!("{:?}: {}", e.code, e.message))
            .collect::<Vec<_>>()
            .join("; "),
        OciDistributionError::ServerError { code, message, .. } => {
            format!("HTTP {code}: {message}")
        }
        other => other.to_string(),
    }
}

/// Whether the registry said the thing asked for does not exist.
pub(crate) fn is_not_found(error: &OciDistributionError) -> bool {
    match error {
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::NotFound
            )
        }),
        OciDistributionError::ServerError { code, .. } => *code == 404,
        _ => false,
    }
}

impl PullError {
    fn from_registry(image: &ImageRef, error: OciDistributionError) -> PullError {
        let registry = image.registry.clone();
        if is_not_found(&error) {
            return PullError::NotFound {
                image: image.to_string(),
            };
        }
        match error {
            OciDistributionError::AuthenticationFailure(_)
            | OciDistributionError::UnauthorizedError { .. } => PullError::Unauthorized {
                registry,
                image: image.to_string(),
            },
            OciDistributionError::RegistryError { ref envelope, .. }
                if envelope.errors.iter().any(|e| {
                    matches!(e.code, OciErrorCode::Unauthorized | OciErrorCode::Denied)
                }) =>
            {
                PullError::Unauthorized {
                    registry,
                    image: image.to_string(),
                }
            }
            OciDistributionError::RequestError(_) | OciDistributionError::IoError(_) => {
                PullError::Unreachable {
                    registry,
                    source: error,
                }
            }
            OciDistributionError::DigestError(_) => PullError::DigestMismatch {
                what: "a document the registry sent".into(),
                expected: "its descriptor's digest".into(),
                actual: registry_message(&error),
            },
            OciDistributionError::UnsupportedMediaTypeError(_)
            | OciDistributionError::ManifestParsingError(_)
            | OciDistributionError::VersionedParsingError(_)
            | OciDistributionError::UnsupportedSchemaVersionError(_)
            | OciDistributionError::ImageIndexParsingNoPlatformResolverError
            | OciDistributionError::JsonError(_)
            | OciDistributionError::ManifestEncodingError(_) => PullError::BadImage {
                message: registry_message(&error),
            },
            other => PullError::Registry {
                registry,
                message: registry_message(&other),
            },
        }
    }
}

/// The registries a daemon pulls from, how it reaches them, and what it
/// requires of their images.
pub struct Registries {
    allowed: Vec<Allowed>,
    credentials: HashMap<String, Credential>,
    trust: Option<Trust>,
    client: oci_client::Client,
}

impl std::fmt::Debug for Registries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registries")
            .field("allowed", &self.allowed)
            .field("credentials", &self.credentials.keys().collect::<Vec<_>>())
            .field("trust", &self.trust.is_some())
            .finish()
    }
}

impl Default for Registries {
    /// No registry: every pull is refused.
    fn default() -> Self {
        Registries::new(Vec::new(), Vec::new())
    }
}

impl Registries {
    /// Pulls only from `allowed` (registries or repository prefixes) and
    /// from `insecure`, registries (`host[:port]`) reached over plain HTTP.
    pub fn new(mut allowed: Vec<Allowed>, insecure: Vec<Allowed>) -> Registries {
        // reqwest is built without a default TLS provider (no C crypto
        // library): ring's is installed once for the process. An error
        // means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let plain_http: Vec<String> = insecure.iter().map(|a| a.registry().to_owned()).collect();
        allowed.extend(insecure);
        let client = oci_client::Client::new(oci_client::client::ClientConfig {
            protocol: oci_client::client::ClientProtocol::HttpsExcept(plain_http),
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            user_agent: concat!("airlock/", env!("CARGO_PKG_VERSION")),
            ..Default::default()
        });
        Registries {
            allowed,
            credentials: HashMap::new(),
            trust: None,
            client,
        }
    }

    /// Uses `credentials` (by registry) for the registries they name.
    pub fn with_credentials(mut self, credentials: HashMap<String, Credential>) -> Registries {
        self.credentials = credentials;
        self
    }

    /// Requires every pulled image to be signed with `trust`'s key.
    pub fn with_trust(mut self, trust: Trust) -> Registries {
        self.trust = Some(trust);
        self
    }

    /// The allow-list.
    pub fn allowed(&self) -> &[Allowed] {
        &self.allowed
    }

    /// Refuses `image` unless the allow-list covers it.
    pub fn check_allowed(&self, image: &ImageRef) -> Result<(), PullError> {
        if self.allowed.is_empty() {
            return Err(PullError::NoRegistries);
        }
        if self.allowed.iter().any(|a| a.allows(image)) {
            return Ok(());
        }
        Err(PullError::NotAllowed {
            image: image.to_string(),
            allowed: self
                .allowed
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    fn auth_for(&self, registry: &str) -> RegistryAuth {
        match self.credentials.get(registry) {
            Some(c) => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
            None => RegistryAuth::Anonymous,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(s: &str) -> ImageRef {
        s.parse().unwrap()
    }

    #[test]
    fn pulls_are_refused_outside_the_allow_list() {
        let none = Registries::default();
        assert!(matches!(
            none.check_allowed(&image("localhost:5000/a")),
            Err(PullError::NoRegistries)
        ));
        let some = Registries::new(
            vec!["mirror.example/team".parse().unwrap()],
            vec!["localhost:5000".parse().unwrap()],
        );
        assert!(some.check_allowed(&image("localhost:5000/a")).is_ok());
        assert!(some.check_allowed(&image("mirror.example/team/a")).is_ok());
        let refused = some
            .check_allowed(&image("mirror.example/other"))
            .unwrap_err();
        assert!(matches!(refused, PullError::NotAllowed { .. }));
        assert!(refused
            .to_string()
            .contains("mirror.example/team, localhost:5000"));
    }
}
