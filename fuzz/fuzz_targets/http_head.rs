//! The egress proxy's HTTP request head reader: the transparent Host sniff
//! and the explicit proxy's request line (CONNECT, absolute form), then
//! what a CONNECT tunnel carries first (a ClientHello), and the rewrite
//! that lets a server answer one request only.
#![no_main]

use airlock_egress_parse::{http_host, one_request_only, tls_sni, Sniffed, MAX_SNIFF_BYTES};
use libfuzzer_sys::fuzz_target;

fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}

fuzz_target!(|data: &[u8]| {
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
});
