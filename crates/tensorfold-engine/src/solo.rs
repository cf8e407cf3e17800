//! The solo loop: one stream, start to finish, chunked prefill then one decode row per step, every token drawn by
//! the keyed sampler where the logits live (as the lane core draws). The serial reference that shared rounds and
//! drafting must equal; [`crate::single::generate`] runs it.

use crate::controls::Controls;
use crate::keyed::SampleError;
use crate::keyed::{DrawSpec, SamplingParams};
use crate::request::{FinishReason, SubmitError};
use crate::single::{GenerateError, GenerateOptions, GenerateStats};
use std::time::Instant;
use tensorfold_kernels::{Backend, Segment};
use tensorfold_model::{Batch, LogitRows, Model, RowWant, StreamState};

/// Prefills `prompt` in chunks into a fresh state. Returns the state and the last row's logits.
pub fn prefill<B: Backend>(
    model: &Model<B>,
    prompt: &[u32],
    chunk: usize,
) -> Result<(StreamState<B>, Vec<f32>), GenerateError> {
    if prompt.is_empty() {
        return Err(SubmitError::EmptyPrompt.into());
    }
    if chunk == 0 {
        return Err(GenerateError::ZeroChunk);
    }
    let mut state = model.new_state();
    let mut logits = Vec::new();
    for part in prompt.chunks(chunk) {
        let seg = Segment { first_row: 0, rows: part.len(), start_pos: state.pos, cache: 0 };
        logits = model.forward(Batch::new(part, &[seg], &mut [&mut state], LogitRows::Last))?.logits;
    }
    Ok((state, logits))
}

/// Runs `tokens` at the state's position; with `params`, the keyed draw of the last row for the next position
/// (where the logits live; on the host after the logit controls when `controls` is given, the token then recorded
/// there), otherwise nothing (the head is skipped).
fn forward_draw<B: Backend>(
    model: &Model<B>,
    tokens: &[u32],
    state: &mut StreamState<B>,
    params: Option<&SamplingParams>,
    controls: Option<&mut Controls>,
) -> Result<Option<u32>, GenerateError> {
    let seg = Segment { first_row: 0, rows: tokens.len(), start_pos: state.pos, cache: 0 };
    let position = (state.pos + tokens.len()) as u64;
    let host = controls.is_some();
    let want: Vec<RowWant> = params
        .map(|&params| RowWant {
            row: tokens.len() - 1,
            draw: (!host).then_some(DrawSpec { params, position }),
            logits: host,
        })
        .into_iter()
        .collect();
    let out = model.forward(Batch::new(tokens, &[seg], &mut [state], LogitRows::Want(want)))?;
    match (params, controls) {
        (Some(params), Some(c)) => Ok(Some(c.draw(params, position, &out.logits).map_err(SampleError::Constraint)?)),
        _ => Ok(out.draws.into_iter().next().flatten().transpose()?),
    }
}

/// The serial reference loop over a checked request (see [`crate::single::generate`]): chunked prefill, then one
/// decode row a step. `on_token` sees each token as it is committed and returns false to stop.
pub(crate) fn run<B: Backend>(
    model: &Model<B>,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<(Vec<u32>, GenerateStats), GenerateError> {
    let t0 = Instant::now();
    let mut state = model.new_state();
    let mut controls = Controls::new(&opts.penalties, opts.grammar.as_ref(), prompt);
    let chunks: Vec<&[u32]> = prompt.chunks(opts.chunk).collect();
    let mut tok = 0;
    for (j, part) in chunks.iter().enumerate() {
        let last = j + 1 == chunks.len() && opts.max_tokens > 0;
        tok = forward_draw(model, part, &mut state, last.then_some(&opts.params), controls.as_mut())?.unwrap_or(0);
    }
    let prefill_time = t0.elapsed();
    let t1 = Instant::now();
    let mut out = Vec::new();
    let mut finish = FinishReason::Length;
    while out.len() < opts.max_tokens {
        out.push(tok);
        if !on_token(tok) {
            finish = FinishReason::Cancelled;
            break;
        }
        if opts.stop_ids.contains(&tok) || controls.as_ref().is_some_and(Controls::done) {
            finish = FinishReason::Stop;
            break;
        }
        if out.len() == opts.max_tokens {
            break;
        }
        tok = forward_draw(model, &[tok], &mut state, Some(&opts.params), controls.as_mut())?.unwrap_or(0);
    }
    let stats = GenerateStats {
        prompt_tokens: prompt.len(),
        generated: out.len(),
        prefill: prefill_time,
        decode: t1.elapsed(),
        finish,
        drafts: None,
    };
    Ok((out, stats))
}
