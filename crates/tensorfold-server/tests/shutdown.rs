//! Shutdown is bounded and answers as documented: a stop with the engine wedged inside a forward still returns
//! (the engine left behind after `ENGINE_STOP_WAIT`) and the request in flight gets 503; an engine that goes
//! away under a non-streamed request always gives 503, never 500.

use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::{Caps, Engine, EngineConfig, ForwardCall, SegOut, Target};
use tensorfold_model::ForwardError;
use tensorfold_server::shutdown::ENGINE_STOP_WAIT;
use tensorfold_server::state::Ready;
use tensorfold_server::{ServeOptions, serve_on};

/// The fake target, each forward `delay` long; `wedge`: the first forward never returns (a device that stopped
/// answering). `entered` turns true once a forward has started.
struct Slow {
    inner: FakeTarget,
    delay: Duration,
    wedge: bool,
    entered: Arc<AtomicBool>,
}

/// A stream state whose drop takes 200 ms: a stopping engine closes the stream's channel (its sink drops first)
/// well before its thread ends, which is the window in which a reply used to read the engine as alive (500).
#[derive(Clone, Default)]
struct SlowDrop(Vec<u32>);

impl Drop for SlowDrop {
    fn drop(&mut self) {
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl Target for Slow {
    type State = SlowDrop;
    type Held = ();
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn new_state(&self) -> SlowDrop {
        SlowDrop(self.inner.new_state())
    }
    fn pos(&self, s: &SlowDrop) -> usize {
        self.inner.pos(&s.0)
    }
    fn state_bytes(&self, s: &SlowDrop) -> usize {
        self.inner.state_bytes(&s.0)
    }
    fn stream_bytes(&self, tokens: usize, verify_rows: usize) -> usize {
        self.inner.stream_bytes(tokens, verify_rows)
    }
    fn forward(&self, call: &ForwardCall<'_, ()>, states: &mut [&mut SlowDrop]) -> Result<Vec<SegOut>, ForwardError> {
        self.entered.store(true, Ordering::Release);
        if self.wedge {
            // A device that never answers: parked for good (spurious wake-ups park again).
            loop {
                std::thread::park();
            }
        }
        std::thread::sleep(self.delay);
        let mut inner: Vec<&mut Vec<u32>> = states.iter_mut().map(|s| &mut s.0).collect();
        self.inner.forward(call, &mut inner)
    }
    fn keep(&self, s: &mut SlowDrop, pos: usize) -> Result<(), ForwardError> {
        self.inner.keep(&mut s.0, pos)
    }
}

fn engine(wedge: bool) -> (Engine, Arc<AtomicBool>) {
    let entered = Arc::new(AtomicBool::new(false));
    // EOS never drawn (id 64 is past the fake's 64 logits), so a reply runs to max_tokens.
    let inner = FakeTarget { eos: vec![64], ..FakeTarget::new() };
    let t = Slow { inner, delay: Duration::from_millis(5), wedge, entered: entered.clone() };
    (Engine::start(t, EngineConfig { max_draft: 0, ..EngineConfig::default() }), entered)
}

fn ready(e: &Engine) -> Ready {
    Ready { engine: e.handle(), text: None, context: 4096, default_max_tokens: 8, devices: None }
}

fn opts(grace: Duration) -> ServeOptions {
    ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        model_name: "slow".into(),
        api_key: None,
        grace,
        conn: Default::default(),
        http: Default::default(),
    }
}

/// POSTs a non-streamed completion of `n` choices of 3000 tokens (far longer than any test waits).
async fn long_completion(base: String, n: usize) -> (u16, Value) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": [1, 2, 3], "max_tokens": 3000, "stream": false, "n": n}))
        .send()
        .await
        .expect("answered");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Waits for `/health` to answer 200 (the model "loaded"): a request before it is a 503 `loading`.
async fn wait_ready(base: &str) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    loop {
        if let Ok(r) = client.get(format!("{base}/health")).send().await
            && r.status() == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn wait_until(flag: &AtomicBool) {
    while !flag.load(Ordering::Acquire) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_the_engine_wedged_returns_and_answers_the_request_in_flight_503() {
    let (e, entered) = engine(true);
    let r = ready(&e);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let grace = Duration::from_millis(300);
    let served = tokio::spawn(serve_on(listener, opts(grace), move || Ok((r, e)), async move {
        let _ = stop_rx.await;
    }));
    wait_ready(&base).await;
    let request = tokio::spawn(long_completion(base, 1));
    wait_until(&entered).await;
    stop_tx.send(()).unwrap();
    // The bound `serve_on` states; the guard only turns a hang into a failure.
    let bound = grace + ENGINE_STOP_WAIT + Duration::from_secs(2);
    let result = tokio::time::timeout(bound + Duration::from_secs(5), served).await;
    assert!(result.expect("serve_on returned within its bound").expect("no panic").is_ok());
    let (status, body) = request.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["type"], "server_error");
    assert!(body["error"]["message"].as_str().unwrap().contains("shutting down"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_stopped_under_a_non_streamed_request_answers_503_every_time() {
    // One choice (routes.rs) and two (fanout.rs): both read a stream the engine left unfinished as shutdown.
    for (round, n) in [1, 2, 1, 2].into_iter().enumerate() {
        let (e, entered) = engine(false);
        let r = ready(&e);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        // The server never gets a stop; the engine is dropped under it (its streams' channels close).
        let served =
            tokio::spawn(serve_on(listener, opts(Duration::from_secs(1)), move || Ok((r, ())), std::future::pending()));
        wait_ready(&base).await;
        let request = tokio::spawn(long_completion(base, n));
        wait_until(&entered).await;
        tokio::task::spawn_blocking(move || drop(e)).await.unwrap();
        let (status, body) = request.await.unwrap();
        assert_eq!(status, 503, "round {round}, n = {n}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("shutting down"), "{body}");
        let err = served.await.unwrap().expect_err("an engine gone on its own stops the server");
        assert!(err.starts_with("engine stopped"), "{err}");
    }
}
