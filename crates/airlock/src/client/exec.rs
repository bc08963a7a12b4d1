//! `airlock exec ID [OPTIONS] -- CMD ARGS...`: runs a command in a sandbox
//! through `POST /v1/sandboxes/{id}/exec` and follows its NDJSON stream.
//!
//! Output is written to our stdout and stderr as it arrives. When our stdin
//! has something to give (it is neither a terminal nor /dev/null), the
//! process is started with `"stdin": true` and a second thread copies our
//! stdin to it in chunks, one `POST …/stdin` each, then closes it. SIGINT,
//! SIGTERM and SIGHUP are forwarded to the process; the third one makes us
//! stop waiting. Exit codes are those of `airlock run`: the process's code,
//! 128+N when signal N killed it (137 at a timeout), 127/126 when it cannot
//! be found/executed, 125 when airlock itself failed.

use anyhow::{anyhow, Context, Result};
use base64::Engine as _;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use super::format::{parse_kv, parse_timeout_secs};
use super::http::{sandbox_path, Api, ClientError, Connection};

/// Options of `airlock exec`.
#[derive(Args)]
pub struct ExecArgs {
    /// The sandbox.
    pub(super) id: String,
    /// Environment variable of the command, added to the sandbox's (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_kv)]
    pub(super) env: Vec<(String, String)>,
    /// Working directory inside the sandbox.
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Identity of the command: `user` (uid 1000, the default) or `root`
    /// (root only inside the sandbox's user namespace).
    #[arg(long, value_enum)]
    user: Option<User>,
    /// Wall-clock limit of the command (`30s`, `5m`); it is killed at it.
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout_secs)]
    pub(super) timeout: Option<u64>,
    /// Start the command and print its pid instead of waiting for it (its
    /// output is kept by the daemon).
    #[arg(long)]
    background: bool,
    /// Print one JSON result object at the end instead of streaming output
    /// (with --background: the daemon's answer).
    #[arg(long)]
    json: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(super) command: Vec<String>,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// Who the command runs as.
#[derive(Clone, Copy, ValueEnum)]
enum User {
    User,
    Root,
}

/// One line of the exec stream.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    Started {
        pid: u32,
    },
    Stdout(Chunk),
    Stderr(Chunk),
    Exited(Exited),
    Error {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    },
    /// A kind of event this client does not know yet.
    #[serde(other)]
    Other,
}

/// Output bytes: text when they are valid UTF-8, base64 otherwise.
#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    data_b64: Option<String>,
}

impl Chunk {
    fn into_bytes(self) -> Result<Vec<u8>> {
        match (self.data, self.data_b64) {
            (Some(text), _) => Ok(text.into_bytes()),
            (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .context("the exec stream sent output that is not valid base64"),
            (None, None) => Ok(Vec::new()),
        }
    }
}

/// How the process ended, as the `exited` event says.
#[derive(Debug, Default, Deserialize)]
struct Exited {
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    exit_code: Option<i32>,
    /// A number, or a name such as `SIGKILL`.
    #[serde(default)]
    signal: Option<Value>,
    #[serde(default)]
    oom: bool,
    #[serde(default)]
    timed_out: bool,
    #[serde(default)]
    duration_ms: Option<u64>,
    #[serde(default)]
    stdout_truncated: bool,
    #[serde(default)]
    stderr_truncated: bool,
}

impl Exited {
    fn signal_number(&self) -> Option<i32> {
        signal_number(self.signal.as_ref()?)
    }

    /// The exit code a shell would report: the code, 128+N for signal N, 137
    /// (SIGKILL) for a timeout that says neither.
    fn shell_code(&self) -> i32 {
        match (self.exit_code, self.signal_number()) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) if self.timed_out => 128 + libc::SIGKILL,
            (None, None) => 255,
        }
    }
}

/// A signal as a number: `9`, `"9"`, `"SIGKILL"` or `"KILL"`.
fn signal_number(value: &Value) -> Option<i32> {
    if let Some(n) = value.as_i64() {
        return i32::try_from(n).ok();
    }
    let name = value.as_str()?.trim();
    if let Ok(n) = name.parse() {
        return Some(n);
    }
    let name = name.strip_prefix("SIG").unwrap_or(name);
    Some(match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "ILL" => libc::SIGILL,
        "TRAP" => libc::SIGTRAP,
        "ABRT" => libc::SIGABRT,
        "BUS" => libc::SIGBUS,
        "FPE" => libc::SIGFPE,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "SEGV" => libc::SIGSEGV,
        "USR2" => libc::SIGUSR2,
        "PIPE" => libc::SIGPIPE,
        "ALRM" => libc::SIGALRM,
        "TERM" => libc::SIGTERM,
        "XCPU" => libc::SIGXCPU,
        "XFSZ" => libc::SIGXFSZ,
        "SYS" => libc::SIGSYS,
        _ => return None,
    })
}

/// How the stream ended.
#[derive(Debug)]
enum Ending {
    Exited(Exited),
    /// The process could not start (an `error` event).
    Failed {
        code: String,
        message: String,
    },
}

impl Ending {
    /// Our exit code for it, as `airlock run` has them.
    fn exit_code(&self) -> i32 {
        match self {
            Ending::Exited(exited) => exited.shell_code(),
            Ending::Failed { code, .. } => match code.as_str() {
                "not_found" => 127,
                // The daemon's codes for "permission denied" and for "not
                // executable" (or a directory): both "cannot execute".
                "forbidden" | "bad_request" => 126,
                _ => i32::from(airlock::EXIT_INTERNAL),
            },
        }
    }
}

/// Where output goes: straight through (people) or into buffers (`--json`).
enum Sink<'a> {
    Through {
        stdout: &'a mut dyn Write,
        stderr: &'a mut dyn Write,
    },
    Collect {
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    },
}

impl Sink<'_> {
    fn write(&mut self, to_stderr: bool, bytes: &[u8]) {
        match self {
            // A closed stdout of ours must not stop us from learning the
            // exit code.
            Sink::Through { stdout, stderr } => {
                let out: &mut dyn Write = if to_stderr { *stderr } else { *stdout };
                let _ = out.write_all(bytes).and_then(|()| out.flush());
            }
            Sink::Collect { stdout, stderr } => {
                if to_stderr {
                    stderr.extend_from_slice(bytes);
                } else {
                    stdout.extend_from_slice(bytes);
                }
            }
        }
    }
}

/// Follows an exec stream to its end; calls `started` with the pid once the
/// process runs.
fn follow(reader: impl Read, sink: &mut Sink, started: &mut dyn FnMut(u32)) -> Result<Ending> {
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = reader
            .read_until(b'\n', &mut line)
            .context("the exec stream broke off")?;
        if read == 0 {
            return Err(anyhow!(
                "the daemon closed the exec stream before the process exited"
            ));
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let event: Event = serde_json::from_slice(&line).with_context(|| {
            format!(
                "the exec stream sent a line that is not an event: {}",
                String::from_utf8_lossy(&line).trim_end()
            )
        })?;
        match event {
            Event::Started { pid } => started(pid),
            Event::Stdout(chunk) => sink.write(false, &chunk.into_bytes()?),
            Event::Stderr(chunk) => sink.write(true, &chunk.into_bytes()?),
            Event::Exited(exited) => return Ok(Ending::Exited(exited)),
            Event::Error { code, message } => return Ok(Ending::Failed { code, message }),
            Event::Other => {}
        }
    }
}

/// The `--json` result.
#[derive(Serialize)]
struct ExecResult {
    sandbox_id: String,
    pid: Option<u32>,
    exit_code: i32,
    signal: Option<i32>,
    oom: bool,
    timed_out: bool,
    duration_ms: Option<u64>,
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The request body.
fn exec_body(args: &ExecArgs, stdin: bool) -> Result<Value> {
    let (cmd, rest) = args
        .command
        .split_first()
        .ok_or_else(|| ClientError::Usage("exec needs a command after `--`".to_owned()))?;
    let mut body = Map::new();
    body.insert("cmd".into(), json!(cmd));
    body.insert("args".into(), json!(rest));
    if !args.env.is_empty() {
        let env: Map<String, Value> = args
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        body.insert("env".into(), Value::Object(env));
    }
    if let Some(cwd) = &args.cwd {
        body.insert("cwd".into(), json!(cwd));
    }
    if let Some(user) = args.user {
        let user = match user {
            User::User => "user",
            User::Root => "root",
        };
        body.insert("user".into(), json!(user));
    }
    if let Some(timeout) = args.timeout {
        body.insert("timeout_s".into(), json!(timeout));
    }
    body.insert("stdin".into(), json!(stdin));
    body.insert("background".into(), json!(args.background));
    Ok(Value::Object(body))
}

/// Runs `airlock exec`; its exit code.
pub fn main(args: &ExecArgs) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(error) => super::fail(&error, airlock::EXIT_INTERNAL),
    }
}

fn run(args: &ExecArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let forward_stdin = stdin_has_input();
    let body = exec_body(args, forward_stdin)?;
    let path = sandbox_path(&args.id, "/exec");
    if args.background {
        return background(&api, args, &path, &body, forward_stdin);
    }
    let pid = Arc::new(OnceLock::new());
    forward_signals(api.clone(), args.id.clone(), Arc::clone(&pid))?;
    let response = api.post_json_response(&path, &body)?;
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let mut sink = if args.json {
        Sink::Collect {
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    } else {
        Sink::Through {
            stdout: &mut stdout,
            stderr: &mut stderr,
        }
    };
    let mut started = |started: u32| {
        let _ = pid.set(started);
        if forward_stdin {
            let api = api.clone();
            let id = args.id.clone();
            std::thread::spawn(move || copy_stdin(&api, &id, started));
        }
    };
    let ending = follow(response.into_body().into_reader(), &mut sink, &mut started)?;
    let code = ending.exit_code();
    let pid = pid.get().copied();
    let shown_pid = pid.map_or_else(|| "?".to_owned(), |pid| pid.to_string());
    match &ending {
        Ending::Failed { message, .. } => {
            let cmd = args.command.first().map_or("", String::as_str);
            eprintln!("airlock: cannot run `{cmd}`: {message}");
        }
        Ending::Exited(exited) if exited.timed_out && !args.json => match args.timeout {
            Some(seconds) => {
                eprintln!("airlock: process {shown_pid} killed at its {seconds}s timeout")
            }
            None => eprintln!("airlock: process {shown_pid} timed out"),
        },
        Ending::Exited(exited) if exited.oom && !args.json => {
            eprintln!(
                "airlock: process {shown_pid} ran out of memory (the memory limit of sandbox {})",
                args.id
            );
        }
        Ending::Exited(_) => {}
    }
    if let Sink::Collect { stdout, stderr } = sink {
        let result = exec_result(&args.id, pid, &ending, &stdout, &stderr);
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string(&result)?)?;
        out.flush()?;
    }
    Ok(ExitCode::from((code & 0xff) as u8))
}

fn exec_result(
    sandbox_id: &str,
    pid: Option<u32>,
    ending: &Ending,
    stdout: &[u8],
    stderr: &[u8],
) -> ExecResult {
    let none = Exited::default();
    let (exited, error) = match ending {
        Ending::Exited(exited) => (exited, None),
        Ending::Failed { code, message } => (&none, Some(format!("{message} ({code})"))),
    };
    ExecResult {
        sandbox_id: sandbox_id.to_owned(),
        pid: exited.pid.or(pid),
        exit_code: ending.exit_code(),
        signal: exited.signal_number(),
        oom: exited.oom,
        timed_out: exited.timed_out,
        duration_ms: exited.duration_ms,
        stdout: String::from_utf8_lossy(stdout).into_owned(),
        stderr: String::from_utf8_lossy(stderr).into_owned(),
        stdout_truncated: exited.stdout_truncated,
        stderr_truncated: exited.stderr_truncated,
        error,
    }
}

/// `--background`: the pid (or the answer with `--json`), then our stdin
/// copied to the process when there is any.
fn background(
    api: &Api,
    args: &ExecArgs,
    path: &str,
    body: &Value,
    forward_stdin: bool,
) -> Result<ExitCode> {
    let answer = api.post_json(path, body)?;
    let pid = answer
        .get("pid")
        .and_then(Value::as_u64)
        .and_then(|pid| u32::try_from(pid).ok())
        .ok_or_else(|| anyhow!("the daemon's answer to a background exec has no pid: {answer}"))?;
    {
        let mut out = std::io::stdout().lock();
        if args.json {
            writeln!(out, "{answer}")?;
        } else {
            writeln!(out, "{pid}")?;
        }
        out.flush()?;
    }
    if forward_stdin {
        copy_stdin(api, &args.id, pid);
    }
    Ok(ExitCode::SUCCESS)
}

/// True when our stdin may carry input for the process: not a terminal (a
/// person typing is not what `exec` forwards), not /dev/null, and open.
fn stdin_has_input() -> bool {
    use std::os::unix::fs::MetadataExt;
    if std::io::stdin().is_terminal() {
        return false;
    }
    let Ok(stdin) = rustix::fs::fstat(rustix::stdio::stdin()) else {
        return false;
    };
    let is_null = std::fs::metadata("/dev/null").is_ok_and(|null| {
        (stdin.st_mode & libc::S_IFMT) == libc::S_IFCHR && stdin.st_rdev == null.rdev()
    });
    !is_null
}

/// Copies our stdin to process `pid` in chunks as they come, then closes its
/// stdin. Stops quietly when the process no longer takes input.
fn copy_stdin(api: &Api, id: &str, pid: u32) {
    let path = sandbox_path(id, &format!("/processes/{pid}/stdin"));
    let mut stdin = std::io::stdin().lock();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match stdin.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                if api.post_bytes(&path, &buffer[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = api.post_bytes(&format!("{path}/close"), &[]);
}

/// Forwards SIGINT, SIGTERM and SIGHUP to the process once it runs. Before
/// that, or when forwarding fails, or at the third signal, we leave with
/// 128+N as if the signal had killed us.
fn forward_signals(api: Api, id: String, pid: Arc<OnceLock<u32>>) -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("cannot handle signals")?;
    std::thread::spawn(move || {
        for (count, signal) in signals.forever().enumerate() {
            let Some(&pid) = pid.get() else {
                std::process::exit(128 + signal);
            };
            let path = sandbox_path(&id, &format!("/processes/{pid}/signal"));
            let name = match signal {
                SIGINT => "SIGINT",
                SIGTERM => "SIGTERM",
                _ => "SIGHUP",
            };
            let sent = api.post_json(&path, &json!({ "signal": name }));
            if sent.is_err() || count >= 2 {
                eprintln!("airlock: stopped waiting for process {pid}; it may still be running");
                std::process::exit(128 + signal);
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{chunk, end_chunks, respond, start_chunked, FakeServer};
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn events(lines: &str) -> (Result<Ending>, Vec<u8>, Vec<u8>, Vec<u32>) {
        let mut sink = Sink::Collect {
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        let mut pids = Vec::new();
        let ending = follow(lines.as_bytes(), &mut sink, &mut |pid| pids.push(pid));
        let Sink::Collect { stdout, stderr } = sink else {
            unreachable!()
        };
        (ending, stdout, stderr, pids)
    }

    #[test]
    fn decodes_text_and_base64_output() {
        let (ending, stdout, stderr, pids) = events(
            "{\"type\":\"started\",\"pid\":12}\n\
             {\"type\":\"stdout\",\"data\":\"hé\\n\"}\n\
             \n\
             {\"type\":\"stdout\",\"data_b64\":\"/w==\"}\n\
             {\"type\":\"stderr\",\"data\":\"oops\"}\n\
             {\"type\":\"progress\",\"whatever\":1}\n\
             {\"type\":\"exited\",\"pid\":12,\"exit_code\":3,\"signal\":null,\"oom\":false,\"timed_out\":false,\"duration_ms\":4}\n",
        );
        assert_eq!(pids, vec![12]);
        assert_eq!(stdout, b"h\xc3\xa9\n\xff");
        assert_eq!(stderr, b"oops");
        let ending = ending.unwrap();
        assert_eq!(ending.exit_code(), 3);
    }

    #[test]
    fn exit_codes_follow_airlock_run() {
        let exited = |value: Value| Ending::Exited(serde_json::from_value(value).unwrap());
        assert_eq!(exited(json!({"exit_code": 0})).exit_code(), 0);
        assert_eq!(
            exited(json!({"exit_code": null, "signal": 9})).exit_code(),
            137
        );
        assert_eq!(exited(json!({"signal": "SIGTERM"})).exit_code(), 143);
        assert_eq!(exited(json!({"signal": "INT"})).exit_code(), 130);
        assert_eq!(exited(json!({"timed_out": true})).exit_code(), 137);
        assert_eq!(exited(json!({})).exit_code(), 255);
        let failed = |code: &str| Ending::Failed {
            code: code.into(),
            message: String::new(),
        };
        assert_eq!(failed("not_found").exit_code(), 127);
        assert_eq!(failed("forbidden").exit_code(), 126);
        assert_eq!(failed("bad_request").exit_code(), 126);
        assert_eq!(failed("internal").exit_code(), 125);
    }

    #[test]
    fn a_stream_without_exited_is_an_error() {
        let (ending, ..) = events("{\"type\":\"started\",\"pid\":1}\n");
        assert!(ending
            .unwrap_err()
            .to_string()
            .contains("before the process exited"));
        let (ending, ..) = events("not json\n");
        assert!(ending.is_err());
        let (ending, ..) = events("{\"type\":\"stdout\",\"data_b64\":\"***\"}\n");
        assert!(ending.is_err());
    }

    #[test]
    fn error_events_end_the_stream() {
        let (ending, ..) =
            events("{\"type\":\"error\",\"code\":\"not_found\",\"message\":\"no such file\"}\n");
        let ending = ending.unwrap();
        assert_eq!(ending.exit_code(), 127);
        let result = exec_result("sbx-1", None, &ending, b"", b"");
        assert_eq!(result.error.as_deref(), Some("no such file (not_found)"));
    }

    fn args(command: &[&str]) -> ExecArgs {
        ExecArgs {
            id: "sbx-1".into(),
            env: vec![("A".into(), "1".into())],
            cwd: Some("/tmp".into()),
            user: Some(User::Root),
            timeout: Some(30),
            background: false,
            json: false,
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            conn: Connection {
                url: super::super::http::DEFAULT_URL.into(),
                api_key: None,
            },
        }
    }

    #[test]
    fn request_body() {
        assert_eq!(
            exec_body(&args(&["python3", "-c", "print(1)"]), true).unwrap(),
            json!({"cmd": "python3", "args": ["-c", "print(1)"], "env": {"A": "1"},
                   "cwd": "/tmp", "user": "root", "timeout_s": 30, "stdin": true,
                   "background": false})
        );
        assert!(exec_body(&args(&[]), false).is_err());
    }

    /// A writer that reports every write on a channel.
    struct Tell(mpsc::Sender<Vec<u8>>);

    impl Write for Tell {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.send(bytes.to_vec());
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn output_streams_before_the_process_exits() {
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let server = FakeServer::start(1, move |_request, stream| {
            start_chunked(stream, 200, "application/x-ndjson");
            chunk(stream, b"{\"type\":\"started\",\"pid\":7}\n");
            chunk(stream, b"{\"type\":\"stdout\",\"data\":\"first\\n\"}\n");
            // Only go on once the client has shown the first line: the
            // output is not held back until the end.
            let shown = rx.recv_timeout(Duration::from_secs(10));
            let code = if shown.as_deref() == Ok(b"first\n") {
                3
            } else {
                99
            };
            chunk(stream, b"{\"type\":\"stderr\",\"data_b64\":\"/w==\"}\n");
            let exited = format!(
                "{{\"type\":\"exited\",\"pid\":7,\"exit_code\":{code},\"signal\":null,\"oom\":false,\"timed_out\":false,\"duration_ms\":5}}\n"
            );
            chunk(stream, exited.as_bytes());
            end_chunks(stream);
        });
        let api = Api::new(&server.url, Some("al_k".into())).unwrap();
        let body = exec_body(&args(&["echo", "first"]), false).unwrap();
        let response = api
            .post_json_response(&sandbox_path("sbx-1", "/exec"), &body)
            .unwrap();
        let mut stdout = Tell(tx);
        let mut stderr = Vec::new();
        let mut sink = Sink::Through {
            stdout: &mut stdout,
            stderr: &mut stderr,
        };
        let mut pid = None;
        let ending = follow(response.into_body().into_reader(), &mut sink, &mut |p| {
            pid = Some(p)
        })
        .unwrap();
        assert_eq!(ending.exit_code(), 3);
        assert_eq!(pid, Some(7));
        assert_eq!(stderr, b"\xff");
        let requests = server.finish();
        assert_eq!(requests[0].method, "POST");
        assert_eq!(requests[0].target, "/v1/sandboxes/sbx-1/exec");
        assert_eq!(requests[0].header("content-type"), Some("application/json"));
        let sent: Value = serde_json::from_slice(&requests[0].body).unwrap();
        assert_eq!(sent["cmd"], "echo");
    }

    #[test]
    fn stdin_goes_in_chunks_then_closes() {
        let server = FakeServer::start(2, |_request, stream| {
            respond(stream, 204, "application/json", b"");
        });
        let api = Api::new(&server.url, None).unwrap();
        // What copy_stdin does per chunk, without our real stdin.
        let path = sandbox_path("sbx-1", "/processes/7/stdin");
        api.post_bytes(&path, b"hello").unwrap();
        api.post_bytes(&format!("{path}/close"), &[]).unwrap();
        let requests = server.finish();
        assert_eq!(requests[0].target, "/v1/sandboxes/sbx-1/processes/7/stdin");
        assert_eq!(requests[0].body, b"hello");
        assert_eq!(
            requests[1].target,
            "/v1/sandboxes/sbx-1/processes/7/stdin/close"
        );
        assert!(requests[1].body.is_empty());
    }
}
