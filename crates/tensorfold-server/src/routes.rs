//! The OpenAI routes: completions and chat (JSON and SSE), models, tokenize/detokenize, health, metrics.

use crate::access_log::Entry;
use crate::answer::Answer;
use crate::api::{self, Params, Prompt};
use crate::completion::{LogprobEntry, Piece, Running, submit};
use crate::error::ApiError;
use crate::protocol::{
    ChatCompletionRequest, CompletionRequest, DetokenizeRequest, DetokenizeResponse, Field, HealthResponse, ModelList,
    TokenizeRequest, TokenizeResponse,
};
use crate::reply::{PieceChunks, Shape};
use crate::shutdown::{Shutdown, stopped_error};
use crate::state::{AppState, Ready};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use std::convert::Infallible;
use tensorfold_text::TextError;
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

/// A text error's answer: the request's or its template's doing is a 400 (a render worker killed for memory or
/// time included: the template made it so); a render worker that cannot be started is this server's fault, a 503
/// with `Retry-After` (a host out of processes or memory may recover; an upgraded binary needs a restart).
fn text_err(e: TextError) -> ApiError {
    match e {
        TextError::NoTokenizer => ApiError::bad_request("this model has no tokenizer; send the prompt as token ids"),
        TextError::NoChatTemplate => ApiError::bad_request("this model has no chat template; use /v1/completions"),
        TextError::EmptyPrompt => ApiError::invalid("prompt", "the prompt has zero tokens"),
        e @ TextError::TemplateWorkerStart(_) => {
            ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "server_error", e.to_string())
                .with_code("render_worker_unavailable")
        }
        other => ApiError::bad_request(other.to_string()),
    }
}

/// Runs tokenizer work over `bytes` bytes of text in the bounded text pool (off the async workers).
async fn blocking(
    s: &AppState,
    bytes: usize,
    f: impl FnOnce() -> Result<Vec<u32>, TextError> + Send + 'static,
) -> Result<Vec<u32>, ApiError> {
    s.text_pool.run(bytes, f).await?.map_err(text_err)
}

/// `POST /v1/completions`.
pub async fn completions(State(s): State<AppState>, log: Entry, b: Result<Bytes, BytesRejection>) -> Response {
    complete(s, log, b).await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(s): State<AppState>, log: Entry, b: Result<Bytes, BytesRejection>) -> Response {
    complete_chat(s, log, b).await.unwrap_or_else(IntoResponse::into_response)
}

async fn complete(s: AppState, log: Entry, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let r = ready(&s)?;
    let b = body(b)?;
    log.body(&b);
    let req: CompletionRequest = api::request(&b)?;
    let params = api::completion_params(&req)?;
    check_model(&s, &params)?;
    let prompt = api::prompt(&req.prompt)?;
    let echo = crate::echo::echo_text(&s, &r, &prompt, params.echo).await?;
    let ids = match prompt {
        Prompt::Ids(ids) => ids,
        Prompt::Text(t) => {
            let text = r.text.clone().ok_or_else(|| text_err(TextError::NoTokenizer))?;
            // Tokenizing a long prompt takes milliseconds: keep it off the async workers.
            blocking(&s, t.len(), move || text.encode_prompt(&t)).await?
        }
    };
    respond(s, r, ids, params, Answer { chat: false, echo, log }).await
}

async fn complete_chat(s: AppState, log: Entry, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let r = ready(&s)?;
    let b = body(b)?;
    log.body(&b);
    // The text pool's weight: the body's length bounds content, tools and history calls together.
    let bytes = b.len();
    let req: ChatCompletionRequest = api::request(&b)?;
    let mut params = api::chat_params(&req)?;
    check_model(&s, &params)?;
    let msgs = api::messages(&req.messages)?;
    let text = r.text.clone().ok_or_else(|| text_err(TextError::NoTokenizer))?;
    crate::tools::prepare(&mut params, &text)?;
    let functions = params.tools.as_ref().map(|t| t.functions.clone());
    // Templating and tokenizing a long chat take milliseconds: keep them off the async workers.
    let ids = blocking(&s, bytes, move || text.encode_chat_with_tools(&msgs, true, functions.as_deref())).await?;
    respond(s, r, ids, params, Answer { chat: true, echo: None, log }).await
}

/// Submits the prompt and answers: an SSE stream, or the whole reply once it has finished.
async fn respond(s: AppState, r: Ready, ids: Vec<u32>, params: Params, a: Answer) -> Result<Response, ApiError> {
    if params.best_of > 1 {
        return crate::fanout::respond(s, r, ids, params, a).await;
    }
    let prompt_tokens = ids.len() as u64;
    let running = tokio::select! {
        running = submit(&r, ids, params.clone()) => running?,
        _ = s.shutdown.cancelled() => return Err(stopped_error("the request was cancelled")),
    };
    metrics::counter!("tensorfold_prompt_tokens_total").increment(prompt_tokens);
    let shape = a.shape(s.model_name.clone());
    if params.stream {
        let tools = crate::tools::StreamTools::new(params.tools.as_ref());
        return Ok(stream(running, shape, (params.include_usage, tools), s.shutdown.clone(), a.log).into_response());
    }
    let mut pieces = Vec::new();
    let out = running.drive(|p| {
        pieces.push(p);
        true
    });
    let out = tokio::select! {
        out = out => out,
        _ = s.shutdown.cancelled() => return Err(stopped_error("the request was cancelled")),
    };
    let out =
        out.ok_or_else(|| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the reply was lost"))?;
    if out.error.is_some() {
        a.log.outcome(&out);
    }
    if let Some(e) = &out.error {
        // The engine gone without finishing the stream is shutdown (503) even before its alive flag drops.
        if out.stopped || !r.engine.is_alive() {
            return Err(stopped_error(e));
        }
        return Err(ApiError::stream_failed(e.clone(), out.out_of_memory));
    }
    metrics::counter!("tensorfold_generation_tokens_total").increment(out.tokens.len() as u64);
    let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
    let lps: Vec<LogprobEntry> = pieces.into_iter().flat_map(|p| p.logprobs).collect();
    let logprobs = params.logprobs.map(|_| lps.as_slice());
    let mut reply = shape.reply(text, logprobs, &out);
    if let Some(plan) = params.tools.as_ref().filter(|p| p.parses()) {
        crate::tools::apply(&mut reply, plan);
    }
    let mut logged = out;
    logged.finish_reason = reply.finish_reason().unwrap_or(logged.finish_reason);
    a.log.outcome(&logged);
    Ok(Json(reply).into_response())
}

/// An SSE reply: a chunk per released piece (content, or tool calls: `tools`), the finish chunk, the usage chunk if
/// asked, `[DONE]`.
fn stream(
    running: Running,
    shape: Shape,
    (include_usage, mut tools): (bool, Option<crate::tools::StreamTools>),
    shutdown: Shutdown,
    log: Entry,
) -> impl IntoResponse {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
    tokio::spawn(async move {
        let send = |data: String| tx.send(Ok(SseEvent::default().data(data))).is_ok();
        if let Some(first) = shape.first_chunk()
            && !send(first.to_json())
        {
            return;
        }
        let mut pieces = PieceChunks::new(running.wants_logprobs());
        let driving = running.drive(|p: Piece| pieces.of(&shape, tools.as_mut(), p).iter().all(|c| send(c.to_json())));
        // A client that leaves while nothing is being sent (a long prefill, text held back) is noticed at once:
        // dropping the reply cancels its engine stream.
        let out = tokio::select! {
            out = driving => out,
            _ = tx.closed() => None,
            _ = shutdown.cancelled() => {
                log.failed(StatusCode::SERVICE_UNAVAILABLE);
                send(stopped_error("the request was cancelled").to_json());
                let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
                return;
            }
        };
        let Some(mut out) = out else { return };
        // A failed stream ends with its error: held text or calls are not sent before it.
        if let Some(t) = tools.as_mut().filter(|_| out.error.is_none()) {
            for c in t.finish(&shape) {
                send(c.to_json());
            }
            out.finish_reason = if t.called() { "tool_calls" } else { out.finish_reason };
        }
        log.outcome(&out);
        if let Some(e) = &out.error {
            let err =
                if out.stopped { stopped_error(e) } else { ApiError::stream_failed(e.clone(), out.out_of_memory) };
            log.failed(err.status);
            send(err.to_json());
        } else {
            metrics::counter!("tensorfold_generation_tokens_total").increment(out.tokens.len() as u64);
            send(shape.finish_chunk(&out).to_json());
            if include_usage {
                send(shape.usage_chunk(&out).to_json());
            }
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
    });
    Sse::new(UnboundedReceiverStream::new(rx)).keep_alive(KeepAlive::default())
}

/// `GET /v1/models`.
pub async fn models(State(s): State<AppState>) -> Json<ModelList> {
    Json(ModelList { object: "list", data: vec![crate::models_route::card(&s)] })
}

/// `POST /tokenize`: `{"prompt": text}` or `{"messages": [...]}` (with `add_special_tokens`, default true for prompts).
pub async fn tokenize(
    State(s): State<AppState>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let r = ready(&s)?;
    let req: TokenizeRequest = api::request(&body(b)?)?;
    let text = r.text.clone().ok_or_else(|| text_err(TextError::NoTokenizer))?;
    let ids = match &req.messages {
        Some(messages) => {
            let msgs = api::messages(messages)?;
            let bytes = msgs.iter().map(|m| m.content.byte_len()).sum();
            let generation = req.add_generation_prompt.given_or(true);
            blocking(&s, bytes, move || text.encode_chat(&msgs, generation)).await?
        }
        None => {
            let Field::Given(p) = req.prompt else {
                return Err(ApiError::invalid("prompt", "`prompt` must be a string"));
            };
            let special = req.add_special_tokens.given_or(true);
            blocking(&s, p.len(), move || text.encode(&p, special)).await?
        }
    };
    Ok(Json(TokenizeResponse { count: ids.len(), tokens: ids, max_model_len: r.context }))
}

/// `POST /detokenize`: `{"tokens": [ids]}`.
pub async fn detokenize(
    State(s): State<AppState>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let r = ready(&s)?;
    let req: DetokenizeRequest = api::request(&body(b)?)?;
    let Ok(Prompt::Ids(ids)) = api::prompt(&req.tokens) else {
        return Err(ApiError::invalid("tokens", "`tokens` must be a list of token ids"));
    };
    let text = r.text.clone().ok_or_else(|| text_err(TextError::NoTokenizer))?;
    // A token's text is at most a few bytes a byte of id list: weigh it as the id count.
    let decoded = s.text_pool.run(ids.len() * 4, move || text.decode(&ids, false)).await?;
    let prompt = decoded.map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(Json(DetokenizeResponse { prompt }))
}

/// `GET /health`: 200 once the model is loaded, 503 before.
pub async fn health(State(s): State<AppState>) -> Response {
    let (code, status) = match s.ready.get() {
        Some(r) if !r.engine.is_alive() => (StatusCode::SERVICE_UNAVAILABLE, "engine stopped"),
        Some(_) => (StatusCode::OK, "ok"),
        None => (StatusCode::SERVICE_UNAVAILABLE, "loading"),
    };
    let mut r = (code, Json(HealthResponse { status })).into_response();
    if code == StatusCode::SERVICE_UNAVAILABLE {
        let secs = axum::http::HeaderValue::from(crate::error::RETRY_AFTER_SECS);
        r.headers_mut().insert(axum::http::header::RETRY_AFTER, secs);
    }
    r
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_render_worker_that_cannot_start_is_a_503_and_a_template_that_kills_one_a_400() {
        let e = text_err(TextError::TemplateWorkerStart("/proc/self/exe: No such file or directory".into()));
        assert_eq!(
            (e.status, e.kind, e.code),
            (StatusCode::SERVICE_UNAVAILABLE, "server_error", Some("render_worker_unavailable"))
        );
        assert_eq!(e.message, "cannot start a chat-template render worker: /proc/self/exe: No such file or directory");
        assert_eq!(e.retry_after(), Some(crate::error::RETRY_AFTER_SECS));
        for template in [
            TextError::TemplateWorker("the render process ended (signal: 6 (SIGABRT))".into()),
            TextError::TemplateTime { limit_ms: 2000 },
            TextError::Template("raise_exception: no".into()),
        ] {
            let e = text_err(template);
            assert_eq!((e.status, e.kind, e.code), (StatusCode::BAD_REQUEST, "invalid_request_error", None));
            assert!(e.message.starts_with("chat template: "), "{}", e.message);
        }
    }
}
