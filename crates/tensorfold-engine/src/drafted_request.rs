//! The drafted request: one request through the lane core with drafting on (context copies and the block drafter),
//! what [`crate::single::generate`] runs when its options carry [`DraftSettings`].

use crate::core::{Core, EngineConfig, SystemClock};
use crate::model_target::ModelTarget;
use crate::request::{Event, FinishReason, Request, Stats};
use crate::single::{GenerateError, GenerateOptions, GenerateStats};
use std::sync::mpsc::channel;
use tensorfold_kernels::Backend;

/// Drafting settings of a single drafted run.
#[derive(Clone, Copy, Debug)]
pub struct DraftSettings {
    /// Most drafts a verify window (at most the target's `Caps::max_draft`).
    pub max_draft: usize,
    /// Shortest recurring suffix for a context copy (0: copies off).
    pub copy_min: usize,
    /// How many drafts a window carries.
    pub verify: crate::schedule::VerifyMode,
    /// The guards (plain rounds where drafted ones do not pay; a stream's pause after rejected windows).
    pub guards: bool,
}

/// Runs a checked request with verify windows; `on_token` sees each committed token and returns false to stop. The
/// reply equals the solo loop's token for token (the keyed accept rule).
pub(crate) fn run<B: Backend + 'static>(
    target: ModelTarget<B>,
    req: Request,
    opts: &GenerateOptions,
    draft: DraftSettings,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<(Vec<u32>, GenerateStats), GenerateError> {
    if opts.max_tokens == 0 {
        // As the solo loop: nothing to generate is an empty reply, not an error.
        return Ok((Vec::new(), stats(&[], Stats::default(), FinishReason::Length)));
    }
    let engine = EngineConfig {
        parallel: 1,
        round_rows: opts.chunk.max(draft.max_draft + 1),
        prefill_chunk: opts.chunk,
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
    let id = core.submit(req, tx).map_err(|e| GenerateError::Stream(e.to_string()))?;
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
                    return Err(GenerateError::Stream(error.unwrap_or_default()));
                }
                Event::Finished { reason, stats: s, .. } => {
                    let st = stats(&out, s, reason);
                    return Ok((out, st));
                }
                _ => {}
            }
        }
        if !more {
            return Err(GenerateError::Stream("the lane core went idle before the stream finished".into()));
        }
    }
}

/// A drafted run's stats: the lane core's, its TTFT as the prefill time.
fn stats(out: &[u32], s: Stats, finish: FinishReason) -> GenerateStats {
    GenerateStats {
        prompt_tokens: s.prompt_tokens,
        generated: out.len(),
        prefill: s.ttft,
        decode: s.decode,
        finish,
        drafts: Some(s),
    }
}
