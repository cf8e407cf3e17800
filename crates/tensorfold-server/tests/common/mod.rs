//! Harness for the HTTP tests: the server in-process on `127.0.0.1:0` over the `lfm2-moe-f32` fixture,
//! spoken to through a real loopback socket with reqwest (JSON replies, SSE streams read to `[DONE]`).
#![allow(dead_code)]

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use tensorfold_engine::{Engine, EngineConfig, ModelTarget};
use tensorfold_kernels::CpuBackend;
use tensorfold_model::Source;
use tensorfold_server::listen::{ConnLimits, serve_connections};
use tensorfold_server::state::{AppState, Ready};
use tensorfold_server::{HttpOptions, ServeOptions, new_state, router_with};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The model every test serves.
pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-moe-f32")
}

/// The name the test server serves (and `/v1/models` lists).
pub const MODEL: &str = "lfm2-moe-f32";

/// How a test server is set up.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Engine settings.
    pub engine: EngineConfig,
    /// Context limit in tokens (the fixture's 128000 cut down so `context_length_exceeded` is cheap to hit).
    pub context: usize,
    /// `max_tokens` of a request that gives none.
    pub default_max_tokens: usize,
    /// Bearer key required on API routes.
    pub api_key: Option<String>,
    /// Load the model and set `ready` (false: the state stays "loading").
    pub ready: bool,
    /// Attach the `dspark-tiny` drafter fixture.
    pub drafter: bool,
    /// Connection bounds (timeouts, the connection cap).
    pub conn: ConnLimits,
    /// CORS and the access log.
    pub http: HttpOptions,
    /// The served name (default [`MODEL`]).
    pub name: Option<String>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            engine: EngineConfig {
                parallel: 8,
                queue_capacity: 64,
                round_rows: 64,
                prefill_chunk: 16,
                memory_bytes: 1 << 30,
                prompt_cache_bytes: 64 << 20,
                // Drafting on in every round, so drafted counts do not depend on measured timings.
                round_guard: false,
                ..EngineConfig::default()
            },
            context: 256,
            default_max_tokens: 16,
            api_key: None,
            ready: true,
            drafter: false,
            conn: ConnLimits::default(),
            http: HttpOptions::default(),
            name: None,
        }
    }
}

/// Opens the fixture and starts an engine over it (as `tensorfold serve` does).
pub fn load(setup: &Setup) -> (Ready, Engine) {
    let mut loaded = tensorfold_model::open(&Source::Dir(fixture()), CpuBackend).expect("the fixture opens");
    loaded.model.cfg.max_positions = setup.context;
    if setup.drafter {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/dspark-tiny");
        let d = tensorfold_model::drafter::open_drafter(&Source::Dir(dir), &loaded.model.cfg, &loaded.model.backend)
            .expect("the drafter fixture opens");
        loaded.model.drafter = Some(d);
    }
    let text = loaded.text.map(Arc::new);
    let engine = Engine::start(
        ModelTarget { model: std::sync::Arc::new(loaded.model), eos: loaded.eos_ids },
        setup.engine.clone(),
    );
    let ready = Ready {
        engine: engine.handle(),
        text,
        context: setup.context,
        default_max_tokens: setup.default_max_tokens,
        devices: None,
    };
    (ready, engine)
}

/// A server on a loopback port, stopped (and its engine joined) when dropped.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The shared state (tests set `ready` late, or read the engine's metrics).
    pub state: AppState,
    /// A client with no proxy.
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    engine: Option<Engine>,
}

/// Starts a server.
pub async fn start(setup: Setup) -> Server {
    let opts = ServeOptions {
        addr: "127.0.0.1:0".parse().expect("an address"),
        model_name: setup.name.clone().unwrap_or_else(|| MODEL.into()),
        api_key: setup.api_key.clone(),
        grace: std::time::Duration::from_secs(1),
        conn: setup.conn.clone(),
        http: setup.http.clone(),
    };
    let state = new_state(&opts);
    let engine = if setup.ready {
        let (ready, engine) = load(&setup);
        assert!(state.ready.set(ready).is_ok(), "a fresh state is not ready yet");
        Some(engine)
    } else {
        None
    };
    let listener = tokio::net::TcpListener::bind(opts.addr).await.expect("binding loopback");
    let base = format!("http://{}", listener.local_addr().expect("a bound address"));
    let (stop, stopped) = oneshot::channel::<()>();
    let app = router_with(state.clone(), &setup.http.allowed_origins);
    // The server's own bounded accept loop (`listen.rs`), as `serve` runs it.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let conn = setup.conn.clone();
    let task = tokio::spawn(async move {
        tokio::spawn(async move {
            let _ = stopped.await;
            let _ = stop_tx.send(true);
        });
        serve_connections(listener, app, conn, stop_rx).await;
    });
    let client = reqwest::Client::builder().no_proxy().build().expect("a client");
    Server { base, state, client, stop: Some(stop), task: Some(task), engine }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
        drop(self.engine.take());
    }
}

/// A JSON reply: status and body (`Value::Null` when the body is not JSON).
#[derive(Clone, Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: StatusCode,
    /// Parsed body.
    pub json: Value,
    /// Raw body.
    pub text: String,
}

impl Reply {
    /// `error.type`.
    pub fn error_type(&self) -> &str {
        self.json["error"]["type"].as_str().unwrap_or("<none>")
    }
}

/// One SSE reply read to its end.
#[derive(Clone, Debug)]
pub struct Streamed {
    /// HTTP status.
    pub status: StatusCode,
    /// `content-type`.
    pub content_type: String,
    /// Every `data:` payload but `[DONE]`, parsed.
    pub chunks: Vec<Value>,
    /// Whether the last event was `data: [DONE]`.
    pub done: bool,
}

impl Streamed {
    /// Each chunk's text (`choices[0].text` or `choices[0].delta.content`), chunks without a choice skipped.
    pub fn pieces(&self) -> Vec<String> {
        self.chunks
            .iter()
            .filter_map(|c| c["choices"].get(0))
            .map(|ch| ch["text"].as_str().or_else(|| ch["delta"]["content"].as_str()).unwrap_or("").to_string())
            .collect()
    }

    /// The whole streamed text.
    pub fn text(&self) -> String {
        self.pieces().concat()
    }

    /// The chunk that carries `finish_reason`.
    pub fn finish_chunk(&self) -> &Value {
        let mut it =
            self.chunks.iter().filter(|c| c["choices"].get(0).is_some_and(|ch| !ch["finish_reason"].is_null()));
        let c = it.next().expect("a chunk with finish_reason");
        assert!(it.next().is_none(), "exactly one chunk carries finish_reason");
        c
    }

    /// `finish_reason`.
    pub fn finish_reason(&self) -> String {
        self.finish_chunk()["choices"][0]["finish_reason"].as_str().expect("a string").to_string()
    }

    /// `tensorfold.token_sha256` of the finish chunk.
    pub fn token_sha256(&self) -> String {
        self.finish_chunk()["tensorfold"]["token_sha256"].as_str().expect("the tensorfold block").to_string()
    }

    /// Completions logprobs, every chunk's lists joined: (tokens, token_logprobs, top_logprobs, text_offset).
    pub fn completion_logprobs(&self) -> Value {
        let mut joined = serde_json::json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
        for c in &self.chunks {
            let lp = &c["choices"][0]["logprobs"];
            if lp.is_null() {
                continue;
            }
            for k in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
                let part = lp[k].as_array().expect("a list").clone();
                joined[k].as_array_mut().expect("a list").extend(part);
            }
        }
        joined
    }

    /// Choice `choice`'s tool-call deltas, in order.
    pub fn tool_call_deltas(&self, choice: usize) -> Vec<Value> {
        let of_choice = self.chunks.iter().filter_map(|c| c["choices"].get(0).filter(|ch| ch["index"] == choice));
        of_choice.filter_map(|ch| ch["delta"]["tool_calls"].as_array()).flatten().cloned().collect()
    }

    /// Choice `choice`'s calls as the official client accumulates the deltas (by `index`: `id`, `type` and `name`
    /// from a call's first delta, argument fragments joined); a later delta repeating an id or a name fails.
    pub fn tool_calls(&self, choice: usize) -> Vec<Value> {
        let mut calls: Vec<Value> = Vec::new();
        for d in self.tool_call_deltas(choice) {
            let i = d["index"].as_u64().expect("an index") as usize;
            let f = &d["function"];
            if i == calls.len() {
                assert!(d["id"].is_string() && d["type"] == "function" && f["name"].is_string(), "{d}");
                calls.push(serde_json::json!({"id": d["id"], "type": "function",
                    "function": {"name": f["name"], "arguments": f["arguments"]}}));
                continue;
            }
            assert!(d.get("id").is_none() && d.get("type").is_none() && f.get("name").is_none(), "{d}");
            let call = calls.get_mut(i).expect("deltas of an announced call");
            let joined = call["function"]["arguments"].as_str().expect("text").to_string()
                + f["arguments"].as_str().expect("a fragment");
            call["function"]["arguments"] = Value::String(joined);
        }
        calls
    }

    /// Chat logprobs, every chunk's `content` entries joined.
    pub fn chat_logprobs(&self) -> Value {
        let mut all = Vec::new();
        for c in &self.chunks {
            if let Some(content) = c["choices"].get(0).and_then(|ch| ch["logprobs"]["content"].as_array()) {
                all.extend(content.iter().cloned());
            }
        }
        serde_json::json!({"content": all})
    }
}

impl Server {
    /// `base + path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POSTs a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_raw(path, body.to_string().into_bytes(), None).await
    }

    /// POSTs raw bytes, with a bearer key if given.
    pub async fn post_raw(&self, path: &str, body: Vec<u8>, key: Option<&str>) -> Reply {
        let mut req = self.client.post(self.url(path)).header("content-type", "application/json").body(body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        reply(req.send().await.expect("the request is answered")).await
    }

    /// GETs a path.
    pub async fn get(&self, path: &str) -> Reply {
        reply(self.client.get(self.url(path)).send().await.expect("the request is answered")).await
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> String {
        let r = self.get("/metrics").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        r.text
    }

    /// POSTs a JSON body and reads the SSE reply to its end.
    pub async fn stream(&self, path: &str, body: &Value) -> Streamed {
        let resp = self.client.post(self.url(path)).json(body).send().await.expect("the request is answered");
        let status = resp.status();
        let content_type =
            resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let text = resp.text().await.expect("a body");
        parse_sse(status, content_type, &text)
    }
}

async fn reply(resp: reqwest::Response) -> Reply {
    let status = resp.status();
    let text = resp.text().await.expect("a body");
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply { status, json, text }
}

/// Splits an SSE body into its `data:` payloads; asserts every one but `[DONE]` is JSON.
pub fn parse_sse(status: StatusCode, content_type: String, text: &str) -> Streamed {
    let mut chunks = Vec::new();
    let mut done = false;
    for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        if data.is_empty() {
            continue; // a keep-alive comment
        }
        let data = data.join("\n");
        assert!(!done, "nothing follows [DONE]: {data}");
        if data == "[DONE]" {
            done = true;
            continue;
        }
        chunks.push(serde_json::from_str(&data).unwrap_or_else(|e| panic!("a JSON chunk ({e}): {data}")));
    }
    Streamed { status, content_type, chunks, done }
}

/// The value of an unlabelled Prometheus sample `name` (None if absent).
pub fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

pub const COMPLETIONS: &str = "/v1/completions";
pub const CHAT: &str = "/v1/chat/completions";

/// `base` with `patch`'s fields set (a null value removes the field).
pub fn with(base: &Value, patch: Value) -> Value {
    let mut v = base.clone();
    for (k, x) in patch.as_object().expect("a patch object") {
        if x.is_null() {
            v.as_object_mut().expect("an object").remove(k);
        } else {
            v[k] = x.clone();
        }
    }
    v
}

pub fn completion(prompt: &str, max_tokens: usize) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

pub fn chat(user: &str, max_tokens: usize) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": user}], "max_tokens": max_tokens,
           "temperature": 0, "ignore_eos": true})
}

/// The reply's text (completions or chat).
pub fn text_of(v: &Value) -> String {
    let c = &v["choices"][0];
    c["text"].as_str().or_else(|| c["message"]["content"].as_str()).expect("a text").to_string()
}

pub fn sha_of(v: &Value) -> String {
    v["tensorfold"]["token_sha256"].as_str().expect("the tensorfold block").to_string()
}

/// The reply's error object has exactly the OpenAI keys.
pub fn assert_error_object(r: &Reply, what: &str) {
    let e = r.json["error"].as_object().unwrap_or_else(|| panic!("{what}: no error object in {}", r.text));
    let mut keys: Vec<&str> = e.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["code", "message", "param", "type"], "{what}: {}", r.text);
    assert!(!e["message"].as_str().unwrap_or_default().is_empty(), "{what}: an empty message");
}
