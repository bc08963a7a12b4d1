//! HTTP/1.x request heads (RFC 9112): the request line and the `Host`
//! header, tokenized by `httparse` (hyper's own head parser) and read
//! strictly, since anything a lenient reader accepts could be read
//! differently by the server behind the proxy.
//!
//! What httparse allows that a server may read but a proxy judging the
//! request must refuse is checked here, around it: a bare LF (or CR) as a
//! line end, empty lines before the request line, two `Host` headers,
//! non-ASCII bytes in the target, and a `Host` or target that is not
//! exactly `host[:port]` (httparse does not read authorities, and the
//! `http` crate's `Authority` takes userinfo and empty ports, so that
//! small reader is ours too).

use crate::{Sniffed, MAX_SNIFF_BYTES};

/// The host an HTTP/1.0 or HTTP/1.1 request head names.
///
/// - `CONNECT host:port`: the CONNECT target (its port is required); a
///   `Host` header, if any, must name the same host.
/// - An absolute-form target (`GET http://host/path`): its authority; a
///   `Host` header must name the same host and port. Userinfo (`user@`) is
///   refused.
/// - Otherwise the `Host` header; HTTP/1.1 requires one, HTTP/1.0 without
///   one is [`Sniffed::NoName`].
///
/// Refused as [`Sniffed::Malformed`]: lines not ended by CRLF (a bare CR or
/// LF), obs-fold continuation lines, header lines without a colon or with
/// space before it, control characters in values, two `Host` headers, and
/// heads not complete within [`MAX_SNIFF_BYTES`]. Only the head is read;
/// bytes after the blank line are not looked at. A line that breaks these
/// rules is refused as soon as it is complete, before the head is.
pub fn http_host(first_bytes: &[u8]) -> Sniffed {
    let window = &first_bytes[..first_bytes.len().min(MAX_SNIFF_BYTES)];
    let full = first_bytes.len() >= MAX_SNIFF_BYTES;
    let head_end = memchr::memmem::find(window, b"\r\n\r\n").map(|at| at + 4);
    let head = &window[..head_end.unwrap_or(window.len())];
    if has_bare_cr_or_lf(head) {
        return Sniffed::Malformed("a line of the request head ends in a bare CR or LF");
    }
    if head.starts_with(b"\r\n") {
        // httparse skips them, as RFC 9112 (2.2) lets a server do.
        return Sniffed::Malformed("the request head starts with an empty line");
    }
    let verdict = match head_end {
        Some(_) => match parse(head) {
            Ok((request_line, host)) => request_line.name(host),
            Err(verdict) => verdict,
        },
        // No head yet: httparse says nothing of the lines so far, so they
        // are read as a head of their own, to refuse a broken line now
        // rather than once the rest arrived. A first line not yet whole
        // must still be able to become a request line.
        None => match memchr::memmem::rfind(head, b"\r\n") {
            None if method_prefix_is_plausible(head.strip_suffix(b"\r").unwrap_or(head)) => {
                Sniffed::NeedMore
            }
            None => Sniffed::NotHttp,
            Some(at) => {
                let mut lines = head[..at + 2].to_vec();
                lines.extend_from_slice(b"\r\n");
                match parse(&lines) {
                    Ok(_) => Sniffed::NeedMore,
                    Err(verdict) => verdict,
                }
            }
        },
    };
    match verdict {
        Sniffed::NeedMore if full => Sniffed::Malformed("the request head is over 16 KiB"),
        other => other,
    }
}

const NO_HOST: &str = "an HTTP/1.1 request has no Host header";

/// Whether a line of `head` ends in anything but CRLF, or a CR stands
/// alone (a CR at the very end may be the start of a CRLF to come).
fn has_bare_cr_or_lf(head: &[u8]) -> bool {
    memchr::memchr2_iter(b'\r', b'\n', head).any(|at| match head[at] {
        b'\n' => at == 0 || head[at - 1] != b'\r',
        _ => head.get(at + 1).is_some_and(|&next| next != b'\n'),
    })
}

/// The request line and `Host` of a complete head (ending in an empty
/// line), each line checked; the verdict on bytes that are no such head.
fn parse(head: &[u8]) -> Result<(RequestLine<'_>, Option<Authority<'_>>), Sniffed> {
    // Every header takes a line: that many slots are enough, so httparse
    // never fails for want of them, and no more than the head's size.
    let lines = memchr::memchr_iter(b'\n', head).count();
    let mut headers = vec![httparse::EMPTY_HEADER; lines];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(Sniffed::NeedMore),
        Err(httparse::Error::Version) => return Err(Sniffed::NotHttp),
        Err(httparse::Error::HeaderName) => {
            return Err(Sniffed::Malformed(
                "a header name is empty or has a character a name cannot have, \
                 or a line is folded (obs-fold)",
            ))
        }
        Err(httparse::Error::HeaderValue) => {
            return Err(Sniffed::Malformed("a header value has a control character"))
        }
        Err(_) if plausible_method(head) => {
            return Err(Sniffed::Malformed(
                "the request line is not `method target version`",
            ))
        }
        Err(_) => return Err(Sniffed::NotHttp),
    }
    let (Some(method), Some(target), Some(version)) =
        (request.method, request.path, request.version)
    else {
        return Err(Sniffed::NeedMore);
    };
    if method.len() > MAX_METHOD {
        return Err(Sniffed::NotHttp);
    }
    if !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Sniffed::Malformed(
            "the request target is empty or has control or non-ASCII bytes",
        ));
    }
    let request_line = RequestLine {
        method: method.as_bytes(),
        target: target.as_bytes(),
        version: if version == 0 {
            Version::Http10
        } else {
            Version::Http11
        },
    };
    let mut host: Option<&[u8]> = None;
    for header in request.headers.iter() {
        if header.name.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return Err(Sniffed::Malformed("the request has two Host headers"));
            }
            host = Some(trim(header.value));
        }
    }
    match host.map(Authority::parse) {
        None => Ok((request_line, None)),
        Some(Some(authority)) => Ok((request_line, Some(authority))),
        Some(None) => Err(Sniffed::Malformed("the Host header is not host[:port]")),
    }
}

/// A header value without the spaces and tabs around it.
fn trim(value: &[u8]) -> &[u8] {
    let is_space = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value
        .iter()
        .position(|b| !is_space(b))
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !is_space(b))
        .map_or(start, |i| i + 1);
    &value[start..end]
}

/// `request` changed so that the server answers its first request alone
/// and then closes the connection: any `Connection`, `Keep-Alive` and
/// `Proxy-Connection` header of the first head is replaced by
/// `Connection: close`, and a server MUST NOT process further requests on
/// that connection (RFC 9112, 9.6). Later requests, which could name
/// another host than the one judged, are thus never served; a client
/// opens a new connection for them, judged anew.
///
/// Left as it is: anything that does not start with a complete request
/// head naming a host (see [`http_host`]: TLS, other protocols), and a
/// request asking to switch protocols (`Upgrade`, e.g. WebSocket), whose
/// connection becomes a tunnel to the same server.
pub fn one_request_only(request: Vec<u8>) -> Vec<u8> {
    if !matches!(http_host(&request), Sniffed::Name { .. }) {
        return request;
    }
    // The head is complete and strict (http_host checked it): its lines
    // end in CRLF and the first empty line ends it.
    let mut lines: Vec<&[u8]> = Vec::new();
    let mut rest: &[u8] = &request;
    while let Some(end) = find_crlf(rest) {
        let line = &rest[..end];
        rest = &rest[end + 2..];
        if line.is_empty() {
            break;
        }
        lines.push(line);
    }
    let Some((request_line, headers)) = lines.split_first() else {
        return request;
    };
    let mut kept = Vec::with_capacity(headers.len());
    for line in headers {
        // http_host checked every header line: its name ends at the
        // first colon.
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return request;
        };
        let name = &line[..colon];
        if name.eq_ignore_ascii_case(b"upgrade") {
            return request;
        }
        let hop_by_hop = [&b"connection"[..], b"keep-alive", b"proxy-connection"]
            .iter()
            .any(|hop| name.eq_ignore_ascii_case(hop));
        if !hop_by_hop {
            kept.push(*line);
        }
    }
    let mut changed = Vec::with_capacity(request.len() + 19);
    for line in std::iter::once(request_line).chain(kept.iter()) {
        changed.extend_from_slice(line);
        changed.extend_from_slice(b"\r\n");
    }
    changed.extend_from_slice(b"Connection: close\r\n\r\n");
    changed.extend_from_slice(rest);
    changed
}

fn find_crlf(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|pair| pair == b"\r\n")
}

/// RFC 9110 `tchar`: what methods and header names are made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Longest method we wait for; real ones are far shorter.
const MAX_METHOD: usize = 32;

/// Whether an incomplete first line could still become a request line.
fn method_prefix_is_plausible(partial: &[u8]) -> bool {
    let method_end = partial
        .iter()
        .position(|&b| b == b' ')
        .unwrap_or(partial.len());
    let method = &partial[..method_end];
    method.len() <= MAX_METHOD
        && method.iter().all(|&b| is_tchar(b))
        && (method_end == partial.len() || !method.is_empty())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    Http10,
    Http11,
}

struct RequestLine<'a> {
    method: &'a [u8],
    target: &'a [u8],
    version: Version,
}

impl RequestLine<'_> {
    /// The name the request goes to, given its `Host` header.
    fn name(&self, host: Option<Authority<'_>>) -> Sniffed {
        if self.method == b"CONNECT" {
            let Some(target) = Authority::parse(self.target).filter(|a| a.port.is_some()) else {
                return Sniffed::Malformed("the CONNECT target is not host:port");
            };
            if host.is_some_and(|h| {
                !h.same_host(&target) || h.port.is_some_and(|p| Some(p) != target.port)
            }) {
                return Sniffed::Malformed("the Host header differs from the CONNECT target");
            }
            return target.sniffed();
        }
        if let Some((scheme, rest)) = split_scheme(self.target) {
            let default_port = match scheme {
                Scheme::Http => 80,
                Scheme::Https => 443,
            };
            let end = rest
                .iter()
                .position(|b| b"/?#".contains(b))
                .unwrap_or(rest.len());
            let Some(target) = Authority::parse(&rest[..end]) else {
                return Sniffed::Malformed("the absolute-form target has no valid host[:port]");
            };
            if let Some(host) = host {
                let port = |a: &Authority<'_>| a.port.unwrap_or(default_port);
                if !host.same_host(&target) || port(&host) != port(&target) {
                    return Sniffed::Malformed("the Host header differs from the target's host");
                }
            } else if self.version == Version::Http11 {
                return Sniffed::Malformed(NO_HOST);
            }
            return target.sniffed();
        }
        if !(self.target.starts_with(b"/") || self.target == b"*") {
            return Sniffed::Malformed("the request target is in no form this method allows");
        }
        match (host, self.version) {
            (Some(host), _) => host.sniffed(),
            (None, Version::Http10) => Sniffed::NoName,
            (None, Version::Http11) => Sniffed::Malformed(NO_HOST),
        }
    }
}

/// Whether a complete first line at least starts like a method and a space.
fn plausible_method(line: &[u8]) -> bool {
    line.iter()
        .position(|&b| b == b' ')
        .is_some_and(|end| end > 0 && end <= MAX_METHOD && line[..end].iter().all(|&b| is_tchar(b)))
}

enum Scheme {
    Http,
    Https,
}

/// `http://` or `https://`, in any case, and what follows it.
fn split_scheme(target: &[u8]) -> Option<(Scheme, &[u8])> {
    let lower_starts = |prefix: &[u8]| {
        target.len() >= prefix.len() && target[..prefix.len()].eq_ignore_ascii_case(prefix)
    };
    if lower_starts(b"http://") {
        Some((Scheme::Http, &target[7..]))
    } else if lower_starts(b"https://") {
        Some((Scheme::Https, &target[8..]))
    } else {
        None
    }
}

/// `host[:port]` or `[v6][:port]`; the host is kept as sent.
#[derive(Clone, Copy)]
struct Authority<'a> {
    host: &'a [u8],
    port: Option<u16>,
}

impl<'a> Authority<'a> {
    /// `None` when the text is no authority: empty host, userinfo, a port
    /// that is not 1 to 65535, stray colons or brackets, or bytes that are
    /// not visible ASCII (a `Host` value may carry obs-text, bytes over
    /// 0x7f, which no host name has and which a server could read as
    /// another name).
    fn parse(text: &'a [u8]) -> Option<Authority<'a>> {
        if text.contains(&b'@') || !text.iter().all(u8::is_ascii_graphic) {
            return None;
        }
        let (host, port) = if text.starts_with(b"[") {
            let close = text.iter().position(|&b| b == b']')?;
            let (host, after) = text.split_at(close + 1);
            match after {
                [] => (host, None),
                [b':', port @ ..] => (host, Some(port)),
                _ => return None,
            }
        } else {
            let mut parts = text.splitn(2, |&b| b == b':');
            let host = parts.next()?;
            (host, parts.next())
        };
        if host.is_empty() || (!host.starts_with(b"[") && host.contains(&b']')) {
            return None;
        }
        let port = match port {
            None => None,
            Some(digits) => Some(parse_port(digits)?),
        };
        Some(Authority { host, port })
    }

    /// The same host, compared as DNS does (ASCII case-insensitively).
    fn same_host(&self, other: &Authority<'_>) -> bool {
        self.host.eq_ignore_ascii_case(other.host)
    }

    fn sniffed(&self) -> Sniffed {
        Sniffed::Name {
            host: self.host.iter().map(|&b| char::from(b)).collect(),
            port: self.port,
        }
    }
}

fn parse_port(digits: &[u8]) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value = digits
        .iter()
        .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
    u16::try_from(value).ok().filter(|p| *p != 0)
}

/// The request with its absolute-form target (`GET http://host/path`)
/// rewritten to origin form (`GET /path`), as a proxy passes a request on
/// to the origin server (RFC 9112, 3.2.1; many servers answer 404
/// otherwise). The `Host` header, already checked to agree, stays.
pub fn origin_form(mut request: Vec<u8>) -> Vec<u8> {
    let Some(line_end) = request.windows(2).position(|w| w == b"\r\n") else {
        return request;
    };
    let line = &request[..line_end];
    let mut parts = line.splitn(3, |&b| b == b' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return request;
    };
    let Some(rest) = target
        .strip_prefix(b"http://")
        .or_else(|| target.strip_prefix(b"HTTP://"))
    else {
        return request;
    };
    let path: &[u8] = match rest.iter().position(|&b| b == b'/' || b == b'?') {
        Some(at) if rest[at] == b'/' => &rest[at..],
        Some(at) => &[b"/".as_slice(), &rest[at..]].concat(),
        None => b"/",
    };
    let mut rewritten = Vec::with_capacity(request.len());
    rewritten.extend_from_slice(method);
    rewritten.push(b' ');
    rewritten.extend_from_slice(path);
    rewritten.push(b' ');
    rewritten.extend_from_slice(version);
    rewritten.extend_from_slice(&request.split_off(line_end));
    rewritten
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    #[test]
    fn only_the_first_request_is_served() {
        let cases: [(&[u8], &[u8]); 6] = [
            (
                b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nAccept: */*\r\n\r\nGET / HTTP/1.1\r\nHost: b.test\r\n\r\n",
                b"GET / HTTP/1.1\r\nHost: a.test\r\nAccept: */*\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\nHost: b.test\r\n\r\n",
            ),
            (
                b"POST /x HTTP/1.1\r\nhost: a.test\r\ncontent-length: 2\r\n\r\nhi",
                b"POST /x HTTP/1.1\r\nhost: a.test\r\ncontent-length: 2\r\nConnection: close\r\n\r\nhi",
            ),
            (
                b"GET http://a.test/ HTTP/1.0\r\nPROXY-CONNECTION: Keep-Alive\r\n\r\n",
                b"GET http://a.test/ HTTP/1.0\r\nConnection: close\r\n\r\n",
            ),
            // Switching protocols, not HTTP, or not a complete head naming
            // a host: untouched.
            (
                b"GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                b"GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            ),
            (b"\x16\x03\x01\x00\x05hello", b"\x16\x03\x01\x00\x05hello"),
            (
                b"GET / HTTP/1.1\r\nHost: a.test\r\n",
                b"GET / HTTP/1.1\r\nHost: a.test\r\n",
            ),
        ];
        for (given, wanted) in cases {
            assert_eq!(
                String::from_utf8_lossy(&one_request_only(given.to_vec())),
                String::from_utf8_lossy(wanted)
            );
        }
        // What comes out still names the same host.
        let changed = one_request_only(cases[0].0.to_vec());
        assert!(matches!(http_host(&changed), Sniffed::Name { host, .. } if host == "a.test"));
    }

    fn name(host: &str, port: Option<u16>) -> Sniffed {
        Sniffed::Name {
            host: host.into(),
            port,
        }
    }

    fn is_malformed(sniffed: &Sniffed) -> bool {
        matches!(sniffed, Sniffed::Malformed(_))
    }

    #[test]
    fn hosts_of_well_formed_heads() {
        let table: &[(&str, Sniffed)] = &[
            ("GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", name("pypi.org", None)),
            (
                "GET /simple/ HTTP/1.1\r\nUser-Agent: pip\r\nhost:   PyPI.org.:8080 \r\nAccept: */*\r\n\r\n",
                name("PyPI.org.", Some(8080)),
            ),
            ("GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", name("[::1]", Some(80))),
            ("GET / HTTP/1.1\r\nHost: 127.1\r\n\r\n", name("127.1", None)),
            ("GET / HTTP/1.0\r\n\r\n", Sniffed::NoName),
            ("OPTIONS * HTTP/1.1\r\nHost: pypi.org\r\n\r\n", name("pypi.org", None)),
            (
                "CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n",
                name("pypi.org", Some(443)),
            ),
            ("CONNECT pypi.org:443 HTTP/1.1\r\n\r\n", name("pypi.org", Some(443))),
            (
                "CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:DB8::1]\r\n\r\n",
                name("[2001:db8::1]", Some(443)),
            ),
            (
                "GET http://pypi.org/simple HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
                name("pypi.org", None),
            ),
            (
                "GET HTTPS://PyPI.org:443?q HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
                name("PyPI.org", Some(443)),
            ),
            ("GET http://pypi.org HTTP/1.0\r\n\r\n", name("pypi.org", None)),
            // Bytes after the head are not looked at.
            (
                "POST / HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 3\r\n\r\nabc\0\0",
                name("pypi.org", None),
            ),
        ];
        for (head, expected) in table {
            assert_eq!(&http_host(head.as_bytes()), expected, "{head:?}");
        }
    }

    #[test]
    fn smuggling_and_ambiguity_are_refused() {
        for head in [
            "GET / HTTP/1.1\r\nHost: pypi.org\r\nHost: evil.com\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: pypi.org\r\nhOsT: pypi.org\r\n\r\n",
            "GET / HTTP/1.1\r\nX-A: 1\r\n evil\r\nHost: pypi.org\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: pypi.org\r\n\tevil.com\r\n\r\n",
            "GET / HTTP/1.1\r\nHost pypi.org\r\n\r\n",
            "GET / HTTP/1.1\r\nHost : pypi.org\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: pypi.org\0.evil.com\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: pypi.org\nHost: evil.com\r\n\r\n",
            "GET / HTTP/1.1\nHost: pypi.org\n\n",
            "GET / HTTP/1.1\r\nHost: pypi.org\revil\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: user@pypi.org\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: pypi.org:0\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: pypi.org:65536\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: pypi.org:\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: pypi.org:80:80\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: \r\n\r\n",
            // Found by the fuzzer (fuzz/corpus/http_head/host-obs-text): a
            // Host with bytes over 0x7f was a name of Latin-1 characters.
            "GET /x HTTP/1.1\r\nHost: 127.0.0\u{ff}.1:18450\r\n\r\n",
            "GET /x HTTP/1.1\r\nHost: b\u{fc}cher.de\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET http://evil.com/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "GET http://pypi.org:8080/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "GET http://pypi.org@evil.com/ HTTP/1.1\r\nHost: evil.com\r\n\r\n",
            "GET http://pypi.org/ HTTP/1.1\r\n\r\n",
            "GET ftp://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "GET pypi.org:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "CONNECT pypi.org HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "CONNECT pypi.org:443 HTTP/1.1\r\nHost: evil.com:443\r\n\r\n",
            "CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:80\r\n\r\n",
            "CONNECT / HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "GET  / HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "GET / HTTP/1.1 \r\nHost: pypi.org\r\n\r\n",
            "GET /\x7f HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "\r\nGET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "GET /\r\n\r\n",
        ] {
            let verdict = http_host(head.as_bytes());
            assert!(is_malformed(&verdict), "{head:?}: {verdict:?}");
        }
    }

    #[test]
    fn other_protocols_are_not_http() {
        for bytes in [
            &b"\x16\x03\x01\x02\x00\x01"[..],
            b"SSH-2.0-OpenSSH_9.6\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"GET / HTTP/3\r\n\r\n",
            b"\0\0\0\0",
            b"<html>",
        ] {
            assert_eq!(http_host(bytes), Sniffed::NotHttp, "{bytes:?}");
        }
    }

    #[test]
    fn every_prefix_of_a_head_needs_more() {
        for head in [
            "GET /simple/pip/ HTTP/1.1\r\nHost: pypi.org\r\nAccept: */*\r\n\r\n",
            "CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n",
        ] {
            let bytes = head.as_bytes();
            for end in 0..bytes.len() {
                assert_eq!(
                    http_host(&bytes[..end]),
                    Sniffed::NeedMore,
                    "{:?}",
                    &head[..end]
                );
            }
        }
        // A broken line is reported before the head is complete.
        assert!(is_malformed(&http_host(
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n"
        )));
        assert!(is_malformed(&http_host(b"GET / HTTP/1.1\r\nHost: a\nX")));
    }

    #[test]
    fn heads_real_clients_sent() {
        // Captured with a local listener: curl 7.88.1 plainly, through
        // -x as a proxy (absolute form, CONNECT), Python's urllib.
        let table: [(&[u8], Sniffed); 4] = [
            (
                b"GET /simple/pip/ HTTP/1.1\r\nHost: pypi.org:18447\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n",
                name("pypi.org", Some(18447)),
            ),
            (
                b"GET http://pypi.org/simple/?q=1 HTTP/1.1\r\nHost: pypi.org\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\nProxy-Connection: Keep-Alive\r\n\r\n",
                name("pypi.org", None),
            ),
            (
                b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\nUser-Agent: curl/7.88.1\r\nProxy-Connection: Keep-Alive\r\n\r\n",
                name("pypi.org", Some(443)),
            ),
            (
                b"GET /x HTTP/1.1\r\nAccept-Encoding: identity\r\nHost: 127.0.0.1:18450\r\nUser-Agent: Python-urllib/3.11\r\nConnection: close\r\n\r\n",
                name("127.0.0.1", Some(18450)),
            ),
        ];
        for (head, expected) in table {
            assert_eq!(http_host(head), expected);
            for end in 0..head.len() {
                assert_eq!(http_host(&head[..end]), Sniffed::NeedMore, "{end}");
            }
        }
    }

    #[test]
    fn a_head_of_many_short_headers_is_read_whole() {
        let mut head = b"GET / HTTP/1.1\r\n".to_vec();
        while head.len() < MAX_SNIFF_BYTES - 32 {
            head.extend_from_slice(b"a:\r\n");
        }
        head.extend_from_slice(b"Host: pypi.org\r\n\r\n");
        assert_eq!(http_host(&head), name("pypi.org", None));
    }

    #[test]
    fn heads_are_bounded() {
        let mut head = b"GET / HTTP/1.1\r\nHost: pypi.org\r\n".to_vec();
        while head.len() < MAX_SNIFF_BYTES {
            head.extend_from_slice(b"X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert!(is_malformed(&http_host(&head)));
        head.extend_from_slice(b"\r\n");
        assert!(is_malformed(&http_host(&head)));
        let mut long_line = b"GET /".to_vec();
        long_line.resize(MAX_SNIFF_BYTES - 1, b'a');
        assert_eq!(http_host(&long_line), Sniffed::NeedMore);
        long_line.push(b'a');
        assert!(is_malformed(&http_host(&long_line)));
        assert_eq!(http_host(&vec![b'G'; MAX_SNIFF_BYTES]), Sniffed::NotHttp);
    }

    #[test]
    fn random_and_mutated_input_never_panics() {
        let mut rng = Rng::new(0x5eed_0002);
        let good = b"GET http://pypi.org/simple HTTP/1.1\r\nHost: pypi.org\r\nAccept: */*\r\n\r\n";
        let alphabet = b"GET / HTTP/1.1\r\n:@[]0123456789abc \t\0";
        for _ in 0..20_000 {
            let len = rng.below(300);
            http_host(&rng.bytes(len));
            let picked: Vec<u8> = (0..rng.below(120))
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect();
            http_host(&picked);
            let mut mutated = good.to_vec();
            for _ in 0..=rng.below(3) {
                let at = rng.below(mutated.len());
                mutated[at] = alphabet[rng.below(alphabet.len())];
            }
            let cut = rng.below(mutated.len() + 1);
            http_host(&mutated[..cut]);
        }
    }

    #[test]
    fn absolute_form_requests_reach_the_origin_in_origin_form() {
        let cases: [(&[u8], &[u8]); 5] = [
            (
                b"GET http://site.test:8000/a/b?c HTTP/1.1\r\nHost: site.test:8000\r\n\r\nbody",
                b"GET /a/b?c HTTP/1.1\r\nHost: site.test:8000\r\n\r\nbody",
            ),
            (
                b"GET http://site.test HTTP/1.1\r\n\r\n",
                b"GET / HTTP/1.1\r\n\r\n",
            ),
            (
                b"GET http://site.test?q HTTP/1.1\r\n\r\n",
                b"GET /?q HTTP/1.1\r\n\r\n",
            ),
            (
                b"GET /already HTTP/1.1\r\n\r\n",
                b"GET /already HTTP/1.1\r\n\r\n",
            ),
            (b"garbage", b"garbage"),
        ];
        for (given, wanted) in cases {
            assert_eq!(origin_form(given.to_vec()), wanted.to_vec());
        }
    }
}
