//! The seam every dialect plugs into: the wires other than the native API
//! (e2b's, DeerFlow's AIO) served on the daemon's one port.
//!
//! One request pipeline serves them all: [`observe`](crate) gives every
//! request its id and records it, then [`demux`] asks each dialect in turn
//! whether a request is its own; the first that claims it serves it
//! whole (its own authentication, body handling and errors), and a request
//! nobody claims goes on to the native API. Nothing outside a dialect's
//! module knows its paths or headers: it says what it claims and what the
//! audit trail keeps of a request ([`Dialect::audited`]).

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use futures_util::future::BoxFuture;
use std::sync::Arc;

/// What the audit trail keeps of a dialect's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audited {
    /// The sandbox it touches, if one.
    pub sandbox: Option<String>,
    /// Its path as recorded (secrets in it cut out).
    pub path: String,
}

/// A wire some clients speak.
pub trait Dialect: Send + Sync + 'static {
    /// Whether `request` is one of its own. It may mark the request for
    /// itself on the way (e.g. name the sandbox a call without its header
    /// is for).
    fn claim(&self, request: &mut Request) -> bool;

    /// What the audit trail keeps of a request of its own (`None`: the
    /// request is not its own, or not one it records).
    fn audited(&self, path: &str, headers: &HeaderMap) -> Option<Audited>;

    /// Serves a request it claimed.
    fn serve(&self, request: Request) -> BoxFuture<'static, Response>;
}

/// The dialects the daemon serves, asked in order.
#[derive(Clone, Default)]
pub struct Dialects(Arc<Vec<Arc<dyn Dialect>>>);

impl Dialects {
    pub fn new(dialects: Vec<Arc<dyn Dialect>>) -> Dialects {
        Dialects(Arc::new(dialects))
    }

    /// What the audit trail keeps of `path`, if a dialect records it.
    pub fn audited(&self, path: &str, headers: &HeaderMap) -> Option<Audited> {
        self.0.iter().find_map(|d| d.audited(path, headers))
    }
}

/// Hands each request to the first dialect that claims it, or on.
pub async fn demux(State(dialects): State<Dialects>, mut request: Request, next: Next) -> Response {
    for dialect in dialects.0.iter() {
        if dialect.claim(&mut request) {
            return dialect.serve(request).await;
        }
    }
    next.run(request).await
}
