//! The native API against a real daemon: lifecycle, processes, files,
//! auth, bad input, the reaper, audit and metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{assert_sandbox_gone, id_of, TestDaemon};
use serde_json::{json, Value};
use std::time::Duration;

#[test]
fn a_sandbox_lives_runs_and_is_released_by_delete() {
    let daemon = TestDaemon::start(&[]);
    let created = daemon.create(json!({
        "metadata": {"team": "a", "run": "1"},
        "limits": {"memory": "256M", "cpus": 0.5, "pids": 64, "disk": "64M"},
        "env": {"GREETING": "hi"},
        "timeout_s": 120
    }));
    let id = id_of(&created);
    assert!(id.starts_with("sbx-"));
    assert_eq!(created["state"], "running");
    assert!(created["access_token"].as_str().unwrap().starts_with("at_"));
    assert_eq!(created["limits"]["memory_bytes"], 256 << 20);
    assert_eq!(created["limits"]["cpu_millis"], 500);

    let got = daemon.call("GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(got.status, 200);
    assert!(
        got.json().get("access_token").is_none(),
        "the token is shown once"
    );

    let (out, code) = daemon.sh_out(&id, "echo $GREETING; id -u; exit 7");
    assert_eq!((out.as_str(), code), ("hi\n1000\n", 7));

    let deleted = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(deleted.status, 204, "{}", deleted.text());
    assert_sandbox_gone(&id);
    let dead = daemon
        .call("GET", &format!("/v1/sandboxes/{id}"), None)
        .json();
    assert_eq!(
        (dead["state"].as_str(), dead["reason"].as_str()),
        (Some("dead"), Some("deleted"))
    );
    // Deleting again is fine; using it is not.
    assert_eq!(
        daemon
            .call("DELETE", &format!("/v1/sandboxes/{id}"), None)
            .status,
        204
    );
    let exec = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"cmd": "true"})),
    );
    assert_eq!(
        (exec.status, exec.code().as_str()),
        (409, "sandbox_not_running")
    );
}

#[test]
fn listing_filters_by_state_and_metadata_and_pages() {
    let daemon = TestDaemon::start(&[]);
    let a: Vec<String> = (0..3)
        .map(|_| id_of(&daemon.create(json!({"metadata": {"group": "a b&c"}}))))
        .collect();
    let b = id_of(&daemon.create(json!({"metadata": {"group": "other"}})));
    daemon.call("DELETE", &format!("/v1/sandboxes/{}", a[2]), None);

    let page = daemon
        .call(
            "GET",
            "/v1/sandboxes?state=running&metadata=group%3Da%2Bb%2526c",
            None,
        )
        .json();
    let ids: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![a[0].as_str(), a[1].as_str()]);

    let first = daemon.call("GET", "/v1/sandboxes?limit=2", None).json();
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let cursor = first["next_cursor"].as_str().unwrap();
    let second = daemon
        .call(
            "GET",
            &format!("/v1/sandboxes?limit=2&cursor={cursor}"),
            None,
        )
        .json();
    let rest: Vec<&str> = second["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(rest, vec![a[2].as_str(), b.as_str()]);
    assert!(second["next_cursor"].is_null());

    let bad = daemon.call("GET", "/v1/sandboxes?state=zombie", None);
    assert_eq!((bad.status, bad.code().as_str()), (400, "bad_request"));
    let bad = daemon.call("GET", "/v1/sandboxes?cursor=zz", None);
    assert_eq!(bad.status, 400);
}

#[test]
fn processes_run_in_the_background_reattach_take_stdin_and_signals() {
    let daemon = TestDaemon::start(&[]);
    let id = id_of(&daemon.create(json!({})));
    let base = format!("/v1/sandboxes/{id}");

    // A background process with stdin: feed it, close it, re-attach.
    let started = daemon.call(
        "POST",
        &format!("{base}/exec"),
        Some(json!({"cmd": "sh", "args": ["-c", "echo ready; cat; echo done >&2"], "stdin": true, "background": true})),
    );
    assert_eq!(started.status, 201, "{}", started.text());
    let pid = started.json()["pid"].as_u64().unwrap();
    let written = daemon.call_as(
        Some(&daemon.key),
        "POST",
        &format!("{base}/processes/{pid}/stdin"),
        Some(b"from stdin\n"),
        Some("application/octet-stream"),
        &[],
    );
    assert_eq!(written.status, 204, "{}", written.text());
    assert_eq!(
        daemon
            .call("POST", &format!("{base}/processes/{pid}/stdin/close"), None)
            .status,
        204
    );
    let output = daemon.call("GET", &format!("{base}/processes/{pid}/output"), None);
    assert_eq!(output.content_type.as_deref(), Some("application/x-ndjson"));
    let lines = output.lines();
    let text: String = lines
        .iter()
        .filter(|l| l["type"] == "stdout")
        .map(|l| l["data"].as_str().unwrap())
        .collect();
    assert_eq!(text, "ready\nfrom stdin\n");
    assert!(lines
        .iter()
        .any(|l| l["type"] == "stderr" && l["data"] == "done\n"));
    assert_eq!(lines.last().unwrap()["type"], "exited");
    assert_eq!(lines.last().unwrap()["exit_code"], 0);
    let process = daemon
        .call("GET", &format!("{base}/processes/{pid}"), None)
        .json();
    assert_eq!(
        (process["running"].as_bool(), process["exit_code"].as_i64()),
        (Some(false), Some(0))
    );

    // A signal ends a sleeper; the list shows it while it runs.
    let sleeper = daemon
        .call(
            "POST",
            &format!("{base}/exec"),
            Some(json!({"cmd": "sleep", "args": ["60"], "background": true})),
        )
        .json()["pid"]
        .as_u64()
        .unwrap();
    let list = daemon
        .call("GET", &format!("{base}/processes"), None)
        .json();
    assert!(list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["pid"] == sleeper && p["running"] == true));
    let sent = daemon.call(
        "POST",
        &format!("{base}/processes/{sleeper}/signal"),
        Some(json!({"signal": "SIGTERM"})),
    );
    assert_eq!(sent.status, 204, "{}", sent.text());
    let ended = daemon
        .call("GET", &format!("{base}/processes/{sleeper}/output"), None)
        .lines();
    assert_eq!(ended.last().unwrap()["signal"], 15);
    let bad = daemon.call(
        "POST",
        &format!("{base}/processes/{sleeper}/signal"),
        Some(json!({"signal": "SIGNOPE"})),
    );
    assert_eq!(bad.status, 400);

    // A per-exec timeout kills, and says so.
    let timed = daemon.call(
        "POST",
        &format!("{base}/exec"),
        Some(json!({"cmd": "sleep", "args": ["30"], "timeout_s": 0.2})),
    );
    let last = timed.lines().pop().unwrap();
    assert_eq!(
        (last["timed_out"].as_bool(), last["signal"].as_i64()),
        (Some(true), Some(9))
    );

    // A program that does not exist: a clear error before any stream.
    let missing = daemon.call(
        "POST",
        &format!("{base}/exec"),
        Some(json!({"cmd": "/no/such/program"})),
    );
    assert_eq!(
        (missing.status, missing.code().as_str()),
        (404, "not_found"),
        "{}",
        missing.text()
    );
    let unknown = daemon.call("GET", &format!("{base}/processes/99999/output"), None);
    assert_eq!(unknown.status, 404);

    // Output that is not UTF-8 arrives intact as base64; split characters are joined.
    let bytes = daemon.sh(
        &id,
        r"printf '\377\376'; printf 'caf\303'; sleep 0.05; printf '\251\n'",
    );
    let b64: Vec<&str> = bytes
        .iter()
        .filter_map(|l| l["data_b64"].as_str())
        .collect();
    assert!(!b64.is_empty(), "{bytes:?}");
    let text: String = bytes.iter().filter_map(|l| l["data"].as_str()).collect();
    assert!(text.contains("café\n") || b64.len() > 1, "{bytes:?}");
}

#[test]
fn files_move_in_and_out_atomically_and_stay_inside() {
    let daemon = TestDaemon::start(&["--max-upload", "1M"]);
    let id = id_of(&daemon.create(json!({})));
    let base = format!("/v1/sandboxes/{id}");
    let key = daemon.key.clone();
    let put = |path: &str, body: &[u8]| {
        daemon.call_as(
            Some(&key),
            "PUT",
            &format!("{base}/files?path={path}"),
            Some(body),
            Some("application/octet-stream"),
            &[],
        )
    };

    let content: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let written = put("/home/user/deep/dir/blob.bin", &content);
    assert_eq!(written.status, 201, "{}", written.text());
    assert_eq!(written.json()["bytes"], 300_000);
    let read = daemon.call(
        "GET",
        &format!("{base}/files?path=/home/user/deep/dir/blob.bin"),
        None,
    );
    assert_eq!(read.status, 200);
    assert!(read.body == content, "the file comes back byte for byte");
    let stat = daemon
        .call(
            "GET",
            &format!("{base}/files/stat?path=/home/user/deep/dir/blob.bin"),
            None,
        )
        .json();
    assert_eq!(
        (
            stat["kind"].as_str(),
            stat["size"].as_u64(),
            stat["uid"].as_u64()
        ),
        (Some("file"), Some(300_000), Some(1000))
    );

    // Too large, declared: 413 before a byte of the body is read.
    let declared = raw_request(
        &daemon.url,
        &format!("PUT {base}/files?path=/home/user/big.bin HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Length: 2000000\r\n\r\n"),
    );
    assert!(declared.starts_with("HTTP/1.1 413"), "{declared}");
    assert!(declared.contains("payload_too_large"), "{declared}");
    // Too large, streamed without a length: cut off at the limit, 413, and
    // no file or temporary left over.
    let url = format!("{}{base}/files?path=/home/user/big.bin", daemon.url);
    let streamed = ureq::put(&url)
        .header("X-API-Key", &key)
        .config()
        .http_status_as_error(false)
        .build()
        .send(ureq::SendBody::from_reader(&mut std::io::Cursor::new(
            vec![b'x'; (1 << 20) + 1],
        )))
        .unwrap();
    assert_eq!(streamed.status().as_u16(), 413);
    let listing = daemon
        .call("GET", &format!("{base}/files/list?path=/home/user"), None)
        .json();
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec!["deep"],
        "nothing of the refused upload is left: {names:?}"
    );

    // mkdir, move, list with depth, remove.
    let made = daemon.call(
        "POST",
        &format!("{base}/files/mkdir"),
        Some(json!({"path": "/tmp/a/b", "parents": true})),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let again = daemon.call(
        "POST",
        &format!("{base}/files/mkdir"),
        Some(json!({"path": "/tmp/a/b"})),
    );
    assert_eq!((again.status, again.code().as_str()), (409, "conflict"));
    let moved = daemon.call(
        "POST",
        &format!("{base}/files/move"),
        Some(json!({"from": "/home/user/deep/dir/blob.bin", "to": "/tmp/a/b/moved.bin"})),
    );
    assert_eq!(moved.status, 200, "{}", moved.text());
    let deep = daemon
        .call(
            "GET",
            &format!("{base}/files/list?path=/tmp/a&depth=2"),
            None,
        )
        .json();
    let paths: Vec<&str> = deep["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"/tmp/a/b/moved.bin"), "{paths:?}");
    let not_empty = daemon.call("DELETE", &format!("{base}/files?path=/tmp/a"), None);
    assert_eq!(not_empty.status, 400, "{}", not_empty.text());
    assert_eq!(
        daemon
            .call(
                "DELETE",
                &format!("{base}/files?path=/tmp/a&recursive=true"),
                None
            )
            .status,
        204
    );
    assert_eq!(
        daemon
            .call("GET", &format!("{base}/files/stat?path=/tmp/a"), None)
            .status,
        404
    );

    // Path tricks never reach the host: `..` stays inside, symlinks to host
    // paths resolve inside, NUL and relative paths are refused.
    std::fs::write("/tmp/airlock-host-only", "host secret").unwrap();
    let dots = daemon.call(
        "GET",
        &format!("{base}/files?path=/../../../tmp/airlock-host-only"),
        None,
    );
    assert_eq!(dots.status, 404, "{}", dots.text());
    daemon.sh(&id, "ln -s /tmp/airlock-host-only /home/user/link");
    let through = daemon.call("GET", &format!("{base}/files?path=/home/user/link"), None);
    assert_eq!(
        through.status,
        404,
        "a symlink resolves inside the sandbox: {}",
        through.text()
    );
    let nul = daemon.call("GET", &format!("{base}/files?path=/etc/passwd%00x"), None);
    assert_eq!(nul.status, 400);
    let relative = daemon.call("GET", &format!("{base}/files?path=etc/passwd"), None);
    assert_eq!(relative.status, 400);
    let host_write = put("/../../tmp/airlock-host-only", b"overwritten");
    assert_eq!(host_write.status, 201);
    assert_eq!(
        std::fs::read_to_string("/tmp/airlock-host-only").unwrap(),
        "host secret"
    );
    std::fs::remove_file("/tmp/airlock-host-only").unwrap();
}

/// Sends `head` on a fresh connection and returns what comes back first.
fn raw_request(url: &str, head: &str) -> String {
    use std::io::{Read, Write};
    let address = url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    // The server may answer and close before it has read everything.
    let mut writer = stream.try_clone().unwrap();
    let bytes = head.as_bytes().to_vec();
    std::thread::spawn(move || {
        let _ = writer.write_all(&bytes);
    });
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buffer = vec![0u8; 4096];
    let n = stream.read(&mut buffer).unwrap();
    String::from_utf8_lossy(&buffer[..n]).into_owned()
}

/// Makes `/home/user/big` hold `f000000` … `f099999` and `sub/inner`.
fn make_100000_files(daemon: &TestDaemon, id: &str) {
    let (out, code) = daemon.sh_out(
        id,
        "python3 -c \"import os\n\
         os.makedirs('/home/user/big/sub')\n\
         open('/home/user/big/sub/inner', 'w').close()\n\
         for i in range(100000): open('/home/user/big/f%06d' % i, 'w').close()\n\
         print(len(os.listdir('/home/user/big')))\"",
    );
    assert_eq!((out.as_str(), code), ("100001\n", 0));
}

#[test]
fn a_directory_of_100000_entries_lists_in_pages_and_through_the_cli() {
    let daemon = TestDaemon::start(&[]);
    let id = id_of(&daemon.create(json!({
        "limits": {"memory": "1G", "disk": "256M"},
        "timeout_s": 600
    })));
    let base = format!("/v1/sandboxes/{id}");
    make_100000_files(&daemon, &id);

    // The default page, then every page of the most a page may hold.
    let first = daemon.call(
        "GET",
        &format!("{base}/files/list?path=/home/user/big"),
        None,
    );
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    assert_eq!(first["entries"].as_array().unwrap().len(), 1000);
    assert_eq!(first["entries"][0]["path"], "/home/user/big/f000000");
    assert!(first["next_cursor"].is_string());

    let mut paths: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = format!("{base}/files/list?path=/home/user/big&depth=2&limit=10000");
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&cursor={cursor}"));
        }
        let page = daemon.call("GET", &url, None);
        assert_eq!(page.status, 200, "{}", page.text());
        let page = page.json();
        let entries = page["entries"].as_array().unwrap();
        assert!(!entries.is_empty() && entries.len() <= 10_000);
        paths.extend(
            entries
                .iter()
                .map(|e| e["path"].as_str().unwrap().to_owned()),
        );
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert!(pages >= 10, "{pages} pages");
    let mut expected: Vec<String> = (0..100_000)
        .map(|i| format!("/home/user/big/f{i:06}"))
        .collect();
    expected.push("/home/user/big/sub".into());
    expected.push("/home/user/big/sub/inner".into());
    assert_eq!(paths.len(), expected.len());
    assert!(
        paths == expected,
        "every entry once, none twice, in path order"
    );

    // Bad pages are refused and say why.
    for query in [
        "limit=0",
        "limit=10001",
        "cursor=not*a*cursor",
        "cursor=AAAA",
        "depth=33",
    ] {
        let bad = daemon.call(
            "GET",
            &format!("{base}/files/list?path=/home/user/big&{query}"),
            None,
        );
        assert_eq!(
            (bad.status, bad.code().as_str()),
            (400, "bad_request"),
            "{query}"
        );
    }

    // The CLI reads every page.
    let ls = std::process::Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(["files", &id, "ls", "/home/user/big"])
        .env("AIRLOCK_URL", &daemon.url)
        .env("AIRLOCK_API_KEY", &daemon.key)
        .output()
        .unwrap();
    assert!(
        ls.status.success(),
        "{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    let table = String::from_utf8(ls.stdout).unwrap();
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 100_001, "the header, then one row per entry");
    assert!(rows[0].ends_with("/home/user/big/f000000"), "{}", rows[0]);
    assert!(rows[99_999].ends_with("/home/user/big/f099999"));
    assert!(rows[100_000].starts_with("dir") && rows[100_000].ends_with("/home/user/big/sub"));
    let json = std::process::Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args([
            "files",
            &id,
            "ls",
            "--json",
            "--depth",
            "2",
            "/home/user/big",
        ])
        .env("AIRLOCK_URL", &daemon.url)
        .env("AIRLOCK_API_KEY", &daemon.key)
        .output()
        .unwrap();
    assert!(json.status.success());
    let listed: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(listed["entries"].as_array().unwrap().len(), 100_002);
}

#[test]
fn an_upload_larger_than_a_memory_layer_answers_507_and_the_sandbox_lives() {
    // 256M of memory and the default disk limit (1G), with the writable
    // layer in memory: it must end well inside the memory limit.
    let daemon = TestDaemon::start(&["--writable-layers", "memory"]);
    let created = daemon.create(json!({"limits": {"memory": "256M"}}));
    let id = id_of(&created);
    assert_eq!(created["limits"]["disk_bytes"], 192 << 20, "{created}");
    let base = format!("/v1/sandboxes/{id}");
    let key = daemon.key.clone();
    let kept = daemon.call_as(
        Some(&key),
        "PUT",
        &format!("{base}/files?path=/home/user/kept.txt"),
        Some(b"still here"),
        Some("application/octet-stream"),
        &[],
    );
    assert_eq!(kept.status, 201, "{}", kept.text());

    let big = daemon.call_streamed(
        Some(&key),
        "PUT",
        &format!("{base}/files?path=/home/user/big.bin"),
        300 << 20,
        &[("Content-Type", "application/octet-stream")],
    );
    let got = daemon.call("GET", &base, None).json();
    assert_eq!(
        (got["state"].as_str(), big.status),
        (Some("running"), 507),
        "{got} {}",
        big.text()
    );
    assert_eq!(big.code(), "insufficient_storage");
    let read = daemon.call(
        "GET",
        &format!("{base}/files?path=/home/user/kept.txt"),
        None,
    );
    assert_eq!((read.status, read.text().as_str()), (200, "still here"));
    // Nothing of the refused upload is left, and the layer is usable again.
    let (out, code) = daemon.sh_out(
        &id,
        "ls -A /home/user; echo more > /home/user/after.txt && cat /home/user/after.txt",
    );
    assert_eq!((out.as_str(), code), ("kept.txt\nmore\n", 0));
}

#[test]
fn a_disk_layer_holds_more_than_memory_and_past_its_quota_answers_507() {
    // The writable layer is on disk under a quota of `disk`: a sandbox of
    // 64M of memory takes a 200M file (a layer in memory could hold 48M),
    // and past the quota an upload answers 507 and the sandbox lives on.
    let daemon = TestDaemon::start(&[]);
    let created = daemon.create(json!({"limits": {"memory": "64M", "disk": "256M"}}));
    let id = id_of(&created);
    assert_eq!(created["limits"]["disk_bytes"], 256 << 20, "{created}");
    let base = format!("/v1/sandboxes/{id}");
    let key = daemon.key.clone();
    let fits = daemon.call_streamed(
        Some(&key),
        "PUT",
        &format!("{base}/files?path=/home/user/fits.bin"),
        200 << 20,
        &[("Content-Type", "application/octet-stream")],
    );
    assert_eq!(fits.status, 201, "{}", fits.text());
    let big = daemon.call_streamed(
        Some(&key),
        "PUT",
        &format!("{base}/files?path=/home/user/big.bin"),
        100 << 20,
        &[("Content-Type", "application/octet-stream")],
    );
    let got = daemon.call("GET", &base, None).json();
    assert_eq!(
        (got["state"].as_str(), big.status),
        (Some("running"), 507),
        "{got} {}",
        big.text()
    );
    assert_eq!(big.code(), "insufficient_storage");
    // Inside, a write past the quota fails as the kernel says; the files
    // written before are whole.
    let (out, code) = daemon.sh_out(
        &id,
        "head -c 104857600 /dev/zero > /home/user/more.bin 2>&1 || echo refused; \
         rm -f /home/user/more.bin; ls -A /home/user; wc -c < /home/user/fits.bin",
    );
    assert!(out.contains("refused"), "{out}");
    assert!(out.ends_with("fits.bin\n209715200\n"), "{out} ({code})");
    // And the layer goes with the sandbox.
    assert_eq!(daemon.call("DELETE", &base, None).status, 204);
    assert!(
        !daemon.data_dir().join("disk/sandboxes").join(&id).exists(),
        "the writable layer of {id} is left"
    );
}

#[test]
fn a_body_framed_two_ways_is_400_and_keys_of_either_shape_work() {
    let daemon = TestDaemon::start(&[]);
    // Content-Length and Transfer-Encoding: hyper reads the body as chunked
    // (dropping the length), the plain body is no chunk, and the answer is
    // a 400 that closes the connection (it was a 413).
    let answer = raw_request(
        &daemon.url,
        &format!(
            "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: {}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{{}}",
            daemon.key
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("\"code\":\"bad_request\""), "{answer}");
    // A well-formed chunked body with a Content-Length beside it is refused
    // the same way (hyper alone would drop the length and serve it).
    let answer = raw_request(
        &daemon.url,
        &format!(
            "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: {}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n",
            daemon.key
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("Content-Length and Transfer-Encoding"),
        "{answer}"
    );
    let listed = daemon.call("GET", "/v1/sandboxes", None).json();
    assert_eq!(listed["items"], json!([]), "nothing was created");

    // The admin key the daemon made is shaped as every e2b SDK 2.x wants.
    assert!(daemon.key.starts_with("e2b_"), "{}", daemon.key);
}

#[test]
fn watches_stream_changes_until_the_client_leaves() {
    let daemon = TestDaemon::start(&[]);
    let id = id_of(&daemon.create(json!({})));
    let base = format!("/v1/sandboxes/{id}");
    daemon.sh(&id, "mkdir -p /home/user/w");
    let url = format!(
        "{}{base}/files/watch?path=/home/user/w&recursive=true",
        daemon.url
    );
    let key = daemon.key.clone();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let response = ureq::get(&url).header("X-API-Key", &key).call().unwrap();
        let mut lines = Vec::new();
        let body = response.into_body().into_reader();
        for line in std::io::BufReader::new(body).lines() {
            let line: Value = serde_json::from_str(&line.unwrap()).unwrap();
            let done = line["path"] == "/home/user/w/sub/f.txt" && line["type"] == "write";
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    });
    std::thread::sleep(Duration::from_millis(300));
    daemon.sh(
        &id,
        "mkdir /home/user/w/sub && sleep 0.1 && echo x > /home/user/w/sub/f.txt",
    );
    let lines = reader.join().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "create" && l["path"] == "/home/user/w/sub"),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "create" && l["path"] == "/home/user/w/sub/f.txt"),
        "{lines:?}"
    );

    let missing = daemon.call("GET", &format!("{base}/files/watch?path=/nope"), None);
    assert_eq!(missing.status, 404, "{}", missing.text());
}

#[test]
fn every_call_needs_credentials_and_tokens_open_one_sandbox() {
    let daemon = TestDaemon::start(&[]);
    let created = daemon.create(json!({}));
    let id = id_of(&created);
    let token = created["access_token"].as_str().unwrap().to_owned();
    let base = format!("/v1/sandboxes/{id}");

    for (key, headers) in [
        (None, vec![]),
        (Some("al_wrong"), vec![]),
        (None, vec![("Authorization", "Bearer al_0000")]),
        (None, vec![("X-Access-Token", "at_wrong")]),
    ] {
        let answer = daemon.call_as(key, "GET", "/v1/sandboxes", None, None, &headers);
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (401, "unauthorized"),
            "{key:?} {headers:?}"
        );
    }
    let bearer = format!("Bearer {}", daemon.key);
    assert_eq!(
        daemon
            .call_as(
                None,
                "GET",
                "/v1/sandboxes",
                None,
                None,
                &[("Authorization", &bearer)]
            )
            .status,
        200
    );
    assert_eq!(
        daemon
            .call_as(None, "GET", "/metrics", None, None, &[])
            .status,
        401
    );
    assert_eq!(
        daemon
            .call_as(None, "GET", "/healthz", None, None, &[])
            .status,
        200
    );

    // The access token opens this sandbox's data plane, nothing else.
    let with_token = |method: &str, path: &str, body: Option<&[u8]>| {
        daemon.call_as(
            None,
            method,
            path,
            body,
            body.map(|_| "application/json"),
            &[("X-Access-Token", &token)],
        )
    };
    let exec = with_token("POST", &format!("{base}/exec"), Some(br#"{"cmd":"true"}"#));
    assert_eq!(exec.status, 200, "{}", exec.text());
    assert_eq!(with_token("GET", &base, None).status, 200);
    assert_eq!(with_token("DELETE", &base, None).status, 401);
    assert_eq!(
        with_token(
            "POST",
            &format!("{base}/timeout"),
            Some(br#"{"timeout_s":5}"#)
        )
        .status,
        401
    );
    assert_eq!(with_token("GET", "/v1/sandboxes", None).status, 401);
    let other = id_of(&daemon.create(json!({})));
    assert_eq!(
        with_token("GET", &format!("/v1/sandboxes/{other}/processes"), None).status,
        401
    );

    // Another key sees nothing of the admin's sandboxes; a revoked key nothing at all.
    let tenant = daemon.new_key("tenant");
    let tenant_key = tenant["key"].as_str().unwrap();
    let answer = daemon.call_as(Some(tenant_key), "GET", &base, None, None, &[]);
    assert_eq!(answer.status, 404);
    let listed = daemon
        .call_as(Some(tenant_key), "GET", "/v1/sandboxes", None, None, &[])
        .json();
    assert_eq!(listed["items"].as_array().unwrap().len(), 0);
    assert_eq!(
        daemon
            .call_as(Some(tenant_key), "DELETE", &base, None, None, &[])
            .status,
        404
    );
    let revoked = std::process::Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args([
            "keys",
            "revoke",
            tenant["id"].as_str().unwrap(),
            "--data-dir",
        ])
        .arg(daemon.data_dir())
        .output()
        .unwrap();
    assert!(revoked.status.success());
    assert_eq!(
        daemon
            .call_as(Some(tenant_key), "GET", "/v1/sandboxes", None, None, &[])
            .status,
        401
    );
    assert_eq!(
        daemon.call("GET", &base, None).json()["state"],
        "running",
        "nothing changed"
    );
}

#[test]
fn bad_input_gets_a_clear_4xx_and_changes_nothing() {
    let daemon = TestDaemon::start(&[]);
    let key = daemon.key.clone();
    let post = |body: &[u8], content_type: Option<&str>| {
        daemon.call_as(
            Some(&key),
            "POST",
            "/v1/sandboxes",
            Some(body),
            content_type,
            &[],
        )
    };
    let json_type = Some("application/json");

    let malformed = post(b"{\"limits\": {", json_type);
    assert_eq!(
        (malformed.status, malformed.code().as_str()),
        (400, "bad_request")
    );
    let wrong_type = post(br#"{"limits": {"pids": "many"}}"#, json_type);
    assert_eq!(wrong_type.status, 400);
    assert!(
        wrong_type.json()["message"]
            .as_str()
            .unwrap()
            .contains("limits.pids"),
        "{}",
        wrong_type.text()
    );
    let unknown = post(br#"{"limitz": {}}"#, json_type);
    assert!(
        unknown.json()["message"]
            .as_str()
            .unwrap()
            .contains("limitz"),
        "{}",
        unknown.text()
    );
    let huge = raw_request(
        &daemon.url,
        &format!(
            "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: 1100013\r\n\r\n{{\"metadata\": \"{}\"}}",
            "x".repeat(1_100_000)
        ),
    );
    assert!(
        huge.starts_with("HTTP/1.1 413") && huge.contains("payload_too_large"),
        "{huge}"
    );
    assert_eq!(post(b"{}", Some("text/plain")).status, 415);
    for body in [
        json!({"limits": {"memory": "100T"}}),
        json!({"limits": {"cpus": 4096}}),
        json!({"limits": {"memory": "1K"}}),
        json!({"timeout_s": 0}),
        json!({"tier": "microvm"}),
        json!({"template": "../../etc"}),
        json!({"network": {"mode": "allow", "rules": ["pypi.org:0"]}}),
        json!({"mounts": [{"source": "/etc", "target": "/mnt/etc"}]}),
        json!({"env": {"A=B": "c"}}),
    ] {
        let answer = post(body.to_string().as_bytes(), json_type);
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (400, "bad_request"),
            "{body}: {}",
            answer.text()
        );
        assert!(
            !answer.text().contains("/var/lib"),
            "no internal detail: {}",
            answer.text()
        );
    }
    let listed = daemon.call("GET", "/v1/sandboxes", None).json();
    assert_eq!(
        listed["items"].as_array().unwrap().len(),
        0,
        "no sandbox was created by bad input"
    );

    assert_eq!(daemon.call("GET", "/v1/nope", None).code(), "not_found");
    assert_eq!(daemon.call("GET", "/v1/nope", None).status, 404);
    let wrong_method = daemon.call("PATCH", "/v1/sandboxes", None);
    assert_eq!(
        (wrong_method.status, wrong_method.code().as_str()),
        (405, "method_not_allowed")
    );
    let unknown_sandbox = daemon.call("GET", "/v1/sandboxes/sbx-0000000000000000", None);
    assert_eq!(
        (unknown_sandbox.status, unknown_sandbox.code().as_str()),
        (404, "not_found")
    );
    let unknown_exec = daemon.call(
        "POST",
        "/v1/sandboxes/sbx-0000000000000000/exec",
        Some(json!({"cmd": "true"})),
    );
    assert_eq!(unknown_exec.status, 404);
    let garbage_id = daemon.call("DELETE", "/v1/sandboxes/..%2F..%2Fetc", None);
    assert_eq!(garbage_id.status, 404);
}

#[test]
fn the_reaper_kills_expired_sandboxes_on_time_and_timeouts_extend() {
    let daemon = TestDaemon::start(&[]);
    let short = id_of(&daemon.create(json!({"timeout_s": 1})));
    let extended = id_of(&daemon.create(json!({"timeout_s": 1})));
    let set = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{extended}/timeout"),
        Some(json!({"timeout_s": 60})),
    );
    assert_eq!(set.status, 200, "{}", set.text());
    let dead = TestDaemon::wait_for(Duration::from_secs(3), || {
        daemon
            .call("GET", &format!("/v1/sandboxes/{short}"), None)
            .json()["state"]
            == "dead"
    });
    assert!(dead, "the sandbox outlived its timeout");
    let row = daemon
        .call("GET", &format!("/v1/sandboxes/{short}"), None)
        .json();
    assert_eq!(row["reason"], "timeout");
    assert_sandbox_gone(&short);
    assert_eq!(
        daemon
            .call("GET", &format!("/v1/sandboxes/{extended}"), None)
            .json()["state"],
        "running"
    );
    let events = daemon
        .call(
            "GET",
            &format!("/v1/sandboxes/{short}/events?stream=security"),
            None,
        )
        .json();
    let kinds: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, vec!["sandbox.timeout_kill"]);
}

#[test]
fn audit_streams_and_metrics_record_what_happened() {
    let daemon = TestDaemon::start(&[]);
    let id = id_of(&daemon.create(json!({"limits": {"memory": "64M"}})));
    let base = format!("/v1/sandboxes/{id}");
    daemon.sh(&id, "echo x > /tmp/f");
    let key = daemon.key.clone();
    daemon.call_as(
        Some(&key),
        "PUT",
        &format!("{base}/files?path=/tmp/up"),
        Some(b"12345"),
        None,
        &[("X-Request-Id", "req-test-1")],
    );
    // Blow the memory limit: the OOM killer ends the process; it is recorded.
    let oom = daemon.sh(&id, "python3 -c 'a = bytearray(200 << 20); print(len(a))'");
    assert_eq!(oom.last().unwrap()["oom"], true, "{oom:?}");

    let events = daemon
        .call("GET", &format!("{base}/events?limit=1000"), None)
        .json();
    let items = events["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    for kind in [
        "sandbox.created",
        "exec.started",
        "exec.exited",
        "api.call",
        "file.write",
        "exec.oom",
    ] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    let write = items.iter().find(|e| e["kind"] == "file.write").unwrap();
    assert_eq!(
        (
            write["detail"]["path"].as_str(),
            write["detail"]["bytes"].as_u64()
        ),
        (Some("/tmp/up"), Some(5))
    );
    assert_eq!(write["request_id"], "req-test-1");
    let paged = daemon
        .call("GET", &format!("{base}/events?limit=2"), None)
        .json();
    let after = paged["next_cursor"].as_i64().unwrap();
    let next = daemon
        .call("GET", &format!("{base}/events?limit=2&after={after}"), None)
        .json();
    assert!(next["items"][0]["seq"].as_i64().unwrap() > after);

    // The JSONL streams on disk carry the same events, tied by sandbox and request id.
    let audit = daemon.data_dir().join("audit");
    let access = std::fs::read_to_string(audit.join("access.jsonl")).unwrap();
    assert!(access
        .lines()
        .any(|l| l.contains("req-test-1") && l.contains("file.write")));
    let security = std::fs::read_to_string(audit.join("security.jsonl")).unwrap();
    assert!(security.contains("exec.oom") && security.contains(&id));
    let runtime = std::fs::read_to_string(audit.join("runtime.jsonl")).unwrap();
    assert!(runtime.contains("sandbox.created"));

    daemon.call("DELETE", &base, None);
    let metrics = daemon.call("GET", "/metrics", None).text();
    for needle in [
        "airlock_sandboxes{state=\"running\"} 0",
        "airlock_sandbox_deaths_total{reason=\"deleted\"} 1",
        "airlock_sandbox_create_seconds_count 1",
        "airlock_oom_kills_total 1",
        "airlock_leaked_resources 0",
        "airlock_teardown_failures_total 0",
        "airlock_admission_queue_depth 0",
        "airlock_execs_total{outcome=\"ok\"} 1",
    ] {
        assert!(metrics.contains(needle), "{needle} missing from\n{metrics}");
    }
}

#[test]
fn the_openapi_document_is_served_and_lists_the_routes() {
    let daemon = TestDaemon::start(&[]);
    let doc = daemon.call_as(None, "GET", "/v1/openapi.json", None, None, &[]);
    assert_eq!(doc.status, 200);
    let doc = doc.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for path in [
        "/v1/sandboxes",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/files/watch",
        "/metrics",
        "/healthz",
    ] {
        assert!(paths.contains_key(path), "{path} missing");
    }
}

#[test]
fn the_tiers_are_listed_and_a_create_runs_on_the_one_it_names() {
    let daemon = TestDaemon::start(&[]);
    let tiers = daemon.call("GET", "/v1/tiers", None);
    assert_eq!(tiers.status, 200, "{}", tiers.text());
    // CI installs runsc and runc: every tier runs here (one that cannot
    // shows its probe's reason in the failure).
    assert_eq!(
        tiers.json()["items"],
        json!([
            {"tier": "gvisor", "available": true},
            {"tier": "oci", "available": true},
            {"tier": "process", "available": true}
        ]),
        "{}",
        tiers.text()
    );
    assert_eq!(
        daemon
            .call_as(None, "GET", "/v1/tiers", None, None, &[])
            .status,
        401
    );
    let created = daemon.create(json!({"tier": "process"}));
    assert_eq!(created["tier"], "process", "{created}");
    let refused = daemon.call("POST", "/v1/sandboxes", Some(json!({"tier": "vm"})));
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(
        refused.text().contains("GET /v1/tiers"),
        "{}",
        refused.text()
    );
    let out = std::process::Command::new(common::binary())
        .args(["tiers", "--url", &daemon.url, "--api-key", &daemon.key])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["process", "yes", "-"]),
        "{table}"
    );
    daemon.delete_all();
}
