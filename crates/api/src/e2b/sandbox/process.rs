//! `process.Process`: commands in the sandbox, translated onto the
//! daemon's processes (exec, attach, stdin, signals). Message and field
//! names follow envd's process service; the JSON is protobuf's (camelCase
//! names, bytes in base64, enums by name).
//!
//! Terminals (`pty`) are processes the agent starts on a pseudo-terminal:
//! their output streams as `data.pty`, `input.pty` is typed into them and
//! `Update` resizes them. As in envd, input goes to the kind of input the
//! process has (`input.stdin` to a terminal, or `input.pty` to a process
//! on pipes, is refused) and a terminal's input cannot be closed
//! (`CloseStdin`; write `^D` instead).

use super::connect::{self, Code, ConnectError, StreamOptions};
use super::{absolute, basic_user, Target};
use crate::{Api, RequestId};
use airlock_daemon::processes::ExecRequest;
use airlock_daemon::{Attached, Output, ProcessHub};
use airlock_protocol::PtySize;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

type Result<T> = std::result::Result<T, ConnectError>;

/// `ProcessConfig`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

/// `PTY`: a terminal and its size.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Pty {
    size: Option<PtySizeMessage>,
}

/// `PTY.Size`; protobuf leaves zero fields out.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PtySizeMessage {
    cols: u32,
    rows: u32,
}

impl Pty {
    /// The size, which must fit a terminal (1 to 65535 cells each way;
    /// envd would truncate a larger one to 16 bits and take a zero).
    fn size(&self) -> Result<PtySize> {
        let size = self.size.as_ref();
        let cells = |n: Option<u32>| u16::try_from(n.unwrap_or(0)).ok().filter(|n| *n > 0);
        match (cells(size.map(|s| s.cols)), cells(size.map(|s| s.rows))) {
            (Some(cols), Some(rows)) => Ok(PtySize { cols, rows }),
            _ => Err(ConnectError::invalid(
                "pty.size: cols and rows must each be between 1 and 65535",
            )),
        }
    }
}

/// `StartRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StartRequest {
    process: Option<ProcessConfig>,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

/// `ProcessSelector`: a oneof of `pid` and `tag`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

/// The requests that name only a process: `ConnectRequest`,
/// `CloseStdinRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Selected {
    process: Option<Selector>,
}

/// `UpdateRequest`: a new terminal size, when `pty` is set.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct UpdateRequest {
    process: Option<Selector>,
    pty: Option<Pty>,
}

/// `ProcessInput`: a oneof of `stdin` and `pty`, bytes.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ProcessInput {
    stdin: Option<String>,
    pty: Option<String>,
}

/// `SendInputRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendInputRequest {
    process: Option<Selector>,
    input: Option<ProcessInput>,
}

/// `SendSignalRequest`; `signal` is the `Signal` enum by name or number.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendSignalRequest {
    process: Option<Selector>,
    signal: Value,
}

/// `StreamInputRequest`: a oneof of `start`, `data` and `keepalive`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamInputRequest {
    start: Option<Selected>,
    data: Option<StreamInputData>,
    keepalive: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamInputData {
    input: Option<ProcessInput>,
}

/// Serves `POST /process.Process/{method}`.
pub async fn call(
    State(api): State<Api>,
    Extension(target): Extension<Target>,
    request_id: Option<Extension<RequestId>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let request_id = request_id.map(|Extension(r)| r.0).unwrap_or_default();
    let id = target.id.as_str();
    let answer = match method.as_str() {
        "Start" => start(&api, id, &request_id, &headers, body).await,
        "Connect" => reattach(&api, id, &headers, body).await,
        "List" => list(&api, id, &headers, body).await,
        "SendInput" => send_input(&api, id, &headers, body).await,
        "StreamInput" => stream_input(&api, id, &headers, body).await,
        "SendSignal" => send_signal(&api, id, &headers, body).await,
        "CloseStdin" => close_stdin(&api, id, &headers, body).await,
        "Update" => update(&api, id, &headers, body).await,
        _ => Err(ConnectError::unimplemented(format!(
            "process.Process has no method {method}"
        ))),
    };
    answer.unwrap_or_else(IntoResponse::into_response)
}

fn event(event: Value) -> Value {
    json!({ "event": event })
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unbase64(text: &str) -> Result<Vec<u8>> {
    let text = text.trim_end_matches('=');
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(text)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text))
        .map_err(|_| ConnectError::invalid("input is not valid base64"))
}

/// The `end` event of an exit, worded as envd (Go) words it.
fn end_event(info: &airlock_daemon::ExitInfo) -> Value {
    let (exit_code, exited, status) = match (info.exit_code, info.signal) {
        (Some(code), _) => (code, true, format!("exit status {code}")),
        (None, Some(signal)) => (-1, false, format!("signal: {}", signal_name(signal))),
        (None, None) => (-1, false, "unknown".to_owned()),
    };
    let mut end = json!({ "exitCode": exit_code, "exited": exited, "status": status });
    if !(exited && exit_code == 0) {
        end["error"] = json!(status);
    }
    event(json!({ "end": end }))
}

fn signal_name(signal: i32) -> String {
    match signal {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        11 => "segmentation fault".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

/// The messages of one output item of a process (on a terminal when `pty`:
/// the hub carries a terminal's output as stdout).
fn translate(id: &str, item: Output, pty: bool) -> Result<Value> {
    match item {
        Output::Stdout(bytes) if pty => Ok(event(json!({"data": {"pty": base64(&bytes)}}))),
        Output::Stdout(bytes) => Ok(event(json!({"data": {"stdout": base64(&bytes)}}))),
        Output::Stderr(bytes) => Ok(event(json!({"data": {"stderr": base64(&bytes)}}))),
        Output::Exited(info) if info.timed_out => Err(ConnectError::new(
            Code::DeadlineExceeded,
            "the command ran past its timeout and was killed",
        )),
        Output::Exited(info) => Ok(end_event(&info)),
        Output::Error {
            code: "sandbox_not_running",
            message,
        } => Err(ConnectError::new(
            Code::Unavailable,
            format!("The sandbox {id} was not found: {message}"),
        )),
        Output::Error { message, .. } => Err(ConnectError::new(Code::Unknown, message)),
    }
}

/// The stream of a process: `start`, its output, its `end`.
fn process_stream(
    id: &str,
    hub: &ProcessHub,
    attached: Attached,
    headers: &HeaderMap,
    deadline: Option<Duration>,
) -> Response {
    let id = id.to_owned();
    let (pid, pty) = (hub.pid, hub.pty);
    let start =
        futures_util::stream::once(async move { Ok(event(json!({"start": {"pid": pid}}))) });
    let rest = futures_util::stream::unfold((attached, false), move |(mut attached, done)| {
        let id = id.clone();
        async move {
            if done {
                return None;
            }
            let item = attached.next().await?;
            let last = matches!(item, Output::Exited(_) | Output::Error { .. });
            Some((translate(&id, item, pty), (attached, last)))
        }
    });
    connect::stream_response(
        Box::pin(start.chain(rest)),
        StreamOptions {
            keepalive: connect::keepalive_interval(headers)
                .map(|every| (every, event(json!({"keepalive": {}})))),
            deadline,
        },
    )
}

async fn start(
    api: &Api,
    id: &str,
    request_id: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response> {
    let request: StartRequest = connect::stream_request(headers, body).await?;
    let pty = request.pty.as_ref().map(Pty::size).transpose()?;
    let user = basic_user(headers)?;
    let timeout = connect::timeout(headers)?;
    let config = request
        .process
        .ok_or_else(|| ConnectError::invalid("process: the command to run is missing"))?;
    let cwd = match config.cwd.as_deref() {
        None | Some("") => None,
        Some(cwd) => Some(absolute(cwd, user)?),
    };
    let (hub, attached) = api
        .daemon
        .exec(
            id,
            ExecRequest {
                cmd: config.cmd,
                args: config.args,
                env: config.envs,
                cwd,
                user,
                timeout_ms: timeout.map(|t| t.as_millis().max(1) as u64),
                // A terminal is always the input; `stdin` is for pipes.
                stdin: pty.is_none() && request.stdin.unwrap_or(false),
                pty,
                tag: request.tag.filter(|t| !t.is_empty()),
            },
            request_id,
        )
        .await?;
    // The agent kills the process at its timeout and the stream then ends
    // with deadline_exceeded; this is only the backstop.
    let backstop = timeout.map(|t| t + Duration::from_secs(5));
    Ok(process_stream(id, &hub, attached, headers, backstop))
}

/// The process a selector names.
fn select(api: &Api, id: &str, selector: Option<Selector>) -> Result<Arc<ProcessHub>> {
    let selector = selector.unwrap_or_default();
    match (selector.pid, selector.tag) {
        (Some(pid), _) => Ok(api.daemon.process(id, pid)?),
        (None, Some(tag)) => Ok(api.daemon.process_by_tag(id, &tag)?),
        (None, None) => Err(ConnectError::invalid(
            "process: select the process by pid or tag",
        )),
    }
}

/// The pid a selector names (processes the daemon did not start are found
/// by pid only).
fn select_pid(api: &Api, id: &str, selector: Option<Selector>) -> Result<u32> {
    match selector {
        Some(Selector { pid: Some(pid), .. }) => Ok(pid),
        other => Ok(select(api, id, other)?.pid),
    }
}

async fn reattach(api: &Api, id: &str, headers: &HeaderMap, body: Body) -> Result<Response> {
    let request: Selected = connect::stream_request(headers, body).await?;
    let hub = select(api, id, request.process)?;
    let deadline = connect::timeout(headers)?;
    // As envd: output from the moment of connecting, and an ended process
    // is not there to connect to.
    let attached = hub.attach_from_now().ok_or_else(|| {
        ConnectError::new(
            Code::NotFound,
            format!("process with pid {} not found", hub.pid),
        )
    })?;
    Ok(process_stream(id, &hub, attached, headers, deadline))
}

async fn list(api: &Api, id: &str, headers: &HeaderMap, body: Body) -> Result<Response> {
    let _: Value = connect::unary_request(headers, body).await?;
    let processes: Vec<Value> = api
        .daemon
        .processes(id)
        .await?
        .into_iter()
        .filter(|p| p.running)
        .map(|p| {
            let mut config = json!({"cmd": p.cmd, "args": p.args, "envs": p.env});
            if let Some(cwd) = p.cwd {
                config["cwd"] = json!(cwd);
            }
            let mut info = json!({"config": config, "pid": p.pid});
            if let Some(tag) = p.tag {
                info["tag"] = json!(tag);
            }
            info
        })
        .collect();
    Ok(connect::unary_response(&json!({ "processes": processes })))
}

/// The process input is for: its pid, and whether it runs on a terminal
/// (`None` for a process the daemon did not start and cannot tell).
fn select_input(api: &Api, id: &str, selector: Option<Selector>) -> Result<(u32, Option<bool>)> {
    match selector {
        Some(Selector { pid: Some(pid), .. }) => {
            Ok((pid, api.daemon.process(id, pid).ok().map(|hub| hub.pty)))
        }
        other => {
            let hub = select(api, id, other)?;
            Ok((hub.pid, Some(hub.pty)))
        }
    }
}

/// The bytes of a `ProcessInput` for a process on a terminal (`pty`) or on
/// pipes, refused when the input is of the other kind.
fn input_of(input: Option<ProcessInput>, pty: Option<bool>) -> Result<Vec<u8>> {
    match input {
        Some(ProcessInput {
            stdin: Some(data), ..
        }) => match pty {
            Some(true) => Err(ConnectError::invalid(
                "input: the process runs on a terminal; send its input as pty, not stdin",
            )),
            _ => unbase64(&data),
        },
        Some(ProcessInput {
            pty: Some(data), ..
        }) => match pty {
            Some(false) => Err(ConnectError::invalid(
                "input: the process has no terminal; send its input as stdin, not pty",
            )),
            _ => unbase64(&data),
        },
        _ => Ok(Vec::new()),
    }
}

async fn send_input(api: &Api, id: &str, headers: &HeaderMap, body: Body) -> Result<Response> {
    let request: SendInputRequest = connect::unary_request(headers, body).await?;
    let (pid, pty) = select_input(api, id, request.process)?;
    let data = input_of(request.input, pty)?;
    api.daemon.write_stdin(id, pid, data).await?;
    Ok(connect::unary_response(&json!({})))
}

/// `Update`: resizes the process's terminal when `pty` is set; without it
/// there is nothing to change (as in envd).
async fn update(api: &Api, id: &str, headers: &HeaderMap, body: Body) -> Result<Response> {
    let request: UpdateRequest = connect::unary_request(headers, body).await?;
    let pid = select_pid(api, id, request.process)?;
    if let Some(pty) = request.pty {
        let size = pty.size()?;
        api.daemon.resize(id, pid, size.cols, size.rows).await?;
    }
    Ok(connect::unary_response(&json!({})))
}

async fn stream_input(api: &Api, id: &str, headers: &HeaderMap, body: Body) -> Result<Response> {
    connect::check_content_type(headers, true)?;
    let mut messages = connect::client_stream::<StreamInputRequest>(body);
    let mut target = None;
    let mut outcome: Result<()> = Ok(());
    while let Some(message) = messages.next().await {
        let message = match message {
            Ok(message) => message,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        };
        if let Some(start) = message.start {
            match select_input(api, id, start.process) {
                Ok(selected) => target = Some(selected),
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        } else if let Some(data) = message.data {
            let Some((pid, pty)) = target else {
                outcome = Err(ConnectError::invalid(
                    "the input stream must start with a start message naming the process",
                ));
                break;
            };
            let written = match input_of(data.input, pty) {
                Ok(bytes) => api
                    .daemon
                    .write_stdin(id, pid, bytes)
                    .await
                    .map_err(Into::into),
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                outcome = Err(e);
                break;
            }
        } else if message.keepalive.is_some() {
            continue;
        }
    }
    let reply = match outcome {
        Ok(()) => vec![Ok(json!({}))],
        Err(e) => vec![Err(e)],
    };
    Ok(connect::stream_response(
        futures_util::stream::iter(reply),
        StreamOptions {
            keepalive: None,
            deadline: None,
        },
    ))
}

/// The signal number of the `Signal` enum, by name or number.
fn signal_number(value: &Value) -> Result<i32> {
    let number = match value {
        Value::String(name) => match name.as_str() {
            "SIGNAL_SIGKILL" => Some(9),
            "SIGNAL_SIGTERM" => Some(15),
            _ => None,
        },
        Value::Number(n) => n.as_i64().filter(|n| [9, 15].contains(n)).map(|n| n as i32),
        _ => None,
    };
    number.ok_or_else(|| ConnectError::invalid("signal: must be SIGNAL_SIGKILL or SIGNAL_SIGTERM"))
}

async fn send_signal(api: &Api, id: &str, headers: &HeaderMap, body: Body) -> Result<Response> {
    let request: SendSignalRequest = connect::unary_request(headers, body).await?;
    let signal = signal_number(&request.signal)?;
    let pid = select_pid(api, id, request.process)?;
    api.daemon.signal(id, pid, signal).await?;
    Ok(connect::unary_response(&json!({})))
}

async fn close_stdin(api: &Api, id: &str, headers: &HeaderMap, body: Body) -> Result<Response> {
    let request: Selected = connect::unary_request(headers, body).await?;
    let pid = select_pid(api, id, request.process)?;
    api.daemon.close_stdin(id, pid).await?;
    Ok(connect::unary_response(&json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_daemon::ExitInfo;

    fn exit(code: Option<i32>, signal: Option<i32>) -> ExitInfo {
        ExitInfo {
            pid: 3,
            exit_code: code,
            signal,
            oom: false,
            timed_out: false,
            duration_ms: 1,
            stdout_truncated: false,
            stderr_truncated: false,
        }
    }

    #[test]
    fn output_translates_to_process_events() {
        assert_eq!(
            translate("sbx-1", Output::Stdout(b"hi\n".to_vec()), false).unwrap(),
            json!({"event": {"data": {"stdout": "aGkK"}}})
        );
        assert_eq!(
            translate("sbx-1", Output::Stdout(b"hi\n".to_vec()), true).unwrap(),
            json!({"event": {"data": {"pty": "aGkK"}}})
        );
        assert_eq!(
            translate("sbx-1", Output::Exited(exit(Some(0), None)), false).unwrap(),
            json!({"event": {"end": {"exitCode": 0, "exited": true, "status": "exit status 0"}}})
        );
        assert_eq!(
            translate("sbx-1", Output::Exited(exit(Some(2), None)), false).unwrap()["event"]["end"]
                ["error"],
            "exit status 2"
        );
        let killed = translate("sbx-1", Output::Exited(exit(None, Some(9))), false).unwrap();
        assert_eq!(killed["event"]["end"]["exitCode"], -1);
        assert_eq!(killed["event"]["end"]["status"], "signal: killed");
        let gone = translate(
            "sbx-1",
            Output::Error {
                code: "sandbox_not_running",
                message: "gone".into(),
            },
            false,
        )
        .unwrap_err();
        assert_eq!(gone.code, Code::Unavailable);
        assert!(gone.message.contains("was not found"));
    }

    #[test]
    fn requests_parse_as_the_sdk_writes_them() {
        let start: StartRequest = connect::decode(
            br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"}},"stdin":false}"#,
        )
        .unwrap();
        let config = start.process.unwrap();
        assert_eq!(config.args[2], "echo hi");
        assert_eq!(config.envs["A"], "1");
        let input: SendInputRequest =
            connect::decode(br#"{"process":{"pid":12},"input":{"stdin":"aGk="}}"#).unwrap();
        assert_eq!(input.process.unwrap().pid, Some(12));
        assert_eq!(input_of(input.input, Some(false)).unwrap(), b"hi");
        let signal: SendSignalRequest =
            connect::decode(br#"{"process":{"tag":"t"},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert_eq!(signal_number(&signal.signal).unwrap(), 9);
        assert_eq!(signal_number(&json!(15)).unwrap(), 15);
        assert!(signal_number(&json!("SIGNAL_UNSPECIFIED")).is_err());
    }

    #[test]
    fn terminal_requests_parse_as_the_sdk_writes_them() {
        let start: StartRequest = connect::decode(
            br#"{"process":{"cmd":"/bin/bash","args":["-i","-l"],"envs":{"TERM":"xterm"}},"pty":{"size":{"cols":80,"rows":24}}}"#,
        )
        .unwrap();
        assert_eq!(
            start.pty.unwrap().size().unwrap(),
            PtySize { cols: 80, rows: 24 }
        );
        let update: UpdateRequest =
            connect::decode(br#"{"process":{"pid":5},"pty":{"size":{"cols":120,"rows":40}}}"#)
                .unwrap();
        assert_eq!(
            update.pty.unwrap().size().unwrap(),
            PtySize {
                cols: 120,
                rows: 40
            }
        );
        // Protobuf leaves a zero out; a terminal needs both, within 16 bits.
        for bad in [
            &br#"{"pty":{}}"#[..],
            br#"{"pty":{"size":{"cols":80}}}"#,
            br#"{"pty":{"size":{"cols":70000,"rows":24}}}"#,
        ] {
            let update: UpdateRequest = connect::decode(bad).unwrap();
            let error = update.pty.unwrap().size().unwrap_err();
            assert_eq!(error.code, Code::InvalidArgument);
        }

        let typed: SendInputRequest =
            connect::decode(br#"{"process":{"pid":5},"input":{"pty":"ZWNobyBoaQo="}}"#).unwrap();
        assert_eq!(input_of(typed.input, Some(true)).unwrap(), b"echo hi\n");
        // Input of the other kind is refused, as envd does; a process the
        // daemon did not start gets either.
        let typed: SendInputRequest =
            connect::decode(br#"{"process":{"pid":5},"input":{"pty":"aGk="}}"#).unwrap();
        assert_eq!(
            input_of(typed.input, Some(false)).unwrap_err().code,
            Code::InvalidArgument
        );
        let piped: SendInputRequest =
            connect::decode(br#"{"process":{"pid":5},"input":{"stdin":"aGk="}}"#).unwrap();
        assert_eq!(
            input_of(piped.input, Some(true)).unwrap_err().code,
            Code::InvalidArgument
        );
        let typed: SendInputRequest =
            connect::decode(br#"{"process":{"pid":5},"input":{"pty":"aGk="}}"#).unwrap();
        assert_eq!(input_of(typed.input, None).unwrap(), b"hi");
    }
}
