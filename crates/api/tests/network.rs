//! Network policies through the native API: the body's `network` maps to
//! the spec's policy (the test tier records the spec it is given), and bad
//! rules are 400s that name the rule before a backend sees anything.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_policy::NetworkPolicy;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::CountingTier;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tower::ServiceExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_modes_reach_the_backend_and_bad_rules_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let tier = Arc::new(CountingTier::default());
    let (daemon, key) = common::daemon(dir.path(), tier.clone());
    let router = airlock_api::router(daemon);
    let create = |body: Value| {
        let router = router.clone();
        let key = key.clone();
        async move {
            let request = Request::post("/v1/sandboxes")
                .header("X-API-Key", &key)
                .header("Content-Type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap();
            let response = router.oneshot(request).await.unwrap();
            let status = response.status();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<Value>(&bytes).unwrap())
        }
    };

    // Each policy reaches the tier as it was asked for: mode and rules in
    // the spec, in order (a create that dropped or widened them fails).
    for (network, mode, rules) in [
        (json!({"mode": "open"}), "open", vec![]),
        (
            json!({"mode": "allow", "rules": ["pypi.org", "*.pythonhosted.org:443", "10.0.0.0/8"]}),
            "allow",
            vec!["pypi.org", "*.pythonhosted.org:443", "10.0.0.0/8"],
        ),
        (json!({"mode": "allow", "rules": []}), "allow", vec![]),
    ] {
        let before = tier.creates.load(Ordering::SeqCst);
        create(json!({ "network": network })).await;
        assert_eq!(tier.creates.load(Ordering::SeqCst), before + 1, "{network}");
        let spec = tier.last_spec().unwrap();
        assert_eq!(spec.network.mode(), mode, "{network}");
        assert_eq!(spec.network.rule_count(), rules.len(), "{network}");
        let given = serde_json::to_value(&spec.network).unwrap();
        assert_eq!(given["mode"], mode, "{network}: {given}");
        if mode == "allow" {
            assert_eq!(given["rules"], json!(rules), "{network}: {given}");
        }
        assert_eq!(
            spec.network,
            serde_json::from_value::<NetworkPolicy>(network.clone()).unwrap(),
            "{network}"
        );
    }
    let valid = tier.creates.load(Ordering::SeqCst);
    for (network, needle) in [
        (
            json!({"mode": "allow", "rules": ["pypi.org:0"]}),
            "\"pypi.org:0\"",
        ),
        (json!({"mode": "allow", "rules": ["127.1"]}), "\"127.1\""),
        (json!({"mode": "allow"}), "needs a list of rules"),
        (json!({"mode": "none", "rules": ["pypi.org"]}), "only mode"),
        (json!({"mode": "wide"}), "network.mode"),
    ] {
        let (status, body) = create(json!({ "network": network })).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{network}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains(needle),
            "{network}: {body}"
        );
    }
    assert_eq!(tier.creates.load(Ordering::SeqCst), valid);

    // Mode none goes through to the tier as well, and so does the default
    // (no `network`: none), after a create that asked for more.
    for body in [
        json!({"network": {"mode": "open"}}),
        json!({"network": {"mode": "none"}}),
        json!({}),
    ] {
        create(body.clone()).await;
        let expected = if body["network"]["mode"] == "open" {
            NetworkPolicy::Open
        } else {
            NetworkPolicy::None
        };
        assert_eq!(tier.last_spec().unwrap().network, expected, "{body}");
    }
    assert_eq!(tier.creates.load(Ordering::SeqCst), valid + 3);
}
