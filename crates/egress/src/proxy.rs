//! The transparent TCP proxy (see the crate doc for the decision order).

use crate::{EgressEvent, Shared};
use airlock_egress_parse::{
    http_host, one_request_only, origin_form, tls_sni, Sniffed, MAX_SNIFF_BYTES,
};
use airlock_policy::{canonical_host, Decision, Destination, Host};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a connection may take to name its host.
const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes each direction of a proxied connection moves per read.
const COPY_BUFFER: usize = 256 << 10;
/// How long connecting upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Accepts redirected connections until the attachment is dropped.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        // Past the sandbox's connection rate or count the connection is
        // closed at once, before anything is read or resolved.
        let permit = match shared.connections.enter() {
            Ok(permit) => permit,
            Err(refused) => {
                if refused.report() {
                    let original = original_destination(&stream);
                    let destination =
                        original.map_or_else(|| "proxy".into(), |o| o.ip().to_string());
                    let port = original.map_or(0, |o| o.port());
                    shared.limited("tcp", &destination, port, refused);
                }
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _permit = permit;
            handle(stream, &shared).await;
        });
    }
}

async fn handle(mut inside: TcpStream, shared: &Shared) {
    let _ = inside.set_nodelay(true);
    let local = inside.local_addr().ok();
    let original = original_destination(&inside);
    // A connection made to the proxy itself (not redirected, or sent to
    // the address sandboxes name it by): a tool using it as its
    // HTTP(S)_PROXY.
    let Some(original) = original.filter(|o| Some(*o) != local && !names_the_proxy(*o)) else {
        explicit(inside, shared).await;
        return;
    };
    let policy = shared.policy();
    let port = original.port();
    let unnamed = host_guard(
        original.ip(),
        policy.decide(&Destination {
            host: None,
            ip: original.ip(),
            port,
        }),
    );
    if unnamed.is_allowed() {
        if let Some(upstream) = connect(original).await {
            report(shared, &original.ip().to_string(), port, &unnamed);
            splice(inside, upstream, Vec::new()).await;
        }
        return;
    }
    let (named, first) = sniff(&mut inside).await;
    let Some(raw) = named else {
        report(shared, &original.ip().to_string(), port, &unnamed);
        return;
    };
    let host = match canonical_host(&raw) {
        Ok(host) => host,
        Err(_) => {
            shared.refuse("tcp", &raw, port, "bad_host");
            return;
        }
    };
    // A literal is judged against where the connection goes; a name is
    // resolved on the host and connected where it resolves.
    if let Some((upstream, decision, label)) =
        judge_and_connect(shared, &host, Some(original.ip()), port).await
    {
        report(shared, &label, port, &decision);
        // Plain HTTP is judged by its first request's Host: the server
        // must serve that one alone (TLS bytes pass untouched).
        splice(inside, upstream, one_request_only(first)).await;
    }
}

/// Refuses addresses of the host itself (its public and private
/// interfaces, where the daemon and other services may listen) even when
/// the policy would allow them: they are not "the internet".
fn host_guard(ip: IpAddr, decision: Decision) -> Decision {
    if decision.is_allowed() && crate::is_host_address(ip) {
        return Decision::Deny {
            reason: airlock_policy::DenyReason::HostAddress,
            rule: None,
        };
    }
    decision
}

fn report(shared: &Shared, destination: &str, port: u16, decision: &Decision) {
    let (allowed, reason, rule) = match decision {
        Decision::Allow { rule } => (true, "allowed", rule.clone()),
        Decision::Deny { reason, rule } => (false, reason.code(), rule.clone()),
    };
    shared.report(EgressEvent {
        sandbox: shared.sandbox.clone(),
        protocol: "tcp",
        destination: destination.to_owned(),
        port,
        allowed,
        reason,
        rule,
    });
}

/// A request to the proxy as an HTTP proxy: `CONNECT host:port` (answered
/// `200` and then spliced; the TLS ClientHello that follows must name the
/// same host) or an absolute-form request (`GET http://host/…`, passed on
/// as it is). The host is judged exactly as a transparent connection's
/// name is.
async fn explicit(mut inside: TcpStream, shared: &Shared) {
    const FORBIDDEN: &[u8] =
        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    const BAD: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let mut first = Vec::new();
    let sniffed = read_until(&mut inside, &mut first, |bytes| match http_host(bytes) {
        Sniffed::NeedMore => None,
        other => Some(other),
    })
    .await;
    let Some(Sniffed::Name { host: raw, port }) = sniffed else {
        let _ = inside.write_all(BAD).await;
        return;
    };
    let tunnel = first.starts_with(b"CONNECT ");
    let port = port.unwrap_or(80);
    let Ok(host) = canonical_host(&raw) else {
        let _ = inside.write_all(BAD).await;
        return;
    };
    let Some((upstream, decision, label)) = judge_and_connect(shared, &host, None, port).await
    else {
        let _ = inside.write_all(FORBIDDEN).await;
        return;
    };
    report(shared, &label, port, &decision);
    if !tunnel {
        // One request per judged host: a client reusing its connection to
        // the proxy for another URL must open a new one.
        splice(inside, upstream, origin_form(one_request_only(first))).await;
        return;
    }
    let head_end = first
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(first.len(), |at| at + 4);
    let mut rest = first.split_off(head_end);
    if inside
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    // The tunnel must carry TLS for the host it was opened to.
    let hello = read_until(&mut inside, &mut rest, |bytes| match tls_sni(bytes) {
        Sniffed::NeedMore => None,
        other => Some(other),
    })
    .await;
    if let Some(Sniffed::Name { host: sni, .. }) = hello {
        if canonical_host(&sni).ok().as_ref() != Some(&host) {
            shared.refuse("tcp", &sni, port, "sni_mismatch");
            return;
        }
    }
    splice(inside, upstream, rest).await;
}

/// Resolves (for a name) and judges `host`, and connects to the first
/// address the policy allows. Refusals are reported here.
async fn judge_and_connect(
    shared: &Shared,
    host: &Host,
    original: Option<IpAddr>,
    port: u16,
) -> Option<(TcpStream, Decision, String)> {
    let policy = shared.policy();
    let label = match host {
        Host::Name(name) => name.as_str().to_owned(),
        Host::Ip(ip) => ip.to_string(),
    };
    let candidates = match host {
        Host::Ip(ip) => vec![original.unwrap_or(*ip)],
        Host::Name(name) => {
            if !policy.allows_name(name.as_str()) {
                let decision = match original {
                    Some(ip) => policy.decide(&Destination {
                        host: Some(host.clone()),
                        ip,
                        port,
                    }),
                    None => Decision::Deny {
                        reason: policy.name_refusal(),
                        rule: None,
                    },
                };
                report(shared, &label, port, &decision);
                return None;
            }
            match shared.resolver.lookup(name.as_str()).await {
                // IPv4 first, as before names were looked up for AAAA as
                // well: a host whose IPv6 route leads nowhere would make
                // every connection wait out the connect timeout first.
                Ok(mut ips) => {
                    ips.sort_by_key(IpAddr::is_ipv6);
                    ips
                }
                Err(e) => {
                    tracing::debug!("egress: {e}");
                    shared.refuse("tcp", &label, port, "unresolvable");
                    return None;
                }
            }
        }
    };
    let mut last = None;
    for ip in candidates {
        let decision = host_guard(
            ip,
            policy.decide(&Destination {
                host: Some(host.clone()),
                ip,
                port,
            }),
        );
        if decision.is_allowed() {
            if let Some(upstream) = connect(SocketAddr::new(ip, port)).await {
                return Some((upstream, decision, label));
            }
        }
        last = Some(decision);
    }
    if let Some(decision) = last.filter(|d| !d.is_allowed()) {
        report(shared, &label, port, &decision);
    }
    None
}

/// Reads into `buffer` until `done` says what the bytes are (or the
/// connection ends, the time is up or the bound is reached).
async fn read_until<T>(
    inside: &mut TcpStream,
    buffer: &mut Vec<u8>,
    done: impl Fn(&[u8]) -> Option<T>,
) -> Option<T> {
    tokio::time::timeout(SNIFF_TIMEOUT, async {
        loop {
            if !buffer.is_empty() {
                if let Some(answer) = done(buffer) {
                    return Some(answer);
                }
            }
            if buffer.len() >= MAX_SNIFF_BYTES {
                return None;
            }
            let mut chunk = [0u8; 4096];
            let n = inside.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .ok()
    .flatten()
}

/// Reads the connection's first bytes until they name a host (or cannot).
async fn sniff(inside: &mut TcpStream) -> (Option<String>, Vec<u8>) {
    let mut first = Vec::with_capacity(2048);
    let named = read_until(inside, &mut first, |bytes| {
        match (tls_sni(bytes), http_host(bytes)) {
            (Sniffed::Name { host, .. }, _) | (_, Sniffed::Name { host, .. }) => Some(Some(host)),
            (Sniffed::NeedMore, _) | (_, Sniffed::NeedMore) => None,
            _ => Some(None),
        }
    })
    .await
    .flatten();
    (named, first)
}

async fn connect(to: SocketAddr) -> Option<TcpStream> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(to))
        .await
        .ok()?
        .ok()?;
    let _ = stream.set_nodelay(true);
    Some(stream)
}

async fn splice(mut inside: TcpStream, mut upstream: TcpStream, first: Vec<u8>) {
    if !first.is_empty() && upstream.write_all(&first).await.is_err() {
        return;
    }
    // Zero-copy in the kernel (splice through a pipe) when pipes can be
    // had; else through large user-space buffers (with tokio's default
    // 8 KiB, a download costs a read and a write per 8 KiB).
    let (Ok(down), Ok(up)) = (zero_copy::Pipe::new(), zero_copy::Pipe::new()) else {
        let _ = tokio::io::copy_bidirectional_with_sizes(
            &mut inside,
            &mut upstream,
            COPY_BUFFER,
            COPY_BUFFER,
        )
        .await;
        return;
    };
    let (inside_read, inside_write) = inside.split();
    let (upstream_read, upstream_write) = upstream.split();
    // An error either way (a reset) ends both directions, as
    // `copy_bidirectional` does.
    let _ = tokio::try_join!(
        zero_copy::pump(upstream_read, inside_write, down),
        zero_copy::pump(inside_read, upstream_write, up),
    );
}

/// Moving bytes between two sockets with splice(2).
mod zero_copy {
    use std::io;
    use std::os::fd::{AsFd, OwnedFd};
    use tokio::io::{AsyncWriteExt, Interest};
    use tokio::net::tcp::{ReadHalf, WriteHalf};

    /// Bytes moved per splice call at most.
    const CHUNK: usize = 1 << 20;

    /// A pipe the bytes of one direction pass through.
    pub struct Pipe {
        read: OwnedFd,
        write: OwnedFd,
    }

    impl Pipe {
        pub fn new() -> io::Result<Pipe> {
            let (read, write) = rustix::pipe::pipe_with(
                rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
            )?;
            // A larger pipe moves more per call; the default 64 KiB still
            // works if the kernel refuses.
            let _ = rustix::pipe::fcntl_setpipe_size(&write, CHUNK);
            Ok(Pipe { read, write })
        }
    }

    /// splice(2) from the current positions (sockets and pipes have no
    /// other), never blocking.
    fn splice(from: impl AsFd, to: impl AsFd, len: usize) -> io::Result<usize> {
        use rustix::pipe::SpliceFlags;
        rustix::pipe::splice(
            from,
            None,
            to,
            None,
            len,
            SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
        )
        .map_err(io::Error::from)
    }

    /// Moves everything `from` sends to `to`, then shuts `to`'s write side.
    pub async fn pump(from: ReadHalf<'_>, mut to: WriteHalf<'_>, pipe: Pipe) -> io::Result<()> {
        let from_socket: &tokio::net::TcpStream = from.as_ref();
        let to_socket: &tokio::net::TcpStream = to.as_ref();
        loop {
            let filled = from_socket
                .async_io(Interest::READABLE, || {
                    splice(from_socket, &pipe.write, CHUNK)
                })
                .await?;
            if filled == 0 {
                break;
            }
            let mut left = filled;
            while left > 0 {
                let moved = to_socket
                    .async_io(Interest::WRITABLE, || splice(&pipe.read, to_socket, left))
                    .await?;
                if moved == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                left -= moved;
            }
        }
        to.shutdown().await
    }
}

/// Whether `to` is the address sandboxes name the proxy by
/// (`airlock_policy::network::PROXY_HOST_V4` and its IPv6 twin).
fn names_the_proxy(to: SocketAddr) -> bool {
    use airlock_policy::network::{PROXY_HOST_V4, PROXY_HOST_V6, PROXY_PORT};
    to.port() == PROXY_PORT
        && (to.ip() == std::net::IpAddr::V4(PROXY_HOST_V4)
            || to.ip() == std::net::IpAddr::V6(PROXY_HOST_V6))
}

/// Where a redirected connection was going (`SO_ORIGINAL_DST`, and its
/// IPv6 twin for connections accepted on `::1`).
fn original_destination(stream: &TcpStream) -> Option<SocketAddr> {
    use rustix::net::sockopt::{ip_original_dst, ipv6_original_dst};
    match stream.local_addr().ok()? {
        SocketAddr::V4(_) => ip_original_dst(stream).ok().map(SocketAddr::V4),
        SocketAddr::V6(_) => ipv6_original_dst(stream).ok().map(SocketAddr::V6),
    }
}
