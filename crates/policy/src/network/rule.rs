//! Allowlist rules: `domain`, `*.domain`, `IP` or `CIDR`, each with an
//! optional `:PORT`, read from and written back to one text form.

use super::name::{shown, DomainName, Host, NameError};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// One entry of an `allow` policy. Parse it with [`str::parse`]; its
/// [`Display`](fmt::Display) form parses back to the same rule, and is how
/// it is serialized.
///
/// | text | allows |
/// |---|---|
/// | `pypi.org` | connections naming `pypi.org` (SNI or Host) |
/// | `*.pythonhosted.org` | names strictly under it, at any depth (`files.pythonhosted.org`, `a.b.pythonhosted.org`) but **not** `pythonhosted.org` itself; add that as a rule of its own |
/// | `140.82.112.3`, `2001:db8::1` | connections to that address, named or not |
/// | `10.1.0.0/16`, `2001:db8::/32` | connections to an address in the network |
/// | any of them + `:443` (`[2001:db8::1]:443` for IPv6) | the same, on that port only |
///
/// Address rules can name always-denied space (`10.0.0.0/8`); they parse,
/// but the always-denied check wins, so they never allow anything there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    target: RuleTarget,
    port: Option<u16>,
}

/// What a [`Rule`] matches, apart from its port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RuleTarget {
    /// Exactly this name.
    Domain(DomainName),
    /// Names strictly under this one (`*.example.com`), not the name itself.
    Subdomains(DomainName),
    /// Exactly this address.
    Ip(IpAddr),
    /// Any address in this network.
    Cidr(Cidr),
}

/// An IP network: an address with no bits set past its prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

/// Why a text is not a [`Rule`]. The rule is shown quoted and escaped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("a network rule is empty")]
    Empty,
    #[error("rule {0} is not ASCII; write internationalised domains in their xn-- form (IDNA is not supported)")]
    NonAscii(String),
    #[error("rule {0} contains whitespace or a control character")]
    Whitespace(String),
    #[error("rule {0} has `*` somewhere other than a leading `*.`")]
    Wildcard(String),
    #[error(
        "rule {0} has an invalid port; a port is a number from 1 to 65535 without leading zeros"
    )]
    Port(String),
    #[error("rule {0} has brackets that do not hold one IPv6 address or network followed by an optional :PORT")]
    Bracket(String),
    #[error("rule {0} has several `:` but is not an IPv6 address or network; with a port, write [2001:db8::1]:443")]
    Ipv6(String),
    #[error("rule {0} is not a valid IP network address")]
    CidrAddress(String),
    #[error("rule {rule} has a prefix length out of range; it must be a number from 0 to {max}")]
    CidrPrefix { rule: String, max: u8 },
    #[error("rule {rule} has address bits set past its prefix length; the network is {network}")]
    CidrHostBits { rule: String, network: String },
    #[error("rule {rule} is not a valid domain: {reason}")]
    Domain { rule: String, reason: NameError },
}

impl Rule {
    /// What the rule matches.
    pub fn target(&self) -> &RuleTarget {
        &self.target
    }

    /// The only port the rule allows, if it names one.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Whether this rule allows a connection claiming `host` (if any), going
    /// to `ip`, port `port`. Domain rules look at the name only, address
    /// rules at the address only: a name never makes an address rule match
    /// and an address never makes a domain rule match.
    pub fn matches(&self, host: Option<&Host>, ip: IpAddr, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match (&self.target, host) {
            (RuleTarget::Domain(_) | RuleTarget::Subdomains(_), Some(Host::Name(name))) => {
                self.matches_name(name)
            }
            (RuleTarget::Domain(_) | RuleTarget::Subdomains(_), _) => false,
            (RuleTarget::Ip(allowed), _) => allowed.to_canonical() == ip.to_canonical(),
            (RuleTarget::Cidr(cidr), _) => cidr.contains(ip),
        }
    }

    /// Whether this rule allows `name` on some port; address rules never do.
    pub fn matches_name(&self, name: &DomainName) -> bool {
        match &self.target {
            RuleTarget::Domain(domain) => domain == name,
            RuleTarget::Subdomains(parent) => name.is_strictly_under(parent),
            RuleTarget::Ip(_) | RuleTarget::Cidr(_) => false,
        }
    }
}

impl Cidr {
    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length: 0 to 32 for IPv4, 0 to 128 for IPv6.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is in the network. An IPv4-mapped IPv6 address is the
    /// IPv4 address it maps, and the other way round.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = prefix_mask_v4(self.prefix);
                u32::from(ip) & mask == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = prefix_mask_v6(self.prefix);
                u128::from(ip) & mask == u128::from(net)
            }
            (IpAddr::V6(_), IpAddr::V4(ip)) => self.contains(IpAddr::V6(ip.to_ipv6_mapped())),
            (IpAddr::V4(_), IpAddr::V6(ip)) => ip
                .to_ipv4_mapped()
                .is_some_and(|v4| self.contains(IpAddr::V4(v4))),
        }
    }
}

fn prefix_mask_v4(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn prefix_mask_v6(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Rule, RuleError> {
        if text.is_empty() {
            return Err(RuleError::Empty);
        }
        if !text.is_ascii() {
            return Err(RuleError::NonAscii(shown(text)));
        }
        if text
            .chars()
            .any(|c| c.is_ascii_control() || c.is_ascii_whitespace())
        {
            return Err(RuleError::Whitespace(shown(text)));
        }
        if let Some(rest) = text.strip_prefix('[') {
            let bracket = || RuleError::Bracket(shown(text));
            let (inner, after) = rest.split_once(']').ok_or_else(bracket)?;
            let port = match after {
                "" => None,
                _ => Some(parse_port(
                    after.strip_prefix(':').ok_or_else(bracket)?,
                    text,
                )?),
            };
            let target = match parse_address(inner, text) {
                Some(Ok(target)) if target.is_ipv6() => target,
                Some(Err(error)) => return Err(error),
                _ => return Err(bracket()),
            };
            return Ok(Rule { target, port });
        }
        match text.matches(':').count() {
            0 => Ok(Rule {
                target: parse_target(text, text)?,
                port: None,
            }),
            1 => {
                let (host, port) = text.split_once(':').ok_or(RuleError::Empty)?;
                Ok(Rule {
                    target: parse_target(host, text)?,
                    port: Some(parse_port(port, text)?),
                })
            }
            _ => {
                let target = match parse_address(text, text) {
                    Some(Ok(target)) if target.is_ipv6() => target,
                    Some(Err(error)) => return Err(error),
                    _ => return Err(RuleError::Ipv6(shown(text))),
                };
                Ok(Rule { target, port: None })
            }
        }
    }
}

impl RuleTarget {
    fn is_ipv6(&self) -> bool {
        matches!(self, RuleTarget::Ip(IpAddr::V6(_)))
            || matches!(self, RuleTarget::Cidr(c) if c.network.is_ipv6())
    }
}

/// A port as a rule writes it: 1 to 65535, decimal, no leading zeros, so
/// that the text form round-trips.
fn parse_port(text: &str, rule: &str) -> Result<u16, RuleError> {
    let bad = || RuleError::Port(shown(rule));
    if text.is_empty() || text.len() > 5 || text.starts_with('0') {
        return Err(bad());
    }
    if !text.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    text.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)
}

/// The target part of an unbracketed rule: a network, an address, a
/// wildcard or a domain.
fn parse_target(host: &str, rule: &str) -> Result<RuleTarget, RuleError> {
    if let Some(address) = parse_address(host, rule) {
        return address;
    }
    if host.contains('*') {
        let suffix = host
            .strip_prefix("*.")
            .filter(|s| !s.contains('*'))
            .ok_or_else(|| RuleError::Wildcard(shown(rule)))?;
        return domain(suffix, rule).map(RuleTarget::Subdomains);
    }
    domain(host, rule).map(RuleTarget::Domain)
}

fn domain(text: &str, rule: &str) -> Result<DomainName, RuleError> {
    DomainName::parse(text).map_err(|reason| RuleError::Domain {
        rule: shown(rule),
        reason,
    })
}

/// `Some` when `text` is meant as an address or network (it parses as an
/// address, or holds a `/`), with the result of reading it; `None` when it
/// is meant as a name. Addresses use the strict forms only (four decimal
/// parts for IPv4); `127.1` is refused later as a numeric name.
fn parse_address(text: &str, rule: &str) -> Option<Result<RuleTarget, RuleError>> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(Ok(RuleTarget::Ip(ip)));
    }
    let (address, prefix) = text.split_once('/')?;
    Some(parse_cidr(address, prefix, rule).map(RuleTarget::Cidr))
}

fn parse_cidr(address: &str, prefix: &str, rule: &str) -> Result<Cidr, RuleError> {
    let network: IpAddr = address
        .parse()
        .map_err(|_| RuleError::CidrAddress(shown(rule)))?;
    let max: u8 = if network.is_ipv4() { 32 } else { 128 };
    let prefix_error = || RuleError::CidrPrefix {
        rule: shown(rule),
        max,
    };
    let well_formed = !prefix.is_empty()
        && prefix.len() <= 3
        && prefix.chars().all(|c| c.is_ascii_digit())
        && (prefix == "0" || !prefix.starts_with('0'));
    if !well_formed {
        return Err(prefix_error());
    }
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| *p <= max)
        .ok_or_else(prefix_error)?;
    let masked = match network {
        IpAddr::V4(ip) => IpAddr::V4((u32::from(ip) & prefix_mask_v4(prefix)).into()),
        IpAddr::V6(ip) => IpAddr::V6((u128::from(ip) & prefix_mask_v6(prefix)).into()),
    };
    if masked != network {
        return Err(RuleError::CidrHostBits {
            rule: shown(rule),
            network: format!("{masked}/{prefix}"),
        });
    }
    Ok(Cidr { network, prefix })
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bracket = self.port.is_some() && self.target.is_ipv6();
        if bracket {
            f.write_str("[")?;
        }
        match &self.target {
            RuleTarget::Domain(name) => write!(f, "{name}")?,
            RuleTarget::Subdomains(name) => write!(f, "*.{name}")?,
            RuleTarget::Ip(ip) => write!(f, "{ip}")?,
            RuleTarget::Cidr(cidr) => write!(f, "{cidr}")?,
        }
        if bracket {
            f.write_str("]")?;
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

impl Serialize for Rule {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Rule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Rule, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> Rule {
        text.parse()
            .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    #[test]
    fn rules_round_trip_through_their_text() {
        for text in [
            "pypi.org",
            "pypi.org:443",
            "*.pythonhosted.org",
            "*.pythonhosted.org:443",
            "140.82.112.3",
            "140.82.112.3:22",
            "2001:db8::1",
            "[2001:db8::1]:443",
            "10.0.0.0/8",
            "10.0.0.0/8:5432",
            "0.0.0.0/0",
            "2001:db8::/32",
            "[2001:db8::/32]:443",
            "xn--bcher-kva.example",
            "a-b.c0.example",
        ] {
            let parsed = rule(text);
            assert_eq!(parsed.to_string(), text);
            assert_eq!(rule(&parsed.to_string()), parsed);
        }
    }

    #[test]
    fn rules_normalise() {
        let cases = [
            ("PyPI.Org.", "pypi.org"),
            ("*.Example.COM.:8080", "*.example.com:8080"),
            ("[2001:DB8::1]", "2001:db8::1"),
            ("2001:0db8:0000::0001", "2001:db8::1"),
        ];
        for (text, normal) in cases {
            assert_eq!(rule(text).to_string(), normal, "{text}");
        }
    }

    #[test]
    fn rule_parts() {
        let r = rule("*.pythonhosted.org:443");
        assert_eq!(r.port(), Some(443));
        assert!(
            matches!(r.target(), RuleTarget::Subdomains(n) if n.as_str() == "pythonhosted.org")
        );
        let r = rule("10.1.0.0/16");
        let RuleTarget::Cidr(cidr) = r.target() else {
            panic!("not a CIDR: {r:?}")
        };
        assert_eq!(cidr.prefix(), 16);
        assert_eq!(cidr.network(), "10.1.0.0".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        use RuleError as E;
        #[allow(clippy::type_complexity)]
        let table: &[(&str, fn(&RuleError) -> bool)] = &[
            ("", |e| *e == E::Empty),
            ("pypi.org ", |e| matches!(e, E::Whitespace(_))),
            (" pypi.org", |e| matches!(e, E::Whitespace(_))),
            ("pypi org", |e| matches!(e, E::Whitespace(_))),
            ("pypi.org\0", |e| matches!(e, E::Whitespace(_))),
            ("pypi.org\r\n", |e| matches!(e, E::Whitespace(_))),
            ("bücher.de", |e| matches!(e, E::NonAscii(_))),
            ("*", |e| matches!(e, E::Wildcard(_))),
            ("*pypi.org", |e| matches!(e, E::Wildcard(_))),
            ("a.*.pypi.org", |e| matches!(e, E::Wildcard(_))),
            ("*.*.pypi.org", |e| matches!(e, E::Wildcard(_))),
            ("pypi.*", |e| matches!(e, E::Wildcard(_))),
            ("pypi.org:0", |e| matches!(e, E::Port(_))),
            ("pypi.org:65536", |e| matches!(e, E::Port(_))),
            ("pypi.org:99999", |e| matches!(e, E::Port(_))),
            ("pypi.org:", |e| matches!(e, E::Port(_))),
            ("pypi.org:0443", |e| matches!(e, E::Port(_))),
            ("pypi.org:+443", |e| matches!(e, E::Port(_))),
            ("pypi.org:https", |e| matches!(e, E::Port(_))),
            ("[2001:db8::1]:0", |e| matches!(e, E::Port(_))),
            ("[2001:db8::1]443", |e| matches!(e, E::Bracket(_))),
            ("[10.0.0.1]:443", |e| matches!(e, E::Bracket(_))),
            ("[pypi.org]:443", |e| matches!(e, E::Bracket(_))),
            ("[2001:db8::1", |e| matches!(e, E::Bracket(_))),
            ("2001:db8::1:443:x", |e| matches!(e, E::Ipv6(_))),
            (":443", |e| {
                matches!(
                    e,
                    E::Domain {
                        reason: NameError::Empty,
                        ..
                    }
                )
            }),
            ("10.0.0.0/33", |e| {
                matches!(e, E::CidrPrefix { max: 32, .. })
            }),
            ("2001:db8::/129", |e| {
                matches!(e, E::CidrPrefix { max: 128, .. })
            }),
            ("10.0.0.0/", |e| matches!(e, E::CidrPrefix { .. })),
            ("10.0.0.0/08", |e| matches!(e, E::CidrPrefix { .. })),
            ("10.0.0.0/-1", |e| matches!(e, E::CidrPrefix { .. })),
            ("10.0.0.1/8", |e| matches!(e, E::CidrHostBits { .. })),
            ("pypi.org/8", |e| matches!(e, E::CidrAddress(_))),
            ("127.1", |e| {
                matches!(
                    e,
                    E::Domain {
                        reason: NameError::NumericLastLabel,
                        ..
                    }
                )
            }),
            ("0x7f.0.0.1", |e| {
                matches!(
                    e,
                    E::Domain {
                        reason: NameError::NumericLastLabel,
                        ..
                    }
                )
            }),
            ("010.0.0.1", |e| {
                matches!(
                    e,
                    E::Domain {
                        reason: NameError::NumericLastLabel,
                        ..
                    }
                )
            }),
            ("localhost", |e| {
                matches!(
                    e,
                    E::Domain {
                        reason: NameError::SingleLabel,
                        ..
                    }
                )
            }),
            ("*.org", |e| {
                matches!(
                    e,
                    E::Domain {
                        reason: NameError::SingleLabel,
                        ..
                    }
                )
            }),
            ("pypi..org", |e| {
                matches!(
                    e,
                    E::Domain {
                        reason: NameError::EmptyLabel,
                        ..
                    }
                )
            }),
            ("-pypi.org", |e| {
                matches!(
                    e,
                    E::Domain {
                        reason: NameError::HyphenAtEdge,
                        ..
                    }
                )
            }),
            ("py_pi.org", |e| {
                matches!(
                    e,
                    E::Domain {
                        reason: NameError::BadChar('_'),
                        ..
                    }
                )
            }),
            ("user@pypi.org", |e| {
                matches!(
                    e,
                    E::Domain {
                        reason: NameError::BadChar('@'),
                        ..
                    }
                )
            }),
        ];
        for (text, check) in table {
            let got = text.parse::<Rule>();
            assert!(got.as_ref().is_err_and(check), "{text:?}: {got:?}");
        }
        let message = "10.0.0.1/8".parse::<Rule>().unwrap_err().to_string();
        assert_eq!(
            message,
            "rule \"10.0.0.1/8\" has address bits set past its prefix length; the network is 10.0.0.0/8"
        );
        let message = "pypi.org:0".parse::<Rule>().unwrap_err().to_string();
        assert!(message.starts_with("rule \"pypi.org:0\""), "{message}");
    }

    #[test]
    fn matching() {
        let ip = |t: &str| t.parse::<IpAddr>().unwrap();
        let name = |t: &str| Host::Name(DomainName::parse(t).unwrap());
        let public = ip("151.101.0.223");

        let exact = rule("pypi.org");
        assert!(exact.matches(Some(&name("pypi.org")), public, 443));
        assert!(exact.matches(Some(&name("pypi.org")), public, 80));
        assert!(!exact.matches(Some(&name("www.pypi.org")), public, 443));
        assert!(!exact.matches(None, public, 443));
        assert!(!exact.matches(Some(&Host::Ip(public)), public, 443));

        let wild = rule("*.pythonhosted.org:443");
        assert!(wild.matches(Some(&name("files.pythonhosted.org")), public, 443));
        assert!(wild.matches(Some(&name("a.b.pythonhosted.org")), public, 443));
        assert!(!wild.matches(Some(&name("files.pythonhosted.org")), public, 80));
        assert!(!wild.matches(Some(&name("pythonhosted.org")), public, 443));
        assert!(!wild.matches(Some(&name("evilpythonhosted.org")), public, 443));

        let address = rule("151.101.0.223");
        assert!(address.matches(None, public, 443));
        assert!(address.matches(Some(&name("anything.example")), public, 443));
        assert!(address.matches(None, ip("::ffff:151.101.0.223"), 443));
        assert!(!address.matches(None, ip("151.101.0.224"), 443));

        let net = rule("151.101.0.0/16:443");
        assert!(net.matches(None, ip("151.101.255.1"), 443));
        assert!(net.matches(None, ip("::ffff:151.101.255.1"), 443));
        assert!(!net.matches(None, ip("151.102.0.1"), 443));
        assert!(!net.matches(None, ip("151.101.255.1"), 80));

        let v6 = rule("2001:db8::/32");
        assert!(v6.matches(None, ip("2001:db8:1::1"), 1));
        assert!(!v6.matches(None, ip("2001:db9::1"), 1));
        assert!(rule("0.0.0.0/0").matches(None, ip("8.8.8.8"), 53));
        assert!(rule("::/0").matches(None, ip("2606:4700::1111"), 53));
        assert!(rule("[2001:db8::1]:443").matches(None, ip("2001:db8::1"), 443));

        assert!(exact.matches_name(&DomainName::parse("pypi.org").unwrap()));
        assert!(!address.matches_name(&DomainName::parse("pypi.org").unwrap()));
    }

    #[test]
    fn serde_uses_the_text_form() {
        let rules: Vec<Rule> =
            serde_json::from_str(r#"["pypi.org", "*.pythonhosted.org:443", "[2001:db8::1]:443"]"#)
                .unwrap();
        assert_eq!(
            serde_json::to_string(&rules).unwrap(),
            r#"["pypi.org","*.pythonhosted.org:443","[2001:db8::1]:443"]"#
        );
        let error = serde_json::from_str::<Vec<Rule>>(r#"["pypi.org:0"]"#).unwrap_err();
        assert!(error.to_string().contains("invalid port"), "{error}");
    }
}
