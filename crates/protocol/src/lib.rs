//! The agent protocol: how the host talks to `airlock agent`, PID 1 of every
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
//! the version: a peer refuses a version it does not speak.
//!
//! The JSON schema of both directions is checked in as `schema/v1.json`; a
//! test fails when the types drift from it, so every change is deliberate.
#![forbid(unsafe_code)]

mod client;
mod codec;
mod messages;

pub use client::{AgentClient, ClientError, Events};
pub use codec::{
    encode, read_frame, read_frame_bytes, write_frame, FrameError, MAX_HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
};
pub use messages::*;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;

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
        "request": request,
        "event": event,
        "definitions": definitions,
    })
}
