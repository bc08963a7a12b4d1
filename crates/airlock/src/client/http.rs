//! The daemon's native API (`docs/api.md`) over blocking HTTP/1.1, and the
//! errors of talking to it.
//!
//! One [`Api`] per command; it is cheap to clone (the connection pool is
//! shared), so `exec` hands clones to its stdin and signal threads. Every
//! answer outside 2xx becomes a [`ClientError::Api`] carrying the API's own
//! `code` and `message`.

use clap::Args;
use serde::Deserialize;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;
use ureq::http::Response;
use ureq::typestate::{WithBody, WithoutBody};
use ureq::{AsSendBody, Body, BodyReader, RequestBuilder};

use super::format::percent_encode;

/// Where the daemon listens by default (`airlock serve`'s default).
pub const DEFAULT_URL: &str = "http://127.0.0.1:7070";
/// Largest JSON answer read into memory.
const MAX_JSON_BYTES: u64 = 64 << 20;
/// Largest error body read.
const MAX_ERROR_BYTES: u64 = 64 << 10;
/// How long to wait for the daemon to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach the daemon: the options every client command takes.
#[derive(Args, Clone, Debug)]
pub struct Connection {
    /// Base URL of the airlock daemon's API.
    #[arg(
        long,
        env = "AIRLOCK_URL",
        default_value = DEFAULT_URL,
        value_name = "URL",
        global = true
    )]
    pub url: String,
    /// API key (`al_…`) [default: a local daemon's admin key file, if
    /// readable: /var/lib/airlock/admin.key or
    /// ${XDG_DATA_HOME:-~/.local/share}/airlock/admin.key]
    #[arg(
        long,
        env = "AIRLOCK_API_KEY",
        hide_env_values = true,
        value_name = "KEY",
        global = true
    )]
    pub api_key: Option<String>,
}

impl Connection {
    /// A client for these options, with the key from the flag, the
    /// environment or a readable admin key file, in that order.
    pub fn api(&self) -> Result<Api, ClientError> {
        let key = match self.api_key.as_deref().map(str::trim) {
            Some(key) if !key.is_empty() => Some(key.to_owned()),
            _ => read_key_file(&key_files()),
        };
        Api::new(&self.url, key)
    }
}

/// The admin key files a local daemon writes, most likely first: root's
/// daemon keeps its data in /var/lib/airlock, a user's under XDG_DATA_HOME.
fn key_files() -> Vec<PathBuf> {
    let system = PathBuf::from("/var/lib/airlock/admin.key");
    let user = match std::env::var_os("XDG_DATA_HOME") {
        Some(dir) if PathBuf::from(&dir).is_absolute() => Some(PathBuf::from(dir)),
        _ => std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/share")),
    }
    .map(|dir| dir.join("airlock/admin.key"));
    let mut files = vec![system];
    if let Some(user) = user {
        if rustix::process::geteuid().is_root() {
            files.push(user);
        } else {
            files.insert(0, user);
        }
    }
    files
}

/// The first non-empty key among readable files.
fn read_key_file(files: &[PathBuf]) -> Option<String> {
    files.iter().find_map(|path| {
        let text = std::fs::read_to_string(path).ok()?;
        let key = text.trim();
        (!key.is_empty()).then(|| key.to_owned())
    })
}

/// What went wrong talking to the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answered at the daemon's address.
    #[error("cannot reach the airlock daemon at {url}: {reason} (is `airlock serve` running?)")]
    Unreachable {
        /// The base URL tried.
        url: String,
        /// Why, e.g. `connection refused`.
        reason: String,
    },
    /// The daemon answered with an API error.
    #[error("{message} ({code}){hint}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The API's error code, e.g. `not_found`.
        code: String,
        /// The API's message.
        message: String,
        /// Advice of ours, starting with `; `, or empty.
        hint: String,
    },
    /// An error status without the API's error body: something else answered.
    #[error(
        "{what} answered HTTP {status} without an API error body (is {url} an airlock daemon?)"
    )]
    NotAnApiError {
        /// Method and path of the request.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The base URL.
        url: String,
    },
    /// An answer body that is not the JSON the API describes.
    #[error("cannot decode the answer to {what}")]
    Decode {
        /// Method and path of the request.
        what: String,
        /// The decoding failure.
        #[source]
        source: serde_json::Error,
    },
    /// The exchange broke down after the connection was made.
    #[error("{what} failed")]
    Transport {
        /// Method and path of the request.
        what: String,
        /// ureq's error.
        #[source]
        source: ureq::Error,
    },
    /// A daemon URL this client cannot use.
    #[error("cannot use the daemon URL `{url}`: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// Why not.
        reason: &'static str,
    },
    /// Command-line input that parsed but makes no sense (exit code 2).
    #[error("{0}")]
    Usage(String),
}

impl ClientError {
    /// The API error code, when the daemon answered with one.
    pub fn api_code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// The API's error body.
#[derive(Deserialize)]
struct ErrorBody {
    code: String,
    #[serde(default)]
    message: Option<String>,
}

/// A client of one daemon, with one API key (or none).
#[derive(Clone)]
pub struct Api {
    agent: ureq::Agent,
    base: String,
    key: Option<String>,
}

impl Api {
    /// A client of the daemon at `url` (`http://host:port`, a bare
    /// `host:port` means http).
    pub fn new(url: &str, key: Option<String>) -> Result<Api, ClientError> {
        let base = normalize_url(url)?;
        let config = ureq::Agent::config_builder()
            // Error bodies carry the API's code and message: read them.
            .http_status_as_error(false)
            // NDJSON lines and small stdin chunks must not wait for Nagle.
            .no_delay(true)
            // The API key goes to the daemon and nowhere else: no proxy from
            // the environment, no redirects.
            .proxy(None)
            .max_redirects(0)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .user_agent(concat!("airlock/", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Api {
            agent: ureq::Agent::new_with_config(config),
            base,
            key,
        })
    }

    fn prepare<B>(
        &self,
        mut request: RequestBuilder<B>,
        query: &[(&str, &str)],
    ) -> RequestBuilder<B> {
        if let Some(key) = &self.key {
            request = request.header("X-API-Key", key);
        }
        for (name, value) in query {
            request = request.query(*name, *value);
        }
        request
    }

    fn get(&self, path: &str, query: &[(&str, &str)]) -> RequestBuilder<WithoutBody> {
        self.prepare(self.agent.get(format!("{}{path}", self.base)), query)
    }

    fn post(&self, path: &str, query: &[(&str, &str)]) -> RequestBuilder<WithBody> {
        self.prepare(self.agent.post(format!("{}{path}", self.base)), query)
    }

    /// `GET path?query` → the JSON answer.
    pub fn get_json(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, ClientError> {
        let what = format!("GET {path}");
        let response = self.check(&what, self.get(path, query).call())?;
        read_json(&what, response)
    }

    /// `GET path?query` → the answer body as a stream.
    pub fn get_stream(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<BodyReader<'static>, ClientError> {
        let what = format!("GET {path}");
        let response = self.check(&what, self.get(path, query).call())?;
        Ok(response.into_body().into_reader())
    }

    /// `POST path` with a JSON body → the answer, unread (for streams).
    pub fn post_json_response(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<Response<Body>, ClientError> {
        let what = format!("POST {path}");
        let request = self.post(path, &[]).content_type("application/json");
        self.check(&what, request.send(body.to_string()))
    }

    /// `POST path` with a JSON body → the JSON answer (`null` when empty).
    pub fn post_json(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let response = self.post_json_response(path, body)?;
        read_json(&format!("POST {path}"), response)
    }

    /// `POST path` with raw bytes, or with no body when `bytes` is empty.
    pub fn post_bytes(&self, path: &str, bytes: &[u8]) -> Result<(), ClientError> {
        let what = format!("POST {path}");
        let request = self.post(path, &[]);
        let result = if bytes.is_empty() {
            request.send_empty()
        } else {
            request.content_type("application/octet-stream").send(bytes)
        };
        let response = self.check(&what, result)?;
        read_json(&what, response).map(drop)
    }

    /// `POST path?query` with a streamed raw body → the answer body as a
    /// stream (an NDJSON answer read as it comes).
    pub fn post_stream(
        &self,
        path: &str,
        query: &[(&str, &str)],
        body: impl AsSendBody,
    ) -> Result<BodyReader<'static>, ClientError> {
        let what = format!("POST {path}");
        let request = self.post(path, query).content_type("application/x-tar");
        let response = self.check(&what, request.send(body))?;
        Ok(response.into_body().into_reader())
    }

    /// `PUT path?query` with a streamed raw body → the JSON answer.
    pub fn put(
        &self,
        path: &str,
        query: &[(&str, &str)],
        body: impl AsSendBody,
    ) -> Result<Value, ClientError> {
        let what = format!("PUT {path}");
        let request = self
            .prepare(self.agent.put(format!("{}{path}", self.base)), query)
            .content_type("application/octet-stream");
        let response = self.check(&what, request.send(body))?;
        read_json(&what, response)
    }

    /// `PUT path` with a JSON body → the JSON answer.
    pub fn put_json(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let what = format!("PUT {path}");
        let request = self
            .prepare(self.agent.put(format!("{}{path}", self.base)), &[])
            .content_type("application/json");
        let response = self.check(&what, request.send(body.to_string()))?;
        read_json(&what, response)
    }

    /// `PATCH path` with a JSON body → the JSON answer.
    pub fn patch_json(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let what = format!("PATCH {path}");
        let request = self
            .prepare(self.agent.patch(format!("{}{path}", self.base)), &[])
            .content_type("application/json");
        let response = self.check(&what, request.send(body.to_string()))?;
        read_json(&what, response)
    }

    /// `DELETE path?query`.
    pub fn delete(&self, path: &str, query: &[(&str, &str)]) -> Result<(), ClientError> {
        let what = format!("DELETE {path}");
        let request = self.prepare(self.agent.delete(format!("{}{path}", self.base)), query);
        let response = self.check(&what, request.call())?;
        read_json(&what, response).map(drop)
    }

    /// The answer when its status is 2xx; otherwise the error it carries.
    fn check(
        &self,
        what: &str,
        result: Result<Response<Body>, ureq::Error>,
    ) -> Result<Response<Body>, ClientError> {
        let response = result.map_err(|e| self.transport_error(what, e))?;
        if response.status().is_success() {
            Ok(response)
        } else {
            Err(self.api_error(what, response))
        }
    }

    fn transport_error(&self, what: &str, error: ureq::Error) -> ClientError {
        use std::io::ErrorKind;
        let reason = match &error {
            ureq::Error::Io(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused
                        | ErrorKind::HostUnreachable
                        | ErrorKind::NetworkUnreachable
                        | ErrorKind::NetworkDown
                        | ErrorKind::AddrNotAvailable
                ) =>
            {
                Some(e.kind().to_string())
            }
            ureq::Error::HostNotFound => Some("host not found".to_owned()),
            ureq::Error::ConnectionFailed => Some("connection failed".to_owned()),
            ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => {
                Some("timed out connecting".to_owned())
            }
            _ => None,
        };
        match reason {
            Some(reason) => ClientError::Unreachable {
                url: self.base.clone(),
                reason,
            },
            None => ClientError::Transport {
                what: what.to_owned(),
                source: error,
            },
        }
    }

    fn api_error(&self, what: &str, response: Response<Body>) -> ClientError {
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response
            .into_body()
            .with_config()
            .limit(MAX_ERROR_BYTES)
            .read_to_vec()
            .unwrap_or_default();
        let Ok(error) = serde_json::from_slice::<ErrorBody>(&body) else {
            return ClientError::NotAnApiError {
                what: what.to_owned(),
                status,
                url: self.base.clone(),
            };
        };
        let hint = match (error.code.as_str(), &retry_after) {
            ("unauthorized", _) if self.key.is_none() => {
                "; no API key given: set AIRLOCK_API_KEY or pass --api-key".to_owned()
            }
            ("unauthorized", _) => "; check AIRLOCK_API_KEY or --api-key".to_owned(),
            ("too_many_requests", Some(after)) => format!("; retry after {after}s"),
            _ => String::new(),
        };
        let message = match error.message {
            Some(message) if !message.is_empty() => message,
            _ => default_message(&error.code),
        };
        ClientError::Api {
            status,
            code: error.code,
            message,
            hint,
        }
    }
}

/// A message for an error body that came without one.
fn default_message(code: &str) -> String {
    match code {
        "unauthorized" => "wrong or missing credentials".to_owned(),
        other => other.replace('_', " "),
    }
}

/// The JSON of an answer, `null` when it has no body (204).
fn read_json(what: &str, response: Response<Body>) -> Result<Value, ClientError> {
    let bytes = response
        .into_body()
        .with_config()
        .limit(MAX_JSON_BYTES)
        .read_to_vec()
        .map_err(|source| ClientError::Transport {
            what: what.to_owned(),
            source,
        })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
        what: what.to_owned(),
        source,
    })
}

/// `http://host:port[/prefix]` without a trailing slash; a bare
/// `host:port` gets `http://`.
fn normalize_url(url: &str) -> Result<String, ClientError> {
    let bad = |reason| ClientError::BadUrl {
        url: url.to_owned(),
        reason,
    };
    let text = url.trim();
    let (scheme, rest) = text.split_once("://").unwrap_or(("http", text));
    if scheme.eq_ignore_ascii_case("https") {
        return Err(bad(
            "this client speaks plain HTTP only; reach a remote daemon through a tunnel that ends TLS",
        ));
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(bad("expected http://HOST:PORT"));
    }
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() {
        return Err(bad("it names no host"));
    }
    Ok(format!("http://{rest}"))
}

/// `/v1/sandboxes/{id}{rest}`, with the id percent-encoded.
pub fn sandbox_path(id: &str, rest: &str) -> String {
    format!("/v1/sandboxes/{}{rest}", percent_encode(id))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{respond, FakeServer};
    use super::*;

    #[test]
    fn urls() {
        let ok = |url: &str| normalize_url(url).ok();
        assert_eq!(
            ok("http://127.0.0.1:7070/").as_deref(),
            Some("http://127.0.0.1:7070")
        );
        assert_eq!(
            ok("127.0.0.1:7070").as_deref(),
            Some("http://127.0.0.1:7070")
        );
        assert_eq!(ok("HTTP://h:1/api").as_deref(), Some("http://h:1/api"));
        assert!(ok("https://h:1").is_none());
        assert!(ok("ftp://h").is_none());
        assert!(ok("").is_none());
        assert!(ok("http://").is_none());
    }

    #[test]
    fn sandbox_paths_encode_the_id() {
        assert_eq!(sandbox_path("sbx-1", "/files"), "/v1/sandboxes/sbx-1/files");
        assert_eq!(sandbox_path("../x", ""), "/v1/sandboxes/..%2Fx");
    }

    #[test]
    fn key_file_is_the_first_readable_non_empty_one() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        let key = dir.path().join("key");
        std::fs::write(&empty, "\n").unwrap();
        std::fs::write(&key, "al_secret\n").unwrap();
        let missing = dir.path().join("missing");
        assert_eq!(
            read_key_file(&[missing, empty.clone(), key]).as_deref(),
            Some("al_secret")
        );
        assert_eq!(read_key_file(&[empty]), None);
    }

    #[test]
    fn error_bodies_become_their_message_and_code() {
        let server = FakeServer::start(1, |_request, stream| {
            respond(
                stream,
                404,
                "application/json",
                br#"{"code":"not_found","message":"no sandbox sbx-nope"}"#,
            );
        });
        let api = Api::new(&server.url, Some("al_k".into())).unwrap();
        let error = api.get_json("/v1/sandboxes/sbx-nope", &[]).unwrap_err();
        assert_eq!(error.to_string(), "no sandbox sbx-nope (not_found)");
        assert_eq!(error.api_code(), Some("not_found"));
        let requests = server.finish();
        assert_eq!(requests[0].target, "/v1/sandboxes/sbx-nope");
        assert_eq!(requests[0].header("x-api-key"), Some("al_k"));
    }

    #[test]
    fn unauthorized_points_at_the_api_key() {
        let server = FakeServer::start(2, |_request, stream| {
            respond(
                stream,
                401,
                "application/json",
                br#"{"code":"unauthorized"}"#,
            );
        });
        let without = Api::new(&server.url, None).unwrap();
        let error = without.get_json("/v1/sandboxes", &[]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "wrong or missing credentials (unauthorized); no API key given: set AIRLOCK_API_KEY or pass --api-key"
        );
        let with = Api::new(&server.url, Some("al_bad".into())).unwrap();
        let error = with.get_json("/v1/sandboxes", &[]).unwrap_err();
        assert!(error
            .to_string()
            .ends_with("(unauthorized); check AIRLOCK_API_KEY or --api-key"));
        let requests = server.finish();
        assert_eq!(requests[0].header("x-api-key"), None);
    }

    #[test]
    fn a_body_that_is_not_an_api_error_says_so() {
        let server = FakeServer::start(1, |_request, stream| {
            respond(stream, 502, "text/html", b"<html>bad gateway</html>");
        });
        let api = Api::new(&server.url, None).unwrap();
        let error = api.get_json("/v1/sandboxes", &[]).unwrap_err();
        assert!(
            matches!(error, ClientError::NotAnApiError { status: 502, .. }),
            "{error}"
        );
        server.finish();
    }

    #[test]
    fn connection_refused_names_the_daemon() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let api = Api::new(&url, None).unwrap();
        let error = api.get_json("/v1/sandboxes", &[]).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "cannot reach the airlock daemon at {url}: connection refused (is `airlock serve` running?)"
            )
        );
    }

    #[test]
    fn queries_are_encoded_and_empty_answers_are_null() {
        let server = FakeServer::start(1, |_request, stream| {
            respond(stream, 204, "application/json", b"");
        });
        let api = Api::new(&server.url, None).unwrap();
        api.delete(
            "/v1/sandboxes/sbx-1/files",
            &[("path", "/a b&c"), ("recursive", "true")],
        )
        .unwrap();
        let requests = server.finish();
        assert_eq!(requests[0].method, "DELETE");
        assert_eq!(
            requests[0].target,
            "/v1/sandboxes/sbx-1/files?path=%2Fa%20b%26c&recursive=true"
        );
    }
}
