//! Calls into one sandbox, selected by the `E2b-Sandbox-Id` header: envd's
//! `/health` and `/files`, and its Connect services `process.Process` and
//! `filesystem.Filesystem` (port 49983, [`ENVD_PORT`]); and the code
//! interpreter's `/execute` and `/contexts` (port 49999,
//! [`CODE_INTERPRETER_PORT`], see [`interpreter`]).
//!
//! Every call but envd's `/health` is authenticated here: `X-Access-Token`
//! must be the sandbox's access token (the SDK's `envdAccessToken`), or
//! `X-API-Key` a key that may see the sandbox; a `/files` URL may instead
//! carry a signature made with the access token (see [`files`]). The code
//! interpreter's port also takes `E2B-Traffic-Access-Token`, the
//! sandbox's traffic token, which is all the SDK sends on its `/contexts`
//! calls. A sandbox that
//! does not exist answers `not_found` before any credential is looked at,
//! as e2b's proxy does.

pub mod connect;
mod files;
mod filesystem;
mod gzip;
mod interpreter;
mod process;

/// Entry points for the fuzzer (`fuzz/` at the repository's root) into the
/// readers of uploads that are private here; not part of the API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use super::files::fuzz_metadata as metadata;
    pub use super::files::fuzz_multipart as multipart;
    pub use super::gzip::fuzz_gunzip as gunzip;
}

use crate::auth::Caller;
use crate::e2b::{SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER};
use crate::Api;
use airlock_policy::RunAs;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine;
use connect::{Code, ConnectError};
use tower::ServiceExt;

pub use files::{is_signed as files_signed, signer as files_signer};

/// envd's port inside an e2b sandbox.
pub const ENVD_PORT: u16 = 49983;
/// The namespace of the extended attributes that hold a file's e2b
/// metadata (what an upload's `X-Metadata-<key>` headers set and an
/// `EntryInfo`'s `metadata` shows), as envd keeps it: `user.` is the
/// namespace a file's owner may write, `e2b.` keeps other tools' out.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";
/// The code interpreter's port inside an e2b sandbox.
pub const CODE_INTERPRETER_PORT: u16 = 49999;

/// The sandbox a request is for, once authenticated; put into the request's
/// extensions.
#[derive(Debug, Clone)]
pub struct Target {
    /// `sbx-…`.
    pub id: String,
}

/// The routes of calls into a sandbox (selected by `E2b-Sandbox-Id`).
pub fn router(api: Api) -> Router {
    let interpreter = interpreter::router(api.clone());
    Router::new()
        .route("/health", get(health))
        .route("/files", get(files::download).post(files::upload))
        .route("/process.Process/{method}", post(process::call))
        .route("/filesystem.Filesystem/{method}", post(filesystem::call))
        .fallback(no_route)
        .layer(axum::middleware::from_fn_with_state(
            (api.clone(), interpreter),
            admit,
        ))
        .with_state(api)
}

/// envd's health answer (reached only through [`admit`], which answers
/// for sandboxes that are gone).
async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn no_route() -> ConnectError {
    ConnectError::new(Code::NotFound, "envd has no such route")
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// Checks the sandbox, the port and the credentials of a request, and
/// sends it on to envd's routes or the code interpreter's.
async fn admit(
    State((api, interpreter)): State<(Api, Router)>,
    mut request: Request,
    next: Next,
) -> Response {
    let id = header(request.headers(), SANDBOX_ID_HEADER)
        .unwrap_or_default()
        .to_owned();
    let port = header(request.headers(), SANDBOX_PORT_HEADER)
        .map(|p| p.parse::<u16>().unwrap_or(0))
        .unwrap_or(ENVD_PORT);
    // Any port but envd's and the code interpreter's is a port of the
    // sandbox's own, which the ports dialect forwards with its own checks.
    if port != ENVD_PORT && port != CODE_INTERPRETER_PORT {
        let target = crate::ports::Target {
            id,
            port,
            prefix: None,
        };
        return crate::ports::forward(api, target, request).await;
    }
    if request.uri().path() == "/health" {
        // Open, as envd's is; a sandbox that is gone answers as e2b's proxy
        // does, so the SDKs' health probe reports it not running.
        return match api.daemon.running(&id) {
            Ok(_) => StatusCode::NO_CONTENT.into_response(),
            Err(_) => (
                StatusCode::BAD_GATEWAY,
                axum::Json(serde_json::json!({
                    "code": 502,
                    "message": format!("The sandbox {id} was not found"),
                })),
            )
                .into_response(),
        };
    }
    let known = !id.is_empty()
        && api
            .daemon
            .with_store(|s| s.get_sandbox(&id))
            .ok()
            .flatten()
            .is_some();
    if !known {
        return ConnectError::new(Code::NotFound, format!("The sandbox {id} was not found"))
            .into_response();
    }
    let caller =
        match credentials(&api, &id, port, request.headers()) {
            Some(caller) => Some(caller),
            // A signed `/files` URL is checked by its handler.
            None if request.uri().path() == "/files" && files::is_signed(request.uri()) => None,
            None => return ConnectError::new(
                Code::Unauthenticated,
                "a valid X-Access-Token (the sandbox's envd access token) or X-API-Key is required",
            )
            .into_response(),
        };
    request.extensions_mut().insert(Target { id });
    if let Some(caller) = &caller {
        crate::server::trust(&request);
        request.extensions_mut().insert(caller.clone());
    }
    let mut response = if port == CODE_INTERPRETER_PORT {
        match interpreter.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    } else {
        next.run(request).await
    };
    if let Some(caller) = caller {
        response.extensions_mut().insert(caller);
    }
    response
}

/// Who the credentials of a request name, if they open `port` of sandbox
/// `id`.
fn credentials(api: &Api, id: &str, port: u16, headers: &HeaderMap) -> Option<Caller> {
    if port == CODE_INTERPRETER_PORT {
        if let Some(token) = header(headers, "e2b-traffic-access-token") {
            return api
                .daemon
                .traffic_token_matches(id, token)
                .then(|| Caller::Sandbox(id.to_owned()));
        }
    }
    if let Some(token) = header(headers, "x-access-token") {
        if api.daemon.access_token_matches(id, token) {
            return Some(Caller::Sandbox(id.to_owned()));
        }
        return None;
    }
    let key = header(headers, "x-api-key")?;
    let row = api
        .daemon
        .with_store(|s| s.verify_key(key))
        .ok()
        .flatten()?;
    api.daemon.get(&row, id).ok()?;
    Some(Caller::Key(row))
}

/// The user a request names: `user` (uid 1000) or `root`; `None` for the
/// sandbox's default.
pub fn run_as(name: Option<&str>) -> Result<Option<RunAs>, ConnectError> {
    match name.map(str::trim) {
        None | Some("") => Ok(None),
        Some("user") => Ok(Some(RunAs::User)),
        Some("root") => Ok(Some(RunAs::Root)),
        Some(other) => Err(ConnectError::new(
            Code::InvalidArgument,
            format!("there is no user {other:?} in the sandbox; use \"user\" or \"root\""),
        )),
    }
}

/// The user named by `Authorization: Basic base64(user:)`, as the SDKs
/// send it for RPCs.
pub fn basic_user(headers: &HeaderMap) -> Result<Option<RunAs>, ConnectError> {
    let Some(value) = header(headers, "authorization") else {
        return Ok(None);
    };
    let Some(encoded) = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))
    else {
        return Ok(None);
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| ConnectError::invalid("the Authorization header is not valid Basic"))?;
    let name = decoded.split(':').next().unwrap_or("");
    run_as(Some(name))
}

/// The home directory of `user`, against which relative paths resolve.
pub fn home(user: Option<RunAs>) -> &'static str {
    user.unwrap_or(RunAs::User).home()
}

/// `path` made absolute: relative paths are under the user's home.
pub fn absolute(path: &str, user: Option<RunAs>) -> Result<String, ConnectError> {
    if path.is_empty() {
        return Err(ConnectError::invalid("path is empty"));
    }
    if path.starts_with('/') {
        Ok(path.to_owned())
    } else if path == "~" {
        Ok(home(user).to_owned())
    } else {
        let rest = path.strip_prefix("~/").unwrap_or(path);
        Ok(format!("{}/{rest}", home(user)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_and_paths_translate() {
        let mut headers = HeaderMap::new();
        assert_eq!(basic_user(&headers).unwrap(), None);
        headers.insert("authorization", "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(basic_user(&headers).unwrap(), Some(RunAs::Root));
        headers.insert("authorization", "Basic dXNlcjo=".parse().unwrap());
        assert_eq!(basic_user(&headers).unwrap(), Some(RunAs::User));
        headers.insert("authorization", "Basic Ym9iOg==".parse().unwrap());
        assert_eq!(
            basic_user(&headers).unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(absolute("a/b", None).unwrap(), "/home/user/a/b");
        assert_eq!(absolute("~/x", Some(RunAs::Root)).unwrap(), "/root/x");
        assert_eq!(absolute("/etc", None).unwrap(), "/etc");
        assert!(absolute("", None).is_err());
    }
}
