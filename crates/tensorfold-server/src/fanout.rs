//! Replies with `n` > 1 choices: `n` engine streams of one prompt sharing one prefill (`submit_n`), choice `i` keyed
//! by seed `seed + i`. A whole reply lists the choices by index, sums `completion_tokens` over them (the prompt
//! counted once, as OpenAI and vLLM count it) and adds `tensorfold.choices` (each choice's engine block; the
//! top-level block is choice 0's); a stream sends every choice's first chunk in index order (the official client
//! appends choices as they first appear), then interleaves the choices' chunks, each carrying its `index`, each
//! choice's finish chunk its own engine block, then one usage chunk and `[DONE]`. With tools, each choice reads its
//! own calls from its own text (whole, or streamed as its own deltas).

use crate::access_log::Entry;
use crate::answer::Answer;
use crate::api::Params;
use crate::completion::{LogprobEntry, Outcome, Piece, Running, submit_n};
use crate::error::ApiError;
use crate::reply::{Chunk, PieceChunks, Shape, engine_stats, usage};
use crate::shutdown::stopped_error;
use crate::state::{AppState, Ready};
use axum::Json;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::convert::Infallible;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// Submits the `params.n` choices and answers: one SSE stream of them all, or the whole reply once every choice
/// has finished.
pub async fn respond(s: AppState, r: Ready, ids: Vec<u32>, params: Params, a: Answer) -> Result<Response, ApiError> {
    if params.best_of > params.n {
        return crate::best_of::respond(s, r, ids, params, a).await;
    }
    let prompt_tokens = ids.len() as u64;
    let runs = submit_n(&r, ids, params.clone(), params.n).await?;
    metrics::counter!("tensorfold_prompt_tokens_total").increment(prompt_tokens);
    let shape = a.shape(s.model_name.clone());
    if params.stream {
        return Ok(stream(runs, shape, &params, a.log).into_response());
    }
    let choices = collect(&r, runs, &a.log).await?;
    Ok(Json(merge(&shape, &params, choices, &a.log)).into_response())
}

/// Every run's pieces and outcome, in order, once all have finished; a failed run fails the reply (logged).
pub(crate) async fn collect(
    r: &Ready,
    runs: Vec<Running>,
    log: &Entry,
) -> Result<Vec<(Vec<Piece>, Outcome)>, ApiError> {
    let mut choices = Vec::new();
    // The engine runs every stream at once; reading them one after another only orders the reads.
    for run in runs {
        let mut pieces = Vec::new();
        let out = run
            .drive(|p| {
                pieces.push(p);
                true
            })
            .await
            .ok_or_else(|| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the reply was lost"))?;
        if let Some(e) = &out.error {
            log.outcome(&out);
            // The engine gone without finishing the stream is shutdown (503), as for one choice (routes.rs).
            if out.stopped || !r.engine.is_alive() {
                return Err(stopped_error(e));
            }
            return Err(ApiError::stream_failed(e.clone(), out.out_of_memory));
        }
        metrics::counter!("tensorfold_generation_tokens_total").increment(out.tokens.len() as u64);
        choices.push((pieces, out));
    }
    Ok(choices)
}

/// The whole reply of several choices: choice `i`'s reply with its index (its own tool calls read from its own
/// text), the choices together, the usage summed; each choice logged with its finish reason.
pub(crate) fn merge(shape: &Shape, params: &Params, choices: Vec<(Vec<Piece>, Outcome)>, log: &Entry) -> Value {
    let mut merged = Value::Null;
    let (mut list, mut stats, mut completion_tokens) = (Vec::new(), Vec::new(), 0);
    for (i, (pieces, out)) in choices.into_iter().enumerate() {
        let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
        let lps: Vec<LogprobEntry> = pieces.into_iter().flat_map(|p| p.logprobs).collect();
        let mut reply = shape.reply(text, params.logprobs.map(|_| lps.as_slice()), &out);
        if let Some(plan) = params.tools.as_ref().filter(|p| p.parses()) {
            crate::tools::apply(&mut reply, plan);
        }
        log.outcome(&Outcome { finish_reason: reply.finish_reason().unwrap_or(out.finish_reason), ..out.clone() });
        let mut reply = serde_json::to_value(reply).expect("a reply has string keys only, so it always serializes");
        completion_tokens += out.tokens.len();
        stats.push(serde_json::to_value(engine_stats(&out)).expect("string keys"));
        if let Some(Value::Array(c)) = reply.get_mut("choices") {
            c.iter_mut().for_each(|c| c["index"] = json!(i));
            list.append(c);
        }
        if i == 0 {
            merged = reply;
        }
    }
    merged["choices"] = Value::Array(list);
    merged["tensorfold"]["choices"] = Value::Array(stats);
    let prompt_tokens = merged["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize;
    merged["usage"]["completion_tokens"] = json!(completion_tokens);
    merged["usage"]["total_tokens"] = json!(prompt_tokens + completion_tokens);
    merged
}

/// A chunk's JSON with every choice's `index` set to `i`.
fn indexed(chunk: Chunk, i: usize) -> String {
    let mut v = serde_json::to_value(&chunk).expect("a chunk has string keys only, so it always serializes");
    if let Some(Value::Array(c)) = v.get_mut("choices") {
        c.iter_mut().for_each(|c| c["index"] = json!(i));
    }
    v.to_string()
}

/// An SSE reply of several choices: every choice's first chunk in index order, then each choice's chunks as its
/// stream releases them (pieces, or its own tool-call deltas, indexed within the choice; its finish chunk), then
/// the usage chunk if asked (completion tokens summed) and `[DONE]`. A choice that fails ends the reply as one
/// choice's stream ends (its error event, then `[DONE]`) and cancels the others; so does a client that leaves.
fn stream(runs: Vec<Running>, shape: Shape, params: &Params, log: Entry) -> impl IntoResponse {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
    let include_usage = params.include_usage;
    if let Some(first) = shape.first_chunk() {
        for i in 0..runs.len() {
            let _ = tx.send(Ok(SseEvent::default().data(indexed(first.clone(), i))));
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (i, running) in runs.into_iter().enumerate() {
        let (tx, shape, log) = (tx.clone(), shape.clone(), log.clone());
        let mut tools = crate::tools::StreamTools::new(params.tools.as_ref());
        tasks.spawn(async move {
            let send = |data: String| tx.send(Ok(SseEvent::default().data(data))).is_ok();
            let mut pieces = PieceChunks::new(running.wants_logprobs());
            let driving =
                running.drive(|p: Piece| pieces.of(&shape, tools.as_mut(), p).into_iter().all(|c| send(indexed(c, i))));
            let mut out = tokio::select! {
                out = driving => out,
                _ = tx.closed() => None,
            }
            .ok_or(None)?;
            if let Some(e) = &out.error {
                log.outcome(&out);
                let err =
                    if out.stopped { stopped_error(e) } else { ApiError::stream_failed(e.clone(), out.out_of_memory) };
                return Err(Some(err));
            }
            if let Some(t) = tools.as_mut() {
                for c in t.finish(&shape) {
                    send(indexed(c, i));
                }
                out.finish_reason = if t.called() { "tool_calls" } else { out.finish_reason };
            }
            log.outcome(&out);
            metrics::counter!("tensorfold_generation_tokens_total").increment(out.tokens.len() as u64);
            if send(indexed(shape.finish_chunk(&out), i)) { Ok((i, out)) } else { Err(None) }
        });
    }
    tokio::spawn(async move {
        let mut outs = Vec::new();
        while let Some(done) = tasks.join_next().await {
            // A failed choice (its error), an abandoned one (none) or a panicked task ends the reply at once, as one
            // choice's would: the others are cancelled and waited for (their engine streams end with them), so
            // the one error event and `[DONE]` are the reply's last events.
            let error = match done {
                Ok(Ok(out)) => {
                    outs.push(out);
                    continue;
                }
                Ok(Err(error)) => error,
                Err(_) => Some(ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "a choice failed")),
            };
            tasks.shutdown().await;
            if let Some(e) = error {
                log.failed(e.status);
                let _ = tx.send(Ok(SseEvent::default().data(e.to_json())));
            }
            let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
            return;
        }
        outs.sort_by_key(|(i, _)| *i);
        let outs: Vec<_> = outs.into_iter().map(|(_, out)| out).collect();
        if include_usage && let Some(first) = outs.first() {
            let mut u = serde_json::to_value(shape.usage_chunk(first)).expect("string keys");
            let completion: usize = outs.iter().map(|o| o.tokens.len()).sum();
            u["usage"] = serde_json::to_value(usage(first)).expect("string keys");
            u["usage"]["completion_tokens"] = json!(completion);
            u["usage"]["total_tokens"] = json!(first.prompt_tokens + completion);
            let _ = tx.send(Ok(SseEvent::default().data(u.to_string())));
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
    });
    Sse::new(UnboundedReceiverStream::new(rx)).keep_alive(KeepAlive::default())
}
