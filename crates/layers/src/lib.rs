//! The layer store: what a template is made of.
//!
//! - [`unpack`]: one OCI layer (tar, gzip or zstd) into a directory, with
//!   hostile entries refused and whiteouts in overlayfs form.
//! - [`store`]: the directory of unpacked layers, named by `diff_id`, with
//!   staging that a crash cannot leave half-done under a layer's name.
//! - [`archive`]: images from `docker save` archives and OCI layouts.
//! - [`bootstrap`]: a Debian system from the host's apt sources
//!   (mmdebstrap), the `base` template.
//! - [`sbom`]: a template's software bill of materials (CycloneDX 1.5):
//!   the dpkg, apk, Python and npm packages of its merged layers.
//! - [`snapshot`]: a sandbox's writable overlayfs upper (hostile, read by
//!   descriptor) frozen into an OCI layer tar stream, deterministically.
//! - [`keep`]: that stream kept as a zstd-compressed archive while it is
//!   unpacked (a snapshot's portable form).
//!
//! Which layers are referenced (by templates, by sandboxes) is the state
//! database's business (`airlock-store`); this crate holds the files.
#![forbid(unsafe_code)]

pub mod archive;
pub mod bootstrap;
pub mod keep;
pub mod sbom;
pub mod snapshot;
pub mod store;
pub mod unpack;

pub use archive::{import, ImportError, ImportProgress, ImportedImage};
pub use store::{is_sha256_digest, LayerStore, Swept};

use serde::{Deserialize, Serialize};

/// How a sandbox of a template starts, from its image configuration: what
/// the daemon applies beneath a create's own settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageConfig {
    /// `KEY=VALUE` environment entries.
    pub env: Vec<String>,
    /// The working directory; `None` for the default.
    pub workdir: Option<String>,
    /// `USER` (a name or uid[:gid]); `None` for the default.
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// A command (for `/bin/sh -c`) every sandbox of the template runs in
    /// the background once it is up (the e2b Template SDK's start command);
    /// a create answers once `ready_cmd` succeeds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<String>,
    /// A command (for `/bin/sh -c`) that succeeds once the start command's
    /// work is ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready_cmd: Option<String>,
}

impl ImageConfig {
    /// The configuration an OCI image configuration document gives.
    pub fn from_oci(configuration: &oci_spec::image::ImageConfiguration) -> ImageConfig {
        let Some(config) = configuration.config() else {
            return ImageConfig::default();
        };
        let nonempty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
        ImageConfig {
            env: config.env().clone().unwrap_or_default(),
            workdir: nonempty(config.working_dir()),
            user: nonempty(config.user()),
            entrypoint: config.entrypoint().clone().unwrap_or_default(),
            cmd: config.cmd().clone().unwrap_or_default(),
            start_cmd: None,
            ready_cmd: None,
        }
    }
}
