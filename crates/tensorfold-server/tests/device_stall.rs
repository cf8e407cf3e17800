//! A device that stops answering without an error is caught by the deadline on device waits, on several devices (a
//! planted stall in the host-rank stand-in's collective) and on one (a planted stall in the device sync that reads
//! a forward's results; both feature `planted-faults`): the engine stops with `DeviceFailure: ...` naming the
//! deadline, a request waiting over HTTP is answered 503, `/health` answers 503, `serve` returns that error (the
//! binary exits non-zero) within the deadline and a few seconds even while the wait never returns, and once a
//! stalled wait does return, the request in flight ends with the same failure.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tensorfold_engine::{Engine, EngineConfig, EngineHandle, Event, FinishReason, ModelTarget, Request};
use tensorfold_kernels::deadline::StallingCollective;
use tensorfold_kernels::stalling::StallingBackend;
use tensorfold_kernels::{Backend, CpuBackend, DeviceWatch, Watched};
use tensorfold_model::{Source, open, open_expert_parallel};
use tensorfold_server::shutdown::ENGINE_STOP_WAIT;
use tensorfold_server::state::Ready;
use tensorfold_server::{ServeOptions, new_state, router, serve_on};
use tokio::task::JoinHandle;

const DEADLINE: Duration = Duration::from_millis(300);
const STALL: Duration = Duration::from_secs(5);
/// A stall the test never sees end (it is over in seconds): `serve` must stop without the wait returning. Without
/// the deadline the test fails at its 20 s timeout, then waits this long for the engine thread as it drops.
const FOREVER: Duration = Duration::from_secs(60);

fn fixture(name: &str) -> Source {
    Source::Dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name))
}

/// The engine over `target`, after one healthy request ran to its end under the deadline.
fn engine_after_a_healthy_run<B: Backend + 'static>(target: ModelTarget<B>) -> Engine {
    let engine = Engine::start(target, EngineConfig { max_draft: 0, ..EngineConfig::default() });
    let (_, rx) =
        engine.handle().submit(Request { ignore_eos: true, ..Request::greedy(vec![1, 2, 3], 4) }).expect("admitted");
    assert!(rx.iter().any(|e| matches!(e, Event::Finished { reason: FinishReason::Length, .. })), "a healthy run");
    engine
}

fn ready(engine: EngineHandle) -> Ready {
    Ready { engine, text: None, context: 64, default_max_tokens: 8, devices: None }
}

fn options() -> ServeOptions {
    ServeOptions {
        addr: "127.0.0.1:0".parse().expect("an address"),
        model_name: "stalled".into(),
        api_key: None,
        grace: Duration::from_secs(1),
        conn: Default::default(),
        http: Default::default(),
    }
}

/// `serve` over `engine` (taking it, as the binary's loader does), once `/health` answers 200 (loaded, so a 503
/// later is the engine's); the server's base URL and the serve task.
async fn serve(engine: Engine) -> (String, JoinHandle<Result<(), String>>) {
    let opts = options();
    let listener = tokio::net::TcpListener::bind(opts.addr).await.expect("binding loopback");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    let r = ready(engine.handle());
    let never = std::future::pending::<()>();
    let server = tokio::spawn(serve_on(listener, opts, move || Ok((r, engine)), never));
    let client = reqwest::Client::builder().no_proxy().build().expect("a client");
    let t = Instant::now();
    while client.get(format!("{base}/health")).send().await.map_or(true, |r| r.status() != 200) {
        assert!(t.elapsed() < Duration::from_secs(10), "the server never became ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (base, server)
}

/// A second router over the same engine that outlives `serve`'s listener, for `/health` after the failure.
async fn health_url(engine: EngineHandle) -> String {
    let state = new_state(&options());
    let _ = state.ready.set(ready(engine));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding loopback");
    let url = format!("http://{}/health", listener.local_addr().expect("an address"));
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    url
}

/// Posts a completion that waits on the stalled engine: answered 503 by the shutdown the failure starts, at the
/// deadline (and the server's 200 ms poll), well before `stall` ends.
async fn a_waiting_request_is_answered_503(base: &str, stall: Duration) {
    let body = serde_json::json!({"prompt": [7, 8, 9], "max_tokens": 8, "temperature": 0});
    let client = reqwest::Client::builder().no_proxy().build().expect("a client");
    let t = Instant::now();
    let reply =
        tokio::time::timeout(Duration::from_secs(20), client.post(format!("{base}/v1/completions")).json(&body).send())
            .await
            .expect("answered before the test's deadline")
            .expect("answered, not dropped");
    assert!(t.elapsed() < DEADLINE + Duration::from_secs(2) && t.elapsed() < stall, "answered after {:?}", t.elapsed());
    assert_eq!(reply.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let text = reply.text().await.unwrap_or_default();
    assert!(text.contains("shutting down"), "the engine's failure, not loading: {text}");
}

/// `serve` returns the failure on its own (the binary's non-zero exit).
async fn serve_fails_by_name(server: JoinHandle<Result<(), String>>) {
    let served = tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("serve returns on its own")
        .expect("the serve task");
    let err = served.expect_err("a device past its deadline is an error exit");
    assert!(err.starts_with("engine stopped: DeviceFailure:") && err.contains("deadline"), "{err}");
}

/// The request in flight when the stall began ends with the deadline's failure once its wait returns.
fn ends_with_the_failure(rx: &std::sync::mpsc::Receiver<Event>) {
    let finished = rx.iter().find_map(|e| match e {
        Event::Finished { reason, error, .. } => Some((reason, error)),
        _ => None,
    });
    let (reason, error) = finished.expect("the request finishes");
    assert_eq!(reason, FinishReason::Error);
    assert!(error.is_some_and(|e| e.starts_with("DeviceFailure:") && e.contains("deadline")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_collective_past_its_deadline_stops_the_engine_and_the_server_by_name() {
    let armed = Arc::new(AtomicBool::new(false));
    let comm = Watched::new(StallingCollective::new(2, armed.clone(), STALL), DeviceWatch::new(DEADLINE));
    let loaded = open_expert_parallel(&fixture("lfm2-moe-f32"), vec![CpuBackend; 2], Box::new(comm)).expect("splits");
    let engine = engine_after_a_healthy_run(ModelTarget { model: Arc::new(loaded.model), eos: loaded.eos_ids });
    let handle = engine.handle();
    let (base, server) = serve(engine).await;
    // Then the stand-in stops answering in the middle of the next request.
    armed.store(true, Ordering::Release);
    let t = Instant::now();
    let (_, rx) = handle.submit(Request { ignore_eos: true, ..Request::greedy(vec![4, 5, 6], 8) }).expect("admitted");
    a_waiting_request_is_answered_503(&base, STALL - Duration::from_secs(2)).await;
    serve_fails_by_name(server).await;
    assert!(handle.metrics().failure.is_some_and(|f| f.contains("forward")), "the wait named");
    // serve waits for the wedged engine at most shutdown::ENGINE_STOP_WAIT; here the stall ends before that.
    assert!(t.elapsed() < STALL + Duration::from_secs(8), "{:?}", t.elapsed());
    // The stalled wait came back late: its forward is refused, so the stream ends with the same failure.
    ends_with_the_failure(&rx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_sync_that_never_returns_on_one_device_stops_the_server_within_the_deadline() {
    let armed = Arc::new(AtomicBool::new(false));
    let backend = StallingBackend::new(CpuBackend, armed.clone(), FOREVER);
    // One device of a dense model: no collective anywhere, only the forward's own watch.
    let mut loaded = open(&fixture("lfm2-dense-f32"), backend).expect("opens");
    assert!(loaded.model.ep.is_none(), "one device");
    loaded.model.watch = DeviceWatch::new(DEADLINE);
    let engine = engine_after_a_healthy_run(ModelTarget { model: Arc::new(loaded.model), eos: loaded.eos_ids });
    let handle = engine.handle();
    let health = health_url(handle.clone()).await;
    let (base, server) = serve(engine).await;
    // The next sync that reads a forward's results (the completion's) never comes back (within the test).
    armed.store(true, Ordering::Release);
    let t = Instant::now();
    a_waiting_request_is_answered_503(&base, FOREVER).await;
    serve_fails_by_name(server).await;
    // The deadline, the server's poll and its 2 s for connections, then at most ENGINE_STOP_WAIT for the wedged
    // engine: the process exits non-zero though the wait is still blocked.
    assert!(t.elapsed() < DEADLINE + Duration::from_secs(3) + ENGINE_STOP_WAIT, "{:?}", t.elapsed());
    let failure = handle.metrics().failure.unwrap_or_default();
    assert!(failure.starts_with("DeviceFailure: device lost in forward:") && failure.contains("deadline"), "{failure}");
    let client = reqwest::Client::builder().no_proxy().build().expect("a client");
    let h = client.get(&health).send().await.expect("a health reply");
    assert_eq!(h.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert!(h.text().await.unwrap_or_default().contains("engine stopped"));
}

#[test]
fn a_device_sync_that_returns_past_the_deadline_on_one_device_is_refused() {
    let armed = Arc::new(AtomicBool::new(false));
    let mut loaded =
        open(&fixture("lfm2-dense-f32"), StallingBackend::new(CpuBackend, armed.clone(), STALL / 4)).expect("opens");
    loaded.model.watch = DeviceWatch::new(DEADLINE);
    let engine = engine_after_a_healthy_run(ModelTarget { model: Arc::new(loaded.model), eos: loaded.eos_ids });
    let handle = engine.handle();
    armed.store(true, Ordering::Release);
    let (_, rx) = handle.submit(Request { ignore_eos: true, ..Request::greedy(vec![4, 5, 6], 8) }).expect("admitted");
    // The stall ends after the deadline: the forward's results are refused, not used.
    ends_with_the_failure(&rx);
    assert!(!handle.is_alive(), "the engine stopped");
    assert!(handle.metrics().failure.is_some_and(|f| f.contains("forward") && f.contains("deadline")));
}
