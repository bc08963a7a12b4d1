//! The e2b control plane against a real daemon, with the requests shaped
//! exactly as the e2b SDKs send them (Python 2.0 and 2.63, JS 2.51):
//! create, get, list with filters and pages, connect, resume, timeout,
//! pause, metrics, kill, and the error answers the SDKs map to exceptions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{e2b, Answer, TestDaemon};
use serde_json::{json, Value};

/// The e2b error shape: `{"code": <status>, "message": "..."}`.
fn assert_error(answer: &Answer, status: u16) -> String {
    assert_eq!(answer.status, status, "{}", answer.text());
    let body = answer.json();
    assert_eq!(body["code"], status, "{body}");
    body["message"].as_str().unwrap().to_owned()
}

/// Creates through the v2 route as Python 2.63 does; the `Sandbox` answer.
fn create(daemon: &TestDaemon, metadata: Value) -> Value {
    let answer = e2b(
        daemon,
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "base", "metadata": metadata, "envVars": {}, "timeout": 300})),
    );
    assert_eq!(answer.status, 201, "{}", answer.text());
    answer.json()
}

fn sid(sandbox: &Value) -> String {
    sandbox["sandboxID"].as_str().unwrap().to_owned()
}

/// A GET that also returns the `x-next-token` header.
fn get_page(daemon: &TestDaemon, path: &str) -> (u16, Option<String>, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .build()
        .into();
    let mut response = agent
        .get(format!("{}{path}", daemon.url))
        .header("X-API-KEY", &daemon.key)
        .call()
        .unwrap();
    let token = response
        .headers()
        .get("x-next-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: Value = serde_json::from_slice(&response.body_mut().read_to_vec().unwrap()).unwrap();
    (response.status().as_u16(), token, body)
}

fn ids_of(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|s| s["sandboxID"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_sdk_lifecycle_works_end_to_end() {
    let daemon = TestDaemon::start(&[]);
    // Python 2.63 / JS 2.51: POST /v2/sandboxes, only the fields set.
    let answer = e2b(
        &daemon,
        "POST",
        "/v2/sandboxes",
        Some(json!({
            "templateID": "base",
            "metadata": {"owner": "sdk"},
            "envVars": {"GREETING": "hello"},
            "timeout": 120
        })),
    );
    assert_eq!(answer.status, 201, "{}", answer.text());
    let created = answer.json();
    let id = sid(&created);
    assert!(id.starts_with("sbx-"));
    assert_eq!(created["templateID"], "base");
    assert_eq!(created["clientID"], "airlock");
    assert_eq!(created["alias"], "base");
    assert_eq!(created["envdVersion"], "0.6.4");
    assert!(created.get("domain").is_some() && created["domain"].is_null());
    let token = created["envdAccessToken"].as_str().unwrap().to_owned();
    assert!(token.starts_with("at_"));

    // The token opens the sandbox, and envVars reached its processes.
    let exec = daemon.call_as(
        None,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(br#"{"cmd":"/bin/sh","args":["-c","echo $GREETING"]}"#),
        Some("application/json"),
        &[("X-Access-Token", &token)],
    );
    assert_eq!(exec.status, 200, "{}", exec.text());
    assert!(exec.text().contains("hello\\n"), "{}", exec.text());

    // get_info: SandboxDetail, with the same token (connect of SDK 2.0 reads it here).
    let got = e2b(&daemon, "GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(got.status, 200, "{}", got.text());
    let detail = got.json();
    assert_eq!(detail["sandboxID"], id.as_str());
    assert_eq!(detail["state"], "running");
    assert_eq!(detail["envdAccessToken"], token.as_str());
    assert_eq!(detail["metadata"]["owner"], "sdk");
    assert_eq!(detail["cpuCount"], 1);
    assert_eq!(detail["memoryMB"], 512);
    assert_eq!(
        detail["diskSizeMB"], 1024,
        "the writable layer: on disk, the default 1G quota"
    );
    assert_eq!(detail["envdVersion"], "0.6.4");
    let started = detail["startedAt"].as_str().unwrap().to_owned();
    let end_at = detail["endAt"].as_str().unwrap().to_owned();
    assert!(
        started.ends_with('Z') && end_at > started,
        "{started} {end_at}"
    );

    // set_timeout: 204, the expiry moves (either way).
    let answer = e2b(
        &daemon,
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        Some(json!({"timeout": 600})),
    );
    assert_eq!(answer.status, 204, "{}", answer.text());
    let end_600 = e2b(&daemon, "GET", &format!("/sandboxes/{id}"), None).json()["endAt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(end_600 > end_at);

    // connect (v2, as 2.63 sends it): 200; a shorter timeout leaves the
    // expiry, a longer one extends it.
    let answer = e2b(
        &daemon,
        "POST",
        &format!("/v2/sandboxes/{id}/connect"),
        Some(json!({"timeout": 10})),
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let connected = answer.json();
    assert_eq!(connected["sandboxID"], id.as_str());
    assert_eq!(connected["envdAccessToken"], token.as_str());
    assert_eq!(connected["envdVersion"], "0.6.4");
    let after = e2b(&daemon, "GET", &format!("/sandboxes/{id}"), None).json();
    assert_eq!(after["endAt"], end_600.as_str(), "TTL is only extended");
    let answer = e2b(
        &daemon,
        "POST",
        &format!("/sandboxes/{id}/connect"),
        Some(json!({"timeout": 3600})),
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let after = e2b(&daemon, "GET", &format!("/sandboxes/{id}"), None).json();
    assert!(after["endAt"].as_str().unwrap() > end_600.as_str());
    // JS connect without a timeout (the field is left out): 200, no change.
    let answer = e2b(
        &daemon,
        "POST",
        &format!("/v2/sandboxes/{id}/connect"),
        Some(json!({})),
    );
    assert_eq!(answer.status, 200, "{}", answer.text());

    // resume (SDK 2.0): a running sandbox resumes as a connect, 201.
    let answer = e2b(
        &daemon,
        "POST",
        &format!("/sandboxes/{id}/resume"),
        Some(json!({"timeout": 300})),
    );
    assert_eq!(answer.status, 201, "{}", answer.text());
    assert_eq!(answer.json()["envdAccessToken"], token.as_str());

    // pause: 204, then 409 (the SDKs' "already paused"); connect resumes
    // it, answering 201, then 200 once it runs.
    let paused = e2b(
        &daemon,
        "POST",
        &format!("/sandboxes/{id}/pause"),
        Some(json!({"memory": true})),
    );
    assert_eq!(paused.status, 204, "{}", paused.text());
    assert_eq!(
        e2b(&daemon, "GET", &format!("/sandboxes/{id}"), None).json()["state"],
        "paused"
    );
    assert_error(
        &e2b(&daemon, "POST", &format!("/sandboxes/{id}/pause"), None),
        409,
    );
    let message = assert_error(
        &e2b(
            &daemon,
            "POST",
            &format!("/sandboxes/{id}/pause"),
            Some(json!({"memory": false})),
        ),
        409,
    );
    assert!(message.contains("already paused"), "{message}");
    let resumed = e2b(
        &daemon,
        "POST",
        &format!("/sandboxes/{id}/connect"),
        Some(json!({"timeout": 60})),
    );
    assert_eq!(resumed.status, 201, "{}", resumed.text());
    assert_eq!(
        e2b(&daemon, "GET", &format!("/sandboxes/{id}"), None).json()["state"],
        "running"
    );
    // Its template (the host's system) is no stack of layers, so its files
    // cannot be kept apart from its memory: 501, and it keeps running
    // (tests/snapshots.rs pauses layered ones keeping only their files).
    let message = assert_error(
        &e2b(
            &daemon,
            "POST",
            &format!("/sandboxes/{id}/pause"),
            Some(json!({"memory": false})),
        ),
        501,
    );
    assert!(message.contains("pause keeping its memory"), "{message}");
    assert_eq!(
        e2b(&daemon, "GET", &format!("/sandboxes/{id}"), None).json()["state"],
        "running"
    );

    // metrics: one sample now, every field the SDK reads.
    daemon.sh(&id, "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done");
    let answer = e2b(&daemon, "GET", &format!("/sandboxes/{id}/metrics"), None);
    assert_eq!(answer.status, 200, "{}", answer.text());
    let samples = answer.json();
    let sample = &samples[0];
    for field in [
        "timestamp",
        "timestampUnix",
        "cpuCount",
        "cpuUsedPct",
        "memUsed",
        "memTotal",
        "memCache",
        "diskUsed",
        "diskTotal",
    ] {
        assert!(sample.get(field).is_some(), "{field}: {sample}");
    }
    assert_eq!(sample["memTotal"], 512u64 << 20);
    assert!(sample["memUsed"].as_u64().unwrap() > 0, "{sample}");
    let batch = e2b(
        &daemon,
        "GET",
        &format!("/sandboxes/metrics?sandbox_ids={id},sbx-0000000000000000"),
        None,
    );
    assert_eq!(batch.status, 200, "{}", batch.text());
    let batch = batch.json();
    assert!(batch["sandboxes"][id.as_str()]["cpuCount"].is_number());
    assert_eq!(batch["sandboxes"].as_object().unwrap().len(), 1);

    // kill: 204, then the sandbox is gone everywhere (kill again → 404,
    // which the SDK's kill() turns into `false`).
    let answer = e2b(&daemon, "DELETE", &format!("/sandboxes/{id}"), None);
    assert_eq!(answer.status, 204, "{}", answer.text());
    assert_error(
        &e2b(&daemon, "DELETE", &format!("/sandboxes/{id}"), None),
        404,
    );
    assert_error(&e2b(&daemon, "GET", &format!("/sandboxes/{id}"), None), 404);
    assert_error(
        &e2b(
            &daemon,
            "POST",
            &format!("/v2/sandboxes/{id}/connect"),
            Some(json!({"timeout": 60})),
        ),
        404,
    );
    assert_error(
        &e2b(
            &daemon,
            "POST",
            &format!("/sandboxes/{id}/resume"),
            Some(json!({"timeout": 60})),
        ),
        404,
    );
    assert_error(
        &e2b(
            &daemon,
            "POST",
            &format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 60})),
        ),
        404,
    );
    assert_error(
        &e2b(&daemon, "GET", &format!("/sandboxes/{id}/metrics"), None),
        404,
    );
    assert_error(
        &e2b(&daemon, "POST", &format!("/sandboxes/{id}/pause"), None),
        404,
    );

    // SDK 2.0: POST /sandboxes with its defaults, allow_internet_access
    // true among them, is accepted (the sandbox still has no network).
    let answer = e2b(
        &daemon,
        "POST",
        "/sandboxes",
        Some(json!({
            "templateID": "base", "autoPause": false, "metadata": {},
            "timeout": 300, "envVars": {}, "secure": true,
            "allow_internet_access": true
        })),
    );
    assert_eq!(answer.status, 201, "{}", answer.text());
    let legacy = answer.json();
    assert!(legacy["envdAccessToken"]
        .as_str()
        .unwrap()
        .starts_with("at_"));
    // The code interpreter's template is the host template too.
    let answer = e2b(
        &daemon,
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "code-interpreter-v1"})),
    );
    assert_eq!(answer.status, 201, "{}", answer.text());
    assert_eq!(answer.json()["templateID"], "code-interpreter-v1");
}

#[test]
fn errors_come_in_the_shape_the_sdks_parse() {
    let daemon = TestDaemon::start(&[]);
    // No key, a wrong key, a sandbox token instead of a key: 401.
    let none = daemon.call_as(None, "GET", "/v2/sandboxes", None, None, &[]);
    assert!(assert_error(&none, 401).contains("API key"));
    let wrong = daemon.call_as(
        Some("al_0000000000000000000000000000000000000000000000000000000000000000"),
        "POST",
        "/v2/sandboxes",
        Some(br#"{"templateID":"base"}"#),
        Some("application/json"),
        &[],
    );
    assert_error(&wrong, 401);
    let created = create(&daemon, json!({}));
    let id = sid(&created);
    let token = created["envdAccessToken"].as_str().unwrap();
    let as_token = daemon.call_as(
        None,
        "GET",
        &format!("/sandboxes/{id}"),
        None,
        None,
        &[("X-Access-Token", token)],
    );
    assert_error(&as_token, 401);

    // Unknown template: 404 on the v2 route, 400 on the first one.
    let message = assert_error(
        &e2b(
            &daemon,
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "no-such-template"})),
        ),
        404,
    );
    assert!(message.contains("no-such-template"), "{message}");
    assert_error(
        &e2b(
            &daemon,
            "POST",
            "/sandboxes",
            Some(json!({"templateID": "no-such-template"})),
        ),
        400,
    );
    // A partial deny list: where the daemon denies by default it takes
    // nothing away (the sandbox gets allowOut, here nothing); where it
    // serves the open internet, it is mode deny, allowOut winning over it.
    let answer = e2b(
        &daemon,
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "base", "network": {"denyOut": ["8.8.8.8/32"]}})),
    );
    assert_eq!(answer.status, 201, "{}", answer.text());
    let partial = answer.json()["sandboxID"].as_str().unwrap().to_owned();
    let native = daemon.call("GET", &format!("/v1/sandboxes/{partial}/network"), None);
    assert_eq!(native.json(), json!({"mode": "none"}), "{}", native.text());
    let open = TestDaemon::start(&["--e2b-internet", "open"]);
    let answer = e2b(
        &open,
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "base",
                    "network": {"denyOut": ["8.8.8.8/32"], "allowOut": ["8.8.8.8"]}})),
    );
    assert_eq!(answer.status, 201, "{}", answer.text());
    let partial = answer.json()["sandboxID"].as_str().unwrap().to_owned();
    let native = open.call("GET", &format!("/v1/sandboxes/{partial}/network"), None);
    assert_eq!(
        native.json(),
        json!({"mode": "deny", "rules": ["8.8.8.8/32"], "except": ["8.8.8.8"]}),
        "{}",
        native.text()
    );
    drop(open);
    // Deny everything but what allowOut gives back: an allowlist, which
    // reads back and can be replaced through PUT /sandboxes/{id}/network.
    let answer = e2b(
        &daemon,
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "base", "allow_internet_access": false,
                    "network": {"allowOut": ["example.com"], "denyOut": ["0.0.0.0/0"]}})),
    );
    assert_eq!(answer.status, 201, "{}", answer.text());
    let listed = answer.json()["sandboxID"].as_str().unwrap().to_owned();
    let native = daemon.call("GET", &format!("/v1/sandboxes/{listed}/network"), None);
    assert_eq!(native.json()["mode"], "allow", "{}", native.text());
    assert_eq!(native.json()["rules"][0], "example.com");
    let updated = e2b(
        &daemon,
        "PUT",
        &format!("/sandboxes/{listed}/network"),
        Some(json!({"allowOut": ["pypi.org"], "denyOut": ["0.0.0.0/0"]})),
    );
    assert_eq!(updated.status, 204, "{}", updated.text());
    let native = daemon.call("GET", &format!("/v1/sandboxes/{listed}/network"), None);
    assert_eq!(native.json()["rules"][0], "pypi.org");
    // Denying everything is mode none, which has no egress path to update.
    let answer = e2b(
        &daemon,
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "base", "allow_internet_access": false,
                    "network": {"denyOut": ["0.0.0.0/0"]}})),
    );
    assert_eq!(answer.status, 201, "{}", answer.text());
    let closed = answer.json()["sandboxID"].as_str().unwrap().to_owned();
    let refused = e2b(
        &daemon,
        "PUT",
        &format!("/sandboxes/{closed}/network"),
        Some(json!({"allowOut": ["pypi.org"], "denyOut": ["0.0.0.0/0"]})),
    );
    assert_eq!(refused.status, 409, "{}", refused.text());
    // Bad values and bodies: 400.
    assert_error(
        &e2b(
            &daemon,
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "timeout": 0})),
        ),
        400,
    );
    assert_error(
        &e2b(
            &daemon,
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "autoResume": {"enabled": true}})),
        ),
        400,
    );
    assert_error(&e2b(&daemon, "POST", "/v2/sandboxes", Some(json!({}))), 400);
    let not_json = daemon.call_as(
        Some(&daemon.key),
        "POST",
        "/v2/sandboxes",
        Some(b"{nope"),
        Some("application/json"),
        &[],
    );
    assert_error(&not_json, 400);
    assert_error(
        &e2b(
            &daemon,
            "POST",
            &format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 100_000_000})),
        ),
        400,
    );
    assert_error(&e2b(&daemon, "GET", "/sandboxes/metrics", None), 400);
    // Unknown sandbox and route: 404; wrong method: 405.
    assert_error(
        &e2b(&daemon, "GET", "/sandboxes/sbx-0000000000000000", None),
        404,
    );
    assert_error(&e2b(&daemon, "GET", "/sandboxes/x/nothing", None), 404);
    assert_error(&e2b(&daemon, "PATCH", "/v2/sandboxes", None), 405);

    // Another key sees none of the admin's sandboxes.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(["keys", "create", "tenant", "--json", "--data-dir"])
        .arg(daemon.data_dir())
        .output()
        .unwrap();
    assert!(output.status.success());
    let tenant: Value = serde_json::from_slice(&output.stdout).unwrap();
    let tenant_key = tenant["key"].as_str().unwrap();
    let as_tenant =
        |method: &str, path: &str| daemon.call_as(Some(tenant_key), method, path, None, None, &[]);
    assert_error(&as_tenant("GET", &format!("/sandboxes/{id}")), 404);
    assert_error(&as_tenant("DELETE", &format!("/sandboxes/{id}")), 404);
    let listed = as_tenant("GET", "/v2/sandboxes");
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json(), json!([]));
    assert_eq!(
        e2b(&daemon, "GET", &format!("/sandboxes/{id}"), None).json()["state"],
        "running"
    );
}

#[test]
fn lists_filter_and_page_as_the_sdks_expect() {
    let daemon = TestDaemon::start(&[]);
    let mut mine = Vec::new();
    for n in 0..3 {
        mine.push(sid(&create(
            &daemon,
            json!({"suite": "list", "n": n.to_string(), "who": "a b&c"}),
        )));
    }
    let other = sid(&create(&daemon, json!({"suite": "other"})));

    // The SDK's metadata filter: each key and value URL-encoded, joined
    // with & and =, then encoded once more as the query value.
    let (status, token, list) = get_page(&daemon, "/v2/sandboxes?metadata=suite%3Dlist");
    assert_eq!(status, 200);
    assert_eq!(token, None);
    assert_eq!(ids_of(&list), mine);
    assert_eq!(list[0]["metadata"]["suite"], "list");
    assert_eq!(list[0]["state"], "running");
    for field in [
        "templateID",
        "clientID",
        "startedAt",
        "endAt",
        "cpuCount",
        "memoryMB",
        "diskSizeMB",
        "envdVersion",
    ] {
        assert!(list[0].get(field).is_some(), "{field}");
    }
    let (_, _, list) = get_page(
        &daemon,
        "/v2/sandboxes?metadata=suite%3Dlist%26who%3Da%252520b%252526c%26n%3D1",
    );
    assert_eq!(ids_of(&list), [mine[1].clone()]);

    // Pages: limit + nextToken, x-next-token while there is more.
    let (status, token, first) = get_page(&daemon, "/v2/sandboxes?metadata=suite%3Dlist&limit=2");
    assert_eq!(status, 200);
    assert_eq!(ids_of(&first), mine[..2]);
    let token = token.expect("a next token");
    let (_, last_token, second) = get_page(
        &daemon,
        &format!("/v2/sandboxes?metadata=suite%3Dlist&limit=2&nextToken={token}"),
    );
    assert_eq!(ids_of(&second), mine[2..]);
    assert_eq!(last_token, None);

    // State filters (comma-separated, as both SDKs send them).
    let (_, _, running) = get_page(&daemon, "/v2/sandboxes?state=running,paused");
    assert_eq!(ids_of(&running).len(), 4);
    let (_, _, paused) = get_page(&daemon, "/v2/sandboxes?state=paused");
    assert_eq!(paused, json!([]));
    let (status, _, body) = get_page(&daemon, "/v2/sandboxes?state=dead");
    assert_eq!((status, body["code"].clone()), (400, json!(400)));
    let (status, _, _) = get_page(&daemon, "/v2/sandboxes?limit=101");
    assert_eq!(status, 400);
    let (status, _, _) = get_page(&daemon, "/v2/sandboxes?nextToken=garbage");
    assert_eq!(status, 400);
    // Template and start-time filters.
    let (_, _, by_template) = get_page(&daemon, "/v2/sandboxes?template=base");
    assert_eq!(ids_of(&by_template).len(), 4);
    let (_, _, none) = get_page(&daemon, "/v2/sandboxes?template=other");
    assert_eq!(none, json!([]));
    let (_, _, later) = get_page(&daemon, "/v2/sandboxes?startedAfter=2999-01-01T00:00:00Z");
    assert_eq!(later, json!([]));

    // The deprecated list: running ones, metadata filter, no pages.
    let (status, _, legacy) = get_page(&daemon, "/sandboxes?metadata=suite%3Dother");
    assert_eq!(status, 200);
    assert_eq!(ids_of(&legacy), std::slice::from_ref(&other));

    // A killed sandbox leaves every list.
    assert_eq!(
        e2b(&daemon, "DELETE", &format!("/sandboxes/{}", mine[0]), None).status,
        204
    );
    let (_, _, list) = get_page(&daemon, "/v2/sandboxes?metadata=suite%3Dlist");
    assert_eq!(ids_of(&list), mine[1..]);
    let (_, _, legacy) = get_page(&daemon, "/sandboxes");
    assert!(!ids_of(&legacy).contains(&mine[0]));
}

#[test]
fn connect_hands_out_the_same_token_after_a_daemon_restart() {
    let mut daemon = TestDaemon::start(&[]);
    let created = create(&daemon, json!({}));
    let id = sid(&created);
    daemon.restart();
    let answer = e2b(
        &daemon,
        "POST",
        &format!("/v2/sandboxes/{id}/connect"),
        Some(json!({"timeout": 60})),
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        answer.json()["envdAccessToken"],
        created["envdAccessToken"],
        "the token is derived, not remembered"
    );
}
