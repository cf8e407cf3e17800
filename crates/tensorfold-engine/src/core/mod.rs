//! The lane core, in vLLM v1's shape: each round schedules (admission, which lanes draft, the round's plan:
//! `scheduler.rs` and `plan.rs`, with the drafter's block pass in `block_pass.rs` and `held.rs`), executes ONE
//! forward over every active stream's rows (`runner.rs`), and updates (verify windows in `verify.rs`; commits,
//! stops, prompt-cache snapshots and finishes in `output.rs`; device failures in `failure.rs`). Synchronous and
//! deterministic: `engine` runs it on its own thread.

mod block_pass;
mod config;
mod controlled;
mod failure;
mod fanout;
mod held;
mod output;
mod plan;
mod planted;
mod runner;
mod scheduler;
mod stream;
mod verify;

pub use config::{Clock, EngineConfig, FixedClock, Metrics, SystemClock};
#[cfg(feature = "planted-faults")]
pub use planted::PlantedFault;
pub use scheduler::largest_fitting;

use crate::prompt_cache::PromptCache;
use crate::request::RequestId;
use crate::schedule::{CostModel, Mode, RoundGuard};
use crate::target::{Caps, Target};
use planted::Planted;
use std::collections::VecDeque;
use stream::{Stream, Waiting};

/// The lane core over a target `T`.
pub struct Core<T: Target> {
    target: T,
    /// What the target stated when the core was made (vocabulary, context, EOS ids, window limit).
    caps: Caps,
    cfg: EngineConfig,
    /// The fault planted in this core (never one without the `planted-faults` feature).
    planted: Planted,
    clock: Box<dyn Clock>,
    queue: VecDeque<Waiting>,
    lanes: Vec<Stream<T::State>>,
    cache: PromptCache<T::State>,
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
}

impl<T: Target> Core<T> {
    /// A core with no streams. `cfg.max_draft` is capped at what the target can roll back (`Caps::max_draft`).
    pub fn new(target: T, cfg: EngineConfig, clock: Box<dyn Clock>) -> Self {
        let caps = target.caps();
        let cache = PromptCache::new(cfg.prompt_cache_bytes);
        let cfg = EngineConfig {
            parallel: cfg.parallel.max(1),
            round_rows: cfg.round_rows.max(1),
            max_draft: cfg.max_draft.min(caps.max_draft),
            ..cfg
        };
        Self {
            target,
            caps,
            planted: Planted::of(&cfg),
            cfg,
            clock,
            queue: VecDeque::new(),
            lanes: Vec::new(),
            cache,
            next_id: 1,
            reserved: 0,
            counters: Metrics::default(),
            costs: CostModel::default(),
            round_guard: RoundGuard::default(),
            round_committed: 0,
            failure: None,
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

    /// Runs one round: schedule (admit, decide drafting, plan), execute (the one forward), update (verify, commit,
    /// finish). Returns false when there was nothing to run.
    pub fn step(&mut self) -> bool {
        if self.failure.is_some() {
            self.fail_all();
            return false;
        }
        self.admit();
        let t0 = self.clock.now();
        let decoding = self.lanes.iter().filter(|s| s.pending.is_some()).count();
        let mode = self.round_mode(decoding);
        let mut drafts = self.open_lanes(mode);
        // A lost device met by an admitted stream's reserve (`refuse_state`) is caught below, with no pass first.
        if mode == Mode::Drafted && self.failure.is_none() {
            self.draft_blocks(&mut drafts);
        }
        if self.failure.is_some() {
            self.fail_all();
            return true;
        }
        let plan = self.plan(mode, drafts);
        if plan.entries.is_empty() {
            return false;
        }
        self.counters.rounds += 1;
        self.round_committed = 0;
        let (rows, mode) = (plan.rows(), plan.mode);
        let tf = self.clock.now();
        let results = self.run_forward(&plan);
        self.counters.forward_seconds += (self.clock.now() - tf).as_secs_f64();
        if self.failure.is_some() {
            self.fail_all();
            return true;
        }
        self.update(plan, results);
        let wall = (self.clock.now() - t0).as_secs_f64();
        self.counters.round_seconds += wall;
        self.record_round(decoding, mode, rows, wall);
        true
    }
}
