//! The OpenAI-compatible server through a real loopback socket (the bad-request table is in
//! `bad_requests.rs`): routes and methods, auth, limits, a full queue, streamed vs plain replies (text, tokens, logprobs), stop strings,
//! the usage chunk and `[DONE]`, a client that disconnects, concurrent clients vs solo runs, health, tokenize,
//! metrics and the prompt cache across chat turns.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tensorfold_engine::keyed::token_sha256;
use tensorfold_engine::{EngineConfig, Event, Request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_methods_answer_404_and_405_as_openai_errors() {
    let s = start(Setup::default()).await;
    for path in ["/v1/embeddings", "/v2/completions", "/"] {
        let r = s.post(path, &json!({})).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {}", r.text);
        assert_error_object(&r, path);
        assert_eq!(r.error_type(), "not_found_error");
    }
    let r = s.get("/v1/nope").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.error_type(), "not_found_error");
    let r = s.get(COMPLETIONS).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{}", r.text);
    assert_error_object(&r, "GET /v1/completions");
    assert_eq!(r.error_type(), "invalid_request_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_declared_over_four_mib_is_refused_with_413_at_once_and_one_under_it_is_read() {
    use std::io::{Read, Write};
    let s = start(Setup::default()).await;
    // One byte over, through a plain socket (so no client can be the one that balks).
    let addr = s.base.trim_start_matches("http://").to_string();
    let answer = tokio::task::spawn_blocking(move || {
        let mut sock = std::net::TcpStream::connect(addr).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(10))).expect("a timeout");
        let head = format!(
            "POST {COMPLETIONS} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            (4 << 20) + 1
        );
        sock.write_all(head.as_bytes()).expect("write");
        // The declared length alone is refused: the answer comes before any body byte is sent.
        let mut answer = Vec::new();
        let _ = sock.read_to_end(&mut answer);
        answer
    })
    .await
    .expect("the socket task");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).expect("a body")).expect("JSON");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].as_str().expect("a message").contains("length limit"), "{body}");
    // Just under the limit: read, the unknown field ignored, and answered.
    let mut ok = b"{\"prompt\": \"Hello\", \"max_tokens\": 2, \"pad\": \"".to_vec();
    ok.resize((4 << 20) - 2, b' ');
    ok.extend_from_slice(b"\"}");
    assert_eq!(ok.len(), 4 << 20);
    let r = s.post_raw(COMPLETIONS, ok, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["usage"]["completion_tokens"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_wrong_bearer_key_is_401_while_health_and_metrics_stay_open() {
    let s = start(Setup { api_key: Some("sk-test-key".into()), ..Setup::default() }).await;
    let body = completion("Hello", 2).to_string().into_bytes();
    let missing = s.post_raw(COMPLETIONS, body.clone(), None).await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert_error_object(&missing, "missing key");
    assert_eq!(missing.error_type(), "authentication_error");
    assert!(missing.text.contains("missing API key"), "{}", missing.text);
    let wrong = s.post_raw(CHAT, chat("Hi", 2).to_string().into_bytes(), Some("sk-other")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.error_type(), "authentication_error");
    assert!(wrong.text.contains("invalid API key"), "{}", wrong.text);
    let models = s.client.get(s.url("/v1/models")).send().await.expect("answered");
    assert_eq!(models.status(), StatusCode::UNAUTHORIZED);
    // The key is checked before the body: a bad body without a key is still 401.
    let r = s.post_raw(COMPLETIONS, b"{not json".to_vec(), None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let good = s.post_raw(COMPLETIONS, body, Some("sk-test-key")).await;
    assert_eq!(good.status, StatusCode::OK, "{}", good.text);
    assert_eq!(good.json["usage"]["completion_tokens"], 2);
    let health = s.get("/health").await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.json["status"], "ok");
    assert_eq!(s.get("/metrics").await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_before_the_model_is_ready_and_200_after() {
    let setup = Setup { ready: false, ..Setup::default() };
    let s = start(setup.clone()).await;
    let h = s.get("/health").await;
    assert_eq!(h.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h.json["status"], "loading");
    let r = s.post(COMPLETIONS, &completion("Hello", 2)).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert_error_object(&r, "completions while loading");
    assert!(r.text.contains("still loading"), "{}", r.text);
    let models = s.get("/v1/models").await;
    assert_eq!(models.status, StatusCode::OK);
    assert_eq!(models.json["data"][0]["id"], MODEL);
    assert!(models.json["data"][0]["max_model_len"].is_null());
    let (ready, engine) = common::load(&setup);
    assert!(s.state.ready.set(ready).is_ok());
    let h = s.get("/health").await;
    assert_eq!(h.status, StatusCode::OK);
    assert_eq!(h.json["status"], "ok");
    let r = s.post(COMPLETIONS, &completion("Hello", 2)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(s.get("/v1/models").await.json["data"][0]["max_model_len"], 256);
    drop(s);
    drop(engine);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_the_engine_serves_the_waiting_request_afterwards() {
    let mut setup = Setup::default();
    setup.engine = EngineConfig { parallel: 1, queue_capacity: 1, ..setup.engine };
    setup.context = 16384;
    let s = start(setup).await;
    let engine = s.state.ready.get().expect("ready").engine.clone();
    // One long stream holds the only lane.
    let long = with(&completion("A very long answer", 16000), json!({"stream": true}));
    let mut resp = s.client.post(s.url(COMPLETIONS)).json(&long).send().await.expect("answered");
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.chunk().await.expect("a chunk").is_some());
    // A second request waits in the queue's only place.
    let waiting = {
        let (client, url) = (s.client.clone(), s.url(COMPLETIONS));
        tokio::spawn(async move {
            let r = client.post(url).json(&completion("Patience", 5)).send().await.expect("answered");
            (r.status(), r.json::<Value>().await.expect("JSON"))
        })
    };
    let t = Instant::now();
    while engine.metrics().waiting != 1 {
        assert!(t.elapsed() < Duration::from_secs(10), "the second request never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A third finds the queue full.
    for route in [COMPLETIONS, CHAT] {
        let body = if route == CHAT { chat("Me too", 3) } else { completion("Me too", 3) };
        let r = s.post(route, &body).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
        assert_error_object(&r, "queue full");
        assert_eq!(r.error_type(), "rate_limit_error");
        assert!(r.text.contains("queue is full (1 waiting)"), "{}", r.text);
    }
    let r = s.client.post(s.url(COMPLETIONS)).json(&completion("Me too", 3)).send().await.expect("answered");
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"), "every 429 says when to retry");
    let m = engine.metrics();
    assert_eq!((m.running, m.waiting), (1, 1));
    // The long stream's client leaves: the waiting request gets the lane and completes.
    drop(resp);
    let (status, v) = tokio::time::timeout(Duration::from_secs(30), waiting).await.expect("in time").expect("task");
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let r = s.post(COMPLETIONS, &completion("Patience", 5)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(sha_of(&r.json), sha_of(&v));
}

/// Sends `body` plain and streamed and checks both say the same; returns the plain reply.
async fn same_both_ways(s: &Server, route: &str, body: &Value) -> Value {
    let plain = s.post(route, body).await;
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.text);
    let streamed = s.stream(route, &with(body, json!({"stream": true}))).await;
    assert_eq!(streamed.status, StatusCode::OK);
    assert!(streamed.content_type.starts_with("text/event-stream"), "{}", streamed.content_type);
    assert!(streamed.done, "the stream ends with data: [DONE]");
    assert!(streamed.chunks.len() > 2, "the reply is streamed in pieces: {:?}", streamed.chunks);
    let p = &plain.json;
    assert_eq!(streamed.text(), text_of(p), "{route} {body}");
    assert_eq!(streamed.token_sha256(), sha_of(p));
    assert_eq!(streamed.finish_reason(), p["choices"][0]["finish_reason"].as_str().expect("a reason"));
    if let Some(seed) = body["seed"].as_u64() {
        assert_eq!(streamed.finish_chunk()["tensorfold"]["seed"], seed);
        assert_eq!(p["tensorfold"]["seed"], seed);
    }
    let id = streamed.chunks[0]["id"].clone();
    let object = if route == CHAT { "chat.completion.chunk" } else { "text_completion" };
    for c in &streamed.chunks {
        assert_eq!(c["id"], id, "one id for every chunk");
        assert_eq!(c["object"], object);
        assert_eq!(c["model"], MODEL);
    }
    if route == CHAT {
        assert_eq!(streamed.chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(p["choices"][0]["message"]["role"], "assistant");
        assert_eq!(p["object"], "chat.completion");
        if !p["choices"][0]["logprobs"].is_null() {
            assert_eq!(streamed.chat_logprobs(), p["choices"][0]["logprobs"]);
        }
    } else {
        assert_eq!(p["object"], "text_completion");
        if !p["choices"][0]["logprobs"].is_null() {
            assert_eq!(streamed.completion_logprobs(), p["choices"][0]["logprobs"]);
        }
    }
    plain.json
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_and_plain_completions_agree_on_text_tokens_and_logprobs_greedy_and_seeded() {
    let s = start(Setup::default()).await;
    let greedy = with(&completion("The quick brown fox", 24), json!({"logprobs": 3}));
    let g = same_both_ways(&s, COMPLETIONS, &greedy).await;
    let lp = &g["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().expect("tokens").len(), 24);
    assert_eq!(lp["text_offset"][0], 0);
    for (i, top) in lp["top_logprobs"].as_array().expect("tops").iter().enumerate() {
        let top = top.as_object().expect("a map");
        assert!((1..=3).contains(&top.len()), "{top:?}");
        // Greedy: the chosen token is the most likely one.
        let best = top.values().map(|v| v.as_f64().expect("a number")).fold(f64::MIN, f64::max);
        assert_eq!(lp["token_logprobs"][i].as_f64(), Some(best), "token {i}");
        assert!(best <= 0.0);
    }
    let seeded = with(
        &completion("The quick brown fox", 24),
        json!({"temperature": 1.5, "top_k": 50, "top_p": 0.99, "seed": 1234, "logprobs": 2}),
    );
    let a = same_both_ways(&s, COMPLETIONS, &seeded).await;
    assert_eq!(a["tensorfold"]["seed"], 1234);
    assert_ne!(
        sha_of(&a),
        sha_of(&g),
        "sampling at 1.5 differs from greedy on 24 tokens: {}",
        g["choices"][0]["logprobs"]
    );
    // The same seed again: the same tokens; another seed: others.
    let again = s.post(COMPLETIONS, &seeded).await;
    assert_eq!(sha_of(&again.json), sha_of(&a));
    let other = s.post(COMPLETIONS, &with(&seeded, json!({"seed": 99}))).await;
    assert_ne!(sha_of(&other.json), sha_of(&a));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_and_plain_chat_replies_agree_on_text_tokens_and_logprobs_greedy_and_seeded() {
    let s = start(Setup::default()).await;
    let greedy = with(&chat("Write a poem about rust.", 20), json!({"logprobs": true, "top_logprobs": 2}));
    let g = same_both_ways(&s, CHAT, &greedy).await;
    let content = g["choices"][0]["logprobs"]["content"].as_array().expect("content").clone();
    assert_eq!(content.len(), 20);
    for e in &content {
        let top = e["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["logprob"], e["logprob"], "greedy picks the top token");
        assert_eq!(top[0]["token"], e["token"]);
        let bytes: Vec<u8> = e["bytes"].as_array().expect("bytes").iter().map(|b| b.as_u64().unwrap() as u8).collect();
        assert_eq!(bytes, e["token"].as_str().expect("a token").as_bytes());
    }
    let seeded = with(&chat("Write a poem about rust.", 20), json!({"temperature": 1.0, "min_p": 0.05, "seed": 77}));
    let a = same_both_ways(&s, CHAT, &with(&seeded, json!({"logprobs": true, "top_logprobs": 2}))).await;
    assert_eq!(a["tensorfold"]["seed"], 77);
    // Without logprobs the tokens are the same, and the logprobs field is null.
    let b = same_both_ways(&s, CHAT, &seeded).await;
    assert_eq!(sha_of(&a), sha_of(&b));
    assert!(b["choices"][0]["logprobs"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unseeded_sampled_reply_reports_the_seed_that_reproduces_it() {
    let s = start(Setup::default()).await;
    let body = with(&completion("Roll the dice", 16), json!({"temperature": 1.0}));
    let a = s.post(COMPLETIONS, &body).await.json;
    let b = s.post(COMPLETIONS, &body).await.json;
    let (sa, sb) =
        (a["tensorfold"]["seed"].as_u64().expect("a seed"), b["tensorfold"]["seed"].as_u64().expect("a seed"));
    assert_ne!(sa, sb, "two unseeded requests get different seeds");
    let again = s.post(COMPLETIONS, &with(&body, json!({"seed": sa}))).await.json;
    assert_eq!(sha_of(&again), sha_of(&a));
    assert_eq!(text_of(&again), text_of(&a));
}

/// The `chars`-char substring of `text` whose first occurrence is latest (never at the start, never holding
/// U+FFFD): (stop, its byte offset).
fn pick_stop(text: &str, chars: usize) -> (String, usize) {
    let idx: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
    (1..idx.len().saturating_sub(chars))
        .map(|k| (&text[idx[k]..idx[k + chars]], idx[k]))
        .filter(|&(s, at)| !s.contains('\u{FFFD}') && text.find(s) == Some(at))
        .max_by_key(|&(_, at)| at)
        .map(|(s, at)| (s.to_string(), at))
        .unwrap_or_else(|| panic!("no stop string of {chars} chars in {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_string_ends_the_reply_before_it_and_is_never_streamed() {
    let s = start(Setup::default()).await;
    // Sampled with a fixed seed (the fixture's greedy text falls into a two-token loop at once).
    let sampled = json!({"temperature": 1.0, "seed": 11});
    for (route, body) in [
        (COMPLETIONS, with(&completion("Once upon a time", 40), sampled.clone())),
        (CHAT, with(&chat("Once upon a time", 40), sampled.clone())),
    ] {
        let full = s.post(route, &body).await.json;
        let text = text_of(&full);
        for chars in [1, 3] {
            let (stop, at) = pick_stop(&text, chars);
            let stopped = with(&body, json!({"stop": ["\u{1F980}never", stop.clone()]}));
            let plain = s.post(route, &stopped).await.json;
            assert_eq!(text_of(&plain), text[..at], "stop {stop:?} in {text:?}");
            assert_eq!(plain["choices"][0]["finish_reason"], "stop");
            let used = plain["usage"]["completion_tokens"].as_u64().expect("a count");
            assert!(used < 40, "generation ended at the stop string, after {used} tokens");
            let streamed = s.stream(route, &with(&stopped, json!({"stream": true}))).await;
            assert_eq!(streamed.text(), text[..at]);
            assert_eq!(streamed.finish_reason(), "stop");
            assert_eq!(streamed.token_sha256(), sha_of(&plain));
            for p in streamed.pieces() {
                assert!(!p.contains(&stop), "chunk {p:?} holds the stop string {stop:?}");
            }
            assert!(streamed.done);
        }
        // A stop string that never occurs changes nothing.
        let never = s.post(route, &with(&body, json!({"stop": "\u{1F980}never"}))).await.json;
        assert_eq!(text_of(&never), text);
        assert_eq!(never["choices"][0]["finish_reason"], "length");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_chunk_comes_last_before_done_only_when_asked() {
    let s = start(Setup::default()).await;
    for (route, body) in [(COMPLETIONS, completion("Count to ten", 7)), (CHAT, chat("Count to ten", 7))] {
        let asked =
            s.stream(route, &with(&body, json!({"stream": true, "stream_options": {"include_usage": true}}))).await;
        assert!(asked.done);
        let last = asked.chunks.last().expect("chunks");
        assert_eq!(last["choices"], json!([]), "the usage chunk has no choices");
        let plain = s.post(route, &body).await.json;
        let mut u = last["usage"].clone();
        assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0, "the first request of this prompt");
        u["prompt_tokens_details"] = plain["usage"]["prompt_tokens_details"].clone(); // the second one hits the cache
        assert_eq!(u, plain["usage"]);
        assert_eq!(last["usage"]["completion_tokens"], 7);
        let u = &last["usage"];
        assert_eq!(u["total_tokens"].as_u64(), Some(u["prompt_tokens"].as_u64().unwrap() + 7));
        let with_usage = asked.chunks.iter().filter(|c| !c["usage"].is_null()).count();
        assert_eq!(with_usage, 1, "only the last chunk carries usage");
        let not_asked = s.stream(route, &with(&body, json!({"stream": true}))).await;
        assert!(not_asked.done);
        assert!(not_asked.chunks.iter().all(|c| c["usage"].is_null()), "no usage unless asked");
        assert_eq!(not_asked.chunks.len() + 1, asked.chunks.len());
        assert_eq!(not_asked.text(), text_of(&plain));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_text_is_the_utf8_decode_of_the_engine_tokens_at_every_chunk_boundary() {
    let s = start(Setup::default()).await;
    let ready = s.state.ready.get().expect("ready").clone();
    let text = ready.text.clone().expect("the fixture has a tokenizer");
    let mut broken = 0;
    for k in 0..6u32 {
        let prompt: Vec<u32> = vec![1, 100 + 37 * k, 200 + 11 * k, 300 + k];
        // The engine alone: the token ids of the greedy reply.
        let (_, rx) = ready
            .engine
            .submit(Request { ignore_eos: true, ..Request::greedy(prompt.clone(), 48) })
            .expect("submitted");
        let ids: Vec<u32> = rx.iter().filter_map(|e| if let Event::Token(t) = e { Some(t) } else { None }).collect();
        assert_eq!(ids.len(), 48);
        let decoded = text.decode(&ids, true).expect("decodes");
        broken += decoded.matches('\u{FFFD}').count();
        let body = json!({"prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": true});
        let streamed = s.stream(COMPLETIONS, &with(&body, json!({"stream": true}))).await;
        assert_eq!(streamed.text(), decoded, "prompt {prompt:?}");
        assert_eq!(streamed.token_sha256(), token_sha256(&ids));
        // No chunk starts with a broken character that the whole text does not have there.
        let mut at = 0;
        for p in streamed.pieces() {
            assert_eq!(&decoded[at..at + p.len()], p);
            at += p.len();
        }
        let plain = s.post(COMPLETIONS, &body).await.json;
        assert_eq!(text_of(&plain), decoded);
    }
    // The fixture's random weights emit lone UTF-8 bytes: the detokenizer held them back and rendered them
    // exactly where a whole decode puts U+FFFD.
    assert!(broken > 0, "the replies exercise incomplete UTF-8 sequences");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_drops_its_stream_frees_the_lane_and_memory_within_a_second() {
    let s = start(Setup { context: 16384, ..Setup::default() }).await;
    let engine = s.state.ready.get().expect("ready").engine.clone();
    for route in [COMPLETIONS, CHAT] {
        let body = if route == CHAT { chat("Talk forever", 16000) } else { completion("Talk forever", 16000) };
        let mut resp =
            s.client.post(s.url(route)).json(&with(&body, json!({"stream": true}))).send().await.expect("answered");
        assert_eq!(resp.status(), StatusCode::OK);
        for _ in 0..3 {
            assert!(resp.chunk().await.expect("a chunk").is_some());
        }
        assert_eq!(engine.metrics().running, 1);
        assert!(engine.metrics().reserved_bytes > 0);
        drop(resp);
        assert_lanes_free_within_a_second(&s).await;
        let m = engine.metrics();
        assert_eq!((m.running, m.waiting, m.reserved_bytes, m.state_bytes), (0, 0, 0, 0));
        assert!(m.generated_tokens < 16000, "the stream was cancelled, not run out");
        // The lane serves the next request.
        let r = s.post(route, &with(&body, json!({"max_tokens": 3}))).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.json["usage"]["completion_tokens"], 3);
    }
}

/// Polls `/metrics` until no request runs and nothing is reserved; panics after a second.
async fn assert_lanes_free_within_a_second(s: &Server) {
    let t = Instant::now();
    loop {
        let m = s.metrics().await;
        let running = sample(&m, "tensorfold_requests_running");
        let reserved = sample(&m, "tensorfold_memory_reserved_bytes");
        if running == Some(0.0) && reserved == Some(0.0) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(1), "after 1 s: running {running:?}, reserved {reserved:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_on_a_plain_request_frees_the_lane_within_a_second() {
    let s = start(Setup { context: 16384, ..Setup::default() }).await;
    let engine = s.state.ready.get().expect("ready").engine.clone();
    let impatient =
        reqwest::Client::builder().no_proxy().timeout(Duration::from_millis(300)).build().expect("a client");
    let err = impatient.post(s.url(COMPLETIONS)).json(&completion("Talk forever", 16000)).send().await;
    assert!(err.is_err_and(|e| e.is_timeout()), "16000 tokens take longer than 300 ms");
    assert_lanes_free_within_a_second(&s).await;
    let m = engine.metrics();
    assert_eq!((m.running, m.waiting, m.reserved_bytes), (0, 0, 0));
    assert!(m.generated_tokens < 16000, "the request was cancelled, not run out ({})", m.generated_tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_clients_get_the_same_tokens_as_each_request_alone() {
    let s = start(Setup::default()).await;
    let requests: Vec<(&str, Value)> = (0..8)
        .map(|i| {
            let prompt = format!("Client {i} asks about {}", ["ships", "bread", "stars", "code"][i % 4]);
            let sampling = match i % 4 {
                0 => json!({"temperature": 0}),
                1 => json!({"temperature": 0.8, "seed": 100 + i}),
                2 => json!({"temperature": 1.0, "top_k": 20, "top_p": 0.9, "seed": 200 + i}),
                _ => json!({"temperature": 0.7, "min_p": 0.1, "seed": 300 + i}),
            };
            let base = if i % 2 == 0 { completion(&prompt, 10 + 3 * i) } else { chat(&prompt, 10 + 3 * i) };
            let body = with(&with(&base, sampling), json!({"ignore_eos": i % 3 != 0, "stream": i % 3 == 1}));
            (if i % 2 == 0 { COMPLETIONS } else { CHAT }, body)
        })
        .collect();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = requests
        .iter()
        .cloned()
        .map(|(route, body)| {
            let (client, url, barrier) = (s.client.clone(), s.url(route), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let resp = client.post(url).json(&body).send().await.expect("answered");
                assert_eq!(resp.status(), StatusCode::OK);
                let text = resp.text().await.expect("a body");
                if body["stream"] == true {
                    let st = common::parse_sse(StatusCode::OK, String::new(), &text);
                    assert!(st.done);
                    (st.text(), st.token_sha256(), st.finish_reason())
                } else {
                    let v: Value = serde_json::from_str(&text).expect("JSON");
                    (text_of(&v), sha_of(&v), v["choices"][0]["finish_reason"].as_str().expect("a reason").to_string())
                }
            })
        })
        .collect();
    let mut together = Vec::new();
    for t in tasks {
        together.push(t.await.expect("a client task"));
    }
    let engine = s.state.ready.get().expect("ready").engine.metrics();
    assert!(engine.rounds > 0);
    for ((route, body), (text, sha, finish)) in requests.iter().zip(&together) {
        let alone = s.post(route, &with(body, json!({"stream": false}))).await;
        assert_eq!(alone.status, StatusCode::OK, "{}", alone.text);
        assert_eq!(*sha, sha_of(&alone.json), "{route} {body}");
        assert_eq!(*text, text_of(&alone.json), "{route} {body}");
        assert_eq!(finish, alone.json["choices"][0]["finish_reason"].as_str().expect("a reason"));
    }
    let distinct: std::collections::HashSet<&String> = together.iter().map(|(_, sha, _)| sha).collect();
    assert_eq!(distinct.len(), 8, "distinct prompts give distinct replies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_then_detokenize_gives_the_text_back() {
    let s = start(Setup::default()).await;
    let text = "Hello world, this is TensorFold.";
    let t = s.post("/tokenize", &json!({"prompt": text, "add_special_tokens": false})).await;
    assert_eq!(t.status, StatusCode::OK, "{}", t.text);
    let ids = t.json["tokens"].as_array().expect("tokens").clone();
    assert_eq!(t.json["count"].as_u64(), Some(ids.len() as u64));
    assert_eq!(t.json["max_model_len"], 256);
    assert!(ids.len() > 3);
    let d = s.post("/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(d.status, StatusCode::OK, "{}", d.text);
    assert_eq!(d.json["prompt"], text);
    // With special tokens the BOS comes first, as a completion prompt is encoded.
    let with_bos = s.post("/tokenize", &json!({"prompt": text})).await.json;
    assert_eq!(with_bos["tokens"][0], 1);
    assert_eq!(with_bos["count"].as_u64(), Some(ids.len() as u64 + 1));
    let usage = s.post(COMPLETIONS, &completion(text, 1)).await.json;
    assert_eq!(usage["usage"]["prompt_tokens"], with_bos["count"]);
    // Chat messages tokenize as the chat route renders them.
    let msgs = json!([{"role": "user", "content": "Hi there"}]);
    let chat_ids = s.post("/tokenize", &json!({"messages": msgs})).await.json;
    let reply = s.post(CHAT, &json!({"messages": msgs, "max_tokens": 1})).await.json;
    assert_eq!(reply["usage"]["prompt_tokens"], chat_ids["count"]);
    // Bad input is a 400 naming the field.
    let bad = s.post("/detokenize", &json!({"tokens": [1, 700]})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text);
    assert_eq!(bad.json["error"]["param"], "tokens");
    let bad = s.post("/tokenize", &json!({"prompt": 5})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.json["error"]["param"], "prompt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_lists_the_server_and_engine_series() {
    let s = start(Setup::default()).await;
    let r = s.post(COMPLETIONS, &completion("Measure me", 4)).await;
    assert_eq!(r.status, StatusCode::OK);
    let resp = s.client.get(s.url("/metrics")).send().await.expect("answered");
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let m = resp.text().await.expect("a body");
    for name in [
        "tensorfold_requests_running",
        "tensorfold_requests_waiting",
        "tensorfold_prompt_cache_hits_total",
        "tensorfold_prompt_cache_queries_total",
        "tensorfold_kv_bytes_in_use",
        "tensorfold_memory_reserved_bytes",
        "tensorfold_prompt_tokens_total",
        "tensorfold_generation_tokens_total",
        "tensorfold_rounds_total",
    ] {
        assert!(sample(&m, name).is_some(), "{name} missing from\n{m}");
    }
    for name in ["tensorfold_time_to_first_token_seconds", "tensorfold_inter_token_latency_seconds"] {
        assert!(m.contains(&format!("{name}_count ")) && m.contains(&format!("{name}_bucket{{le=")), "{name}\n{m}");
        assert!(sample(&m, &format!("{name}_count")).expect("a count") >= 1.0);
    }
    assert!(m.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).all(|l| l.starts_with("tensorfold_")), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_chat_turn_reuses_the_first_turns_prompt_from_the_cache() {
    let s = start(Setup::default()).await;
    let mut messages = vec![
        json!({"role": "system", "content": "You are a sailor who tells long stories about the sea."}),
        json!({"role": "user", "content": "Tell me about the storm you met off the cape last winter."}),
    ];
    let one = s.post(CHAT, &json!({"messages": messages, "max_tokens": 8, "temperature": 0})).await.json;
    let first = one["usage"]["prompt_tokens"].as_u64().expect("a count");
    assert_eq!(one["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert!(first > 16, "the first prompt spans a prefill chunk ({first} tokens)");
    messages.push(json!({"role": "assistant", "content": one["choices"][0]["message"]["content"]}));
    messages.push(json!({"role": "user", "content": "And then?"}));
    let two = s.post(CHAT, &json!({"messages": messages, "max_tokens": 8, "temperature": 0})).await.json;
    let cached = two["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("a count");
    // The template renders turn 1's prompt as a prefix of turn 2's, so all of it is reused.
    assert_eq!(cached, first, "turn 2 reused {cached} of turn 1's {first} prompt tokens");
    assert!(two["usage"]["prompt_tokens"].as_u64().expect("a count") > first);
    let m = s.state.ready.get().expect("ready").engine.metrics();
    assert!(m.cache.hits >= 1 && m.cache.reused_tokens >= cached, "{:?}", m.cache);
    // The cached reply is the reply computed from scratch on a fresh server.
    let fresh = start(Setup::default()).await;
    let cold = fresh.post(CHAT, &json!({"messages": messages, "max_tokens": 8, "temperature": 0})).await.json;
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(sha_of(&cold), sha_of(&two));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_lists_the_served_model_and_unknown_fields_are_ignored() {
    let s = start(Setup::default()).await;
    let m = s.get("/v1/models").await;
    assert_eq!(m.status, StatusCode::OK);
    assert_eq!(m.json["object"], "list");
    assert_eq!(m.json["data"][0]["id"], MODEL);
    assert_eq!(m.json["data"][0]["object"], "model");
    assert_eq!(m.json["data"][0]["max_model_len"], 256);
    // No model field, a null field and fields we do not know: served as if absent.
    let plain = s.post(COMPLETIONS, &with(&completion("Hi", 3), json!({"model": null}))).await.json;
    let extra = s
        .post(
            COMPLETIONS,
            &with(&completion("Hi", 3), json!({"user": "u1", "suffix": null, "best_of": 1, "echo": false})),
        )
        .await;
    assert_eq!(extra.status, StatusCode::OK, "{}", extra.text);
    assert_eq!(sha_of(&extra.json), sha_of(&plain));
    assert_eq!(extra.json["model"], MODEL);
    // max_tokens absent: the server default (16 here).
    let d = s.post(COMPLETIONS, &with(&completion("Hi", 3), json!({"max_tokens": null}))).await.json;
    assert_eq!(d["usage"]["completion_tokens"], 16);
    assert_eq!(d["choices"][0]["finish_reason"], "length");
    // max_completion_tokens wins over max_tokens.
    let c = s.post(CHAT, &with(&chat("Hi", 9), json!({"max_completion_tokens": 4}))).await.json;
    assert_eq!(c["usage"]["completion_tokens"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafting_reports_what_it_drafted_and_changes_no_token() {
    let s = start(Setup::default()).await;
    // The fixture's greedy text falls into a loop, which context copies draft.
    let body = completion("Once upon a time", 64);
    let drafted = same_both_ways(&s, COMPLETIONS, &body).await;
    let serial = same_both_ways(&s, COMPLETIONS, &with(&body, json!({"draft": false}))).await;
    let (d, a) = (&drafted["tensorfold"]["drafted"], &drafted["tensorfold"]["accepted"]);
    assert!(d.as_u64() > Some(0) && a.as_u64() > Some(0) && a.as_u64() <= d.as_u64(), "drafted {d}, accepted {a}");
    assert_eq!((&serial["tensorfold"]["drafted"], &serial["tensorfold"]["accepted"]), (&json!(0), &json!(0)));
    assert_eq!(sha_of(&drafted), sha_of(&serial));
    assert_eq!(text_of(&drafted), text_of(&serial));
    // Sampled, with a seed: the same holds.
    let sampled = with(&body, json!({"temperature": 0.7, "seed": 5, "logprobs": 1}));
    let a = s.post(COMPLETIONS, &sampled).await.json;
    let b = s.post(COMPLETIONS, &with(&sampled, json!({"draft": false}))).await.json;
    assert_eq!(sha_of(&a), sha_of(&b));
    assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]);
    let m = s.metrics().await;
    assert!(sample(&m, "tensorfold_drafted_tokens_total").is_some_and(|v| v > 0.0), "{m}");
    assert!(sample(&m, "tensorfold_accepted_tokens_total").is_some(), "{m}");
}
