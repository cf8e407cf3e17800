//! Held drafts: the drafter's picks stay on the device and feed the verify without a host read; the core reads
//! them after the verify, fills the windows' placeholders, and refuses a failed block as the read pass does.

use super::Core;
use super::plan::{Entry, RoundDrafts};
use crate::target::{DraftCall, Drafts, SegOut, Target};
use tensorfold_kernels::KernelError;
use tensorfold_model::ForwardError;

/// The token a held draft's row carries on the host until the read (any valid id: the device embeds the pick).
const PLACEHOLDER: u32 = 0;

impl<T: Target> Core<T> {
    /// One held block pass over lanes `want`; true when it ran (or the device was lost), false when the target
    /// holds no drafts or the pass failed (the read pass then retries each stream alone and names it).
    pub(super) fn hold_blocks(&mut self, want: &[usize], drafts: &mut RoundDrafts<T::Held>) -> bool {
        let (anchors, pickers) = self.draft_inputs(want);
        let states: Vec<&T::State> = want.iter().map(|&i| &self.lanes[i].state).collect();
        let call = DraftCall { anchors: &anchors, pickers: &pickers, hold: true };
        match self.target.draft(&states, &call) {
            None | Some(Ok(Drafts::Read(_))) => false,
            Some(Ok(Drafts::Held { held, block })) => {
                for (j, &i) in want.iter().enumerate() {
                    let d = &mut drafts.lanes[i];
                    (d.block, d.held) = (vec![PLACEHOLDER; block], Some(j));
                }
                drafts.held = Some(held);
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
    /// Returns, per entry, the error of a block the read pass would have refused ([`Core::refuse_held`]). A failed
    /// block whose window carried none of its drafts (the budget or the request's room cut it to zero) is refused
    /// here, as the read pass refuses it before any window is sized.
    pub(super) fn apply_held(&mut self, entries: &mut [Entry], held: Option<T::Held>) -> Vec<Option<String>> {
        let mut refused = vec![None; entries.len()];
        let Some(h) = held else { return refused };
        let picks = self.target.read_held(&h);
        if let Some(e) = picks.iter().find_map(|p| p.as_ref().err()) {
            self.note_device(e);
        }
        for (e, bad) in entries.iter_mut().zip(&mut refused) {
            let s = &mut self.lanes[e.lane];
            let (Some(j), n) = (e.held, e.held_rows) else { continue };
            match picks.get(j) {
                Some(Err(err)) if n == 0 => s.stats.draft_error = Some(err.to_string()),
                _ if n == 0 => {}
                Some(Ok(p)) if p.len() >= n && e.rows.len() == n + 1 => {
                    e.rows[1..].copy_from_slice(&p[..n]);
                    if self.planted.held_picks_shifted() {
                        e.rows[1..].rotate_right(1);
                    }
                    self.counters.held_windows += 1;
                }
                Some(Err(err)) => *bad = Some(err.to_string()),
                _ => *bad = Some(format!("held drafts: no block of {n} for stream {j}")),
            }
        }
        refused
    }

    /// A held block that failed its read: as on the read path, the stream records the error, drafts no more, and this
    /// round keeps only its pending token's row (the state rolls back past the drafts' rows). Returns false when the
    /// rollback failed and the stream finished with that error.
    pub(super) fn refuse_held(&mut self, i: usize, rows: &mut Vec<u32>, out: &mut SegOut, error: String) -> bool {
        let n = rows.len() - 1;
        let s = &mut self.lanes[i];
        let pos = self.target.pos(&s.state);
        if let Err(e) = self.target.keep(&mut s.state, pos - n) {
            self.refuse_rollback(i, e);
            return false;
        }
        s.stats.draft_error = Some(error);
        rows.truncate(1);
        out.draws.truncate(1);
        out.logits.truncate(self.caps.vocab);
        true
    }
}
