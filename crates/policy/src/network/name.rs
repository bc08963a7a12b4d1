//! Domain names and the hosts a sandbox names: one normal form, so that a
//! rule and a connection are compared as the same bytes.
//!
//! Everything a sandbox writes (TLS SNI, an HTTP `Host` header, a CONNECT
//! target, a DNS question) goes through [`canonical_host`] before it is
//! judged. It refuses whatever could be read two ways (control characters,
//! userinfo, zone ids, ports, empty labels) and turns every legacy IPv4
//! spelling that `inet_aton(3)` accepts into the address it means, so that
//! `0x7f.1` is judged as 127.0.0.1 and never looked up as a name.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Longest name in its dotted form, without the trailing dot (RFC 1035).
pub const MAX_NAME_LEN: usize = 253;
/// Longest label (RFC 1035).
pub const MAX_LABEL_LEN: usize = 63;

/// How much of a hostile input an error message shows.
const SHOWN_CHARS: usize = 80;

/// Input as it appears in an error message: quoted and escaped (so CR, LF
/// and NUL cannot forge log lines) and cut to [`SHOWN_CHARS`].
pub(crate) fn shown(text: &str) -> String {
    if text.chars().count() <= SHOWN_CHARS {
        return format!("{text:?}");
    }
    let head: String = text.chars().take(SHOWN_CHARS).collect();
    format!("{head:?}…")
}

/// A DNS name in normal form: ASCII, lowercase, no trailing dot, at least
/// two labels of 1 to 63 characters from `[a-z0-9-]` that neither start nor
/// end with `-`, at most 253 characters, and a last label that is not
/// numeric (that would be an IPv4 spelling). The only way to get one is
/// [`DomainName::parse`], so holding one means the checks passed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomainName(String);

/// Why a text is not a [`DomainName`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("the name is empty")]
    Empty,
    #[error("the name is not ASCII; write internationalised names in their xn-- form (IDNA is not supported)")]
    NonAscii,
    #[error("the name is {0} characters long; at most 253 are allowed")]
    TooLong(usize),
    #[error("the name has an empty label (a leading dot or two dots in a row)")]
    EmptyLabel,
    #[error("a label is {0} characters long; at most 63 are allowed")]
    LabelTooLong(usize),
    #[error("{0:?} is not allowed in a name; only letters, digits, `-` and `.` are")]
    BadChar(char),
    #[error("a label starts or ends with `-`")]
    HyphenAtEdge,
    #[error("the name has a single label; at least two are needed (like example.com)")]
    SingleLabel,
    #[error("the last label is numeric, which makes this an IPv4 address spelling, not a name")]
    NumericLastLabel,
}

impl DomainName {
    /// Normalises and checks a name: ASCII letters are lowercased and one
    /// trailing dot is dropped; everything else must already be right.
    pub fn parse(text: &str) -> Result<DomainName, NameError> {
        if !text.is_ascii() {
            return Err(NameError::NonAscii);
        }
        let lower = text.to_ascii_lowercase();
        let name = lower.strip_suffix('.').unwrap_or(&lower);
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong(name.len()));
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
        {
            return Err(NameError::BadChar(bad));
        }
        let mut labels = 0;
        for label in name.split('.') {
            if label.is_empty() {
                return Err(NameError::EmptyLabel);
            }
            if label.len() > MAX_LABEL_LEN {
                return Err(NameError::LabelTooLong(label.len()));
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(NameError::HyphenAtEdge);
            }
            labels += 1;
        }
        if labels < 2 {
            return Err(NameError::SingleLabel);
        }
        if name.rsplit('.').next().is_some_and(is_numeric_label) {
            return Err(NameError::NumericLastLabel);
        }
        Ok(DomainName(name.to_owned()))
    }

    /// The name in normal form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `self` is a strict subdomain of `parent`, at any depth:
    /// `a.b.example.com` is under `example.com`, `example.com` is not.
    pub fn is_strictly_under(&self, parent: &DomainName) -> bool {
        self.0
            .strip_suffix(parent.as_str())
            .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
    }
}

impl fmt::Display for DomainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for DomainName {
    type Err = NameError;

    fn from_str(text: &str) -> Result<DomainName, NameError> {
        DomainName::parse(text)
    }
}

/// What a connection claims to be going to, in normal form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name.
    Name(DomainName),
    /// An IP literal, however it was spelled.
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name.as_str()),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// Why a host named by a sandbox is refused. The input is shown quoted and
/// escaped, cut to 80 characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the host is empty")]
    Empty,
    #[error("host {0} is not ASCII; internationalised names must arrive in their xn-- form")]
    NonAscii(String),
    #[error("host {host} contains {ch:?}, which no host name may contain")]
    ForbiddenChar { host: String, ch: char },
    #[error("host {0} contains `:`; ports must be split off first and IPv6 addresses written in brackets")]
    Colon(String),
    #[error("host {0} opens a bracket but is not one bracketed IPv6 address")]
    BadBracket(String),
    #[error("host {0} is numeric but not a valid IPv4 address")]
    BadIpv4(String),
    #[error("host {host} is not a valid name: {reason}")]
    Name { host: String, reason: NameError },
}

/// Longest input looked at: a name of 253 characters plus a trailing dot,
/// or a bracketed IPv6 address, fit well within it.
const MAX_RAW_HOST: usize = 300;

/// The normal form of a host a sandbox names (SNI, HTTP `Host`, CONNECT
/// target, a DNS question), ports already split off by the caller.
///
/// - `[v6]` is an IPv6 literal; a bare IPv6 address is refused (its colons
///   cannot be told from a port).
/// - A name whose last label is numeric (`127.1`, `0x7f.0.0.1`, `2130706433`)
///   is read as `inet_aton(3)` reads it and becomes [`Host::Ip`]; if that
///   fails it is refused, never treated as a name.
/// - Otherwise it must be a [`DomainName`] (lowercased, one trailing dot
///   dropped). Single-label names are refused too: a host resolver would
///   complete them with its search domains and reach internal hosts.
/// - NUL, CR, LF, spaces and other controls, `@`, `/`, `\`, `%` (zone ids),
///   `_`, and non-ASCII text are refused outright.
pub fn canonical_host(raw: &str) -> Result<Host, HostError> {
    if raw.is_empty() {
        return Err(HostError::Empty);
    }
    if raw.len() > MAX_RAW_HOST {
        return Err(HostError::Name {
            host: shown(raw),
            reason: NameError::TooLong(raw.len()),
        });
    }
    if !raw.is_ascii() {
        return Err(HostError::NonAscii(shown(raw)));
    }
    if let Some(ch) = raw
        .chars()
        .find(|c| c.is_ascii_control() || c.is_ascii_whitespace() || "@/\\%_".contains(*c))
    {
        return Err(HostError::ForbiddenChar {
            host: shown(raw),
            ch,
        });
    }
    if let Some(rest) = raw.strip_prefix('[') {
        let inner = rest
            .strip_suffix(']')
            .ok_or_else(|| HostError::BadBracket(shown(raw)))?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .map_err(|_| HostError::BadBracket(shown(raw)));
    }
    if raw.contains(':') {
        return Err(HostError::Colon(shown(raw)));
    }
    if let Some(ch) = raw.chars().find(|c| matches!(c, '[' | ']')) {
        return Err(HostError::ForbiddenChar {
            host: shown(raw),
            ch,
        });
    }
    let lower = raw.to_ascii_lowercase();
    let trimmed = lower.strip_suffix('.').unwrap_or(&lower);
    if trimmed.rsplit('.').next().is_some_and(is_numeric_label) {
        return inet_aton(trimmed)
            .map(|ip| Host::Ip(IpAddr::V4(ip)))
            .ok_or_else(|| HostError::BadIpv4(shown(raw)));
    }
    DomainName::parse(raw)
        .map(Host::Name)
        .map_err(|reason| HostError::Name {
            host: shown(raw),
            reason,
        })
}

/// A label that makes a whole name an IPv4 spelling, as the WHATWG URL
/// standard decides it: all decimal digits, or `0x` and hex digits.
fn is_numeric_label(label: &str) -> bool {
    if let Some(hex) = label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"))
    {
        return hex.chars().all(|c| c.is_ascii_hexdigit());
    }
    !label.is_empty() && label.chars().all(|c| c.is_ascii_digit())
}

/// `inet_aton(3)`: one to four parts, each decimal, octal (leading `0`) or
/// hex (`0x`); the last part fills all the bytes the earlier ones left.
/// `127.1` is 127.0.0.1, `127.0.1` is 127.0.0.1, `2130706433` is 127.0.0.1.
pub fn inet_aton(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        values.push(inet_aton_part(part)?);
    }
    let (last, leading) = values.split_last()?;
    let mut address: u32 = 0;
    for (i, value) in leading.iter().enumerate() {
        if *value > 255 {
            return None;
        }
        address |= value << (24 - 8 * i);
    }
    let last_bits = 8 * (4 - leading.len()) as u32;
    if last_bits < 32 && *last >= 1u32 << last_bits {
        return None;
    }
    Some(Ipv4Addr::from(address | last))
}

/// One part of an `inet_aton` address, up to 32 bits.
fn inet_aton_part(part: &str) -> Option<u32> {
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    // from_str_radix would accept a leading `+`; the check above did not.
    u32::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(text: &str) -> Host {
        Host::Ip(IpAddr::V4(text.parse().unwrap()))
    }

    fn name(text: &str) -> Host {
        Host::Name(DomainName::parse(text).unwrap())
    }

    #[test]
    fn domain_names_normalise_and_refuse() {
        assert_eq!(DomainName::parse("PyPI.org.").unwrap().as_str(), "pypi.org");
        assert_eq!(
            DomainName::parse("xn--bcher-kva.example").unwrap().as_str(),
            "xn--bcher-kva.example"
        );
        let label63 = "a".repeat(63);
        assert!(DomainName::parse(&format!("{label63}.com")).is_ok());
        let long = format!("{label63}.{label63}.{label63}.{}.com", "b".repeat(57));
        assert_eq!(long.len(), 253);
        assert!(DomainName::parse(&long).is_ok());
        let cases: &[(&str, NameError)] = &[
            ("", NameError::Empty),
            (".", NameError::Empty),
            ("bücher.de", NameError::NonAscii),
            (&format!("x{long}"), NameError::TooLong(254)),
            ("a..com", NameError::EmptyLabel),
            (".a.com", NameError::EmptyLabel),
            ("a.com..", NameError::EmptyLabel),
            (&format!("{label63}a.com"), NameError::LabelTooLong(64)),
            ("a_b.com", NameError::BadChar('_')),
            ("a b.com", NameError::BadChar(' ')),
            ("*.a.com", NameError::BadChar('*')),
            ("-a.com", NameError::HyphenAtEdge),
            ("a-.com", NameError::HyphenAtEdge),
            ("localhost", NameError::SingleLabel),
            ("com.", NameError::SingleLabel),
            ("example.123", NameError::NumericLastLabel),
            ("1.2.3.4", NameError::NumericLastLabel),
            ("a.0x1f", NameError::NumericLastLabel),
        ];
        for (text, error) in cases {
            assert_eq!(DomainName::parse(text).as_ref(), Err(error), "{text:?}");
        }
    }

    #[test]
    fn subdomains_at_any_depth_but_not_the_name_itself() {
        let parent = DomainName::parse("example.com").unwrap();
        let under = |t: &str| DomainName::parse(t).unwrap().is_strictly_under(&parent);
        assert!(under("a.example.com"));
        assert!(under("a.b.c.example.com"));
        assert!(!under("example.com"));
        assert!(!under("badexample.com"));
        assert!(!under("example.com.evil.org"));
    }

    #[test]
    fn every_inet_aton_spelling_is_the_address_it_means() {
        for spelling in [
            "127.0.0.1",
            "127.1",
            "127.0.1",
            "0x7f.0.0.1",
            "0X7F.0.0.1",
            "0177.0.0.1",
            "0177.0.0.01",
            "2130706433",
            "0x7f000001",
            "017700000001",
            "0x7f.1",
            "127.0.0.1.",
            "127.000.000.001",
        ] {
            assert_eq!(canonical_host(spelling), Ok(v4("127.0.0.1")), "{spelling}");
        }
        assert_eq!(canonical_host("169.254.43518"), Ok(v4("169.254.169.254")));
        assert_eq!(canonical_host("2852039166"), Ok(v4("169.254.169.254")));
        assert_eq!(canonical_host("0xA9FEA9FE"), Ok(v4("169.254.169.254")));
        assert_eq!(
            canonical_host("0251.0376.0251.0376"),
            Ok(v4("169.254.169.254"))
        );
        assert_eq!(canonical_host("0"), Ok(v4("0.0.0.0")));
        assert_eq!(canonical_host("4294967295"), Ok(v4("255.255.255.255")));
    }

    #[test]
    fn adversarial_hosts() {
        use HostError as E;
        #[allow(clippy::type_complexity)]
        let table: &[(&str, Result<Host, fn(&HostError) -> bool>)] = &[
            ("pypi.org", Ok(name("pypi.org"))),
            ("PYPI.ORG.", Ok(name("pypi.org"))),
            ("a.b-c.example.com", Ok(name("a.b-c.example.com"))),
            ("[::1]", Ok(Host::Ip("::1".parse().unwrap()))),
            (
                "[::ffff:169.254.169.254]",
                Ok(Host::Ip("::ffff:a9fe:a9fe".parse().unwrap())),
            ),
            (
                "[FD00:EC2::254]",
                Ok(Host::Ip("fd00:ec2::254".parse().unwrap())),
            ),
            ("", Err(|e| *e == E::Empty)),
            (
                "pypi.org\0.evil.com",
                Err(|e| matches!(e, E::ForbiddenChar { ch: '\0', .. })),
            ),
            (
                "pypi.org\r\nHost: evil",
                Err(|e| matches!(e, E::ForbiddenChar { ch: '\r', .. })),
            ),
            (
                "pypi.org\n",
                Err(|e| matches!(e, E::ForbiddenChar { ch: '\n', .. })),
            ),
            (
                "pypi.org ",
                Err(|e| matches!(e, E::ForbiddenChar { ch: ' ', .. })),
            ),
            (
                "pypi.org\t",
                Err(|e| matches!(e, E::ForbiddenChar { ch: '\t', .. })),
            ),
            (
                "user@pypi.org",
                Err(|e| matches!(e, E::ForbiddenChar { ch: '@', .. })),
            ),
            (
                "pypi.org/evil",
                Err(|e| matches!(e, E::ForbiddenChar { ch: '/', .. })),
            ),
            (
                "pypi.org\\evil",
                Err(|e| matches!(e, E::ForbiddenChar { ch: '\\', .. })),
            ),
            (
                "[fe80::1%eth0]",
                Err(|e| matches!(e, E::ForbiddenChar { ch: '%', .. })),
            ),
            (
                "pypi%2eorg",
                Err(|e| matches!(e, E::ForbiddenChar { ch: '%', .. })),
            ),
            (
                "_dmarc.example.com",
                Err(|e| matches!(e, E::ForbiddenChar { ch: '_', .. })),
            ),
            ("pypi.org:443", Err(|e| matches!(e, E::Colon(_)))),
            ("::1", Err(|e| matches!(e, E::Colon(_)))),
            ("[::1]:443", Err(|e| matches!(e, E::BadBracket(_)))),
            ("[127.0.0.1]", Err(|e| matches!(e, E::BadBracket(_)))),
            ("[::1", Err(|e| matches!(e, E::BadBracket(_)))),
            (
                "a]b.com",
                Err(|e| matches!(e, E::ForbiddenChar { ch: ']', .. })),
            ),
            (
                "pypi..org",
                Err(|e| {
                    matches!(
                        e,
                        E::Name {
                            reason: NameError::EmptyLabel,
                            ..
                        }
                    )
                }),
            ),
            (
                ".pypi.org",
                Err(|e| {
                    matches!(
                        e,
                        E::Name {
                            reason: NameError::EmptyLabel,
                            ..
                        }
                    )
                }),
            ),
            (
                "pypi.org..",
                Err(|e| {
                    matches!(
                        e,
                        E::Name {
                            reason: NameError::EmptyLabel,
                            ..
                        }
                    )
                }),
            ),
            (
                "localhost",
                Err(|e| {
                    matches!(
                        e,
                        E::Name {
                            reason: NameError::SingleLabel,
                            ..
                        }
                    )
                }),
            ),
            (
                "localhost.",
                Err(|e| {
                    matches!(
                        e,
                        E::Name {
                            reason: NameError::SingleLabel,
                            ..
                        }
                    )
                }),
            ),
            (
                "pypi.org*",
                Err(|e| {
                    matches!(
                        e,
                        E::Name {
                            reason: NameError::BadChar('*'),
                            ..
                        }
                    )
                }),
            ),
            ("пример.рф", Err(|e| matches!(e, E::NonAscii(_)))),
            ("pypi.org\u{200b}", Err(|e| matches!(e, E::NonAscii(_)))),
            ("256.0.0.1", Err(|e| matches!(e, E::BadIpv4(_)))),
            ("1.2.3.4.5", Err(|e| matches!(e, E::BadIpv4(_)))),
            ("127.16777216", Err(|e| matches!(e, E::BadIpv4(_)))),
            ("4294967296", Err(|e| matches!(e, E::BadIpv4(_)))),
            ("08.0.0.1", Err(|e| matches!(e, E::BadIpv4(_)))),
            ("0x.0.0.1", Err(|e| matches!(e, E::BadIpv4(_)))),
            ("example.0x", Err(|e| matches!(e, E::BadIpv4(_)))),
            ("evil.127", Err(|e| matches!(e, E::BadIpv4(_)))),
            ("+1.0.0.1", Err(|e| matches!(e, E::BadIpv4(_)))),
        ];
        for (input, expected) in table {
            let got = canonical_host(input);
            match expected {
                Ok(host) => assert_eq!(got.as_ref(), Ok(host), "{input:?}"),
                Err(check) => assert!(got.as_ref().is_err_and(check), "{input:?}: {got:?}"),
            }
        }
        let long = format!("{}.com", "a".repeat(400));
        assert!(canonical_host(&long).is_err());
    }

    #[test]
    fn error_messages_cannot_forge_log_lines() {
        let message = canonical_host("a\r\nb").unwrap_err().to_string();
        assert!(
            !message.contains('\n') && !message.contains('\r'),
            "{message}"
        );
        let message = canonical_host(&"x".repeat(299)).unwrap_err().to_string();
        assert!(message.len() < 200, "{message}");
    }

    #[test]
    fn hosts_display_in_their_wire_form() {
        assert_eq!(name("pypi.org").to_string(), "pypi.org");
        assert_eq!(v4("10.0.0.1").to_string(), "10.0.0.1");
        assert_eq!(canonical_host("[::1]").unwrap().to_string(), "[::1]");
    }
}
