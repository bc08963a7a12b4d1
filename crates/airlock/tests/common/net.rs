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
        FarNet { netns, link, peer }
    }

    /// Also gives the host's end `host/64` and the namespace's end
    /// `far/64`, usable at once (`nodad`: no duplicate address detection
    /// to wait for).
    pub fn with_ipv6(self, host: &str, far: &str) -> FarNet {
        let FarNet { netns, link, peer } = &self;
        let script = format!(
            "set -e
             ip addr add {host}/64 dev {link} nodad
             ip -n {netns} addr add {far}/64 dev {peer} nodad"
        );
        run(
            &script,
            "cannot give the test network IPv6 addresses (is IPv6 disabled on this host?)",
        );
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
