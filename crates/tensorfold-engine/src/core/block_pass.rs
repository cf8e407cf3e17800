//! The drafter's block pass of a drafted round (part of scheduling): one batched pass over every lane that drafts and
//! has no context copy, held on the device where it can be (`held.rs`), else read; on an error each stream is retried
//! alone, and a stream whose pass fails alone drafts no more.

use super::Core;
use super::plan::RoundDrafts;
use crate::copies::context_copy;
use crate::request::RequestId;
use crate::schedule::VerifyMode;
use crate::target::{DraftCall, Drafts, Target};
use tensorfold_kernels::KernelError;
use tensorfold_model::ForwardError;
use tensorfold_model::drafter::{DraftBlock, Picker};

impl<T: Target> Core<T> {
    /// One drafter block pass over every stream that drafts this round and has no context copy (one batched
    /// call; on an error each stream is retried alone). A stream whose pass fails alone records the error in its
    /// stats and decodes on without drafts (this round and after): it is never failed for its drafter.
    pub(super) fn draft_blocks(&mut self, drafts: &mut RoundDrafts<T::Held>) {
        let want: Vec<usize> = (0..self.lanes.len())
            .filter(|&i| drafts.lanes[i].open)
            .filter(|&i| context_copy(&self.lanes[i].history, self.cfg.copy_min, 1).is_empty())
            .collect();
        if want.is_empty() {
            return;
        }
        // Held drafts need no confidences first, so scheduled verify reads its blocks.
        let hold = self.cfg.held_drafts && self.cfg.verify != VerifyMode::Scheduled && self.caps.holds_drafts;
        if hold && self.hold_blocks(&want, drafts) {
            return;
        }
        let (results, shared) = self.read_blocks(&want);
        if let Some(e) = shared {
            self.note_device(&e);
        }
        let ids: Vec<RequestId> = want.iter().map(|&i| self.lanes[i].id).collect();
        for (id, r) in ids.into_iter().zip(results) {
            let Some(i) = self.lanes.iter().position(|s| s.id == id) else { continue };
            match r {
                Ok(b) => (drafts.lanes[i].block, drafts.lanes[i].conf) = (b.tokens, b.confidence),
                Err(e) => {
                    self.note_device(&e);
                    self.lanes[i].stats.draft_error = Some(e.to_string());
                    drafts.lanes[i].open = false;
                }
            }
        }
    }

    /// The read pass over lanes `want`: every block (or each stream's own error, after a failed batch retried stream
    /// by stream), and the batch's error when it failed. A lost device is not retried (the step then ends every
    /// stream); a target without a drafter gives no blocks.
    fn read_blocks(&self, want: &[usize]) -> (Vec<Result<DraftBlock, ForwardError>>, Option<ForwardError>) {
        let run = |ids: &[usize]| {
            let states: Vec<&T::State> = ids.iter().map(|&i| &self.lanes[i].state).collect();
            let (anchors, pickers) = self.draft_inputs(ids);
            let call = DraftCall { anchors: &anchors, pickers: &pickers, hold: false };
            self.target.draft(&states, &call).map(|r| r.and_then(read))
        };
        match run(want) {
            None => (Vec::new(), None),
            Some(Ok(blocks)) => (blocks.into_iter().map(Ok).collect(), None),
            Some(Err(shared @ ForwardError::Kernel(KernelError::DeviceLost { .. }))) => (Vec::new(), Some(shared)),
            Some(Err(shared)) => {
                let alone = want
                    .iter()
                    .map(|&i| match run(&[i]) {
                        Some(Ok(mut b)) => Ok(b.remove(0)),
                        Some(Err(e)) => Err(e),
                        None => Ok(DraftBlock { tokens: Vec::new(), confidence: Vec::new(), scores: Vec::new() }),
                    })
                    .collect();
                (alone, Some(shared))
            }
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
}

/// The blocks of a read pass; held picks there break the target's contract (asked not to hold, it reads them).
fn read<H>(d: Drafts<H>) -> Result<Vec<DraftBlock>, ForwardError> {
    match d {
        Drafts::Read(blocks) => Ok(blocks),
        Drafts::Held { .. } => Err(ForwardError::Batch("a read pass returned held drafts".into())),
    }
}
