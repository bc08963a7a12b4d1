//! The network namespace of a sandbox that may reach the network.
//!
//! A sandbox whose policy is `none` gets a namespace of its own, loopback
//! only, made beside its setup (`crate::offline_net`). Any other policy is
//! enforced by the daemon's egress path, and the namespace is prepared by
//! the launcher *before* the clone, as host root, so it belongs to the
//! host's user namespace: nothing inside the sandbox — not its root, not
//! the agent — holds `CAP_NET_ADMIN` over it, so its routes and filter rules
//! cannot be changed from inside.
//!
//! What the namespace holds:
//!
//! - `lo`, up; the daemon binds its egress listeners there: the
//!   transparent proxy on `127.0.0.1` and `::1` port [`PROXY_PORT`] and the
//!   resolver on `127.0.0.1` port 53 (`/etc/resolv.conf` names it).
//! - a veth pair `e0`/`e1` with both ends inside, `e0` carrying a host
//!   address and the default routes: without a route, `connect` to an
//!   outside address would fail before the filter could redirect it. Its
//!   MTU is 65535, near loopback's (see [`LINKS`]).
//! - the rules of [`RULES`] (nftables, in this namespace only: nothing is
//!   added to the host's firewall, and the rules go with the namespace):
//!   every TCP connection that would leave is redirected to the proxy
//!   (which reads its original destination with `SO_ORIGINAL_DST`), every
//!   UDP datagram to port 53 to the resolver, and anything else that would
//!   leave through `e0` — other UDP, ICMP, raw packets — is dropped.
//!   Queries to the resolver and new connections to the proxy past a
//!   kernel rate (the `flood` chain of [`RULES`]) are dropped before they wake the egress
//!   path at all.
//!
//! The setup runs `ip -batch` and `nft -f` (iproute2 and nftables) once
//! per sandbox, after `unshare(CLONE_NEWNET)` in the launcher.

use std::io::Write;
use std::process::{Command, Stdio};

/// Port of the transparent TCP proxy on the namespace's loopback (the
/// rules below name it literally; a test checks they agree).
pub const PROXY_PORT: u16 = airlock_policy::network::PROXY_PORT;
/// Port of the resolver on `127.0.0.1` inside the namespace.
pub const DNS_PORT: u16 = 53;

/// Interfaces and routes, as `ip -batch` input. `e0` carries no traffic
/// (everything that would use it is redirected to loopback or dropped), but
/// a connection takes its segment size from the route it was made on, so
/// `e0` gets loopback's size of frame: with Ethernet's 1500, every
/// intercepted connection would move 1448-byte segments through the proxy.
pub const LINKS: &str = "\
link set lo up
link add e0 mtu 65535 type veth peer name e1 mtu 65535
link set e1 up
link set e0 up
addr add 10.255.255.1/32 dev e0
route add default dev e0
addr add fd7a:a1:10c::1/128 dev e0 nodad
route add ::/0 dev e0
";

/// The filter rules, as `nft -f` input: the reviewed artifact of what may
/// leave. Packets to the namespace's own addresses go through `lo` and are
/// untouched (servers inside the sandbox keep working for its own
/// clients).
///
/// The `flood` chain caps floods in the kernel. The daemon's own limits
/// (`airlock_egress::EgressLimits`: 100 queries and 200 connections a
/// second by default) decide what is answered and report a limited
/// sandbox; the chain sits ten times above them, so the daemon still sees,
/// and reports, any flood, but a sandbox sending 30,000 queries a second
/// costs the egress worker only the first thousand: the rest are dropped
/// in the sender's own system call (which fails with `EPERM`), on the
/// sender's CPU time. The output hook sees the redirected destination (the
/// NAT chain runs first), so a query to `127.0.0.1:53` and one sent
/// anywhere else are counted together, as are connections to any outside
/// address.
pub const RULES: &str = "\
table inet airlock {
  chain to_proxy {
    type nat hook output priority -100; policy accept;
    oifname \"lo\" return
    meta l4proto tcp redirect to :15001
    udp dport 53 redirect to :53
  }
  chain out_filter {
    type filter hook postrouting priority 0; policy drop;
    oifname \"lo\" accept
    oifname \"g1\" ct status dnat accept
    oifname \"g1\" icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept
  }
  chain flood {
    type filter hook output priority 0; policy accept;
    udp dport 53 limit rate over 1000/second burst 2000 packets drop
    tcp dport 15001 tcp flags & (syn | ack) == syn limit rate over 2000/second burst 4000 packets drop
  }
  chain from_guest {
    type nat hook prerouting priority -100; policy accept;
    iifname \"g1\" meta nfproto ipv4 meta l4proto tcp dnat ip to 127.0.0.1:15001
    iifname \"g1\" meta nfproto ipv6 meta l4proto tcp dnat ip6 to [fd7a:a1:10d::1]:15001
    iifname \"g1\" meta nfproto ipv4 udp dport 53 dnat ip to 127.0.0.1:53
  }
  chain guest_in {
    type filter hook input priority 0; policy accept;
    iifname \"g1\" icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept
    iifname \"g1\" ct status dnat udp dport 53 limit rate over 1000/second burst 2000 packets drop
    iifname \"g1\" ct status dnat tcp dport 15001 tcp flags & (syn | ack) == syn limit rate over 2000/second burst 4000 packets drop
    iifname \"g1\" ct status dnat accept
    iifname \"g1\" drop
  }
}
";

/// The guest link's addresses (see [`GuestLink`]): the egress namespace's
/// end, where the guest's packets arrive, and the guest's.
/// The gateway is where every tier's sandboxes find the proxy by name
/// ([`airlock_policy::network::PROXY_HOST_V4`]).
pub const GUEST_GATEWAY_V4: std::net::Ipv4Addr = airlock_policy::network::PROXY_HOST_V4;
pub const GUEST_ADDRESS_V4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 255, 254, 2);
pub const GUEST_GATEWAY_V6: std::net::Ipv6Addr = airlock_policy::network::PROXY_HOST_V6;
pub const GUEST_ADDRESS_V6: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0xfd7a, 0xa1, 0x10d, 0, 0, 0, 0, 2);

/// The egress namespace's end of the guest link, as `ip -batch` input
/// (`{guest}` is the guest namespace's path). Its MTU is loopback's, as
/// `e0`'s is.
const GUEST_LINK_HERE: &str = "link add g1 mtu 65535 type veth peer name g0 mtu 65535 netns {guest}
addr add 10.255.254.1/30 dev g1
addr add fd7a:a1:10d::1/126 dev g1 nodad
link set g1 up
";

/// The guest namespace's end: its only interface besides loopback, with
/// the routes through the egress namespace. No link-local address: the
/// guest's kernel takes every address it finds here.
const GUEST_LINK_THERE: &str = "link set lo up
link set g0 addrgenmode none
addr add 10.255.254.2/30 dev g0
addr add fd7a:a1:10d::2/126 dev g0 nodad
link set g0 up
route add default via 10.255.254.1 dev g0
route add ::/0 via fd7a:a1:10d::1 dev g0
";

/// A guest kernel's way into the egress namespace, for a tier whose
/// sandbox runs a network stack of its own (gVisor's netstack), which would
/// not pass through the namespace's own stack, where the redirect rules
/// are, if it were put there. The guest gets a namespace of its own
/// (`guest`) whose only interface, `g0`, is a veth pair's end; the other
/// end, `g1`, is in the egress namespace, and what arrives on it is judged
/// by the rules of [`RULES`]: TCP is handed to the proxy (IPv4 to
/// `127.0.0.1`, which `route_localnet` on `g1` allows, IPv6 to the link's
/// own address, where the egress path binds a listener of its own),
/// queries to port 53 to the resolver, and anything else is dropped; only
/// replies go back. The guest's resolver is [`GUEST_GATEWAY_V4`].
///
/// Nothing inside the guest namespace can change the egress namespace:
/// both belong to the host's user namespace.
#[derive(Debug)]
pub struct GuestLink {
    egress: std::fs::File,
    guest: std::fs::File,
}

impl GuestLink {
    /// Makes the guest namespace and the link, from inside the egress
    /// namespace (the caller's, which it stays in). Must run in a
    /// single-threaded process, as [`enter_egress_namespace`].
    pub fn create() -> Result<GuestLink, NetError> {
        let egress = std::fs::File::open("/proc/thread-self/ns/net").map_err(NetError::Unshare)?;
        // SAFETY: as in `enter_egress_namespace`: NEWNET changes only the
        // network namespace of this (single-threaded) process.
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }
            .map_err(|e| NetError::Unshare(e.into()))?;
        let guest = std::fs::File::open("/proc/thread-self/ns/net");
        let back = move_into(&egress);
        let link = GuestLink {
            egress,
            guest: guest.map_err(NetError::Unshare)?,
        };
        back?;
        let here = GUEST_LINK_HERE.replace("{guest}", &link.guest_path().to_string_lossy());
        finish(start("ip", &["-batch", "-"], &here, None)?)?;
        std::fs::write("/proc/sys/net/ipv4/conf/g1/route_localnet", "1").map_err(|source| {
            NetError::Spawn {
                program: "route_localnet",
                source,
            }
        })?;
        use std::os::fd::AsRawFd;
        finish(start(
            "ip",
            &["-batch", "-"],
            GUEST_LINK_THERE,
            Some(link.guest.as_raw_fd()),
        )?)?;
        Ok(link)
    }

    /// The guest namespace (a path any process of the host can open while
    /// this value lives).
    pub fn guest_path(&self) -> std::path::PathBuf {
        descriptor_path(&self.guest)
    }

    /// The egress namespace, where the egress path binds.
    pub fn egress_path(&self) -> std::path::PathBuf {
        descriptor_path(&self.egress)
    }
}

/// `/proc/<this process>/fd/<n>` of `file`: a path to it other processes
/// of the host can open.
fn descriptor_path(file: &std::fs::File) -> std::path::PathBuf {
    use std::os::fd::AsRawFd;
    format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd()).into()
}

fn move_into(namespace: &std::fs::File) -> Result<(), NetError> {
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(namespace),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(|e| NetError::Unshare(e.into()))
}

/// The namespace could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("cannot create a network namespace")]
    Unshare(#[source] std::io::Error),
    #[error("cannot run {program} to set up the sandbox's network (is it installed?)")]
    Spawn {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed to set up the sandbox's network: {stderr}")]
    Failed {
        program: &'static str,
        stderr: String,
    },
}

/// Moves this process into a new network namespace and starts preparing
/// it as the module doc says. Must run before the sandbox is cloned (which
/// then shares it) and in a single-threaded process (`unshare` of the
/// network namespace applies to the calling thread only).
///
/// The two setup programs run while the caller goes on (they only touch
/// the namespace, and the sandbox's init may start meanwhile: nothing can
/// leave the namespace before they are done, since its only interfaces
/// are `lo` and a veth pair with both ends inside); [`PendingSetup::wait`]
/// must be called before the sandbox is handed out.
pub fn enter_egress_namespace() -> Result<PendingSetup, NetError> {
    // SAFETY: the hazard `unshare_unsafe` guards against is FILES, which
    // splits the descriptor table between threads; NEWNET only gives this
    // thread (the whole process: the caller is single-threaded) a new
    // network namespace, and every descriptor stays valid.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }
        .map_err(|e| NetError::Unshare(e.into()))?;
    let links = start("ip", &["-batch", "-"], LINKS, None)?;
    let rules = match start("nft", &["-f", "-"], RULES, None) {
        Ok(rules) => rules,
        Err(e) => {
            let _ = finish(links);
            return Err(e);
        }
    };
    Ok(PendingSetup {
        children: vec![links, rules],
    })
}

/// The setup programs of a namespace, still running.
#[must_use = "the namespace is ready only once `wait` returned Ok"]
pub struct PendingSetup {
    children: Vec<(&'static str, std::process::Child)>,
}

impl PendingSetup {
    /// Waits for the setup to finish; the first failure, if any.
    pub fn wait(self) -> Result<(), NetError> {
        let mut result = Ok(());
        for child in self.children {
            let outcome = finish(child);
            if result.is_ok() {
                result = outcome;
            }
        }
        result
    }
}

/// The network namespace a process started in, to go back to after
/// [`enter_egress_namespace`]: a launcher that serves the egress path
/// itself (`airlock run`) must make its outgoing connections from the
/// host's namespace, not from the sandbox's.
pub struct HostNamespace(std::fs::File);

impl HostNamespace {
    /// Remembers the calling thread's network namespace.
    pub fn current() -> Result<HostNamespace, NetError> {
        std::fs::File::open("/proc/thread-self/ns/net")
            .map(HostNamespace)
            .map_err(NetError::Unshare)
    }

    /// Moves the calling thread (the whole process, if single-threaded)
    /// back into it.
    pub fn go_back(self) -> Result<(), NetError> {
        move_into(&self.0)
    }
}

/// Starts `program ARGS` with `input` on its stdin, in the network
/// namespace `netns` (a descriptor of this process) when given.
fn start(
    program: &'static str,
    args: &[&str],
    input: &str,
    netns: Option<std::os::fd::RawFd>,
) -> Result<(&'static str, std::process::Child), NetError> {
    let spawn = |source| NetError::Spawn { program, source };
    let mut command = Command::new(program);
    if let Some(fd) = netns {
        use std::os::unix::process::CommandExt;
        // SAFETY: runs in the forked child before exec, where only
        // async-signal-safe calls are allowed: setns is one. `fd` is open
        // in the parent, and so in the child, for the whole spawn.
        unsafe {
            command.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = command
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    // The input is far below a pipe's capacity: this write does not block.
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).map_err(spawn)?;
    }
    Ok((program, child))
}

fn finish((program, child): (&'static str, std::process::Child)) -> Result<(), NetError> {
    let out = child
        .wait_with_output()
        .map_err(|source| NetError::Spawn { program, source })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetError::Failed {
            program,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_redirect_to_the_ports_the_listeners_use() {
        assert!(RULES.contains(&format!("redirect to :{PROXY_PORT}")));
        assert!(RULES.contains(&format!("udp dport 53 redirect to :{DNS_PORT}")));
        assert!(RULES.contains("policy drop"));
        assert!(RULES.contains(&format!("udp dport {DNS_PORT} limit rate over")));
        assert!(RULES.contains(&format!("tcp dport {PROXY_PORT} tcp flags")));
    }

    #[test]
    fn the_guest_link_text_names_the_addresses_the_constants_give() {
        assert!(GUEST_LINK_HERE.contains(&format!("addr add {GUEST_GATEWAY_V4}/30 dev g1")));
        assert!(GUEST_LINK_HERE.contains(&format!("addr add {GUEST_GATEWAY_V6}/126 dev g1")));
        assert!(GUEST_LINK_THERE.contains(&format!("addr add {GUEST_ADDRESS_V4}/30 dev g0")));
        assert!(GUEST_LINK_THERE.contains(&format!("addr add {GUEST_ADDRESS_V6}/126 dev g0")));
        assert!(GUEST_LINK_THERE.contains(&format!("default via {GUEST_GATEWAY_V4} dev g0")));
        assert!(GUEST_LINK_THERE.contains(&format!("::/0 via {GUEST_GATEWAY_V6} dev g0")));
        assert!(RULES.contains(&format!("dnat ip6 to [{GUEST_GATEWAY_V6}]:{PROXY_PORT}")));
        assert!(RULES.contains(&format!("dnat ip to 127.0.0.1:{PROXY_PORT}")));
        assert!(RULES.contains(&format!("dnat ip to 127.0.0.1:{DNS_PORT}")));
    }
}
