//! The lane core: streams admitted into lanes (FCFS, memory admission), each round ONE forward over every
//! active stream's rows (a decode row, or a chunk of its prompt within a per-round row budget), keyed
//! draws, stop conditions, prompt-cache snapshots, cancel. Synchronous and deterministic: `engine` runs it
//! on its own thread. Drafting (proposals, the depth rule, verify) lives in `drafting`.

mod drafting;
mod failure;
mod held;

use crate::schedule::{CostModel, Mode, RoundGuard, VerifyMode};
pub use drafting::PlantedFault;
use drafting::window_draws;

use crate::drafts::Guard;
use crate::prompt_cache::{CacheCounters, PromptCache};
use crate::request::{Event, FinishReason, Request, RequestId, Sink, Stats, SubmitError, TokenLogprobs};
use crate::sampler::DrawSpec;
use crate::target::{SegOut, SegWant, Target};
use std::collections::VecDeque;
use std::time::Instant;
use tensorfold_kernels::Segment;
use tensorfold_model::drafter::HeldRows;

/// Most drafts a window may carry: windows must stay within what a backend can roll back (the CPU conv
/// kernel keeps the rows of calls of at most `KEEP_ROWS`).
pub const MAX_DRAFT: usize = 32;
const _: () = assert!(MAX_DRAFT < tensorfold_kernels::cpu::conv::KEEP_ROWS);

/// A round's rows: `(lane, tokens)` per stream.
type Plan = Vec<(usize, Vec<u32>)>;

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
    /// Most drafts in a verify window (0 turns drafting off; at most [`MAX_DRAFT`]).
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
    /// A verify fault planted on purpose, so tests can show their checks catch it (always `None` in use).
    #[doc(hidden)]
    pub planted: Option<PlantedFault>,
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

struct Waiting {
    id: RequestId,
    req: Request,
    sink: Sink,
    submitted: Instant,
    bytes: usize,
}

struct Stream<S> {
    id: RequestId,
    req: Request,
    sink: Sink,
    state: S,
    /// The token to feed next (the last committed one) once the prompt is in.
    pending: Option<u32>,
    /// Prompt and committed tokens (what context copies search).
    history: Vec<u32>,
    guard: Guard,
    /// This round's drafter block (drafts for the positions after the pending token).
    block: Vec<u32>,
    /// The drafter's confidence in each draft of `block` (empty without a confidence head).
    conf: Vec<f32>,
    /// This round's block is held: the stream's index in [`Core::held`] (`block` then holds placeholders).
    held: Option<usize>,
    /// Rows of this round's window that take held drafts (after the pending token).
    held_rows: usize,
    /// This round, the stream may draft (set by `open_lanes`).
    open: bool,
    generated: usize,
    bytes: usize,
    stats: Stats,
    submitted: Instant,
    first_token: Option<Instant>,
}

/// The lane core over a target `T`.
pub struct Core<T: Target> {
    target: T,
    cfg: EngineConfig,
    clock: Box<dyn Clock>,
    queue: VecDeque<Waiting>,
    lanes: Vec<Stream<T::State>>,
    cache: PromptCache<T::State>,
    eos: Vec<u32>,
    next_id: RequestId,
    reserved: usize,
    counters: Metrics,
    /// Measured acceptance and round cost (the depth rule, scheduled verify).
    costs: CostModel,
    /// Plain or drafted rounds per stream count.
    round_guard: RoundGuard,
    /// Tokens committed in the current round.
    round_committed: u64,
    /// The device failure that stopped the engine (`failure.rs`).
    failure: Option<String>,
    /// This round's held drafter blocks (`Stream::held` indexes its streams).
    held: Option<T::Held>,
}

impl<T: Target> Core<T> {
    /// A core with no streams.
    pub fn new(target: T, cfg: EngineConfig, clock: Box<dyn Clock>) -> Self {
        let eos = target.eos_ids();
        let cache = PromptCache::new(cfg.prompt_cache_bytes);
        let cfg = EngineConfig {
            parallel: cfg.parallel.max(1),
            round_rows: cfg.round_rows.max(1),
            max_draft: cfg.max_draft.min(MAX_DRAFT),
            ..cfg
        };
        Self {
            target,
            cfg,
            clock,
            queue: VecDeque::new(),
            lanes: Vec::new(),
            cache,
            eos,
            next_id: 1,
            reserved: 0,
            counters: Metrics::default(),
            costs: CostModel::default(),
            round_guard: RoundGuard::default(),
            round_committed: 0,
            failure: None,
            held: None,
        }
    }

    /// The target.
    pub fn target(&self) -> &T {
        &self.target
    }

    /// True when nothing runs or waits.
    pub fn is_idle(&self) -> bool {
        self.lanes.is_empty() && self.queue.is_empty()
    }

    /// Current metrics.
    pub fn metrics(&self) -> Metrics {
        Metrics {
            running: self.lanes.len(),
            waiting: self.queue.len(),
            cache: self.cache.counters,
            state_bytes: self.lanes.iter().map(|s| self.target.state_bytes(&s.state)).sum(),
            reserved_bytes: self.reserved,
            cache_bytes: self.cache.bytes(),
            ..self.counters.clone()
        }
    }

    /// Checks and queues a request; events go to `sink`. Refusals queue nothing.
    pub fn submit(&mut self, req: Request, sink: impl Into<Sink>) -> Result<RequestId, SubmitError> {
        let sink = sink.into();
        if self.failure.is_some() {
            return Err(SubmitError::Stopped);
        }
        req.params.validate()?;
        if req.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        let vocab = self.target.vocab();
        if let Some(&id) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(SubmitError::TokenOutOfRange { id, vocab });
        }
        if req.max_tokens == 0 {
            return Err(SubmitError::ZeroMaxTokens);
        }
        let (prompt, context) = (req.prompt.len(), self.target.context());
        if prompt.checked_add(req.max_tokens).is_none_or(|t| t > context) {
            return Err(SubmitError::ContextExceeded { prompt, max_tokens: req.max_tokens, context });
        }
        let tokens = prompt + req.max_tokens;
        let bytes = self.target.stream_bytes(tokens);
        if bytes > self.cfg.memory_bytes {
            let fits = (0..=tokens).rev().find(|&t| self.target.stream_bytes(t) <= self.cfg.memory_bytes).unwrap_or(0);
            return Err(SubmitError::NeverFits { needed: bytes, tokens, budget: self.cfg.memory_bytes, fits });
        }
        // A request that a free lane takes at the next round does not wait in the queue.
        let free_lanes = self.cfg.parallel.saturating_sub(self.lanes.len());
        if self.queue.len() + 1 > free_lanes + self.cfg.queue_capacity {
            return Err(SubmitError::QueueFull { capacity: self.cfg.queue_capacity });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(Waiting { id, req, sink, submitted: self.clock.now(), bytes });
        Ok(id)
    }

    /// Cancels a waiting or running request: it finishes `Cancelled` now and frees its lane and memory.
    /// Returns false when the id is unknown (already finished). Touches no other request.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if let Some(i) = self.queue.iter().position(|w| w.id == id) {
            let mut w = self.queue.remove(i).expect("index from position");
            let stats =
                Stats { prompt_tokens: w.req.prompt.len(), queued: self.clock.now() - w.submitted, ..Stats::default() };
            w.sink.send(Event::Finished { reason: FinishReason::Cancelled, error: None, stats });
            return true;
        }
        match self.lanes.iter().position(|s| s.id == id) {
            Some(i) => {
                self.finish(i, FinishReason::Cancelled, None);
                true
            }
            None => false,
        }
    }

    /// Admits waiting requests, first come first served, while lanes and memory allow.
    fn admit(&mut self) {
        while self.lanes.len() < self.cfg.parallel {
            let Some(w) = self.queue.front() else { break };
            if self.reserved + w.bytes > self.cfg.memory_bytes {
                break;
            }
            let w = self.queue.pop_front().expect("front exists");
            let now = self.clock.now();
            let (mut state, cached) = match self.cache.lookup(&w.req.prompt) {
                Some((s, n)) => (s, n),
                None => (self.target.new_state(), 0),
            };
            self.target.reserve(&mut state, w.req.prompt.len() + w.req.max_tokens);
            self.reserved += w.bytes;
            self.counters.prompt_tokens += w.req.prompt.len() as u64;
            let stats = Stats {
                prompt_tokens: w.req.prompt.len(),
                cached_tokens: cached,
                queued: now - w.submitted,
                ..Stats::default()
            };
            let history = w.req.prompt.clone();
            self.lanes.push(Stream {
                id: w.id,
                req: w.req,
                sink: w.sink,
                state,
                pending: None,
                history,
                guard: Guard::default(),
                block: Vec::new(),
                conf: Vec::new(),
                held: None,
                held_rows: 0,
                open: false,
                generated: 0,
                bytes: w.bytes,
                stats,
                submitted: w.submitted,
                first_token: None,
            });
        }
    }

    /// Rows of this round: `(lane, tokens)`, decode windows first (the pending token, then drafts while
    /// the row budget allows), then prompt chunks within the budget.
    fn plan(&mut self, mode: Mode) -> Vec<(usize, Vec<u32>)> {
        let mut plan = Vec::new();
        let mut budget = self.cfg.round_rows.max(1);
        for (i, s) in self.lanes.iter().enumerate() {
            if let Some(t) = s.pending {
                plan.push((i, vec![t]));
                budget = budget.saturating_sub(1);
            }
        }
        if mode == Mode::Drafted {
            self.extend_windows(&mut plan, &mut budget);
        }
        // At least one prompt row a round, so prefill never starves behind decode rows.
        budget = budget.max(1);
        for (i, s) in self.lanes.iter().enumerate() {
            let pos = self.target.pos(&s.state);
            if s.pending.is_some() || pos >= s.req.prompt.len() || budget == 0 {
                continue;
            }
            let chunk = self.cfg.prefill_chunk.max(1);
            let boundary = ((pos / chunk + 1) * chunk).min(s.req.prompt.len());
            let n = (boundary - pos).min(budget);
            budget -= n;
            plan.push((i, s.req.prompt[pos..pos + n].to_vec()));
        }
        plan
    }

    /// Runs one round. Returns false when there was nothing to run.
    pub fn step(&mut self) -> bool {
        self.clear_held();
        if self.failure.is_some() {
            self.fail_all();
            return false;
        }
        self.admit();
        let t0 = self.clock.now();
        let decoding = self.lanes.iter().filter(|s| s.pending.is_some()).count();
        let mode = self.round_mode(decoding);
        self.open_lanes(mode);
        if mode == Mode::Drafted {
            self.draft_blocks();
        }
        if self.failure.is_some() {
            self.fail_all();
            return true;
        }
        let plan = self.plan(mode);
        if plan.is_empty() {
            return false;
        }
        self.counters.rounds += 1;
        self.round_committed = 0;
        let rows: usize = plan.iter().map(|(_, r)| r.len()).sum();
        let tf = self.clock.now();
        let results = self.run_forward(&plan);
        self.counters.forward_seconds += (self.clock.now() - tf).as_secs_f64();
        if self.failure.is_some() {
            self.fail_all();
            return true;
        }
        let (mut plan, outs) = self.drop_failed(plan, results);
        let refused = self.apply_held(&mut plan);
        let ids: Vec<RequestId> = plan.iter().map(|(i, _)| self.lanes[*i].id).collect();
        let v = self.target.vocab();
        for (((id, (_, rows)), mut out), bad) in ids.into_iter().zip(&mut plan).zip(outs).zip(refused) {
            let Some(i) = self.lanes.iter().position(|s| s.id == id) else { continue };
            if let Some(e) = bad
                && !self.refuse_held(i, rows, &mut out, e)
            {
                continue;
            }
            if self.lanes[i].pending.is_some() {
                let p0 = self.target.pos(&self.lanes[i].state) - rows.len();
                let draws = window_draws(&self.lanes[i].req.params, p0, rows, &out, v, self.cfg.planted);
                self.verify(i, rows, &out.logits, draws);
            } else {
                self.after_prompt_rows(i, out);
            }
        }
        let wall = (self.clock.now() - t0).as_secs_f64();
        self.counters.round_seconds += wall;
        self.record_round(decoding, mode, rows, wall);
        true
    }

    /// One forward over every planned row (or one per stream when shared rounds are off): each entry's
    /// draws (and logits where asked), or its error. Windows with drafts get a draw for every row.
    fn run_forward(&mut self, plan: &[(usize, Vec<u32>)]) -> Vec<Result<SegOut, String>> {
        if !self.cfg.shared_rounds {
            return plan
                .iter()
                .map(|entry| self.forward_rows(std::slice::from_ref(entry)).map(|mut l| l.remove(0)))
                .collect();
        }
        match self.forward_rows(plan) {
            Ok(l) => l.into_iter().map(Ok).collect(),
            // A device failure stops the engine: no retries.
            Err(e) if self.failure.is_some() => plan.iter().map(|_| Err(e.clone())).collect(),
            // An engine fault (calls are validated before they touch state): run each stream alone, so only a
            // stream that fails alone fails.
            Err(_) => plan
                .iter()
                .map(|entry| self.forward_rows(std::slice::from_ref(entry)).map(|mut l| l.remove(0)))
                .collect(),
        }
    }

    /// One target forward over the rows of `plan`.
    fn forward_rows(&mut self, plan: &[(usize, Vec<u32>)]) -> Result<Vec<SegOut>, String> {
        if let Some(f) = &self.failure {
            return Err(f.clone());
        }
        let mut tokens = Vec::new();
        let mut segs = Vec::new();
        let mut wants = Vec::new();
        let mut runs = Vec::new();
        for (k, (lane, rows)) in plan.iter().enumerate() {
            let s = &self.lanes[*lane];
            let start_pos = self.target.pos(&s.state);
            if let Some(stream) = s.held.filter(|_| s.held_rows > 0) {
                runs.push(HeldRows { row: tokens.len() + 1, stream, count: s.held_rows });
            }
            segs.push(Segment { first_row: tokens.len(), rows: rows.len(), start_pos, cache: k });
            wants.push(self.want(*lane, start_pos, rows.len()));
            tokens.extend_from_slice(rows);
        }
        let mut picked: Vec<Option<&mut Stream<T::State>>> = self.lanes.iter_mut().map(Some).collect();
        let mut states: Vec<&mut T::State> =
            plan.iter().map(|(lane, _)| &mut picked[*lane].take().expect("one segment a lane").state).collect();
        let out = match (&self.held, runs.is_empty()) {
            (Some(h), false) => self.target.forward_held(&tokens, (h, &runs), &segs, &mut states, &wants),
            _ => self.target.forward_drawn(&tokens, &segs, &mut states, &wants),
        };
        out.map_err(|e| {
            self.note_device(&e);
            e.to_string()
        })
    }

    /// What a lane's segment of `rows` rows from `start` needs back: a decode window a draw a row (row `r` for
    /// position `start + 1 + r`), the prompt's last chunk the first token's draw, an earlier chunk nothing;
    /// logits only for logprobs or a planted fault.
    fn want(&self, lane: usize, start: usize, rows: usize) -> SegWant {
        let s = &self.lanes[lane];
        let (params, logprobs) = (s.req.params, s.req.logprobs.is_some());
        if s.pending.is_none() {
            let last = start + rows == s.req.prompt.len();
            let draws = if last { vec![DrawSpec { params, position: (start + rows) as u64 }] } else { Vec::new() };
            return SegWant { all_rows: false, draws, logits: last && logprobs };
        }
        let shift = |r: usize| usize::from(self.cfg.planted == Some(PlantedFault::DrawAtWrongPosition) && r + 1 < rows);
        let draws = (0..rows).map(|r| DrawSpec { params, position: (start + 1 + r + shift(r)) as u64 }).collect();
        SegWant { all_rows: rows > 1, draws, logits: logprobs || self.cfg.planted.is_some() }
    }

    /// After a prompt chunk: prompt-cache snapshots, and the first token once the prompt is in.
    fn after_prompt_rows(&mut self, i: usize, out: SegOut) {
        let pos = self.target.pos(&self.lanes[i].state);
        let prompt_len = self.lanes[i].req.prompt.len();
        let s = &self.lanes[i];
        if self.keeps_state_at(pos, prompt_len) && !self.cache.contains(&s.req.prompt[..pos]) {
            let snap = self.target.snapshot(&s.state);
            let bytes = self.target.state_bytes(&snap);
            self.cache.insert(&s.req.prompt[..pos], snap, bytes);
        }
        if pos < prompt_len {
            return;
        }
        let s = &mut self.lanes[i];
        let cached_tokens = s.stats.cached_tokens;
        s.sink.send(Event::Prefilled { cached_tokens });
        match out.draws.into_iter().next() {
            Some(Ok(tok)) => {
                self.send_logprobs(i, &out.logits, tok);
                self.commit(i, tok, pos);
            }
            Some(Err(e)) => self.finish(i, FinishReason::Error, Some(format!("draw at position {pos}: {e}"))),
            None => self.finish(i, FinishReason::Error, Some(format!("no draw at position {pos}"))),
        }
    }

    /// Planned prompt-cache points: the prompt's end, the last chunk boundary before it, and boundaries at
    /// power-of-two multiples of the chunk (so copying snapshots costs O(prompt), not O(prompt^2 / chunk)).
    fn keeps_state_at(&self, pos: usize, prompt_len: usize) -> bool {
        if self.cfg.prompt_cache_bytes == 0 {
            return false;
        }
        let chunk = self.cfg.prefill_chunk.max(1);
        pos == prompt_len
            || (pos.is_multiple_of(chunk) && ((pos / chunk).is_power_of_two() || pos + chunk >= prompt_len))
    }

    fn send_logprobs(&mut self, i: usize, logits: &[f32], tok: u32) {
        if let Some(n) = self.lanes[i].req.logprobs {
            self.lanes[i].sink.send(Event::Logprobs(TokenLogprobs::from_logits(logits, tok, n)));
        }
    }

    /// Commits the token drawn for position `at` and applies the stop conditions. Returns false when the
    /// stream finished (its lane is gone).
    fn commit(&mut self, i: usize, tok: u32, at: usize) -> bool {
        let now = self.clock.now();
        let context = self.target.context();
        let s = &mut self.lanes[i];
        s.generated += 1;
        s.history.push(tok);
        self.counters.generated_tokens += 1;
        self.round_committed += 1;
        if s.first_token.is_none() {
            s.first_token = Some(now);
            s.stats.ttft = now - s.submitted;
        }
        if !s.sink.send(Event::Token(tok)) {
            self.finish(i, FinishReason::Cancelled, None);
            return false;
        }
        let stop = s.req.stop_ids.contains(&tok) || (!s.req.ignore_eos && self.eos.contains(&tok));
        if stop {
            self.finish(i, FinishReason::Stop, None);
        } else if s.generated >= s.req.max_tokens || at + 1 >= context {
            self.finish(i, FinishReason::Length, None);
        } else {
            s.pending = Some(tok);
            return true;
        }
        false
    }

    /// Ends lane `i`: its last event, its lane and its memory are released at once.
    fn finish(&mut self, i: usize, reason: FinishReason, error: Option<String>) {
        let mut s = self.lanes.swap_remove(i);
        let now = self.clock.now();
        self.reserved -= s.bytes;
        let mut stats = s.stats;
        stats.generated_tokens = s.generated;
        stats.decode = s.first_token.map_or_else(Default::default, |t| now - t);
        s.sink.send(Event::Finished { reason, error, stats });
    }
}
