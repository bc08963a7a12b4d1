//! The sandbox spec: one serde type that says what a sandbox is and may do.
//!
//! A [`SandboxSpec`] is built from user input (CLI flags, API bodies),
//! validated once by [`SandboxSpec::validate`], and then handed to a backend,
//! which turns it into a launch plan with a pure function. Nothing here talks
//! to the kernel: every check is on the data alone, so the whole policy layer
//! is unit-testable. Deserialization fails closed: unknown fields are refused.
//!
//! [`network`] holds the network policy and the pure decisions its
//! enforcement asks: which names DNS may answer, which connections the
//! egress proxy may open.
#![forbid(unsafe_code)]

pub mod network;
mod parse;
mod spec;

pub use network::{
    always_denied, canonical_host, Decision, DeniedRange, DenyReason, Destination, DomainName,
    Host, HostError, NetworkPolicy, Rule, RuleError,
};
pub use parse::{parse_cpus, parse_duration, parse_size, ParseError};
pub use spec::*;
