//! Admission control of `airlock serve` under load: 200 clients create at
//! once against small caps. Every answer is `201` or a well-formed `429`,
//! live sandboxes never outnumber the cap, the metrics agree with what the
//! clients saw, and nothing is left once they are deleted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{assert_sandbox_gone, TestDaemon};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Barrier;
use std::time::{Duration, Instant};

const CLIENTS: usize = 200;
const MAX_LIVE: usize = 50;

/// What one client got.
#[derive(Debug)]
struct Reply {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}), status {}: {}", self.status, self.body))
    }
}

/// One create on a connection of its own (a fresh agent per client).
fn create_alone(url: &str, key: &str) -> Reply {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .no_delay(true)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(60)))
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let mut response = agent
        .post(format!("{url}/v1/sandboxes"))
        .header("X-API-Key", key)
        .content_type("application/json")
        .send(r#"{"limits": {"memory": "64M", "disk": "16M"}}"#)
        .unwrap_or_else(|e| panic!("POST /v1/sandboxes: {e}"));
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Reply {
        status: response.status().as_u16(),
        retry_after,
        body: response.body_mut().read_to_string().unwrap_or_default(),
    }
}

/// `count` clients create at the same instant, each on its own thread and
/// connection.
fn burst(daemon: &TestDaemon, count: usize) -> Vec<Reply> {
    let barrier = Barrier::new(count);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..count)
            .map(|_| {
                let barrier = &barrier;
                std::thread::Builder::new()
                    .stack_size(256 << 10)
                    .spawn_scoped(scope, move || {
                        barrier.wait();
                        create_alone(&daemon.url, &daemon.key)
                    })
                    .unwrap()
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Checks that every reply is a 201 or a well-formed 429 and returns the
/// ids created and the number refused.
fn tally(replies: &[Reply]) -> (Vec<String>, usize) {
    let mut created = Vec::new();
    let mut refused = 0;
    for reply in replies {
        match reply.status {
            201 => {
                let view = reply.json();
                assert_eq!(view["state"], "running", "{view}");
                assert!(view["access_token"].is_string(), "{view}");
                created.push(view["id"].as_str().unwrap().to_owned());
            }
            429 => {
                refused += 1;
                assert_eq!(reply.json()["code"], "too_many_requests", "{}", reply.body);
                let secs: u64 = reply
                    .retry_after
                    .as_deref()
                    .unwrap_or_else(|| panic!("a 429 without Retry-After: {}", reply.body))
                    .parse()
                    .expect("Retry-After in whole seconds");
                assert!(secs >= 1, "Retry-After {secs}");
            }
            other => panic!("a create answered {other}: {}", reply.body),
        }
    }
    (created, refused)
}

/// The value of the metric line that starts with `name ` (exactly).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
}

fn running_ids(daemon: &TestDaemon) -> BTreeSet<String> {
    let answer = daemon.call("GET", "/v1/sandboxes?state=running&limit=1000", None);
    assert_eq!(answer.status, 200, "list: {}", answer.text());
    let page = answer.json();
    assert!(page["next_cursor"].is_null(), "more than one page: {page}");
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn two_hundred_concurrent_creates_meet_the_caps_and_leave_nothing_behind() {
    let started = Instant::now();
    let daemon = TestDaemon::start(&[
        "--max-live",
        &MAX_LIVE.to_string(),
        "--max-live-per-key",
        &MAX_LIVE.to_string(),
        "--max-concurrent-creates",
        "4",
        "--max-queue",
        "16",
    ]);

    // The burst: 4 creating and 16 queued at most, the rest refused.
    let replies = burst(&daemon, CLIENTS);
    let (mut created, mut refused) = tally(&replies);
    eprintln!(
        "burst of {CLIENTS}: {} created, {refused} refused in {:?}",
        created.len(),
        started.elapsed()
    );
    assert!(!created.is_empty(), "no create got through the burst");
    assert!(
        refused > 0,
        "200 at once and none refused: the queue is not bounded"
    );
    assert!(
        created.len() <= MAX_LIVE,
        "{} live over the cap",
        created.len()
    );
    let running = running_ids(&daemon);
    assert_eq!(
        running,
        created.iter().cloned().collect::<BTreeSet<_>>(),
        "the running sandboxes are not the ones created"
    );

    // A second burst on top: the live cap holds across bursts.
    let replies = burst(&daemon, CLIENTS);
    let (more, more_refused) = tally(&replies);
    created.extend(more);
    refused += more_refused;
    assert!(
        created.len() <= MAX_LIVE,
        "{} live over the cap",
        created.len()
    );

    // Fill up one at a time (never queued), then the cap itself refuses.
    let at_cap = loop {
        let reply = create_alone(&daemon.url, &daemon.key);
        let (one, no) = tally(std::slice::from_ref(&reply));
        created.extend(one);
        refused += no;
        assert!(
            created.len() <= MAX_LIVE,
            "{} live over the cap",
            created.len()
        );
        if no == 1 {
            break reply;
        }
    };
    assert_eq!(
        created.len(),
        MAX_LIVE,
        "refused below the cap: {}",
        at_cap.body
    );
    assert_eq!(
        at_cap.retry_after.as_deref(),
        Some("5"),
        "the live cap's Retry-After"
    );
    let running = running_ids(&daemon);
    assert_eq!(
        running,
        created.iter().cloned().collect::<BTreeSet<_>>(),
        "the running sandboxes are not the ones created"
    );

    let metrics = daemon.call("GET", "/metrics", None).text();
    assert_eq!(
        metric(&metrics, "airlock_admission_rejected_total"),
        refused as f64,
        "rejections counted by the daemon vs. 429s seen"
    );
    assert_eq!(metric(&metrics, "airlock_leaked_resources"), 0.0);
    assert_eq!(
        metric(&metrics, "airlock_sandboxes{state=\"running\"}"),
        MAX_LIVE as f64
    );
    assert_eq!(metric(&metrics, "airlock_admission_queue_depth"), 0.0);

    // Delete them all, concurrently.
    std::thread::scope(|scope| {
        for chunk in created.chunks(MAX_LIVE / 5) {
            let daemon = &daemon;
            scope.spawn(move || {
                for id in chunk {
                    let answer = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
                    assert_eq!(answer.status, 204, "delete {id}: {}", answer.text());
                }
            });
        }
    });
    for id in &created {
        assert_sandbox_gone(id);
    }
    assert!(running_ids(&daemon).is_empty(), "running after the deletes");
    let metrics = daemon.call("GET", "/metrics", None).text();
    assert_eq!(metric(&metrics, "airlock_leaked_resources"), 0.0);
    assert_eq!(
        metric(&metrics, "airlock_sandboxes{state=\"running\"}"),
        0.0
    );
    // Slots are free again.
    let reply = create_alone(&daemon.url, &daemon.key);
    assert_eq!(
        reply.status, 201,
        "create after the deletes: {}",
        reply.body
    );
    let id = reply.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        daemon
            .call("DELETE", &format!("/v1/sandboxes/{id}"), None)
            .status,
        204
    );
    assert_sandbox_gone(&id);
    eprintln!("load test done in {:?}", started.elapsed());
}
