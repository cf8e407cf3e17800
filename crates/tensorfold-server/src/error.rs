//! OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the matching HTTP status.

use crate::protocol::{ErrorInfo, ErrorResponse};
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error answered to a client. Client mistakes are 4xx; engine faults, and the server's own limits of the
/// moment (loading, shutting down, no device memory for a stream, the connection cap), are 5xx.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, `authentication_error`, `not_found_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 naming the field at fault.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: None,
        }
    }

    /// A 400 without a specific field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// The same error with a code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// Any other status.
    pub fn status(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind, param: None, code: None }
    }

    /// A stream the device had no memory for then (the engine finished it alone, `OutOfMemory: ...`): 503 with
    /// `Retry-After` and code `insufficient_memory`, since the same request may succeed once other streams finish.
    pub fn out_of_memory(message: impl Into<String>) -> Self {
        Self::status(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).with_code("insufficient_memory")
    }

    /// The answer to a stream that failed with `message` while the engine runs: [`ApiError::out_of_memory`] when
    /// it found no device memory, else 500.
    pub fn stream_failed(message: impl Into<String>, out_of_memory: bool) -> Self {
        if out_of_memory {
            return Self::out_of_memory(message);
        }
        Self::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The reply body.
    pub fn body(&self) -> ErrorResponse {
        let (message, kind, param, code) = (self.message.clone(), self.kind, self.param.clone(), self.code);
        ErrorResponse { error: ErrorInfo { message, kind, param, code } }
    }

    /// The reply body as JSON text (the last event of a stream that failed).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.body()).expect("an error object has string keys only, so it always serializes")
    }
}

/// Seconds a client should wait before retrying an overloaded or stopping server: the `Retry-After` of every 429
/// and 503 (RFC 9110 section 10.2.3, delay-seconds form). Queues drain in well under a second at the default
/// sizes, and a restarting or still-loading server is polled, so 1 s.
pub const RETRY_AFTER_SECS: u64 = 1;

impl ApiError {
    /// `Retry-After` seconds for this answer: every 429 (queue full, tokenizer busy) and 503 (loading, connection
    /// cap, shutting down, no device memory for a stream), none otherwise.
    pub fn retry_after(&self) -> Option<u64> {
        matches!(self.status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE)
            .then_some(RETRY_AFTER_SECS)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = self.retry_after();
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = retry {
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(s));
        }
        r
    }
}

impl From<tensorfold_engine::SubmitError> for ApiError {
    fn from(e: tensorfold_engine::SubmitError) -> Self {
        use tensorfold_engine::SubmitError as S;
        match &e {
            S::ContextExceeded { .. } => {
                ApiError::invalid("max_tokens", e.to_string()).with_code("context_length_exceeded")
            }
            S::EmptyPrompt => ApiError::invalid("prompt", e.to_string()),
            S::ZeroMaxTokens => ApiError::invalid("max_tokens", e.to_string()),
            S::TokenOutOfRange { .. } => ApiError::invalid("prompt", e.to_string()),
            S::NeverFits { .. } => ApiError::invalid("max_tokens", e.to_string()).with_code("insufficient_memory"),
            S::Sampling(_) => ApiError::bad_request(e.to_string()),
            S::Penalty(p) => ApiError::invalid(p.param(), e.to_string()),
            S::QueueFull { .. } => ApiError::status(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", e.to_string()),
            S::GroupTooLarge { .. } => ApiError::invalid("n", e.to_string()),
            S::GroupPrompts => ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string()),
            S::Stopped => ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "server_error", e.to_string()),
        }
    }
}
