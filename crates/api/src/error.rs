//! Every error the API answers: `{"code": "...", "message": "..."}` with a
//! stable code and a message that never carries internal detail.

use airlock_core::RejectReason;
use airlock_daemon::DaemonError;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// Seconds a client is asked to wait when the store is unavailable.
pub const UNAVAILABLE_RETRY_SECS: u64 = 1;

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Stable, machine-readable: `bad_request`, `unauthorized`, `not_found`,
    /// `method_not_allowed`, `conflict`, `forbidden`, `payload_too_large`,
    /// `too_many_requests`, `sandbox_not_running`, `sandbox_io_error`,
    /// `insufficient_storage`, `unavailable`, `internal`.
    pub code: &'static str,
    /// A sentence for people.
    pub message: String,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid API key is required (X-API-Key or Authorization: Bearer)",
        )
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.code,
            message: self.message,
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

impl From<DaemonError> for ApiError {
    fn from(e: DaemonError) -> ApiError {
        let message = e.to_string();
        match e {
            DaemonError::BadInput(_) => ApiError::bad_request(message),
            DaemonError::NotFound(_) => ApiError::not_found(message),
            DaemonError::NotRunning(_) => {
                ApiError::new(StatusCode::CONFLICT, "sandbox_not_running", message)
            }
            DaemonError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "conflict", message),
            DaemonError::Unsupported(_) => {
                ApiError::new(StatusCode::NOT_IMPLEMENTED, "not_implemented", message)
            }
            DaemonError::Forbidden(_) => ApiError::new(StatusCode::FORBIDDEN, "forbidden", message),
            DaemonError::QuotaExceeded(_) => {
                ApiError::new(StatusCode::FORBIDDEN, "quota_exceeded", message)
            }
            DaemonError::TooLarge(_) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
            }
            DaemonError::Upstream(_) => {
                ApiError::new(StatusCode::BAD_GATEWAY, "upstream_failed", message)
            }
            DaemonError::PortClosed(_) => {
                ApiError::new(StatusCode::BAD_GATEWAY, "port_closed", message)
            }
            DaemonError::InSandbox(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "sandbox_io_error",
                message,
            ),
            DaemonError::StepFailed(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "build_step_failed",
                message,
            ),
            DaemonError::NoSpace(_) => ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                message,
            ),
            DaemonError::Rejected(rejected) => {
                let (status, code) = match rejected.reason {
                    RejectReason::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
                    _ => (StatusCode::TOO_MANY_REQUESTS, "too_many_requests"),
                };
                ApiError {
                    status,
                    code,
                    message: rejected.reason.to_string(),
                    retry_after: Some(rejected.retry_after_secs()),
                }
            }
            DaemonError::Reconnecting(_) => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "sandbox_reconnecting",
                message,
                retry_after: Some(1),
            },
            DaemonError::Unavailable(detail) => {
                tracing::warn!("unavailable: {detail}");
                ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    code: "unavailable",
                    message: "the daemon's state database is unavailable for now; try again".into(),
                    retry_after: Some(UNAVAILABLE_RETRY_SECS),
                }
            }
            DaemonError::Internal(detail) => {
                tracing::error!("internal error: {detail}");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the daemon failed to carry out the request; see its log",
                )
            }
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        match rejection {
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be JSON with Content-Type: application/json",
            ),
            JsonRejection::BytesRejection(e) if !too_long(&e) => unreadable_body(),
            JsonRejection::BytesRejection(_) => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the JSON body is larger than 1 MiB",
            ),
            // The text names the field and what was wrong with it.
            other => ApiError::bad_request(other.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> ApiError {
        ApiError::bad_request(rejection.body_text())
    }
}

/// Whether a body could not be read because it was longer than its limit
/// (`http_body_util::Limited`), as opposed to malformed: a broken chunked
/// encoding (which is also what a request with both `Content-Length` and
/// `Transfer-Encoding: chunked` gets, since hyper then reads it as chunked)
/// or a connection that broke off.
pub fn too_long(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// The answer to a request body that could not be read and was not too
/// long: 400.
pub fn unreadable_body() -> ApiError {
    ApiError::bad_request(
        "the request body could not be read: it is not framed as its headers say (a request may not carry both Content-Length and Transfer-Encoding)",
    )
}

/// Fallback for unknown routes.
pub async fn no_route() -> ApiError {
    ApiError::not_found("no such route")
}

/// Fallback for a known route with a wrong method.
pub async fn wrong_method() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}

/// The JSON body, or the error answer for it.
pub fn json_body<T>(
    body: std::result::Result<axum::Json<T>, JsonRejection>,
) -> std::result::Result<T, ApiError> {
    body.map(|axum::Json(t)| t).map_err(ApiError::from)
}

/// An optional JSON body: `T::default()` when it is empty (or only
/// whitespace), else `T` or a 400 saying the body is not `what`.
pub fn optional_body<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
    what: &str,
) -> std::result::Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not {what}: {e}")))
}

/// The query parameters, or the error answer for them.
pub fn query<T>(
    q: std::result::Result<axum::extract::Query<T>, QueryRejection>,
) -> std::result::Result<T, ApiError> {
    q.map(|axum::extract::Query(t)| t).map_err(ApiError::from)
}
