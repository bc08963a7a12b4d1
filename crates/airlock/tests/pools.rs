//! Warm pools through the daemon, on every tier: a pool fills, a create
//! that fits it is handed a ready member with the request's env,
//! metadata, limits, network policy and a token of its own, and the pool
//! refills; members are pristine (never handed out twice, nothing of an
//! earlier tenant in them) and invisible until claimed; a create that does
//! not fit starts its own sandbox; bad settings are refused; a daemon
//! killed with -9 comes back with its pools refilled and nothing of the
//! old members left. Needs root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::*;
use serde_json::{json, Value};
use std::time::Duration;

const TIERS: [&str; 3] = ["process", "oci", "gvisor"];

fn pool(daemon: &TestDaemon, name: &str) -> Value {
    let answer = daemon.call("GET", &format!("/v1/pools/{name}"), None);
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()
}

fn set_pool(daemon: &TestDaemon, name: &str, body: Value) -> Value {
    let answer = daemon.call("PUT", &format!("/v1/pools/{name}"), Some(body));
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()
}

/// Waits until pool `name` has `ready` members ready and none starting.
fn wait_ready(daemon: &TestDaemon, name: &str, ready: u64) -> Value {
    let mut last = Value::Null;
    let filled = TestDaemon::wait_for(Duration::from_secs(90), || {
        last = pool(daemon, name);
        last["ready"] == ready && last["starting"] == 0
    });
    assert!(filled, "pool {name} did not get {ready} ready: {last}");
    last
}

/// The memory limit of sandbox `id`'s cgroup, as the host sees it.
fn memory_limit(id: &str) -> u64 {
    for path in [
        format!("/sys/fs/cgroup/memory/airlock/{id}/memory.limit_in_bytes"),
        format!("/sys/fs/cgroup/airlock/{id}/memory.max"),
    ] {
        if let Ok(text) = std::fs::read_to_string(&path) {
            return text.trim().parse().unwrap();
        }
    }
    panic!("no memory cgroup for {id}");
}

/// Ids of the sandboxes `daemon`'s supervisors run (not its spare
/// supervisors, which hold no cgroup yet).
fn supervised(daemon: &TestDaemon) -> Vec<String> {
    let owner = daemon.instance();
    let mut ids: Vec<String> = supervisors("")
        .into_iter()
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let value = |flag: &str| {
                let at = args.iter().position(|a| a == flag)?;
                args.get(at + 1).cloned()
            };
            (value("--owner")? == owner)
                .then(|| value("--id"))
                .flatten()
        })
        .filter(|id| {
            std::path::Path::new(&format!("/sys/fs/cgroup/memory/airlock/{id}")).exists()
                || std::path::Path::new(&format!("/sys/fs/cgroup/airlock/{id}")).exists()
        })
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

#[test]
fn a_pool_hands_out_ready_members_with_the_requests_settings_on_every_tier() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    for tier in TIERS {
        let name = format!("p-{tier}");
        set_pool(
            &daemon,
            &name,
            json!({"template": "host", "tier": tier, "min_ready": 2, "max": 3}),
        );
        let filled = wait_ready(&daemon, &name, 2);
        assert_eq!(filled["claims"], 0, "{filled}");
        let waiting = supervised(&daemon);
        assert!(waiting.len() >= 2, "{waiting:?}");
        // Members are nobody's: not listed, not found, even by an admin.
        let listed = daemon
            .call("GET", "/v1/sandboxes?state=creating,running", None)
            .json();
        assert_eq!(listed["items"].as_array().unwrap().len(), 0, "{listed}");
        for id in &waiting {
            let found = daemon.call("GET", &format!("/v1/sandboxes/{id}"), None);
            assert_eq!(
                found.status,
                404,
                "{tier}: a member was visible: {}",
                found.text()
            );
        }

        let created = daemon.create(json!({
            "tier": tier,
            "env": {"GREETING": "hello"},
            "metadata": {"who": "first"},
            "limits": {"memory": "300M"},
            "timeout_s": 120,
        }));
        let id = id_of(&created);
        assert!(
            waiting.contains(&id),
            "{tier}: {id} was not one of the ready {waiting:?}"
        );
        assert_eq!(created["metadata"]["who"], "first", "{created}");
        assert_eq!(created["tier"], tier, "{created}");
        assert_eq!(created["state"], "running", "{created}");
        let claimed = pool(&daemon, &name);
        assert_eq!(claimed["claims"], 1, "{claimed}");
        assert_eq!(
            daemon
                .sh_ok(&id, "echo $GREETING; hostname")
                .lines()
                .collect::<Vec<_>>(),
            vec!["hello", id.as_str()],
            "{tier}"
        );
        assert_eq!(memory_limit(&id), 300 << 20, "{tier}");
        // The pool refills behind the claim.
        wait_ready(&daemon, &name, 2);
        // A claimed member's deadline is the request's, not the member's.
        let brief = id_of(&daemon.create(json!({"tier": tier, "timeout_s": 1})));
        assert_eq!(pool(&daemon, &name)["claims"], 2);
        let mut row = Value::Null;
        let expired = TestDaemon::wait_for(Duration::from_secs(15), || {
            row = daemon
                .call("GET", &format!("/v1/sandboxes/{brief}"), None)
                .json();
            row["state"] == "dead"
        });
        assert!(expired, "{tier}: {row}");
        assert_eq!(row["reason"], "timeout", "{row}");
        wait_ready(&daemon, &name, 2);

        // A create that does not fit (another pids limit) starts its own.
        let own = id_of(&daemon.create(json!({"tier": tier, "limits": {"pids": 77}})));
        assert!(!supervised(&daemon).is_empty());
        assert_eq!(pool(&daemon, &name)["claims"], 2);
        let removed = daemon.call("DELETE", &format!("/v1/pools/{name}"), None);
        assert_eq!(removed.status, 204, "{}", removed.text());
        for id in [&id, &own] {
            assert_eq!(
                daemon
                    .call("DELETE", &format!("/v1/sandboxes/{id}"), None)
                    .status,
                204
            );
        }
        // The pool's members went with it.
        assert!(
            TestDaemon::wait_for(Duration::from_secs(30), || supervised(&daemon).is_empty()),
            "{tier}: left running: {:?}",
            supervised(&daemon)
        );
    }
}

#[test]
fn members_are_pristine_and_never_handed_out_twice() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    set_pool(
        &daemon,
        "p",
        json!({"template": "host", "min_ready": 2, "max": 2}),
    );
    wait_ready(&daemon, "p", 2);
    let other = daemon.new_key("other");
    let other_key = other["key"].as_str().unwrap().to_owned();
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..4 {
        let first = id_of(&daemon.create(json!({})));
        assert!(seen.insert(first.clone()), "{first} handed out twice");
        daemon.sh_ok(
            &first,
            "echo secret > /tmp/left; echo secret > /home/user/left; (sleep 300 &) ",
        );
        let theirs = daemon.call_as(
            Some(&other_key),
            "POST",
            "/v1/sandboxes",
            Some(json!({}).to_string().as_bytes()),
            Some("application/json"),
            &[],
        );
        assert_eq!(theirs.status, 201, "{}", theirs.text());
        let second = id_of(&theirs.json());
        assert!(seen.insert(second.clone()), "{second} handed out twice");
        let (out, _) = daemon.sh_out(
            &second,
            "cat /tmp/left /home/user/left 2>&1; ps -eo args | grep -c '[s]leep 300'",
        );
        assert!(!out.contains("secret"), "round {round}: {out}");
        assert_eq!(out.lines().last(), Some("0"), "round {round}: {out}");
        for id in [&first, &second] {
            daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
        }
        wait_ready(&daemon, "p", 2);
    }
    assert_eq!(pool(&daemon, "p")["claims"], 8);
}

#[test]
fn a_networked_pool_serves_creates_with_network_and_applies_their_policy() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    set_pool(
        &daemon,
        "net",
        json!({"template": "host", "networked": true, "min_ready": 1}),
    );
    wait_ready(&daemon, "net", 1);
    // No network: not this pool's.
    let plain = id_of(&daemon.create(json!({})));
    assert_eq!(pool(&daemon, "net")["claims"], 0);
    assert_eq!(pool(&daemon, "net")["misses"], 0);
    let allowed = id_of(&daemon.create(json!({
        "network": {"mode": "allow", "rules": ["example.com:443"]},
    })));
    assert_eq!(pool(&daemon, "net")["claims"], 1);
    let policy = daemon
        .call("GET", &format!("/v1/sandboxes/{allowed}/network"), None)
        .json();
    assert_eq!(policy["mode"], "allow", "{policy}");
    // A connection the policy does not allow is refused.
    let (out, code) = daemon.sh_out(
        &allowed,
        "wget -q -T 3 -O /dev/null http://192.0.2.1/ 2>&1; echo exit=$?",
    );
    assert!(
        out.contains("exit=") && !out.contains("exit=0"),
        "{out} {code}"
    );
    for id in [&plain, &allowed] {
        daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    }
}

#[test]
fn bad_pool_settings_are_refused_and_change_nothing() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    for (name, body, status) in [
        (
            "p",
            json!({"template": "host", "min_ready": 5, "max": 2}),
            400,
        ),
        (
            "p",
            json!({"template": "host", "min_ready": 1, "max": 1000}),
            400,
        ),
        (
            "p",
            json!({"template": "host", "min_ready": 1, "refill": 0}),
            400,
        ),
        ("p", json!({"template": "no-such", "min_ready": 1}), 404),
        (
            "p",
            json!({"template": "host", "tier": "vm", "min_ready": 1}),
            400,
        ),
        (
            "p",
            json!({"template": "host", "min_ready": 1, "extra": 1}),
            400,
        ),
        ("-bad", json!({"template": "host", "min_ready": 1}), 400),
    ] {
        let answer = daemon.call("PUT", &format!("/v1/pools/{name}"), Some(body.clone()));
        assert_eq!(answer.status, status, "{body}: {}", answer.text());
        assert!(answer.json()["code"].is_string(), "{}", answer.text());
    }
    assert_eq!(
        daemon.call("GET", "/v1/pools", None).json()["items"],
        json!([])
    );
    assert_eq!(daemon.call("DELETE", "/v1/pools/none", None).status, 404);
    assert_eq!(daemon.call("GET", "/v1/pools/none", None).status, 404);
    // Only an admin sets or sees pools.
    let other = daemon.new_key("other");
    let key = other["key"].as_str().unwrap();
    let body = json!({"template": "host", "min_ready": 1}).to_string();
    for (method, body) in [
        ("PUT", Some(body.as_bytes())),
        ("GET", None),
        ("DELETE", None),
    ] {
        let answer = daemon.call_as(
            Some(key),
            method,
            "/v1/pools/p",
            body,
            Some("application/json"),
            &[],
        );
        assert_eq!(answer.status, 403, "{method}: {}", answer.text());
    }
    assert_eq!(
        daemon
            .call_as(Some(key), "GET", "/v1/pools", None, None, &[])
            .status,
        403
    );
    assert!(supervised(&daemon).is_empty(), "{:?}", supervised(&daemon));
}

#[test]
fn a_daemon_killed_with_9_comes_back_with_its_pools_refilled_and_no_old_member() {
    let _serial = serial();
    let cleanup = SupervisorCleanup::default();
    let mut daemon = TestDaemon::start(&[]);
    set_pool(&daemon, "p", json!({"template": "host", "min_ready": 2}));
    wait_ready(&daemon, "p", 2);
    let before = supervised(&daemon);
    for id in &before {
        cleanup.add(id);
    }
    daemon.kill9();
    daemon.restart();
    let after = wait_ready(&daemon, "p", 2);
    assert_eq!(after["min_ready"], 2, "{after}");
    let now = supervised(&daemon);
    for id in &now {
        cleanup.add(id);
    }
    for id in &before {
        assert!(!now.contains(id), "{id} of the old daemon still runs");
        assert_sandbox_gone(id);
    }
    // A claim after the restart works as before.
    let id = id_of(&daemon.create(json!({})));
    assert!(now.contains(&id), "{id} was not one of {now:?}");
    assert_eq!(daemon.sh_ok(&id, "echo ok"), "ok\n");
    let metrics = daemon.call("GET", "/metrics", None).text();
    assert!(
        metrics.contains("airlock_pool_claims_total{pool=\"p\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("airlock_leaked_resources 0"), "{metrics}");
}

#[test]
fn a_daemon_stopped_while_members_start_or_go_leaves_none_running() {
    let _serial = serial();
    for tier in ["gvisor", "process"] {
        let cleanup = SupervisorCleanup::default();
        // Members being torn down: a pool of ready ones deleted just
        // before the stop.
        let mut daemon = TestDaemon::start(&[]);
        set_pool(
            &daemon,
            "p",
            json!({"template": "host", "tier": tier, "min_ready": 3, "refill": 3}),
        );
        wait_ready(&daemon, "p", 3);
        for id in supervised(&daemon) {
            cleanup.add(&id);
        }
        assert_eq!(daemon.call("DELETE", "/v1/pools/p", None).status, 204);
        let owner = daemon.instance();
        daemon.stop();
        // Ids of the sandboxes the supervisors tagged `owner` still run
        // (spare supervisors hold none: they end with their daemon), each
        // handed to the cleanup.
        let left = |owner: &str| {
            let ids: Vec<String> = supervisors("")
                .into_iter()
                .filter_map(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).ok())
                .map(|c| String::from_utf8_lossy(&c).into_owned())
                .filter(|text| text.contains(owner))
                .filter_map(|text| {
                    text.split('\0')
                        .find(|a| {
                            a.starts_with("sbx-")
                                && std::path::Path::new(&format!(
                                    "/sys/fs/cgroup/memory/airlock/{a}"
                                ))
                                .exists()
                        })
                        .map(str::to_owned)
                })
                .collect();
            for id in &ids {
                cleanup.add(id);
            }
            ids.len()
        };
        assert_eq!(left(&owner), 0, "{tier}: members left after a stop");
        // Members being started: a pool set just before the stop.
        let mut daemon = TestDaemon::start(&[]);
        set_pool(
            &daemon,
            "p",
            json!({"template": "host", "tier": tier, "min_ready": 3, "refill": 3}),
        );
        TestDaemon::wait_for(Duration::from_secs(10), || {
            pool(&daemon, "p")["starting"].as_u64().unwrap_or(0) > 0
        });
        let owner = daemon.instance();
        daemon.stop();
        assert!(
            TestDaemon::wait_for(Duration::from_secs(5), || left(&owner) == 0),
            "{tier}: members being started were left after a stop"
        );
    }
}
