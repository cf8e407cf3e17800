//! A device that stops answering without an error (a planted stall in the host-rank stand-in's collective, feature
//! `planted-faults`) is caught by the deadline on device waits: the engine stops with `DeviceFailure: ...` naming
//! the deadline, a request waiting over HTTP is answered 503, `serve` returns that error (the binary exits non-zero)
//! within the stall and a few seconds, and once the stalled wait returns, the request in flight ends with the same
//! failure.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use tensorfold_engine::{Engine, EngineConfig, Event, FinishReason, ModelTarget, Request};
use tensorfold_kernels::deadline::StallingCollective;
use tensorfold_kernels::{CpuBackend, DeviceWatch, Watched};
use tensorfold_model::{Source, open_expert_parallel};
use tensorfold_server::state::Ready;
use tensorfold_server::{ServeOptions, serve_on};

const DEADLINE: Duration = Duration::from_millis(300);
const STALL: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_collective_past_its_deadline_stops_the_engine_and_the_server_by_name() {
    let armed = Arc::new(AtomicBool::new(false));
    let comm = Watched::new(StallingCollective::new(2, armed.clone(), STALL), DeviceWatch::new(DEADLINE));
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-moe-f32");
    let loaded = open_expert_parallel(&Source::Dir(dir), vec![CpuBackend; 2], Box::new(comm)).expect("splits");
    let target = ModelTarget { model: Arc::new(loaded.model), eos: loaded.eos_ids };
    let engine = Engine::start(target, EngineConfig { max_draft: 0, ..EngineConfig::default() });
    let handle = engine.handle();
    // Healthy first: a request runs to its end under the deadline.
    let (_, rx) = handle.submit(Request { ignore_eos: true, ..Request::greedy(vec![1, 2, 3], 4) }).expect("admitted");
    assert!(rx.iter().any(|e| matches!(e, Event::Finished { reason: FinishReason::Length, .. })), "a healthy run");
    // Then the stand-in stops answering in the middle of the next request.
    armed.store(true, std::sync::atomic::Ordering::Release);
    let (_, rx) = handle.submit(Request { ignore_eos: true, ..Request::greedy(vec![4, 5, 6], 8) }).expect("admitted");
    let ready = Ready { engine: engine.handle(), text: None, context: 64, default_max_tokens: 8, devices: None };
    let opts = ServeOptions {
        addr: "127.0.0.1:0".parse().expect("an address"),
        model_name: "stalled".into(),
        api_key: None,
        grace: Duration::from_secs(1),
        conn: Default::default(),
        http: Default::default(),
    };
    let listener = tokio::net::TcpListener::bind(opts.addr).await.expect("binding loopback");
    let url = format!("http://{}/v1/completions", listener.local_addr().expect("an address"));
    let never = std::future::pending::<()>();
    let server = tokio::spawn(serve_on(listener, opts, move || Ok((ready, engine)), never));
    // A request over HTTP waiting on the stalled engine is answered 503 when the deadline stops it.
    let body = serde_json::json!({"prompt": [7, 8, 9], "max_tokens": 8, "temperature": 0});
    let client = reqwest::Client::builder().no_proxy().build().expect("a client");
    let t = Instant::now();
    let reply = tokio::time::timeout(Duration::from_secs(20), client.post(&url).json(&body).send())
        .await
        .expect("answered before the test's deadline")
        .expect("answered, not dropped");
    // At the deadline (and the server's 200 ms poll), not when the stall ends.
    assert!(t.elapsed() < STALL - Duration::from_secs(2), "answered after {:?}", t.elapsed());
    assert_eq!(reply.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE, "{:?}", reply.text().await);
    let served = tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("serve returns on its own")
        .expect("the serve task");
    let err = served.expect_err("a device past its deadline is an error exit");
    assert!(err.starts_with("engine stopped: DeviceFailure:") && err.contains("deadline"), "{err}");
    assert!(handle.metrics().failure.is_some_and(|f| f.contains("forward")), "the wait named");
    // serve waits for the wedged engine at most shutdown::ENGINE_STOP_WAIT; here the stall ends before that.
    assert!(t.elapsed() < STALL + Duration::from_secs(8), "{:?}", t.elapsed());
    // The stalled wait came back late: its forward is refused, so the stream ends with the same failure.
    let finished = rx.iter().find_map(|e| match e {
        Event::Finished { reason, error, .. } => Some((reason, error)),
        _ => None,
    });
    let (reason, error) = finished.expect("the request finishes");
    assert_eq!(reason, FinishReason::Error);
    assert!(error.is_some_and(|e| e.starts_with("DeviceFailure:") && e.contains("deadline")));
}
