//! The lane core's drafting: which streams draft this round and how deep (the shared-round guard, the
//! depth rule, confidence-scheduled verify), the drafter's block pass, and verifying windows with the
//! keyed accept rule.

use super::{Core, Plan};
use crate::drafts::context_copy;
use crate::request::{FinishReason, RequestId};
use crate::sampler::{SamplingParams, draw};
use crate::schedule::{Mode, VerifyMode};
use crate::target::{SegOut, Target};
use tensorfold_kernels::KernelError;
use tensorfold_model::ForwardError;
use tensorfold_model::drafter::DraftBlock;

/// Verify faults the drafting tests plant to prove they turn red.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantedFault {
    /// The token after the last kept draft is drawn from the row before it.
    BonusFromWrongRow,
    /// Each draft is compared with the draw keyed one position later.
    DrawAtWrongPosition,
    /// Held drafts are written into their window one row late (the host's rows no longer match what the device
    /// verified).
    HeldPicksShifted,
}

impl<T: Target> Core<T> {
    /// This round's mode: plain or drafted under the shared-round guard (drafted when it is off).
    pub(super) fn round_mode(&mut self, decoding: usize) -> Mode {
        let any = self.cfg.max_draft > 0 && self.lanes.iter().any(|s| s.pending.is_some() && s.req.draft);
        if !any {
            return Mode::Plain;
        }
        if self.cfg.round_guard { self.round_guard.mode(decoding) } else { Mode::Drafted }
    }

    /// Feeds a finished round to the cost model and the guard.
    pub(super) fn record_round(&mut self, decoding: usize, mode: Mode, rows: usize, secs: f64) {
        self.costs.record_round(rows, secs);
        if self.cfg.round_guard && decoding > 0 {
            self.round_guard.record(decoding, mode, self.round_committed, secs);
        }
    }

    /// Extends each decode window with drafts: a context copy, else the drafter's block, as deep as the
    /// verify mode says and the row budget, the request and the context allow.
    pub(super) fn extend_windows(&mut self, plan: &mut Plan, budget: &mut usize) {
        let context = self.target.context();
        let drafting: Vec<usize> = plan.iter().map(|(l, _)| *l).filter(|&l| self.may_draft(l)).collect();
        let other = plan.len() - drafting.len();
        let depth = match self.cfg.verify {
            VerifyMode::Fixed => self.cfg.max_draft,
            _ => self.costs.depth(drafting.len(), other, self.cfg.max_draft),
        };
        let scheduled: Vec<usize> = if self.cfg.verify == VerifyMode::Scheduled {
            // Blocks without confidences (copies, a drafter without the head) follow the depth rule.
            let confs: Vec<Vec<f32>> = drafting.iter().map(|&l| self.lanes[l].conf.clone()).collect();
            let take = self.costs.scheduled(&confs, other);
            take.into_iter().zip(&confs).map(|(k, c)| if c.is_empty() { usize::MAX } else { k }).collect()
        } else {
            Vec::new()
        };
        for (lane, rows) in plan.iter_mut() {
            let s = &mut self.lanes[*lane];
            if *budget == 0 || !drafting.contains(lane) {
                continue;
            }
            let pos = self.target.pos(&s.state);
            let room = (s.req.max_tokens - s.generated).saturating_sub(1).min(context.saturating_sub(pos + 1));
            let max = depth.min(room).min(*budget);
            let mut drafts = context_copy(&s.history, self.cfg.copy_min, max);
            if drafts.is_empty() {
                drafts = std::mem::take(&mut s.block);
                let k = drafting.iter().position(|l| l == lane).and_then(|k| scheduled.get(k).copied());
                drafts.truncate(k.map_or(max, |k| k.min(max)));
                s.held_rows = if s.held.is_some() { drafts.len() } else { 0 };
            }
            *budget -= drafts.len();
            rows.extend(drafts);
        }
    }

    /// Whether lane `i` drafts this round at all (set once a round by [`Core::open_lanes`]).
    pub(super) fn may_draft(&self, i: usize) -> bool {
        self.lanes[i].open
    }

    /// Decides once a round which lanes may draft: a decoding request that allows it, drafting on, and its
    /// stream guard open (asking the guard counts one round of a pause down).
    pub(super) fn open_lanes(&mut self, mode: Mode) {
        let (on, guarded) = (self.cfg.max_draft > 0 && mode == Mode::Drafted, self.cfg.stream_guard);
        for s in &mut self.lanes {
            let wants = s.pending.is_some() && s.req.draft && s.stats.draft_error.is_none();
            s.open = wants && (!guarded || s.guard.allow()) && on;
        }
    }

    /// One drafter block pass over every stream that drafts this round and has no context copy (one batched
    /// call; on an error each stream is retried alone). A stream whose pass fails alone records the error in its
    /// stats and decodes on without drafts (this round and after): it is never failed for its drafter.
    pub(super) fn draft_blocks(&mut self) {
        for s in &mut self.lanes {
            s.block.clear();
            s.conf.clear();
        }
        let want: Vec<usize> = (0..self.lanes.len())
            .filter(|&i| self.may_draft(i))
            .filter(|&i| context_copy(&self.lanes[i].history, self.cfg.copy_min, 1).is_empty())
            .collect();
        if want.is_empty() {
            return;
        }
        // Held drafts need no confidences first, so scheduled verify reads its blocks.
        if self.cfg.held_drafts && self.cfg.verify != VerifyMode::Scheduled && self.hold_blocks(&want) {
            return;
        }
        let run = |core: &Self, ids: &[usize]| {
            let states: Vec<&T::State> = ids.iter().map(|&i| &core.lanes[i].state).collect();
            let (anchors, pickers) = core.draft_inputs(ids);
            core.target.draft_keyed(&states, &anchors, &pickers)
        };
        let (results, shared): (Vec<Result<DraftBlock, ForwardError>>, _) = match run(self, &want) {
            None => return,
            Some(Ok(blocks)) => (blocks.into_iter().map(Ok).collect(), None),
            // A lost device: no retries (the step then ends every stream).
            Some(Err(shared @ ForwardError::Kernel(KernelError::DeviceLost { .. }))) => (Vec::new(), Some(shared)),
            Some(Err(shared)) => {
                let alone = want
                    .iter()
                    .map(|&i| match run(self, &[i]) {
                        Some(Ok(mut b)) => Ok(b.remove(0)),
                        Some(Err(e)) => Err(e),
                        None => Ok(DraftBlock { tokens: Vec::new(), confidence: Vec::new(), scores: Vec::new() }),
                    })
                    .collect();
                (alone, Some(shared))
            }
        };
        if let Some(e) = shared {
            self.note_device(&e);
        }
        let ids: Vec<RequestId> = want.iter().map(|&i| self.lanes[i].id).collect();
        for (id, r) in ids.into_iter().zip(results) {
            let Some(i) = self.lanes.iter().position(|s| s.id == id) else { continue };
            match r {
                Ok(b) => (self.lanes[i].block, self.lanes[i].conf) = (b.tokens, b.confidence),
                Err(e) => {
                    self.note_device(&e);
                    let s = &mut self.lanes[i];
                    (s.stats.draft_error, s.open) = (Some(e.to_string()), false);
                }
            }
        }
    }

    /// Applies a verified decode window (the pending token, then drafts; `draws` from [`window_draws`]): a
    /// draft was kept iff it equals the draw at the row before it; the kept drafts and the draw after the
    /// last kept row are committed, and the state rolls back to the kept path.
    pub(super) fn verify(&mut self, i: usize, rows: &[u32], logits: &[f32], draws: Result<Vec<u32>, String>) {
        let v = self.target.vocab();
        let n = rows.len() - 1;
        let p0 = self.target.pos(&self.lanes[i].state) - rows.len();
        let toks = match draws {
            Ok(t) => t,
            Err(e) => return self.finish(i, FinishReason::Error, Some(e)),
        };
        let accepted = toks.len() - 1;
        if n > 0 {
            let s = &mut self.lanes[i];
            if let Err(e) = self.target.keep(&mut s.state, p0 + toks.len()) {
                return self.finish(i, FinishReason::Error, Some(format!("rolling back a verify window: {e}")));
            }
            s.guard.record(accepted);
            self.costs.record_window(n, accepted);
            s.stats.drafted += n;
            s.stats.accepted += accepted;
            s.stats.windows += 1;
            if s.stats.accepted_at.len() < accepted {
                s.stats.accepted_at.resize(accepted, 0);
            }
            s.stats.accepted_at[..accepted].iter_mut().for_each(|c| *c += 1);
            self.counters.draft_windows += 1;
            if self.counters.accepted_at.len() < accepted {
                self.counters.accepted_at.resize(accepted, 0);
            }
            self.counters.accepted_at[..accepted].iter_mut().for_each(|c| *c += 1);
            self.counters.drafted_tokens += n as u64;
            self.counters.accepted_tokens += accepted as u64;
        }
        for (r, &t) in toks.iter().enumerate() {
            self.send_logprobs(i, logits.get(r * v..(r + 1) * v).unwrap_or(&[]), t);
            if !self.commit(i, t, p0 + 1 + r) {
                return;
            }
        }
    }
}

/// The draws of a decode window (`rows` = the pending token, then drafts; `out` one draw a row, and the rows'
/// logits `v` wide when a fault is planted) whose first row sits at position `p0`: row `r` was drawn for
/// position `p0 + 1 + r`, and the walk stops at the first draw that differs from the next draft (the draw after
/// the last kept draft). A draw's error counts only if the walk reaches it.
pub(super) fn window_draws(
    params: &SamplingParams,
    p0: usize,
    rows: &[u32],
    out: &SegOut,
    v: usize,
    planted: Option<PlantedFault>,
) -> Result<Vec<u32>, String> {
    let n = rows.len() - 1;
    let mut toks = Vec::with_capacity(rows.len());
    for r in 0..=n {
        let at = p0 + 1 + r;
        let t = match out.draws.get(r) {
            Some(d) => d.clone().map_err(|e| format!("draw at position {at}: {e}"))?,
            None => return Err(format!("no draw at position {at}")),
        };
        toks.push(t);
        if r == n || t != rows[r + 1] {
            break;
        }
    }
    let k = toks.len() - 1;
    if planted == Some(PlantedFault::BonusFromWrongRow) && k > 0 {
        toks[k] = draw(params, (p0 + 1 + k) as u64, &out.logits[(k - 1) * v..k * v]).map_err(|e| e.to_string())?;
    }
    Ok(toks)
}
