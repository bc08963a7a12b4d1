//! Sandbox ports from outside (issue 15): a server inside a sandbox is
//! reached through the daemon's listener, by path and by host, HTTP and
//! WebSocket; only with the sandbox's credentials unless its ports are
//! public; never another sandbox's ports or the host's; with network
//! `none` too. Runs on `AIRLOCK_TEST_TIER`'s tier (scripts/test runs it
//! on every tier).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const DOMAIN: &str = "ports.airlock.test";
const SERVER: &str = include_str!("../../../tests/common/port_server.py");

fn start() -> TestDaemon {
    TestDaemon::start(&["--sandbox-domain", DOMAIN])
}

/// The daemon's `host:port`.
fn address(daemon: &TestDaemon) -> String {
    daemon.url.trim_start_matches("http://").to_owned()
}

/// Starts the test server on `port` in `id` and waits until it answers
/// through the daemon.
fn serve(daemon: &TestDaemon, id: &str, token: &str, port: u16) {
    let put = daemon.call_as(
        Some(&daemon.key),
        "PUT",
        &format!("/v1/sandboxes/{id}/files?path=/tmp/port_server.py"),
        Some(SERVER.as_bytes()),
        Some("application/octet-stream"),
        &[],
    );
    assert!(put.status < 300, "{}", put.text());
    let started = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(
            json!({"cmd": "python3", "args": ["/tmp/port_server.py", port.to_string()],
                    "background": true}),
        ),
    );
    assert_eq!(started.status, 201, "{}", started.text());
    let path = format!("/v1/sandboxes/{id}/ports/{port}/ready");
    assert!(
        TestDaemon::wait_for(Duration::from_secs(30), || {
            daemon
                .call_as(None, "GET", &path, None, None, &[("X-Access-Token", token)])
                .status
                == 200
        }),
        "the server in {id} never answered on port {port}"
    );
}

/// One raw HTTP/1.1 exchange on a fresh connection: the status and body.
fn raw(daemon: &TestDaemon, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address(daemon)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A GET by host `PORT-ID.DOMAIN` with `headers`.
fn get_by_host(
    daemon: &TestDaemon,
    id: &str,
    port: u16,
    path: &str,
    headers: &str,
) -> (u16, String) {
    raw(
        daemon,
        &format!(
            "GET {path} HTTP/1.1\r\nHost: {port}-{id}.{DOMAIN}\r\n{headers}Connection: close\r\n\r\n"
        ),
    )
}

fn create(daemon: &TestDaemon, body: Value) -> (String, String) {
    let created = daemon.create(body);
    (
        created["id"].as_str().unwrap().to_owned(),
        created["access_token"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn a_server_inside_answers_by_path_and_by_host_with_credentials_only() {
    let _serial = serial();
    let daemon = start();
    // Network `none` (the default): ports are served all the same.
    let (id, token) = create(&daemon, json!({}));
    serve(&daemon, &id, &token, 8000);

    // By path, with an API key: the prefix is taken off, the query kept,
    // and the daemon's credentials never reach the server.
    let answer = daemon.call_as(
        Some(&daemon.key),
        "GET",
        &format!("/v1/sandboxes/{id}/ports/8000/some/page?x=1"),
        None,
        None,
        &[("X-App", "mine"), ("Authorization", "Basic app-own")],
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let seen = answer.json();
    assert_eq!(seen["path"], "/some/page?x=1", "{seen}");
    assert_eq!(seen["headers"]["x-app"], "mine", "{seen}");
    assert_eq!(seen["headers"]["authorization"], "Basic app-own", "{seen}");
    assert!(seen["headers"].get("x-api-key").is_none(), "{seen}");

    // With the sandbox's access token; the bare prefix redirects to its
    // directory.
    let with_token = [("X-Access-Token", token.as_str())];
    let answer = daemon.call_as(
        None,
        "GET",
        &format!("/v1/sandboxes/{id}/ports/8000/"),
        None,
        None,
        &with_token,
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.json()["headers"].get("x-access-token").is_none());
    let (status, _) = raw(
        &daemon,
        &format!(
            "GET /v1/sandboxes/{id}/ports/8000 HTTP/1.1\r\nHost: x\r\nX-Access-Token: {token}\r\nConnection: close\r\n\r\n"
        ),
    );
    assert_eq!(status, 308);

    // A body goes in and comes back whole.
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let echoed = daemon.call_as(
        None,
        "POST",
        &format!("/v1/sandboxes/{id}/ports/8000/echo"),
        Some(&body),
        Some("application/octet-stream"),
        &with_token,
    );
    assert_eq!(echoed.status, 200);
    assert!(echoed.body == body, "the body came back changed");

    // By host: path and Host untouched.
    let (status, body) = get_by_host(
        &daemon,
        &id,
        8000,
        "/by/host",
        &format!("X-Access-Token: {token}\r\n"),
    );
    assert_eq!(status, 200, "{body}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["path"], "/by/host");
    assert_eq!(seen["headers"]["host"], format!("8000-{id}.{DOMAIN}"));

    // Without a credential: 401; with a wrong one: 403; the server saw
    // neither.
    let path = format!("/v1/sandboxes/{id}/ports/8000/");
    let bare = daemon.call_as(None, "GET", &path, None, None, &[]);
    assert_eq!((bare.status, bare.code()), (401, "unauthorized".to_owned()));
    let (status, _) = get_by_host(&daemon, &id, 8000, "/", "");
    assert_eq!(status, 401);
    let wrong = daemon.call_as(
        None,
        "GET",
        &path,
        None,
        None,
        &[("X-Access-Token", "at_wrong")],
    );
    assert_eq!(wrong.status, 403, "{}", wrong.text());
    let wrong = daemon.call_as(
        None,
        "GET",
        &path,
        None,
        None,
        &[("E2B-Traffic-Access-Token", "tt_wrong")],
    );
    assert_eq!(wrong.status, 403, "{}", wrong.text());

    // A port nothing listens on: 502, saying so.
    let closed = daemon.call_as(
        None,
        "GET",
        &format!("/v1/sandboxes/{id}/ports/8001/"),
        None,
        None,
        &with_token,
    );
    assert_eq!(
        (closed.status, closed.code()),
        (502, "port_closed".to_owned()),
        "{}",
        closed.text()
    );

    // Unknown sandboxes: 404.
    let unknown = daemon.call_as(
        Some(&daemon.key),
        "GET",
        "/v1/sandboxes/sbx-0000000000000000/ports/8000/",
        None,
        None,
        &[],
    );
    assert_eq!(unknown.status, 404, "{}", unknown.text());

    let deleted = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert!(deleted.status < 300);
    // A deleted sandbox's ports are gone with it.
    let gone = daemon.call_as(Some(&daemon.key), "GET", &path, None, None, &[]);
    assert_eq!(gone.status, 404, "{}", gone.text());
}

#[test]
fn a_sandbox_reaches_only_its_own_ports() {
    let _serial = serial();
    let daemon = start();
    let (a, token_a) = create(&daemon, json!({}));
    let (b, token_b) = create(&daemon, json!({"network": {"mode": "open"}}));
    serve(&daemon, &a, &token_a, 8000);

    // A's token does not open B's ports (nor B's A's), by path or by host.
    let path = format!("/v1/sandboxes/{a}/ports/8000/");
    let cross = daemon.call_as(
        None,
        "GET",
        &path,
        None,
        None,
        &[("X-Access-Token", &token_b)],
    );
    assert_eq!(cross.status, 403, "{}", cross.text());
    let (status, _) = get_by_host(
        &daemon,
        &b,
        8000,
        "/",
        &format!("X-Access-Token: {token_a}\r\n"),
    );
    assert_eq!(status, 403);

    // B has nothing on 8000: its own loopback, not A's.
    let own = daemon.call_as(
        None,
        "GET",
        &format!("/v1/sandboxes/{b}/ports/8000/"),
        None,
        None,
        &[("X-Access-Token", &token_b)],
    );
    assert_eq!(own.status, 502, "{}", own.text());

    // A port the host listens on (on its loopback) is not a sandbox's,
    // even for a sandbox whose network is open.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    host.set_nonblocking(true).unwrap();
    for (id, token) in [(&a, &token_a), (&b, &token_b)] {
        let answer = daemon.call_as(
            None,
            "GET",
            &format!("/v1/sandboxes/{id}/ports/{host_port}/"),
            None,
            None,
            &[("X-Access-Token", token)],
        );
        assert_eq!(answer.status, 502, "{id}: {}", answer.text());
    }
    assert!(
        host.accept().is_err(),
        "a sandbox's port request reached the host"
    );
    // Nor the daemon's own port.
    let daemon_port: u16 = address(&daemon)
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let answer = daemon.call_as(
        None,
        "GET",
        &format!("/v1/sandboxes/{b}/ports/{daemon_port}/v1/sandboxes"),
        None,
        None,
        &[("X-Access-Token", &token_b)],
    );
    assert_eq!(answer.status, 502, "{}", answer.text());
    daemon.delete_all();
}

/// Requests one after another go over one kept-alive connection inside
/// (the server sees the same client port), and a sandbox paused and
/// resumed in between still answers: a pooled connection its pause broke
/// is replaced, never answered with an error.
#[test]
fn requests_share_a_kept_alive_connection_across_a_pause() {
    let _serial = serial();
    let daemon = start();
    let (id, token) = create(&daemon, json!({}));
    serve(&daemon, &id, &token, 8080);
    let peer = || -> u64 {
        let answer = daemon.call_as(
            None,
            "GET",
            &format!("/v1/sandboxes/{id}/ports/8080/peer"),
            None,
            None,
            &[("X-Access-Token", &token)],
        );
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.json()["peer"].as_u64().unwrap()
    };
    let first = peer();
    assert_eq!(
        peer(),
        first,
        "a second request opened a new connection inside"
    );
    let paused = daemon.call("POST", &format!("/v1/sandboxes/{id}/pause"), None);
    assert!(
        paused.status < 300,
        "{}\n{}",
        paused.text(),
        daemon.log.lock().unwrap()
    );
    let resumed = daemon.call("POST", &format!("/v1/sandboxes/{id}/resume"), None);
    assert!(resumed.status < 300, "{}", resumed.text());
    let after = peer();
    assert_eq!(peer(), after, "{after}");
    daemon.delete_all();
}

#[test]
fn public_ports_answer_without_credentials() {
    let _serial = serial();
    let daemon = start();
    let (id, token) = create(&daemon, json!({"public_ports": true}));
    serve(&daemon, &id, &token, 8080);
    let answer = daemon.call_as(
        None,
        "GET",
        &format!("/v1/sandboxes/{id}/ports/8080/open"),
        None,
        None,
        &[],
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let (status, body) = get_by_host(&daemon, &id, 8080, "/open", "");
    assert_eq!(status, 200, "{body}");
    // Public ports open the ports only, not the sandbox's API.
    let api = daemon.call_as(None, "GET", &format!("/v1/sandboxes/{id}"), None, None, &[]);
    assert_eq!(api.status, 401);
    daemon.delete_all();
}

#[test]
fn a_host_mask_replaces_the_host_requests_go_in_with() {
    let _serial = serial();
    let daemon = start();
    let (id, token) = create(&daemon, json!({"port_host_mask": "localhost:${PORT}"}));
    serve(&daemon, &id, &token, 3000);
    let (status, body) = get_by_host(
        &daemon,
        &id,
        3000,
        "/",
        &format!("X-Access-Token: {token}\r\n"),
    );
    assert_eq!(status, 200, "{body}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["headers"]["host"], "localhost:3000", "{seen}");
    for bad in ["", "a b", "host\r\nx-injected: 1", "é"] {
        let refused = daemon.call(
            "POST",
            "/v1/sandboxes",
            Some(json!({"port_host_mask": bad})),
        );
        assert_eq!(refused.status, 400, "{bad:?}: {}", refused.text());
    }
    daemon.delete_all();
}

/// A WebSocket handshake and one message each way over `stream`.
fn websocket_echo(stream: &mut TcpStream, request_head: &str, message: &str) -> String {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request_head.as_bytes()).unwrap();
    // The answer's head, byte by byte up to its blank line.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    // A masked text frame, as a client sends.
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | message.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(message.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    stream.write_all(&frame).unwrap();
    let mut header = [0u8; 2];
    stream.read_exact(&mut header).unwrap();
    assert_eq!(header[0], 0x81);
    let mut payload = vec![0u8; usize::from(header[1] & 0x7f)];
    stream.read_exact(&mut payload).unwrap();
    // A close, answered.
    stream.write_all(&[0x88, 0x80, 0, 0, 0, 0]).unwrap();
    stream.read_exact(&mut header).unwrap();
    assert_eq!(header[0], 0x88);
    String::from_utf8(payload).unwrap()
}

#[test]
fn a_websocket_inside_echoes_through_the_daemon() {
    let _serial = serial();
    let daemon = start();
    let (id, token) = create(&daemon, json!({}));
    serve(&daemon, &id, &token, 8765);
    let upgrade = WEBSOCKET_UPGRADE;
    let mut by_path = TcpStream::connect(address(&daemon)).unwrap();
    let reply = websocket_echo(
        &mut by_path,
        &format!(
            "GET /v1/sandboxes/{id}/ports/8765/ws HTTP/1.1\r\nHost: x\r\n{upgrade}X-Access-Token: {token}\r\n\r\n"
        ),
        "through the path",
    );
    assert_eq!(reply, "echo: through the path");
    let mut by_host = TcpStream::connect(address(&daemon)).unwrap();
    let reply = websocket_echo(
        &mut by_host,
        &format!("GET /ws HTTP/1.1\r\nHost: 8765-{id}.{DOMAIN}\r\n{upgrade}X-Access-Token: {token}\r\n\r\n"),
        "through the host",
    );
    assert_eq!(reply, "echo: through the host");
    // Several at once, each its own.
    echo_on_sockets(
        &daemon,
        4,
        &format!("GET /ws HTTP/1.1\r\nHost: 8765-{id}.{DOMAIN}\r\n{upgrade}X-Access-Token: {token}\r\n\r\n"),
    );
    daemon.delete_all();
}

/// The headers of a WebSocket handshake.
const WEBSOCKET_UPGRADE: &str = "Upgrade: websocket\r\nConnection: Upgrade\r\n\
     Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";

/// Opens `n` connections to the daemon, each a WebSocket by `request`
/// that echoes `socket I`; returns them, still open.
fn echo_on_sockets(daemon: &TestDaemon, n: usize, request: &str) -> Vec<TcpStream> {
    let mut sockets: Vec<TcpStream> = (0..n)
        .map(|_| TcpStream::connect(address(daemon)).unwrap())
        .collect();
    for (i, socket) in sockets.iter_mut().enumerate() {
        let reply = websocket_echo(socket, request, &format!("socket {i}"));
        assert_eq!(reply, format!("echo: socket {i}"));
    }
    sockets
}

/// A WebSocket keeps counting against the daemon's connection caps for as
/// long as it is open (it is not evicted to make room while its caller
/// was authenticated), and gives its place back when it closes.
#[test]
fn an_open_websocket_counts_as_a_connection_until_it_closes() {
    let _serial = serial();
    let daemon = start();
    let (id, token) = create(&daemon, json!({}));
    serve(&daemon, &id, &token, 8765);
    let upgrade = WEBSOCKET_UPGRADE;
    // The metrics calls are connections of their own, closed by then.
    let before = daemon.metric("airlock_http_connections");
    let sockets = echo_on_sockets(
        &daemon,
        3,
        &format!("GET /v1/sandboxes/{id}/ports/8765/ws HTTP/1.1\r\nHost: x\r\n{upgrade}X-Access-Token: {token}\r\n\r\n"),
    );
    let open = daemon.metric("airlock_http_connections");
    assert!(
        open >= before + 3.0,
        "3 open WebSockets, {open} connections counted (before: {before})"
    );
    drop(sockets);
    assert!(
        TestDaemon::wait_for(Duration::from_secs(10), || {
            daemon.metric("airlock_http_connections") <= before
        }),
        "closed WebSockets still counted: {}",
        daemon.metric("airlock_http_connections")
    );
    daemon.delete_all();
}
