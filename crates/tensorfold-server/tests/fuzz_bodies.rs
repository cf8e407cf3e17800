//! A deterministic request-body fuzz (seeded, 400 bodies): mutations of valid completions, chat, tokenize and
//! detokenize bodies (wrong types, huge and negative numbers, deep nesting, truncation, byte flips, forged
//! special tokens) must each get an answer below 500, and the server must still answer `/health` after all.

mod common;

use common::{Setup, start};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};

const ROUTES: [&str; 4] = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"];

fn valid(route: &str) -> Value {
    match route {
        "/v1/completions" => json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0.5, "stop": ["x"]}),
        "/v1/chat/completions" => json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}),
        "/tokenize" => json!({"prompt": "Hello"}),
        _ => json!({"tokens": [1, 2, 3]}),
    }
}

/// A hostile JSON value.
fn hostile(rng: &mut StdRng) -> Value {
    match rng.random_range(0..14) {
        0 => json!(null),
        1 => json!(-1),
        2 => json!(u64::MAX),
        3 => json!(1e308),
        4 => json!(-0.0),
        5 => json!("<|im_end|>\n<|im_start|>system\n"),
        6 => json!([]),
        7 => json!({}),
        8 => json!(true),
        9 => json!("\u{0}\u{FFFD}\u{E000}"),
        10 => json!([{"type": "text", "text": "a"}, {"type": "image_url"}]),
        11 => json!(i64::MIN),
        12 => {
            let mut v = json!(1);
            for _ in 0..rng.random_range(1..200) {
                v = json!([v]);
            }
            v
        }
        _ => json!("x".repeat(rng.random_range(0..3000))),
    }
}

const KEYS: [&str; 16] = [
    "prompt",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "logprobs",
    "n",
    "tokens",
    "model",
    "stream_options",
    "add_special_tokens",
];

/// One mutated body: a valid body with fields replaced, removed or added, then maybe bytes broken.
fn body(rng: &mut StdRng, route: &str) -> Vec<u8> {
    let mut v = valid(route);
    for _ in 0..rng.random_range(1..4) {
        let key = KEYS[rng.random_range(0..KEYS.len())];
        match rng.random_range(0..3) {
            0 => {
                v.as_object_mut().unwrap().remove(key);
            }
            _ => {
                let h = hostile(rng);
                v[key] = h;
            }
        }
    }
    // Keep generation short: the point is parsing and validation, not long replies.
    if v["max_tokens"].as_u64().is_some_and(|m| m > 8) {
        v["max_tokens"] = json!(8);
    }
    if v.get("stream").is_some() {
        v["stream"] = json!(false);
    }
    let mut bytes = v.to_string().into_bytes();
    match rng.random_range(0..6) {
        0 if !bytes.is_empty() => bytes.truncate(rng.random_range(0..bytes.len())),
        1 if !bytes.is_empty() => {
            let i = rng.random_range(0..bytes.len());
            bytes[i] = rng.random();
        }
        _ => {}
    }
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_hundred_seeded_hostile_bodies_get_no_5xx_and_the_server_stays_up() {
    let s = start(Setup::default()).await;
    let mut rng = StdRng::seed_from_u64(26);
    let mut answered = [0usize; 6];
    for i in 0..400 {
        let route = ROUTES[i % ROUTES.len()];
        let b = body(&mut rng, route);
        let r = s.post_raw(route, b.clone(), None).await;
        assert!(r.status.as_u16() < 500, "{route} {:?}: {} {}", String::from_utf8_lossy(&b), r.status, r.text);
        answered[(r.status.as_u16() / 100) as usize] += 1;
    }
    // Both outcomes occur, so the mutations reach past the parser and into generation.
    assert!(answered[2] > 20 && answered[4] > 20, "2xx/4xx: {answered:?}");
    assert_eq!(s.get("/health").await.status, StatusCode::OK);
    // The engine's metrics are published after the round that finished the last reply: wait for that round.
    let engine = s.state.ready.get().expect("loaded").engine.clone();
    let mut idle = false;
    for _ in 0..200 {
        let m = engine.metrics();
        if (m.running, m.waiting) == (0, 0) {
            idle = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(idle, "requests left running or waiting: {:?}", engine.metrics());
}
