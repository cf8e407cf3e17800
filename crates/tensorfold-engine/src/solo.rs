//! One stream, start to finish: chunked prefill, then one decode row per step, every token drawn by the
//! keyed sampler where the logits live (as the lane core draws). The serial reference that shared rounds and
//! drafting must equal.

use crate::sampler::{DrawSpec, SampleError, SamplingParams};
use std::time::{Duration, Instant};
use tensorfold_kernels::{Backend, Segment};
use tensorfold_model::{ForwardError, LogitRows, Model, RowWant, StreamState};

/// Why a solo run stopped early with an error.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SoloError {
    /// The prompt has no tokens.
    #[error("the prompt has zero tokens")]
    EmptyPrompt,
    /// Prompt plus `max_tokens` do not fit the context.
    #[error("prompt of {prompt} tokens plus max_tokens {max_tokens} exceeds the context of {context} tokens")]
    ContextExceeded { prompt: usize, max_tokens: usize, context: usize },
    /// `chunk` is zero.
    #[error("prefill chunk size must be at least 1")]
    ZeroChunk,
    /// The forward refused a call.
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// A draw failed (a non-finite logit, bad parameters).
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// The drafted run's stream failed in the lane core (a forward or drafter error, by name).
    #[error("the stream failed: {0}")]
    Stream(String),
}

/// Why a reply ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence or stop id was drawn (it is part of the reply).
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The token callback asked to stop.
    Cancelled,
}

/// Settings of one solo run.
#[derive(Clone, Debug)]
pub struct SoloConfig {
    /// Prompt rows per prefill call.
    pub chunk: usize,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Context limit in tokens (prompt plus reply).
    pub context: usize,
    /// Ids that end the reply (EOS from the checkpoint plus the caller's).
    pub stop_ids: Vec<u32>,
    /// Sampling parameters (temperature 0 = greedy).
    pub params: SamplingParams,
}

/// Counters and timings of a run.
#[derive(Clone, Debug)]
pub struct SoloStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub generated: usize,
    /// Wall time of the prefill (up to the first token's logits).
    pub prefill: Duration,
    /// Wall time of the decode steps after the first token.
    pub decode: Duration,
    /// Why it ended.
    pub finish: Finish,
}

/// Prefills `prompt` in chunks into a fresh state. Returns the state and the last row's logits.
pub fn prefill<B: Backend>(
    model: &Model<B>,
    prompt: &[u32],
    chunk: usize,
) -> Result<(StreamState<B>, Vec<f32>), SoloError> {
    if prompt.is_empty() {
        return Err(SoloError::EmptyPrompt);
    }
    if chunk == 0 {
        return Err(SoloError::ZeroChunk);
    }
    let mut state = model.new_state();
    let mut logits = Vec::new();
    for part in prompt.chunks(chunk) {
        let seg = Segment { first_row: 0, rows: part.len(), start_pos: state.pos, cache: 0 };
        logits = model.forward(part, &[seg], &mut [&mut state], LogitRows::Last)?.logits;
    }
    Ok((state, logits))
}

/// Runs `tokens` at the state's position; with `params`, the keyed draw of the last row for the next position
/// (where the logits live), otherwise nothing (the head is skipped).
fn forward_draw<B: Backend>(
    model: &Model<B>,
    tokens: &[u32],
    state: &mut StreamState<B>,
    params: Option<&SamplingParams>,
) -> Result<Option<u32>, SoloError> {
    let seg = Segment { first_row: 0, rows: tokens.len(), start_pos: state.pos, cache: 0 };
    let position = (state.pos + tokens.len()) as u64;
    let want: Vec<RowWant> = params
        .map(|&params| RowWant { row: tokens.len() - 1, draw: Some(DrawSpec { params, position }), logits: false })
        .into_iter()
        .collect();
    let out = model.forward(tokens, &[seg], &mut [state], LogitRows::Want(want))?;
    Ok(out.draws.into_iter().next().flatten().transpose()?)
}

/// Generates a reply to `prompt`. `on_token` sees each token as it is committed and returns false to stop.
pub fn generate<B: Backend>(
    model: &Model<B>,
    prompt: &[u32],
    cfg: &SoloConfig,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<(Vec<u32>, SoloStats), SoloError> {
    cfg.params.validate()?;
    if prompt.len().saturating_add(cfg.max_tokens) > cfg.context {
        return Err(SoloError::ContextExceeded {
            prompt: prompt.len(),
            max_tokens: cfg.max_tokens,
            context: cfg.context,
        });
    }
    let t0 = Instant::now();
    if prompt.is_empty() {
        return Err(SoloError::EmptyPrompt);
    }
    if cfg.chunk == 0 {
        return Err(SoloError::ZeroChunk);
    }
    let mut state = model.new_state();
    let chunks: Vec<&[u32]> = prompt.chunks(cfg.chunk).collect();
    let mut tok = 0;
    for (j, part) in chunks.iter().enumerate() {
        let last = j + 1 == chunks.len() && cfg.max_tokens > 0;
        tok = forward_draw(model, part, &mut state, last.then_some(&cfg.params))?.unwrap_or(0);
    }
    let prefill_time = t0.elapsed();
    let t1 = Instant::now();
    let mut out = Vec::new();
    let mut finish = Finish::Length;
    while out.len() < cfg.max_tokens {
        out.push(tok);
        if !on_token(tok) {
            finish = Finish::Cancelled;
            break;
        }
        if cfg.stop_ids.contains(&tok) {
            finish = Finish::Stop;
            break;
        }
        if out.len() == cfg.max_tokens {
            break;
        }
        tok = forward_draw(model, &[tok], &mut state, Some(&cfg.params))?.unwrap_or(0);
    }
    let stats = SoloStats {
        prompt_tokens: prompt.len(),
        generated: out.len(),
        prefill: prefill_time,
        decode: t1.elapsed(),
        finish,
    };
    Ok((out, stats))
}
