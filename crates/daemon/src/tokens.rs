//! Sandbox access tokens that the daemon can give out again.
//!
//! The store keeps only the SHA-256 of a sandbox's access token. Some
//! dialects must hand the token out again after create: the e2b control
//! plane answers `connect` and `GET /sandboxes/{id}` with the sandbox's
//! `envdAccessToken`, which the SDK then sends on every call into the
//! sandbox. So a token is not drawn at random but derived:
//! `at_` + hex(HMAC-SHA256(token key, sandbox id)), where the token key is
//! 256 random bits kept in `<data-dir>/token.key` (0600, created on first
//! start, like `admin.key`). Anyone who may read that file may also read
//! `admin.key`, so deriving adds no new way in; sandbox ids are never reused,
//! so each token is as unguessable as a random one.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// File name of the token key in the data directory.
pub const TOKEN_KEY_FILE: &str = "token.key";

/// Length of the key file's text: 64 hex digits, whose bytes are the key.
const BLOCK: usize = 64;

/// The secret that sandbox access tokens are derived from.
pub struct TokenKey {
    key: [u8; BLOCK],
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// The token key could not be read or created.
#[derive(Debug, thiserror::Error)]
pub enum TokenKeyError {
    #[error("cannot read or create the token key")]
    Io(#[from] std::io::Error),
    #[error("the token key file is malformed (expected 64 hex digits)")]
    Malformed,
    #[error("cannot draw random bytes for the token key")]
    Random,
}

impl TokenKey {
    /// Reads `<dir>/token.key`, creating it (0600) with a fresh key first.
    pub fn load_or_create(dir: &Path) -> Result<TokenKey, TokenKeyError> {
        let path = dir.join(TOKEN_KEY_FILE);
        std::fs::create_dir_all(dir)?;
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut file) => {
                let text = airlock_store::new_secret("").map_err(|_| TokenKeyError::Random)?;
                file.write_all(text.as_bytes())?;
                file.sync_all()?;
                TokenKey::from_text(&text)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let mut text = String::new();
                std::fs::File::open(&path)?.read_to_string(&mut text)?;
                TokenKey::from_text(text.trim())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The key written as 64 hex digits (its text bytes are the HMAC key).
    fn from_text(text: &str) -> Result<TokenKey, TokenKeyError> {
        if text.len() != BLOCK || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(TokenKeyError::Malformed);
        }
        let mut key = [0u8; BLOCK];
        key.copy_from_slice(text.as_bytes());
        Ok(TokenKey { key })
    }

    /// The access token of sandbox `id`.
    pub fn token_for(&self, id: &str) -> String {
        self.derive("at_", id.as_bytes())
    }

    /// The traffic token of sandbox `id`: what e2b's SDKs send as
    /// `E2B-Traffic-Access-Token` to ports other than envd's (the code
    /// interpreter's `/contexts` calls carry nothing else). It opens only
    /// those ports, so it is derived apart from the access token.
    pub fn traffic_token_for(&self, id: &str) -> String {
        let mut message = b"traffic\0".to_vec();
        message.extend_from_slice(id.as_bytes());
        self.derive("tt_", &message)
    }

    /// The content token of volume `id`: what e2b's SDKs send as a bearer
    /// token to the volume content API. It opens that one volume's files
    /// only, so it is derived apart from sandboxes' tokens.
    pub fn volume_token_for(&self, id: &str) -> String {
        let mut message = b"volume\0".to_vec();
        message.extend_from_slice(id.as_bytes());
        self.derive("vt_", &message)
    }

    /// `prefix` + hex(HMAC-SHA256(key, message)).
    fn derive(&self, prefix: &str, message: &[u8]) -> String {
        let mut mac = match Hmac::<Sha256>::new_from_slice(&self.key) {
            Ok(mac) => mac,
            // HMAC takes keys of any length; this cannot happen.
            Err(_) => return String::new(),
        };
        mac.update(message);
        let digest = mac.finalize().into_bytes();
        let mut token = String::with_capacity(prefix.len() + 64);
        token.push_str(prefix);
        for b in digest {
            token.push_str(&format!("{b:02x}"));
        }
        token
    }
}

/// Compares two secrets in time that depends only on their lengths.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |diff, (x, y)| diff | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_hmac_sha256() {
        // Computed independently: python3 -c 'import hmac, hashlib;
        // print(hmac.new(b"a"*64, b"sbx-1", hashlib.sha256).hexdigest())'
        let key = TokenKey { key: [b'a'; BLOCK] };
        assert_eq!(
            key.token_for("sbx-1"),
            "at_fc75dacc52eca34709b1bfd7ab763876c654960607aee537d67a500985b26639"
        );
    }

    #[test]
    fn key_is_created_once_and_reread() {
        let dir = tempfile::tempdir().unwrap();
        let first = TokenKey::load_or_create(dir.path()).unwrap();
        let again = TokenKey::load_or_create(dir.path()).unwrap();
        assert_eq!(first.token_for("sbx-00"), again.token_for("sbx-00"));
        assert_ne!(first.token_for("sbx-00"), first.token_for("sbx-01"));
        assert!(first.token_for("sbx-00").starts_with("at_"));
        assert_eq!(first.token_for("sbx-00").len(), 67);
        let mode = std::fs::metadata(dir.path().join(TOKEN_KEY_FILE))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
    }

    #[test]
    fn traffic_tokens_differ_from_access_tokens() {
        let key = TokenKey { key: [b'a'; BLOCK] };
        let traffic = key.traffic_token_for("sbx-1");
        assert!(traffic.starts_with("tt_"));
        assert_eq!(traffic.len(), 67);
        assert_ne!(traffic[3..], key.token_for("sbx-1")[3..]);
        assert!(same_secret(&traffic, &key.traffic_token_for("sbx-1")));
        assert!(!same_secret(&traffic, &key.traffic_token_for("sbx-2")));
        assert!(!same_secret(&traffic, "tt_"));
    }

    #[test]
    fn malformed_keys_are_refused() {
        assert!(TokenKey::from_text("abc").is_err());
        assert!(TokenKey::from_text(&"z".repeat(64)).is_err());
    }
}
