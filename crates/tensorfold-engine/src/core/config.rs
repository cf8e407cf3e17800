//! The lane core's settings ([`EngineConfig`]), what it reports ([`Metrics`]) and its source of time ([`Clock`]).

use crate::prompt_cache::CacheCounters;
use crate::schedule::VerifyMode;
use std::time::Instant;

/// Lane-core settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Streams that decode at once (lanes).
    pub parallel: usize,
    /// Requests that may wait for a lane; one more is refused (`QueueFull`).
    pub queue_capacity: usize,
    /// Rows one round may hold (decode rows first, then prompt chunks), so a long prompt does not stall decode.
    pub round_rows: usize,
    /// Prompt chunk: prefill stops at multiples of it, where the prompt cache keeps states.
    pub prefill_chunk: usize,
    /// Bytes the streams' states may hold together (memory admission).
    pub memory_bytes: usize,
    /// Bytes of the prompt cache (0 = off).
    pub prompt_cache_bytes: usize,
    /// One forward over all streams' rows (true), or one forward per stream (the A/B baseline).
    pub shared_rounds: bool,
    /// Context copies: the shortest suffix of a stream's context that must recur for its continuation to be
    /// drafted (0 turns copies off).
    pub copy_min: usize,
    /// Most drafts in a verify window (0 turns drafting off; at most the target's `Caps::max_draft`).
    pub max_draft: usize,
    /// How many drafts a window carries: the depth rule (default), confidence-scheduled, or fixed.
    pub verify: VerifyMode,
    /// The shared-round guard: per stream count, plain rounds where drafted ones do not pay.
    pub round_guard: bool,
    /// Each stream's guard: a pause (4 to 64 rounds, doubling) after two windows with nothing accepted.
    pub stream_guard: bool,
    /// Held drafts: the drafter's picks stay on the device and feed the verify without a host read (read after it);
    /// off, or under scheduled verify (it needs the confidences first), each block is read before its verify.
    pub held_drafts: bool,
    /// A verify fault planted on purpose, so tests can show their checks catch it (only with the `planted-faults`
    /// feature, which the engine's own tests turn on).
    #[cfg(feature = "planted-faults")]
    pub planted: Option<super::PlantedFault>,
}

impl EngineConfig {
    /// Rows of the longest verify window a stream runs (the pending token and at most `max_draft` drafts, capped at
    /// the target's `target_max_draft`): the conv window memory admission counts and reserves a stream.
    pub fn verify_rows(&self, target_max_draft: usize) -> usize {
        self.max_draft.min(target_max_draft).saturating_add(1)
    }

    /// The default row budget for `parallel` lanes: a decode row for every lane plus one prompt chunk, and at least
    /// 512, so plain rounds keep a prompt chunk however many streams decode (drafts fill the budget before prompt
    /// chunks do, so drafted rounds may leave less; vLLM likewise keeps its token budget above `max_num_seqs`).
    pub fn default_round_rows(parallel: usize, prefill_chunk: usize) -> usize {
        parallel.saturating_add(prefill_chunk).max(512)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            parallel: 8,
            queue_capacity: 64,
            round_rows: 512,
            prefill_chunk: 256,
            memory_bytes: 8 << 30,
            prompt_cache_bytes: 1 << 30,
            shared_rounds: true,
            copy_min: 8,
            max_draft: 8,
            verify: VerifyMode::Depth,
            round_guard: true,
            stream_guard: true,
            held_drafts: true,
            #[cfg(feature = "planted-faults")]
            planted: None,
        }
    }
}

/// A source of time (a fixed clock in tests keeps every recorded duration zero).
pub trait Clock: Send {
    /// Now.
    fn now(&self) -> Instant;
}

/// The system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that never moves.
pub struct FixedClock(pub Instant);

impl Clock for FixedClock {
    fn now(&self) -> Instant {
        self.0
    }
}

/// What the engine reports (`/metrics`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Streams in lanes.
    pub running: usize,
    /// Requests waiting.
    pub waiting: usize,
    /// Prompt tokens admitted.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Rounds run.
    pub rounds: u64,
    /// Draft tokens verified.
    pub drafted_tokens: u64,
    /// Draft tokens accepted.
    pub accepted_tokens: u64,
    /// Verify windows that carried drafts.
    pub draft_windows: u64,
    /// Of those, windows whose drafts were held on the device until after the verify.
    pub held_windows: u64,
    /// `accepted_at[k]`: windows whose draft k (0-based) was accepted (acceptance per position).
    pub accepted_at: Vec<u64>,
    /// Prompt-cache counters.
    pub cache: CacheCounters,
    /// Bytes the running streams' states hold.
    pub state_bytes: usize,
    /// Bytes reserved by memory admission.
    pub reserved_bytes: usize,
    /// Bytes the prompt cache holds.
    pub cache_bytes: usize,
    /// Wall seconds of all rounds (drafting, forward, draws, verify, bookkeeping), by the engine's clock.
    pub round_seconds: f64,
    /// Of those, seconds inside the target's forward (logits copied to the host included): the rest of a round
    /// is host work (block passes, draws, verify, streaming).
    pub forward_seconds: f64,
    /// The device failure that stopped the engine (every stream ended with it; the engine thread has ended).
    pub failure: Option<String>,
}
