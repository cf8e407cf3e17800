//! Server state: what the routes share once the model is loaded, and the options that hold before.

use std::sync::{Arc, OnceLock};
use tensorfold_engine::EngineHandle;
use tensorfold_text::Text;

/// What the routes need once the model is loaded.
#[derive(Clone)]
pub struct Ready {
    /// The engine.
    pub engine: EngineHandle,
    /// Tokenizer and chat template (`None`: token-id requests only).
    pub text: Option<Arc<Text>>,
    /// Context limit in tokens.
    pub context: usize,
    /// `max_tokens` when a request gives none (clipped to what the context leaves).
    pub default_max_tokens: usize,
    /// Each device's weight bytes and memory high-water marks (allocated, reserved by the pool), rank 0 first, for
    /// `/metrics`; `None` where the caller reports none.
    pub devices: Option<DeviceReport>,
}

/// Per-device figures for `/metrics`: `(weight bytes, high-water marks)` of each device, rank 0 first.
pub type DeviceReport = Arc<dyn Fn() -> Vec<(usize, Option<(usize, usize)>)> + Send + Sync>;

/// Shared by every route.
#[derive(Clone)]
pub struct AppState {
    /// Set once loading finishes; routes answer 503 until then.
    pub ready: Arc<OnceLock<Ready>>,
    /// The name `/v1/models` lists and requests may give as `model`.
    pub model_name: String,
    /// Bearer key required on API routes, if set.
    pub api_key: Option<String>,
    /// Renders `/metrics`.
    pub prometheus: metrics_exporter_prometheus::PrometheusHandle,
    /// Unix time the server started (the model's `created`).
    pub created: u64,
    /// How long a request body may take to arrive (408 past it).
    pub body_timeout: std::time::Duration,
    /// Tokenizer and template work, off the async workers and bounded.
    pub text_pool: crate::limits::TextPool,
    /// Past the grace period: every request still running answers 503.
    pub shutdown: crate::shutdown::Shutdown,
    /// The access log's settings (`access_log.rs`).
    pub access_log: crate::access_log::AccessLog,
}
