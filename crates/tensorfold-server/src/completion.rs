//! One completion's life: submit it to the engine, then turn engine events into text pieces (UTF-8 safe
//! detokenizing, stop strings, logprobs), with the engine stream cancelled when the client goes away.

use crate::api::Params;
use crate::error::ApiError;
use crate::state::Ready;
use axum::http::StatusCode;
use std::time::Instant;
use tensorfold_engine::keyed::{SamplingParams, resolve_seed};
use tensorfold_engine::{EngineHandle, Event, FinishReason, Grammar, Request, RequestId, Sink, TokenLogprobs};
use tensorfold_text::{Detokenizer, TextError};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// A token's logprobs in text form.
#[derive(Clone, Debug, PartialEq)]
pub struct LogprobEntry {
    /// The token's text.
    pub token: String,
    /// The token's bytes (its text may be part of a multibyte character).
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// Top alternatives: (text, bytes, logprob).
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// Text released to the client, with the logprobs of the tokens consumed since the last piece.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Piece {
    /// Text (may be empty when only logprobs are released).
    pub text: String,
    /// Logprobs of the tokens behind it.
    pub logprobs: Vec<LogprobEntry>,
}

/// How a reply ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// `stop` or `length`.
    pub finish_reason: &'static str,
    /// Every committed token id (the reply's token hash is over these).
    pub tokens: Vec<u32>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the prompt cache.
    pub cached_tokens: usize,
    /// The seed every draw was keyed by.
    pub seed: u64,
    /// Draft tokens verified for this reply.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Verify windows that carried drafts.
    pub windows: usize,
    /// Windows whose draft k was accepted, by position k.
    pub accepted_at: Vec<usize>,
    /// An engine fault after the reply started (the stream failed; others go on).
    pub error: Option<String>,
    /// The engine went away without finishing the stream (shutting down): the answer is 503, not 500.
    pub stopped: bool,
    /// The stream failed for want of device memory then (the engine's `out_of_memory`): the answer is 503 with
    /// `Retry-After` (streamed: the last event, code `insufficient_memory`), not 500, since the same request may
    /// succeed later.
    pub out_of_memory: bool,
    /// The drafter's error for this reply, if it failed (the reply then finished without drafts).
    pub draft_error: Option<String>,
    /// When the first and the last token arrived (the access log's TTFT and decode rate).
    pub first_token_at: Option<Instant>,
    /// When the last token arrived.
    pub last_token_at: Option<Instant>,
}

impl Outcome {
    /// Copies the engine's draft counters (drafted, accepted, windows, acceptance by position).
    fn take_draft_stats(&mut self, stats: &tensorfold_engine::Stats) {
        (self.drafted, self.accepted, self.windows) = (stats.drafted, stats.accepted, stats.windows);
        self.accepted_at = stats.accepted_at.clone();
        self.draft_error = stats.draft_error.clone();
    }

    /// Mean accepted length: committed tokens per verify window with drafts (0 without drafts).
    pub fn mean_accepted_length(&self) -> f64 {
        tensorfold_engine::request::mean_accepted_length(self.accepted as u64, self.windows as u64)
    }
}

/// A submitted request whose events have not been read yet.
pub struct Running {
    rx: UnboundedReceiver<Event>,
    guard: CancelGuard,
    ready: Ready,
    params: Params,
    prompt_tokens: usize,
    seed: u64,
    started: Instant,
}

struct CancelGuard {
    engine: EngineHandle,
    id: RequestId,
    done: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.done {
            self.engine.cancel(self.id);
        }
    }
}

/// Checks the request against the context and submits it. Client mistakes come back as 4xx.
pub async fn submit(ready: &Ready, prompt: Vec<u32>, params: Params) -> Result<Running, ApiError> {
    Ok(submit_n(ready, prompt, params, 1).await?.remove(0))
}

/// Submits `n` streams of the prompt as one group sharing one prefill (`EngineHandle::submit_group`): stream `i`
/// is keyed by seed `seed + i` (wrapping), as vLLM derives its `n` children's seeds. `n` 1 submits one request.
pub async fn submit_n(ready: &Ready, prompt: Vec<u32>, params: Params, n: usize) -> Result<Vec<Running>, ApiError> {
    // Compiling a grammar can take milliseconds: keep it off the async workers.
    let (r, p, q) = (ready.clone(), prompt.clone(), params.clone());
    let (req, seed) = tokio::task::spawn_blocking(move || request(&r, &p, &q))
        .await
        .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string()))??;
    let seeds: Vec<u64> = (0..n as u64).map(|i| seed.wrapping_add(i)).collect();
    let reqs: Vec<Request> =
        seeds.iter().map(|&seed| Request { params: SamplingParams { seed, ..req.params }, ..req.clone() }).collect();
    let (sinks, rxs): (Vec<Sink>, Vec<_>) = (0..n)
        .map(|_| {
            let (tx, rx) = unbounded_channel();
            (Sink::new(move |e| tx.send(e).is_ok()), rx)
        })
        .unzip();
    let engine = ready.engine.clone();
    let ids = tokio::task::spawn_blocking(move || {
        if n == 1 {
            engine
                .submit_to(reqs.into_iter().next().expect("one"), sinks.into_iter().next().expect("one"))
                .map(|id| vec![id])
        } else {
            engine.submit_group(reqs, sinks)
        }
    })
    .await
    .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string()))??;
    let started = Instant::now();
    Ok(ids
        .into_iter()
        .zip(rxs)
        .zip(seeds)
        .map(|((id, rx), seed)| Running {
            rx,
            guard: CancelGuard { engine: ready.engine.clone(), id, done: false },
            ready: ready.clone(),
            params: params.clone(),
            prompt_tokens: prompt.len(),
            seed,
            started,
        })
        .collect())
}

/// The request's grammar compiled for the checkpoint's tokenizer (a 400 naming the field that sent it, with
/// llguidance's reason, when it does not compile).
fn grammar(ready: &Ready, params: &Params) -> Result<Option<Grammar>, ApiError> {
    let Some((field, spec)) = &params.grammar else { return Ok(None) };
    let text = ready.text.as_ref().ok_or_else(|| {
        ApiError::invalid(field, "structured output needs the checkpoint's tokenizer, and this model has none")
    })?;
    let env = text.grammar_env().map_err(|e| ApiError::invalid(field, e.to_string()))?;
    Grammar::compile(&env.factory, spec).map(Some).map_err(|e| ApiError::invalid(field, e.to_string()))
}

/// The engine request of a checked completion and its resolved seed.
fn request(ready: &Ready, prompt: &[u32], params: &Params) -> Result<(Request, u64), ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt has zero tokens"));
    }
    let room = ready.context.saturating_sub(prompt.len());
    let max_tokens = match params.max_tokens {
        Some(m) => m,
        None if room == 0 => {
            let msg = format!(
                "the prompt has {} tokens and the context is {} tokens; nothing is left to generate",
                prompt.len(),
                ready.context
            );
            return Err(ApiError::invalid("prompt", msg).with_code("context_length_exceeded"));
        }
        None => ready.default_max_tokens.min(room),
    };
    let seed = resolve_seed(params.seed);
    let sampling = SamplingParams {
        temperature: params.temperature,
        top_k: params.top_k,
        top_p: params.top_p,
        min_p: params.min_p,
        seed,
    };
    let req = Request {
        prompt: prompt.to_vec(),
        params: sampling,
        max_tokens,
        stop_ids: Vec::new(),
        ignore_eos: params.ignore_eos,
        logprobs: params.logprobs,
        draft: params.draft,
        penalties: params.penalties.clone(),
        grammar: grammar(ready, params)?,
    };
    Ok((req, seed))
}

impl Running {
    /// True when the request asked for logprobs.
    pub fn wants_logprobs(&self) -> bool {
        self.params.logprobs.is_some()
    }

    /// Reads the engine's events to the end, handing each released piece to `emit` (which returns false
    /// when the client is gone: the stream is then cancelled and `None` returned).
    pub async fn drive(mut self, mut emit: impl FnMut(Piece) -> bool) -> Option<Outcome> {
        let mut detok = self.ready.text.as_ref().map(|t| Detokenizer::new(t.clone(), true));
        let mut stops = crate::stops::StopMatcher::new(self.params.stop.clone());
        let mut out = Outcome {
            finish_reason: "length",
            tokens: Vec::new(),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: 0,
            seed: self.seed,
            drafted: 0,
            accepted: 0,
            windows: 0,
            accepted_at: Vec::new(),
            error: None,
            stopped: false,
            out_of_memory: false,
            draft_error: None,
            first_token_at: None,
            last_token_at: None,
        };
        let (mut pending, mut lps) = (Vec::new(), Vec::new());
        let mut last = self.started;
        while let Some(ev) = self.rx.recv().await {
            match ev {
                Event::Prefilled { cached_tokens } => out.cached_tokens = cached_tokens,
                Event::Logprobs(lp) => pending.push(lp),
                Event::Token(t) => {
                    let now = Instant::now();
                    let name = if out.tokens.is_empty() {
                        "tensorfold_time_to_first_token_seconds"
                    } else {
                        "tensorfold_inter_token_latency_seconds"
                    };
                    metrics::histogram!(name).record((now - last).as_secs_f64());
                    last = now;
                    out.first_token_at.get_or_insert(now);
                    out.last_token_at = Some(now);
                    out.tokens.push(t);
                    let piece = match detok.as_mut().map(|d| d.push(t)) {
                        Some(Ok(p)) => p,
                        // A vocabulary padded past the tokenizer: the id has no text (as vLLM renders it).
                        Some(Err(TextError::UnknownToken(_))) => String::new(),
                        Some(Err(e)) => {
                            out.error = Some(format!("token {t} cannot be detokenized: {e}"));
                            return Some(out);
                        }
                        None => String::new(),
                    };
                    let piece = crate::tools::visible(&self.params, t, piece);
                    lps.extend(pending.drain(..).map(|lp| self.entry(&lp)));
                    let (text, stopped) = stops.push(&piece);
                    if (!text.is_empty() || !lps.is_empty())
                        && !emit(Piece { text, logprobs: std::mem::take(&mut lps) })
                    {
                        return None;
                    }
                    if stopped {
                        out.finish_reason = "stop";
                        self.finish_early(&mut out).await;
                        return Some(out);
                    }
                }
                Event::Finished { reason, error, out_of_memory, stats } => {
                    out.take_draft_stats(&stats);
                    self.guard.done = true;
                    let tail = detok.take().map(|d| d.finish()).unwrap_or_default();
                    let (mut text, stopped) = stops.push(&tail);
                    if !stopped {
                        text += &stops.finish();
                    }
                    lps.extend(pending.drain(..).map(|lp| self.entry(&lp)));
                    if (!text.is_empty() || !lps.is_empty())
                        && !emit(Piece { text, logprobs: std::mem::take(&mut lps) })
                    {
                        return None;
                    }
                    out.finish_reason = match reason {
                        FinishReason::Length if !stopped => "length",
                        _ => "stop",
                    };
                    if reason == FinishReason::Error {
                        out.error = Some(error.unwrap_or_else(|| "the stream failed".into()));
                        out.out_of_memory = out_of_memory;
                    }
                    return Some(out);
                }
            }
        }
        out.error = Some("the engine stopped".into());
        out.stopped = true;
        Some(out)
    }

    /// Cancels the engine stream after a stop string and reads its final counters (drafted, accepted).
    async fn finish_early(&mut self, out: &mut Outcome) {
        self.guard.engine.cancel(self.guard.id);
        while let Some(ev) = self.rx.recv().await {
            if let Event::Finished { stats, .. } = ev {
                out.take_draft_stats(&stats);
                break;
            }
        }
        self.guard.done = true;
    }

    fn entry(&self, lp: &TokenLogprobs) -> LogprobEntry {
        let text = |id: u32| -> (String, Vec<u8>) {
            let s =
                self.ready.text.as_ref().and_then(|t| t.decode(&[id], false).ok()).unwrap_or_else(|| format!("<{id}>"));
            let b = s.as_bytes().to_vec();
            (s, b)
        };
        let (token, bytes) = text(lp.token);
        LogprobEntry {
            token,
            bytes,
            logprob: lp.logprob,
            top: lp
                .top
                .iter()
                .map(|&(id, p)| {
                    let (s, b) = text(id);
                    (s, b, p)
                })
                .collect(),
        }
    }
}
