//! Outputs that survive their sandbox, on every tier: a sandbox created
//! with `collect_outputs` has its `/mnt/user-data/outputs` copied to the
//! daemon's object store (a local directory here) when its timeout kills
//! it, each file with its size and digest in the audit trail; symlinks and
//! special files are skipped, never followed; a collection on request
//! copies the same; past the byte bound a file is left out and counted.
//! Needs root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::*;
use common::images::sha256;
use serde_json::{json, Value};
use std::time::Duration;

const TIERS: [&str; 3] = ["process", "oci", "gvisor"];

const WRITE: &str = "cd /mnt/user-data/outputs && echo hello > report.txt && \
    mkdir -p nested/deep && head -c 100000 /dev/urandom > nested/deep/data.bin && \
    ln -s /etc/passwd passwd-link && mkfifo a-fifo";

fn events(daemon: &TestDaemon, id: &str) -> Vec<Value> {
    daemon
        .call(
            "GET",
            &format!("/v1/sandboxes/{id}/events?limit=1000"),
            None,
        )
        .json()["items"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn outputs_of_a_timed_out_sandbox_reach_the_store_on_every_tier() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    let store = daemon.data_dir().join("outputs");
    for tier in TIERS {
        let id = id_of(&daemon.create(json!({
            "tier": tier, "collect_outputs": true, "timeout_s": 4,
        })));
        daemon.sh_ok(&id, WRITE);
        let random = daemon.sh_ok(
            &id,
            "od -An -tx1 -v /mnt/user-data/outputs/nested/deep/data.bin | tr -d ' \\n'",
        );
        let mut row = Value::Null;
        let ended = TestDaemon::wait_for(Duration::from_secs(30), || {
            row = daemon
                .call("GET", &format!("/v1/sandboxes/{id}"), None)
                .json();
            row["state"] == "dead"
        });
        assert!(ended, "{tier}: {row}");
        assert_eq!(row["reason"], "timeout", "{row}");
        let dir = store.join(&id);
        assert_eq!(
            std::fs::read_to_string(dir.join("report.txt")).unwrap(),
            "hello\n",
            "{tier}"
        );
        let data = std::fs::read(dir.join("nested/deep/data.bin")).unwrap();
        assert_eq!(data.len(), 100_000, "{tier}");
        let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, random.trim(), "{tier}");
        assert!(
            !dir.join("passwd-link").exists(),
            "{tier}: a symlink was followed"
        );
        assert!(!dir.join("a-fifo").exists(), "{tier}");
        let all = events(&daemon, &id);
        let collected = all
            .iter()
            .find(|e| e["kind"] == "outputs.collected")
            .unwrap_or_else(|| panic!("{tier}: no outputs.collected in {all:?}"));
        let detail = &collected["detail"];
        assert_eq!(detail["why"], "timeout", "{detail}");
        assert_eq!(detail["count"], 2, "{detail}");
        assert_eq!(detail["left_out"], 2, "{detail}");
        assert_eq!(detail["bytes"], 100_006, "{detail}");
        let report = detail["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "report.txt")
            .unwrap();
        assert_eq!(report["sha256"], sha256(b"hello\n"), "{detail}");
    }
}

#[test]
fn outputs_are_collected_on_request_within_their_bound_and_kept_for_their_ttl() {
    let _serial = serial();
    let daemon = TestDaemon::start(&["--outputs-max-bytes", "1K", "--outputs-ttl", "3s"]);
    let id = id_of(&daemon.create(json!({})));
    daemon.sh_ok(
        &id,
        "cd /mnt/user-data/outputs && echo small > a.txt && head -c 2048 /dev/zero > big.bin",
    );
    let answer = daemon.call("POST", &format!("/v1/sandboxes/{id}/outputs"), None);
    assert_eq!(answer.status, 200, "{}", answer.text());
    let view = answer.json();
    assert_eq!(view["bytes"], 6, "{view}");
    assert_eq!(view["left_out"], 1, "{view}");
    assert_eq!(view["files"][0]["path"], "a.txt", "{view}");
    let dir = daemon.data_dir().join("outputs").join(&id);
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "small\n"
    );
    assert!(!dir.join("big.bin").exists());
    // Without collect_outputs, a delete copies nothing more.
    daemon.sh_ok(&id, "echo later > /mnt/user-data/outputs/b.txt");
    assert_eq!(
        daemon
            .call("DELETE", &format!("/v1/sandboxes/{id}"), None)
            .status,
        204
    );
    assert!(!dir.join("b.txt").exists());
    // Unknown and another key's sandboxes are 404; a dead one 409.
    let gone = daemon.call("POST", &format!("/v1/sandboxes/{id}/outputs"), None);
    assert_eq!(gone.status, 409, "{}", gone.text());
    let unknown = daemon.call("POST", "/v1/sandboxes/sbx-0000000000000000/outputs", None);
    assert_eq!(unknown.status, 404, "{}", unknown.text());
    // Kept for their TTL: a collection now leaves them, one after it
    // deletes them.
    let gc = daemon.call("POST", "/v1/gc", None);
    assert_eq!(gc.status, 200, "{}", gc.text());
    assert_eq!(gc.json()["outputs"], 0, "{}", gc.text());
    assert!(dir.join("a.txt").exists());
    std::thread::sleep(Duration::from_millis(3500));
    let gc = daemon.call("POST", "/v1/gc", None);
    assert_eq!(gc.json()["outputs"], 1, "{}", gc.text());
    assert!(!dir.join("a.txt").exists(), "kept past its TTL");
}
