//! Requests into the lane core and the events that come back out of it.

use crate::grammar::Grammar;
use crate::keyed::{SampleError, SamplingParams};
use crate::penalties::{Penalties, PenaltyError};
use std::time::Duration;

/// Engine-wide request id.
pub type RequestId = u64;

/// One generation request, in token ids.
#[derive(Clone, Debug)]
pub struct Request {
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    /// Sampling parameters; the seed keys every draw.
    pub params: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Caller's stop token ids (besides the checkpoint's EOS ids).
    pub stop_ids: Vec<u32>,
    /// Ignore the checkpoint's EOS ids (the caller's stop ids still stop).
    pub ignore_eos: bool,
    /// Report each token's log-probability and this many top alternatives (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// Verify drafted tokens (context copies) in windows; false runs the plain serial reference. The reply
    /// is the same tokens either way.
    pub draft: bool,
    /// `logit_bias` and the presence, frequency and repetition penalties (`penalties.rs`); rows of a request with
    /// any on are drawn on the host from the row's logits.
    pub penalties: Penalties,
    /// A compiled grammar the reply must follow (`grammar.rs`; `None`: free text); its rows are drawn on the host.
    pub grammar: Option<Grammar>,
}

/// What a request is checked against: the target's vocabulary, and the context it may fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Logits a row: prompt ids must be below it.
    pub vocab: usize,
    /// Positions the prompt and the reply may take together.
    pub context: usize,
}

impl Request {
    /// The one check of a request (the lane core's submit and the serial [`crate::single::generate`] both run it),
    /// in this order: its sampling parameters, its logit controls, an empty prompt, a prompt id past the vocabulary, `max_tokens` 0,
    /// prompt plus `max_tokens` past the context (an overflowing sum included).
    pub fn validate(&self, limits: Limits) -> Result<(), SubmitError> {
        self.params.validate()?;
        self.penalties.validate(limits.vocab)?;
        if self.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        let vocab = limits.vocab;
        if let Some(&id) = self.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(SubmitError::TokenOutOfRange { id, vocab });
        }
        if self.max_tokens == 0 {
            return Err(SubmitError::ZeroMaxTokens);
        }
        let (prompt, context) = (self.prompt.len(), limits.context);
        if prompt.checked_add(self.max_tokens).is_none_or(|t| t > context) {
            return Err(SubmitError::ContextExceeded { prompt, max_tokens: self.max_tokens, context });
        }
        Ok(())
    }

    /// A greedy request.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            prompt,
            params: SamplingParams::greedy(),
            max_tokens,
            stop_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            draft: true,
            penalties: Penalties::default(),
            grammar: None,
        }
    }
}

/// Log-probabilities of a committed token under the model's distribution (log-softmax of the raw logits,
/// before temperature and filters, as vLLM reports them by default).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The committed token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first (ties to the lower id).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// Computes them from a row's logits (in f64, max-subtracted).
    pub fn from_logits(logits: &[f32], token: u32, top_n: usize) -> Self {
        let max = logits.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let lse = max + logits.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
        let lp = |i: usize| (logits[i] as f64 - lse) as f32;
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let n = top_n.min(logits.len());
        if n > 0 {
            order.select_nth_unstable_by(n - 1, |&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            order.truncate(n);
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        }
        Self { token, logprob: lp(token as usize), top: order.into_iter().take(n).map(|i| (i as u32, lp(i))).collect() }
    }
}

/// Where a request's events go: a function that returns false once nobody listens (the stream is then
/// cancelled at its next token).
pub struct Sink(Box<dyn FnMut(Event) -> bool + Send>);

impl Sink {
    /// A sink from a function.
    pub fn new(f: impl FnMut(Event) -> bool + Send + 'static) -> Self {
        Self(Box::new(f))
    }

    /// Delivers an event; false when the receiver is gone.
    pub fn send(&mut self, e: Event) -> bool {
        (self.0)(e)
    }
}

impl From<std::sync::mpsc::Sender<Event>> for Sink {
    fn from(tx: std::sync::mpsc::Sender<Event>) -> Self {
        Self::new(move |e| tx.send(e).is_ok())
    }
}

/// Why a stream (or a serial run) finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS or stop id was drawn (it is the last token of the reply).
    Stop,
    /// `max_tokens` reached, or the context's end.
    Length,
    /// Cancelled by the caller (or its receiver was dropped).
    Cancelled,
    /// The stream failed; others are unaffected.
    Error,
}

/// Counters and timings of one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the prompt cache.
    pub cached_tokens: usize,
    /// Generated tokens.
    pub generated_tokens: usize,
    /// Time in the queue before admission.
    pub queued: Duration,
    /// Time from submission to the first token (TTFT).
    pub ttft: Duration,
    /// Time from the first token to the last.
    pub decode: Duration,
    /// Draft tokens verified.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Verify windows that carried at least one draft.
    pub windows: usize,
    /// `accepted_at[k]`: windows whose draft k (0-based) was accepted (acceptance per position).
    pub accepted_at: Vec<usize>,
    /// The drafter's error, when it failed for this stream (a non-finite score, a pick past the vocabulary). The
    /// stream then decoded on without drafts: its tokens are the same, since drafts only decide how many tokens a
    /// round commits, and the target's state is untouched by a block pass.
    pub draft_error: Option<String>,
}

impl Stats {
    /// Mean accepted length: committed tokens per verify window with drafts (accepted drafts plus the
    /// target's own token), or 0 without such windows.
    pub fn mean_accepted_length(&self) -> f64 {
        mean_accepted_length(self.accepted as u64, self.windows as u64)
    }
}

/// Committed tokens per verify window with drafts: `(accepted + windows) / windows` (each window commits its
/// accepted drafts and the target's own token), or 0 without windows.
pub fn mean_accepted_length(accepted: u64, windows: u64) -> f64 {
    if windows == 0 { 0.0 } else { (accepted + windows) as f64 / windows as f64 }
}

/// What the engine tells a request's owner, in order: `Prefilled`, `Token`s, then one `Finished`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The prompt is in the stream's state; `cached_tokens` of it came from the prompt cache.
    Prefilled {
        /// Prompt tokens reused.
        cached_tokens: usize,
    },
    /// Log-probabilities of the token that follows (only when the request asked for them).
    Logprobs(TokenLogprobs),
    /// A committed token.
    Token(u32),
    /// The last event.
    Finished {
        /// Why.
        reason: FinishReason,
        /// A message when `reason` is `Error`.
        error: Option<String>,
        /// With `reason` `Error`: the device had no room then, for the stream's state (`KernelError::OutOfMemory`
        /// from the target's reserve) or inside a forward that failed for this stream
        /// ([`tensorfold_kernels::KernelError::is_out_of_memory`]), no fault of the request's or the device's, so the
        /// same request may succeed later (the server answers 503 with `Retry-After`).
        out_of_memory: bool,
        /// Counters and timings.
        stats: Stats,
    },
}

/// A request refused at submission. Nothing was queued.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SubmitError {
    /// The prompt has no tokens.
    #[error("the prompt has zero tokens")]
    EmptyPrompt,
    /// `max_tokens` is 0: nothing to generate.
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    /// A prompt id outside the vocabulary.
    #[error("prompt token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    /// Prompt plus max_tokens past the context.
    #[error("prompt of {prompt} tokens plus max_tokens {max_tokens} exceeds the context of {context} tokens")]
    ContextExceeded { prompt: usize, max_tokens: usize, context: usize },
    /// The queue is at capacity.
    #[error("the request queue is full ({capacity} waiting); retry later")]
    QueueFull { capacity: usize },
    /// The stream can never fit the memory budget.
    #[error(
        "the request needs {needed} bytes for {tokens} positions but the memory budget is {budget} bytes; at most {fits} positions (prompt plus max_tokens) fit"
    )]
    NeverFits { needed: usize, tokens: usize, budget: usize, fits: usize },
    /// Bad sampling parameters.
    #[error(transparent)]
    Sampling(#[from] SampleError),
    /// Bad logit controls (`logit_bias`, the penalties).
    #[error(transparent)]
    Penalty(#[from] PenaltyError),
    /// A group's requests must share one prompt, one sink each.
    #[error("a group's requests must have the same prompt and one sink each")]
    GroupPrompts,
    /// A group larger than the engine's lanes can never be admitted whole.
    #[error("n = {n} streams exceed the engine's {lanes} lanes (--parallel)")]
    GroupTooLarge { n: usize, lanes: usize },
    /// The engine thread has stopped.
    #[error("the engine has stopped")]
    Stopped,
}
