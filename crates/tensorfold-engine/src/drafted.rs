//! One request through the lane core with drafting on (context copies and the block drafter): what
//! `tensorfold generate` runs when a drafter is attached. Same checks and errors as [`crate::solo`].

use crate::core::{Core, EngineConfig, SystemClock};
use crate::request::{Event, FinishReason, Request, Stats};
use crate::solo::{SoloConfig, SoloError};
use crate::target::ModelTarget;
use std::sync::mpsc::channel;
use tensorfold_kernels::Backend;

/// Drafting settings of a single drafted run.
#[derive(Clone, Copy, Debug)]
pub struct DraftSettings {
    /// Most drafts a verify window (at most [`crate::core::MAX_DRAFT`]).
    pub max_draft: usize,
    /// Shortest recurring suffix for a context copy (0: copies off).
    pub copy_min: usize,
    /// How many drafts a window carries.
    pub verify: crate::schedule::VerifyMode,
    /// The guards (plain rounds where drafted ones do not pay; a stream's pause after rejected windows).
    pub guards: bool,
}

/// Generates a reply to `prompt` with verify windows; `on_token` sees each committed token and returns
/// false to stop. The reply equals [`crate::solo::generate`]'s token for token (the keyed accept rule).
pub fn generate<B: Backend + 'static>(
    target: ModelTarget<B>,
    prompt: &[u32],
    cfg: &SoloConfig,
    draft: DraftSettings,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<(Vec<u32>, Stats, FinishReason), SoloError> {
    cfg.params.validate()?;
    if prompt.is_empty() {
        return Err(SoloError::EmptyPrompt);
    }
    if cfg.chunk == 0 {
        return Err(SoloError::ZeroChunk);
    }
    if cfg.max_tokens == 0 {
        // As the solo loop: nothing to generate is an empty reply, not an error.
        return Ok((Vec::new(), Stats::default(), FinishReason::Length));
    }
    if prompt.len().saturating_add(cfg.max_tokens) > cfg.context {
        return Err(SoloError::ContextExceeded {
            prompt: prompt.len(),
            max_tokens: cfg.max_tokens,
            context: cfg.context,
        });
    }
    let engine = EngineConfig {
        parallel: 1,
        round_rows: cfg.chunk.max(draft.max_draft + 1),
        prefill_chunk: cfg.chunk,
        memory_bytes: usize::MAX / 4,
        prompt_cache_bytes: 0,
        copy_min: draft.copy_min,
        max_draft: draft.max_draft,
        verify: draft.verify,
        round_guard: draft.guards,
        stream_guard: draft.guards,
        ..EngineConfig::default()
    };
    let mut core = Core::new(target, engine, Box::new(SystemClock));
    let (tx, rx) = channel();
    let req = Request {
        prompt: prompt.to_vec(),
        params: cfg.params,
        max_tokens: cfg.max_tokens,
        stop_ids: cfg.stop_ids.clone(),
        ignore_eos: true,
        logprobs: None,
        draft: true,
    };
    let id = core.submit(req, tx).map_err(|e| SoloError::Stream(e.to_string()))?;
    let (mut out, mut stopped) = (Vec::new(), false);
    loop {
        let more = core.step();
        for ev in rx.try_iter() {
            match ev {
                // A window commits several tokens at once: after a stop, the rest of it is dropped.
                Event::Token(t) if !stopped => {
                    out.push(t);
                    if !on_token(t) {
                        stopped = true;
                        core.cancel(id);
                    }
                }
                Event::Finished { reason: FinishReason::Error, error, .. } => {
                    return Err(SoloError::Stream(error.unwrap_or_default()));
                }
                Event::Finished { reason, stats, .. } => return Ok((out, stats, reason)),
                _ => {}
            }
        }
        if !more {
            return Err(SoloError::Stream("the lane core went idle before the stream finished".into()));
        }
    }
}
