//! Scheduling, the first stage of a round: submission (the one request check, then memory and queue admission),
//! cancel, admission into lanes (FCFS while lanes and memory allow), the round's mode under the shared-round guard,
//! which lanes draft, and the [`RoundPlan`]: decode windows (the pending token, then drafts as deep as the verify
//! mode says) and prompt chunks within the per-round row budget.

use super::Core;
use super::plan::{Entry, LaneDraft, RoundDrafts, RoundPlan};
use super::stream::{Stream, Waiting};
use crate::controls::Controls;
use crate::copies::{StreamGuard, context_copy};
use crate::request::{FinishReason, Limits, Request, RequestId, Sink, Stats, SubmitError};
use crate::schedule::{Mode, VerifyMode};
use crate::target::Target;
use tensorfold_model::ForwardError;

impl<T: Target> Core<T> {
    /// Rows of the longest verify window a stream runs ([`super::EngineConfig::verify_rows`]).
    pub(super) fn verify_rows(&self) -> usize {
        self.cfg.verify_rows(self.caps.max_draft)
    }

    /// Checks and queues a request; events go to `sink`. Refusals queue nothing.
    pub fn submit(&mut self, req: Request, sink: impl Into<Sink>) -> Result<RequestId, SubmitError> {
        let sink = sink.into();
        if self.failure.is_some() {
            return Err(SubmitError::Stopped);
        }
        req.validate(Limits { vocab: self.caps.vocab, context: self.caps.context })?;
        // The sum is checked by `validate` (at most the context).
        let tokens = req.prompt.len() + req.max_tokens;
        let v = self.verify_rows();
        let bytes = self.target.stream_bytes(tokens, v);
        if bytes > self.cfg.memory_bytes {
            let fits = largest_fitting(tokens, self.cfg.memory_bytes, |t| self.target.stream_bytes(t, v));
            return Err(SubmitError::NeverFits { needed: bytes, tokens, budget: self.cfg.memory_bytes, fits });
        }
        // A request that a free lane takes at the next round does not wait in the queue.
        let free_lanes = self.cfg.parallel.saturating_sub(self.lanes.len());
        if self.queue.len() + 1 > free_lanes + self.cfg.queue_capacity {
            return Err(SubmitError::QueueFull { capacity: self.cfg.queue_capacity });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(Waiting { id, req, sink, submitted: self.clock.now(), bytes, followers: Vec::new() });
        Ok(id)
    }

    /// Cancels a waiting or running request: it finishes `Cancelled` now and frees its lane and memory.
    /// Returns false when the id is unknown (already finished). Touches no other request.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if self.cancel_waiting(id) {
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

    /// Admits waiting requests (a group whole), first come first served, while lanes and memory allow. A leader
    /// whose state the target could not reserve finishes with that error once its group is in ([`Core::refuse_state`]:
    /// its followers then prefill on their own).
    pub(super) fn admit(&mut self) {
        while self.lanes.len() < self.cfg.parallel && self.failure.is_none() {
            let Some(w) = self.queue.front() else { break };
            let (lanes, bytes) = w.followers.iter().fold((1, w.bytes), |(l, b), f| (l + 1, b.saturating_add(f.bytes)));
            if self.lanes.len() + lanes > self.cfg.parallel
                || self.reserved.saturating_add(bytes) > self.cfg.memory_bytes
            {
                break;
            }
            let mut w = self.queue.pop_front().expect("front exists");
            let followers = std::mem::take(&mut w.followers);
            let leader = w.id;
            let refused = self.admit_one(w, None).err();
            for f in followers {
                // A follower reserves nothing until it takes its leader's state.
                let _ = self.admit_one(f, Some(leader));
            }
            if let Some(e) = refused {
                self.refuse_state(leader, e);
            }
        }
    }

    /// The prompt cache's longest kept prefix of `prompt`, copied on the device as the target copies (and watches)
    /// its snapshots, and its length; a copy the device could not make is a miss (a lost device is recorded: the
    /// step's check stops the engine).
    fn resume(&mut self, prompt: &[u32]) -> Option<(T::State, usize)> {
        let (copied, n) = self.cache.lookup(prompt).map(|(s, n)| (self.target.snapshot(s), n))?;
        match copied {
            Ok(s) => {
                self.cache.resumed(n);
                Some((s, n))
            }
            Err(e) => {
                self.note_device(&e);
                None
            }
        }
    }

    /// Puts one waiting request in a lane (a group's follower waits for `leader`'s prefill). Errors: the target could
    /// not reserve a leader's or a lone request's state; the lane is taken all the same, for the caller to finish.
    fn admit_one(&mut self, w: Waiting, leader: Option<RequestId>) -> Result<(), ForwardError> {
        let now = self.clock.now();
        // A follower's state is its leader's at the prompt's end (`fanout.rs`); until then a placeholder.
        let looked = leader.is_none().then(|| self.resume(&w.req.prompt)).flatten();
        let (mut state, cached) = looked.unwrap_or_else(|| (self.target.new_state(), 0));
        let reserved = match leader {
            None => self.target.reserve(&mut state, w.req.prompt.len() + w.req.max_tokens, self.verify_rows()),
            Some(_) => Ok(()),
        };
        self.reserved += w.bytes;
        self.counters.prompt_tokens += w.req.prompt.len() as u64;
        let stats = Stats {
            prompt_tokens: w.req.prompt.len(),
            cached_tokens: cached,
            queued: now - w.submitted,
            ..Stats::default()
        };
        let history = w.req.prompt.clone();
        let controls = Controls::of(&w.req);
        self.lanes.push(Stream {
            id: w.id,
            req: w.req,
            sink: w.sink,
            state,
            pending: None,
            history,
            guard: StreamGuard::default(),
            generated: 0,
            bytes: w.bytes,
            stats,
            submitted: w.submitted,
            first_token: None,
            controls,
            leader,
        });
        reserved
    }

    /// This round's mode: plain or drafted under the shared-round guard (drafted when it is off).
    pub(super) fn round_mode(&mut self, decoding: usize) -> Mode {
        let any = self.cfg.max_draft > 0 && self.lanes.iter().any(|s| s.pending.is_some() && s.req.draft);
        if !any {
            return Mode::Plain;
        }
        if self.cfg.round_guard { self.round_guard.mode(decoding) } else { Mode::Drafted }
    }

    /// Decides once a round which lanes may draft: a decoding request that allows it, drafting on, and its
    /// stream guard open (asking the guard counts one round of a pause down).
    pub(super) fn open_lanes(&mut self, mode: Mode) -> RoundDrafts<T::Held> {
        let (on, guarded) = (self.cfg.max_draft > 0 && mode == Mode::Drafted, self.cfg.stream_guard);
        let lanes = self
            .lanes
            .iter_mut()
            .map(|s| {
                let wants = s.pending.is_some() && s.req.draft && s.stats.draft_error.is_none();
                LaneDraft { open: wants && (!guarded || s.guard.allow()) && on, ..LaneDraft::default() }
            })
            .collect();
        RoundDrafts { lanes, held: None }
    }

    /// The round's rows: decode windows first (the pending token, then drafts while the row budget allows), then
    /// prompt chunks within the budget.
    pub(super) fn plan(&mut self, mode: Mode, mut drafts: RoundDrafts<T::Held>) -> RoundPlan<T::Held> {
        let mut entries = Vec::new();
        let mut budget = self.cfg.round_rows.max(1);
        for (i, s) in self.lanes.iter().enumerate() {
            if let Some(t) = s.pending {
                entries.push(Entry::new(i, vec![t]));
                budget = budget.saturating_sub(1);
            }
        }
        if mode == Mode::Drafted {
            self.extend_windows(&mut entries, &mut budget, &mut drafts.lanes);
        }
        // At least one prompt row a round, so prefill never starves behind decode rows.
        budget = budget.max(1);
        for (i, s) in self.lanes.iter().enumerate() {
            let pos = self.target.pos(&s.state);
            if s.pending.is_some() || s.leader.is_some() || pos >= s.req.prompt.len() || budget == 0 {
                continue;
            }
            let chunk = self.cfg.prefill_chunk.max(1);
            let boundary = ((pos / chunk + 1) * chunk).min(s.req.prompt.len());
            let n = (boundary - pos).min(budget);
            budget -= n;
            entries.push(Entry::new(i, s.req.prompt[pos..pos + n].to_vec()));
        }
        RoundPlan { mode, entries, held: drafts.held }
    }

    /// Extends each decode window with drafts: a context copy, else the drafter's block, as deep as the
    /// verify mode says and the row budget, the request and the context allow.
    fn extend_windows(&mut self, entries: &mut [Entry], budget: &mut usize, drafts: &mut [LaneDraft]) {
        let context = self.caps.context;
        let drafting: Vec<usize> = entries.iter().map(|e| e.lane).filter(|&l| drafts[l].open).collect();
        let other = entries.len() - drafting.len();
        let depth = match self.cfg.verify {
            VerifyMode::Fixed => self.cfg.max_draft,
            _ => self.costs.depth(drafting.len(), other, self.cfg.max_draft),
        };
        let scheduled: Vec<usize> = if self.cfg.verify == VerifyMode::Scheduled {
            // Blocks without confidences (copies, a drafter without the head) follow the depth rule.
            let confs: Vec<Vec<f32>> = drafting.iter().map(|&l| drafts[l].conf.clone()).collect();
            let take = self.costs.scheduled(&confs, other);
            take.into_iter().zip(&confs).map(|(k, c)| if c.is_empty() { usize::MAX } else { k }).collect()
        } else {
            Vec::new()
        };
        for e in entries.iter_mut() {
            let (s, d) = (&self.lanes[e.lane], &mut drafts[e.lane]);
            // A held block is read after the verify even when its window takes none of it (a failed one is refused).
            e.held = d.held;
            if *budget == 0 || !drafting.contains(&e.lane) {
                continue;
            }
            let pos = self.target.pos(&s.state);
            let room = (s.req.max_tokens - s.generated).saturating_sub(1).min(context.saturating_sub(pos + 1));
            let max = depth.min(room).min(*budget);
            let mut window = context_copy(&s.history, self.cfg.copy_min, max);
            if window.is_empty() {
                window = std::mem::take(&mut d.block);
                let k = drafting.iter().position(|&l| l == e.lane).and_then(|k| scheduled.get(k).copied());
                window.truncate(k.map_or(max, |k| k.min(max)));
                e.held_rows = if d.held.is_some() { window.len() } else { 0 };
            }
            *budget -= window.len();
            e.rows.extend(window);
        }
    }

    /// Feeds a finished round to the cost model and the guard.
    pub(super) fn record_round(&mut self, decoding: usize, mode: Mode, rows: usize, secs: f64) {
        self.costs.record_round(rows, secs);
        if self.cfg.round_guard && decoding > 0 {
            self.round_guard.record(decoding, mode, self.round_committed, secs);
        }
    }
}

/// The largest `t` in `0..=max` with `bytes(t) <= budget` (0 when none), by bisection over a `bytes` that is
/// monotone in `t`: O(log max) estimates, so a 10^9-token context costs ~30 of them, not a scan.
pub fn largest_fitting(max: usize, budget: usize, bytes: impl Fn(usize) -> usize) -> usize {
    let (mut lo, mut hi) = (0usize, max);
    if bytes(hi) <= budget {
        return hi;
    }
    // Invariant: bytes(hi) > budget; bytes(lo) <= budget, or lo == 0.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if bytes(mid) <= budget { lo = mid } else { hi = mid }
    }
    lo
}
