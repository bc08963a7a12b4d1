//! `--net` and `--allow`: the network policy flags `airlock run` and
//! `airlock create` share.

use airlock_policy::{NetworkPolicy, Rule};
use clap::{Args, ValueEnum};

/// Network flags. Nothing given means the spec's default, `none`.
#[derive(Args, Clone, Debug, Default)]
pub struct NetArgs {
    /// Network access: `none` (loopback only, the default) or `open` (the
    /// public internet; private, loopback and metadata addresses stay
    /// unreachable).
    #[arg(long, value_enum, value_name = "none|open")]
    pub net: Option<NetMode>,
    /// Allow connections that match RULE (repeatable; implies allow mode,
    /// so it cannot be combined with --net): `domain`, `*.domain`
    /// (subdomains only), `IP` or `CIDR`, each with an optional `:PORT`
    /// (`[IPv6]:PORT`).
    #[arg(long = "allow", value_name = "RULE", conflicts_with = "net")]
    pub allow: Vec<Rule>,
}

/// The modes `--net` names; allow mode is spelled with `--allow`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NetMode {
    None,
    Open,
}

impl NetArgs {
    /// Whether any network flag was given.
    pub fn given(&self) -> bool {
        self.net.is_some() || !self.allow.is_empty()
    }

    /// The policy the flags ask for.
    pub fn policy(&self) -> NetworkPolicy {
        match (self.net, self.allow.is_empty()) {
            (_, false) => NetworkPolicy::Allow {
                rules: self.allow.clone(),
            },
            (Some(NetMode::Open), true) => NetworkPolicy::Open,
            (Some(NetMode::None) | None, true) => NetworkPolicy::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        net: NetArgs,
    }

    fn parse(args: &[&str]) -> Result<NetworkPolicy, String> {
        Cli::try_parse_from(std::iter::once("airlock").chain(args.iter().copied()))
            .map(|cli| cli.net.policy())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn flags_make_the_policy() {
        assert_eq!(parse(&[]), Ok(NetworkPolicy::None));
        assert_eq!(parse(&["--net", "none"]), Ok(NetworkPolicy::None));
        assert_eq!(parse(&["--net", "open"]), Ok(NetworkPolicy::Open));
        assert_eq!(
            parse(&["--allow", "pypi.org", "--allow", "*.pythonhosted.org:443"]),
            Ok(NetworkPolicy::allow(&["pypi.org", "*.pythonhosted.org:443"]).unwrap())
        );
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        assert!(parse(&["--net", "none", "--allow", "pypi.org"])
            .unwrap_err()
            .contains("cannot be used with"));
        assert!(parse(&["--net", "open", "--allow", "pypi.org"]).is_err());
        assert!(parse(&["--net", "allow"]).is_err());
        let error = parse(&["--allow", "pypi.org:0"]).unwrap_err();
        assert!(error.contains("invalid port"), "{error}");
        assert!(parse(&["--allow", "127.1"]).is_err());
    }
}
