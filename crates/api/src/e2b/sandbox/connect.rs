//! The Connect protocol, JSON codec only, as envd speaks it to the e2b
//! SDKs.
//!
//! - **Unary** calls post one JSON message (`application/json`) and get one
//!   back with 200, or an error: a non-200 status and `{"code", "message"}`.
//! - **Streams** (`application/connect+json`) carry *envelopes* in both
//!   directions: one flag byte, a 4-byte big-endian length, the message.
//!   The server ends its stream with an envelope flagged [`END_STREAM`]
//!   whose body is `{}` or `{"error": {"code", "message"}}`. An error found
//!   before the first message is answered like a unary error instead (a
//!   non-200 status and a JSON body), which Connect clients accept too.
//! - `Connect-Timeout-Ms` bounds a call; `Keepalive-Ping-Interval` (an e2b
//!   header, seconds) asks for a keepalive message whenever a stream has
//!   been quiet that long.

use crate::error::ApiError;
use airlock_daemon::DaemonError;
use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::pin::Pin;
use std::time::Duration;
use tokio::time::Instant;

/// Content type of unary JSON calls.
pub const UNARY_JSON: &str = "application/json";
/// Content type of streaming JSON calls.
pub const STREAM_JSON: &str = "application/connect+json";
/// Envelope flag: the payload is compressed (we never accept it).
pub const COMPRESSED: u8 = 0x01;
/// Envelope flag: the server's last envelope, carrying the end of stream.
pub const END_STREAM: u8 = 0x02;
/// Largest message accepted in a request.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// Longest keepalive interval honoured; shortest is one second.
const MAX_KEEPALIVE: Duration = Duration::from_secs(3600);

/// The Connect error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// The code as it is written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status the Connect specification maps the code to.
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }

    /// The code for an HTTP status (for errors that came as [`ApiError`]).
    pub fn of_status(status: StatusCode) -> Code {
        match status.as_u16() {
            400 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            409 => Code::AlreadyExists,
            413 | 429 | 507 => Code::ResourceExhausted,
            499 => Code::Canceled,
            501 => Code::Unimplemented,
            503 => Code::Unavailable,
            504 => Code::DeadlineExceeded,
            _ => Code::Internal,
        }
    }
}

/// A Connect error: a code and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::InvalidArgument, message)
    }

    pub fn unimplemented(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::Unimplemented, message)
    }

    /// The JSON of the error, as both unary bodies and end-of-stream
    /// messages carry it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }

    /// The end-of-stream envelope reporting this error.
    pub fn end_stream(&self) -> Bytes {
        envelope(END_STREAM, &serde_json::json!({"error": self.to_json()}))
    }
}

impl From<DaemonError> for ConnectError {
    fn from(e: DaemonError) -> ConnectError {
        let code = match &e {
            DaemonError::BadInput(_) => Code::InvalidArgument,
            DaemonError::NotFound(_) => Code::NotFound,
            // What e2b's proxy says of a sandbox that is gone, so the SDK
            // reports it as not running.
            DaemonError::NotRunning(id) => {
                return ConnectError::new(
                    Code::Unavailable,
                    format!("The sandbox {id} was not found"),
                )
            }
            DaemonError::Conflict(_) => Code::AlreadyExists,
            DaemonError::Unsupported(_) => Code::Unimplemented,
            DaemonError::Forbidden(_) => Code::PermissionDenied,
            DaemonError::TooLarge(_) | DaemonError::NoSpace(_) => Code::ResourceExhausted,
            DaemonError::InSandbox(_) | DaemonError::StepFailed(_) => Code::Unknown,
            DaemonError::Rejected(_) | DaemonError::QuotaExceeded(_) => Code::ResourceExhausted,
            DaemonError::Reconnecting(_)
            | DaemonError::Upstream(_)
            | DaemonError::PortClosed(_) => Code::Unavailable,
            DaemonError::Unavailable(_) => {
                // Transient; the detail goes to the log only.
                let api = ApiError::from(e);
                return ConnectError::new(Code::Unavailable, api.message);
            }
            DaemonError::Internal(_) => {
                // The detail goes to the log only.
                let api = ApiError::from(e);
                return ConnectError::new(Code::Internal, api.message);
            }
        };
        ConnectError::new(code, e.to_string())
    }
}

impl From<ApiError> for ConnectError {
    fn from(e: ApiError) -> ConnectError {
        ConnectError::new(Code::of_status(e.status), e.message)
    }
}

impl IntoResponse for ConnectError {
    /// The unary (and before-the-first-message streaming) error answer.
    fn into_response(self) -> Response {
        (
            self.code.http_status(),
            [(header::CONTENT_TYPE, UNARY_JSON)],
            self.to_json().to_string(),
        )
            .into_response()
    }
}

/// One envelope: flags, big-endian length, the JSON of `message`.
pub fn envelope<T: Serialize>(flags: u8, message: &T) -> Bytes {
    let body = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
    let mut out = BytesMut::with_capacity(5 + body.len());
    out.extend_from_slice(&[flags]);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out.freeze()
}

/// The end-of-stream envelope of a stream that ended well.
pub fn end_ok() -> Bytes {
    envelope(END_STREAM, &serde_json::json!({}))
}

/// Reads envelopes out of a byte stream cut at arbitrary points.
#[derive(Default)]
pub struct EnvelopeReader {
    buffer: BytesMut,
}

impl EnvelopeReader {
    /// Adds bytes that arrived.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole envelope `(flags, payload)`, if one is buffered.
    pub fn next_envelope(&mut self) -> Result<Option<(u8, Bytes)>, ConnectError> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let flags = self.buffer[0];
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if len > MAX_MESSAGE_BYTES {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("a message is larger than {MAX_MESSAGE_BYTES} bytes"),
            ));
        }
        if flags & COMPRESSED != 0 {
            return Err(ConnectError::unimplemented(
                "compressed messages are not supported; send them uncompressed",
            ));
        }
        if self.buffer.len() < 5 + len {
            return Ok(None);
        }
        self.buffer.advance(5);
        Ok(Some((flags, self.buffer.split_to(len).freeze())))
    }

    /// Whether bytes of an unfinished envelope are left.
    pub fn has_partial(&self) -> bool {
        !self.buffer.is_empty()
    }
}

/// Parses one JSON message.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ConnectError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        bytes
    };
    serde_json::from_slice(bytes)
        .map_err(|e| ConnectError::invalid(format!("the request message is not valid: {e}")))
}

/// Checks the content type is the JSON codec of the expected kind.
pub fn check_content_type(headers: &HeaderMap, stream: bool) -> Result<(), ConnectError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let expected = if stream { STREAM_JSON } else { UNARY_JSON };
    if content_type == expected || content_type.is_empty() && !stream {
        Ok(())
    } else {
        Err(ConnectError::unimplemented(format!(
            "only the JSON codec is served; send Content-Type: {expected}"
        )))
    }
}

/// The whole body of a unary call, parsed.
pub async fn unary_request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ConnectError> {
    check_content_type(headers, false)?;
    if headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.eq_ignore_ascii_case("identity"))
    {
        return Err(ConnectError::unimplemented(
            "compressed requests are not supported; send them uncompressed",
        ));
    }
    let bytes = axum::body::to_bytes(body, MAX_MESSAGE_BYTES)
        .await
        .map_err(|_| {
            ConnectError::new(
                Code::ResourceExhausted,
                format!("the request is larger than {MAX_MESSAGE_BYTES} bytes"),
            )
        })?;
    decode(&bytes)
}

/// The single message of a server-streaming call.
pub async fn stream_request<T: DeserializeOwned + Send + 'static>(
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ConnectError> {
    check_content_type(headers, true)?;
    let mut messages = client_stream::<T>(body);
    let first = messages
        .next()
        .await
        .unwrap_or_else(|| Err(ConnectError::invalid("the request carries no message")))?;
    // The body's end (a chunked body's last chunk) is read too: an error
    // answer closes the connection (see `e2b::closing_on_error`), and a
    // close with request bytes still unread makes the kernel reset the
    // connection, which can destroy the answer before the client reads it
    // (the SDK then sees "connection closed before message completed").
    // A client that keeps its body open is not waited for long.
    let _ = tokio::time::timeout(DRAIN_WAIT, async {
        while messages.next().await.is_some() {}
    })
    .await;
    Ok(first)
}

/// How long a server-streaming call waits for the end of its request body
/// after its one message.
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// The messages of a client stream, in order; an error ends it.
pub fn client_stream<T: DeserializeOwned + Send + 'static>(
    body: Body,
) -> Pin<Box<dyn Stream<Item = Result<T, ConnectError>> + Send>> {
    let state = (body.into_data_stream(), EnvelopeReader::default(), false);
    Box::pin(futures_util::stream::unfold(
        state,
        |(mut data, mut reader, done)| async move {
            if done {
                return None;
            }
            loop {
                match reader.next_envelope() {
                    Err(e) => return Some((Err(e), (data, reader, true))),
                    Ok(Some((flags, payload))) => {
                        if flags & END_STREAM != 0 {
                            return None;
                        }
                        let item = decode::<T>(&payload);
                        let failed = item.is_err();
                        return Some((item, (data, reader, failed)));
                    }
                    Ok(None) => {}
                }
                match data.next().await {
                    Some(Ok(bytes)) => reader.feed(&bytes),
                    Some(Err(_)) => {
                        return Some((
                            Err(ConnectError::new(
                                Code::Canceled,
                                "the request body broke off",
                            )),
                            (data, reader, true),
                        ))
                    }
                    None if reader.has_partial() => {
                        return Some((
                            Err(ConnectError::invalid("the request ends inside a message")),
                            (data, reader, true),
                        ))
                    }
                    None => return None,
                }
            }
        },
    ))
}

/// A unary success answer.
pub fn unary_response<T: Serialize>(message: &T) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, UNARY_JSON)],
        serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec()),
    )
        .into_response()
}

/// The keepalive interval the client asked for.
pub fn keepalive_interval(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|secs| Duration::from_secs(secs).clamp(Duration::from_secs(1), MAX_KEEPALIVE))
}

/// The call's deadline from `Connect-Timeout-Ms`, if it names one.
pub fn timeout(headers: &HeaderMap) -> Result<Option<Duration>, ConnectError> {
    match headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
    {
        None => Ok(None),
        Some(text) => {
            let text = text.trim();
            if text.is_empty() || text.len() > 10 {
                return Err(ConnectError::invalid(
                    "Connect-Timeout-Ms must be 1 to 10 digits",
                ));
            }
            text.parse::<u64>()
                .map(|ms| Some(Duration::from_millis(ms)))
                .map_err(|_| ConnectError::invalid("Connect-Timeout-Ms must be 1 to 10 digits"))
        }
    }
}

/// How a server stream is sent.
pub struct StreamOptions {
    /// Send this message whenever the stream has been quiet this long.
    pub keepalive: Option<(Duration, serde_json::Value)>,
    /// End the stream with `deadline_exceeded` at this time.
    pub deadline: Option<Duration>,
}

struct StreamState<S> {
    messages: S,
    keepalive: Option<(Duration, Bytes)>,
    deadline: Option<Instant>,
    ended: bool,
}

/// A streaming answer: each message of `messages` in an envelope, then the
/// end of stream (`{}` when `messages` ends, the error when it yields one).
pub fn stream_response<S>(messages: S, options: StreamOptions) -> Response
where
    S: Stream<Item = Result<serde_json::Value, ConnectError>> + Send + Unpin + 'static,
{
    let state = StreamState {
        messages,
        keepalive: options
            .keepalive
            .map(|(every, message)| (every, envelope(0, &message))),
        deadline: options.deadline.map(|d| Instant::now() + d),
        ended: false,
    };
    let body = futures_util::stream::unfold(state, |mut state| async move {
        if state.ended {
            return None;
        }
        let next = {
            let quiet = async {
                match &state.keepalive {
                    Some((every, _)) => tokio::time::sleep(*every).await,
                    None => std::future::pending().await,
                }
            };
            let expired = async {
                match state.deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                item = state.messages.next() => Step::Item(item),
                () = quiet => Step::Quiet,
                () = expired => Step::Expired,
            }
        };
        let bytes = match next {
            Step::Item(Some(Ok(message))) => envelope(0, &message),
            Step::Item(Some(Err(error))) => {
                state.ended = true;
                error.end_stream()
            }
            Step::Item(None) => {
                state.ended = true;
                end_ok()
            }
            Step::Quiet => state
                .keepalive
                .as_ref()
                .map(|(_, bytes)| bytes.clone())
                .unwrap_or_default(),
            Step::Expired => {
                state.ended = true;
                ConnectError::new(Code::DeadlineExceeded, "the call's timeout passed").end_stream()
            }
        };
        Some((Ok::<Bytes, std::convert::Infallible>(bytes), state))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, STREAM_JSON),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

enum Step {
    Item(Option<Result<serde_json::Value, ConnectError>>),
    Quiet,
    Expired,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn frames(mut bytes: &[u8]) -> Vec<(u8, serde_json::Value)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
            out.push((
                bytes[0],
                serde_json::from_slice(&bytes[5..5 + len]).unwrap(),
            ));
            bytes = &bytes[5 + len..];
        }
        out
    }

    #[test]
    fn envelopes_carry_flags_length_and_json() {
        let bytes = envelope(0, &json!({"a": 1}));
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(&bytes[5..], br#"{"a":1}"#);
        assert_eq!(&end_ok()[..], &[2, 0, 0, 0, 2, b'{', b'}']);
        let end = ConnectError::new(Code::NotFound, "no file").end_stream();
        assert_eq!(
            frames(&end),
            vec![(
                2,
                json!({"error": {"code": "not_found", "message": "no file"}})
            )]
        );
    }

    #[test]
    fn the_reader_reassembles_envelopes_cut_anywhere() {
        let mut all = Vec::new();
        all.extend_from_slice(&envelope(0, &json!({"n": 1})));
        all.extend_from_slice(&envelope(0, &json!({"n": 2})));
        let mut reader = EnvelopeReader::default();
        let mut got = Vec::new();
        for byte in &all {
            reader.feed(&[*byte]);
            while let Some((flags, payload)) = reader.next_envelope().unwrap() {
                got.push((
                    flags,
                    serde_json::from_slice::<serde_json::Value>(&payload).unwrap(),
                ));
            }
        }
        assert_eq!(got, vec![(0, json!({"n": 1})), (0, json!({"n": 2}))]);
        assert!(!reader.has_partial());
        let mut compressed = EnvelopeReader::default();
        compressed.feed(&[1, 0, 0, 0, 0]);
        assert_eq!(
            compressed.next_envelope().unwrap_err().code,
            Code::Unimplemented
        );
        let mut huge = EnvelopeReader::default();
        huge.feed(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            huge.next_envelope().unwrap_err().code,
            Code::ResourceExhausted
        );
    }

    #[test]
    fn codes_map_to_the_specified_statuses() {
        assert_eq!(Code::NotFound.http_status(), StatusCode::NOT_FOUND);
        assert_eq!(
            Code::Unauthenticated.http_status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            Code::Unimplemented.http_status(),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(Code::Canceled.http_status().as_u16(), 499);
        assert_eq!(
            Code::DeadlineExceeded.http_status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(Code::AlreadyExists.http_status(), StatusCode::CONFLICT);
        let e: ConnectError = DaemonError::NotFound("no file /x".into()).into();
        assert_eq!((e.code, e.message.as_str()), (Code::NotFound, "no file /x"));
        let e: ConnectError = DaemonError::Internal("secret detail".into()).into();
        assert_eq!(e.code, Code::Internal);
        assert!(!e.message.contains("secret"));
        let e: ConnectError = DaemonError::NotRunning("sbx-1".into()).into();
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.message.contains("was not found"));
        let e: ConnectError = ApiError::unauthorized().into();
        assert_eq!(e.code, Code::Unauthenticated);
    }

    #[test]
    fn headers_give_timeouts_and_keepalives() {
        let mut headers = HeaderMap::new();
        assert_eq!(timeout(&headers).unwrap(), None);
        headers.insert("connect-timeout-ms", "1500".parse().unwrap());
        headers.insert("keepalive-ping-interval", "50".parse().unwrap());
        assert_eq!(
            timeout(&headers).unwrap(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(keepalive_interval(&headers), Some(Duration::from_secs(50)));
        headers.insert("connect-timeout-ms", "12345678901".parse().unwrap());
        assert_eq!(timeout(&headers).unwrap_err().code, Code::InvalidArgument);
        headers.insert("keepalive-ping-interval", "0".parse().unwrap());
        assert_eq!(keepalive_interval(&headers), Some(Duration::from_secs(1)));
    }

    async fn body_frames(response: Response) -> Vec<(u8, serde_json::Value)> {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        frames(&bytes)
    }

    #[tokio::test]
    async fn streams_send_keepalives_and_end_at_the_deadline() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<serde_json::Value, ConnectError>>(4);
        tx.send(Ok(json!({"first": true}))).await.unwrap();
        let messages = tokio_stream_of(rx);
        let response = stream_response(
            messages,
            StreamOptions {
                keepalive: Some((Duration::from_millis(100), json!({"keepalive": {}}))),
                deadline: Some(Duration::from_millis(350)),
            },
        );
        assert_eq!(response.headers()[header::CONTENT_TYPE], STREAM_JSON);
        let got = body_frames(response).await;
        drop(tx);
        assert_eq!(got[0], (0, json!({"first": true})));
        let keepalives = &got[1..got.len() - 1];
        assert!(!keepalives.is_empty());
        assert!(keepalives
            .iter()
            .all(|f| f == &(0, json!({"keepalive": {}}))));
        let (flags, end) = got.last().unwrap();
        assert_eq!(*flags, END_STREAM);
        assert_eq!(end["error"]["code"], "deadline_exceeded");
    }

    #[tokio::test]
    async fn streams_end_with_the_error_they_yield() {
        let items = vec![
            Ok(json!({"n": 1})),
            Err(ConnectError::new(Code::Unavailable, "gone")),
            Ok(json!({"n": 2})),
        ];
        let response = stream_response(
            futures_util::stream::iter(items),
            StreamOptions {
                keepalive: None,
                deadline: None,
            },
        );
        let got = body_frames(response).await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].1["error"]["code"], "unavailable");
    }

    fn tokio_stream_of(
        rx: tokio::sync::mpsc::Receiver<Result<serde_json::Value, ConnectError>>,
    ) -> impl Stream<Item = Result<serde_json::Value, ConnectError>> + Send + Unpin {
        Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        }))
    }
}
