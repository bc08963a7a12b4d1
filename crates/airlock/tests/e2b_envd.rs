//! The e2b envd dialect against a real daemon, spoken byte for byte as the
//! e2b Python SDK speaks it: Connect JSON (unary `application/json`,
//! streams `application/connect+json` in hand-built envelopes), `/files`,
//! `/health`, and the `E2b-Sandbox-Id` / `X-Access-Token` headers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{Answer, TestDaemon};
use serde_json::{json, Value};
use std::time::Duration;

struct Sandbox<'a> {
    daemon: &'a TestDaemon,
    id: String,
    token: String,
}

/// One envelope around `message`.
fn envelope(flags: u8, message: &Value) -> Vec<u8> {
    let body = message.to_string().into_bytes();
    let mut out = vec![flags];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// The envelopes of a stream answer.
fn frames(bytes: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        out.push((rest[0], serde_json::from_slice(&rest[5..5 + len]).unwrap()));
        rest = &rest[5 + len..];
    }
    assert!(rest.is_empty(), "trailing bytes in a stream");
    out
}

fn b64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn unb64(text: &str) -> String {
    use base64::Engine;
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap(),
    )
    .unwrap()
}

impl<'a> Sandbox<'a> {
    fn new(daemon: &'a TestDaemon) -> Sandbox<'a> {
        Sandbox::with(daemon, json!({"timeout_s": 120}))
    }

    /// A sandbox created from `body`.
    fn with(daemon: &'a TestDaemon, body: Value) -> Sandbox<'a> {
        let created = daemon.create(body);
        Sandbox {
            daemon,
            id: created["id"].as_str().unwrap().to_owned(),
            token: created["access_token"].as_str().unwrap().to_owned(),
        }
    }

    fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        content_type: Option<&str>,
        extra: &[(&str, &str)],
    ) -> Answer {
        let mut headers = vec![
            ("E2b-Sandbox-Id", self.id.as_str()),
            ("E2b-Sandbox-Port", "49983"),
            ("X-Access-Token", self.token.as_str()),
            ("Connect-Protocol-Version", "1"),
        ];
        headers.extend_from_slice(extra);
        self.daemon
            .call_as(None, method, path, body, content_type, &headers)
    }

    fn unary(&self, rpc: &str, message: Value) -> Answer {
        self.raw(
            "POST",
            &format!("/{rpc}"),
            Some(message.to_string().as_bytes()),
            Some("application/json"),
            &[],
        )
    }

    fn stream(
        &self,
        rpc: &str,
        message: Value,
        extra: &[(&str, &str)],
    ) -> (Answer, Vec<(u8, Value)>) {
        let answer = self.raw(
            "POST",
            &format!("/{rpc}"),
            Some(&envelope(0, &message)),
            Some("application/connect+json"),
            extra,
        );
        let frames = if answer.status == 200 {
            frames(&answer.body)
        } else {
            Vec::new()
        };
        (answer, frames)
    }

    /// Runs `bash -l -c cmd` as `commands.run` does: stdout, stderr, the end event.
    fn run(&self, cmd: &str) -> (String, String, Value) {
        let (answer, frames) = self.stream(
            "process.Process/Start",
            json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd], "envs": {}}, "stdin": false}),
            &[("Keepalive-Ping-Interval", "50"), ("Authorization", "Basic dXNlcjo=")],
        );
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.content_type.as_deref(),
            Some("application/connect+json")
        );
        assert!(frames[0].1["event"]["start"]["pid"].as_u64().unwrap() > 0);
        let (mut out, mut err, mut end) = (String::new(), String::new(), Value::Null);
        for (flags, frame) in &frames[1..] {
            if *flags == 2 {
                assert_eq!(frame, &json!({}), "the stream ends well");
                continue;
            }
            let event = &frame["event"];
            if let Some(data) = event["data"]["stdout"].as_str() {
                out.push_str(&unb64(data));
            }
            if let Some(data) = event["data"]["stderr"].as_str() {
                err.push_str(&unb64(data));
            }
            if !event["end"].is_null() {
                end = event["end"].clone();
            }
        }
        assert_eq!(frames.last().unwrap().0, 2);
        (out, err, end)
    }
}

#[test]
fn commands_run_with_output_exit_codes_stdin_list_and_signals() {
    let daemon = TestDaemon::start(&[]);
    let sbx = Sandbox::new(&daemon);

    let (out, err, end) = sbx.run("echo hello; echo oops >&2; exit 3");
    assert_eq!((out.as_str(), err.as_str()), ("hello\n", "oops\n"));
    assert_eq!(end["exitCode"], 3);
    assert_eq!(end["exited"], true);
    assert_eq!(end["status"], "exit status 3");

    // Root through the Basic user, as the SDK sends `user="root"`.
    let (_, frames) = sbx.stream(
        "process.Process/Start",
        json!({"process": {"cmd": "/usr/bin/id", "args": ["-u"]}}),
        &[("Authorization", "Basic cm9vdDo=")],
    );
    let stdout = frames
        .iter()
        .find_map(|(_, f)| f["event"]["data"]["stdout"].as_str())
        .unwrap();
    assert_eq!(unb64(stdout), "0\n");

    // A background `cat` fed by SendInput, ended by CloseStdin; found by
    // pid in List, re-attached by Connect.
    let started = std::thread::scope(|scope| {
        let start = scope.spawn(|| {
            sbx.stream(
                "process.Process/Start",
                json!({"process": {"cmd": "/bin/cat"}, "stdin": true, "tag": "feeder"}),
                &[],
            )
        });
        let mut pid = None;
        assert!(TestDaemon::wait_for(Duration::from_secs(10), || {
            let list = sbx.unary("process.Process/List", json!({}));
            assert_eq!(list.status, 200, "{}", list.text());
            pid = list.json()["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["tag"] == "feeder")
                .map(|p| p["pid"].as_u64().unwrap());
            pid.is_some()
        }));
        let pid = pid.unwrap();
        let list = sbx.unary("process.Process/List", json!({})).json();
        assert_eq!(list["processes"][0]["config"]["cmd"], "/bin/cat");
        let sent = sbx.unary(
            "process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"stdin": b64("piped\n")}}),
        );
        assert_eq!(sent.status, 200, "{}", sent.text());
        assert_eq!(sent.json(), json!({}));
        let closed = sbx.unary(
            "process.Process/CloseStdin",
            json!({"process": {"tag": "feeder"}}),
        );
        assert_eq!(closed.status, 200, "{}", closed.text());
        start.join().unwrap()
    });
    let (answer, frames) = started;
    assert_eq!(answer.status, 200);
    let out: String = frames
        .iter()
        .filter_map(|(_, f)| f["event"]["data"]["stdout"].as_str())
        .map(unb64)
        .collect();
    assert_eq!(out, "piped\n");
    assert!(frames
        .iter()
        .any(|(_, f)| f["event"]["end"]["exitCode"] == 0));

    // SendSignal SIGKILL ends a sleeper; its Start stream reports it.
    let (answer, frames) = std::thread::scope(|scope| {
        let start = scope.spawn(|| {
            sbx.stream(
                "process.Process/Start",
                json!({"process": {"cmd": "/bin/sleep", "args": ["60"]}, "tag": "sleeper"}),
                &[],
            )
        });
        let mut pid = 0;
        assert!(TestDaemon::wait_for(Duration::from_secs(10), || {
            let list = sbx.unary("process.Process/List", json!({})).json();
            if let Some(p) = list["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["tag"] == "sleeper")
            {
                pid = p["pid"].as_u64().unwrap();
            }
            pid > 0
        }));
        let signal = sbx.unary(
            "process.Process/SendSignal",
            json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
        );
        assert_eq!(signal.status, 200, "{}", signal.text());
        // Connect re-attaches to the (now ending) process by tag.
        start.join().unwrap()
    });
    assert_eq!(answer.status, 200);
    let end = frames
        .iter()
        .find_map(|(_, f)| f["event"].get("end").cloned())
        .unwrap();
    assert_eq!(end["exited"], false);
    assert_eq!(end["status"], "signal: killed");

    // A process that is not there: not_found, the SDK's "not killed".
    let missing = sbx.unary(
        "process.Process/SendSignal",
        json!({"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"}),
    );
    assert_eq!(missing.status, 404, "{}", missing.text());
    assert_eq!(missing.code(), "not_found");
}

#[test]
fn terminals_start_take_input_resize_and_end() {
    let daemon = TestDaemon::start(&[]);
    let sbx = Sandbox::new(&daemon);
    // The script marks when it has printed the first size, so the resize
    // below cannot overtake it (a slow tier may not have run `stty` yet when
    // the process is listed).
    let script = "test -t 0 && test -t 1 && echo on-a-tty; stty size; : > /tmp/sized; \
                  read line; echo \"got $line\"; stty size; exit 3";
    let (pid, (answer, frames)) = std::thread::scope(|scope| {
        let start = scope.spawn(|| {
            sbx.stream(
                "process.Process/Start",
                json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]},
                       "pty": {"size": {"cols": 80, "rows": 24}}, "tag": "term"}),
                &[],
            )
        });
        let mut pid = 0;
        assert!(TestDaemon::wait_for(Duration::from_secs(10), || {
            let list = sbx.unary("process.Process/List", json!({})).json();
            if let Some(p) = list["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["tag"] == "term")
            {
                pid = p["pid"].as_u64().unwrap();
            }
            pid > 0
        }));
        assert!(TestDaemon::wait_for(Duration::from_secs(20), || {
            sbx.unary("filesystem.Filesystem/Stat", json!({"path": "/tmp/sized"}))
                .status
                == 200
        }));
        // Input of the wrong kind, and closing a terminal's input, are refused.
        let piped = sbx.unary(
            "process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"stdin": b64("x\n")}}),
        );
        assert_eq!(piped.status, 400, "{}", piped.text());
        assert_eq!(piped.code(), "invalid_argument");
        let closed = sbx.unary(
            "process.Process/CloseStdin",
            json!({"process": {"pid": pid}}),
        );
        assert_eq!(closed.status, 400, "{}", closed.text());
        // Update without pty changes nothing; with a zero size it is refused.
        let nothing = sbx.unary("process.Process/Update", json!({"process": {"pid": pid}}));
        assert_eq!(nothing.status, 200, "{}", nothing.text());
        let zero = sbx.unary(
            "process.Process/Update",
            json!({"process": {"pid": pid}, "pty": {"size": {"cols": 100}}}),
        );
        assert_eq!(zero.status, 400, "{}", zero.text());
        let resized = sbx.unary(
            "process.Process/Update",
            json!({"process": {"pid": pid}, "pty": {"size": {"cols": 100, "rows": 30}}}),
        );
        assert_eq!(resized.status, 200, "{}", resized.text());
        let typed = sbx.unary(
            "process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"pty": b64("hello\n")}}),
        );
        assert_eq!(typed.status, 200, "{}", typed.text());
        (pid, start.join().unwrap())
    });
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(
        frames
            .iter()
            .all(|(_, f)| f["event"]["data"].get("stdout").is_none()
                && f["event"]["data"].get("stderr").is_none()),
        "a terminal's output comes as data.pty only: {frames:?}"
    );
    let shown: String = frames
        .iter()
        .filter_map(|(_, f)| f["event"]["data"]["pty"].as_str())
        .map(unb64)
        .collect();
    // The first size, the echo of the typed line, the answer, the new size.
    assert_eq!(
        shown,
        "on-a-tty\r\n24 80\r\nhello\r\ngot hello\r\n30 100\r\n"
    );
    let end = frames
        .iter()
        .find_map(|(_, f)| f["event"].get("end").cloned())
        .unwrap();
    assert_eq!(end["exitCode"], 3);

    // The native API shows a terminal's output as stdout.
    let native = daemon.call(
        "GET",
        &format!("/v1/sandboxes/{}/processes/{pid}/output", sbx.id),
        None,
    );
    assert_eq!(native.status, 200, "{}", native.text());
    let stdout: String = native
        .text()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["type"] == "stdout")
        .filter_map(|l| l["data"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(stdout, shown, "{}", native.text());

    // A process on pipes has no terminal to type into or resize.
    let (answer, _) = std::thread::scope(|scope| {
        let start = scope.spawn(|| {
            sbx.stream(
                "process.Process/Start",
                json!({"process": {"cmd": "/bin/sleep", "args": ["60"]}, "tag": "piped"}),
                &[],
            )
        });
        let mut pid = 0;
        assert!(TestDaemon::wait_for(Duration::from_secs(10), || {
            let list = sbx.unary("process.Process/List", json!({})).json();
            if let Some(p) = list["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["tag"] == "piped")
            {
                pid = p["pid"].as_u64().unwrap();
            }
            pid > 0
        }));
        let typed = sbx.unary(
            "process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"pty": b64("x")}}),
        );
        assert_eq!(typed.status, 400, "{}", typed.text());
        let resized = sbx.unary(
            "process.Process/Update",
            json!({"process": {"pid": pid}, "pty": {"size": {"cols": 100, "rows": 30}}}),
        );
        assert_eq!(resized.status, 400, "{}", resized.text());
        let killed = sbx.unary(
            "process.Process/SendSignal",
            json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
        );
        assert_eq!(killed.status, 200, "{}", killed.text());
        start.join().unwrap()
    });
    assert_eq!(answer.status, 200);
}

#[test]
fn a_killed_sandbox_ends_a_running_command_with_an_error() {
    let daemon = TestDaemon::start(&[]);
    let sbx = Sandbox::new(&daemon);
    let (answer, frames) = std::thread::scope(|scope| {
        let start = scope.spawn(|| {
            sbx.stream(
                "process.Process/Start",
                json!({"process": {"cmd": "/bin/sleep", "args": ["60"]}}),
                &[],
            )
        });
        std::thread::sleep(Duration::from_millis(800));
        let deleted = daemon.call("DELETE", &format!("/v1/sandboxes/{}", sbx.id), None);
        assert_eq!(deleted.status, 204);
        start.join().unwrap()
    });
    assert_eq!(answer.status, 200);
    let (flags, last) = frames.last().unwrap();
    assert_eq!(*flags, 2);
    assert!(last["error"]["code"].is_string(), "{last}");
    let health = sbx.raw("GET", "/health", None, None, &[]);
    assert_eq!(health.status, 502);
}

#[test]
fn an_upload_past_the_disk_answers_507_as_envd_and_the_sandbox_lives() {
    let daemon = TestDaemon::start(&[]);
    // A writable layer of 128M: the 300M upload cannot fit.
    let created =
        daemon.create(json!({"limits": {"memory": "256M", "disk": "128M"}, "timeout_s": 120}));
    let sbx = Sandbox {
        daemon: &daemon,
        id: created["id"].as_str().unwrap().to_owned(),
        token: created["access_token"].as_str().unwrap().to_owned(),
    };
    let kept = sbx.raw(
        "POST",
        "/files?path=%2Fhome%2Fuser%2Fkept.txt",
        Some(b"still here"),
        Some("application/octet-stream"),
        &[],
    );
    assert_eq!(kept.status, 200, "{}", kept.text());

    let big = daemon.call_streamed(
        None,
        "POST",
        "/files?path=%2Fhome%2Fuser%2Fbig.bin",
        300 << 20,
        &[
            ("E2b-Sandbox-Id", sbx.id.as_str()),
            ("E2b-Sandbox-Port", "49983"),
            ("X-Access-Token", sbx.token.as_str()),
            ("Content-Type", "application/octet-stream"),
        ],
    );
    assert_eq!(big.status, 507, "{}", big.text());
    assert_eq!(big.json()["code"], 507, "envd's error body");
    assert_eq!(sbx.raw("GET", "/health", None, None, &[]).status, 204);
    let down = sbx.raw(
        "GET",
        "/files?path=%2Fhome%2Fuser%2Fkept.txt",
        None,
        None,
        &[],
    );
    assert_eq!(
        (down.status, down.body.as_slice()),
        (200, &b"still here"[..])
    );
    let (out, _, end) = sbx.run("ls -A /home/user | grep -v '^\\.'; df -k /home/user | tail -1");
    assert_eq!(end["exitCode"].as_i64().unwrap_or(0), 0, "{end}");
    assert!(out.starts_with("kept.txt\n"), "{out}");
}

#[test]
fn the_filesystem_round_trips_and_watches() {
    let daemon = TestDaemon::start(&[]);
    let sbx = Sandbox::new(&daemon);
    assert_eq!(sbx.raw("GET", "/health", None, None, &[]).status, 204);

    let made = sbx.unary(
        "filesystem.Filesystem/MakeDir",
        json!({"path": "/home/user/d/e"}),
    );
    assert_eq!(made.status, 200, "{}", made.text());
    assert_eq!(made.json()["entry"]["type"], "FILE_TYPE_DIRECTORY");
    let again = sbx.unary(
        "filesystem.Filesystem/MakeDir",
        json!({"path": "/home/user/d/e"}),
    );
    assert_eq!(again.status, 409);
    assert_eq!(again.code(), "already_exists");

    // Upload (multipart, as the SDK's write) and download.
    let body = b"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/d/a.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello file\r\n--b0undary--\r\n";
    let up = sbx.raw(
        "POST",
        "/files?path=%2Fhome%2Fuser%2Fd%2Fa.txt",
        Some(body),
        Some("multipart/form-data; boundary=b0undary"),
        &[],
    );
    assert_eq!(up.status, 200, "{}", up.text());
    assert_eq!(
        up.json(),
        json!([{"path": "/home/user/d/a.txt", "name": "a.txt", "type": "file"}])
    );
    let raw = sbx.raw(
        "POST",
        "/files?path=d%2Fraw.bin",
        Some(b"\x00\x01"),
        Some("application/octet-stream"),
        &[],
    );
    assert_eq!(raw.status, 200, "{}", raw.text());
    assert_eq!(raw.json()[0]["path"], "/home/user/d/raw.bin");
    let down = sbx.raw(
        "GET",
        "/files?path=%2Fhome%2Fuser%2Fd%2Fa.txt&username=user",
        None,
        None,
        &[],
    );
    assert_eq!(down.status, 200);
    assert_eq!(down.body, b"hello file");
    let missing = sbx.raw("GET", "/files?path=%2Fnope", None, None, &[]);
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["code"], 404);

    let stat = sbx
        .unary(
            "filesystem.Filesystem/Stat",
            json!({"path": "/home/user/d/a.txt"}),
        )
        .json();
    let entry = &stat["entry"];
    assert_eq!(entry["name"], "a.txt");
    assert_eq!(entry["type"], "FILE_TYPE_FILE");
    assert_eq!(entry["size"], "10");
    assert_eq!(entry["owner"], "user");
    assert!(entry["permissions"].as_str().unwrap().starts_with("-rw"));
    assert!(entry["modifiedTime"].as_str().unwrap().ends_with('Z'));

    let list = sbx
        .unary(
            "filesystem.Filesystem/ListDir",
            json!({"path": "/home/user/d", "depth": 2}),
        )
        .json();
    let mut paths: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "/home/user/d/a.txt",
            "/home/user/d/e",
            "/home/user/d/raw.bin"
        ]
    );

    let moved = sbx.unary(
        "filesystem.Filesystem/Move",
        json!({"source": "/home/user/d/a.txt", "destination": "/home/user/d/b.txt"}),
    );
    assert_eq!(moved.json()["entry"]["path"], "/home/user/d/b.txt");
    assert_eq!(
        sbx.unary(
            "filesystem.Filesystem/Remove",
            json!({"path": "/home/user/d/e"})
        )
        .status,
        200
    );
    let gone = sbx.unary(
        "filesystem.Filesystem/Stat",
        json!({"path": "/home/user/d/e"}),
    );
    assert_eq!((gone.status, gone.code().as_str()), (404, "not_found"));

    // Polled watcher.
    let created = sbx.unary(
        "filesystem.Filesystem/CreateWatcher",
        json!({"path": "/home/user/d"}),
    );
    let watcher = created.json()["watcherId"].as_str().unwrap().to_owned();
    daemon.sh(&sbx.id, "touch /home/user/d/polled");
    let mut names = Vec::new();
    assert!(TestDaemon::wait_for(Duration::from_secs(5), || {
        let events = sbx
            .unary(
                "filesystem.Filesystem/GetWatcherEvents",
                json!({"watcherId": watcher}),
            )
            .json();
        names.extend(
            events["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| (e["name"].clone(), e["type"].clone())),
        );
        names.contains(&(json!("polled"), json!("EVENT_TYPE_CREATE")))
    }));
    assert_eq!(
        sbx.unary(
            "filesystem.Filesystem/RemoveWatcher",
            json!({"watcherId": watcher})
        )
        .status,
        200
    );
    let after = sbx.unary(
        "filesystem.Filesystem/GetWatcherEvents",
        json!({"watcherId": watcher}),
    );
    assert_eq!(after.status, 404);

    // WatchDir: start first, then the change; the call's timeout ends it.
    let (answer, frames) = std::thread::scope(|scope| {
        let watch = scope.spawn(|| {
            sbx.stream(
                "filesystem.Filesystem/WatchDir",
                json!({"path": "/home/user/d", "recursive": false}),
                &[("Connect-Timeout-Ms", "2500")],
            )
        });
        std::thread::sleep(Duration::from_millis(800));
        daemon.sh(&sbx.id, "echo x > /home/user/d/streamed");
        watch.join().unwrap()
    });
    assert_eq!(answer.status, 200);
    assert_eq!(frames[0].1, json!({"start": {}}));
    assert!(
        frames
            .iter()
            .any(|(_, f)| f["filesystem"]
                == json!({"name": "streamed", "type": "EVENT_TYPE_CREATE"})),
        "{frames:?}"
    );
    assert_eq!(
        frames.last().unwrap().1["error"]["code"],
        "deadline_exceeded"
    );
}

/// The metadata and listing calls envd 0.6.2 added, which the SDKs send
/// to the envd version airlock reports: `X-Metadata-*` on uploads kept as
/// `user.e2b.*` extended attributes, shown by stat, list, move and the
/// upload's answer, replaced by the next upload and kept by a rename.
#[test]
fn uploads_keep_metadata_as_envd_0_6_2_does() {
    let daemon = TestDaemon::start(&[]);
    let sbx = Sandbox::new(&daemon);
    let tagged = [
        ("X-Metadata-Author", "Mish"),
        ("X-Metadata-Purpose", "a test"),
    ];
    let up = sbx.raw(
        "POST",
        "/files?path=%2Fhome%2Fuser%2Fm%2Fa.txt",
        Some(b"tagged"),
        Some("application/octet-stream"),
        &tagged,
    );
    if common::on_gvisor() {
        // gVisor's gofer keeps no user extended attributes: refused, and
        // nothing written.
        assert_eq!(up.status, 501, "{}", up.text());
        assert_eq!(up.json()["code"], 501);
        assert!(up.text().contains("extended attributes"), "{}", up.text());
        let stat = sbx.unary(
            "filesystem.Filesystem/Stat",
            json!({"path": "/home/user/m/a.txt"}),
        );
        assert_eq!(stat.status, 404, "{}", stat.text());
        return;
    }
    assert_eq!(up.status, 200, "{}", up.text());
    let metadata = json!({"author": "Mish", "purpose": "a test"});
    assert_eq!(
        up.json(),
        json!([{"path": "/home/user/m/a.txt", "name": "a.txt", "type": "file", "metadata": metadata}])
    );
    // Kept where envd keeps it.
    let (out, _, end) = sbx.run(
        "python3 -c 'import os; print(sorted((n, os.getxattr(\"/home/user/m/a.txt\", n).decode()) \
         for n in os.listxattr(\"/home/user/m/a.txt\")))'",
    );
    assert_eq!(end["exitCode"].as_i64().unwrap_or(0), 0, "{end}");
    assert_eq!(
        out,
        "[('user.e2b.author', 'Mish'), ('user.e2b.purpose', 'a test')]\n"
    );
    let stat = sbx.unary(
        "filesystem.Filesystem/Stat",
        json!({"path": "/home/user/m/a.txt"}),
    );
    assert_eq!(stat.json()["entry"]["metadata"], metadata);
    let list = sbx.unary(
        "filesystem.Filesystem/ListDir",
        json!({"path": "/home/user/m", "depth": 1}),
    );
    assert_eq!(list.json()["entries"][0]["metadata"], metadata);
    // Other `user.*` attributes are not metadata.
    sbx.run("python3 -c 'import os; os.setxattr(\"/home/user/m/a.txt\", \"user.other\", b\"x\")'");
    let stat = sbx.unary(
        "filesystem.Filesystem/Stat",
        json!({"path": "/home/user/m/a.txt"}),
    );
    assert_eq!(stat.json()["entry"]["metadata"], metadata);

    // A rename keeps it.
    let moved = sbx.unary(
        "filesystem.Filesystem/Move",
        json!({"source": "/home/user/m/a.txt", "destination": "/home/user/m/b.txt"}),
    );
    assert_eq!(moved.json()["entry"]["metadata"], metadata);
    // An upload replaces the whole set: a multipart one with one header
    // leaves that one; one with none clears it, as envd's do.
    let body = b"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/m/b.txt\"\r\n\r\nagain\r\n--b0undary--\r\n";
    let up = sbx.raw(
        "POST",
        "/files",
        Some(body),
        Some("multipart/form-data; boundary=b0undary"),
        &[("X-Metadata-Only", "one")],
    );
    assert_eq!(up.status, 200, "{}", up.text());
    assert_eq!(up.json()[0]["metadata"], json!({"only": "one"}));
    let stat = sbx.unary(
        "filesystem.Filesystem/Stat",
        json!({"path": "/home/user/m/b.txt"}),
    );
    assert_eq!(stat.json()["entry"]["metadata"], json!({"only": "one"}));
    let up = sbx.raw(
        "POST",
        "/files?path=%2Fhome%2Fuser%2Fm%2Fb.txt",
        Some(b"plain"),
        Some("application/octet-stream"),
        &[],
    );
    assert_eq!(up.status, 200, "{}", up.text());
    assert!(up.json()[0].get("metadata").is_none(), "{}", up.text());
    let stat = sbx.unary(
        "filesystem.Filesystem/Stat",
        json!({"path": "/home/user/m/b.txt"}),
    );
    assert!(
        stat.json()["entry"].get("metadata").is_none(),
        "{}",
        stat.text()
    );
    let (out, _, _) = sbx.run("cat /home/user/m/b.txt; python3 -c 'import os; print(os.listxattr(\"/home/user/m/b.txt\"))'");
    assert_eq!(out, "plain['user.other']\n");

    // Metadata envd refuses is refused before anything is written.
    let bad = sbx.raw(
        "POST",
        "/files?path=%2Fhome%2Fuser%2Fm%2Fb.txt",
        Some(b"not written"),
        Some("application/octet-stream"),
        &[("X-Metadata-K", "tab\there")],
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert!(
        bad.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid metadata: "),
        "{}",
        bad.text()
    );
    let down = sbx.raw(
        "GET",
        "/files?path=%2Fhome%2Fuser%2Fm%2Fb.txt",
        None,
        None,
        &[],
    );
    assert_eq!(down.body, b"plain");
}

/// Watches as envd 0.6.3 and 0.6.4 answer them: entries on the events that
/// have one (`includeEntry`, polled and streamed), and a volume's bind
/// mount watched like any directory (it is no network mount), changes made
/// from the host included.
#[test]
fn watches_carry_entries_and_see_into_volumes() {
    let daemon = TestDaemon::start(&[]);
    let made = daemon.call("POST", "/v1/volumes", Some(json!({"name": "shared"})));
    assert_eq!(made.status, 201, "{}", made.text());
    let sbx = Sandbox::with(
        &daemon,
        json!({"timeout_s": 120, "volumes": [{"name": "shared", "path": "/mnt/data"}]}),
    );
    daemon.sh_ok(&sbx.id, "mkdir -p /home/user/w");

    // Polled (CreateWatcher / GetWatcherEvents), as the sync SDK watches.
    let created = sbx.unary(
        "filesystem.Filesystem/CreateWatcher",
        json!({"path": "/home/user/w", "includeEntry": true}),
    );
    assert_eq!(created.status, 200, "{}", created.text());
    let watcher = created.json()["watcherId"].as_str().unwrap().to_owned();
    daemon.sh_ok(
        &sbx.id,
        "printf 12345 > /home/user/w/kept; touch /home/user/w/gone; rm /home/user/w/gone",
    );
    let mut events: Vec<Value> = Vec::new();
    assert!(TestDaemon::wait_for(Duration::from_secs(5), || {
        let polled = sbx
            .unary(
                "filesystem.Filesystem/GetWatcherEvents",
                json!({"watcherId": watcher}),
            )
            .json();
        events.extend(polled["events"].as_array().unwrap().iter().cloned());
        events
            .iter()
            .any(|e| e["name"] == "gone" && e["type"] == "EVENT_TYPE_REMOVE")
    }));
    let kept: Vec<&Value> = events.iter().filter(|e| e["name"] == "kept").collect();
    assert!(
        kept.iter()
            .any(|e| e["entry"]["path"] == "/home/user/w/kept"
                && e["entry"]["type"] == "FILE_TYPE_FILE"),
        "{events:?}"
    );
    for event in &events {
        if event["type"] == "EVENT_TYPE_REMOVE" || event["type"] == "EVENT_TYPE_RENAME" {
            assert!(event.get("entry").is_none(), "{event}");
        }
    }

    // Streamed (WatchDir), as the async SDK watches, on the volume.
    let (answer, frames) = std::thread::scope(|scope| {
        let watch = scope.spawn(|| {
            sbx.stream(
                "filesystem.Filesystem/WatchDir",
                json!({"path": "/mnt/data", "includeEntry": true}),
                &[("Connect-Timeout-Ms", "3000")],
            )
        });
        std::thread::sleep(Duration::from_millis(800));
        daemon.sh_ok(&sbx.id, "echo inside > /mnt/data/inside.txt");
        let put = daemon.call_as(
            Some(&daemon.key),
            "PUT",
            "/v1/volumes/shared/file?path=/host.txt",
            Some(b"from the host"),
            Some("application/octet-stream"),
            &[],
        );
        assert_eq!(put.status / 100, 2, "{}", put.text());
        watch.join().unwrap()
    });
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(frames[0].1, json!({"start": {}}));
    let seen = |name: &str| {
        frames.iter().any(|(_, f)| {
            f["filesystem"]["name"] == name
                && f["filesystem"]["type"] == "EVENT_TYPE_CREATE"
                && f["filesystem"]["entry"]["name"] == name
        })
    };
    assert!(seen("inside.txt"), "{frames:?}");
    // gVisor's inotify sees only what goes through its own kernel.
    if !common::on_gvisor() {
        assert!(seen("host.txt"), "{frames:?}");
    }

    // A path that is not there is envd's not_found.
    let missing = sbx.unary(
        "filesystem.Filesystem/CreateWatcher",
        json!({"path": "/home/user/none", "allowNetworkMounts": true}),
    );
    assert_eq!(missing.status, 404, "{}", missing.text());
}

#[test]
fn list_dir_answers_100000_entries_whole_and_refuses_past_its_cap() {
    let daemon = TestDaemon::start(&[]);
    let sbx = Sandbox::with(
        &daemon,
        json!({"timeout_s": 600, "limits": {"memory": "1G", "disk": "256M"}}),
    );
    let make = |dir: &str| {
        let (out, _, end) = sbx.run(&format!(
            "python3 -c \"import os\n\
             os.makedirs('{dir}')\n\
             for i in range(100000): open('{dir}/f%06d' % i, 'w').close()\""
        ));
        assert_eq!(end["status"], "exit status 0", "{out} {end}");
    };
    make("/home/user/big/a");
    let list = sbx.unary(
        "filesystem.Filesystem/ListDir",
        json!({"path": "/home/user/big/a", "depth": 1}),
    );
    assert_eq!(list.status, 200, "{}", list.text());
    let list = list.json();
    let entries = list["entries"].as_array().unwrap();
    let names: std::collections::BTreeSet<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(entries.len(), 100_000);
    assert_eq!(names.len(), 100_000, "every name once");
    assert!(names.contains("f000000") && names.contains("f099999"));
    assert_eq!(entries[0]["type"], "FILE_TYPE_FILE");
    assert_eq!(entries[0]["size"], "0");

    // Past the cap (200,000 entries) the answer is a clear error.
    make("/home/user/big/b");
    make("/home/user/big/c");
    let over = sbx.unary(
        "filesystem.Filesystem/ListDir",
        json!({"path": "/home/user/big", "depth": 2}),
    );
    assert_eq!(
        (over.status, over.code().as_str()),
        (429, "resource_exhausted"),
        "{}",
        over.text()
    );
    assert!(over.json()["message"]
        .as_str()
        .unwrap()
        .contains("more than 200000 entries"));
}

#[test]
fn credentials_and_sandboxes_are_checked() {
    let daemon = TestDaemon::start(&[]);
    let sbx = Sandbox::new(&daemon);
    let other = Sandbox::new(&daemon);
    let list = |id: &str, token: &str| {
        daemon.call_as(
            None,
            "POST",
            "/process.Process/List",
            Some(b"{}"),
            Some("application/json"),
            &[("E2b-Sandbox-Id", id), ("X-Access-Token", token)],
        )
    };
    assert_eq!(list(&sbx.id, &sbx.token).status, 200);
    let wrong = list(&sbx.id, &other.token);
    assert_eq!(
        (wrong.status, wrong.code().as_str()),
        (401, "unauthenticated")
    );
    let unknown = list("sbx-0123456789abcdef", &sbx.token);
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (404, "not_found")
    );
    // An API key works too.
    let keyed = daemon.call_as(
        Some(&daemon.key),
        "POST",
        "/process.Process/List",
        Some(b"{}"),
        Some("application/json"),
        &[("E2b-Sandbox-Id", &sbx.id)],
    );
    assert_eq!(keyed.status, 200, "{}", keyed.text());
    // The code interpreter's port runs code with the access token…
    let interpreter = daemon.call_as(
        None,
        "POST",
        "/execute",
        Some(br#"{"code": "print('in'); 40 + 2"}"#),
        Some("application/json"),
        &[
            ("E2b-Sandbox-Id", &sbx.id),
            ("E2b-Sandbox-Port", "49999"),
            ("X-Access-Token", &sbx.token),
        ],
    );
    assert_eq!(interpreter.status, 200, "{}", interpreter.text());
    let lines: Vec<serde_json::Value> = interpreter
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines
        .iter()
        .any(|l| l["type"] == "stdout" && l["text"] == "in\n"));
    assert!(lines
        .iter()
        .any(|l| l["type"] == "result" && l["text"] == "42" && l["is_main_result"] == true));
    assert_eq!(lines.last().unwrap()["type"], "end_of_execution");
    // …and refuses a call without credentials or with a wrong traffic token.
    for headers in [
        vec![
            ("E2b-Sandbox-Id", sbx.id.as_str()),
            ("E2b-Sandbox-Port", "49999"),
        ],
        vec![
            ("E2b-Sandbox-Id", sbx.id.as_str()),
            ("E2b-Sandbox-Port", "49999"),
            ("E2B-Traffic-Access-Token", "tt_0000"),
        ],
    ] {
        let refused = daemon.call_as(None, "GET", "/contexts", None, None, &headers);
        assert_eq!(refused.status, 401, "{}", refused.text());
    }
    // Files without credentials need a valid signature.
    let unsigned = daemon.call_as(
        None,
        "GET",
        "/files?path=%2Fetc%2Fhostname&signature=v1_bad",
        None,
        None,
        &[("E2b-Sandbox-Id", &sbx.id)],
    );
    assert_eq!(unsigned.status, 401);
}
