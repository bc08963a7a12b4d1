//! Network policies through the native API: the body's `network` maps to
//! the spec's policy, and bad rules are 400s that name the rule before a
//! backend sees anything.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_backend::{
    AdoptError, Backend, CreateError, DestroyError, Instance, Reconciled, Resources, Unavailable,
    Usage,
};
use airlock_daemon::{Config, Daemon};
use airlock_policy::{SandboxSpec, Tier};
use airlock_store::Store;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tower::ServiceExt;

/// A tier that counts the creates that reach it and runs nothing.
#[derive(Default)]
struct CountingTier {
    creates: AtomicUsize,
    ids: AtomicUsize,
}

#[async_trait::async_trait]
impl Backend for CountingTier {
    fn tier(&self) -> Tier {
        Tier::Process
    }
    fn probe(&self) -> Result<(), Unavailable> {
        Ok(())
    }
    fn reserve_id(&self, _: &SandboxSpec) -> String {
        format!("sbx-{:016x}", self.ids.fetch_add(1, Ordering::SeqCst))
    }
    fn unreserve(&self, _: &str) {}
    async fn create(&self, _: &str, _: &SandboxSpec) -> Result<Instance, CreateError> {
        self.creates.fetch_add(1, Ordering::SeqCst);
        Err(CreateError::BadInput("this test tier runs nothing".into()))
    }
    async fn adopt(&self, _: &str, _: &Resources) -> Result<Instance, AdoptError> {
        Err(AdoptError::Gone)
    }
    async fn destroy(&self, _: &str, _: Option<&Resources>) -> Result<(), DestroyError> {
        Ok(())
    }
    fn usage(&self, _: &str) -> Option<Usage> {
        None
    }
    async fn reconcile(&self, _: &HashSet<String>) -> Reconciled {
        Reconciled::default()
    }
    fn leaked(&self, _: &HashSet<String>) -> usize {
        0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_modes_reach_the_backend_and_bad_rules_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_in_memory().unwrap();
    let (_, key) = store.create_key("admin", true).unwrap();
    let tier = Arc::new(CountingTier::default());
    let daemon = Daemon::new(
        Config::new(dir.path().to_owned()),
        Arc::new(Mutex::new(store)),
        tier.clone(),
    )
    .unwrap();
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
