//! Registry credentials, read from a file in the format `docker login`,
//! `podman login` and `skopeo login` write (`{"auths": {HOST: {"auth":
//! base64("user:password")}}}`), so an operator reuses the file they have.
//! Credential helpers (`credsStore`) are not run: the daemon executes no
//! program a file names.

use base64::Engine;
use std::collections::HashMap;
use std::path::Path;

/// Largest credentials file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// A user name and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why a credentials file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("cannot read the registry credentials file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the registry credentials file {path} is larger than 1 MiB")]
    TooLarge { path: String },
    #[error("the registry credentials file {path} is not JSON of the form {{\"auths\": {{HOST: {{\"auth\": BASE64}}}}}}: {message}")]
    Format { path: String, message: String },
    #[error("the credentials for {registry} in {path} are not base64 of USER:PASSWORD")]
    BadAuth { path: String, registry: String },
}

#[derive(serde::Deserialize)]
struct File {
    #[serde(default)]
    auths: HashMap<String, Entry>,
}

#[derive(serde::Deserialize)]
struct Entry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

/// The registry a key of `auths` names: `https://host:port/v1/` and
/// `host:port` both name `host:port`.
fn registry_of(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key).to_ascii_lowercase()
}

/// Reads the credentials in `path`, by registry (`host[:port]`).
pub fn read_auth_file(path: &Path) -> Result<HashMap<String, Credential>, AuthFileError> {
    let shown = path.display().to_string();
    let read = |source| AuthFileError::Read {
        path: shown.clone(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(AuthFileError::TooLarge { path: shown });
    }
    let text = std::fs::read(path).map_err(read)?;
    parse_auth_file(&text, &shown)
}

/// Parses the text of a credentials file (`shown` names it in errors).
pub fn parse_auth_file(
    text: &[u8],
    shown: &str,
) -> Result<HashMap<String, Credential>, AuthFileError> {
    let file: File = serde_json::from_slice(text).map_err(|e| AuthFileError::Format {
        path: shown.to_owned(),
        message: e.to_string(),
    })?;
    let mut credentials = HashMap::new();
    for (key, entry) in file.auths {
        let registry = registry_of(&key);
        let bad = || AuthFileError::BadAuth {
            path: shown.to_owned(),
            registry: registry.clone(),
        };
        let credential = match (entry.auth, entry.username, entry.password) {
            (Some(auth), _, _) if !auth.is_empty() => {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .map_err(|_| bad())?;
                let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
                let (username, password) = decoded.split_once(':').ok_or_else(bad)?;
                Credential {
                    username: username.to_owned(),
                    password: password.to_owned(),
                }
            }
            (_, Some(username), Some(password)) => Credential { username, password },
            // An entry without credentials (a helper's placeholder).
            _ => continue,
        };
        credentials.insert(registry, credential);
    }
    Ok(credentials)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_login_files_are_read_by_registry() {
        let text = br#"{"auths": {
            "https://LOCALHOST:5000/v1/": {"auth": "YWxpY2U6czNjcjN0OndpdGg6Y29sb25z"},
            "mirror.example": {"username": "bob", "password": "pw"},
            "helper.example": {}
        }, "credsStore": "desktop"}"#;
        let creds = parse_auth_file(text, "auth.json").unwrap();
        assert_eq!(creds.len(), 2);
        assert_eq!(creds["localhost:5000"].username, "alice");
        assert_eq!(creds["localhost:5000"].password, "s3cr3t:with:colons");
        assert_eq!(creds["mirror.example"].username, "bob");
        assert!(!format!("{:?}", creds["mirror.example"]).contains("pw"));
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        assert!(matches!(
            parse_auth_file(b"\"text\"", "f"),
            Err(AuthFileError::Format { .. })
        ));
        assert!(matches!(
            parse_auth_file(br#"{"auths": {"h.x": {"auth": "!!"}}}"#, "f"),
            Err(AuthFileError::BadAuth { .. })
        ));
        assert!(matches!(
            parse_auth_file(br#"{"auths": {"h.x": {"auth": "bm9jb2xvbg=="}}}"#, "f"),
            Err(AuthFileError::BadAuth { .. })
        ));
    }
}
