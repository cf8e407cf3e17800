//! Shutdown as the routes see it: once the grace period is over, every request still waiting on the engine is
//! answered 503 at once (whatever the engine is doing), and [`ENGINE_STOP_WAIT`] bounds the wait for the engine.

use crate::error::ApiError;
use axum::http::StatusCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long shutdown waits for the engine thread to end after the grace period (a wedged engine, e.g. a device
/// that stopped answering, is then left behind and the process exits anyway).
pub const ENGINE_STOP_WAIT: Duration = Duration::from_secs(5);

/// The "cancel everything" signal the routes select on.
#[derive(Clone, Debug)]
pub struct Shutdown(Arc<watch::Sender<bool>>);

impl Default for Shutdown {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(false)))
    }
}

impl Shutdown {
    /// Answers every request still running 503 (the grace period is over).
    pub fn cancel_all(&self) {
        self.0.send_replace(true);
    }

    /// Resolves once [`Shutdown::cancel_all`] has been called.
    pub async fn cancelled(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }
}

/// The documented answer to a request cancelled by shutdown (or whose engine stopped under it): 503.
pub fn stopped_error(why: &str) -> ApiError {
    ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "server_error", format!("the server is shutting down: {why}"))
}

/// Drops `keep` (the engine: its drop joins the engine thread) on a thread of its own and waits at most
/// [`ENGINE_STOP_WAIT`]; false when the engine did not stop in time (the thread is left behind).
pub async fn stop_engine<K: Send + 'static>(keep: K) -> bool {
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A plain thread, not the blocking pool: the runtime's shutdown would wait for a pool thread that never ends.
    let spawned = std::thread::Builder::new().name("tensorfold-engine-stop".into()).spawn(move || {
        drop(keep);
        let _ = tx.send(());
    });
    if spawned.is_err() {
        return false;
    }
    let stopped = tokio::time::timeout(ENGINE_STOP_WAIT, rx).await.is_ok();
    if !stopped {
        tracing::warn!("the engine did not stop within {ENGINE_STOP_WAIT:?} (wedged); exiting without it");
    }
    stopped
}
