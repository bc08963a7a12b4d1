//! Who is calling.
//!
//! An API key (`X-API-Key: e2b_…` or `Authorization: Bearer e2b_…`; keys
//! made before are `al_…` and still valid) opens
//! every route; its owner sees its own sandboxes (an admin key sees all).
//! A sandbox's access token (`X-Access-Token: at_…` or a bearer token that
//! is not an API key) opens only the data-plane routes of that one sandbox:
//! `/v1/sandboxes/{id}` (read) and everything below it except `timeout`.
//! Secrets are compared by the store in constant time on their SHA-256.

use crate::error::ApiError;
use airlock_daemon::Daemon;
use airlock_store::KeyRow;
use axum::http::{header, HeaderMap, Method};

/// The authenticated caller, put into each request's extensions.
#[derive(Debug, Clone)]
pub enum Caller {
    /// An API key.
    Key(KeyRow),
    /// The access token of this sandbox.
    Sandbox(String),
}

impl Caller {
    /// The key, for calls that need one.
    pub fn key(&self) -> Result<&KeyRow, ApiError> {
        match self {
            Caller::Key(key) => Ok(key),
            Caller::Sandbox(_) => Err(ApiError::new(
                axum::http::StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this call needs an API key; an access token opens only its sandbox's data plane",
            )),
        }
    }

    /// The key, for calls only an admin key may make (403 for any other).
    pub fn admin(&self) -> Result<&KeyRow, ApiError> {
        let key = self.key()?;
        if !key.is_admin {
            return Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "forbidden",
                "this call needs an admin API key",
            ));
        }
        Ok(key)
    }

    /// Checks the caller may use sandbox `id`; an unknown sandbox and one the
    /// caller may not see answer the same 404.
    pub fn may_use(&self, daemon: &Daemon, id: &str) -> Result<(), ApiError> {
        match self {
            Caller::Key(key) => daemon.visible(key, id).map_err(ApiError::from),
            Caller::Sandbox(own) if own == id => Ok(()),
            Caller::Sandbox(_) => Err(ApiError::not_found(format!("no sandbox {id}"))),
        }
    }

    /// A label for the access log.
    pub fn label(&self) -> String {
        match self {
            Caller::Key(key) => key.id.clone(),
            Caller::Sandbox(id) => format!("token:{id}"),
        }
    }
}

/// The sandbox id an access token may open on this route, if any.
fn token_scope(method: &Method, path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v1/sandboxes/")?;
    let (id, sub) = match rest.split_once('/') {
        Some((id, sub)) => (id, Some(sub)),
        None => (rest, None),
    };
    let allowed = match sub {
        None => method == Method::GET,
        Some("timeout") => false,
        Some(_) => true,
    };
    (allowed && !id.is_empty()).then(|| id.to_owned())
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// Authenticates a request from its headers.
pub fn authenticate(
    daemon: &Daemon,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Result<Caller, ApiError> {
    let bearer = header_str(headers, header::AUTHORIZATION.as_str())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let key =
        header_str(headers, "x-api-key").or(bearer.filter(|b| airlock_store::is_key_secret(b)));
    if let Some(secret) = key {
        return match daemon.with_store(|s| s.verify_key(secret)) {
            Ok(Some(row)) => Ok(Caller::Key(row)),
            Ok(None) => Err(ApiError::unauthorized()),
            // A store that cannot answer says nothing about the key.
            Err(e) => Err(ApiError::from(airlock_daemon::DaemonError::from(e))),
        };
    }
    let token = header_str(headers, "x-access-token").or(bearer);
    if let (Some(token), Some(id)) = (token, token_scope(method, path)) {
        if daemon.access_token_matches(&id, token) {
            return Ok(Caller::Sandbox(id));
        }
    }
    Err(ApiError::unauthorized())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_open_only_their_sandbox_data_plane() {
        let get = Method::GET;
        let post = Method::POST;
        let delete = Method::DELETE;
        assert_eq!(
            token_scope(&get, "/v1/sandboxes/sbx-1"),
            Some("sbx-1".into())
        );
        assert_eq!(token_scope(&delete, "/v1/sandboxes/sbx-1"), None);
        assert_eq!(token_scope(&post, "/v1/sandboxes/sbx-1/timeout"), None);
        assert_eq!(
            token_scope(&post, "/v1/sandboxes/sbx-1/exec"),
            Some("sbx-1".into())
        );
        assert_eq!(
            token_scope(&get, "/v1/sandboxes/sbx-1/files"),
            Some("sbx-1".into())
        );
        assert_eq!(token_scope(&get, "/v1/sandboxes"), None);
        assert_eq!(token_scope(&get, "/v1/sandboxes/"), None);
        assert_eq!(token_scope(&get, "/metrics"), None);
    }
}
