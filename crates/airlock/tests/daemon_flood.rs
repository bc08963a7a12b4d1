//! What a sandbox can make the daemon write is bounded: a DNS flood of
//! random names (every one refused, every one once an audit event) costs
//! the audit trail a few events in full, one `rate_limited` refusal and
//! one `audit.suppressed` summary per interval, not an event per query.
//! Needs root, nftables and python3.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::TestDaemon;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Three threads sending queries of random names under a denied domain to
/// the sandbox's resolver for `seconds`, as fast as they can, without
/// waiting for answers; prints how many were sent and how many of those
/// the namespace's flood rule dropped (the send fails with `EPERM`).
const FLOOD: &str = r#"
import os, socket, struct, sys, threading, time
seconds = float(sys.argv[1])
sent = [0, 0, 0]
dropped = [0, 0, 0]
def flood(k):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    end = time.time() + seconds
    while time.time() < end:
        label = os.urandom(12).hex().encode()
        q = os.urandom(2) + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + bytes([len(label)]) + label + b"\x04evil\x04test\x00\x00\x01\x00\x01"
        try:
            s.sendto(q, ("127.0.0.1", 53)); sent[k] += 1
        except PermissionError:
            sent[k] += 1; dropped[k] += 1
        except BlockingIOError:
            time.sleep(0.0005)
        try:
            while True: s.recv(512)
        except BlockingIOError:
            pass
threads = [threading.Thread(target=flood, args=(k,)) for k in range(3)]
[t.start() for t in threads]; [t.join() for t in threads]
print(sum(sent), sum(dropped))
"#;

fn security_events(daemon: &TestDaemon, id: &str) -> Vec<Value> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = daemon
            .call(
                "GET",
                &format!("/v1/sandboxes/{id}/events?stream=security&after={after}&limit=1000"),
                None,
            )
            .json();
        events.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_i64() {
            Some(next) => after = next,
            None => break,
        }
    }
    events
}

#[test]
fn a_dns_flood_writes_a_bounded_audit_trail_and_the_daemon_keeps_answering() {
    let daemon = TestDaemon::start(&["--egress-host", "site.test=203.0.113.9"]);
    let created = daemon.create(json!({"network": {"mode": "allow", "rules": ["site.test"]}}));
    let id = created["id"].as_str().unwrap().to_owned();
    let security_log = daemon.data_dir().join("audit/security.jsonl");
    let before = std::fs::metadata(&security_log).map_or(0, |m| m.len());

    let flood_seconds = 6;
    let flooding = {
        let daemon_url = daemon.url.clone();
        let key = daemon.key.clone();
        let id = id.clone();
        std::thread::spawn(move || {
            let body = json!({
                "cmd": "python3",
                "args": ["-c", FLOOD, flood_seconds.to_string()],
            });
            let answer = ureq::post(format!("{daemon_url}/v1/sandboxes/{id}/exec"))
                .header("X-API-Key", &key)
                .content_type("application/json")
                .send(body.to_string())
                .unwrap()
                .into_body()
                .read_to_string()
                .unwrap();
            answer
        })
    };
    // The daemon keeps answering while it floods (timing belongs to
    // bench/flood.py; here it must answer at all, well within a timeout).
    let mut slowest = Duration::ZERO;
    let deadline = Instant::now() + Duration::from_secs(flood_seconds);
    while Instant::now() < deadline {
        let started = Instant::now();
        assert_eq!(daemon.call("GET", "/healthz", None).status, 200);
        slowest = slowest.max(started.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = flooding.join().unwrap();
    let counts: Vec<u64> = output
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["type"] == "stdout")
        .filter_map(|l| l["data"].as_str().map(str::to_owned))
        .collect::<String>()
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    let [sent, dropped] = counts[..] else {
        panic!("the flood printed no counts: {output}")
    };
    assert!(sent > 5_000, "the flood sent only {sent} queries");
    eprintln!(
        "flood: {sent} queries in {flood_seconds} s, {dropped} dropped in the kernel; \
         slowest /healthz {slowest:?}"
    );
    // Past 1,000 a second the namespace's own rule drops them: most of the
    // flood never reaches the egress worker.
    assert!(
        dropped > sent / 2,
        "the kernel dropped {dropped} of {sent} queries"
    );

    // Every interval the flood touched has ended and been summed up.
    std::thread::sleep(Duration::from_secs(11));
    daemon.call("GET", &format!("/v1/sandboxes/{id}"), None);
    let events = security_events(&daemon, &id);
    let kinds = |kind: &str| events.iter().filter(|e| e["kind"] == kind).count();
    let denied_in_full = events
        .iter()
        .filter(|e| e["kind"] == "egress.denied")
        .count();
    assert!(
        denied_in_full <= 100,
        "{denied_in_full} denials written in full for {sent} queries"
    );
    let reasons: std::collections::BTreeSet<String> = events
        .iter()
        .filter(|e| e["kind"] == "egress.limited")
        .filter_map(|e| e["detail"]["reason"].as_str().map(str::to_owned))
        .collect();
    assert!(
        reasons.contains("rate_limited") || reasons.contains("too_many_at_once"),
        "the flood itself is a security event: {reasons:?}"
    );
    let suppressed: u64 = events
        .iter()
        .filter(|e| e["kind"] == "audit.suppressed")
        .map(|e| e["detail"]["suppressed"].as_u64().unwrap())
        .sum();
    assert!(
        suppressed > 0 && kinds("audit.suppressed") <= 10,
        "summaries: {} summing {suppressed}",
        kinds("audit.suppressed")
    );
    let grown = std::fs::metadata(&security_log).unwrap().len() - before;
    assert!(
        grown < 128 << 10,
        "the security stream grew by {grown} bytes for {sent} queries"
    );
    // The metrics count what the trail did not write.
    let metrics = daemon.call("GET", "/metrics", None).text();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("airlock_audit_suppressed_events ") && !l.ends_with(" 0")),
        "{metrics}"
    );
    daemon.delete_all();
}
