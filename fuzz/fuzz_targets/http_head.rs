//! The egress proxy's HTTP request head reader: the transparent Host sniff
//! and the explicit proxy's request line (CONNECT, absolute form), then
//! what a CONNECT tunnel carries first (a ClientHello), the rewrite that
//! lets a server answer one request only, and the rewrite of an
//! absolute-form target to origin form.
#![no_main]

use airlock_egress_parse::{
    http_host, one_request_only, origin_form, tls_sni, Sniffed, MAX_SNIFF_BYTES,
};
use libfuzzer_sys::fuzz_target;

fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}

fn line_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|w| w == b"\r\n")
}

/// Only the request line changes, and a changed target starts with `/`.
fn check_origin_form(request: &[u8]) {
    let origin = origin_form(request.to_vec());
    if origin == request {
        return;
    }
    let (Some(was), Some(is)) = (line_end(request), line_end(&origin)) else {
        panic!("a request with no line end was changed");
    };
    assert_eq!(&origin[is..], &request[was..], "more than the line changed");
    let target = origin[..is].split(|&b| b == b' ').nth(1).expect("a target");
    assert!(target.starts_with(b"/"), "target {target:?}");
    assert_eq!(origin_form(origin.clone()), origin, "not idempotent");
}

fuzz_target!(|data: &[u8]| {
    check_origin_form(data);
    let verdict = http_host(data);
    match &verdict {
        Sniffed::Name { host, port } => {
            assert!(!host.is_empty(), "an empty host");
            assert!(host.bytes().all(|b| b.is_ascii_graphic()), "{host:?}");
            assert!(!host.contains('@'), "userinfo in {host:?}");
            assert_ne!(*port, Some(0));
            if data.starts_with(b"CONNECT ") {
                assert!(port.is_some(), "a CONNECT target without a port");
            }
        }
        Sniffed::NeedMore => assert!(data.len() < MAX_SNIFF_BYTES),
        Sniffed::NotTls => panic!("the HTTP reader answered NotTls"),
        Sniffed::NoName | Sniffed::NotHttp | Sniffed::Malformed(_) => {}
    }
    if data.len() > MAX_SNIFF_BYTES {
        assert_eq!(http_host(&data[..MAX_SNIFF_BYTES]), verdict);
    }

    let Sniffed::Name { .. } = verdict else {
        // Nothing that names no host is changed.
        assert_eq!(one_request_only(data.to_vec()), data);
        return;
    };
    let Some(end) = head_end(data) else {
        panic!("a name from a head with no end");
    };
    if data.starts_with(b"CONNECT ") {
        // The explicit proxy then reads the tunnel's first bytes as TLS.
        let _ = tls_sni(&data[end..]);
    }
    let changed = one_request_only(data.to_vec());
    if changed != data {
        // Only the head changes, it closes the connection after the
        // first answer, and it still names the same host.
        let changed_end = head_end(&changed).expect("the rewritten head has an end");
        assert_eq!(&changed[changed_end..], &data[end..]);
        assert!(changed[..changed_end].ends_with(b"\r\nConnection: close\r\n\r\n"));
        if changed.len() < MAX_SNIFF_BYTES {
            assert_eq!(http_host(&changed), verdict);
        }
        assert_eq!(one_request_only(changed.clone()), changed, "not idempotent");
    }
    // What the explicit proxy passes on.
    check_origin_form(&changed);
});
