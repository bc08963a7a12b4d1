//! Network policies through the native API: the body's `network` maps to
//! the spec's policy, and bad rules are 400s that name the rule before a
//! backend sees anything.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

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

    for network in [
        json!({"mode": "open"}),
        json!({"mode": "allow", "rules": ["pypi.org", "*.pythonhosted.org:443", "10.0.0.0/8"]}),
        json!({"mode": "allow", "rules": []}),
    ] {
        let before = tier.creates.load(Ordering::SeqCst);
        create(json!({ "network": network })).await;
        assert_eq!(tier.creates.load(Ordering::SeqCst), before + 1, "{network}");
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

    // Mode none goes through to the tier as well.
    create(json!({"network": {"mode": "none"}})).await;
    assert_eq!(tier.creates.load(Ordering::SeqCst), valid + 1);
}
