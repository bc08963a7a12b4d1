//! A network of the tests' own: a namespace standing for "the internet",
//! joined to the host by a veth pair (IPv4, and IPv6 when asked for).
//! Needs root and iproute2.

use std::process::Command;

/// A network namespace joined to the host: the host's end of the veth pair
/// has `host/24`, the namespace's end `far/24` (and, after
/// [`FarNet::with_ipv6`], IPv6 addresses in one /64 too). Removed on drop.
pub struct FarNet {
    /// The namespace, for `ip netns exec`.
    pub netns: String,
    link: String,
    peer: String,
    /// The namespace's IPv4 address on the pair.
    far: String,
    /// The namespace's IPv6 address on the pair, after [`FarNet::with_ipv6`].
    far6: Option<String>,
}

impl FarNet {
    /// `name` (two letters) tells apart the networks of different tests.
    pub fn new(name: &str, host: &str, far: &str) -> FarNet {
        let tag = std::process::id() % 100_000;
        let netns = format!("al-{name}-{tag}");
        let link = format!("al-{name}{tag}");
        let peer = format!("al-{name}p{tag}");
        let _ = Command::new("ip").args(["netns", "del", &netns]).status();
        let _ = Command::new("ip").args(["link", "del", &link]).status();
        let script = format!(
            "set -e
             ip netns add {netns}
             ip link add {link} type veth peer name {peer}
             ip link set {peer} netns {netns}
             ip addr add {host}/24 dev {link}
             ip link set {link} up
             ip -n {netns} addr add {far}/24 dev {peer}
             ip -n {netns} link set {peer} up
             ip -n {netns} link set lo up"
        );
        run(
            &script,
            "cannot set up the test network (root and iproute2 needed)",
        );
        FarNet {
            netns,
            link,
            peer,
            far: far.to_owned(),
            far6: None,
        }
    }

    /// Also gives the host's end `host/64` and the namespace's end
    /// `far/64`, usable at once (`nodad`: no duplicate address detection
    /// to wait for).
    pub fn with_ipv6(mut self, host: &str, far: &str) -> FarNet {
        let FarNet {
            netns, link, peer, ..
        } = &self;
        let script = format!(
            "set -e
             ip addr add {host}/64 dev {link} nodad
             ip -n {netns} addr add {far}/64 dev {peer} nodad"
        );
        run(
            &script,
            "cannot give the test network IPv6 addresses (is IPv6 disabled on this host?)",
        );
        self.far6 = Some(far.to_owned());
        self
    }

    /// Gives the namespace one more address, `address` (IPv4, or IPv6 after
    /// [`FarNet::with_ipv6`]), on its loopback, and the host a route to it
    /// through the pair, so the host reaches a server there as it would a
    /// host of the internet (or a cloud's metadata service). The route goes
    /// with the pair.
    pub fn with_address(self, address: &str) -> FarNet {
        let (family, via) = if address.contains(':') {
            let via = self.far6.as_deref().expect("with_ipv6 first");
            ("-6", via)
        } else {
            ("-4", self.far.as_str())
        };
        let script = format!(
            "set -e
             ip -n {netns} addr add {address} dev lo
             ip {family} route add {address} via {via} dev {link}",
            netns = self.netns,
            link = self.link,
        );
        run(&script, "cannot give the test network another address");
        self
    }
}

/// Runs a shell script; fails the test with `failure` if it fails.
fn run(script: &str, failure: &str) {
    let ok = Command::new("sh")
        .args(["-c", script])
        .status()
        .unwrap()
        .success();
    assert!(ok, "{failure}");
}

impl Drop for FarNet {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}
