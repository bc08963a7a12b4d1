//! TLS ClientHello: the `server_name` extension (RFC 6066) of the first
//! handshake message, reassembled across records.

use crate::{Sniffed, MAX_SNIFF_BYTES};

const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST_NAME: u8 = 0;
/// Largest plaintext record fragment (RFC 8446, 5.1).
const MAX_FRAGMENT: usize = 1 << 14;
const RECORD_HEADER: usize = 5;
const HANDSHAKE_HEADER: usize = 4;

/// The SNI host name of a TLS ClientHello.
///
/// `first_bytes` are the first bytes the client sent. The hello may span
/// several handshake records; it is reassembled up to [`MAX_SNIFF_BYTES`].
/// Returns [`Sniffed::NeedMore`] for every proper prefix of a well-formed
/// hello, [`Sniffed::NotTls`] when the first record is not a TLS handshake
/// record, and [`Sniffed::Malformed`] when lengths disagree, the first
/// message is not a ClientHello, an extension or a host name appears twice,
/// or anything follows the hello.
pub fn tls_sni(first_bytes: &[u8]) -> Sniffed {
    let mut handshake: Vec<u8> = Vec::new();
    let mut at = 0;
    loop {
        let header = &first_bytes[at.min(first_bytes.len())..];
        let first_record = at == 0;
        if let Some(&content_type) = header.first() {
            if content_type != CONTENT_HANDSHAKE {
                return if first_record {
                    Sniffed::NotTls
                } else {
                    Sniffed::Malformed("a record other than a handshake interrupts the ClientHello")
                };
            }
        }
        if let Some(&major) = header.get(1) {
            if major != 3 {
                return if first_record {
                    Sniffed::NotTls
                } else {
                    Sniffed::Malformed("a record of another TLS version interrupts the ClientHello")
                };
            }
        }
        if header.len() < RECORD_HEADER {
            return Sniffed::NeedMore;
        }
        let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if length == 0 || length > MAX_FRAGMENT {
            return Sniffed::Malformed("a handshake record has a length of 0 or over 16 KiB");
        }
        let available = &header[RECORD_HEADER..];
        let fragment = &available[..length.min(available.len())];
        handshake.extend_from_slice(fragment);
        if let Some(&kind) = handshake.first() {
            if kind != HANDSHAKE_CLIENT_HELLO {
                return Sniffed::Malformed("the first handshake message is not a ClientHello");
            }
        }
        if handshake.len() >= HANDSHAKE_HEADER {
            let body_len = usize::from(handshake[1]) << 16
                | usize::from(handshake[2]) << 8
                | usize::from(handshake[3]);
            let message_len = HANDSHAKE_HEADER + body_len;
            if message_len > MAX_SNIFF_BYTES {
                return Sniffed::Malformed("the ClientHello is over 16 KiB");
            }
            // The record's length counts bytes past the hello (whether
            // they have arrived or not): a client sends nothing else in the
            // hello's records.
            let record_rest = length - fragment.len();
            if handshake.len() > message_len || (handshake.len() == message_len && record_rest > 0)
            {
                return Sniffed::Malformed("data follows the ClientHello in its record");
            }
            if handshake.len() == message_len {
                return client_hello(&handshake[HANDSHAKE_HEADER..]);
            }
        }
        if fragment.len() < length {
            return Sniffed::NeedMore;
        }
        at += RECORD_HEADER + length;
        if at >= MAX_SNIFF_BYTES {
            return Sniffed::Malformed("the ClientHello is over 16 KiB");
        }
    }
}

/// A cursor over a complete message: every read that runs past the end
/// means a length inside the message lied.
struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.data.len() {
            return None;
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one-byte length.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// A vector with a two-byte length.
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

const TRUNCATED: Sniffed = Sniffed::Malformed("a length inside the ClientHello runs past its end");

/// The body of a complete ClientHello (after the handshake header).
fn client_hello(body: &[u8]) -> Sniffed {
    let mut r = Reader { data: body };
    let Some(version) = r.u16() else {
        return TRUNCATED;
    };
    if version >> 8 != 3 {
        return Sniffed::Malformed("the ClientHello has a version other than 3.x");
    }
    if r.take(32).is_none() {
        return TRUNCATED;
    }
    match r.vec8() {
        Some(session_id) if session_id.len() <= 32 => {}
        Some(_) => return Sniffed::Malformed("the session id is over 32 bytes"),
        None => return TRUNCATED,
    }
    match r.vec16() {
        Some(suites) if !suites.is_empty() && suites.len() % 2 == 0 => {}
        Some(_) => return Sniffed::Malformed("the cipher suite list is empty or odd"),
        None => return TRUNCATED,
    }
    match r.vec8() {
        Some(methods) if !methods.is_empty() => {}
        Some(_) => return Sniffed::Malformed("the compression method list is empty"),
        None => return TRUNCATED,
    }
    if r.is_empty() {
        // A hello from before extensions existed.
        return Sniffed::NoName;
    }
    let Some(extensions) = r.vec16() else {
        return TRUNCATED;
    };
    if !r.is_empty() {
        return Sniffed::Malformed("bytes follow the extensions of the ClientHello");
    }
    let mut r = Reader { data: extensions };
    let mut seen: Vec<u16> = Vec::new();
    let mut name = None;
    while !r.is_empty() {
        let (Some(kind), Some(data)) = (r.u16(), r.vec16()) else {
            return TRUNCATED;
        };
        if seen.contains(&kind) {
            return Sniffed::Malformed("an extension appears twice in the ClientHello");
        }
        seen.push(kind);
        if kind == EXTENSION_SERVER_NAME {
            match server_name(data) {
                Ok(found) => name = found,
                Err(malformed) => return malformed,
            }
        }
    }
    match name {
        Some(host) => Sniffed::Name { host, port: None },
        None => Sniffed::NoName,
    }
}

/// The host name of a `server_name` extension's data, if it holds one.
fn server_name(data: &[u8]) -> Result<Option<String>, Sniffed> {
    let mut outer = Reader { data };
    let list = outer.vec16().ok_or(TRUNCATED)?;
    if !outer.is_empty() || list.is_empty() {
        return Err(Sniffed::Malformed(
            "the server_name extension is empty or has bytes past its list",
        ));
    }
    let mut r = Reader { data: list };
    let mut host = None;
    while !r.is_empty() {
        let (Some(kind), Some(name)) = (r.u8(), r.vec16()) else {
            return Err(TRUNCATED);
        };
        if kind != NAME_TYPE_HOST_NAME {
            continue;
        }
        if host.is_some() {
            return Err(Sniffed::Malformed("the ClientHello names two hosts"));
        }
        if name.is_empty() || !name.is_ascii() {
            return Err(Sniffed::Malformed(
                "the SNI host name is empty or not ASCII",
            ));
        }
        host = Some(name.iter().map(|&b| char::from(b)).collect());
    }
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

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
        let mut all = vec![supported_versions, groups, key_share];
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
        // No extensions block at all.
        let mut body = vec![3, 1];
        body.extend([0u8; 32]);
        body.extend(vec8(&[]));
        body.extend(vec16(&[0x00, 0x2f]));
        body.extend(vec8(&[0]));
        assert_eq!(
            tls_sni(&records(&handshake(&body), MAX_FRAGMENT)),
            Sniffed::NoName
        );
        // Only a name of another type.
        let mut list = vec![7];
        list.extend(vec16(b"x"));
        let other = extension(EXTENSION_SERVER_NAME, &vec16(&list));
        assert_eq!(tls_sni(&hello(&[other])), Sniffed::NoName);
    }

    #[test]
    fn names_are_returned_raw_for_the_caller_to_canonicalise() {
        assert_eq!(
            tls_sni(&hello(&[sni_extension(&["PyPI.org."])])),
            name("PyPI.org.")
        );
        assert_eq!(tls_sni(&hello(&[sni_extension(&["a\0b"])])), name("a\0b"));
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
