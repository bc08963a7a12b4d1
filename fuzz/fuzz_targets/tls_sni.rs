//! The egress proxy's TLS ClientHello / SNI reader (rustls's Acceptor
//! behind our first-record look), on the first bytes of a connection.
#![no_main]

use airlock_egress_parse::{tls_sni, Sniffed, MAX_SNIFF_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let verdict = tls_sni(data);
    match &verdict {
        Sniffed::Name { host, port } => {
            // TLS carries no port; a name is a lower-case DNS name.
            assert!(port.is_none());
            assert!(!host.is_empty() && host.len() <= 253, "{host:?}");
            assert!(
                host.bytes()
                    .all(|b| b.is_ascii_graphic() && !b.is_ascii_uppercase()),
                "{host:?}"
            );
        }
        Sniffed::NeedMore => assert!(data.len() < MAX_SNIFF_BYTES),
        Sniffed::NotHttp => panic!("the TLS reader answered NotHttp"),
        Sniffed::NoName | Sniffed::NotTls | Sniffed::Malformed(_) => {}
    }
    // Only the first MAX_SNIFF_BYTES count.
    if data.len() > MAX_SNIFF_BYTES {
        assert_eq!(tls_sni(&data[..MAX_SNIFF_BYTES]), verdict);
    }
    // Not TLS is decided by the first two bytes and stays so: the proxy,
    // which asks the HTTP reader too, must not wait on it.
    for end in 1..=data.len().min(2) {
        if tls_sni(&data[..end]) == Sniffed::NotTls {
            assert_eq!(verdict, Sniffed::NotTls);
        }
    }
});
