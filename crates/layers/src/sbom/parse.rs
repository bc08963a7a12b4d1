//! The package databases' formats, parsed from bytes a hostile image
//! wrote: no input panics, a record that is not well formed is counted and
//! left out, and every name and version kept is one printable token of at
//! most [`MAX_TOKEN`] bytes.

use serde::Deserialize;

/// The longest name, version or architecture kept, in bytes.
pub(crate) const MAX_TOKEN: usize = 256;

/// Records parsed from one file, and how many were not well formed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Parsed<T> {
    pub(crate) items: Vec<T>,
    pub(crate) malformed: u64,
}

impl<T> Default for Parsed<T> {
    fn default() -> Self {
        Parsed {
            items: Vec::new(),
            malformed: 0,
        }
    }
}

/// An installed Debian package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deb {
    pub(crate) package: String,
    pub(crate) version: String,
    pub(crate) architecture: Option<String>,
    /// `Source:` as written (`NAME` or `NAME (VERSION)`), when present.
    pub(crate) source: Option<String>,
}

/// An installed Alpine package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Apk {
    pub(crate) package: String,
    pub(crate) version: String,
    pub(crate) architecture: Option<String>,
    /// `o:`, the origin (source) package.
    pub(crate) origin: Option<String>,
}

/// The `/etc/os-release` fields the document uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OsRelease {
    pub(crate) id: Option<String>,
    pub(crate) version_id: Option<String>,
}

/// `value` as a token: UTF-8, not empty, at most [`MAX_TOKEN`] bytes, with
/// no whitespace or control characters.
fn token(value: &[u8]) -> Option<String> {
    if value.is_empty() || value.len() > MAX_TOKEN {
        return None;
    }
    let value = std::str::from_utf8(value).ok()?;
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return None;
    }
    Some(value.to_owned())
}

fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

/// The paragraphs of a deb822-style file (`KEY: VALUE` lines, paragraphs
/// separated by blank lines), each as its lines without the newline.
fn paragraphs(text: &[u8]) -> Vec<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if trim(line).is_empty() {
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
        } else {
            current.push(line);
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The fields of one paragraph (continuation lines dropped), or `None` if
/// a line is neither a field nor a continuation.
fn fields<'a>(paragraph: &[&'a [u8]]) -> Option<Vec<(&'a [u8], &'a [u8])>> {
    let mut out = Vec::with_capacity(paragraph.len());
    for line in paragraph {
        if line.starts_with(b" ") || line.starts_with(b"\t") {
            continue;
        }
        let colon = line.iter().position(|&b| b == b':')?;
        let name = trim(&line[..colon]);
        if name.is_empty() {
            return None;
        }
        out.push((name, trim(&line[colon + 1..])));
    }
    Some(out)
}

fn field<'a>(fields: &[(&[u8], &'a [u8])], name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| *v)
}

/// The installed packages of a dpkg status file. A paragraph counts when
/// its `Status:` is `install ok installed`; one without a `Status:` counts
/// only if `status_required` is false (distroless `status.d/` files have
/// none). A paragraph not installed is left out without being counted as
/// malformed.
pub(crate) fn dpkg_status(text: &[u8], status_required: bool) -> Parsed<Deb> {
    let mut parsed = Parsed::default();
    for paragraph in paragraphs(text) {
        let Some(fields) = fields(&paragraph) else {
            parsed.malformed += 1;
            continue;
        };
        match field(&fields, "Status") {
            Some(status) => {
                let words: Vec<&[u8]> = status
                    .split(u8::is_ascii_whitespace)
                    .filter(|w| !w.is_empty())
                    .collect();
                if words != [&b"install"[..], b"ok", b"installed"] {
                    continue;
                }
            }
            None if status_required => continue,
            None => {}
        }
        let package = field(&fields, "Package").and_then(token);
        let version = field(&fields, "Version").and_then(token);
        let (Some(package), Some(version)) = (package, version) else {
            parsed.malformed += 1;
            continue;
        };
        let source = field(&fields, "Source")
            .filter(|s| !s.is_empty() && s.len() <= MAX_TOKEN)
            .and_then(|s| std::str::from_utf8(s).ok())
            .filter(|s| !s.chars().any(char::is_control))
            .map(str::to_owned);
        parsed.items.push(Deb {
            package,
            version,
            architecture: field(&fields, "Architecture").and_then(token),
            source,
        });
    }
    parsed
}

/// The packages of an apk database (`/lib/apk/db/installed`): paragraphs
/// of `K:VALUE` lines with a one-letter key.
pub(crate) fn apk_installed(text: &[u8]) -> Parsed<Apk> {
    let mut parsed = Parsed::default();
    for paragraph in paragraphs(text) {
        let mut package = None;
        let mut version = None;
        let mut architecture = None;
        let mut origin = None;
        let mut well_formed = true;
        for line in paragraph {
            let (key, value) = match line {
                [key, b':', value @ ..] => (*key, value),
                _ => {
                    well_formed = false;
                    break;
                }
            };
            let slot = match key {
                b'P' => &mut package,
                b'V' => &mut version,
                b'A' => &mut architecture,
                b'o' => &mut origin,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(value);
            }
        }
        let package = package.and_then(token);
        let version = version.and_then(token);
        match (well_formed, package, version) {
            (true, Some(package), Some(version)) => parsed.items.push(Apk {
                package,
                version,
                architecture: architecture.and_then(token),
                origin: origin.and_then(token),
            }),
            _ => parsed.malformed += 1,
        }
    }
    parsed
}

/// `Name:` and `Version:` of a Python distribution's core metadata
/// (`METADATA` or `PKG-INFO`: email-style headers up to the first blank
/// line), the name checked against PEP 508's form.
pub(crate) fn python_metadata(text: &[u8]) -> Option<(String, String)> {
    let headers = paragraphs(text).into_iter().next()?;
    let mut name = None;
    let mut version = None;
    for line in headers {
        if line.starts_with(b" ") || line.starts_with(b"\t") {
            continue;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (key, value) = (trim(&line[..colon]), trim(&line[colon + 1..]));
        if key.eq_ignore_ascii_case(b"name") && name.is_none() {
            name = Some(value);
        } else if key.eq_ignore_ascii_case(b"version") && version.is_none() {
            version = Some(value);
        }
    }
    let name = token(name?).filter(|n| is_pep508_name(n))?;
    Some((name, token(version?)?))
}

/// PEP 508's distribution name: ASCII letters, digits, `.`, `_` and `-`,
/// starting and ending with a letter or digit.
fn is_pep508_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    edge(bytes.first())
        && edge(bytes.last())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// PEP 503's normalised name: lowercase, each run of `-`, `_` and `.` one
/// `-`.
pub(crate) fn pep503(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_run {
                out.push('-');
            }
            in_run = true;
        } else {
            out.extend(c.to_lowercase());
            in_run = false;
        }
    }
    out
}

#[derive(Deserialize)]
struct PackageJson {
    name: Option<String>,
    version: Option<String>,
}

/// `name` (split into its scope, without the `@`, and the rest) and
/// `version` of an npm `package.json`.
pub(crate) fn npm_package(text: &[u8]) -> Option<(Option<String>, String, String)> {
    let json: PackageJson = serde_json::from_slice(text).ok()?;
    let full = json.name?;
    if full.len() > 214 {
        return None;
    }
    let (scope, name) = match full.strip_prefix('@') {
        Some(scoped) => {
            let (scope, name) = scoped.split_once('/')?;
            (Some(scope), name)
        }
        None => (None, full.as_str()),
    };
    let part = |s: &str| token(s.as_bytes()).filter(|s| !s.contains('/'));
    let scope = match scope {
        Some(scope) => Some(part(scope)?),
        None => None,
    };
    Some((scope, part(name)?, token(json.version?.as_bytes())?))
}

/// `ID` and `VERSION_ID` of an os-release file (`KEY=VALUE` lines, values
/// optionally quoted); `ID` kept only in os-release's own form
/// (`[a-z0-9._-]`).
pub(crate) fn os_release(text: &[u8]) -> OsRelease {
    let mut release = OsRelease::default();
    for line in text.split(|&b| b == b'\n') {
        let Some(eq) = line.iter().position(|&b| b == b'=') else {
            continue;
        };
        let key = trim(&line[..eq]);
        let mut value = trim(&line[eq + 1..]);
        for quote in [b'"', b'\''] {
            if value.len() >= 2 && value[0] == quote && value[value.len() - 1] == quote {
                value = &value[1..value.len() - 1];
            }
        }
        let slot = match key {
            b"ID" => &mut release.id,
            b"VERSION_ID" => &mut release.version_id,
            _ => continue,
        };
        if slot.is_none() {
            *slot = token(value);
        }
    }
    release.id = release.id.filter(|id| {
        id.len() <= 64
            && id.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
    });
    release
}

/// `value` percent-encoded for a package URL: ASCII letters, digits,
/// `.`, `-`, `_`, `~` and `:` stay, every other byte is `%XX`.
pub(crate) fn purl_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'~' | b':') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &[u8] = b"Package: libc6\n\
Status: install ok installed\n\
Architecture: amd64\n\
Source: glibc (2.36-9)\n\
Version: 2.36-9+deb12u4\n\
Description: GNU C Library\n \
continued: not a field\n\
\n\
Package: gone\n\
Status: deinstall ok config-files\n\
Version: 1.0\n\
\n\
Package: broken\n\
Status: install ok installed\n\
\n\
\n\
Package: zlib1g\r\n\
Status: install  ok  installed\r\n\
Version: 1:1.2.13.dfsg-1\r\n";

    #[test]
    fn a_dpkg_status_gives_its_installed_packages() {
        let parsed = dpkg_status(STATUS, true);
        assert_eq!(parsed.malformed, 1, "{parsed:?}");
        assert_eq!(
            parsed.items,
            [
                Deb {
                    package: "libc6".into(),
                    version: "2.36-9+deb12u4".into(),
                    architecture: Some("amd64".into()),
                    source: Some("glibc (2.36-9)".into()),
                },
                Deb {
                    package: "zlib1g".into(),
                    version: "1:1.2.13.dfsg-1".into(),
                    architecture: None,
                    source: None,
                },
            ]
        );
        // Without a Status line a paragraph counts only where none is required.
        assert!(dpkg_status(b"Package: a\nVersion: 1\n", true)
            .items
            .is_empty());
        assert_eq!(
            dpkg_status(b"Package: a\nVersion: 1\n", false).items.len(),
            1
        );
    }

    #[test]
    fn apk_metadata_package_json_and_os_release_parse() {
        let apk = apk_installed(
            b"C:Q1abc=\nP:musl\nV:1.2.4-r2\nA:x86_64\no:musl\n\nP:nover\n\ngarbage line\n",
        );
        assert_eq!(apk.malformed, 2);
        assert_eq!(apk.items[0].package, "musl");
        assert_eq!(apk.items[0].origin.as_deref(), Some("musl"));

        assert_eq!(
            python_metadata(b"Metadata-Version: 2.1\nName: Foo_Bar\nVersion: 1.0\n\nName: body\n"),
            Some(("Foo_Bar".into(), "1.0".into()))
        );
        assert_eq!(python_metadata(b"Name: -bad\nVersion: 1\n"), None);
        assert_eq!(pep503("Foo__Bar.-baz"), "foo-bar-baz");

        assert_eq!(
            npm_package(br#"{"name": "@types/node", "version": "20.1.0", "x": [1]}"#),
            Some((Some("types".into()), "node".into(), "20.1.0".into()))
        );
        assert_eq!(npm_package(br#"{"name": "a/b", "version": "1"}"#), None);
        assert_eq!(npm_package(br#"{"name": 5, "version": "1"}"#), None);

        assert_eq!(
            os_release(b"NAME=\"Debian GNU/Linux\"\nID=debian\nVERSION_ID=\"12\"\n"),
            OsRelease {
                id: Some("debian".into()),
                version_id: Some("12".into())
            }
        );
        assert_eq!(os_release(b"ID=\"Evil/../x\"\n").id, None);
        assert_eq!(
            purl_encode("1:2.3+dfsg~1 @/?"),
            "1:2.3%2Bdfsg~1%20%40%2F%3F"
        );
    }

    /// A small xorshift generator: the same bytes every run.
    struct Bytes(u64);

    impl Bytes {
        fn next(&mut self) -> u8 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 32) as u8
        }
    }

    #[test]
    fn random_bytes_do_not_panic_any_parser() {
        // Uniform bytes, and bytes drawn mostly from the formats' own
        // punctuation (so paragraphs, fields and continuations occur).
        const ALPHABET: &[u8] = b"PVAoackage:Status install ok \n\n\t\r=\"'@/{}[],\xff\xc3";
        let mut rng = Bytes(0x9e37_79b9_7f4a_7c15);
        for round in 0..64 {
            let len = 1 + usize::from(rng.next()) * 64;
            let text: Vec<u8> = (0..len)
                .map(|_| {
                    let b = rng.next();
                    if round % 2 == 0 {
                        b
                    } else {
                        ALPHABET[usize::from(b) % ALPHABET.len()]
                    }
                })
                .collect();
            let _ = dpkg_status(&text, round % 4 < 2);
            let _ = apk_installed(&text);
            let _ = python_metadata(&text);
            let _ = npm_package(&text);
            let _ = os_release(&text);
        }
        // A valid status with random bytes spliced in.
        for _ in 0..64 {
            let mut text = STATUS.to_vec();
            for _ in 0..8 {
                let at = usize::from(rng.next()) % text.len();
                text[at] = rng.next();
            }
            let parsed = dpkg_status(&text, true);
            assert!(parsed.items.len() <= 3);
        }
    }
}
