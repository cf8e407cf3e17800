//! A stream the device has no memory for (the target's reserve answers `KernelError::OutOfMemory`) fails alone and
//! is answered 503 with `Retry-After` and code `insufficient_memory`, streamed or not: a retry may succeed, unlike
//! a 500. The requests that fit are served as before, and the server stays up.

use serde_json::{Value, json};
use std::time::Duration;
use tensorfold_engine::fake::{FakeTarget, RefusedReserve};
use tensorfold_engine::{Engine, EngineConfig};
use tensorfold_server::state::Ready;
use tensorfold_server::{ServeOptions, serve_on};

/// The refused stream: the prompt [1, 2, 3] and 100 tokens to generate (the reserve asks for both).
const REFUSED_MAX_TOKENS: usize = 100;

/// A server on a target whose reserve refuses the streams of [`REFUSED_MAX_TOKENS`]; its address.
async fn start() -> String {
    // EOS never drawn (id 64 is past the fake's 64 logits), so a reply runs to max_tokens.
    let target = RefusedReserve::new(FakeTarget { eos: vec![64], ..FakeTarget::new() }, 3 + REFUSED_MAX_TOKENS);
    let engine = Engine::start(target, EngineConfig { max_draft: 0, ..EngineConfig::default() });
    let ready = Ready { engine: engine.handle(), text: None, context: 4096, default_max_tokens: 8, devices: None };
    let opts = ServeOptions {
        addr: "127.0.0.1:0".parse().expect("an address"),
        model_name: "refused".into(),
        api_key: None,
        grace: Duration::from_secs(1),
        conn: Default::default(),
        http: Default::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    tokio::spawn(serve_on(listener, opts, move || Ok((ready, engine)), std::future::pending()));
    let client = client();
    loop {
        if let Ok(r) = client.get(format!("{base}/health")).send().await
            && r.status() == 200
        {
            return base;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().expect("a client")
}

/// A completion of the prompt [1, 2, 3] and `max_tokens` tokens: status, `Retry-After`, body text.
async fn complete(base: &str, max_tokens: usize, stream: bool, n: usize) -> (u16, Option<String>, String) {
    let body = json!({"prompt": [1, 2, 3], "max_tokens": max_tokens, "stream": stream, "n": n});
    let r = client().post(format!("{base}/v1/completions")).json(&body).send().await.expect("answered");
    let retry = r.headers().get("retry-after").map(|v| v.to_str().expect("ascii").to_string());
    (r.status().as_u16(), retry, r.text().await.expect("a body"))
}

/// The error object of a body (a whole reply) or of a stream's last data event before `[DONE]`.
fn error_of(text: &str) -> Value {
    let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]").collect();
    let last = data.last().copied().unwrap_or(text);
    serde_json::from_str::<Value>(last).expect("JSON")["error"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_device_memory_is_answered_503_with_retry_after() {
    let base = start().await;
    for n in [1, 2] {
        let (status, retry, body) = complete(&base, REFUSED_MAX_TOKENS, false, n).await;
        assert_eq!(status, 503, "n = {n}: {body}");
        assert_eq!(retry.as_deref(), Some("1"), "n = {n}");
        let e = error_of(&body);
        assert_eq!(e["code"], "insufficient_memory", "{body}");
        assert!(e["message"].as_str().is_some_and(|m| m.contains("OutOfMemory")), "{body}");
    }
    // A request that fits is served in full after them: the server and the engine run on.
    let (status, _, body) = complete(&base, 8, false, 1).await;
    assert_eq!(status, 200, "{body}");
    let reply: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(reply["usage"]["completion_tokens"], 8, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_reply_without_device_memory_ends_with_the_named_error() {
    let base = start().await;
    // Several choices fail in the same engine step: still one error event, and nothing after `[DONE]` (repeated, as
    // a late choice's event racing the end would show only sometimes).
    for n in [1, 2, 4, 4, 4, 4, 4, 4, 4, 4] {
        let (status, _, body) = complete(&base, REFUSED_MAX_TOKENS, true, n).await;
        // The stream's head went out before the engine met the reserve; its last event names the error.
        assert_eq!(status, 200, "{body}");
        let e = error_of(&body);
        assert_eq!(e["code"], "insufficient_memory", "n = {n}: {body}");
        assert!(e["message"].as_str().is_some_and(|m| m.contains("OutOfMemory")), "{body}");
        let data: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        assert_eq!(data.iter().filter(|d| d.contains("\"error\"")).count(), 1, "n = {n}: {body}");
        assert_eq!(data.iter().position(|d| *d == "[DONE]"), Some(data.len() - 1), "n = {n}: {body}");
    }
    let (status, _, body) = complete(&base, 8, true, 1).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("\"error\""), "{body}");
}
