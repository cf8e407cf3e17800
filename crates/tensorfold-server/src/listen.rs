//! The accept loop with bounds: a cap on open connections (past it a quick 503 and close, so descriptors never run
//! out and `/health` keeps answering), hyper's HTTP/1 header read timeout, an idle keep-alive timeout, and graceful
//! shutdown of every connection on stop. Body reading is bounded per request in `limits.rs`.

use axum::Router;
use axum::body::Body;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

/// Connection bounds (the `serve` flags `--header-timeout`, `--body-timeout`, `--idle-timeout`,
/// `--max-connections`).
#[derive(Clone, Debug, PartialEq)]
pub struct ConnLimits {
    /// From when a connection waits for a request head until the head is complete (slow headers: closed).
    /// Default 30 s: hyper's own default.
    pub header_timeout: Duration,
    /// From the head until the whole body has arrived (slow or missing body: 408). Default 30 s.
    pub body_timeout: Duration,
    /// A kept-alive connection with no request in flight is closed this long after its last response.
    /// Default 5 s: uvicorn's `--timeout-keep-alive`, which vLLM uses.
    pub idle_timeout: Duration,
    /// Open connections served at once; one more is answered 503 and closed at once. Default 512 (below the usual
    /// 1024 descriptor limit, which also holds the model's files and the listener).
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(5),
            max_connections: 512,
        }
    }
}

/// The answer to a connection past the cap, written without reading its request (with `Retry-After`, as every 503).
fn over_cap() -> Vec<u8> {
    let body = crate::error::ApiError::status(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "too many open connections (--max-connections); retry later",
    )
    .with_code("too_many_connections")
    .to_json();
    let head = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n";
    let retry = crate::error::RETRY_AFTER_SECS;
    format!("{head}retry-after: {retry}\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

/// Serves `app` on `listener` until `stop` turns true, then stops accepting, shuts every connection down
/// gracefully (idle ones close at once, in-flight requests finish) and returns once all have closed.
pub async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) {
    // Clamped so the semaphore (and the u32 of the final wait) holds it; 2^20 is past any descriptor limit.
    let cap = limits.max_connections.clamp(1, 1 << 20);
    let permits = Arc::new(Semaphore::new(cap));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            // Out of descriptors or a transient error: back off instead of spinning (as axum::serve does).
            Err(e) => {
                tracing::warn!("accept error: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Without TCP_NODELAY, SSE chunks on a reused connection wait for Nagle's timer and arrive in bursts.
        let _ = tcp.set_nodelay(true);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refuse(tcp);
            continue;
        };
        let (app, limits, stop) = (app.clone(), limits.clone(), stop.clone());
        tokio::spawn(async move {
            serve_one(tcp, app, &limits, stop).await;
            drop(permit);
        });
    }
    // Every connection returns its permit when it closes.
    let _ = permits.acquire_many(cap as u32).await;
}

/// Past the cap: the 503 written if the socket takes it now (it always does: a fresh socket's buffer is empty),
/// then closed; nothing is read and no task is spawned.
fn refuse(tcp: TcpStream) {
    let _ = tcp.try_write(&over_cap());
    drop(tcp);
}

/// One connection: HTTP/1.1 with the header timeout, closed when idle past the idle timeout or on stop.
async fn serve_one(tcp: TcpStream, app: Router, limits: &ConnLimits, mut stop: watch::Receiver<bool>) {
    let activity = Arc::new(Activity::default());
    let a = activity.clone();
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let guard = a.begin();
        let mut app = app.clone();
        async move {
            let resp = tower_service::Service::call(&mut app, req.map(Body::new)).await?;
            Ok::<_, Infallible>(resp.map(|b| Body::new(Tracked { inner: b, _guard: guard })))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(tcp), svc);
    let mut conn = std::pin::pin!(conn);
    let mut closing = false;
    loop {
        let idle_at = activity.idle_deadline(limits.idle_timeout);
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = stop.wait_for(|s| *s), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = sleep_until(idle_at), if !closing => {
                if activity.idle_deadline(limits.idle_timeout).is_some_and(|d| d <= Instant::now()) {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        // A request in flight (or none served yet: the header timeout covers that): check again soon.
        None => tokio::time::sleep(Duration::from_millis(250)).await,
    }
}

/// Requests in flight on one connection and when its last response ended.
#[derive(Default)]
struct Activity {
    in_flight: AtomicUsize,
    last_done: Mutex<Option<Instant>>,
}

impl Activity {
    fn begin(self: &Arc<Self>) -> Done {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Done(self.clone())
    }

    /// When the connection counts as idle: its last response's end plus `idle`, while nothing is in flight.
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        self.last_done.lock().ok().and_then(|d| *d).map(|d| d + idle)
    }
}

/// Ends a request's activity when its response body is finished or dropped.
struct Done(Arc<Activity>);

impl Drop for Done {
    fn drop(&mut self) {
        if let Ok(mut d) = self.0.last_done.lock() {
            *d = Some(Instant::now());
        }
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that holds its request's [`Done`] until the body ends.
struct Tracked {
    inner: Body,
    _guard: Done,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
