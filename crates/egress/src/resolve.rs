//! Host-side name resolution for the egress path.
//!
//! Names are always looked up as fully qualified: no search domains, so a
//! name the policy allows cannot be completed into an internal one.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

/// A boxed lookup.
pub type Lookup<'a> = Pin<Box<dyn Future<Output = Result<Vec<IpAddr>, String>> + Send + 'a>>;

/// Resolves names on the host.
pub trait Resolve: Send + Sync {
    /// The addresses of `name` (canonical, without a trailing dot); an
    /// error is a sentence for the log.
    fn lookup<'a>(&'a self, name: &'a str) -> Lookup<'a>;
}

/// Why no resolver could be made.
#[derive(Debug, thiserror::Error)]
pub enum ResolverError {
    /// A `name=ip` entry is malformed.
    #[error("{0}")]
    Hosts(String),
    /// The host's resolver configuration cannot be read.
    #[error("{0}")]
    System(String),
}

/// The resolver egress uses: the fixed table `hosts` when it has entries,
/// else the server `dns` when given, else the host's configuration.
pub fn resolver<S: AsRef<str>>(
    hosts: &[S],
    dns: Option<std::net::SocketAddr>,
) -> Result<std::sync::Arc<dyn Resolve>, ResolverError> {
    if !hosts.is_empty() {
        return Ok(std::sync::Arc::new(
            HostsResolver::parse(hosts).map_err(ResolverError::Hosts)?,
        ));
    }
    Ok(match dns {
        Some(server) => std::sync::Arc::new(SystemResolver::with_nameserver(server)),
        None => std::sync::Arc::new(SystemResolver::from_system().map_err(ResolverError::System)?),
    })
}

/// The host's resolver configuration (`/etc/resolv.conf`), through hickory.
pub struct SystemResolver {
    resolver: hickory_resolver::TokioResolver,
}

impl SystemResolver {
    /// Reads the host's configuration; search domains and `ndots` are
    /// dropped.
    pub fn from_system() -> Result<SystemResolver, String> {
        let (config, options) = hickory_resolver::system_conf::read_system_conf()
            .map_err(|e| format!("cannot read the host's resolver configuration: {e}"))?;
        let config = hickory_resolver::config::ResolverConfig::from_parts(
            None,
            Vec::new(),
            config.name_servers().to_vec(),
        );
        let resolver = SystemResolver::build(config, options);
        Ok(SystemResolver { resolver })
    }
}

impl SystemResolver {
    /// A resolver that asks only `server` (UDP, then TCP), with the host's
    /// other options; for hosts whose sandboxes must use a resolver of
    /// their own, and for tests.
    pub fn with_nameserver(server: std::net::SocketAddr) -> SystemResolver {
        let config = hickory_resolver::config::ResolverConfig::from_parts(
            None,
            Vec::new(),
            hickory_resolver::config::NameServerConfigGroup::from_ips_clear(
                &[server.ip()],
                server.port(),
                true,
            ),
        );
        let options = hickory_resolver::config::ResolverOpts::default();
        SystemResolver {
            resolver: SystemResolver::build(config, options),
        }
    }

    /// Names are asked as they are (no search domains); a lookup asks for
    /// both A and AAAA, so a sandbox asking for AAAA of a name that has
    /// both gets its IPv6 addresses (hickory's default asks for AAAA only
    /// when there is no A). The proxy tries the addresses in turn.
    fn build(
        config: hickory_resolver::config::ResolverConfig,
        mut options: hickory_resolver::config::ResolverOpts,
    ) -> hickory_resolver::TokioResolver {
        options.ndots = 0;
        options.ip_strategy = hickory_resolver::config::LookupIpStrategy::Ipv4AndIpv6;
        hickory_resolver::TokioResolver::builder_with_config(
            config,
            hickory_resolver::name_server::TokioConnectionProvider::default(),
        )
        .with_options(options)
        .build()
    }
}

impl Resolve for SystemResolver {
    fn lookup<'a>(&'a self, name: &'a str) -> Lookup<'a> {
        Box::pin(async move {
            let fqdn = format!("{name}.");
            let answer = self
                .resolver
                .lookup_ip(fqdn.as_str())
                .await
                .map_err(|e| format!("cannot resolve {name}: {e}"))?;
            Ok(answer.iter().collect())
        })
    }
}

/// A fixed table of names: for tests (their "internet" hosts live in
/// network namespaces on the same machine) and for air-gapped setups.
#[derive(Debug, Clone, Default)]
pub struct HostsResolver {
    names: BTreeMap<String, Vec<IpAddr>>,
}

impl HostsResolver {
    /// Parses `name=ip` entries (a name may repeat for several addresses).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<HostsResolver, String> {
        let mut names: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        for entry in entries {
            let entry = entry.as_ref();
            let (name, ip) = entry
                .split_once('=')
                .ok_or_else(|| format!("{entry:?} is not name=ip"))?;
            let ip: IpAddr = ip
                .trim()
                .parse()
                .map_err(|_| format!("{entry:?}: {ip:?} is not an IP address"))?;
            let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
            if name.is_empty() {
                return Err(format!("{entry:?} has no name"));
            }
            names.entry(name).or_default().push(ip);
        }
        Ok(HostsResolver { names })
    }
}

impl Resolve for HostsResolver {
    fn lookup<'a>(&'a self, name: &'a str) -> Lookup<'a> {
        let found = self.names.get(name).cloned();
        Box::pin(async move { found.ok_or_else(|| format!("{name} is not in the hosts table")) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_tables_parse_and_answer() {
        let hosts =
            HostsResolver::parse(&["Example.test.=198.51.100.7", "example.test=2001:db8::7"])
                .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let ips = rt.block_on(hosts.lookup("example.test")).unwrap();
        assert_eq!(ips.len(), 2);
        assert!(rt.block_on(hosts.lookup("other.test")).is_err());
        assert!(HostsResolver::parse(&["nonsense"]).is_err());
        assert!(HostsResolver::parse(&["a.test=999.1.1.1"]).is_err());
    }
}
