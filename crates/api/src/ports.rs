//! Sandbox ports from outside: HTTP (WebSocket included) to a port a
//! process inside a sandbox listens on, as e2b's `get_host` promises.
//!
//! A request names its target in one of two ways:
//!
//! - by **host**, `PORT-SANDBOXID.DOMAIN` on the daemon's listener, when
//!   the daemon was given a sandbox domain (`serve --sandbox-domain`; the
//!   wildcard DNS record is the operator's). The request goes in as it
//!   came, path and `Host` untouched.
//! - by **path**, `/v1/sandboxes/SANDBOXID/ports/PORT/REST` (for setups
//!   without wildcard DNS): the request goes in as `/REST`.
//!
//! (e2b's own form, `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers with a
//! port other than envd's, is the e2b dialect's; it hands such requests
//! to [`forward`].)
//!
//! **Access.** A sandbox created with public ports (`public_ports`, e2b's
//! `allowPublicTraffic`) answers anyone who can reach the daemon. Any
//! other needs one of: its traffic token (`E2B-Traffic-Access-Token`, as
//! e2b has it), its access token (`X-Access-Token`), or an API key that
//! may use it (`X-API-Key`, or a bearer API key). The credential is taken
//! off the request before it goes in, so nothing inside ever sees it.
//!
//! **Reach.** The connection is opened on the sandbox's own loopback
//! ([`airlock_daemon::Daemon::open_port`]: by the daemon in the sandbox's
//! network namespace where its tier says so, else by its agent): a
//! request reaches that sandbox's ports and nothing else, not the host's,
//! not another sandbox's, whatever its network policy (a sandbox with
//! network `none` serves its ports too).
//!
//! **Connections.** Plain requests go over kept-alive connections to the
//! port, pooled per sandbox and port ([`PortPool`]; a connection is used
//! by one request at a time and idles at most [`IDLE`]): a request after
//! the first costs no new connection inside. An upgrade (WebSocket) gets
//! a connection of its own, kept for as long as both sides keep it.

use crate::dialect::{Audited, Dialect};
use crate::error::ApiError;
use crate::{is_sandbox_id, Api};
use airlock_daemon::PortStream;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

/// How long a pooled connection to a sandbox's port may idle.
pub const IDLE: Duration = Duration::from_secs(30);
/// Idle connections kept per sandbox port.
const IDLE_PER_PORT: usize = 16;

/// Kept-alive connections to sandboxes' ports, keyed by sandbox and port
/// (the pool's URIs are `http://SANDBOXID:PORT`; only the key, never sent).
#[derive(Clone)]
pub struct PortPool {
    client: Client<Tunnels, Body>,
}

impl PortPool {
    pub fn new(daemon: airlock_daemon::Daemon) -> PortPool {
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE)
            .pool_max_idle_per_host(IDLE_PER_PORT)
            // The request keeps the Host it came with (or its mask).
            .set_host(false)
            .build(Tunnels { daemon });
        PortPool { client }
    }
}

/// Opens connections for the pool: through the sandbox's agent.
#[derive(Clone)]
struct Tunnels {
    daemon: airlock_daemon::Daemon,
}

/// Why the pool could not connect: the daemon's answer, taken once by
/// [`forward`] to answer the client.
#[derive(Debug, thiserror::Error)]
#[error("the connection to the sandbox's port could not be opened")]
struct ConnectFailed(Mutex<Option<airlock_daemon::DaemonError>>);

impl tower::Service<Uri> for Tunnels {
    type Response = Tunnel;
    type Error = ConnectFailed;
    type Future = BoxFuture<'static, Result<Tunnel, ConnectFailed>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ConnectFailed>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let daemon = self.daemon.clone();
        Box::pin(async move {
            let failed = |e| ConnectFailed(Mutex::new(Some(e)));
            let (Some(id), Some(port)) = (uri.host(), uri.port_u16()) else {
                return Err(failed(airlock_daemon::DaemonError::BadInput(
                    "no sandbox port named".into(),
                )));
            };
            let stream = daemon.open_port(id, port).await.map_err(failed)?;
            Ok(Tunnel(TokioIo::new(stream)))
        })
    }
}

/// One connection to a sandbox's port, as the pool holds it.
struct Tunnel(TokioIo<PortStream>);

impl Connection for Tunnel {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The header e2b's SDK users send a sandbox's traffic token in.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Which port of which sandbox a request is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub id: String,
    pub port: u16,
    /// The path prefix that named it, taken off before the request goes
    /// in (`None`: named by host).
    pub prefix: Option<String>,
}

/// A sandbox domain as the operator wrote it, made canonical: lower case,
/// no leading or trailing dot, only DNS name characters.
pub fn normalize_domain(text: &str) -> Result<String, String> {
    let domain = text.trim().trim_matches('.').to_ascii_lowercase();
    let valid = !domain.is_empty()
        && domain.len() <= 253
        && domain.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if valid {
        Ok(domain)
    } else {
        Err(format!("{text:?} is not a domain name"))
    }
}

/// A port number as a request writes it: digits only, 1 to 65535.
fn port_number(text: &str) -> Option<u16> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u16>().ok().filter(|p| *p != 0)
}

/// The target a `Host` of `PORT-SANDBOXID.DOMAIN` names.
pub fn by_host(headers: &HeaderMap, domain: Option<&str>) -> Option<Target> {
    let domain = domain?;
    let host = headers.get(header::HOST)?.to_str().ok()?;
    // Without the listener's port, if any.
    let host = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    if label.contains('.') {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    let port = port_number(port)?;
    is_sandbox_id(id).then(|| Target {
        id: id.to_owned(),
        port,
        prefix: None,
    })
}

/// The target a path of `/v1/sandboxes/SANDBOXID/ports/PORT[/REST]` names.
pub fn by_path(path: &str) -> Option<Target> {
    let rest = path.strip_prefix("/v1/sandboxes/")?;
    let (id, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("ports/")?;
    let (port, _) = rest.split_once('/').unwrap_or((rest, ""));
    if !is_sandbox_id(id) {
        return None;
    }
    let port_text = port;
    let port = port_number(port)?;
    Some(Target {
        id: id.to_owned(),
        port,
        prefix: Some(format!("/v1/sandboxes/{id}/ports/{port_text}")),
    })
}

/// The ports dialect.
#[derive(Clone)]
pub struct Ports {
    api: Api,
}

impl Ports {
    pub fn new(api: Api) -> Ports {
        Ports { api }
    }

    fn target(&self, path: &str, headers: &HeaderMap) -> Option<Target> {
        let config = self.api.daemon.config();
        by_host(headers, config.sandbox_domain.as_deref()).or_else(|| by_path(path))
    }
}

impl Dialect for Ports {
    fn claim(&self, request: &mut Request) -> bool {
        match self.target(request.uri().path(), request.headers()) {
            Some(target) => {
                request.extensions_mut().insert(target);
                true
            }
            None => false,
        }
    }

    fn audited(&self, path: &str, headers: &HeaderMap) -> Option<Audited> {
        let target = self.target(path, headers)?;
        Some(Audited {
            sandbox: Some(target.id.clone()),
            path: match target.prefix {
                Some(_) => path.to_owned(),
                None => format!("port {}: {path}", target.port),
            },
        })
    }

    fn serve(&self, mut request: Request) -> BoxFuture<'static, Response> {
        let api = self.api.clone();
        let target = request.extensions_mut().remove::<Target>();
        Box::pin(async move {
            match target {
                Some(target) => forward(api, target, request).await,
                None => ApiError::not_found("no such route").into_response(),
            }
        })
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// Whether a credential is one of the daemon's (an API key, a sandbox's
/// access or traffic token): such a value never goes into a sandbox.
fn is_daemon_secret(value: &str) -> bool {
    let value = value.trim();
    let value = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .unwrap_or(value)
        .trim();
    airlock_store::is_key_secret(value) || value.starts_with("at_") || value.starts_with("tt_")
}

/// Longest host mask.
const MAX_HOST_MASK: usize = 255;

/// Checks a host mask (`maskRequestHost`): a `Host` value once `${PORT}`
/// is replaced.
pub fn check_host_mask(mask: &str) -> Result<(), String> {
    let host = mask.replace("${PORT}", "65535");
    if mask.is_empty() || mask.len() > MAX_HOST_MASK {
        return Err(format!("must be 1 to {MAX_HOST_MASK} bytes"));
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b".-_:[]".contains(&b))
    {
        return Err(format!(
            "{mask:?} is not a host (letters, digits, `.-_:[]` and `${{PORT}}`)"
        ));
    }
    Ok(())
}

/// Checks a request may reach `id`'s ports; the `Host` mask it goes in
/// with, if any.
fn admit(api: &Api, id: &str, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(access) = api.daemon.port_access(id) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "sandbox_not_found",
            format!("The sandbox {id} was not found"),
        ));
    };
    let mask = access.host_mask;
    if access.public {
        return Ok(mask);
    }
    let opens = if let Some(token) = header_str(headers, TRAFFIC_TOKEN_HEADER) {
        Some(api.daemon.traffic_token_matches(id, token))
    } else if let Some(token) = header_str(headers, "x-access-token") {
        Some(api.daemon.access_token_matches(id, token))
    } else {
        let bearer = header_str(headers, header::AUTHORIZATION.as_str())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|b| airlock_store::is_key_secret(b));
        header_str(headers, "x-api-key").or(bearer).map(|secret| {
            matches!(
                api.daemon.with_store(|s| s.verify_key(secret)),
                Ok(Some(row)) if api.daemon.visible(&row, id).is_ok()
            )
        })
    };
    match opens {
        Some(true) => Ok(mask),
        Some(false) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "the credential does not open the ports of sandbox {id}: send its traffic token \
                 ({TRAFFIC_TOKEN_HEADER}), its access token (X-Access-Token) or an API key that \
                 may use it"
            ),
        )),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            format!(
                "the ports of sandbox {id} are not public: send its traffic token \
                 ({TRAFFIC_TOKEN_HEADER}), its access token (X-Access-Token) or an API key"
            ),
        )),
    }
}

/// Headers that belong to one hop, never forwarded (RFC 9110 §7.6.1);
/// `connection` and `upgrade` go on only for an upgrade.
const HOP_BY_HOP: &[&str] = &[
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// Whether the request asks to switch protocols (a WebSocket handshake).
fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Takes off what must not go in: hop-by-hop headers (and those the
/// `Connection` header names), the daemon's credentials (whichever opened
/// the request; an application's own keys and `Authorization` go in), e2b's
/// routing headers.
fn inward_headers(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|name| !(upgrade && name == header::UPGRADE))
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
    if !upgrade {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
    for name in [
        "x-api-key",
        "x-access-token",
        header::AUTHORIZATION.as_str(),
    ] {
        let secret = headers
            .get_all(name)
            .iter()
            .any(|v| v.to_str().is_ok_and(is_daemon_secret));
        if secret {
            headers.remove(name);
        }
    }
    for name in [
        TRAFFIC_TOKEN_HEADER,
        crate::e2b::SANDBOX_ID_HEADER,
        crate::e2b::SANDBOX_PORT_HEADER,
    ] {
        headers.remove(name);
    }
}

/// The URI the request goes in with: its path less the prefix that named
/// the target, and its query.
fn inward_uri(uri: &Uri, prefix: Option<&str>) -> Uri {
    let path = uri.path();
    let path = match prefix.and_then(|p| path.strip_prefix(p)) {
        Some("") => "/",
        Some(rest) => rest,
        None => path,
    };
    let text = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    text.parse().unwrap_or_else(|_| Uri::from_static("/"))
}

/// [`inward_uri`] for the fuzz targets.
#[cfg(feature = "fuzzing")]
pub fn fuzz_inward_uri(uri: &Uri, prefix: Option<&str>) -> Uri {
    inward_uri(uri, prefix)
}

/// [`inward_headers`] for the fuzz targets.
#[cfg(feature = "fuzzing")]
pub fn fuzz_inward_headers(headers: &mut HeaderMap, upgrade: bool) {
    inward_headers(headers, upgrade)
}

/// A 502 that says why the request could not go in.
fn bad_gateway(id: &str, port: u16, message: String) -> Response {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "port_unreachable",
        format!("sandbox {id}, port {port}: {message}"),
    )
    .into_response()
}

/// Sends `request` to port `target.port` of sandbox `target.id`, once the
/// request's credentials open it, and streams the answer back.
pub async fn forward(api: Api, target: Target, mut request: Request) -> Response {
    let Target { id, port, prefix } = target;
    let mask = match admit(&api, &id, request.headers()) {
        Ok(mask) => mask,
        Err(e) => return e.into_response(),
    };
    // `/v1/sandboxes/ID/ports/PORT` alone: on to its directory, so that
    // the relative links of a page served there resolve under it.
    if let Some(prefix) = &prefix {
        if request.uri().path() == prefix {
            let location = match request.uri().query() {
                Some(query) => format!("{prefix}/?{query}"),
                None => format!("{prefix}/"),
            };
            let mut response = StatusCode::PERMANENT_REDIRECT.into_response();
            if let Ok(value) = HeaderValue::from_str(&location) {
                response.headers_mut().insert(header::LOCATION, value);
            }
            return response;
        }
    }
    let upgrade = is_upgrade(request.headers());
    inward_headers(request.headers_mut(), upgrade);
    if let Some(mask) = mask {
        let host = mask.replace("${PORT}", &port.to_string());
        if let Ok(host) = HeaderValue::from_str(&host) {
            request.headers_mut().insert(header::HOST, host);
        }
    }
    if upgrade {
        return forward_upgrade(api, id, port, prefix, request).await;
    }
    // A paused sandbox wakes before a pooled connection is used, as it
    // would for a new one.
    if let Err(e) = api.daemon.reach_ports(&id).await {
        return port_error(&id, port, e);
    }
    let pool_key = match Uri::builder()
        .scheme("http")
        .authority(format!("{id}:{port}"))
        .path_and_query(inward_uri(request.uri(), prefix.as_deref()).to_string())
        .build()
    {
        Ok(uri) => uri,
        Err(e) => {
            return ApiError::bad_request(format!("the request's path cannot go in: {e}"))
                .into_response()
        }
    };
    *request.uri_mut() = pool_key;
    match api.ports.client.request(request).await {
        Ok(mut response) => {
            for name in HOP_BY_HOP {
                response.headers_mut().remove(*name);
            }
            response.map(Body::new)
        }
        Err(e) => {
            let daemon_error = std::error::Error::source(&e)
                .and_then(|source| source.downcast_ref::<ConnectFailed>())
                .and_then(|failed| {
                    failed
                        .0
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .take()
                });
            match daemon_error {
                Some(daemon_error) => port_error(&id, port, daemon_error),
                None => bad_gateway(
                    &id,
                    port,
                    format!("the service closed the connection without an answer ({e})"),
                ),
            }
        }
    }
}

/// The answer when the daemon could not open a connection to the port.
fn port_error(id: &str, port: u16, e: airlock_daemon::DaemonError) -> Response {
    match e {
        airlock_daemon::DaemonError::PortClosed(_) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "port_closed",
            format!("The sandbox {id} is running but there's no service running on port {port}."),
        )
        .into_response(),
        e => ApiError::from(e).into_response(),
    }
}

/// A request that switches protocols (a WebSocket handshake): on a
/// connection of its own, which becomes the upgraded stream.
async fn forward_upgrade(
    api: Api,
    id: String,
    port: u16,
    prefix: Option<String>,
    mut request: Request,
) -> Response {
    let stream = match api.daemon.open_port(&id, port).await {
        Ok(stream) => stream,
        Err(e) => return port_error(&id, port, e),
    };
    let client_upgrade = hyper::upgrade::on(&mut request);
    let held = crate::server::upgraded(&request);
    *request.uri_mut() = inward_uri(request.uri(), prefix.as_deref());
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream)).await {
            Ok(parts) => parts,
            Err(e) => return bad_gateway(&id, port, e.to_string()),
        };
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let mut response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(e) => {
            return bad_gateway(
                &id,
                port,
                format!("the service closed the connection without an answer ({e})"),
            )
        }
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let server_upgrade = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            if let (Ok(client), Ok(server)) = tokio::join!(client_upgrade, server_upgrade) {
                let mut client = TokioIo::new(client);
                let mut server = TokioIo::new(server);
                // The connection counts against the daemon's caps until
                // this ends; made room for, it ends.
                let evicted = async {
                    match &held {
                        Some(held) => held.evicted().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    () = evicted => {}
                }
            }
            drop(held);
        });
    } else {
        for name in HOP_BY_HOP {
            response.headers_mut().remove(*name);
        }
    }
    response.map(Body::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn hosts_name_a_port_of_a_sandbox_under_the_domain_only() {
        let domain = Some("sbx.example.test");
        let target = by_host(&host("8000-sbx-0123.sbx.example.test:7070"), domain).unwrap();
        assert_eq!((target.id.as_str(), target.port), ("sbx-0123", 8000));
        assert_eq!(target.prefix, None);
        assert!(by_host(&host("8000-SBX-0123.SBX.example.test."), domain).is_some());
        for other in [
            "8000-sbx-0123.other.test",
            "8000-sbx-0123.evil-sbx.example.test",
            "a.8000-sbx-0123.sbx.example.test",
            "sbx.example.test",
            "0-sbx-0123.sbx.example.test",
            "70000-sbx-0123.sbx.example.test",
            "+80-sbx-0123.sbx.example.test",
            "8000-.sbx.example.test",
            "8000-sbx-0123xsbx.example.test",
        ] {
            assert_eq!(by_host(&host(other), domain), None, "{other}");
        }
        assert_eq!(by_host(&host("8000-sbx-0123.sbx.example.test"), None), None);
    }

    #[test]
    fn paths_name_a_port_and_lose_their_prefix() {
        let target = by_path("/v1/sandboxes/sbx-1/ports/8080/a/b").unwrap();
        assert_eq!((target.id.as_str(), target.port), ("sbx-1", 8080));
        let prefix = target.prefix.as_deref();
        assert_eq!(prefix, Some("/v1/sandboxes/sbx-1/ports/8080"));
        let uri: Uri = "/v1/sandboxes/sbx-1/ports/8080/a/b?x=1".parse().unwrap();
        assert_eq!(inward_uri(&uri, prefix), "/a/b?x=1");
        let uri: Uri = "/v1/sandboxes/sbx-1/ports/8080/".parse().unwrap();
        assert_eq!(inward_uri(&uri, prefix), "/");
        assert!(by_path("/v1/sandboxes/sbx-1/ports/8080").is_some());
        for other in [
            "/v1/sandboxes/sbx-1",
            "/v1/sandboxes/sbx-1/ports",
            "/v1/sandboxes/sbx-1/ports/",
            "/v1/sandboxes/sbx-1/ports/0/",
            "/v1/sandboxes/sbx-1/ports/x/",
            "/v1/sandboxes/sbx-1/exec",
            "/v1/sandboxes/../ports/80/",
        ] {
            assert_eq!(by_path(other), None, "{other}");
        }
    }

    #[test]
    fn credentials_and_hop_headers_never_go_in() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("x-api-key", "e2b_0123"),
            ("x-access-token", "app-token"),
            ("e2b-traffic-access-token", "tt_x"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("e2b-sandbox-id", "sbx-1"),
            ("x-app", "kept"),
            ("authorization", "Basic app-credential"),
        ] {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        inward_headers(&mut headers, false);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        // A daemon secret never goes in, whichever opened the request.
        assert!(!left.contains(&"x-api-key"));
        assert!(!left.contains(&"e2b-traffic-access-token"));
        // An application's own token does.
        assert!(left.contains(&"x-access-token"));
        assert!(!left.contains(&"connection"));
        assert!(!left.contains(&"x-private"));
        assert!(!left.contains(&"keep-alive"));
        assert!(!left.contains(&"transfer-encoding"));
        assert!(!left.contains(&"e2b-sandbox-id"));
        assert!(left.contains(&"x-app"));
        // An application's own Authorization goes in; a bearer API key
        // does not.
        assert!(left.contains(&"authorization"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer at_0123"),
        );
        inward_headers(&mut headers, false);
        assert!(!headers.contains_key(header::AUTHORIZATION));
    }

    #[test]
    fn domains_are_made_canonical_or_refused() {
        assert_eq!(
            normalize_domain(".Sbx.Example.test.").unwrap(),
            "sbx.example.test"
        );
        for bad in ["", ".", "a..b", "-a.b", "a_b.c", "a b", "ä.b"] {
            assert!(normalize_domain(bad).is_err(), "{bad}");
        }
    }
}
