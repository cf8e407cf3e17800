//! The access log: one `info` line per finished API request, target `tensorfold::access`, written when the reply
//! (a stream too) has ended: request id, route, status, prompt / cached / completion tokens, TTFT, decode rate,
//! finish reason, drafted / accepted. The request body (prompt text) is logged only with `--enable-log-requests`,
//! as vLLM logs prompts only when asked; `--disable-access-log` turns the line off (uvicorn's and vLLM's flag).

use crate::completion::Outcome;
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Most bytes of a request body quoted with `--enable-log-requests` (longer: cut at a character boundary, the
/// length noted), so one request cannot write megabytes of log.
pub const MAX_LOGGED_BODY: usize = 4096;

/// The access log's settings (the `serve` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessLog {
    /// One line per finished request (off: `--disable-access-log`).
    pub enabled: bool,
    /// Quote the request body, prompt text included (`--enable-log-requests`).
    pub log_requests: bool,
}

impl Default for AccessLog {
    /// On, without request bodies.
    fn default() -> Self {
        Self { enabled: true, log_requests: false }
    }
}

/// One request's line in the making, shared by the middleware (status, the end of the body) and the handler
/// (tokens, timings); written when the last holder drops it. The default entry logs nothing (access log off).
#[derive(Clone, Default)]
pub struct Entry(Option<Arc<Mutex<Record>>>);

/// What one line says.
struct Record {
    route: String,
    arrived: Instant,
    log_requests: bool,
    status: u16,
    id: Option<String>,
    body: Option<String>,
    choices: Vec<Choice>,
}

/// One finished choice's figures.
struct Choice {
    prompt: usize,
    cached: usize,
    completion: usize,
    ttft: Option<Duration>,
    decode: Option<Duration>,
    finish: &'static str,
    drafted: usize,
    accepted: usize,
}

impl Entry {
    fn new(route: String, log_requests: bool) -> Self {
        let r = Record {
            route,
            arrived: Instant::now(),
            log_requests,
            status: 0,
            id: None,
            body: None,
            choices: Vec::new(),
        };
        Self(Some(Arc::new(Mutex::new(r))))
    }

    fn with(&self, f: impl FnOnce(&mut Record)) {
        if let Some(r) = &self.0
            && let Ok(mut r) = r.lock()
        {
            f(&mut r);
        }
    }

    /// The reply's id (`cmpl-...`, `chatcmpl-...`).
    pub fn id(&self, id: &str) {
        self.with(|r| r.id = Some(id.to_string()));
    }

    /// Keeps the request body for the line when `--enable-log-requests` asks (cut at [`MAX_LOGGED_BODY`]).
    pub fn body(&self, body: &[u8]) {
        self.with(|r| {
            if r.log_requests {
                r.body = Some(quoted_body(body));
            }
        });
    }

    /// A choice's outcome (each of `n` choices adds its own: tokens and drafts are summed on the line).
    pub fn outcome(&self, out: &Outcome) {
        self.with(|r| {
            let ttft = out.first_token_at.map(|t| t.saturating_duration_since(r.arrived));
            let decode = out.first_token_at.zip(out.last_token_at).map(|(a, b)| b.saturating_duration_since(a));
            r.choices.push(Choice {
                prompt: out.prompt_tokens,
                cached: out.cached_tokens,
                completion: out.tokens.len(),
                ttft,
                decode,
                finish: if out.error.is_some() { "error" } else { out.finish_reason },
                drafted: out.drafted,
                accepted: out.accepted,
            });
        });
    }

    /// A stream that failed after its 200 head: the line carries the error's status.
    pub fn failed(&self, status: StatusCode) {
        self.with(|r| r.status = status.as_u16());
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Entry {
    type Rejection = Infallible;

    /// The request's entry, or one that logs nothing where the middleware is off.
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(parts.extensions.get::<Entry>().cloned().unwrap_or_default())
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        tracing::info!(target: "tensorfold::access", "{}", self.line());
    }
}

impl Record {
    /// `request id=.. route=".." status=.. prompt_tokens=.. cached_tokens=.. completion_tokens=.. ttft_ms=..
    /// tok_s=.. finish=.. drafted=.. accepted=.. elapsed_ms=..` (figures of a route without a completion left out).
    fn line(&self) -> String {
        let mut s =
            format!("request id={} route=\"{}\" status={}", self.id.as_deref().unwrap_or("-"), self.route, self.status);
        let c = &self.choices;
        if let Some(first) = c.first() {
            let sum = |f: fn(&Choice) -> usize| c.iter().map(f).sum::<usize>();
            let completion = sum(|x| x.completion);
            let _ = write!(
                s,
                " prompt_tokens={} cached_tokens={} completion_tokens={completion} ttft_ms={} tok_s={} finish={} \
                 drafted={} accepted={}",
                first.prompt,
                first.cached,
                c.iter().filter_map(|x| x.ttft).min().map_or("-".into(), |t| format!("{:.1}", ms(t))),
                decode_rate(c).map_or("-".into(), |r| format!("{r:.1}")),
                c.iter().map(|x| x.finish).collect::<Vec<_>>().join(","),
                sum(|x| x.drafted),
                sum(|x| x.accepted),
            );
        }
        let _ = write!(s, " elapsed_ms={:.1}", ms(self.arrived.elapsed()));
        if let Some(b) = &self.body {
            let _ = write!(s, " body={b}");
        }
        s
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Decode tokens per second: the tokens after each choice's first over the longest first-to-last-token span
/// (`None` with fewer than two tokens, where there is no span).
fn decode_rate(c: &[Choice]) -> Option<f64> {
    let after_first: usize = c.iter().map(|x| x.completion.saturating_sub(1)).sum();
    let span = c.iter().filter_map(|x| x.decode).max()?.as_secs_f64();
    (after_first > 0 && span > 0.0).then(|| after_first as f64 / span)
}

/// The body as a JSON string literal (quoted and escaped, so the line stays one line), cut at a character
/// boundary past [`MAX_LOGGED_BODY`] bytes with the full length noted.
fn quoted_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut end = text.len().min(MAX_LOGGED_BODY);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let q = serde_json::Value::from(&text[..end]).to_string();
    if end < text.len() { format!("{q}...({} bytes)", body.len()) } else { q }
}

/// Middleware of the API routes (outermost, so refusals by auth and the body checks are logged too): creates the
/// request's entry, sets the status from the response and holds the entry until the response body has ended.
pub async fn middleware(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    if !s.access_log.enabled {
        return next.run(req).await;
    }
    let entry = Entry::new(format!("{} {}", req.method(), req.uri().path()), s.access_log.log_requests);
    req.extensions_mut().insert(entry.clone());
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    // The head's status; a stream that fails later overrides it (`Entry::failed`).
    entry.with(|r| {
        if r.status == 0 {
            r.status = status;
        }
    });
    resp.map(|b| Body::new(Held { inner: b, _entry: entry }))
}

/// A response body that holds its request's entry until the body ends (the line is written after the last byte).
struct Held {
    inner: Body,
    _entry: Entry,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_body_is_cut_at_a_character_boundary_and_quoted_on_one_line() {
        let body = format!("{{\"prompt\": \"{}\"}}\n", "é".repeat(MAX_LOGGED_BODY));
        let q = quoted_body(body.as_bytes());
        assert!(q.starts_with("\"{\\\"prompt\\\"") && !q.contains('\n'), "{q}");
        assert!(q.ends_with(&format!("...({} bytes)", body.len())), "{q}");
        assert_eq!(quoted_body(b"{}"), "\"{}\"");
    }

    #[test]
    fn the_decode_rate_needs_two_tokens() {
        let c = |completion, ms| Choice {
            prompt: 3,
            cached: 0,
            completion,
            ttft: None,
            decode: Some(Duration::from_millis(ms)),
            finish: "length",
            drafted: 0,
            accepted: 0,
        };
        assert_eq!(decode_rate(&[c(1, 0)]), None);
        assert_eq!(decode_rate(&[c(11, 100)]), Some(100.0));
        assert_eq!(decode_rate(&[c(11, 100), c(11, 200)]), Some(100.0));
    }
}
