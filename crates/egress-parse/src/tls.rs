//! TLS ClientHello: its `server_name` (RFC 6066), read by rustls's server
//! [`Acceptor`], which reassembles the hello across records and parses it
//! as a TLS server would, with no certificate, key or crypto provider.
//!
//! The bytes are fed to the acceptor from a slice: the caller keeps every
//! byte it read and forwards them upstream untouched (the acceptor's own
//! copy, and the alert it would send, are dropped).
//!
//! Ours, in front of rustls, is only a look at the first record and
//! handshake headers, for what rustls cannot tell from a prefix:
//! - whether the bytes are TLS at all ([`Sniffed::NotTls`]): the proxy asks
//!   the TLS and HTTP readers both and waits while either wants more bytes,
//!   and rustls can only ask for more until a whole record is in;
//! - that a hello declares more than [`MAX_SNIFF_BYTES`], or its first
//!   record a length TLS does not allow, refused before waiting for it.
//!
//! Where rustls reads stricter than the hand-written reader it replaced, a
//! hello is [`Sniffed::Malformed`] that names no host the proxy could use
//! anyway: a hello without `signature_algorithms` (every TLS 1.2 and 1.3
//! client sends it; a TLS 1.0 hello without extensions does not), and an
//! SNI that is no DNS name (control or non-ASCII bytes), which
//! `canonical_host` refused too. An SNI holding an IP address, which
//! RFC 6066 forbids and curl or OpenSSL never send, is taken as no SNI, as
//! rustls does: the connection is judged by its address. The name rustls
//! gives is in lower case, without a trailing dot.

use crate::{Sniffed, MAX_SNIFF_BYTES};
use rustls::server::Acceptor;

const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// Largest plaintext record fragment (RFC 8446, 5.1).
const MAX_FRAGMENT: usize = 1 << 14;
const RECORD_HEADER: usize = 5;
const HANDSHAKE_HEADER: usize = 4;

/// The SNI host name of a TLS ClientHello.
///
/// `first_bytes` are the first bytes the client sent; at most
/// [`MAX_SNIFF_BYTES`] of them are read. The hello may span several
/// handshake records. Returns [`Sniffed::NeedMore`] for every proper
/// prefix of a well-formed hello, [`Sniffed::NotTls`] when the first record
/// is not a TLS handshake record, and [`Sniffed::Malformed`] when rustls
/// refuses the hello (lengths that disagree, a first message that is not a
/// ClientHello, an extension or host name twice, handshake bytes after the
/// hello in its flight) or it is not complete within [`MAX_SNIFF_BYTES`].
/// Records after the hello's are not looked at.
pub fn tls_sni(first_bytes: &[u8]) -> Sniffed {
    if let Some(verdict) = first_headers(first_bytes) {
        return verdict;
    }
    let window = &first_bytes[..first_bytes.len().min(MAX_SNIFF_BYTES)];
    let mut acceptor = Acceptor::default();
    let mut unread = window;
    while !unread.is_empty() {
        // A slice reader never fails; the acceptor refuses to buffer past
        // a record it has not processed, which `accept` below does.
        if acceptor.read_tls(&mut unread).is_err() {
            return Sniffed::Malformed("the ClientHello's records overflow the TLS reader");
        }
        match acceptor.accept() {
            Ok(None) => {}
            Ok(Some(accepted)) => {
                return match accepted.client_hello().server_name() {
                    Some(host) => Sniffed::Name {
                        host: host.to_owned(),
                        port: None,
                    },
                    None => Sniffed::NoName,
                };
            }
            Err(_) => return Sniffed::Malformed("rustls refuses the ClientHello"),
        }
    }
    if first_bytes.len() >= MAX_SNIFF_BYTES {
        return Sniffed::Malformed("the ClientHello is over 16 KiB");
    }
    Sniffed::NeedMore
}

/// What the first record's header and the first handshake header already
/// say, before rustls has a whole record to read; `None` to go on.
fn first_headers(bytes: &[u8]) -> Option<Sniffed> {
    match bytes {
        [] => return Some(Sniffed::NeedMore),
        [content_type, ..] if *content_type != CONTENT_HANDSHAKE => return Some(Sniffed::NotTls),
        [_, major, ..] if *major != 3 => return Some(Sniffed::NotTls),
        _ => {}
    }
    let record = bytes.get(..RECORD_HEADER)?;
    let length = usize::from(u16::from_be_bytes([record[3], record[4]]));
    if length == 0 || length > MAX_FRAGMENT {
        return Some(Sniffed::Malformed(
            "a handshake record has a length of 0 or over 16 KiB",
        ));
    }
    // The handshake header as far as it lies in the first record (a hello
    // cut into tiny records has the next record's header after it).
    let handshake = &bytes[RECORD_HEADER..(RECORD_HEADER + length).min(bytes.len())];
    if handshake
        .first()
        .is_some_and(|&kind| kind != HANDSHAKE_CLIENT_HELLO)
    {
        return Some(Sniffed::Malformed(
            "the first handshake message is not a ClientHello",
        ));
    }
    if let [_, a, b, c, ..] = *handshake {
        let body = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
        if HANDSHAKE_HEADER + body > MAX_SNIFF_BYTES {
            return Some(Sniffed::Malformed("the ClientHello is over 16 KiB"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    const EXTENSION_SERVER_NAME: u16 = 0;
    const NAME_TYPE_HOST_NAME: u8 = 0;

    /// A real ClientHello: what OpenSSL 3.0 (through Python's `ssl` module
    /// with a memory BIO, no socket) sent for `files.pythonhosted.org`,
    /// TLS 1.3 with its 512-byte padding extension.
    const OPENSSL_HELLO: &[u8] =
        include_bytes!("../testdata/openssl-3.0-client-hello-files.pythonhosted.org.bin");

    fn vec8(data: &[u8]) -> Vec<u8> {
        let mut out = vec![data.len() as u8];
        out.extend_from_slice(data);
        out
    }

    fn vec16(data: &[u8]) -> Vec<u8> {
        let mut out = (data.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(data);
        out
    }

    fn extension(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut out = kind.to_be_bytes().to_vec();
        out.extend(vec16(data));
        out
    }

    fn sni_extension(names: &[&str]) -> Vec<u8> {
        let mut list = Vec::new();
        for name in names {
            list.push(NAME_TYPE_HOST_NAME);
            list.extend(vec16(name.as_bytes()));
        }
        extension(EXTENSION_SERVER_NAME, &vec16(&list))
    }

    /// A minimal TLS 1.3 ClientHello, laid out as RFC 8446, 4.1.2 says:
    ///
    /// ```text
    /// record:    type 22 | version 3,1 | length u16
    /// handshake: type 1 (client_hello) | length u24
    /// body:      legacy_version 3,3 | random [32] | session_id <0..32>
    ///            | cipher_suites <2..2^16-2> | compression_methods <1..2^8-1>
    ///            | extensions <8..2^16-1>: each type u16 | data <0..2^16-1>
    /// server_name data: list <1..2^16-1> of name_type u8 (0 host_name)
    ///                   | HostName <1..2^16-1>
    /// ```
    fn hello_body(extensions: &[Vec<u8>]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.extend(vec8(&[9u8; 32]));
        body.extend(vec16(&[0x13, 0x01, 0x13, 0x02, 0x13, 0x03]));
        body.extend(vec8(&[0]));
        let supported_versions = extension(0x002b, &vec8(&[3, 4]));
        let groups = extension(0x000a, &vec16(&[0x00, 0x1d]));
        let mut key_share = vec![0x00, 0x1d];
        key_share.extend(vec16(&[5u8; 32]));
        let key_share = extension(0x0033, &vec16(&key_share));
        // ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256: TLS 1.3 requires
        // the extension, and rustls refuses a hello without it.
        let signature_algorithms = extension(0x000d, &vec16(&[0x04, 0x03, 0x08, 0x04]));
        let mut all = vec![supported_versions, groups, key_share, signature_algorithms];
        all.extend(extensions.iter().cloned());
        body.extend(vec16(&all.concat()));
        body
    }

    fn handshake(body: &[u8]) -> Vec<u8> {
        let len = body.len() as u32;
        let mut out = vec![HANDSHAKE_CLIENT_HELLO];
        out.extend(&len.to_be_bytes()[1..]);
        out.extend_from_slice(body);
        out
    }

    fn records(handshake: &[u8], fragment: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in handshake.chunks(fragment) {
            out.extend([CONTENT_HANDSHAKE, 3, 1]);
            out.extend(vec16(chunk));
        }
        out
    }

    fn hello(extensions: &[Vec<u8>]) -> Vec<u8> {
        records(&handshake(&hello_body(extensions)), MAX_FRAGMENT)
    }

    fn name(host: &str) -> Sniffed {
        Sniffed::Name {
            host: host.into(),
            port: None,
        }
    }

    #[test]
    fn a_real_openssl_hello() {
        assert_eq!(tls_sni(OPENSSL_HELLO), name("files.pythonhosted.org"));
        for end in 0..OPENSSL_HELLO.len() {
            assert_eq!(tls_sni(&OPENSSL_HELLO[..end]), Sniffed::NeedMore, "{end}");
        }
    }

    #[test]
    fn hellos_real_clients_sent() {
        // Captured with a local listener: curl 7.88.1 (OpenSSL 3.0, ALPN
        // h2), the same with --tls-max 1.2, and `openssl s_client`.
        let captured: [(&[u8], &str); 3] = [
            (
                include_bytes!("../testdata/curl-7.88-client-hello-pypi.org.bin"),
                "pypi.org",
            ),
            (
                include_bytes!(
                    "../testdata/curl-7.88-tls1.2-client-hello-files.pythonhosted.org.bin"
                ),
                "files.pythonhosted.org",
            ),
            (
                include_bytes!("../testdata/openssl-3.0-s_client-client-hello-github.com.bin"),
                "github.com",
            ),
        ];
        for (bytes, host) in captured {
            assert_eq!(tls_sni(bytes), name(host));
            for end in 0..bytes.len() {
                assert_eq!(tls_sni(&bytes[..end]), Sniffed::NeedMore, "{host} {end}");
            }
        }
    }

    #[test]
    fn a_hand_built_hello_and_every_prefix_of_it() {
        let bytes = hello(&[sni_extension(&["pypi.org"])]);
        assert_eq!(tls_sni(&bytes), name("pypi.org"));
        for end in 0..bytes.len() {
            assert_eq!(tls_sni(&bytes[..end]), Sniffed::NeedMore, "{end}");
        }
    }

    #[test]
    fn a_hello_split_over_records() {
        let message = handshake(&hello_body(&[sni_extension(&["pypi.org"])]));
        for fragment in [1, 3, 4, 50] {
            let bytes = records(&message, fragment);
            assert_eq!(tls_sni(&bytes), name("pypi.org"), "{fragment}");
            for end in 0..bytes.len() {
                assert_eq!(
                    tls_sni(&bytes[..end]),
                    Sniffed::NeedMore,
                    "{fragment} {end}"
                );
            }
        }
    }

    #[test]
    fn hellos_without_a_name() {
        assert_eq!(tls_sni(&hello(&[])), Sniffed::NoName);
        // An IP address where a host name should be (RFC 6066 forbids it):
        // no SNI, as rustls reads it, so only address rules can allow it.
        assert_eq!(
            tls_sni(&hello(&[sni_extension(&["192.0.2.1"])])),
            Sniffed::NoName
        );
    }

    #[test]
    fn what_rustls_refuses_names_no_host() {
        let malformed = |bytes: &[u8]| matches!(tls_sni(bytes), Sniffed::Malformed(_));
        // No extensions block at all (a TLS 1.0 hello), so no
        // signature_algorithms.
        let mut body = vec![3, 1];
        body.extend([0u8; 32]);
        body.extend(vec8(&[]));
        body.extend(vec16(&[0x00, 0x2f]));
        body.extend(vec8(&[0]));
        assert!(malformed(&records(&handshake(&body), MAX_FRAGMENT)));
        // Only a name of another type.
        let mut list = vec![7];
        list.extend(vec16(b"x"));
        let other = extension(EXTENSION_SERVER_NAME, &vec16(&list));
        assert!(malformed(&hello(&[other])));
        // Names that are no DNS names: canonical_host refused them too.
        for bad in ["a\0b", "a b", "bad..name", "-x.test"] {
            assert!(malformed(&hello(&[sni_extension(&[bad])])), "{bad:?}");
        }
    }

    #[test]
    fn names_are_returned_in_lower_case_without_a_trailing_dot() {
        assert_eq!(
            tls_sni(&hello(&[sni_extension(&["PyPI.org."])])),
            name("pypi.org")
        );
        assert_eq!(
            tls_sni(&hello(&[sni_extension(&["_dmarc.Example.test"])])),
            name("_dmarc.example.test")
        );
    }

    #[test]
    fn not_tls() {
        for bytes in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"\x80\x2e\x01\x03\x01",
            b"\x17\x03\x03\x00\x10",
            b"\x16\x02",
            b"SSH-2.0-OpenSSH_9.6\r\n",
        ] {
            assert_eq!(tls_sni(bytes), Sniffed::NotTls, "{bytes:?}");
        }
    }

    #[test]
    fn malformed_hellos() {
        let good = hello(&[sni_extension(&["pypi.org"])]);
        let malformed = |bytes: &[u8]| matches!(tls_sni(bytes), Sniffed::Malformed(_));

        assert!(malformed(&hello(&[
            sni_extension(&["pypi.org"]),
            sni_extension(&["evil.com"])
        ])));
        assert!(malformed(&hello(&[sni_extension(&[
            "pypi.org", "evil.com"
        ])])));
        assert!(malformed(&hello(&[sni_extension(&[""])])));
        assert!(malformed(&hello(&[extension(EXTENSION_SERVER_NAME, &[])])));
        assert!(malformed(&hello(&[extension(
            EXTENSION_SERVER_NAME,
            &vec16(&[])
        )])));
        assert!(malformed(&hello(&[sni_extension(&["bücher.de"])])));
        // A server hello (type 2) where the client hello should be.
        let mut wrong_type = good.clone();
        wrong_type[5] = 2;
        assert!(malformed(&wrong_type));
        assert!(malformed(&wrong_type[..6]));
        // Zero-length and oversized records.
        assert!(malformed(b"\x16\x03\x01\x00\x00"));
        assert!(malformed(b"\x16\x03\x01\x40\x01"));
        // A handshake length past 16 KiB.
        assert!(malformed(b"\x16\x03\x01\x00\x04\x01\x00\x40\x00"));
        // The record is longer than the hello inside it.
        let mut long_record = good.clone();
        let record_len = u16::from_be_bytes([good[3], good[4]]) + 1;
        long_record[3..5].copy_from_slice(&record_len.to_be_bytes());
        long_record.push(0);
        assert!(malformed(&long_record));
        // The handshake length is shorter than its content.
        let body = hello_body(&[sni_extension(&["pypi.org"])]);
        let mut short = handshake(&body[..body.len() - 1]);
        short.push(*body.last().unwrap());
        let bytes = records(&short, MAX_FRAGMENT);
        assert!(malformed(&bytes));
        // An application data record in the middle of a fragmented hello.
        let message = handshake(&body);
        let mut mixed = records(&message[..10], MAX_FRAGMENT);
        mixed.extend([0x17, 3, 3, 0, 1, 0]);
        assert!(malformed(&mixed));
        // An ever-growing hello (padding) past 16 KiB, in many records.
        let padding = extension(0x0015, &vec![0u8; 20_000]);
        let big = records(&handshake(&hello_body(&[padding])), MAX_FRAGMENT);
        assert!(malformed(&big));
        assert!(malformed(&big[..MAX_SNIFF_BYTES + 100]));
    }

    #[test]
    fn random_and_mutated_input_never_panics() {
        let mut rng = Rng::new(0x5eed_0001);
        let good = hello(&[sni_extension(&["pypi.org"])]);
        for _ in 0..20_000 {
            let len = rng.below(700);
            let mut bytes = rng.bytes(len);
            tls_sni(&bytes);
            // Random bytes behind a plausible record header.
            bytes.splice(0..0, [CONTENT_HANDSHAKE, 3, 1]);
            tls_sni(&bytes);
            // A valid hello with a few bytes changed and a random cut.
            let mut mutated = if rng.below(2) == 0 {
                good.clone()
            } else {
                OPENSSL_HELLO.to_vec()
            };
            for _ in 0..=rng.below(4) {
                let at = rng.below(mutated.len());
                mutated[at] = rng.next() as u8;
            }
            let cut = rng.below(mutated.len() + 1);
            let verdict = tls_sni(&mutated[..cut]);
            if let Sniffed::Name { host, .. } = verdict {
                assert!(host.is_ascii() && !host.is_empty());
            }
        }
    }
}
