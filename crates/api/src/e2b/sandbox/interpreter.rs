//! The code interpreter's API (port 49999 in an e2b sandbox), as
//! `e2b-code-interpreter` calls it, onto the daemon's code contexts
//! (`airlock_daemon::interpreter`).
//!
//! | call | answer |
//! |---|---|
//! | `POST /execute {code, context_id?, language?, env_vars?}` | 200, NDJSON: `stdout`/`stderr` `{text, timestamp}`, `result`, `error {name, value, traceback}`, `number_of_executions {execution_count}`, then `end_of_execution` |
//! | `POST /contexts {language?, cwd?}` | 200 `{id, language, cwd}` |
//! | `GET /contexts` | 200 `[{id, language, cwd}]` |
//! | `DELETE /contexts/{id}` | 204 |
//! | `POST /contexts/{id}/restart` | 204 |
//! | `GET /health` | 200 |
//!
//! Errors are the daemon's `{code, message}`; the SDK turns a 404 into its
//! `NotFoundException`, a 502 (the sandbox is gone) into its
//! `TimeoutException` and anything else into `SandboxException` with the
//! body's text.

use crate::error::ApiError;
use crate::{Api, RequestId};
use airlock_daemon::interpreter::{CodeContextView, CodeEvent, RunCode, MAX_CODE_BYTES};
use airlock_daemon::DaemonError;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use futures_util::stream;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use super::Target;

/// Bytes a request body may have: the code plus its JSON quoting.
const MAX_BODY: usize = 2 * MAX_CODE_BYTES;

/// The code interpreter's routes (reached through the sandbox router's
/// admission, which sets [`Target`]).
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/execute", post(execute))
        .route("/contexts", get(list).post(create))
        .route("/contexts/{context}", delete(remove))
        .route("/contexts/{context}/restart", post(restart))
        .route("/health", get(health))
        .fallback(no_route)
        .with_state(api)
}

/// An error of this API.
struct InterpreterError(ApiError);

impl From<DaemonError> for InterpreterError {
    fn from(e: DaemonError) -> InterpreterError {
        InterpreterError(match e {
            // The SDK reads 502 as "the sandbox is gone (timed out)".
            DaemonError::NotRunning(_) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "sandbox_not_running",
                e.to_string(),
            ),
            other => other.into(),
        })
    }
}

impl IntoResponse for InterpreterError {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

type Result<T> = std::result::Result<T, InterpreterError>;

async fn no_route() -> InterpreterError {
    InterpreterError(ApiError::not_found(
        "the code interpreter has no such route",
    ))
}

async fn health() -> StatusCode {
    StatusCode::OK
}

/// The body of a request, parsed as JSON (an empty body is `{}`).
async fn json_body<T: for<'de> Deserialize<'de> + Default>(request: Request) -> Result<T> {
    let bytes = axum::body::to_bytes(request.into_body(), MAX_BODY)
        .await
        .map_err(|_| {
            InterpreterError(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("the body is larger than {MAX_BODY} bytes"),
            ))
        })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        InterpreterError(ApiError::bad_request(format!(
            "the body is not the JSON expected: {e}"
        )))
    })
}

fn context_json(view: &CodeContextView) -> Value {
    json!({"id": view.id, "language": view.language.name(), "cwd": view.cwd})
}

/// `POST /contexts` body.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NewContext {
    language: Option<String>,
    cwd: Option<String>,
}

async fn create(
    State(api): State<Api>,
    Extension(target): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    request: Request,
) -> Result<Json<Value>> {
    let body: NewContext = json_body(request).await?;
    let view = api
        .daemon
        .create_code_context(
            &target.id,
            body.language.as_deref(),
            body.cwd,
            &request_id.0,
        )
        .await?;
    Ok(Json(context_json(&view)))
}

async fn list(State(api): State<Api>, Extension(target): Extension<Target>) -> Result<Json<Value>> {
    let contexts = api.daemon.code_contexts(&target.id)?;
    Ok(Json(Value::Array(
        contexts.iter().map(context_json).collect(),
    )))
}

async fn remove(
    State(api): State<Api>,
    Extension(target): Extension<Target>,
    Path(context): Path<String>,
) -> Result<StatusCode> {
    api.daemon.remove_code_context(&target.id, &context).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn restart(
    State(api): State<Api>,
    Extension(target): Extension<Target>,
    Path(context): Path<String>,
) -> Result<StatusCode> {
    api.daemon
        .restart_code_context(&target.id, &context)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /execute` body.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Execute {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
}

async fn execute(
    State(api): State<Api>,
    Extension(target): Extension<Target>,
    Extension(request_id): Extension<RequestId>,
    request: Request,
) -> Result<Response> {
    let body: Execute = json_body(request).await?;
    let run = RunCode {
        code: body.code,
        context: body.context_id.filter(|c| !c.is_empty()),
        language: body.language.filter(|l| !l.is_empty()),
        env: body.env_vars.unwrap_or_default(),
    };
    let events = api.daemon.run_code(&target.id, run, &request_id.0).await?;
    let lines = stream::unfold(Some(events), |state| async move {
        let mut events = state?;
        match events.recv().await {
            Some(event) => Some((Ok::<Bytes, std::io::Error>(line(&event)), Some(events))),
            None => Some((Ok(ndjson(&json!({"type": "end_of_execution"}))), None)),
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(lines),
    )
        .into_response())
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn ndjson(value: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// One execution event as the SDK parses it.
fn line(event: &CodeEvent) -> Bytes {
    let value = match event {
        CodeEvent::Stdout(text) => json!({"type": "stdout", "text": text, "timestamp": now_ns()}),
        CodeEvent::Stderr(text) => json!({"type": "stderr", "text": text, "timestamp": now_ns()}),
        CodeEvent::Result { main, data } => {
            let mut result = data.clone();
            result.insert("type".into(), Value::from("result"));
            result.insert("is_main_result".into(), Value::from(*main));
            Value::Object(result)
        }
        CodeEvent::Error {
            name,
            value,
            traceback,
        } => json!({"type": "error", "name": name, "value": value, "traceback": traceback}),
        CodeEvent::ExecutionCount(n) => {
            json!({"type": "number_of_executions", "execution_count": n})
        }
    };
    ndjson(&value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(event: CodeEvent) -> Value {
        serde_json::from_slice(&line(&event)).unwrap()
    }

    #[test]
    fn events_have_the_shape_the_sdk_parses() {
        let out = parsed(CodeEvent::Stdout("hi\n".into()));
        assert_eq!(out["type"], "stdout");
        assert_eq!(out["text"], "hi\n");
        assert!(out["timestamp"].as_u64().unwrap() > 1_600_000_000_000_000_000);
        let mut data = serde_json::Map::new();
        data.insert("text".into(), Value::from("42"));
        data.insert("html".into(), Value::from("<b>42</b>"));
        let result = parsed(CodeEvent::Result { main: true, data });
        assert_eq!(result["type"], "result");
        assert_eq!(result["text"], "42");
        assert_eq!(result["html"], "<b>42</b>");
        assert_eq!(result["is_main_result"], true);
        let count = parsed(CodeEvent::ExecutionCount(3));
        assert_eq!(count["type"], "number_of_executions");
        assert_eq!(count["execution_count"], 3);
        let error = parsed(CodeEvent::Error {
            name: "ValueError".into(),
            value: "bad".into(),
            traceback: "tb".into(),
        });
        assert_eq!(error["name"], "ValueError");
        assert_eq!(error["traceback"], "tb");
    }
}
