//! Network policy enforcement end to end: sandboxes created through the
//! daemon reach the test "internet" (a host this test starts in a network
//! namespace of its own on this machine, named through the daemon's
//! `--egress-host`) only as their policy says, over IPv4 and IPv6. Needs
//! root, iproute2, nftables, python3 and curl (scripts/deps installs them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{assert_sandbox_gone, supervisors, TestDaemon};
use common::net::FarNet;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The test internet: a namespace with one HTTP server on 198.51.100.2:8000
/// (TEST-NET-2), joined to the host by a veth pair.
struct Internet {
    server: Child,
    /// HTTPS on 198.51.100.2:8443 with a self-signed certificate.
    tls_server: Child,
    /// A service of the host itself, on its side of the veth
    /// (198.51.100.1:8001): public as addresses go, but the host's own.
    host_service: Child,
    /// Logs every UDP datagram that reaches 198.51.100.2 ports 53 and 9999.
    udp_sink: Child,
    /// HTTP/1.1 with keep-alive on 198.51.100.2:8002, answering each
    /// request with the `Host` it named (`host=…`).
    keep_alive: Child,
    udp_log: std::path::PathBuf,
    /// Stand-ins for what the always-denied set protects: a cloud
    /// metadata service on 169.254.169.254:80 and [fd00:ec2::254]:80 in
    /// the test internet (the host routes there through the veth pair)…
    metadata: Child,
    /// …and services on the host's loopback, 127.0.0.1:8000 and
    /// [::1]:8000. Both log every connection they accept to `reached`.
    loopback: Child,
    reached: std::path::PathBuf,
    /// Dropped after the servers (fields drop after `Drop::drop`).
    _net: FarNet,
}

/// Serves HTTP/1.1 with keep-alive (and pipelining) on 198.51.100.2:8002;
/// each answer is `host=` and the request's `Host`.
const KEEP_ALIVE_SERVER: &str = "
import http.server
class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_GET(self):
        body = ('host=%s\\n' % self.headers.get('Host')).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(('198.51.100.2', 8002), Echo).serve_forever()
";

/// Two requests pipelined on one connection to `address` port `port`, the
/// first naming `first`, the second `second` (`Host`, and the target
/// when `absolute`); prints how many answers came and whether one names
/// the second host.
fn pipelined(address: &str, port: u16, first: &str, second: &str, absolute: bool) -> String {
    let target = |host: &str| {
        if absolute {
            format!("http://{host}/")
        } else {
            "/".to_owned()
        }
    };
    format!(
        "python3 -c \"
import socket
s = socket.create_connection(('{address}', {port}), timeout=3)
s.sendall(b'GET {t1} HTTP/1.1\\r\\nHost: {first}\\r\\n\\r\\nGET {t2} HTTP/1.1\\r\\nHost: {second}\\r\\n\\r\\n')
data = b''
while True:
    try:
        chunk = s.recv(4096)
    except socket.timeout:
        break
    if not chunk:
        break
    data += chunk
print(data.count(b'host='), b'{second}' in data)
\" 2>&1",
        t1 = target(first),
        t2 = target(second),
    )
}

/// Binds UDP 198.51.100.2 ports 53 and 9999 and appends a line per
/// datagram (`PORT PAYLOAD`) to the file named by its argument, after a
/// first line `ready`.
const UDP_SINK: &str = "
import select, socket, sys
socks = []
for port in (53, 9999):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(('198.51.100.2', port))
    socks.append(s)
log = open(sys.argv[1], 'a', buffering=1)
log.write('ready\\n')
while True:
    for s in select.select(socks, [], [])[0]:
        data = s.recvfrom(65535)[0]
        log.write('%d %r\\n' % (s.getsockname()[1], data[:32]))
";

/// Listens on each `ADDRESS:PORT` of its arguments after the first, and
/// for every connection appends `ADDRESS PEER` to the file named by the
/// first, then answers `reached`; writes `ready ADDRESS` once each listens.
const RECORDER: &str = "
import socket, sys, threading
log = open(sys.argv[1], 'a', buffering=1)
def serve(s, address):
    while True:
        c, peer = s.accept()
        log.write('%s %s\\n' % (address, peer[0]))
        c.settimeout(2)
        try:
            c.recv(4096)
            c.sendall(b'HTTP/1.0 200 OK\\r\\nContent-Length: 8\\r\\n\\r\\nreached\\n')
        except OSError:
            pass
        c.close()
for spec in sys.argv[2:]:
    address, port = spec.rsplit(':', 1)
    address = address.strip('[]')
    s = socket.socket(socket.AF_INET6 if ':' in address else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((address, int(port)))
    s.listen(64)
    threading.Thread(target=serve, args=(s, address), daemon=True).start()
    log.write('ready %s\\n' % address)
threading.Event().wait()
";

/// Starts [`RECORDER`] on `listen`, inside `netns` or on the host, and
/// waits until each address listens.
fn start_recorder(netns: Option<&str>, log: &std::path::Path, listen: &[&str]) -> Child {
    let mut command = match netns {
        Some(netns) => {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", netns, "python3"]);
            command
        }
        None => Command::new("python3"),
    };
    let mut recorder = command
        .args(["-c", RECORDER])
        .arg(log)
        .args(listen)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let ready = |address: &str| {
        let line = format!(
            "ready {}",
            address.rsplit_once(':').unwrap().0.trim_matches(['[', ']'])
        );
        std::fs::read_to_string(log).is_ok_and(|l| l.lines().any(|l| l == line))
    };
    if !TestDaemon::wait_for(Duration::from_secs(10), || listen.iter().all(|a| ready(a))) {
        let _ = recorder.kill();
        let _ = recorder.wait();
        panic!("the recording listeners on {listen:?} did not start");
    }
    recorder
}

/// The connections the recorders accepted: `ADDRESS PEER` lines.
fn reached(internet: &Internet) -> Vec<String> {
    std::fs::read_to_string(&internet.reached)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("ready "))
        .map(str::to_owned)
        .collect()
}

impl Internet {
    fn start() -> Internet {
        require_tools();
        let net = FarNet::new("in", "198.51.100.1", "198.51.100.2")
            .with_ipv6("2001:db8:b2::1", "2001:db8:b2::2")
            .with_address("169.254.169.254")
            .with_address("fd00:ec2::254");
        let dir = tempfile::tempdir().unwrap().keep();
        std::fs::write(dir.join("index.html"), "hello from site.test\n").unwrap();
        let far = Some(net.netns.as_str());
        let server = start_server(
            far,
            &dir,
            &["-m", "http.server", "8000", "--bind", "198.51.100.2"],
            "http://198.51.100.2:8000/",
        );
        let ok = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args([
                "-subj",
                "/CN=site.test",
                "-keyout",
                "key.pem",
                "-out",
                "cert.pem",
            ])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "openssl cannot make the test certificate");
        let tls_server = start_server(
            far,
            &dir,
            &[
                "-c",
                "import http.server, ssl\n\
                 server = http.server.HTTPServer(('198.51.100.2', 8443), http.server.SimpleHTTPRequestHandler)\n\
                 context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n\
                 context.load_cert_chain('cert.pem', 'key.pem')\n\
                 server.socket = context.wrap_socket(server.socket, server_side=True)\n\
                 server.serve_forever()\n",
            ],
            "https://198.51.100.2:8443/",
        );
        let host_service = start_server(
            None,
            &dir,
            &["-m", "http.server", "8001", "--bind", "198.51.100.1"],
            "http://198.51.100.1:8001/",
        );
        let keep_alive = start_server(
            far,
            &dir,
            &["-c", KEEP_ALIVE_SERVER],
            "http://198.51.100.2:8002/",
        );
        let udp_log = dir.join("udp.log");
        let udp_sink = Command::new("ip")
            .args(["netns", "exec", &net.netns, "python3", "-c", UDP_SINK])
            .arg(&udp_log)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            TestDaemon::wait_for(Duration::from_secs(10), || {
                std::fs::read_to_string(&udp_log).is_ok_and(|l| l.starts_with("ready"))
            }),
            "the test internet's UDP sink did not start"
        );
        let reached = dir.join("reached.log");
        let metadata = start_recorder(far, &reached, &["169.254.169.254:80", "[fd00:ec2::254]:80"]);
        let loopback = start_recorder(None, &reached, &["127.0.0.1:8000", "[::1]:8000"]);
        Internet {
            server,
            tls_server,
            host_service,
            udp_sink,
            udp_log,
            keep_alive,
            metadata,
            loopback,
            reached,
            _net: net,
        }
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        for child in [
            &mut self.server,
            &mut self.tls_server,
            &mut self.host_service,
            &mut self.udp_sink,
            &mut self.keep_alive,
            &mut self.metadata,
            &mut self.loopback,
        ] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `python3 ARGS` in `dir`, inside the namespace `netns` (or on the
/// host), and waits until `url` answers (stopping it if it does not).
fn start_server(netns: Option<&str>, dir: &std::path::Path, args: &[&str], url: &str) -> Child {
    let mut command = match netns {
        Some(netns) => {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", netns, "python3"]);
            command
        }
        None => Command::new("python3"),
    };
    let mut server = command
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    if !answers(url) {
        let _ = server.kill();
        let _ = server.wait();
        panic!("the test server for {url} did not start");
    }
    server
}

/// Fails unless the tools these tests use are installed.
fn require_tools() {
    for tool in ["ip", "nft", "python3", "curl"] {
        assert!(
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .unwrap()
                .success(),
            "{tool} is missing: run scripts/deps as root"
        );
    }
}

/// Whether `url` answers from the host within 10 s (a server of the test
/// internet has started).
fn answers(url: &str) -> bool {
    TestDaemon::wait_for(Duration::from_secs(10), || {
        Command::new("curl")
            .args(["-sgk", "-o", "/dev/null", "-m", "1", url])
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A script for a tool that ignores proxy settings and speaks raw TCP to
/// `address` port 8000, naming `host` in its request; it prints the HTTP
/// status (or the error).
fn raw_get(address: &str, host: &str) -> String {
    format!(
        "python3 -c \"
import socket
s = socket.create_connection(('{address}', 8000), timeout=5)
s.sendall(b'GET /index.html HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n')
print(s.recv(4096).split(b' ')[1].decode())
\" 2>&1"
    )
}

/// Sandboxes with policies of their own, side by side.
const MANY: usize = 50;

fn create(daemon: &TestDaemon, network: serde_json::Value) -> String {
    let created = daemon.create(json!({ "network": network }));
    created["id"].as_str().unwrap().to_owned()
}

/// The egress denials of `id` in the security stream, once they have come
/// through the egress worker and the audit writer (both asynchronous):
/// read until two reads a moment apart agree.
fn denials(daemon: &TestDaemon, id: &str) -> Vec<serde_json::Value> {
    let read = || {
        let text = std::fs::read_to_string(daemon.data_dir().join("audit/security.jsonl"))
            .unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["kind"] == "egress.denied" && e["sandbox_id"] == id)
            .collect::<Vec<_>>()
    };
    let mut seen = read();
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(250));
        let again = read();
        if again.len() == seen.len() && !again.is_empty() {
            return again;
        }
        seen = again;
    }
    seen
}

/// The value of `airlock_egress_total{protocol, reason}` in a metrics
/// text, 0 if absent.
fn egress_count(metrics: &str, protocol: &str, reason: &str) -> u64 {
    let labels = format!("{{protocol=\"{protocol}\",reason=\"{reason}\"}}");
    metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix("airlock_egress_total")?
                .strip_prefix(&labels)
        })
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn egress_follows_the_policy() {
    let internet = Internet::start();
    let mut flags: Vec<String> = [
        "site.test=198.51.100.2",
        "metadata.test=169.254.169.254",
        "loop.test=127.0.0.1",
    ]
    .iter()
    .flat_map(|h| ["--egress-host".to_owned(), (*h).to_owned()])
    .collect();
    for i in 0..MANY {
        flags.push("--egress-host".into());
        flags.push(format!("site{i}.test=198.51.100.2"));
    }
    flags.push("--max-live".into());
    flags.push("128".into());
    // Every refusal in full: the test reads them one by one.
    flags.push("--audit-events-in-full".into());
    flags.push("100000".into());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let daemon = TestDaemon::start(&flags);

    // An allowlisted name: reachable over HTTP, resolved by the sandbox's
    // resolver; nothing else is.
    let id = create(
        &daemon,
        json!({"mode": "allow", "rules": ["site.test", "metadata.test", "loop.test", "169.254.169.254"]}),
    );
    let (out, code) = daemon.sh_out(
        &id,
        "curl --noproxy '*' -s -m 5 http://site.test:8000/index.html",
    );
    assert_eq!((out.as_str(), code), ("hello from site.test\n", 0));
    let (out, _) = daemon.sh_out(&id, "getent hosts site.test");
    assert!(out.starts_with("198.51.100.2"), "{out}");
    // And over TLS, judged by the ClientHello's SNI.
    let (out, code) = daemon.sh_out(
        &id,
        "curl --noproxy '*' -sk -m 5 https://site.test:8443/index.html",
    );
    assert_eq!((out.as_str(), code), ("hello from site.test\n", 0));
    let (_, code) = daemon.sh_out(
        &id,
        "curl --noproxy '*' -sk -m 5 --resolve other.test:8443:198.51.100.2 https://other.test:8443/",
    );
    assert_eq!(
        code, 35,
        "a TLS connection naming a denied host is cut (curl: 35)"
    );
    // Tools that use the proxy variables get the same enforcement through
    // the proxy's explicit mode: plain requests, and CONNECT tunnels whose
    // TLS must name the host they were opened to.
    let (out, code) = daemon.sh_out(&id, "curl -sf -m 5 http://site.test:8000/index.html");
    assert_eq!((out.as_str(), code), ("hello from site.test\n", 0));
    let (out, code) = daemon.sh_out(&id, "curl -sfk -m 5 https://site.test:8443/index.html");
    assert_eq!((out.as_str(), code), ("hello from site.test\n", 0));
    let (_, code) = daemon.sh_out(&id, "curl -sf -m 5 http://other.test:8000/");
    assert_eq!(
        code, 22,
        "a denied name through the proxy: 403 (curl -f: 22)"
    );
    let (_, code) = daemon.sh_out(&id, "curl -sfk -m 5 https://other.test:8443/");
    assert_eq!(
        code, 22,
        "CONNECT to a denied name: 403 from the proxy (curl -f: 22)"
    );
    // A CONNECT naming a denied host through an allowed address is refused.
    let (_, code) = daemon.sh_out(
        &id,
        "curl -s -m 5 -p -x http://site.test:8000 http://other.test:8000/",
    );
    assert_ne!(code, 0);
    // A name not on the list does not resolve (curl: 6)…
    let (_, code) = daemon.sh_out(&id, "curl --noproxy '*' -s -m 5 http://other.test:8000/");
    assert_eq!(code, 6);
    // …and naming it in Host while going to an allowed address is refused
    // by the proxy (curl: 52, empty reply).
    let (_, code) = daemon.sh_out(
        &id,
        "curl --noproxy '*' -s -m 5 --resolve other.test:8000:198.51.100.2 http://other.test:8000/",
    );
    assert_eq!(code, 52);
    // The allowed host's address without its name is refused.
    let (_, code) = daemon.sh_out(&id, "curl --noproxy '*' -s -m 5 http://198.51.100.2:8000/");
    assert_eq!(code, 52);
    // A tool that ignores proxy settings and speaks raw TCP is intercepted
    // all the same: allowed with the right Host, refused with another.
    let (out, _) = daemon.sh_out(&id, &raw_get("198.51.100.2", "site.test"));
    assert_eq!(out.trim(), "200", "{out}");
    // Plain HTTP is judged by its first request's Host, so the server
    // answers that one alone: a second request pipelined or kept alive on
    // the connection, naming a host not allowed, is never served, whether
    // the connection was intercepted or made to the proxy as a proxy.
    let (out, _) = daemon.sh_out(
        &id,
        &pipelined(
            "198.51.100.2",
            8002,
            "site.test:8002",
            "other.test:8002",
            false,
        ),
    );
    assert_eq!(out, "1 False\n");
    let (out, _) = daemon.sh_out(
        &id,
        &pipelined(
            // Where every tier's sandboxes name the proxy (HTTP_PROXY).
            "10.255.254.1",
            15001,
            "site.test:8002",
            "other.test:8002",
            true,
        ),
    );
    assert_eq!(out, "1 False\n");
    // Clients that reuse connections do not notice: they open another.
    for proxy in ["", "--noproxy '*'"] {
        let (out, code) = daemon.sh_out(
            &id,
            &format!("curl {proxy} -s -m 5 http://site.test:8002/a http://site.test:8002/b"),
        );
        assert_eq!(
            (out.as_str(), code),
            ("host=site.test:8002\nhost=site.test:8002\n", 0)
        );
    }
    // An intercepted connection's segment size comes from the route it was
    // made on, not from loopback, where the proxy takes it: that route must
    // not hold it to Ethernet-sized segments (which cost a download through
    // the proxy two thirds of its speed).
    // (gVisor's netstack answers TCP_MAXSEG with its default, 536, on
    // every connection; the size its segments take on the guest link is
    // what its MTU of 65535 gives, as the proxy's side of a connection
    // shows: 32,704 measured.)
    let (out, _) = daemon.sh_out(
        &id,
        "python3 -c \"
import socket
s = socket.create_connection(('198.51.100.2', 8000), timeout=5)
print(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG))
\"",
    );
    if !common::on_gvisor() {
        assert!(
            out.trim().parse::<u32>().is_ok_and(|mss| mss > 16_000),
            "segment size of an intercepted connection: {out}"
        );
    }
    let (out, _) = daemon.sh_out(&id, &raw_get("198.51.100.2", "other.test"));
    assert!(!out.contains("200"), "{out}");
    // Names that resolve into the always-denied set are refused whatever
    // the rules say: cloud metadata (also as a literal rule) and loopback.
    // Something listens at each of these addresses, and the host reaches
    // it (the control); no connection from the sandbox reaches any of
    // them, intercepted or through the proxy as a proxy.
    let targets = [
        "http://169.254.169.254/",
        "http://[fd00:ec2::254]/",
        "http://127.0.0.1:8000/",
        "http://[::1]:8000/",
    ];
    for url in targets {
        let out = Command::new("curl")
            .args(["--noproxy", "*", "-sg", "-m", "5", url])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "reached\n",
            "the host does not reach {url}"
        );
    }
    let control = reached(&internet);
    assert_eq!(control.len(), targets.len(), "{control:?}");
    for spelling in [
        "http://169.254.169.254/",
        "http://2852039166/",
        "http://0xa9fea9fe/",
        "http://0251.0376.0251.0376/",
        "http://[::ffff:169.254.169.254]/",
        "http://[fd00:ec2::254]/",
        "http://127.1:8000/",
        "http://2130706433:8000/",
        "http://[::1]:8000/",
        "http://[::ffff:127.0.0.1]:8000/",
    ] {
        for proxy in ["--noproxy '*'", ""] {
            let (out, code) = daemon.sh_out(&id, &format!("curl {proxy} -sgf -m 5 '{spelling}'"));
            assert!(
                code != 0 && !out.contains("reached"),
                "{spelling} ({proxy}) was reachable: {out}"
            );
        }
    }
    let (out, _) = daemon.sh_out(&id, "getent hosts metadata.test loop.test; echo end");
    assert_eq!(out, "end\n", "always-denied addresses are not handed out");
    // Names the host resolves into the set, named to an allowed address.
    for (name, port) in [("metadata.test", 80), ("loop.test", 8000)] {
        let (out, code) = daemon.sh_out(
            &id,
            &format!(
                "curl --noproxy '*' -s -m 5 --resolve {name}:{port}:198.51.100.2 http://{name}:{port}/; \
                 curl -sf -m 5 http://{name}:{port}/"
            ),
        );
        assert!(code != 0 && !out.contains("reached"), "{name}: {out}");
    }
    assert_eq!(
        reached(&internet),
        control,
        "a connection from the sandbox reached a metadata or loopback listener"
    );
    // UDP other than DNS and ICMP do not leave: a datagram to an outside
    // port is refused, a DNS query to an outside resolver is answered by
    // the sandbox's own (which knows no other.test), and neither reaches
    // the test internet, which does get the host's datagram.
    let (out, _) = daemon.sh_out(
        &id,
        "python3 -c \"
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
try:
    s.sendto(b'from the sandbox', ('198.51.100.2', 9999)); print('sent')
except OSError as e:
    print('refused', e.errno)
query = bytes.fromhex('abcd01000001000000000000') + b'\\x05other\\x04test\\x00\\x00\\x01\\x00\\x01'
s.sendto(query, ('198.51.100.2', 53))
print('rcode', s.recvfrom(512)[0][3] & 15)
for kind, proto in ((socket.SOCK_DGRAM, socket.IPPROTO_ICMP), (socket.SOCK_RAW, socket.IPPROTO_ICMP)):
    try:
        icmp = socket.socket(socket.AF_INET, kind, proto)
        icmp.sendto(bytes.fromhex('0800f7ff00000000'), ('198.51.100.2', 0)); print('icmp sent')
    except OSError as e:
        print('icmp refused')
\"",
    );
    // On gVisor the guest's own stack sends them (it cannot know the
    // rules of the namespace beyond its link) and they are dropped where
    // they arrive; on the other tiers the sending call fails with EPERM.
    let expected = if common::on_gvisor() {
        "sent\nrcode 3\nicmp sent\nicmp refused\n"
    } else {
        "refused 1\nrcode 3\nicmp refused\nicmp refused\n"
    };
    assert_eq!(out, expected, "{out}");
    std::net::UdpSocket::bind("198.51.100.1:0")
        .unwrap()
        .send_to(b"from the host", "198.51.100.2:9999")
        .unwrap();
    let mut received = String::new();
    TestDaemon::wait_for(Duration::from_secs(5), || {
        received = std::fs::read_to_string(&internet.udp_log).unwrap();
        received.lines().count() > 1
    });
    assert_eq!(received, "ready\n9999 b'from the host'\n");
    // Every refusal is a security audit event.
    let seen = denials(&daemon, &id);
    assert!(
        seen.iter()
            .any(|e| e["detail"]["protocol"] == "dns" && e["detail"]["destination"] == "other.test"),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|e| e["detail"]["protocol"] == "tcp" && e["detail"]["reason"] == "always_denied"),
        "{seen:?}"
    );

    // The policy can be read and replaced while the sandbox runs: new
    // connections follow the new one at once.
    let path = format!("/v1/sandboxes/{id}/network");
    let shown = daemon.call("GET", &path, None).json();
    assert_eq!(shown["mode"], "allow");
    assert_eq!(shown["rules"][0], "site.test");
    let replaced = daemon.call(
        "PUT",
        &path,
        Some(json!({"mode": "allow", "rules": ["other.test"]})),
    );
    assert_eq!(replaced.status, 200, "{}", replaced.text());
    let (_, code) = daemon.sh_out(
        &id,
        "curl --noproxy '*' -s -m 5 http://site.test:8000/index.html",
    );
    assert_eq!(code, 6, "site.test no longer resolves");
    let back = daemon.call(
        "PUT",
        &path,
        Some(json!({"mode": "allow", "rules": ["site.test"]})),
    );
    assert_eq!(back.status, 200);
    let (out, code) = daemon.sh_out(
        &id,
        "curl --noproxy '*' -s -m 5 http://site.test:8000/index.html",
    );
    assert_eq!((out.as_str(), code), ("hello from site.test\n", 0));
    let bad = daemon.call(
        "PUT",
        &path,
        Some(json!({"mode": "allow", "rules": ["a b"]})),
    );
    assert_eq!(bad.status, 400, "{}", bad.text());

    // An IP rule lets the address through without a name.
    let by_ip = create(
        &daemon,
        json!({"mode": "allow", "rules": ["198.51.100.2:8000"]}),
    );
    let (out, code) = daemon.sh_out(
        &by_ip,
        "curl --noproxy '*' -s -m 5 http://198.51.100.2:8000/index.html",
    );
    assert_eq!((out.as_str(), code), ("hello from site.test\n", 0));

    // `open` reaches the public address but never the always-denied set.
    let open = create(&daemon, json!({"mode": "open"}));
    let (out, code) = daemon.sh_out(
        &open,
        "curl --noproxy '*' -s -m 5 http://site.test:8000/index.html",
    );
    assert_eq!((out.as_str(), code), ("hello from site.test\n", 0));
    for url in targets {
        for proxy in ["--noproxy '*'", ""] {
            let (out, code) = daemon.sh_out(&open, &format!("curl {proxy} -sgf -m 5 '{url}'"));
            assert!(
                code != 0 && !out.contains("reached"),
                "{url} ({proxy}): {out}"
            );
        }
    }
    assert_eq!(
        reached(&internet),
        control,
        "an open sandbox reached a listener"
    );
    // Nor the host's own addresses, public or not.
    let (_, code) = daemon.sh_out(
        &open,
        "curl --noproxy '*' -s -m 5 http://198.51.100.1:8001/",
    );
    assert_ne!(code, 0, "a host service is reachable from an open sandbox");
    assert!(
        denials(&daemon, &open)
            .iter()
            .any(|e| e["detail"]["reason"] == "host_address"),
        "{:?}",
        denials(&daemon, &open)
    );

    // `deny`: the internet but what its rules name, unless an exception
    // allows it (e2b's denyOut with allowOut winning over it).
    let denied_name = create(&daemon, json!({"mode": "deny", "rules": ["site.test"]}));
    let (out, code) = daemon.sh_out(
        &denied_name,
        "curl --noproxy '*' -s -m 5 http://site.test:8000/index.html",
    );
    assert!(code != 0 && !out.contains("hello"), "a denied name: {out}");
    let (out, code) = daemon.sh_out(
        &denied_name,
        "curl --noproxy '*' -s -m 5 http://198.51.100.2:8000/index.html",
    );
    assert_eq!((out.as_str(), code), ("hello from site.test\n", 0));
    assert!(
        denials(&daemon, &denied_name)
            .iter()
            .any(|e| e["detail"]["reason"] == "denylisted"),
        "{:?}",
        denials(&daemon, &denied_name)
    );
    let denied_range = create(
        &daemon,
        json!({"mode": "deny", "rules": ["198.51.100.0/24"], "except": ["site.test:8000"]}),
    );
    let (out, code) = daemon.sh_out(
        &denied_range,
        "curl --noproxy '*' -s -m 5 http://198.51.100.2:8000/index.html",
    );
    assert!(
        code != 0 && !out.contains("hello"),
        "a denied address: {out}"
    );
    let (out, code) = daemon.sh_out(
        &denied_range,
        "curl --noproxy '*' -s -m 5 http://site.test:8000/index.html",
    );
    assert_eq!((out.as_str(), code), ("hello from site.test\n", 0));
    let shown = daemon
        .call(
            "GET",
            &format!("/v1/sandboxes/{denied_range}/network"),
            None,
        )
        .json();
    assert_eq!(
        shown,
        json!({"mode": "deny", "rules": ["198.51.100.0/24"], "except": ["site.test:8000"]})
    );
    for sandbox in [&denied_name, &denied_range] {
        assert_eq!(
            reached(&internet),
            control,
            "{sandbox} reached a listener of the always-denied set"
        );
    }

    // `none` (the default) has loopback only, and no egress path to give a
    // policy to later.
    let none = create(&daemon, json!({"mode": "none"}));
    let (_, code) = daemon.sh_out(
        &none,
        "curl --noproxy '*' -s -m 5 http://198.51.100.2:8000/",
    );
    assert_ne!(code, 0);
    let refused = daemon.call(
        "PUT",
        &format!("/v1/sandboxes/{none}/network"),
        Some(json!({"mode": "open"})),
    );
    assert_eq!(refused.status, 409, "{}", refused.text());

    // Every decision so far is counted by protocol and reason.
    let metrics = daemon.call("GET", "/metrics", None);
    assert_eq!(metrics.status, 200);
    let metrics = metrics.text();
    for (protocol, reason) in [
        ("tcp", "allowed"),
        ("tcp", "host_address"),
        ("tcp", "always_denied"),
        ("dns", "allowed"),
        ("dns", "not_allowlisted"),
    ] {
        assert!(
            egress_count(&metrics, protocol, reason) >= 1,
            "no {protocol} {reason} counted in:\n{metrics}"
        );
    }

    // Many sandboxes, each with its own allowlist: each reaches its own
    // name and none of the others'.
    let many: Vec<String> = (0..MANY)
        .map(|i| {
            create(
                &daemon,
                json!({"mode": "allow", "rules": [format!("site{i}.test")]}),
            )
        })
        .collect();
    for (i, sandbox) in many.iter().enumerate() {
        let other = (i + 1) % MANY;
        let (out, _) = daemon.sh_out(
            sandbox,
            &format!(
                "curl --noproxy '*' -s -m 5 -o /dev/null -w '%{{http_code}}' http://site{i}.test:8000/index.html; \
                 echo; curl --noproxy '*' -s -m 5 -o /dev/null -w '%{{http_code}}' \
                 --resolve site{other}.test:8000:198.51.100.2 http://site{other}.test:8000/; echo"
            ),
        );
        assert_eq!(out, "200\n000\n", "sandbox {i}");
    }

    // Teardown leaves nothing: the namespace, its links and its rules go
    // with the sandbox.
    daemon.delete_all();
    for id in [&id, &by_ip, &open, &none].into_iter().chain(many.iter()) {
        assert_sandbox_gone(id);
    }

    // What is left of this daemon is its spares: of the tier the
    // sandboxes ran on, a plain one and, since sandboxes with network were
    // asked for, one with their namespace prepared (and, when that tier is
    // not `process`, the process tier's plain one). They go when the
    // daemon stops.
    let owner = std::fs::read_to_string(daemon.data_dir().join("instance")).unwrap();
    let owner = owner.trim().to_owned();
    let args = |pid: &u32| -> Vec<Vec<u8>> {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .map(<[u8]>::to_vec)
            .collect()
    };
    let networked = |pid: &u32| args(pid).iter().any(|a| a == b"--network");
    let tier = |pid: &u32| {
        let args = args(pid);
        args.iter()
            .position(|a| a == b"--tier")
            .and_then(|at| args.get(at + 1))
            .map_or_else(
                || "process".to_owned(),
                |t| String::from_utf8_lossy(t).into_owned(),
            )
    };
    let test_tier = common::test_tier();
    assert!(
        TestDaemon::wait_for(Duration::from_secs(10), || {
            let spares = supervisors(&owner);
            let (ours, others): (Vec<u32>, Vec<u32>) =
                spares.iter().partition(|p| tier(p) == test_tier);
            ours.len() == 2
                && ours.iter().filter(|p| networked(p)).count() == 1
                && others.iter().all(|p| tier(p) == "process" && !networked(p))
                && others.len() <= 1
        }),
        "spares of the daemon: {:?}",
        supervisors(&owner)
            .iter()
            .map(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .collect::<Vec<_>>()
    );
    drop(daemon);
    assert!(
        TestDaemon::wait_for(Duration::from_secs(10), || supervisors(&owner).is_empty()),
        "spares outlived their daemon: {:?}",
        supervisors(&owner)
    );
    assert!(
        !std::path::Path::new("/run/airlock/sockets")
            .join(&owner)
            .exists(),
        "the daemon left its sockets directory behind"
    );

    // `airlock run` serves the egress path of its one sandbox itself.
    let out = common::run(&[
        "--allow",
        "site.test",
        "--egress-host",
        "site.test=198.51.100.2",
        "--",
        "sh",
        "-c",
        "curl --noproxy '*' -s -m 5 http://site.test:8000/index.html; \
         curl --noproxy '*' -s -m 5 --resolve other.test:8000:198.51.100.2 http://other.test:8000/; echo rc=$?",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from site.test\nrc=52\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("egress refused: tcp other.test:8000"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(internet);
}

/// The address of the IPv6 test internet's server: documentation space
/// (2001:db8::/32), outside the always-denied set like a public address.
const V6_SITE: &str = "2001:db8:a1::2";

/// The IPv6 test internet: a namespace of its own with one HTTP server on
/// [2001:db8:a1::2]:8000, joined to the host by a veth pair carrying
/// 2001:db8:a1::/64 (and 198.18.0.0/24, of the benchmarking range, which
/// no name here resolves to: not TEST-NET-1, which a CI machine's own
/// network may use).
struct Internet6 {
    server: Child,
    /// Dropped after the server (fields drop after `Drop::drop`).
    _net: FarNet,
}

impl Internet6 {
    fn start() -> Internet6 {
        require_tools();
        let net =
            FarNet::new("v6", "198.18.0.1", "198.18.0.2").with_ipv6("2001:db8:a1::1", V6_SITE);
        let dir = tempfile::tempdir().unwrap().keep();
        std::fs::write(dir.join("index.html"), "hello from v6site.test\n").unwrap();
        let server = start_server(
            Some(&net.netns),
            &dir,
            &["-m", "http.server", "8000", "--bind", V6_SITE],
            &format!("http://[{V6_SITE}]:8000/"),
        );
        Internet6 { server, _net: net }
    }
}

impl Drop for Internet6 {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

#[test]
fn egress_over_ipv6_follows_the_policy() {
    let internet = Internet6::start();
    let daemon = TestDaemon::start(&[
        "--egress-host",
        &format!("v6site.test={V6_SITE}"),
        // Every refusal in full: the test reads them one by one.
        "--audit-events-in-full",
        "100000",
    ]);
    let hello = "hello from v6site.test\n";

    // A name with only an IPv6 address: the sandbox's resolver answers
    // AAAA for it (and no A), and it is reachable by name, transparently
    // (whichever family curl picks, and IPv6 forced) and through the
    // proxy's explicit mode.
    let id = create(&daemon, json!({"mode": "allow", "rules": ["v6site.test"]}));
    let (out, _) = daemon.sh_out(&id, "getent ahosts v6site.test | cut -d' ' -f1 | sort -u");
    assert_eq!(out, format!("{V6_SITE}\n"));
    for curl in [
        "curl --noproxy '*' -s -m 5",
        "curl --noproxy '*' -6 -s -m 5",
        "curl -sf -m 5",
    ] {
        let (out, code) = daemon.sh_out(&id, &format!("{curl} http://v6site.test:8000/index.html"));
        assert_eq!((out.as_str(), code), (hello, 0), "{curl}");
    }
    // Raw TCP to the address, which the redirect hands to the proxy's
    // IPv6 listener: allowed with the right Host, refused with another;
    // the address alone (Host naming the literal) is refused too.
    let (out, _) = daemon.sh_out(&id, &raw_get(V6_SITE, "v6site.test"));
    assert_eq!(out.trim(), "200", "{out}");
    let (out, _) = daemon.sh_out(&id, &raw_get(V6_SITE, "other.test"));
    assert!(!out.contains("200"), "{out}");
    let (_, code) = daemon.sh_out(
        &id,
        &format!("curl --noproxy '*' -sg -m 5 http://[{V6_SITE}]:8000/index.html"),
    );
    assert_eq!(code, 52, "the allowed host's address without its name");

    // An IP rule lets the IPv6 address through without a name.
    let by_ip = create(&daemon, json!({"mode": "allow", "rules": [V6_SITE]}));
    let (out, code) = daemon.sh_out(
        &by_ip,
        &format!("curl --noproxy '*' -sg -m 5 http://[{V6_SITE}]:8000/index.html"),
    );
    assert_eq!((out.as_str(), code), (hello, 0));

    // A sandbox allowing some other name reaches it neither by address
    // nor by name (which does not resolve there, curl: 6), and each
    // refusal is a security audit event.
    let other = create(&daemon, json!({"mode": "allow", "rules": ["site.test"]}));
    let (_, code) = daemon.sh_out(
        &other,
        &format!("curl --noproxy '*' -sg -m 5 http://[{V6_SITE}]:8000/index.html"),
    );
    assert_eq!(code, 52);
    let (_, code) = daemon.sh_out(
        &other,
        "curl --noproxy '*' -s -m 5 http://v6site.test:8000/index.html",
    );
    assert_eq!(code, 6);
    let (_, code) = daemon.sh_out(
        &other,
        &format!(
            "curl --noproxy '*' -sg -m 5 --resolve v6site.test:8000:[{V6_SITE}] \
             http://v6site.test:8000/index.html"
        ),
    );
    assert_eq!(code, 52);
    let seen = denials(&daemon, &other);
    for (protocol, destination) in [
        ("tcp", V6_SITE),
        ("dns", "v6site.test"),
        ("tcp", "v6site.test"),
    ] {
        assert!(
            seen.iter().any(|e| e["detail"]["protocol"] == protocol
                && e["detail"]["destination"] == destination
                && e["detail"]["reason"] == "not_allowlisted"),
            "no {protocol} denial of {destination}: {seen:?}"
        );
    }

    daemon.delete_all();
    for id in [&id, &by_ip, &other] {
        assert_sandbox_gone(id);
    }

    // `airlock run` serves the same path.
    let out = common::run(&[
        "--allow",
        "v6site.test",
        "--egress-host",
        &format!("v6site.test={V6_SITE}"),
        "--",
        "curl",
        "--noproxy",
        "*",
        "-s",
        "-m",
        "5",
        "http://v6site.test:8000/index.html",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        hello,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(internet);
}
