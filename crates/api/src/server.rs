//! The daemon's HTTP/1.1 server: the accept loop in front of [`router`],
//! built so that strangers cannot stall it.
//!
//! - **Caps.** At most [`ServerLimits::max_connections`] connections in
//!   all and [`ServerLimits::max_per_peer`] from one address. A connection
//!   that would pass a cap takes the place of the oldest one that is
//!   *evictable*: first one with no request in flight (idle keep-alive, or
//!   a client still sending its head), then one whose request in flight
//!   was never authenticated (a stranger sending a slow body or not
//!   reading its answer). Connections serving an authenticated request are
//!   never evicted, so an authenticated client gets through however many
//!   idle or slow connections strangers hold. When nothing can be evicted
//!   the new connection is answered `503 too_many_connections` with
//!   `Retry-After` and closed. A connection upgraded to a forwarded
//!   WebSocket (`crate::ports`) keeps its place until the WebSocket ends,
//!   counted as a request in flight.
//! - **Timeouts.** A request head must arrive within
//!   [`ServerLimits::header_timeout`] of the connection being ready for
//!   one (this is also the keep-alive idle timeout); an answer whose bytes
//!   the client stops taking for [`ServerLimits::write_stall`] ends the
//!   connection; bodies read before authentication have their own deadline
//!   (`crate::read_small_body`).
//! - **Descriptors.** [`raise_descriptor_limit`] lifts `RLIMIT_NOFILE` so
//!   the caps, not the kernel, decide.
//!
//! [`router`]: crate::router

use airlock_daemon::Daemon;
use axum::body::Body;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tower::ServiceExt;

/// What the server allows.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Connections open at once, in all.
    pub max_connections: usize,
    /// Connections open at once from one address.
    pub max_per_peer: usize,
    /// Time to send a request head (and keep-alive idle time).
    pub header_timeout: Duration,
    /// Time an answer may wait for the client to take its bytes.
    pub write_stall: Duration,
    /// Time in-flight requests get to finish on shutdown.
    pub shutdown_grace: Duration,
    /// Run (on a blocking thread) once a burst of connections is over: the
    /// binary gives the memory the allocator kept for them back to the
    /// system. (This crate has no `unsafe`, and that is a libc call.)
    pub after_burst: fn(),
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 16_384,
            max_per_peer: 4_096,
            header_timeout: Duration::from_secs(30),
            write_stall: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            after_burst: || {},
        }
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one, and the hard one to
/// `want` when allowed (root may, up to `fs.nr_open`); returns the soft
/// limit in force.
pub fn raise_descriptor_limit(want: u64) -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let current = getrlimit(Resource::Nofile);
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let hard = current.maximum.unwrap_or(u64::MAX);
    let target = want.min(nr_open);
    if hard < target
        && setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum: Some(target),
            },
        )
        .is_ok()
    {
        return target;
    }
    let soft = hard.min(target.max(current.current.unwrap_or(0)));
    if setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(soft),
            maximum: current.maximum,
        },
    )
    .is_ok()
    {
        return soft;
    }
    current.current.unwrap_or(0)
}

/// Connections the kernel queues before they are accepted (it caps this
/// at `net.core.somaxconn`). A burst of connections past a short queue
/// waits out a SYN retransmit (a second) each.
const BACKLOG: u32 = 4096;

/// Binds the daemon's listener (with address reuse, as servers do).
pub fn listen(address: SocketAddr) -> io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(BACKLOG)
}

/// One connection as the caps see it.
struct Connection {
    peer: IpAddr,
    /// Requests being served (their answers included).
    in_flight: AtomicUsize,
    /// Whether a request on it was authenticated.
    trusted: AtomicBool,
    /// Told to close.
    evict: Notify,
    /// The request head being read names its body's length two ways.
    framed_twice: AtomicBool,
}

/// Marks the connection a request came on as carrying an authenticated
/// caller (put into every request's extensions).
#[derive(Clone)]
pub struct ConnectionTrust(Arc<Connection>);

impl ConnectionTrust {
    /// The connection's requests are an authenticated caller's: it is
    /// not evicted while one is in flight.
    pub fn trust(&self) {
        self.0.trusted.store(true, Ordering::Relaxed);
    }
}

/// A connection upgraded (to a WebSocket) and forwarded: it counts as a
/// request in flight for as long as this is held, so it is evicted only if
/// its caller was never authenticated, and then [`Upgraded::evicted`]
/// resolves for the forwarder to end it.
pub(crate) struct Upgraded {
    _in_flight: InFlight,
    connection: Arc<Connection>,
}

impl Upgraded {
    /// Resolves once the connection is chosen to make room.
    pub(crate) async fn evicted(&self) {
        self.connection.evict.notified().await;
    }
}

/// Holds `request`'s connection as [`Upgraded`] (`None` for a request that
/// did not come through this server, as in tests of the router alone).
pub(crate) fn upgraded(request: &Request) -> Option<Upgraded> {
    let trust = request.extensions().get::<ConnectionTrust>()?;
    Some(Upgraded {
        _in_flight: InFlight::enter(&trust.0),
        connection: Arc::clone(&trust.0),
    })
}

/// Marks `request`'s connection as authenticated (see [`ConnectionTrust`]).
pub fn trust(request: &Request) {
    if let Some(trust) = request.extensions().get::<ConnectionTrust>() {
        trust.trust();
    }
}

#[derive(Default)]
struct Table {
    /// By accept order, oldest first.
    open: BTreeMap<u64, Arc<Connection>>,
    per_peer: HashMap<IpAddr, usize>,
    next: u64,
    /// Most connections open at once since memory was last given back.
    peak: usize,
}

impl Table {
    /// The oldest connection that may give way, preferring idle ones;
    /// among those of `peer` when given.
    fn victim(&self, peer: Option<IpAddr>) -> Option<u64> {
        let candidates = || {
            self.open
                .iter()
                .filter(move |(_, c)| peer.is_none_or(|p| c.peer == p))
        };
        candidates()
            .find(|(_, c)| c.in_flight.load(Ordering::Relaxed) == 0)
            .or_else(|| candidates().find(|(_, c)| !c.trusted.load(Ordering::Relaxed)))
            .map(|(id, _)| *id)
    }

    fn remove(&mut self, id: u64) -> Option<Arc<Connection>> {
        let connection = self.open.remove(&id)?;
        if let Some(count) = self.per_peer.get_mut(&connection.peer) {
            *count -= 1;
            if *count == 0 {
                self.per_peer.remove(&connection.peer);
            }
        }
        Some(connection)
    }
}

/// Why a connection was turned away.
enum Admission {
    Admitted(u64, Arc<Connection>),
    Refused,
}

struct Connections {
    limits: ServerLimits,
    table: Mutex<Table>,
}

impl Connections {
    /// Admits a connection from `peer`, evicting one if a cap is reached.
    fn admit(&self, peer: IpAddr, daemon: &Daemon) -> Admission {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let from_peer = table.per_peer.get(&peer).copied().unwrap_or(0);
        let needs_room = if from_peer >= self.limits.max_per_peer {
            Some(Some(peer))
        } else if table.open.len() >= self.limits.max_connections {
            Some(None)
        } else {
            None
        };
        if let Some(among) = needs_room {
            let Some(victim) = table.victim(among) else {
                return Admission::Refused;
            };
            tracing::debug!(victim, "evicting");
            if let Some(evicted) = table.remove(victim) {
                evicted.evict.notify_one();
                daemon.metrics().http_connections_evicted.inc();
            }
        }
        let connection = Arc::new(Connection {
            peer,
            in_flight: AtomicUsize::new(0),
            trusted: AtomicBool::new(false),
            evict: Notify::new(),
            framed_twice: AtomicBool::new(false),
        });
        table.next += 1;
        let id = table.next;
        table.open.insert(id, Arc::clone(&connection));
        table.peak = table.peak.max(table.open.len());
        *table.per_peer.entry(peer).or_default() += 1;
        daemon
            .metrics()
            .http_connections
            .set(table.open.len() as i64);
        Admission::Admitted(id, connection)
    }

    fn close(&self, id: u64, daemon: &Daemon) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.remove(id);
        daemon
            .metrics()
            .http_connections
            .set(table.open.len() as i64);
        if burst_is_over(table.peak, table.open.len()) {
            table.peak = table.open.len();
            drop(table);
            // (A stream dropped outside the runtime, at its shutdown, has
            // no burst to recover from.)
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn_blocking(self.limits.after_burst);
            }
        }
    }
}

/// A connection's place in the table, given up when the connection's
/// stream is dropped: after its last answer, or, for a connection upgraded
/// to a WebSocket, when the forwarded stream ends (so it keeps counting
/// against the caps all that time).
struct Release {
    connections: Arc<Connections>,
    id: u64,
    daemon: Daemon,
}

impl Drop for Release {
    fn drop(&mut self) {
        self.connections.close(self.id, &self.daemon);
    }
}

/// Connections open at once past which a burst is worth giving memory
/// back after.
const BURST: usize = 1_000;

/// Whether a burst of connections (at least [`BURST`] open at once) is
/// over: a tenth of its peak is left.
fn burst_is_over(peak: usize, open: usize) -> bool {
    peak >= BURST && open <= peak / 10
}

/// What a connection turned away is told before it is closed.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 97\r\n\r\n\
{\"code\":\"too_many_connections\",\"message\":\"the daemon has as many connections as it takes; retry\"}";

/// Refused connections being answered at once; past it they are just
/// closed.
const REFUSALS_AT_ONCE: usize = 256;

/// Answers a connection turned away and closes it. What the client sent
/// is drained for a moment first, so the close does not reset the
/// connection before the client reads the answer.
fn refuse(mut stream: TcpStream, refusing: &Arc<tokio::sync::Semaphore>) {
    let Ok(permit) = Arc::clone(refusing).try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            stream.write_all(REFUSAL).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 4096];
            let mut drained = 0;
            while drained < 64 << 10 {
                match stream.read(&mut sink).await? {
                    0 => break,
                    n => drained += n,
                }
            }
            io::Result::Ok(())
        })
        .await;
    });
}

/// Serves the daemon's API on `listener` until `shutdown` resolves, then
/// lets in-flight requests finish for [`ServerLimits::shutdown_grace`].
pub async fn serve(
    listener: TcpListener,
    daemon: Daemon,
    limits: ServerLimits,
    dialects: crate::Dialects,
    shutdown: impl Future<Output = ()>,
) {
    let router = crate::router_with(daemon.clone(), dialects);
    let connections = Arc::new(Connections {
        limits,
        table: Mutex::default(),
    });
    let refusing = Arc::new(tokio::sync::Semaphore::new(REFUSALS_AT_ONCE));
    let (stopping, stop) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors or memory: wait a little rather than spin.
                    tracing::warn!("cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Reap finished connection tasks as we go.
        while tasks.try_join_next().is_some() {}
        let _ = stream.set_nodelay(true);
        tracing::debug!(%peer, "accepted");
        let (id, connection) = match connections.admit(peer.ip(), &daemon) {
            Admission::Admitted(id, connection) => (id, connection),
            Admission::Refused => {
                daemon.metrics().http_connections_refused.inc();
                refuse(stream, &refusing);
                continue;
            }
        };
        let router = router.clone();
        let release = Release {
            connections: Arc::clone(&connections),
            id,
            daemon: daemon.clone(),
        };
        let mut stop = stop.clone();
        tasks.spawn(async move {
            serve_connection(
                stream,
                peer,
                router,
                &connection,
                release,
                limits,
                &mut stop,
            )
            .await;
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            "{} connections still open after the shutdown grace; closing them",
            tasks.len()
        );
        tasks.abort_all();
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: axum::Router,
    connection: &Arc<Connection>,
    release: Release,
    limits: ServerLimits,
    stop: &mut watch::Receiver<bool>,
) {
    let trust = ConnectionTrust(Arc::clone(connection));
    let tracked = Arc::clone(connection);
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let router = router.clone();
        let trust = trust.clone();
        let in_flight = InFlight::enter(&tracked);
        let framed_twice = tracked.framed_twice.swap(false, Ordering::Relaxed);
        async move {
            if framed_twice {
                // RFC 9112 §6.1 lets a server reject this outright, and a
                // request framed two ways is how requests are smuggled past
                // proxies: refuse it, and the connection with it.
                let mut response = axum::response::IntoResponse::into_response(
                    crate::error::ApiError::bad_request(
                        "a request may not carry both Content-Length and Transfer-Encoding",
                    ),
                );
                response.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
                return Ok(response.map(|body| {
                    Body::new(Tracked {
                        body,
                        _in_flight: in_flight,
                    })
                }));
            }
            let mut request = request.map(Body::new);
            request.extensions_mut().insert(trust);
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let response = match router.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            // The request is in flight until its answer is sent.
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                Body::new(Tracked {
                    body,
                    _in_flight: in_flight,
                })
            }))
        }
    });
    let io = TokioIo::new(Stalling::new(
        stream,
        limits.write_stall,
        Arc::clone(connection),
        release,
    ));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    // With upgrades: a forwarded WebSocket (see `crate::ports`) takes the
    // connection over once its answer is 101.
    let serving = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(serving);
    tokio::select! {
        result = serving.as_mut() => {
            if let Err(e) = result {
                tracing::debug!("connection from {peer}: {e}");
            }
        }
        () = connection.evict.notified() => {
            tracing::debug!("connection from {peer} closed to make room");
        }
        () = stopped(stop) => {
            serving.as_mut().graceful_shutdown();
            let _ = serving.await;
        }
    }
}

/// Resolves once the server stops (or is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Counts a request in flight until dropped.
struct InFlight(Arc<Connection>);

impl InFlight {
    fn enter(connection: &Arc<Connection>) -> InFlight {
        connection.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(connection))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An answer's body that keeps its request counted in flight.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A stream whose writes fail once the peer has taken no bytes for
/// `stall`, and which looks at each request head that arrives while no
/// request is in flight for a length given two ways (hyper reads such a
/// request by its Transfer-Encoding and drops the Content-Length, so
/// nothing after it can tell).
struct Stalling {
    inner: TcpStream,
    stall: Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    connection: Arc<Connection>,
    /// The head read so far, while one is being looked at.
    head: Option<Vec<u8>>,
    /// The connection's place in the table, for as long as this stream is.
    _release: Release,
}

/// Longest head looked at (hyper refuses longer ones itself).
const MAX_HEAD_LOOKED_AT: usize = 64 << 10;

/// Whether `head` (ending in its blank line) names a Content-Length and a
/// Transfer-Encoding; `None` while it cannot be parsed.
fn framed_twice(head: &[u8]) -> Option<bool> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {
            let has = |name: &str| {
                request
                    .headers
                    .iter()
                    .any(|h| h.name.eq_ignore_ascii_case(name))
            };
            Some(has("content-length") && has("transfer-encoding"))
        }
        _ => None,
    }
}

impl Stalling {
    fn new(
        inner: TcpStream,
        stall: Duration,
        connection: Arc<Connection>,
        release: Release,
    ) -> Stalling {
        Stalling {
            inner,
            stall,
            deadline: None,
            connection,
            head: None,
            _release: release,
        }
    }

    /// Looks at bytes just read for a head framed two ways.
    fn look_at(&mut self, bytes: &[u8]) {
        if self.head.is_none() && self.connection.in_flight.load(Ordering::Relaxed) == 0 {
            self.head = Some(Vec::new());
        }
        let Some(head) = &mut self.head else { return };
        let room = MAX_HEAD_LOOKED_AT.saturating_sub(head.len());
        head.extend_from_slice(&bytes[..bytes.len().min(room)]);
        let Some(end) = memchr::memmem::find(head, b"\r\n\r\n") else {
            if head.len() >= MAX_HEAD_LOOKED_AT {
                self.head = None;
            }
            return;
        };
        if framed_twice(&head[..end + 4]) == Some(true) {
            self.connection.framed_twice.store(true, Ordering::Relaxed);
        }
        self.head = None;
    }

    /// `Ready(Err)` once the write has been pending for `stall`.
    fn stalled(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let stall = self.stall;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        ready!(deadline.as_mut().poll(cx));
        Poll::Ready(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client took no bytes of the answer",
        ))
    }

    fn progressed<T>(
        &mut self,
        result: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        match result {
            Poll::Ready(result) => {
                self.deadline = None;
                Poll::Ready(result)
            }
            Poll::Pending => match self.stalled(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncRead for Stalling {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let result = ready!(Pin::new(&mut this.inner).poll_read(cx, buf));
        if result.is_ok() && buf.filled().len() > before {
            this.look_at(&buf.filled()[before..]);
        }
        Poll::Ready(result)
    }
}

impl AsyncWrite for Stalling {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.progressed(result, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.progressed(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let result = Pin::new(&mut this.inner).poll_flush(cx);
        this.progressed(result, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(peer: [u8; 4], in_flight: usize, trusted: bool) -> Arc<Connection> {
        Arc::new(Connection {
            peer: IpAddr::from(peer),
            in_flight: AtomicUsize::new(in_flight),
            trusted: AtomicBool::new(trusted),
            evict: Notify::new(),
            framed_twice: AtomicBool::new(false),
        })
    }

    fn table(connections: Vec<Arc<Connection>>) -> Table {
        let mut table = Table::default();
        for connection in connections {
            table.next += 1;
            *table.per_peer.entry(connection.peer).or_default() += 1;
            table.open.insert(table.next, connection);
        }
        table
    }

    #[test]
    fn idle_connections_give_way_first_then_strangers_never_the_authenticated() {
        let table = table(vec![
            connection([10, 0, 0, 1], 1, true),  // 1: serving a key holder
            connection([10, 0, 0, 1], 1, false), // 2: a stranger's slow request
            connection([10, 0, 0, 2], 0, false), // 3: idle
            connection([10, 0, 0, 1], 0, true),  // 4: idle, was a key holder's
        ]);
        assert_eq!(table.victim(None), Some(3), "the oldest idle one");
        assert_eq!(table.victim(Some(IpAddr::from([10, 0, 0, 1]))), Some(4));
        let busy = self::table(vec![
            connection([10, 0, 0, 1], 1, true),
            connection([10, 0, 0, 1], 2, false),
        ]);
        assert_eq!(busy.victim(None), Some(2), "a stranger's request in flight");
        let serving = self::table(vec![connection([10, 0, 0, 1], 1, true)]);
        assert_eq!(serving.victim(None), None, "an authenticated request stays");
    }

    #[test]
    fn memory_is_given_back_once_a_burst_is_over() {
        assert!(!burst_is_over(999, 0), "not a burst");
        assert!(!burst_is_over(20_000, 2_001), "still going");
        assert!(burst_is_over(20_000, 2_000));
        assert!(burst_is_over(1_000, 0));
    }

    #[test]
    fn a_head_framed_two_ways_is_seen() {
        let both = b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(framed_twice(both), Some(true));
        let one = b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(framed_twice(one), Some(false));
        assert_eq!(framed_twice(b"POST / HTTP/1.1\r\nHost"), None);
    }

    #[test]
    fn the_refusal_is_a_whole_http_answer() {
        let text = std::str::from_utf8(REFUSAL).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), length);
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["code"], "too_many_connections");
    }
}
