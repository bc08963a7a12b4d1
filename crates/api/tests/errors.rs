//! Answers that depend on who asks and on what the daemon can do: metrics
//! for admin keys only, keys of either shape, bodies that cannot be read,
//! and a state database that is unavailable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use airlock_daemon::{Config, Daemon};
use airlock_store::Store;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::CountingTier;
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use tower::ServiceExt;

/// Status, Retry-After and JSON body of `request` on `router`.
async fn send(
    router: &axum::Router,
    request: Request<Body>,
) -> (StatusCode, Option<String>, Value) {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, retry_after, body)
}

fn get(path: &str, key: &str) -> Request<Body> {
    Request::get(path)
        .header("X-API-Key", key)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_for_admin_keys_only() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, admin) = common::daemon(dir.path(), Arc::new(CountingTier::default()));
    let (_, tenant) = daemon
        .with_store(|s| s.create_key("tenant", false))
        .unwrap();
    let router = airlock_api::router(daemon);

    let response = router
        .clone()
        .oneshot(get("/metrics", &admin))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (status, _, body) = send(&router, get("/metrics", &tenant)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["code"], "forbidden");
    // The tenant's key is good for its own calls.
    let (status, _, _) = send(&router, get("/v1/sandboxes", &tenant)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_keys_are_e2b_shaped_and_work_as_bearer_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, admin) = common::daemon(dir.path(), Arc::new(CountingTier::default()));
    // The shape e2b SDKs 2.25.0–2.45.1 insist on before sending a key.
    let hex = admin.strip_prefix("e2b_").expect("an e2b_ key");
    assert!(!hex.is_empty() && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    let router = airlock_api::router(daemon);
    let bearer = |secret: &str| {
        Request::get("/v1/sandboxes")
            .header("Authorization", format!("Bearer {secret}"))
            .body(Body::empty())
            .unwrap()
    };
    let (status, _, body) = send(&router, bearer(&admin)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, _) = send(&router, bearer(&format!("e2b_{}", "0".repeat(64)))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_cannot_be_read_is_400_and_one_too_long_413() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, key) = common::daemon(dir.path(), Arc::new(CountingTier::default()));
    let router = airlock_api::router(daemon);
    let post = |body: Body| {
        Request::post("/v1/sandboxes")
            .header("X-API-Key", &key)
            .header("Content-Type", "application/json")
            .body(body)
            .unwrap()
    };
    // What hyper hands on for a body that breaks its framing (a bad chunk,
    // or a plain body sent with both Content-Length and
    // Transfer-Encoding: chunked, which hyper reads as chunked).
    let broken = Body::from_stream(futures_util::stream::iter([
        Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"{\"limits\":")),
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "invalid chunk size line",
        )),
    ]));
    let (status, _, body) = send(&router, post(broken)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["code"], "bad_request");

    let (status, _, body) = send(&router, post(Body::from(vec![b' '; (1 << 20) + 1]))).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["code"], "payload_too_large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_store_answers_503_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("airlock.db");
    let store = Store::open(&path).unwrap();
    let (_, key) = store.create_key("admin", true).unwrap();
    let daemon = Daemon::new(
        Config::new(dir.path().to_owned()),
        Arc::new(Mutex::new(store)),
        Arc::new(CountingTier::default()),
    )
    .unwrap();
    let router = airlock_api::router(daemon);

    // Another writer holds the database past the busy timeout.
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let create = Request::post("/v1/sandboxes")
        .header("X-API-Key", &key)
        .header("Content-Type", "application/json")
        .body(Body::from("{}"))
        .unwrap();
    let (status, retry_after, body) = send(&router, create).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "unavailable");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(
        !body["message"].as_str().unwrap().contains("sqlite"),
        "no internal detail: {body}"
    );
    other.execute_batch("ROLLBACK").unwrap();
}
