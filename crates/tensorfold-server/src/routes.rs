//! The OpenAI routes: completions and chat (JSON and SSE), models, tokenize/detokenize, health, metrics.

use crate::api::{self, Params, Prompt};
use crate::error::ApiError;
use crate::generate::{LogprobEntry, Outcome, Piece, Running, start};
use crate::state::{AppState, Ready};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::convert::Infallible;
use tensorfold_engine::keyed::token_sha256;
use tensorfold_model::text::TextError;
use tokio_stream::wrappers::UnboundedReceiverStream;

fn ready(s: &AppState) -> Result<Ready, ApiError> {
    s.ready
        .get()
        .cloned()
        .ok_or_else(|| ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "server_error", "the model is still loading"))
}

fn body(b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    b.map_err(|e| ApiError::status(e.status(), "invalid_request_error", format!("request body: {e}")))
}

fn check_model(s: &AppState, p: &Params) -> Result<(), ApiError> {
    match &p.model {
        Some(m) if *m != s.model_name => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{m}` does not exist; this server serves `{}`", s.model_name),
            kind: "not_found_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }),
        _ => Ok(()),
    }
}

fn text_err(e: TextError) -> ApiError {
    match e {
        TextError::NoTokenizer => ApiError::bad_request("this model has no tokenizer; send the prompt as token ids"),
        TextError::NoChatTemplate => ApiError::bad_request("this model has no chat template; use /v1/completions"),
        TextError::EmptyPrompt => ApiError::invalid("prompt", "the prompt has zero tokens"),
        other => ApiError::bad_request(other.to_string()),
    }
}

/// Runs tokenizer work on the blocking pool.
async fn blocking(f: impl FnOnce() -> Result<Vec<u32>, TextError> + Send + 'static) -> Result<Vec<u32>, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string()))?
        .map_err(text_err)
}

/// `POST /v1/completions`.
pub async fn completions(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Response {
    respond(s, b, false).await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Response {
    respond(s, b, true).await.unwrap_or_else(IntoResponse::into_response)
}

async fn respond(s: AppState, b: Result<Bytes, BytesRejection>, chat: bool) -> Result<Response, ApiError> {
    let r = ready(&s)?;
    let o = api::object(&body(b)?)?;
    let params = api::params(&o, chat)?;
    check_model(&s, &params)?;
    // Templating and tokenizing a long prompt take milliseconds: keep them off the async workers.
    let text = r.text.clone();
    let need_text = || text.clone().ok_or_else(|| text_err(TextError::NoTokenizer));
    let ids = if chat {
        let (msgs, text) = (api::messages(&o)?, need_text()?);
        blocking(move || text.encode_chat(&msgs, true)).await?
    } else {
        match api::prompt(&o)? {
            Prompt::Ids(ids) => ids,
            Prompt::Text(t) => {
                let text = need_text()?;
                blocking(move || text.encode_prompt(&t)).await?
            }
        }
    };
    let prompt_tokens = ids.len() as u64;
    let running = start(&r, ids, params.clone()).await?;
    metrics::counter!("tensorfold_prompt_tokens_total").increment(prompt_tokens);
    let shape = Shape {
        chat,
        model: s.model_name.clone(),
        id: format!("{}-{}", if chat { "chatcmpl" } else { "cmpl" }, rand::random::<u64>()),
        created: now(),
    };
    if params.stream {
        return Ok(stream(running, shape, params.include_usage).into_response());
    }
    let mut pieces = Vec::new();
    let out = running.drive(|p| {
        pieces.push(p);
        true
    });
    let out = out
        .await
        .ok_or_else(|| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the reply was lost"))?;
    if let Some(e) = &out.error {
        let status =
            if r.engine.is_alive() { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::SERVICE_UNAVAILABLE };
        return Err(ApiError::status(status, "server_error", e.clone()));
    }
    metrics::counter!("tensorfold_generation_tokens_total").increment(out.tokens.len() as u64);
    let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
    let lps: Vec<LogprobEntry> = pieces.into_iter().flat_map(|p| p.logprobs).collect();
    let logprobs = params.logprobs.map(|_| shape.logprobs(&lps, 0));
    let choice = if chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": out.finish_reason})
    } else {
        json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": out.finish_reason})
    };
    let mut v = shape.head();
    v["choices"] = json!([choice]);
    v["usage"] = usage(&out);
    v["tensorfold"] = engine_block(&out);
    Ok(Json(v).into_response())
}

/// What identifies a reply in every chunk.
struct Shape {
    chat: bool,
    model: String,
    id: String,
    created: u64,
}

impl Shape {
    fn head(&self) -> Value {
        let object = match self.chat {
            true => "chat.completion",
            false => "text_completion",
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model})
    }

    fn chunk(&self, choice: Value) -> Value {
        let mut v = self.head();
        if self.chat {
            v["object"] = json!("chat.completion.chunk");
        }
        v["choices"] = json!([choice]);
        v
    }

    /// Logprobs in the route's shape; `offset` is the text offset of the first entry (completions).
    fn logprobs(&self, lps: &[LogprobEntry], offset: usize) -> Value {
        if self.chat {
            let content: Vec<Value> = lps
                .iter()
                .map(|e| {
                    let top: Vec<Value> =
                        e.top.iter().map(|(t, b, p)| json!({"token": t, "logprob": p, "bytes": b})).collect();
                    json!({"token": e.token, "logprob": e.logprob, "bytes": e.bytes, "top_logprobs": top})
                })
                .collect();
            return json!({"content": content});
        }
        let mut at = offset;
        let offsets: Vec<usize> = lps
            .iter()
            .map(|e| {
                let o = at;
                at += e.token.len();
                o
            })
            .collect();
        let top: Vec<Value> =
            lps.iter().map(|e| Value::Object(e.top.iter().map(|(t, _, p)| (t.clone(), json!(p))).collect())).collect();
        json!({
            "tokens": lps.iter().map(|e| e.token.clone()).collect::<Vec<_>>(),
            "token_logprobs": lps.iter().map(|e| e.logprob).collect::<Vec<_>>(),
            "top_logprobs": top,
            "text_offset": offsets,
        })
    }
}

fn usage(o: &Outcome) -> Value {
    json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.tokens.len(),
        "total_tokens": o.prompt_tokens + o.tokens.len(),
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
    })
}

fn engine_block(o: &Outcome) -> Value {
    json!({
        "token_sha256": token_sha256(&o.tokens),
        "drafted": o.drafted,
        "accepted": o.accepted,
        "verify_windows": o.windows,
        "accepted_by_position": o.accepted_at,
        "mean_accepted_length": o.mean_accepted_length(),
        "draft_error": o.draft_error,
        "seed": o.seed
    })
}

/// An SSE reply: a chunk per released piece, the finish chunk, the usage chunk if asked, `[DONE]`.
fn stream(running: Running, shape: Shape, include_usage: bool) -> impl IntoResponse {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
    tokio::spawn(async move {
        let send = |v: Value| tx.send(Ok(SseEvent::default().data(v.to_string()))).is_ok();
        if shape.chat && !send(shape.chunk(json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}))) {
            return;
        }
        let want_lp = running.wants_logprobs();
        let mut offset = 0;
        let driving = running.drive(|p: Piece| {
            let lp = want_lp.then(|| shape.logprobs(&p.logprobs, offset));
            offset += p.logprobs.iter().map(|e| e.token.len()).sum::<usize>();
            let choice = if shape.chat {
                json!({"index": 0, "delta": {"content": p.text}, "logprobs": lp, "finish_reason": null})
            } else {
                json!({"index": 0, "text": p.text, "logprobs": lp, "finish_reason": null})
            };
            send(shape.chunk(choice))
        });
        // A client that leaves while nothing is being sent (a long prefill, text held back) is noticed at once:
        // dropping the reply cancels its engine stream.
        let out = tokio::select! {
            out = driving => out,
            _ = tx.closed() => None,
        };
        let Some(out) = out else { return };
        if let Some(e) = &out.error {
            let err = ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.clone());
            send(err.body());
        } else {
            metrics::counter!("tensorfold_generation_tokens_total").increment(out.tokens.len() as u64);
            let choice = if shape.chat {
                json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": out.finish_reason})
            } else {
                json!({"index": 0, "text": "", "logprobs": null, "finish_reason": out.finish_reason})
            };
            let mut last = shape.chunk(choice);
            last["tensorfold"] = engine_block(&out);
            send(last);
            if include_usage {
                let mut u = shape.chunk(json!(null));
                u["choices"] = json!([]);
                u["usage"] = usage(&out);
                send(u);
            }
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
    });
    Sse::new(UnboundedReceiverStream::new(rx)).keep_alive(KeepAlive::default())
}

/// `GET /v1/models`.
pub async fn models(State(s): State<AppState>) -> Json<Value> {
    let max = s.ready.get().map(|r| r.context);
    Json(
        json!({"object": "list", "data": [{"id": s.model_name, "object": "model", "created": s.created, "owned_by": "tensorfold", "max_model_len": max}]}),
    )
}

/// `POST /tokenize`: `{"prompt": text}` or `{"messages": [...]}` (with `add_special_tokens`, default true for prompts).
pub async fn tokenize(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let r = ready(&s)?;
    let o = api::object(&body(b)?)?;
    let text = r.text.as_ref().ok_or_else(|| text_err(TextError::NoTokenizer))?;
    let ids = if o.contains_key("messages") {
        text.encode_chat(&api::messages(&o)?, o.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(true))
            .map_err(text_err)?
    } else {
        let p = o
            .get("prompt")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid("prompt", "`prompt` must be a string"))?;
        let special = o.get("add_special_tokens").and_then(Value::as_bool).unwrap_or(true);
        text.encode(p, special).map_err(text_err)?
    };
    Ok(Json(json!({"tokens": ids, "count": ids.len(), "max_model_len": r.context})))
}

/// `POST /detokenize`: `{"tokens": [ids]}`.
pub async fn detokenize(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let r = ready(&s)?;
    let o = api::object(&body(b)?)?;
    let ids = match api::prompt(&serde_json::Map::from_iter([(
        "prompt".to_string(),
        o.get("tokens").cloned().unwrap_or(Value::Null),
    )])) {
        Ok(Prompt::Ids(ids)) => ids,
        _ => return Err(ApiError::invalid("tokens", "`tokens` must be a list of token ids")),
    };
    let text = r.text.as_ref().ok_or_else(|| text_err(TextError::NoTokenizer))?;
    Ok(Json(json!({"prompt": text.decode(&ids, false).map_err(|e| ApiError::invalid("tokens", e.to_string()))?})))
}

/// `GET /health`: 200 once the model is loaded, 503 before.
pub async fn health(State(s): State<AppState>) -> Response {
    match s.ready.get() {
        Some(r) if !r.engine.is_alive() => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "engine stopped"}))).into_response()
        }
        Some(_) => (StatusCode::OK, Json(json!({"status": "ok"}))).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "loading"}))).into_response(),
    }
}

/// `GET /metrics`: Prometheus text, every name prefixed `tensorfold_`.
pub async fn metrics_route(State(s): State<AppState>) -> Response {
    if let Some(r) = s.ready.get() {
        let m = r.engine.metrics();
        metrics::gauge!("tensorfold_requests_running").set(m.running as f64);
        metrics::gauge!("tensorfold_requests_waiting").set(m.waiting as f64);
        metrics::gauge!("tensorfold_kv_bytes_in_use").set(m.state_bytes as f64);
        metrics::gauge!("tensorfold_memory_reserved_bytes").set(m.reserved_bytes as f64);
        metrics::gauge!("tensorfold_prompt_cache_bytes").set(m.cache_bytes as f64);
        metrics::counter!("tensorfold_prompt_cache_queries_total").absolute(m.cache.queries);
        metrics::counter!("tensorfold_prompt_cache_hits_total").absolute(m.cache.hits);
        metrics::counter!("tensorfold_prompt_cache_reused_tokens_total").absolute(m.cache.reused_tokens);
        metrics::counter!("tensorfold_rounds_total").absolute(m.rounds);
        // Cumulative seconds (monotonic; exported as gauges because the counter type holds integers).
        metrics::gauge!("tensorfold_round_seconds_total").set(m.round_seconds);
        metrics::gauge!("tensorfold_forward_seconds_total").set(m.forward_seconds);
        metrics::counter!("tensorfold_drafted_tokens_total").absolute(m.drafted_tokens);
        metrics::counter!("tensorfold_accepted_tokens_total").absolute(m.accepted_tokens);
        metrics::counter!("tensorfold_draft_windows_total").absolute(m.draft_windows);
        metrics::counter!("tensorfold_held_draft_windows_total").absolute(m.held_windows);
        for (k, n) in m.accepted_at.iter().enumerate() {
            metrics::counter!("tensorfold_accepted_by_position_total", "position" => k.to_string()).absolute(*n);
        }
        for (d, (weights, high)) in r.devices.as_ref().map(|f| f()).unwrap_or_default().into_iter().enumerate() {
            let device = d.to_string();
            metrics::gauge!("tensorfold_device_weight_bytes", "device" => device.clone()).set(weights as f64);
            if let Some((alloc, reserved)) = high {
                metrics::gauge!("tensorfold_device_memory_high_bytes", "device" => device.clone()).set(alloc as f64);
                metrics::gauge!("tensorfold_device_memory_reserved_high_bytes", "device" => device)
                    .set(reserved as f64);
            }
        }
        if m.draft_windows > 0 {
            let mean = tensorfold_engine::request::mean_accepted_length(m.accepted_tokens, m.draft_windows);
            metrics::gauge!("tensorfold_mean_accepted_length").set(mean);
        }
    }
    ([("content-type", "text/plain; version=0.0.4")], s.prometheus.render()).into_response()
}

/// Any other route.
pub async fn not_found() -> ApiError {
    ApiError::status(StatusCode::NOT_FOUND, "not_found_error", "no such route")
}

/// A known route with the wrong method (e.g. `GET /v1/completions`).
pub async fn method_not_allowed() -> ApiError {
    ApiError::status(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "this route does not take that method")
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
