//! Network policy: what a sandbox may reach, and the pure decisions the
//! enforcement asks of it.
//!
//! A [`NetworkPolicy`] is `none` (the default: loopback only), `open` (the
//! public internet) or `allow` (a list of [`Rule`]s, everything else
//! denied). Whatever the mode, the [`always_denied`] set (host loopback,
//! private, shared and link-local networks including cloud metadata,
//! multicast, reserved space, in any IPv4 or IPv6 spelling) is never
//! reachable.
//!
//! Nothing here opens a socket. The enforcement (the per-sandbox DNS
//! resolver and transparent proxy of DESIGN.md, Network) is expected to use
//! these functions like this:
//!
//! 1. **DNS.** The sandbox's only resolver answers a question only when
//!    [`NetworkPolicy::allows_name`] accepts the name; anything else gets
//!    NXDOMAIN or REFUSED and is never forwarded, so DNS tunnels under
//!    denied names reach no one. It resolves on the host side, as a
//!    fully-qualified name (never with the host's search domains).
//! 2. **Proxy.** For every TCP connection leaving the sandbox it reads the
//!    name the connection claims (TLS SNI, the HTTP `Host` header or the
//!    CONNECT target, see the `airlock-egress-parse` crate), splits off any
//!    port, and passes it through [`canonical_host`]; a name that does not
//!    canonicalise is refused. A name is resolved **on the host** (the
//!    sandbox's idea of the address is never trusted); an IP literal is used
//!    as it is. Then it calls [`NetworkPolicy::decide`] with the claimed
//!    host, the address it would connect to and the port, once per address
//!    it tries. Because the always-denied set is checked on the resolved
//!    address, a public name that resolves to 127.0.0.1 or 169.254.169.254
//!    (DNS rebinding) is refused.
//! 3. **Audit.** Every [`Decision::Deny`] becomes a security audit event and
//!    a metric, labelled with [`DenyReason::code`] (and
//!    [`DeniedRange::code`] for always-denied addresses).
//!
//! What the policy cannot know and the enforcement must add: the host's own
//! non-loopback addresses (where the daemon's ports listen) are not in the
//! always-denied set, since they depend on the machine.

mod name;
mod ranges;
mod rule;

/// Port of the egress proxy on a sandbox's loopback (transparent for
/// redirected connections, an HTTP proxy for tools that connect to it).
pub const PROXY_PORT: u16 = 15001;

/// The address a sandbox of any tier names the egress proxy by, for tools
/// that use it as their HTTP(S) proxy (`HTTP_PROXY` and friends): not
/// loopback, which a tier with a kernel of its own (gVisor) keeps to
/// itself. Whatever a sandbox sends there reaches the proxy (redirected or
/// handed over like any other connection), which treats it as a request
/// to itself.
pub const PROXY_HOST_V4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 255, 254, 1);

/// [`PROXY_HOST_V4`]'s IPv6 twin (where a tier has IPv6 to the proxy).
pub const PROXY_HOST_V6: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0xfd7a, 0xa1, 0x10d, 0, 0, 0, 0, 1);

pub use name::{canonical_host, inet_aton, DomainName, Host, HostError, NameError};
pub use ranges::{always_denied, embedded_v4, DeniedRange};
pub use rule::{Cidr, Rule, RuleError, RuleTarget};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;

/// Most rules one `allow` policy may hold: enough for real allowlists,
/// small enough that a linear scan per connection stays cheap.
pub const MAX_RULES: usize = 1024;

/// A policy holding more than [`MAX_RULES`] rules (how many it holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a network allowlist may hold at most {MAX_RULES} rules, got {0}")]
pub struct TooManyRules(pub usize);

/// Network reach of a sandbox. Serialized tagged by `mode`:
/// `{"mode":"none"}`, `{"mode":"open"}`,
/// `{"mode":"allow","rules":["pypi.org","*.pythonhosted.org:443"]}`.
/// Unknown fields are refused, and `allow` needs its `rules`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(
    tag = "mode",
    rename_all = "snake_case",
    try_from = "PolicyWire",
    deny_unknown_fields
)]
pub enum NetworkPolicy {
    /// Loopback only: every connection out is denied.
    #[default]
    None,
    /// The public internet: everything but the always-denied set.
    Open,
    /// Only what a rule allows, never the always-denied set. An empty list
    /// denies everything, like `none`.
    Allow { rules: Vec<Rule> },
    /// The public internet but what a rule denies (and the always-denied
    /// set), unless one of `except` allows it: e2b's `denyOut` with
    /// internet access, whose `allowOut` wins over it.
    Deny {
        rules: Vec<Rule>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        except: Vec<Rule>,
    },
}

/// The serialized form, read strictly: serde's tagged enums let unit
/// variants ignore fields they do not have (`{"mode":"none","rules":[..]}`
/// would pass), so input goes through this struct and [`TryFrom`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyWire {
    mode: ModeWire,
    rules: Option<Vec<Rule>>,
    except: Option<Vec<Rule>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum ModeWire {
    None,
    Open,
    Allow,
    Deny,
}

/// A policy whose fields do not fit its mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyShapeError {
    #[error("network mode {0} takes no rules; use mode allow to list rules")]
    RulesWithoutAllow(&'static str),
    #[error("network mode allow needs a list of rules (an empty list denies everything)")]
    AllowWithoutRules,
    #[error("network mode deny needs a list of rules (what is denied)")]
    DenyWithoutRules,
    #[error("only network mode deny takes exceptions (except)")]
    ExceptWithoutDeny,
}

impl TryFrom<PolicyWire> for NetworkPolicy {
    type Error = PolicyShapeError;

    fn try_from(wire: PolicyWire) -> Result<NetworkPolicy, PolicyShapeError> {
        if let ModeWire::Deny = wire.mode {
            return match wire.rules {
                Some(rules) => Ok(NetworkPolicy::Deny {
                    rules,
                    except: wire.except.unwrap_or_default(),
                }),
                None => Err(PolicyShapeError::DenyWithoutRules),
            };
        }
        if wire.except.is_some() {
            return Err(PolicyShapeError::ExceptWithoutDeny);
        }
        match (wire.mode, wire.rules) {
            (ModeWire::Deny, _) => Err(PolicyShapeError::DenyWithoutRules),
            (ModeWire::None, None) => Ok(NetworkPolicy::None),
            (ModeWire::Open, None) => Ok(NetworkPolicy::Open),
            (ModeWire::Allow, Some(rules)) => Ok(NetworkPolicy::Allow { rules }),
            (ModeWire::None, Some(_)) => Err(PolicyShapeError::RulesWithoutAllow("none")),
            (ModeWire::Open, Some(_)) => Err(PolicyShapeError::RulesWithoutAllow("open")),
            (ModeWire::Allow, None) => Err(PolicyShapeError::AllowWithoutRules),
        }
    }
}

/// A connection the sandbox is opening, as the enforcement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// The name the connection claims (SNI, `Host`, CONNECT target), in the
    /// normal form [`canonical_host`] gives, or `None` when it claims none
    /// (a direct connection to an address, a TLS hello without SNI).
    pub host: Option<Host>,
    /// The address the connection would go to: for a name, what the host
    /// side resolved it to; for an IP literal, that address.
    pub ip: IpAddr,
    /// The destination port.
    pub port: u16,
}

/// The verdict on one [`Destination`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Connect. `rule` is the text of the rule that allowed it (`None`
    /// under `open`).
    Allow { rule: Option<String> },
    /// Refuse. `rule` is the text of a rule that would have allowed the
    /// connection when something stronger denied it (an allowlisted address
    /// in the always-denied set), for the audit trail.
    Deny {
        reason: DenyReason,
        rule: Option<String>,
    },
}

impl Decision {
    /// Whether the connection may go ahead.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }
}

/// Why a connection is denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenyReason {
    /// The policy is `none`.
    PolicyNone,
    /// The address (or the IP literal the connection names) is in the
    /// always-denied set.
    AlwaysDenied(DeniedRange),
    /// No rule allows the name (or the address, for address rules).
    NotAllowlisted,
    /// A rule of the denylist matches (and no exception).
    Denylisted,
    /// The connection names no host, and no address rule allows its address.
    UnnamedNotAllowlisted,
    /// The connection names an IP literal but would go to another address.
    HostAddressMismatch,
    /// Port 0 is no destination.
    InvalidPort,
    /// The address is one of the host's own (judged by the enforcement,
    /// which knows the host's interfaces; the policy alone cannot).
    HostAddress,
}

impl DenyReason {
    /// A stable snake_case code, for audit events and metrics labels.
    pub fn code(self) -> &'static str {
        match self {
            DenyReason::PolicyNone => "policy_none",
            DenyReason::AlwaysDenied(_) => "always_denied",
            DenyReason::NotAllowlisted => "not_allowlisted",
            DenyReason::Denylisted => "denylisted",
            DenyReason::UnnamedNotAllowlisted => "unnamed_not_allowlisted",
            DenyReason::HostAddressMismatch => "host_address_mismatch",
            DenyReason::InvalidPort => "invalid_port",
            DenyReason::HostAddress => "host_address",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::PolicyNone => f.write_str("the sandbox has no network access"),
            DenyReason::HostAddress => f.write_str("the address is the host's own"),
            DenyReason::AlwaysDenied(range) => {
                write!(f, "the address is never reachable: {}", range.reason())
            }
            DenyReason::NotAllowlisted => f.write_str("no rule of the allowlist matches"),
            DenyReason::Denylisted => f.write_str("a rule of the denylist matches"),
            DenyReason::UnnamedNotAllowlisted => f.write_str(
                "the connection names no host and no address rule of the allowlist matches",
            ),
            DenyReason::HostAddressMismatch => {
                f.write_str("the connection names one IP address but goes to another")
            }
            DenyReason::InvalidPort => f.write_str("port 0 is not a destination"),
        }
    }
}

impl NetworkPolicy {
    /// The mode as written in the spec: `none`, `open` or `allow`.
    pub fn mode(&self) -> &'static str {
        match self {
            NetworkPolicy::None => "none",
            NetworkPolicy::Open => "open",
            NetworkPolicy::Allow { .. } => "allow",
            NetworkPolicy::Deny { .. } => "deny",
        }
    }

    /// Whether the policy lets anything out at all.
    pub fn is_none(&self) -> bool {
        matches!(self, NetworkPolicy::None)
    }

    /// Builds an `allow` policy from rule texts, naming the first bad one.
    pub fn allow<S: AsRef<str>>(rules: &[S]) -> Result<NetworkPolicy, RuleError> {
        let rules = rules
            .iter()
            .map(|text| text.as_ref().parse())
            .collect::<Result<Vec<Rule>, RuleError>>()?;
        Ok(NetworkPolicy::Allow { rules })
    }

    /// Builds a `deny` policy from rule texts (what is denied, and the
    /// exceptions that allow anyway), naming the first bad one.
    pub fn deny<S: AsRef<str>>(rules: &[S], except: &[S]) -> Result<NetworkPolicy, RuleError> {
        let parse = |texts: &[S]| {
            texts
                .iter()
                .map(|text| text.as_ref().parse())
                .collect::<Result<Vec<Rule>, RuleError>>()
        };
        Ok(NetworkPolicy::Deny {
            rules: parse(rules)?,
            except: parse(except)?,
        })
    }

    /// Decides one connection. In order:
    /// 1. `none` denies everything;
    /// 2. port 0 is denied;
    /// 3. the always-denied set wins over every rule and over `open`, for
    ///    the address and for an IP literal the connection names;
    /// 4. an IP literal the connection names must be the address it goes to;
    /// 5. `open` allows; `allow` allows when a rule matches (domain rules
    ///    against the name, address rules against the address, each with its
    ///    port), and denies otherwise; `deny` denies when a rule matches and
    ///    no exception does, and allows otherwise.
    pub fn decide(&self, dest: &Destination) -> Decision {
        let deny = |reason, rule: Option<&Rule>| Decision::Deny {
            reason,
            rule: rule.map(Rule::to_string),
        };
        let rules = match self {
            NetworkPolicy::None => return deny(DenyReason::PolicyNone, None),
            NetworkPolicy::Open => &[][..],
            NetworkPolicy::Allow { rules } => rules.as_slice(),
            NetworkPolicy::Deny { except, .. } => except.as_slice(),
        };
        if dest.port == 0 {
            return deny(DenyReason::InvalidPort, None);
        }
        let matched = rules
            .iter()
            .find(|rule| rule.matches(dest.host.as_ref(), dest.ip, dest.port));
        let named_ip = match &dest.host {
            Some(Host::Ip(ip)) => Some(*ip),
            _ => None,
        };
        for ip in std::iter::once(dest.ip).chain(named_ip) {
            if let Some(range) = always_denied(ip) {
                return deny(DenyReason::AlwaysDenied(range), matched);
            }
        }
        if named_ip.is_some_and(|named| named.to_canonical() != dest.ip.to_canonical()) {
            return deny(DenyReason::HostAddressMismatch, None);
        }
        match (self, matched) {
            (NetworkPolicy::Open, _) => Decision::Allow { rule: None },
            (NetworkPolicy::Deny { .. }, Some(rule)) => Decision::Allow {
                rule: Some(rule.to_string()),
            },
            (NetworkPolicy::Deny { rules, .. }, None) => {
                match rules
                    .iter()
                    .find(|rule| rule.matches(dest.host.as_ref(), dest.ip, dest.port))
                {
                    Some(rule) => deny(DenyReason::Denylisted, Some(rule)),
                    None => Decision::Allow { rule: None },
                }
            }
            (_, Some(rule)) => Decision::Allow {
                rule: Some(rule.to_string()),
            },
            (_, None) if dest.host.is_none() => deny(DenyReason::UnnamedNotAllowlisted, None),
            (_, None) => deny(DenyReason::NotAllowlisted, None),
        }
    }

    /// Whether some connection to `name` could be allowed, for the DNS
    /// resolver: `open` accepts every valid name, `none` none, `allow` the
    /// names a domain rule matches (on any port), `deny` every name but
    /// those a domain rule denies on every port (unless an exception
    /// allows the name). Names that do not
    /// canonicalise, and IP literals, are never accepted: there is nothing
    /// to resolve.
    pub fn allows_name(&self, name: &str) -> bool {
        let Ok(Host::Name(name)) = canonical_host(name) else {
            return false;
        };
        match self {
            NetworkPolicy::None => false,
            NetworkPolicy::Open => true,
            NetworkPolicy::Allow { rules } => rules.iter().any(|rule| rule.matches_name(&name)),
            NetworkPolicy::Deny { rules, except } => {
                except.iter().any(|rule| rule.matches_name(&name))
                    || !rules
                        .iter()
                        .any(|rule| rule.port().is_none() && rule.matches_name(&name))
            }
        }
    }

    /// Why a name [`NetworkPolicy::allows_name`] refuses is refused:
    /// `policy_none` under `none`, else `not_allowlisted`.
    pub fn name_refusal(&self) -> DenyReason {
        match self {
            NetworkPolicy::None => DenyReason::PolicyNone,
            NetworkPolicy::Deny { .. } => DenyReason::Denylisted,
            _ => DenyReason::NotAllowlisted,
        }
    }

    /// How many rules the policy holds (0 unless `allow`).
    pub fn rule_count(&self) -> usize {
        match self {
            NetworkPolicy::Allow { rules } => rules.len(),
            NetworkPolicy::Deny { rules, except } => rules.len() + except.len(),
            _ => 0,
        }
    }

    /// Checks the policy's size: at most [`MAX_RULES`] rules.
    pub fn validate(&self) -> Result<(), TooManyRules> {
        match self.rule_count() {
            count if count > MAX_RULES => Err(TooManyRules(count)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn named(host: &str, address: &str, port: u16) -> Destination {
        Destination {
            host: Some(canonical_host(host).unwrap()),
            ip: ip(address),
            port,
        }
    }

    fn unnamed(address: &str, port: u16) -> Destination {
        Destination {
            host: None,
            ip: ip(address),
            port,
        }
    }

    fn allow(rules: &[&str]) -> NetworkPolicy {
        NetworkPolicy::allow(rules).unwrap()
    }

    fn denied_for(decision: Decision) -> Option<DenyReason> {
        match decision {
            Decision::Allow { .. } => None,
            Decision::Deny { reason, .. } => Some(reason),
        }
    }

    const PUBLIC: &str = "151.101.0.223";

    #[test]
    fn a_denylist_takes_only_its_rules_away_from_the_internet() {
        let policy = NetworkPolicy::deny(
            &["evil.example", "1.2.3.0/24", "mail.example:25"],
            &["1.2.3.4"],
        )
        .unwrap();
        assert_eq!(policy.mode(), "deny");
        assert!(policy
            .decide(&named("good.example", PUBLIC, 443))
            .is_allowed());
        assert_eq!(
            denied_for(policy.decide(&named("evil.example", PUBLIC, 443))),
            Some(DenyReason::Denylisted)
        );
        assert_eq!(
            denied_for(policy.decide(&unnamed("1.2.3.9", 80))),
            Some(DenyReason::Denylisted)
        );
        // An exception wins over the denylist.
        assert!(policy.decide(&unnamed("1.2.3.4", 80)).is_allowed());
        // A rule with a port denies that port only.
        assert!(policy
            .decide(&named("mail.example", PUBLIC, 443))
            .is_allowed());
        assert!(!policy
            .decide(&named("mail.example", PUBLIC, 25))
            .is_allowed());
        // The always-denied set still wins over everything.
        assert_eq!(
            denied_for(policy.decide(&unnamed("10.0.0.1", 80))),
            Some(DenyReason::AlwaysDenied(
                always_denied(ip("10.0.0.1")).unwrap()
            ))
        );
        // Names: every one but those denied on every port.
        assert!(policy.allows_name("good.example"));
        assert!(!policy.allows_name("evil.example"));
        assert!(policy.allows_name("mail.example"));
        assert_eq!(policy.name_refusal(), DenyReason::Denylisted);
        assert_eq!(policy.rule_count(), 4);
        // Its serialized form round-trips; a deny without rules, or
        // exceptions on another mode, do not parse.
        let text = serde_json::to_string(&policy).unwrap();
        assert_eq!(
            serde_json::from_str::<NetworkPolicy>(&text).unwrap(),
            policy
        );
        for bad in [
            r#"{"mode":"deny"}"#,
            r#"{"mode":"open","except":["1.1.1.1"]}"#,
            r#"{"mode":"allow","rules":[],"except":[]}"#,
        ] {
            assert!(serde_json::from_str::<NetworkPolicy>(bad).is_err(), "{bad}");
        }
        assert_eq!(
            serde_json::from_str::<NetworkPolicy>(r#"{"mode":"deny","rules":["a.example"]}"#)
                .unwrap(),
            NetworkPolicy::deny(&["a.example"], &[]).unwrap()
        );
    }

    #[test]
    fn serde_forms() {
        let cases = [
            (r#"{"mode":"none"}"#, NetworkPolicy::None),
            (r#"{"mode":"open"}"#, NetworkPolicy::Open),
            (
                r#"{"mode":"allow","rules":["pypi.org","*.pythonhosted.org:443","10.0.0.0/8"]}"#,
                allow(&["pypi.org", "*.pythonhosted.org:443", "10.0.0.0/8"]),
            ),
            (
                r#"{"mode":"allow","rules":[]}"#,
                NetworkPolicy::Allow { rules: vec![] },
            ),
        ];
        for (json, policy) in cases {
            assert_eq!(serde_json::from_str::<NetworkPolicy>(json).unwrap(), policy);
            assert_eq!(serde_json::to_string(&policy).unwrap(), json);
        }
        assert_eq!(NetworkPolicy::default(), NetworkPolicy::None);
    }

    #[test]
    fn serde_fails_closed() {
        for json in [
            r#"{}"#,
            r#"{"mode":"allow"}"#,
            r#"{"mode":"Open"}"#,
            r#"{"mode":"everything"}"#,
            r#"{"mode":"open","rules":[]}"#,
            r#"{"mode":"none","rules":["pypi.org"]}"#,
            r#"{"mode":"allow","rules":["pypi.org"],"extra":1}"#,
            r#"{"mode":"allow","rules":["pypi.org:0"]}"#,
            r#"{"mode":"allow","rules":"pypi.org"}"#,
        ] {
            assert!(
                serde_json::from_str::<NetworkPolicy>(json).is_err(),
                "{json} should be refused"
            );
        }
    }

    #[test]
    fn none_denies_everything() {
        let policy = NetworkPolicy::None;
        for dest in [named("pypi.org", PUBLIC, 443), unnamed(PUBLIC, 443)] {
            assert_eq!(
                policy.decide(&dest),
                Decision::Deny {
                    reason: DenyReason::PolicyNone,
                    rule: None
                }
            );
        }
        assert!(!policy.allows_name("pypi.org"));
    }

    #[test]
    fn open_allows_the_public_internet_only() {
        let policy = NetworkPolicy::Open;
        assert_eq!(
            policy.decide(&named("example.com", PUBLIC, 443)),
            Decision::Allow { rule: None }
        );
        assert!(policy.decide(&unnamed("2606:4700::1111", 443)).is_allowed());
        for address in [
            "127.0.0.1",
            "10.1.2.3",
            "169.254.169.254",
            "::ffff:169.254.169.254",
            "fd00:ec2::254",
            "::1",
        ] {
            assert!(
                matches!(
                    denied_for(policy.decide(&named("example.com", address, 443))),
                    Some(DenyReason::AlwaysDenied(_))
                ),
                "{address}"
            );
        }
        assert!(policy.allows_name("anything.example"));
        assert!(!policy.allows_name("localhost"));
        assert!(!policy.allows_name("127.1"));
        assert!(!policy.allows_name("a\0.example.com"));
    }

    #[test]
    fn dns_rebinding_to_loopback_or_metadata_is_refused() {
        let policy = allow(&["pypi.org"]);
        for address in [
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(
                policy.decide(&named("pypi.org", address, 443)),
                Decision::Deny {
                    reason: DenyReason::AlwaysDenied(always_denied(ip(address)).unwrap()),
                    rule: Some("pypi.org".into()),
                },
                "{address}"
            );
        }
    }

    #[test]
    fn always_denied_wins_over_address_rules() {
        let policy = allow(&["169.254.169.254", "10.0.0.0/8", "0.0.0.0/0"]);
        let decision = policy.decide(&unnamed("169.254.169.254", 80));
        assert_eq!(
            decision,
            Decision::Deny {
                reason: DenyReason::AlwaysDenied(DeniedRange::CloudMetadata),
                rule: Some("169.254.169.254".into()),
            }
        );
        for spelling in [
            "169.254.43518",
            "2852039166",
            "0xa9fea9fe",
            "[::ffff:a9fe:a9fe]",
        ] {
            let host = canonical_host(spelling).unwrap();
            let Host::Ip(address) = host else {
                panic!("{spelling} is an address")
            };
            let dest = Destination {
                host: Some(host),
                ip: address,
                port: 80,
            };
            assert!(
                matches!(
                    denied_for(policy.decide(&dest)),
                    Some(DenyReason::AlwaysDenied(DeniedRange::CloudMetadata))
                ),
                "{spelling}"
            );
        }
        assert!(policy.decide(&unnamed("8.8.8.8", 53)).is_allowed());
    }

    #[test]
    fn a_named_denied_address_is_refused_whatever_it_resolves_to() {
        // Host: 127.1 with the connection going to a public address: the
        // named literal is judged too.
        let dest = Destination {
            host: Some(canonical_host("127.1").unwrap()),
            ip: ip(PUBLIC),
            port: 80,
        };
        assert_eq!(
            denied_for(NetworkPolicy::Open.decide(&dest)),
            Some(DenyReason::AlwaysDenied(DeniedRange::Loopback))
        );
    }

    #[test]
    fn a_named_ip_must_be_where_the_connection_goes() {
        let policy = allow(&["0.0.0.0/0"]);
        let dest = Destination {
            host: Some(canonical_host("8.8.8.8").unwrap()),
            ip: ip("1.1.1.1"),
            port: 443,
        };
        assert_eq!(
            denied_for(policy.decide(&dest)),
            Some(DenyReason::HostAddressMismatch)
        );
        let mapped = Destination {
            host: Some(canonical_host("[::ffff:8.8.8.8]").unwrap()),
            ip: ip("8.8.8.8"),
            port: 443,
        };
        assert!(policy.decide(&mapped).is_allowed());
    }

    #[test]
    fn allowlists() {
        let policy = allow(&[
            "pypi.org",
            "*.pythonhosted.org:443",
            "140.82.112.0/20:22",
            "2001:db8::1",
        ]);
        let allowed_by = |dest: Destination| match policy.decide(&dest) {
            Decision::Allow { rule } => rule,
            Decision::Deny { reason, .. } => panic!("{dest:?} denied: {reason}"),
        };
        assert_eq!(
            allowed_by(named("PyPI.org.", PUBLIC, 443)).as_deref(),
            Some("pypi.org")
        );
        assert_eq!(
            allowed_by(named("files.pythonhosted.org", PUBLIC, 443)).as_deref(),
            Some("*.pythonhosted.org:443")
        );
        assert_eq!(
            allowed_by(unnamed("140.82.113.4", 22)).as_deref(),
            Some("140.82.112.0/20:22")
        );
        assert_eq!(
            allowed_by(named("github.com", "140.82.113.4", 22)).as_deref(),
            Some("140.82.112.0/20:22")
        );
        assert_eq!(
            allowed_by(unnamed("2001:db8::1", 8443)).as_deref(),
            Some("2001:db8::1")
        );

        let denied = [
            (
                named("pythonhosted.org", PUBLIC, 443),
                DenyReason::NotAllowlisted,
            ),
            (
                named("files.pythonhosted.org", PUBLIC, 80),
                DenyReason::NotAllowlisted,
            ),
            (named("evil.com", PUBLIC, 443), DenyReason::NotAllowlisted),
            (
                named("pypi.org.evil.com", PUBLIC, 443),
                DenyReason::NotAllowlisted,
            ),
            (
                named("github.com", "140.82.113.4", 443),
                DenyReason::NotAllowlisted,
            ),
            (unnamed(PUBLIC, 443), DenyReason::UnnamedNotAllowlisted),
            (named("pypi.org", PUBLIC, 0), DenyReason::InvalidPort),
        ];
        for (dest, reason) in denied {
            assert_eq!(denied_for(policy.decide(&dest)), Some(reason), "{dest:?}");
        }

        assert!(policy.allows_name("pypi.org"));
        assert!(policy.allows_name("PYPI.ORG."));
        assert!(policy.allows_name("files.pythonhosted.org"));
        assert!(!policy.allows_name("pythonhosted.org"));
        assert!(!policy.allows_name("evil.com"));
        assert!(!policy.allows_name("aGVsbG8gd29ybGQ.tunnel.evil.com"));
        assert!(!policy.allows_name("140.82.113.4"));
        assert!(!policy.allows_name(""));
    }

    #[test]
    fn an_empty_allowlist_denies_everything() {
        let policy = NetworkPolicy::Allow { rules: vec![] };
        assert_eq!(
            denied_for(policy.decide(&named("pypi.org", PUBLIC, 443))),
            Some(DenyReason::NotAllowlisted)
        );
        assert!(!policy.allows_name("pypi.org"));
    }

    #[test]
    fn deny_codes_are_stable() {
        let codes = [
            (DenyReason::PolicyNone, "policy_none"),
            (
                DenyReason::AlwaysDenied(DeniedRange::CloudMetadata),
                "always_denied",
            ),
            (DenyReason::NotAllowlisted, "not_allowlisted"),
            (DenyReason::UnnamedNotAllowlisted, "unnamed_not_allowlisted"),
            (DenyReason::HostAddressMismatch, "host_address_mismatch"),
            (DenyReason::InvalidPort, "invalid_port"),
        ];
        for (reason, code) in codes {
            assert_eq!(reason.code(), code);
            assert!(!reason.to_string().is_empty());
        }
        assert!(DenyReason::AlwaysDenied(DeniedRange::CloudMetadata)
            .to_string()
            .contains("cloud metadata"));
    }
}
