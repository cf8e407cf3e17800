//! Held drafts: the drafter's picks stay on the device and feed the verify without a host read; the core reads
//! them after the verify, fills the windows' placeholders, and refuses a failed block as the synchronous pass does.

use super::{Core, Plan};
use crate::target::{SegOut, Target};
use tensorfold_kernels::KernelError;
use tensorfold_model::ForwardError;
use tensorfold_model::drafter::Picker;

/// The token a held draft's row carries on the host until the read (any valid id: the device embeds the pick).
const PLACEHOLDER: u32 = 0;

impl<T: Target> Core<T> {
    /// Forgets the last round's held blocks.
    pub(super) fn clear_held(&mut self) {
        self.held = None;
        for s in &mut self.lanes {
            (s.held, s.held_rows) = (None, 0);
        }
    }

    /// Each drafting lane's pending token and picker (sampled requests draft with their own keyed draw at each
    /// draft's position: the pending token sits at `pos`, draft k is checked against the draw at `pos + 1 + k`).
    pub(super) fn draft_inputs(&self, ids: &[usize]) -> (Vec<u32>, Vec<Option<Picker>>) {
        let anchors = ids.iter().map(|&i| self.lanes[i].pending.expect("drafting lanes decode")).collect();
        let pickers = ids
            .iter()
            .map(|&i| {
                let params = self.lanes[i].req.params;
                let first = (self.target.pos(&self.lanes[i].state) + 1) as u64;
                (!params.is_greedy()).then_some(Picker { params, first })
            })
            .collect();
        (anchors, pickers)
    }

    /// One held block pass over lanes `want`; true when it ran (or the device was lost), false when the target
    /// holds no drafts or the pass failed (the synchronous pass then retries each stream alone and names it).
    pub(super) fn hold_blocks(&mut self, want: &[usize]) -> bool {
        let (anchors, pickers) = self.draft_inputs(want);
        let states: Vec<&T::State> = want.iter().map(|&i| &self.lanes[i].state).collect();
        match self.target.draft_held(&states, &anchors, &pickers) {
            None => false,
            Some(Ok(h)) => {
                let n = self.target.held_block(&h);
                for (j, &i) in want.iter().enumerate() {
                    let s = &mut self.lanes[i];
                    (s.block, s.held) = (vec![PLACEHOLDER; n], Some(j));
                }
                self.held = Some(h);
                true
            }
            Some(Err(e @ ForwardError::Kernel(KernelError::DeviceLost { .. }))) => {
                self.note_device(&e);
                true
            }
            Some(Err(_)) => false,
        }
    }

    /// After the verify forward: reads the held blocks once and writes each window's drafts over its placeholders.
    /// Returns, per plan entry, the error of a block the synchronous pass would have refused ([`Core::refuse_held`]).
    /// A failed block whose window carried none of its drafts (the budget or the request's room cut it to zero) is
    /// refused here, as the synchronous pass refuses it before any window is sized.
    pub(super) fn apply_held(&mut self, plan: &mut Plan) -> Vec<Option<String>> {
        let mut refused = vec![None; plan.len()];
        let Some(h) = self.held.take() else { return refused };
        let picks = self.target.read_held(&h);
        if let Some(e) = picks.iter().find_map(|p| p.as_ref().err()) {
            self.note_device(e);
        }
        for ((lane, rows), bad) in plan.iter_mut().zip(&mut refused) {
            let s = &mut self.lanes[*lane];
            let (Some(j), n) = (s.held, s.held_rows) else { continue };
            match picks.get(j) {
                Some(Err(e)) if n == 0 => (s.stats.draft_error, s.open) = (Some(e.to_string()), false),
                _ if n == 0 => {}
                Some(Ok(p)) if p.len() >= n && rows.len() == n + 1 => {
                    rows[1..].copy_from_slice(&p[..n]);
                    if self.cfg.planted == Some(super::PlantedFault::HeldPicksShifted) {
                        rows[1..].rotate_right(1);
                    }
                    self.counters.held_windows += 1;
                }
                Some(Err(e)) => *bad = Some(e.to_string()),
                _ => *bad = Some(format!("held drafts: no block of {n} for stream {j}")),
            }
        }
        refused
    }

    /// A held block that failed its read: as on the synchronous path, the stream records the error, drafts no more,
    /// and this round keeps only its pending token's row (the state rolls back past the drafts' rows). Returns false
    /// when the rollback failed and the stream finished with that error.
    pub(super) fn refuse_held(&mut self, i: usize, rows: &mut Vec<u32>, out: &mut SegOut, error: String) -> bool {
        let n = rows.len() - 1;
        let s = &mut self.lanes[i];
        let pos = self.target.pos(&s.state);
        if let Err(e) = self.target.keep(&mut s.state, pos - n) {
            self.finish(i, crate::request::FinishReason::Error, Some(format!("rolling back a verify window: {e}")));
            return false;
        }
        (s.stats.draft_error, s.open) = (Some(error), false);
        rows.truncate(1);
        out.draws.truncate(1);
        out.logits.truncate(self.target.vocab());
        true
    }
}
