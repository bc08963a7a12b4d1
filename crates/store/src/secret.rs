//! Random ids and secrets, their hashes, and hex.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::StoreError;

/// The prefix of every new API key secret, so a leaked one is easy to
/// recognise (secret scanners, logs). It is e2b's: e2b SDKs 2.25.0–2.45.1
/// refuse, before sending, any API key not shaped `^e2b_[0-9a-f]+$`, so a
/// key of this shape works with every e2b SDK 2.x as it is.
pub const KEY_SECRET_PREFIX: &str = "e2b_";

/// The prefix of API keys made before [`KEY_SECRET_PREFIX`] became e2b's;
/// such keys stay valid (the store keeps only hashes, whatever the shape).
pub const LEGACY_KEY_SECRET_PREFIX: &str = "al_";

/// Whether `text` is shaped as an API key secret (either prefix), which
/// tells a bearer API key from a sandbox's access token (`at_`).
pub fn is_key_secret(text: &str) -> bool {
    text.starts_with(KEY_SECRET_PREFIX) || text.starts_with(LEGACY_KEY_SECRET_PREFIX)
}

/// Fills `buf` from the kernel's CSPRNG (`getrandom(2)`, which blocks only
/// until the pool is first initialised and needs no file descriptor).
pub(crate) fn random_bytes(buf: &mut [u8]) -> Result<(), StoreError> {
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(errno) => return Err(StoreError::Random(errno.into())),
        }
    }
    Ok(())
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// Decodes hex (either case); `None` on odd length or a non-hex digit.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let pairs = text.as_bytes().chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return None;
    }
    pairs
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// `prefix` followed by the hex of `n` random bytes.
pub(crate) fn random_id(prefix: &str, n: usize) -> Result<String, StoreError> {
    let mut buf = vec![0u8; n];
    random_bytes(&mut buf)?;
    Ok(format!("{prefix}{}", hex(&buf)))
}

/// A fresh sandbox id: `sbx-` and 16 hex digits (64 random bits).
pub fn new_sandbox_id() -> Result<String, StoreError> {
    random_id("sbx-", 8)
}

/// A fresh secret: `prefix` and the hex of 32 random bytes (256 bits). Used
/// for API keys (prefix [`KEY_SECRET_PREFIX`]) and sandbox access tokens.
/// Hand it to its owner once and store only [`hash_secret`] of it.
pub fn new_secret(prefix: &str) -> Result<String, StoreError> {
    random_id(prefix, 32)
}

/// SHA-256 of a presented secret: what the store keeps instead of it.
///
/// A plain (unsalted, fast) hash is right here because every secret is 256
/// random bits: there is no dictionary to attack, so key stretching would only
/// slow down each request.
pub fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Compares a stored hash with a computed one in constant time (for equal
/// lengths; a stored value of the wrong length is simply unequal).
pub(crate) fn hashes_match(stored: &[u8], computed: &[u8; 32]) -> bool {
    bool::from(stored.ct_eq(computed.as_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let bytes: Vec<u8> = (0..=255).collect();
        let text = hex(&bytes);
        assert_eq!(text.len(), 512);
        assert_eq!(unhex(&text).unwrap(), bytes);
        assert_eq!(unhex(&text.to_uppercase()).unwrap(), bytes);
        assert_eq!(hex(&[0x0a, 0xf0]), "0af0");
    }

    #[test]
    fn unhex_refuses_garbage() {
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex("é0"), None);
        assert_eq!(unhex(""), Some(vec![]));
    }

    #[test]
    fn ids_and_secrets_have_their_shape() {
        let id = new_sandbox_id().unwrap();
        assert_eq!(id.len(), 4 + 16);
        assert!(id.starts_with("sbx-"));
        assert!(id[4..].bytes().all(|b| b.is_ascii_hexdigit()));

        let secret = new_secret(KEY_SECRET_PREFIX).unwrap();
        assert_eq!(secret.len(), 4 + 64);
        // The shape e2b SDKs 2.25.0–2.45.1 insist on: ^e2b_[0-9a-f]+$.
        let hex = secret.strip_prefix("e2b_").unwrap();
        assert!(hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_ne!(secret, new_secret(KEY_SECRET_PREFIX).unwrap());
        assert!(is_key_secret(&secret) && is_key_secret("al_00") && !is_key_secret("at_00"));
    }

    #[test]
    fn hash_is_sha256() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            hex(&hash_secret("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn constant_time_comparison() {
        let h = hash_secret("one");
        assert!(hashes_match(&h, &h));
        assert!(!hashes_match(&hash_secret("two"), &h));
        let mut last_byte_differs = h;
        last_byte_differs[31] ^= 1;
        assert!(!hashes_match(&last_byte_differs, &h));
        assert!(!hashes_match(&h[..31], &h));
        assert!(!hashes_match(&[], &h));
    }
}
