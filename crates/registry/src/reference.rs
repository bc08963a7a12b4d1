//! Image references and the registries a daemon may pull from.
//!
//! A reference names its registry explicitly (`HOST[:PORT]/REPO[:TAG]`,
//! optionally `@sha256:<hex>`): there is no implied default registry, so
//! a bare `python:3.12` is refused rather than sent to a host nobody
//! chose. The registry part is recognised as Docker does: the first
//! component holds a `.` or a `:`, or is `localhost`.

use std::fmt;
use std::str::FromStr;

/// Longest reference accepted.
pub const MAX_REFERENCE_LEN: usize = 512;

/// A checked image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `host[:port]`, lowercase.
    pub registry: String,
    /// `path/of/repo`, lowercase.
    pub repository: String,
    /// The tag; `latest` when neither a tag nor a digest is given.
    pub tag: Option<String>,
    /// `sha256:<hex>` of the manifest, when pinned.
    pub digest: Option<String>,
}

/// Why a string is not an image reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("the image reference is empty or longer than {MAX_REFERENCE_LEN} characters")]
    Length,
    #[error("the image reference {0:?} names no registry: write it as HOST[:PORT]/REPOSITORY[:TAG] (there is no default registry)")]
    NoRegistry(String),
    #[error("{0:?} is not a registry host (letters, digits, `.` and `-`, then an optional :PORT)")]
    BadRegistry(String),
    #[error("{0:?} is not a repository path (lowercase letters and digits, separated by `.`, `_`, `-` or `/`)")]
    BadRepository(String),
    #[error(
        "{0:?} is not a tag (up to 128 letters, digits and `._-`, not starting with `.` or `-`)"
    )]
    BadTag(String),
    #[error("{0:?} is not a sha256 digest")]
    BadDigest(String),
}

fn is_registry(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    };
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|n| n > 0))
}

fn is_repository(path: &str) -> bool {
    !path.is_empty()
        && path.split('/').all(|component| {
            !component.is_empty()
                && component
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && component.starts_with(|c: char| c.is_ascii_alphanumeric())
                && component.ends_with(|c: char| c.is_ascii_alphanumeric())
                && !component.contains("..")
        })
}

fn is_tag(tag: &str) -> bool {
    (1..=128).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !tag.starts_with(['.', '-'])
}

fn names_registry(first: &str) -> bool {
    first.contains('.') || first.contains(':') || first == "localhost"
}

impl FromStr for ImageRef {
    type Err = ReferenceError;

    fn from_str(s: &str) -> Result<ImageRef, ReferenceError> {
        if s.is_empty() || s.len() > MAX_REFERENCE_LEN {
            return Err(ReferenceError::Length);
        }
        let (rest, digest) = match s.split_once('@') {
            Some((rest, digest)) => {
                if !airlock_layers::is_sha256_digest(digest) {
                    return Err(ReferenceError::BadDigest(digest.to_owned()));
                }
                (rest, Some(digest.to_owned()))
            }
            None => (s, None),
        };
        let (registry, path) = match rest.split_once('/') {
            Some((first, path)) if names_registry(first) => (first, path),
            _ => return Err(ReferenceError::NoRegistry(s.to_owned())),
        };
        let registry = registry.to_ascii_lowercase();
        if !is_registry(&registry) {
            return Err(ReferenceError::BadRegistry(registry));
        }
        // A `:` after the last `/` starts the tag.
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repository, tag)) if !tag.contains('/') => (repository, Some(tag)),
            _ => (path, None),
        };
        if !is_repository(repository) {
            return Err(ReferenceError::BadRepository(repository.to_owned()));
        }
        if let Some(tag) = tag.filter(|t| !is_tag(t)) {
            return Err(ReferenceError::BadTag(tag.to_owned()));
        }
        let tag = match (tag, &digest) {
            (Some(tag), _) => Some(tag.to_owned()),
            (None, Some(_)) => None,
            (None, None) => Some("latest".to_owned()),
        };
        Ok(ImageRef {
            registry,
            repository: repository.to_owned(),
            tag,
            digest,
        })
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl ImageRef {
    /// The last component of the repository, and the tag unless it is
    /// `latest`: what `template pull` names a template by default.
    pub fn default_template_name(&self) -> String {
        let last = self
            .repository
            .rsplit('/')
            .next()
            .unwrap_or(&self.repository);
        match self.tag.as_deref() {
            Some(tag) if tag != "latest" => format!("{last}:{tag}"),
            _ => last.to_owned(),
        }
    }

    pub(crate) fn to_oci(&self) -> oci_client::Reference {
        match (&self.tag, &self.digest) {
            (Some(tag), Some(digest)) => oci_client::Reference::with_tag_and_digest(
                self.registry.clone(),
                self.repository.clone(),
                tag.clone(),
                digest.clone(),
            ),
            (None, Some(digest)) => oci_client::Reference::with_digest(
                self.registry.clone(),
                self.repository.clone(),
                digest.clone(),
            ),
            (tag, None) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                tag.clone().unwrap_or_else(|| "latest".into()),
            ),
        }
    }
}

/// One entry of the allow-list: a registry (`host[:port]`), or a
/// repository prefix on one (`host[:port]/org`), which allows that
/// repository and everything beneath it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    registry: String,
    prefix: Option<String>,
}

impl FromStr for Allowed {
    type Err = ReferenceError;

    fn from_str(s: &str) -> Result<Allowed, ReferenceError> {
        let s = s.trim_end_matches('/');
        let (registry, prefix) = match s.split_once('/') {
            Some((registry, prefix)) => (registry, Some(prefix)),
            None => (s, None),
        };
        let registry = registry.to_ascii_lowercase();
        if !is_registry(&registry) {
            return Err(ReferenceError::BadRegistry(registry));
        }
        if let Some(prefix) = prefix.filter(|p| !is_repository(p)) {
            return Err(ReferenceError::BadRepository(prefix.to_owned()));
        }
        Ok(Allowed {
            registry,
            prefix: prefix.map(str::to_owned),
        })
    }
}

impl fmt::Display for Allowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.prefix {
            Some(prefix) => write!(f, "{}/{prefix}", self.registry),
            None => f.write_str(&self.registry),
        }
    }
}

impl Allowed {
    /// The registry, `host[:port]`.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// Whether this entry allows `image`.
    pub fn allows(&self, image: &ImageRef) -> bool {
        self.registry == image.registry
            && self.prefix.as_ref().is_none_or(|prefix| {
                image.repository == *prefix
                    || image
                        .repository
                        .strip_prefix(prefix.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ImageRef, ReferenceError> {
        s.parse()
    }

    #[test]
    fn a_reference_names_its_registry_or_is_refused() {
        let r = parse("localhost:5000/tools/python:3.12").unwrap();
        assert_eq!(r.registry, "localhost:5000");
        assert_eq!(r.repository, "tools/python");
        assert_eq!(r.tag.as_deref(), Some("3.12"));
        assert_eq!(r.default_template_name(), "python:3.12");
        let r = parse("Mirror.Example:443/busybox").unwrap();
        assert_eq!(r.registry, "mirror.example:443");
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert_eq!(r.default_template_name(), "busybox");
        assert_eq!(r.to_string(), "mirror.example:443/busybox:latest");
        for bare in ["python:3.12", "library/python", "busybox"] {
            assert!(
                matches!(parse(bare), Err(ReferenceError::NoRegistry(_))),
                "{bare}"
            );
        }
    }

    #[test]
    fn digests_pin_and_bad_parts_are_named() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let r = parse(&format!("localhost/x@{digest}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.digest.as_deref(), Some(digest.as_str()));
        assert!(matches!(
            parse("localhost/x@sha256:12"),
            Err(ReferenceError::BadDigest(_))
        ));
        assert!(matches!(
            parse("localhost/UPPER"),
            Err(ReferenceError::BadRepository(_))
        ));
        assert!(matches!(
            parse("localhost/a/../b"),
            Err(ReferenceError::BadRepository(_))
        ));
        assert!(matches!(
            parse("localhost/a//b"),
            Err(ReferenceError::BadRepository(_))
        ));
        assert!(matches!(
            parse("localhost/a:-x"),
            Err(ReferenceError::BadTag(_))
        ));
        assert!(matches!(
            parse("bad_host.x/a"),
            Err(ReferenceError::BadRegistry(_))
        ));
        assert!(matches!(
            parse("host.x:0/a"),
            Err(ReferenceError::BadRegistry(_))
        ));
        assert!(matches!(
            parse(&"a".repeat(600)),
            Err(ReferenceError::Length)
        ));
    }

    #[test]
    fn an_allowed_prefix_covers_its_repositories_only() {
        let allowed: Allowed = "localhost:5000/team".parse().unwrap();
        assert!(allowed.allows(&parse("localhost:5000/team").unwrap()));
        assert!(allowed.allows(&parse("localhost:5000/team/app:1").unwrap()));
        assert!(!allowed.allows(&parse("localhost:5000/teammate/app").unwrap()));
        assert!(!allowed.allows(&parse("localhost:5001/team/app").unwrap()));
        let registry: Allowed = "LOCALHOST:5000".parse().unwrap();
        assert!(registry.allows(&parse("localhost:5000/anything/at/all").unwrap()));
        assert!("not a host".parse::<Allowed>().is_err());
    }
}
