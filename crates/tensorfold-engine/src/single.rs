//! One request, start to finish, outside the engine thread: what `tensorfold generate` and the benches' references
//! run. One public entry, [`generate`]: the request is checked once ([`Request::validate`]), then runs the solo loop
//! (the serial reference), or through the lane core with verify windows when the options carry [`DraftSettings`].

use crate::keyed::{SampleError, SamplingParams};
use crate::model_target::ModelTarget;
use crate::penalties::Penalties;
use crate::request::{FinishReason, Limits, Request, Stats, SubmitError};
use std::sync::Arc;
use std::time::Duration;
use tensorfold_kernels::Backend;
use tensorfold_model::{ForwardError, Model};

pub use crate::drafted_request::DraftSettings;

/// Why a run stopped early with an error.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GenerateError {
    /// The request was refused by the one check ([`Request::validate`]): an empty prompt, past the context, bad
    /// sampling parameters, ...
    #[error(transparent)]
    Refused(#[from] SubmitError),
    /// `chunk` is zero.
    #[error("prefill chunk size must be at least 1")]
    ZeroChunk,
    /// The forward refused a call.
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// A draw failed (a non-finite logit).
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// The drafted run's stream failed in the lane core (a forward or drafter error, by name).
    #[error("the stream failed: {0}")]
    Stream(String),
}

/// Options of one run.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Prompt rows per prefill call.
    pub chunk: usize,
    /// Most tokens to generate (0: an empty reply).
    pub max_tokens: usize,
    /// Context limit in tokens (prompt plus reply).
    pub context: usize,
    /// Ids that end the reply (EOS from the checkpoint plus the caller's).
    pub stop_ids: Vec<u32>,
    /// Sampling parameters (temperature 0 = greedy).
    pub params: SamplingParams,
    /// `logit_bias` and the penalties (`Penalties::default()`: off); with any on, draws are made on the host.
    pub penalties: Penalties,
    /// A compiled grammar the reply must follow (`None`: free text).
    pub grammar: Option<crate::grammar::Grammar>,
    /// Verify drafts in windows through the lane core (the model needs a drafter for block drafts; copies need
    /// none); `None` runs the solo loop. The reply is the same tokens either way.
    pub drafts: Option<DraftSettings>,
}

/// Counters and timings of a run.
#[derive(Clone, Debug)]
pub struct GenerateStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub generated: usize,
    /// Wall time of the prefill (up to the first token's logits; a drafted run's TTFT).
    pub prefill: Duration,
    /// Wall time of the decode steps after the first token.
    pub decode: Duration,
    /// Why it ended (`Stop`, `Length` or `Cancelled`: an error is a [`GenerateError`]).
    pub finish: FinishReason,
    /// A drafted run's lane-core stats (drafted and accepted counts, the drafter's error); `None` for the solo loop.
    pub drafts: Option<Stats>,
}

/// Generates a reply to `prompt`. `on_token` sees each token as it is committed and returns false to stop (the
/// reply then ends `Cancelled` after that token). The prompt is checked against the model's vocabulary and
/// `opts.context`; `max_tokens` 0 is an empty reply, not a refusal.
pub fn generate<B: Backend + 'static>(
    model: &Arc<Model<B>>,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: impl FnMut(u32) -> bool,
) -> Result<(Vec<u32>, GenerateStats), GenerateError> {
    let req = Request {
        prompt: prompt.to_vec(),
        params: opts.params,
        max_tokens: opts.max_tokens,
        stop_ids: opts.stop_ids.clone(),
        // The caller's stop ids carry the checkpoint's EOS ids when it honours them.
        ignore_eos: true,
        logprobs: None,
        draft: true,
        penalties: opts.penalties.clone(),
        grammar: opts.grammar.clone(),
    };
    match req.validate(Limits { vocab: model.cfg.vocab, context: opts.context }) {
        Ok(()) | Err(SubmitError::ZeroMaxTokens) => {}
        Err(e) => return Err(e.into()),
    }
    if opts.chunk == 0 {
        return Err(GenerateError::ZeroChunk);
    }
    match opts.drafts {
        None => crate::solo::run(model, prompt, opts, on_token),
        Some(d) => {
            let target = ModelTarget { model: model.clone(), eos: Vec::new() };
            crate::drafted_request::run(target, req, opts, d, on_token)
        }
    }
}
