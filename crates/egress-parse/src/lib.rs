//! The host an outgoing connection of a sandbox names, read from its first
//! bytes: TLS SNI ([`tls_sni`]) or the HTTP/1.x `Host` header and CONNECT
//! target ([`http_host`]).
//!
//! # Why a crate of its own
//!
//! These functions read bytes written by code we do not trust, in the
//! daemon's process, before any policy applies. Kept apart they have no
//! state, forbid `unsafe`, never panic on any input (tests feed them
//! truncations and random bytes, and `fuzz/` at the repository's root
//! fuzzes them) and look at no more than [`MAX_SNIFF_BYTES`]; the policy
//! crate stays pure data with no wire formats in it.
//!
//! The wire formats are read by crates made for them: a ClientHello by
//! rustls's server `Acceptor` (no crypto provider), a request head by
//! `httparse`, hyper's own head parser. What is ours on top is the
//! strictness a proxy judging a connection needs and a server does not
//! (see each module).
//!
//! # How the egress proxy uses them
//!
//! The proxy peeks at the first bytes of an intercepted connection and
//! calls the parser for the port's protocol (or both). On
//! [`Sniffed::NeedMore`] it reads more, up to [`MAX_SNIFF_BYTES`] and a
//! deadline. A [`Sniffed::Name`] is *raw*: it must go through
//! `airlock_policy::canonical_host` (which refuses what could be read two
//! ways and maps `127.1`-style spellings to addresses) and then
//! `NetworkPolicy::decide`. Anything else ([`Sniffed::NoName`] aside, which
//! only address rules can allow) is refused.
//!
//! What these parsers cannot see, and the enforcement must account for:
//! - Only the first request head of a plain-HTTP connection is read. A
//!   kept-alive connection may send more requests naming other hosts; the
//!   proxy must parse every request head, or allow one request per
//!   connection.
//! - TLS hides everything after the ClientHello: a server reached under an
//!   allowed SNI may serve other names it hosts (domain fronting on shared
//!   CDNs), and with Encrypted Client Hello the SNI is the provider's public
//!   name. Only TLS interception could see more.
#![forbid(unsafe_code)]

mod http;
mod tls;

pub use http::{http_host, one_request_only, origin_form};
pub use tls::tls_sni;

/// The most bytes either parser looks at. A ClientHello or request head
/// that is not complete within them is [`Sniffed::Malformed`].
pub const MAX_SNIFF_BYTES: usize = 16 * 1024;

/// What the first bytes of a connection say about where it is going.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// The host the connection names, exactly as sent (not yet
    /// canonicalised; an IPv6 literal keeps its brackets), and the port
    /// when the protocol carries one: the CONNECT target's, or the one in
    /// `Host` or an absolute-form target. TLS never carries a port.
    Name { host: String, port: Option<u16> },
    /// A complete, well-formed ClientHello or request head that names no
    /// host (no SNI; HTTP/1.0 without `Host`).
    NoName,
    /// A prefix of something well-formed so far: read more bytes.
    NeedMore,
    /// The bytes do not start a TLS handshake ([`tls_sni`] only).
    NotTls,
    /// The bytes do not start an HTTP/1.0 or HTTP/1.1 request
    /// ([`http_host`] only).
    NotHttp,
    /// The protocol is recognised but the message breaks it, or it is
    /// ambiguous (duplicate names, smuggling tricks), or too long. The text
    /// says which, for the audit event.
    Malformed(&'static str),
}

#[cfg(test)]
pub(crate) mod testing {
    /// xorshift64*: a fixed-seed generator, so the random-input tests are
    /// the same on every run and need no dependency.
    pub struct Rng(u64);

    impl Rng {
        pub fn new(seed: u64) -> Rng {
            Rng(seed.max(1))
        }

        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        pub fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        pub fn bytes(&mut self, len: usize) -> Vec<u8> {
            (0..len).map(|_| self.next() as u8).collect()
        }
    }
}
