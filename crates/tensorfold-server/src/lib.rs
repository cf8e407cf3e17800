//! `tensorfold serve`: an OpenAI-compatible HTTP server on the lane core (routes in `routes`, the wire schema in
//! `protocol`, its validation in `api`, replies built in `reply`, one completion's life in `completion`). Loading
//! happens after the socket is bound, so `/health` answers 503 until the model is ready. Connections are bounded
//! in `listen`, request bodies and text work in `limits`, shutdown in `shutdown`; CORS in `cors`, the access log in
//! `access_log`.

pub mod access_log;
pub mod answer;
pub mod api;
pub mod best_of;
pub mod completion;
pub mod cors;
pub mod echo;
pub mod error;
pub mod fanout;
pub mod limits;
pub mod listen;
pub mod models_route;
pub mod penalties;
pub mod protocol;
pub mod reply;
pub mod routes;
pub mod shutdown;
pub mod state;
pub mod stops;
pub mod structured;
#[cfg(test)]
mod tests_fuzz;
pub mod tools;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use state::{AppState, Ready};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Largest request body accepted (larger: 413).
pub const BODY_LIMIT: usize = 4 << 20;

/// Server options (the `serve` flags).
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind.
    pub addr: SocketAddr,
    /// Name listed by `/v1/models`.
    pub model_name: String,
    /// Bearer key required on API routes.
    pub api_key: Option<String>,
    /// How long in-flight requests may run after SIGINT/SIGTERM before they are cancelled.
    pub grace: Duration,
    /// Connection bounds: header, body and idle timeouts, the connection cap.
    pub conn: listen::ConnLimits,
    /// CORS and the access log.
    pub http: HttpOptions,
}

/// The HTTP conventions a deployment picks (`--allowed-origins`, `--disable-access-log`, `--enable-log-requests`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HttpOptions {
    /// Origins browsers may call from (default: off, no CORS headers).
    pub allowed_origins: cors::Origins,
    /// One line per finished request (default: on, without request bodies).
    pub access_log: access_log::AccessLog,
}

/// The process-wide Prometheus recorder (installed once).
pub fn prometheus() -> metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
                .set_buckets(&[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0])
                .expect("static buckets")
                .build_recorder();
            let handle = recorder.handle();
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// The router over `state`, with `origins`' CORS layer outermost (preflights answered before auth).
pub fn router_with(state: AppState, origins: &cors::Origins) -> Router {
    let api = Router::new()
        .route("/v1/completions", post(routes::completions))
        .route("/v1/chat/completions", post(routes::chat))
        .route("/v1/models", get(routes::models))
        .route("/v1/models/{*id}", get(models_route::retrieve))
        .route("/tokenize", post(routes::tokenize))
        .route("/detokenize", post(routes::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), limits::json_body))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth))
        .route_layer(middleware::from_fn_with_state(state.clone(), access_log::middleware));
    let app = Router::new()
        .merge(api)
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics_route))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state);
    match origins.layer() {
        Some(cors) => app.layer(cors),
        None => app,
    }
}

/// The router over `state` without CORS.
pub fn router(state: AppState) -> Router {
    router_with(state, &cors::Origins::Off)
}

async fn auth(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, k)| k.trim());
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            let msg =
                if given.is_none() { "missing API key: send Authorization: Bearer KEY" } else { "invalid API key" };
            return error::ApiError::status(axum::http::StatusCode::UNAUTHORIZED, "authentication_error", msg)
                .into_response();
        }
    }
    next.run(req).await
}

/// Compares keys without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An empty state (nothing loaded yet).
pub fn new_state(opts: &ServeOptions) -> AppState {
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    AppState {
        ready: Arc::new(OnceLock::new()),
        model_name: opts.model_name.clone(),
        api_key: opts.api_key.clone(),
        prometheus: prometheus(),
        created,
        body_timeout: opts.conn.body_timeout,
        text_pool: limits::TextPool::default(),
        shutdown: shutdown::Shutdown::default(),
        access_log: opts.http.access_log,
    }
}

/// Binds, serves while `load` runs (503 until it returns), then serves until SIGINT/SIGTERM; in-flight
/// requests get `opts.grace` to finish. `load` returns the ready state and whatever must live as long as
/// the server (the engine).
pub async fn serve<K: Send + 'static>(
    opts: ServeOptions,
    load: impl FnOnce() -> Result<(Ready, K), String> + Send + 'static,
) -> Result<(), String> {
    serve_until(opts, load, shutdown_signal()).await
}

/// [`serve`], stopping when `stop` resolves instead of on a signal.
pub async fn serve_until<K: Send + 'static>(
    opts: ServeOptions,
    load: impl FnOnce() -> Result<(Ready, K), String> + Send + 'static,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(opts.addr).await.map_err(|e| format!("binding {}: {e}", opts.addr))?;
    serve_on(listener, opts, load, stop).await
}

/// [`serve_until`] on a bound listener (tests bind port 0 and read the port first). Returns within
/// `opts.grace` + [`shutdown::ENGINE_STOP_WAIT`] + 2 s of `stop`, whatever the engine is doing: past the grace
/// period every request still running is answered 503 and a wedged engine is left behind.
pub async fn serve_on<K: Send + 'static>(
    listener: tokio::net::TcpListener,
    opts: ServeOptions,
    load: impl FnOnce() -> Result<(Ready, K), String> + Send + 'static,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let state = new_state(&opts);
    tracing::info!("listening on http://{}", listener.local_addr().map_err(|e| e.to_string())?);
    let app = router_with(state.clone(), &opts.http.allowed_origins);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_accepting = move || {
        let _ = stop_tx.send(true);
    };
    let mut server = tokio::spawn(listen::serve_connections(listener, app, opts.conn.clone(), stop_rx));
    let t = std::time::Instant::now();
    // The stop is watched from the start: one during loading stops the server without waiting for the model.
    let mut signal = tokio::spawn(stop);
    let loading = tokio::task::spawn_blocking(load);
    let (ready, keep) = tokio::select! {
        loaded = loading => loaded.map_err(|e| e.to_string())??,
        _ = &mut signal => {
            tracing::info!("signal during loading: stopping");
            stop_accepting();
            return Ok(());
        }
    };
    let engine = ready.engine.clone();
    let _ = state.ready.set(ready);
    tracing::info!("model ready in {:.1} s", t.elapsed().as_secs_f64());
    tokio::select! {
        _ = signal => {}
        failure = engine_stopped(engine) => {
            // The engine ended every stream with the failure already; stop serving and exit non-zero.
            tracing::error!("engine stopped: {failure}; shutting down");
            stop_accepting();
            // A wedged engine (a device past its deadline) never ends its streams: answer them 503 now.
            state.shutdown.cancel_all();
            let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
            shutdown::stop_engine(keep).await;
            return Err(format!("engine stopped: {failure}"));
        }
    }
    tracing::info!("shutting down: no new connections; in-flight requests have {:?}", opts.grace);
    stop_accepting();
    if tokio::time::timeout(opts.grace, &mut server).await.is_err() {
        tracing::warn!("grace period over: cancelling the requests still running");
        // Every handler still waiting answers 503 now, whether or not the engine can still end its streams.
        state.shutdown.cancel_all();
        shutdown::stop_engine(keep).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
        return Ok(());
    }
    shutdown::stop_engine(keep).await;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves once the engine thread has ended on its own (a device failure), with the reason.
async fn engine_stopped(engine: tensorfold_engine::EngineHandle) -> String {
    while engine.is_alive() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    engine.metrics().failure.unwrap_or_else(|| "the engine thread ended".to_string())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
