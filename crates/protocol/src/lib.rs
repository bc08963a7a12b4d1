//! The agent protocol: how the host talks to `airlock-agent`, PID 1 of every
//! sandbox, over one byte stream (a socketpair today, a vsock tomorrow).
//!
//! # Wire format
//!
//! A frame is `u32 header_len | u32 payload_len | header | payload`, both
//! lengths big-endian. The header is JSON: `{"id": N, "msg": {...}}`, where
//! `id` ties every frame to the request that opened it, so many requests run
//! at once over one stream. The payload carries raw bytes (process output,
//! stdin, file contents) so bulk data is never re-encoded.
//!
//! The host sends [`Request`]s; the agent answers each with zero or more
//! non-final [`Event`]s and exactly one final one ([`Event::is_final`]).
//! The first exchange is [`Request::Hello`] / [`Event::Hello`], which fixes
//! the version (see *Versions* below).
//!
//! # Versions
//!
//! Each build speaks a range of versions, [`OLDEST_PROTOCOL_VERSION`] to
//! [`PROTOCOL_VERSION`] ([`Versions::OURS`]). The host greets with its
//! range; the agent answers with the newest version both speak
//! ([`Versions::highest_common`]) or refuses with `unsupported_version`
//! when the ranges do not meet. From then on both sides speak the chosen
//! version, and the host gates whatever came after it on
//! [`AgentClient::version`]. Agents outlive daemons (a daemon upgrade
//! re-adopts the sandboxes its predecessor started), so a build keeps
//! speaking old versions for as long as their agents may still run:
//!
//! - a change old agents would not understand adds a version: bump
//!   [`PROTOCOL_VERSION`], keep [`OLDEST_PROTOCOL_VERSION`], and send the new
//!   messages only to agents that chose the new version;
//! - raise [`OLDEST_PROTOCOL_VERSION`] only once no agent of the versions
//!   dropped can still be running (a daemon of that build reaps such
//!   sandboxes as unusable on start).
//!
//! Version history: **1**, the first; **2**, the host's greeting carries
//! the range it speaks (`oldest`). Agents of version 1 refuse a greeting
//! with a range (their `hello` knows only `version`) and stay usable: the
//! host then greets them again as version 1 did; **3**, `extract` (a tar
//! stream unpacked in the sandbox, for template builds); **4**, extended
//! attributes (`xattrs` of `write_file`, `stat`, `list_dir_stream` and
//! `watch`, reported in [`FileInfo::xattrs`]), entries attached to a
//! watch's events (`entries`, [`Event::FsEvent`]'s `entry`), watches that
//! refuse network filesystems (`local_only`) and the error kind
//! `unsupported`. Every addition is optional and left out unless used, so
//! a host of version 4 speaks to older agents as before as long as it
//! sends none of them, and an agent sends them only when asked; **5**,
//! `connect` (a TCP connection to a port on the sandbox's loopback,
//! carried as `write_data`/`stream_data` frames, see [`tunnel`]) with its
//! events and the error kind `refused`.
//!
//! The JSON schema of both directions is checked in as `schema/v5.json`
//! (named after [`PROTOCOL_VERSION`]); a test fails when the types drift
//! from it, so every change is deliberate.
#![forbid(unsafe_code)]

mod chunks;
mod client;
mod codec;
mod messages;
pub mod tunnel;

pub use chunks::ChunkReader;
pub use client::{AgentClient, ClientError, Events};
pub use codec::{
    encode, read_frame, read_frame_bytes, write_frame, FrameError, MAX_HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
};
pub use messages::*;

/// The newest protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 5;

/// The oldest protocol version this build still speaks.
pub const OLDEST_PROTOCOL_VERSION: u32 = 1;

/// A range of protocol versions one side speaks, `oldest` to `newest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    /// The oldest version spoken.
    pub oldest: u32,
    /// The newest version spoken.
    pub newest: u32,
}

impl Versions {
    /// What this build speaks.
    pub const OURS: Versions = Versions {
        oldest: OLDEST_PROTOCOL_VERSION,
        newest: PROTOCOL_VERSION,
    };

    /// The range a greeting offers: `oldest` to `version`, or `version`
    /// alone when there is no `oldest` (as hosts of version 1 greet).
    pub fn offered(version: u32, oldest: Option<u32>) -> Versions {
        Versions {
            oldest: oldest.unwrap_or(version).min(version),
            newest: version,
        }
    }

    /// Whether `version` is in the range.
    pub fn contains(self, version: u32) -> bool {
        (self.oldest..=self.newest).contains(&version)
    }

    /// The newest version both ranges hold, if they meet.
    pub fn highest_common(self, other: Versions) -> Option<u32> {
        let newest = self.newest.min(other.newest);
        let oldest = self.oldest.max(other.oldest);
        (oldest <= newest).then_some(newest)
    }
}

impl std::fmt::Display for Versions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.oldest == self.newest {
            write!(f, "{}", self.newest)
        } else {
            write!(f, "{} to {}", self.oldest, self.newest)
        }
    }
}

/// A request or event with the id of the request it belongs to and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<M> {
    /// Request id chosen by the host; events carry the id of their request.
    /// Id 0 is reserved for agent-initiated events (keepalives).
    pub id: u64,
    /// The message.
    pub msg: M,
    /// Raw bytes that belong to the message (output, stdin, file data).
    pub payload: Vec<u8>,
}

impl<M> Frame<M> {
    /// A frame without payload.
    pub fn new(id: u64, msg: M) -> Self {
        Frame {
            id,
            msg,
            payload: Vec::new(),
        }
    }

    /// A frame with payload bytes.
    pub fn with_payload(id: u64, msg: M, payload: Vec<u8>) -> Self {
        Frame { id, msg, payload }
    }
}

/// The JSON schema of the protocol, both directions, as checked in.
pub fn schema() -> serde_json::Value {
    let mut generator = schemars::gen::SchemaSettings::draft07().into_generator();
    let request = generator.subschema_for::<Request>();
    let event = generator.subschema_for::<Event>();
    let definitions = generator.take_definitions();
    serde_json::json!({
        "protocol_version": PROTOCOL_VERSION,
        "oldest_protocol_version": OLDEST_PROTOCOL_VERSION,
        "request": request,
        "event": event,
        "definitions": definitions,
    })
}
