//! The OpenAPI document and the router agree: every operation the document
//! lists is routed (no 404 "no such route", no 405), and every answer to a
//! bad request is a JSON error. The routes and the document are built by
//! the same `utoipa-axum` calls; this test guards that wiring.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use std::sync::Arc;
use tower::ServiceExt;

/// A daemon over a tier that runs nothing: enough to route every request.
fn daemon(dir: &std::path::Path) -> (airlock_daemon::Daemon, String) {
    common::daemon(dir, Arc::new(common::CountingTier::default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_routed() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, key) = daemon(dir.path());
    let router = airlock_api::router(daemon);
    let document = serde_json::to_value(airlock_api::openapi()).unwrap();
    let served: serde_json::Value = {
        let response = router
            .clone()
            .oneshot(
                Request::get("/v1/openapi.json")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap()
    };
    let paths = served["paths"].as_object().unwrap();
    assert!(
        paths.len() >= 15,
        "the served document lists the routes: {}",
        paths.len()
    );
    assert_eq!(document["info"], served["info"]);
    let mut operations = 0;
    for (path, item) in paths {
        for method in ["get", "put", "post", "delete", "patch"] {
            if item.get(method).is_none() {
                continue;
            }
            operations += 1;
            let uri = path
                .replace("{id}", "sbx-0000000000000000")
                .replace("{pid}", "1");
            let request = Request::builder()
                .method(method.to_uppercase().as_str())
                .uri(&uri)
                .header("X-API-Key", &key)
                .header("Content-Type", "application/json")
                .body(Body::from("{}"))
                .unwrap();
            let response = router.clone().oneshot(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            let text = String::from_utf8_lossy(&body);
            assert!(
                !text.contains("no such route"),
                "{method} {path} is documented but not routed"
            );
            assert!(status.as_u16() < 500, "{method} {path}: {status} {text}");
        }
    }
    assert!(operations >= 20, "only {operations} operations documented");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_methods_answer_json() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, key) = daemon(dir.path());
    let router = airlock_api::router(daemon);
    for (method, uri, status, code) in [
        ("GET", "/v2/nothing", StatusCode::NOT_FOUND, "not_found"),
        (
            "PATCH",
            "/v1/sandboxes",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            "PUT",
            "/healthz",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
    ] {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header("X-API-Key", &key)
            .body(Body::empty())
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), status, "{method} {uri}");
        let body: serde_json::Value =
            serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes())
                .unwrap();
        assert_eq!(body["code"], code, "{method} {uri}");
    }
}
