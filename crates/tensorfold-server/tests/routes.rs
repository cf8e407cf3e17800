//! Issue 24's routes and conventions over HTTP: `GET /v1/models/{id}`, CORS by `--allowed-origins` (off by default,
//! preflights before auth), `Retry-After` on 503s, `echo` and `suffix` on completions, and the access-log line.

mod common;

use common::*;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::json;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tensorfold_server::HttpOptions;
use tensorfold_server::access_log::AccessLog;
use tensorfold_server::cors::Origins;

const HUB_NAME: &str = "LiquidAI/LFM2-350M";
const ORIGIN: &str = "http://localhost:3000";

fn header<'a>(h: &'a HeaderMap, k: &str) -> &'a str {
    h.get(k).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// A server still loading (no model needed), serving `name`, with these CORS origins and key.
async fn loading(name: &str, origins: Origins, key: Option<&str>) -> Server {
    let http = HttpOptions { allowed_origins: origins, ..HttpOptions::default() };
    let setup = Setup { ready: false, name: Some(name.into()), http, api_key: key.map(Into::into), ..Setup::default() };
    start(setup).await
}

#[tokio::test]
async fn the_served_model_is_retrieved_by_id_with_slashes_raw_or_encoded_and_others_are_model_not_found() {
    let s = loading(HUB_NAME, Origins::Off, None).await;
    for path in ["/v1/models/LiquidAI/LFM2-350M", "/v1/models/LiquidAI%2FLFM2-350M"] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
        assert_eq!((r.json["id"].as_str(), r.json["object"].as_str()), (Some(HUB_NAME), Some("model")), "{}", r.text);
        assert_eq!(r.json["owned_by"], "tensorfold");
        assert!(r.json["created"].as_u64().is_some() && r.json["max_model_len"].is_null(), "{}", r.text);
    }
    let list = s.get("/v1/models").await;
    assert_eq!(list.json["data"][0], s.get("/v1/models/LiquidAI/LFM2-350M").await.json, "the list's card");
    for other in ["/v1/models/LiquidAI/LFM2-700M", "/v1/models/x"] {
        let r = s.get(other).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
        assert_error_object(&r, other);
        assert_eq!(
            (r.json["error"]["code"].as_str(), r.json["error"]["param"].as_str()),
            (Some("model_not_found"), Some("model"))
        );
    }
}

#[tokio::test]
async fn retrieving_a_model_needs_the_key_as_listing_does() {
    let s = loading(MODEL, Origins::Off, Some("k1")).await;
    let path = format!("/v1/models/{MODEL}");
    assert_eq!(s.get(&path).await.status, StatusCode::UNAUTHORIZED);
    let r = s.client.get(s.url(&path)).bearer_auth("k1").send().await.expect("answered");
    assert_eq!(r.status(), StatusCode::OK);
}

/// A browser's preflight of a chat POST with a bearer key.
async fn preflight(s: &Server, origin: &str) -> reqwest::Response {
    s.client
        .request(reqwest::Method::OPTIONS, s.url(CHAT))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization,content-type")
        .send()
        .await
        .expect("answered")
}

#[tokio::test]
async fn with_allowed_origins_preflights_are_answered_before_auth_and_replies_carry_the_origin() {
    let s = loading(MODEL, Origins::parse(&format!("{ORIGIN},https://app.example")).unwrap(), Some("k1")).await;
    let pre = preflight(&s, ORIGIN).await;
    assert_eq!(pre.status(), StatusCode::OK, "a preflight has no key and is not refused");
    let h = pre.headers();
    assert_eq!(header(h, "access-control-allow-origin"), ORIGIN);
    let allowed = header(h, "access-control-allow-headers").to_ascii_lowercase();
    assert!(allowed.contains("authorization") && allowed.contains("content-type"), "{allowed}");
    assert!(header(h, "access-control-allow-methods").contains("POST"), "{h:?}");
    assert!(header(h, "vary").contains("origin"), "{h:?}");
    assert_eq!(header(h, "access-control-max-age"), "600");
    // The request itself: answered (401 without the key, 200 with it), the origin allowed on both so the page can
    // read the error; Retry-After is exposed to scripts.
    for key in [None, Some("k1")] {
        let mut req = s.client.get(s.url("/v1/models")).header("origin", ORIGIN);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let r = req.send().await.expect("answered");
        assert_eq!(r.status(), if key.is_some() { StatusCode::OK } else { StatusCode::UNAUTHORIZED });
        assert_eq!(header(r.headers(), "access-control-allow-origin"), ORIGIN);
        assert!(header(r.headers(), "vary").contains("origin"), "{:?}", r.headers());
        assert_eq!(header(r.headers(), "access-control-expose-headers"), "retry-after");
    }
    // Another origin gets no allow-origin, so the browser refuses the read.
    let other = preflight(&s, "http://evil.example").await;
    assert!(other.headers().get("access-control-allow-origin").is_none(), "{:?}", other.headers());
}

#[tokio::test]
async fn a_star_allows_every_origin_and_without_the_flag_there_are_no_cors_headers() {
    let any = loading(MODEL, Origins::Any, None).await;
    assert_eq!(header(preflight(&any, "http://x.example").await.headers(), "access-control-allow-origin"), "*");
    let off = loading(MODEL, Origins::Off, None).await;
    let pre = preflight(&off, ORIGIN).await;
    assert_eq!(pre.status(), StatusCode::METHOD_NOT_ALLOWED, "no CORS: OPTIONS is not a method of the route");
    let r = off.client.get(off.url("/v1/models")).header("origin", ORIGIN).send().await.expect("answered");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().keys().all(|k| !k.as_str().starts_with("access-control-")), "{:?}", r.headers());
}

#[tokio::test]
async fn a_503_while_loading_says_when_to_retry() {
    let s = loading(MODEL, Origins::Off, None).await;
    let r = s.client.post(s.url(COMPLETIONS)).json(&completion("Hi", 2)).send().await.expect("answered");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(r.headers(), "retry-after"), "1");
    // Client errors carry none.
    let r = s.client.get(s.url("/v1/models/x")).send().await.expect("answered");
    assert!(r.headers().get("retry-after").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_prepends_the_prompt_to_every_choice_streamed_or_not() {
    let s = start(Setup::default()).await;
    let prompt = "def fib(n):";
    let plain = s.post(COMPLETIONS, &completion(prompt, 6)).await;
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.text);
    let echoed = s.post(COMPLETIONS, &with(&completion(prompt, 6), json!({"echo": true}))).await;
    assert_eq!(echoed.status, StatusCode::OK, "{}", echoed.text);
    assert_eq!(text_of(&echoed.json), format!("{prompt}{}", text_of(&plain.json)));
    assert_eq!(echoed.json["usage"], plain.json["usage"], "echo changes no count");
    let streamed = s.stream(COMPLETIONS, &with(&completion(prompt, 6), json!({"echo": true, "stream": true}))).await;
    assert_eq!(streamed.pieces().first().map(String::as_str), Some(prompt), "the prompt is the first chunk");
    assert_eq!(streamed.text(), text_of(&echoed.json));
    let two =
        s.post(COMPLETIONS, &with(&completion(prompt, 6), json!({"echo": true, "n": 2, "temperature": 0.8}))).await;
    assert_eq!(two.status, StatusCode::OK, "{}", two.text);
    for c in two.json["choices"].as_array().expect("choices") {
        assert!(c["text"].as_str().expect("text").starts_with(prompt), "{c}");
    }
    // A token-id prompt echoes its decoded text.
    let ids = s.post("/tokenize", &json!({"prompt": prompt})).await.json["tokens"].clone();
    let decoded = s.post("/detokenize", &json!({"tokens": ids})).await.json["prompt"].as_str().unwrap().to_string();
    let by_ids = s.post(COMPLETIONS, &with(&completion(prompt, 6), json!({"prompt": ids, "echo": true}))).await;
    assert_eq!(text_of(&by_ids.json), format!("{decoded}{}", text_of(&plain.json)));
}

#[tokio::test]
async fn echo_with_logprobs_a_suffix_and_echo_on_chat_are_refused_by_name() {
    let s = start(Setup::default()).await;
    let cases = [
        (
            COMPLETIONS,
            with(&completion("Hi", 2), json!({"echo": true, "logprobs": 1})),
            "echo",
            "prompt tokens' logprobs",
        ),
        (COMPLETIONS, with(&completion("Hi", 2), json!({"suffix": "tail"})), "suffix", "not supported"),
        (COMPLETIONS, with(&completion("Hi", 2), json!({"suffix": 3})), "suffix", "must be a string"),
        (COMPLETIONS, with(&completion("Hi", 2), json!({"echo": "yes"})), "echo", "true or false"),
        (CHAT, with(&chat("Hi", 2), json!({"echo": true})), "echo", "/v1/completions field"),
    ];
    for (route, body, param, says) in cases {
        let r = s.post(route, &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text);
        assert_error_object(&r, param);
        assert_eq!(r.json["error"]["param"], param, "{}", r.text);
        assert!(r.text.contains(says), "{}", r.text);
    }
    let ok = s.post(COMPLETIONS, &with(&completion("Hi", 2), json!({"suffix": "", "echo": false}))).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
}

/// Every line the tests' global subscriber wrote (installed once for this test binary).
fn log_lines() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = buf.clone();
        let writer = move || Sink(b.clone());
        let sub = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_global_default(sub).expect("the first subscriber");
        buf
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The access-log line naming reply `id`, waited for (it is written once the reply's body has ended).
async fn line_of(id: &str) -> Option<String> {
    let log = log_lines();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
        if let Some(l) = text.lines().find(|l| l.contains(&format!("id={id} "))) {
            return Some(l.to_string());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_finished_request_leaves_one_access_line_without_its_prompt_unless_asked() {
    log_lines();
    let s = start(Setup::default()).await;
    let r = s.post(COMPLETIONS, &completion("zebra-secret", 4)).await;
    let line = line_of(r.json["id"].as_str().expect("an id")).await.expect("a line");
    for part in [
        "tensorfold::access",
        "route=\"POST /v1/completions\"",
        "status=200",
        "completion_tokens=4",
        "finish=length",
        "drafted=0",
        "ttft_ms=",
    ] {
        assert!(line.contains(part), "{part}: {line}");
    }
    assert!(!line.contains("zebra-secret"), "no prompt text by default: {line}");
    let st = s.stream(CHAT, &with(&chat("Hello", 3), json!({"stream": true}))).await;
    let line = line_of(st.chunks[0]["id"].as_str().expect("an id")).await.expect("a streamed reply's line");
    assert!(line.contains("route=\"POST /v1/chat/completions\"") && line.contains("completion_tokens=3"), "{line}");
    assert!(line.contains("status=200") && line.contains("tok_s="), "{line}");

    let http = HttpOptions { access_log: AccessLog { enabled: true, log_requests: true }, ..HttpOptions::default() };
    let asked = start(Setup { http, ..Setup::default() }).await;
    let r = asked.post(COMPLETIONS, &completion("okapi-prompt", 2)).await;
    let line = line_of(r.json["id"].as_str().expect("an id")).await.expect("a line");
    assert!(line.contains("body=\"{") && line.contains("okapi-prompt"), "{line}");

    let http = HttpOptions { access_log: AccessLog { enabled: false, log_requests: false }, ..HttpOptions::default() };
    let off = start(Setup { http, ..Setup::default() }).await;
    let r = off.post(COMPLETIONS, &completion("Hi", 2)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(line_of(r.json["id"].as_str().expect("an id")).await, None, "--disable-access-log");
}

#[tokio::test]
async fn a_refused_request_is_logged_with_its_status() {
    log_lines();
    let s = start(Setup::default()).await;
    let before = log_lines().lock().unwrap().len();
    let r = s.post(COMPLETIONS, &with(&completion("Hi", 2), json!({"temperature": 9, "user": "walrus-user"}))).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let t = Instant::now();
    loop {
        let text = String::from_utf8_lossy(&log_lines().lock().unwrap()[before..]).into_owned();
        if text
            .lines()
            .any(|l| l.contains("status=400") && l.contains("route=\"POST /v1/completions\"") && !l.contains("walrus"))
        {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "no status=400 line: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
