//! A real `airlock serve` on an ephemeral port and a temporary data
//! directory, and a small HTTP client for it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use super::{binary, require_root};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A daemon under test. Dropping it deletes every sandbox it still has
/// (sandboxes outlive the daemon by design) and stops it.
pub struct TestDaemon {
    child: Option<Child>,
    pub url: String,
    pub key: String,
    data_dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
    pub log: Arc<Mutex<String>>,
    extra: Vec<String>,
    /// A command the daemon runs under (e.g. `prlimit …`), if any.
    wrapper: Vec<String>,
    agent: ureq::Agent,
}

/// An answer: status, headers we care about, body.
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}), status {}: {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The NDJSON lines of a stream.
    pub fn lines(&self) -> Vec<Value> {
        self.text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The `code` of an error answer.
    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }
}

/// The HTTP client the test daemons' helpers use (no proxy, statuses
/// are answers, a global timeout so a daemon that stops answering fails a
/// test instead of hanging it).
/// A request as the e2b SDK sends it: `X-API-KEY` and a JSON body.
pub fn e2b(daemon: &TestDaemon, method: &str, path: &str, body: Option<Value>) -> Answer {
    let bytes = body.map(|b| b.to_string().into_bytes());
    daemon.call_as(
        Some(&daemon.key),
        method,
        path,
        bytes.as_deref(),
        bytes.as_ref().map(|_| "application/json"),
        &[("User-Agent", "e2b-python-sdk/2.63.0")],
    )
}

pub fn agent() -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .no_delay(true)
        .proxy(None)
        // A daemon that stops answering fails the test instead of hanging it.
        .timeout_global(Some(Duration::from_secs(300)))
        .build();
    ureq::Agent::new_with_config(config)
}

impl TestDaemon {
    /// Starts a daemon with `extra` flags on a fresh data directory.
    pub fn start(extra: &[&str]) -> TestDaemon {
        TestDaemon::start_under(&[], extra)
    }

    /// Starts a daemon with `extra` flags under `wrapper` (a command that
    /// runs the rest of its command line, such as `prlimit --nofile=N`).
    pub fn start_under(wrapper: &[&str], extra: &[&str]) -> TestDaemon {
        require_root();
        let temp = tempfile::tempdir().unwrap();
        let data_dir = temp.path().join("data");
        let mut daemon = TestDaemon {
            child: None,
            url: String::new(),
            key: String::new(),
            data_dir,
            _temp: Some(temp),
            log: Arc::default(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            wrapper: wrapper.iter().map(|s| s.to_string()).collect(),
            agent: agent(),
        };
        daemon.launch();
        daemon
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    fn launch(&mut self) {
        let mut command = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary());
                command
            }
            None => Command::new(binary()),
        };
        let mut child = command
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&self.data_dir)
            // A create that names no tier runs on AIRLOCK_TEST_TIER's.
            .arg("--default-tier")
            .arg(super::test_tier())
            .args(&self.extra)
            .env("AIRLOCK_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("airlock serve starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let log = Arc::clone(&self.log);
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("serving on ").nth(1) {
                    if let Some(tx) = tx.take() {
                        let url = rest
                            .split_whitespace()
                            .next()
                            .unwrap_or_default()
                            .to_owned();
                        let _ = tx.send(url);
                    }
                }
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let Ok(url) = rx.recv_timeout(Duration::from_secs(30)) else {
            // Not left running (and holding its sandboxes) past the test.
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the daemon did not start serving; its log:\n{}",
                self.log.lock().unwrap()
            )
        };
        self.url = url;
        self.key = std::fs::read_to_string(self.data_dir.join("admin.key"))
            .unwrap()
            .trim()
            .to_owned();
        self.child = Some(child);
    }

    /// `kill -9` of the daemon (its sandboxes live on).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Starts the daemon again on the same data directory.
    pub fn restart(&mut self) {
        self.kill9();
        self.launch();
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Stops the daemon as a service manager would (SIGTERM) and waits for
    /// it; unlike dropping it, deletes nothing first. Its sandboxes live on.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let _ = child.wait();
        }
    }

    /// The tag of this daemon's supervisors and sockets directory
    /// (`<data-dir>/instance`).
    pub fn instance(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("instance"))
            .expect("the daemon tags its sandboxes (<data-dir>/instance)")
            .trim()
            .to_owned()
    }

    /// A request with `key` (or none) and optional JSON or raw body.
    pub fn call_as(
        &self,
        key: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        content_type: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let url = format!("{}{path}", self.url);
        let mut builder = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(key) = key {
            builder = builder.header("X-API-Key", key);
        }
        if let Some(ct) = content_type {
            builder = builder.header("Content-Type", ct);
        }
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let result = match body {
            Some(bytes) => self.agent.run(builder.body(bytes.to_vec()).unwrap()),
            None => self.agent.run(builder.body(()).unwrap()),
        };
        let mut response = result.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let retry_after = header("retry-after");
        let content_type = header("content-type");
        let body = response
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_vec()
            .unwrap_or_default();
        Answer {
            status: response.status().as_u16(),
            retry_after,
            content_type,
            body,
        }
    }

    /// A request whose body is `len` bytes of `x` streamed without a
    /// length (chunked), as a large upload is sent; no copy is held.
    pub fn call_streamed(
        &self,
        key: Option<&str>,
        method: &str,
        path: &str,
        len: u64,
        headers: &[(&str, &str)],
    ) -> Answer {
        use std::io::Read;
        let url = format!("{}{path}", self.url);
        let mut builder = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(key) = key {
            builder = builder.header("X-API-Key", key);
        }
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut source = std::io::repeat(b'x').take(len);
        let request = builder
            .body(ureq::SendBody::from_reader(&mut source))
            .unwrap();
        // A server that answers and closes before the body is sent breaks
        // the send: status 0 with the error as the body.
        let mut response = match self.agent.run(request) {
            Ok(response) => response,
            Err(e) => {
                return Answer {
                    status: 0,
                    retry_after: None,
                    content_type: None,
                    body: format!("{method} {path}: {e}").into_bytes(),
                }
            }
        };
        let body = response
            .body_mut()
            .with_config()
            .limit(1 << 20)
            .read_to_vec()
            .unwrap_or_default();
        Answer {
            status: response.status().as_u16(),
            retry_after: None,
            content_type: None,
            body,
        }
    }

    /// `airlock ARGS --url URL --api-key KEY` against this daemon.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(binary())
            .args(args)
            .args(["--url", &self.url, "--api-key", &self.key])
            .output()
            .unwrap()
    }

    /// A new API key named `name` that is not an admin's (`airlock keys
    /// create --json` on the data directory): its `id` and `key`.
    pub fn new_key(&self, name: &str) -> Value {
        let output = Command::new(binary())
            .args(["keys", "create", name, "--json", "--data-dir"])
            .arg(self.data_dir())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// A request with the admin key.
    /// The value of the metric line `name` (with its labels, if any) of
    /// `GET /metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.call("GET", "/metrics", None).text();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }

    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        let bytes = body.map(|b| b.to_string().into_bytes());
        self.call_as(
            Some(&self.key),
            method,
            path,
            bytes.as_deref(),
            bytes.as_ref().map(|_| "application/json"),
            &[],
        )
    }

    /// Creates a sandbox from `body` (one that names no tier runs on
    /// `AIRLOCK_TEST_TIER`'s, the daemon's default); panics unless 201.
    pub fn create(&self, body: Value) -> Value {
        let answer = self.call("POST", "/v1/sandboxes", Some(body));
        assert_eq!(answer.status, 201, "create: {}", answer.text());
        answer.json()
    }

    /// Runs `sh -c script` in `id`; the NDJSON events.
    pub fn sh(&self, id: &str, script: &str) -> Vec<Value> {
        let answer = self.call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(serde_json::json!({"cmd": "/bin/sh", "args": ["-c", script]})),
        );
        assert_eq!(answer.status, 200, "exec: {}", answer.text());
        answer.lines()
    }

    /// Stdout of `sh -c script` and its exit code.
    pub fn sh_out(&self, id: &str, script: &str) -> (String, i64) {
        let events = self.sh(id, script);
        let mut out = String::new();
        let mut code = -1;
        for event in &events {
            match event["type"].as_str() {
                Some("stdout") => out.push_str(event["data"].as_str().unwrap_or_default()),
                Some("exited") => code = event["exit_code"].as_i64().unwrap_or(-1),
                _ => {}
            }
        }
        (out, code)
    }

    /// Starts, in sandbox `id`, a process holding state in memory: it
    /// counts from its own variable, one line each 50 ms, into /tmp/count.
    pub fn start_counter(&self, id: &str) {
        let started = self.call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(serde_json::json!({"cmd": "/bin/sh", "args": ["-c",
                "i=0; while :; do i=$((i+1)); echo $i >> /tmp/count; sleep 0.05; done"],
                "background": true})),
        );
        assert_eq!(started.status, 201, "{id}: {}", started.text());
    }

    /// Runs `script` in `id`, which must succeed; its output.
    pub fn sh_ok(&self, id: &str, script: &str) -> String {
        let (out, code) = self.sh_out(id, script);
        assert_eq!(code, 0, "{id}: {script}: {out}");
        out
    }

    /// Deletes every sandbox that is not dead.
    pub fn delete_all(&self) {
        let answer = self.call("GET", "/v1/sandboxes?limit=1000", None);
        if answer.status != 200 {
            return;
        }
        for item in answer.json()["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            if item["state"] != "dead" {
                let id = item["id"].as_str().unwrap();
                self.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
            }
        }
    }

    /// Waits until `check` holds, at most `limit`.
    pub fn wait_for(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if check() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        check()
    }
}

/// The `id` of a sandbox (or snapshot) view.
pub fn id_of(value: &Value) -> String {
    value["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {value}"))
        .to_owned()
}

/// A request with `key` and an optional JSON body to the daemon at `url`,
/// through `agent`; a connection that fails (the daemon is down, or was
/// killed mid-request) is an `Err` instead of a panic.
pub fn try_call(
    agent: &ureq::Agent,
    url: &str,
    key: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Answer, String> {
    let mut builder = ureq::http::Request::builder()
        .method(method)
        .uri(format!("{url}{path}"))
        .header("X-API-Key", key);
    let result = match body {
        Some(value) => {
            builder = builder.header("Content-Type", "application/json");
            agent.run(
                builder
                    .body(value.to_string().into_bytes())
                    .map_err(|e| e.to_string())?,
            )
        }
        None => agent.run(builder.body(()).map_err(|e| e.to_string())?),
    };
    let mut response = result.map_err(|e| format!("{method} {path}: {e}"))?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let retry_after = header("retry-after");
    let content_type = header("content-type");
    // A stream cut short (its daemon or agent killed) is an error too.
    let body = response
        .body_mut()
        .with_config()
        .limit(1 << 26)
        .read_to_vec()
        .map_err(|e| format!("{method} {path}: reading the answer: {e}"))?;
    Ok(Answer {
        status: response.status().as_u16(),
        retry_after,
        content_type,
        body,
    })
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.delete_all();
        }
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let _ = child.wait();
        }
        // The disk store of this daemon's data directory (a loop mount)
        // goes with it; detached, since a sandbox left running on purpose
        // may still hold its layer.
        let disk = self.data_dir.join("disk");
        if std::fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|m| m.contains(&format!(" {} ", disk.display())))
        {
            let _ = Command::new("umount").arg("-l").arg(&disk).status();
        }
    }
}

/// Host processes whose command line mentions `airlock supervise` for `id`
/// (or any sandbox when `id` is empty).
pub fn supervisors(id: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "supervise") && (id.is_empty() || args.iter().any(|a| a == id))
        {
            pids.push(pid);
        }
    }
    pids
}

/// Asserts nothing of sandbox `id` is left on the host: no supervisor, no
/// socket, no cgroup, no slot record, no process with a sandbox uid.
pub fn assert_sandbox_gone(id: &str) {
    assert!(
        supervisors(id).is_empty(),
        "the supervisor of {id} is still running"
    );
    let socket = format!("{id}.sock");
    for dir in std::fs::read_dir("/run/airlock/sockets")
        .into_iter()
        .flatten()
        .flatten()
    {
        assert!(
            !dir.path().join(&socket).exists(),
            "the socket of {id} is left in {}",
            dir.path().display()
        );
    }
    super::assert_no_leftovers(id);
}

/// Daemon starts sweep host-wide leftovers: one such test at a time.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stops, when dropped, every supervisor still running for the ids it was
/// given (continued first, in case a test stopped it), then removes what
/// their supervisors leave for a daemon that will not come back (the
/// `<id>.ended` files, and a sockets directory left empty): a test that
/// kills its daemon for good, or fails while it is down, leaves nothing
/// behind. Declare it before the daemon, so the daemon's own cleanup goes
/// first.
#[derive(Default)]
pub struct SupervisorCleanup(Mutex<Vec<String>>);

impl SupervisorCleanup {
    pub fn add(&self, id: &str) {
        self.0.lock().unwrap().push(id.to_owned());
    }
}

impl Drop for SupervisorCleanup {
    fn drop(&mut self) {
        let ids = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        for id in ids {
            for pid in supervisors(&id) {
                for signal in [libc::SIGCONT, libc::SIGTERM] {
                    // SAFETY: kill(2) of a pid whose command line was just
                    // read as this sandbox's supervisor; SIGTERM makes it
                    // tear down; at worst the call fails.
                    unsafe {
                        libc::kill(pid as i32, signal);
                    }
                }
            }
            TestDaemon::wait_for(Duration::from_secs(10), || supervisors(&id).is_empty());
            let Ok(dirs) = std::fs::read_dir("/run/airlock/sockets") else {
                continue;
            };
            for dir in dirs.flatten() {
                let ended = dir.path().join(format!("{id}.ended"));
                if std::fs::remove_file(&ended).is_ok() {
                    // Only if nothing else is in it.
                    let _ = std::fs::remove_dir(dir.path());
                }
            }
        }
    }
}
