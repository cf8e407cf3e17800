//! Per-request bounds before a handler runs: JSON routes take only `application/json` bodies (415 otherwise, so a
//! web page cannot drive a local server with a CORS "simple" request), a declared `Content-Length` over the body
//! limit is a 413 before any body byte is read, and the body must arrive within the body timeout (408). Also the
//! text pool: tokenizing and templating run off the async workers, behind a bound on tasks and bytes in flight.

use crate::BODY_LIMIT;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Middleware of the POST JSON routes (after auth, so the key is still checked before the body is read).
pub async fn json_body(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    if let Err(e) = check_content_type(req.headers()) {
        return e.into_response();
    }
    if let Some(n) = declared_length(req.headers()).filter(|&n| n > BODY_LIMIT as u64) {
        return close(too_large(&format!("the declared Content-Length {n} is over the length limit")));
    }
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(s.body_timeout, axum::body::to_bytes(body, BODY_LIMIT)).await {
        Err(_) => {
            let msg = format!("the request body did not arrive within the body timeout ({:?})", s.body_timeout);
            return close(ApiError::status(StatusCode::REQUEST_TIMEOUT, "invalid_request_error", msg));
        }
        Ok(Err(e)) if is_length_limit(&e) => return close(too_large("the body is over the length limit")),
        Ok(Err(e)) => return ApiError::bad_request(format!("request body: {e}")).into_response(),
        Ok(Ok(b)) => b,
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// `application/json` or `application/*+json` (parameters such as `charset` allowed, case-insensitive).
fn check_content_type(h: &HeaderMap) -> Result<(), ApiError> {
    let given = h.get(CONTENT_TYPE).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let media = given.as_deref().map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase());
    let json = media
        .as_deref()
        .is_some_and(|m| m == "application/json" || (m.starts_with("application/") && m.ends_with("+json")));
    if json {
        return Ok(());
    }
    let what = given.map_or_else(|| "no Content-Type".to_string(), |g| format!("Content-Type `{g}`"));
    Err(ApiError::status(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "invalid_request_error",
        format!("{what} is not accepted: this route takes a JSON body with Content-Type: application/json"),
    ))
}

fn declared_length(h: &HeaderMap) -> Option<u64> {
    h.get(CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        src = s.source();
    }
    false
}

fn too_large(why: &str) -> ApiError {
    let msg = format!("{why}: request bodies are at most {BODY_LIMIT} bytes");
    ApiError::status(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", msg)
}

/// An error answer that closes the connection (its unread body cannot be skipped safely).
fn close(e: ApiError) -> Response {
    let mut r = e.into_response();
    r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Most text bytes being tokenized or templated at once: 8 MiB, two full bodies (a 4 MiB body peaked at ~670 MiB
/// of tokenizer memory, so this bounds the text side's peak to a few GiB).
pub const TEXT_BYTES_IN_FLIGHT: usize = 8 << 20;

/// Tokenizer and template work off the async workers: at most `tasks` at once on the blocking pool (others wait)
/// and at most [`TEXT_BYTES_IN_FLIGHT`] bytes of text at once (past it: 429 at once).
#[derive(Clone, Debug)]
pub struct TextPool {
    tasks: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    max_bytes: usize,
}

/// Tasks the default [`TextPool`] runs at once: as many as cores, at least 2 (`tensorfold serve` starts as many
/// chat-template render workers).
pub fn text_tasks() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).max(2)
}

impl Default for TextPool {
    /// [`text_tasks`] tasks, [`TEXT_BYTES_IN_FLIGHT`] bytes.
    fn default() -> Self {
        Self::new(text_tasks(), TEXT_BYTES_IN_FLIGHT)
    }
}

impl TextPool {
    /// A pool of `tasks` concurrent jobs over at most `max_bytes` bytes of text.
    pub fn new(tasks: usize, max_bytes: usize) -> Self {
        Self { tasks: Arc::new(Semaphore::new(tasks)), bytes: Arc::new(Semaphore::new(max_bytes)), max_bytes }
    }

    /// Runs `f` over `bytes` bytes of text on the blocking pool. Refused with 429 when the bytes would pass the
    /// bound now (a text that alone passes it is weighed as the whole bound).
    pub async fn run<T: Send + 'static>(
        &self,
        bytes: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let weight = bytes.clamp(1, self.max_bytes) as u32;
        let Ok(held) = self.bytes.clone().try_acquire_many_owned(weight) else {
            let msg = format!(
                "the tokenizer is busy: {} bytes of text are being tokenized (at most {} at once); retry later",
                self.max_bytes - self.bytes.available_permits(),
                self.max_bytes
            );
            return Err(ApiError::status(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", msg));
        };
        let task = self.tasks.clone().acquire_owned().await.map_err(|_| internal("the text pool is closed"))?;
        let out = tokio::task::spawn_blocking(move || {
            let out = f();
            drop((held, task));
            out
        })
        .await;
        out.map_err(|e| internal(&format!("tokenizing failed: {e}")))
    }
}

fn internal(msg: &str) -> ApiError {
    ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", msg)
}
