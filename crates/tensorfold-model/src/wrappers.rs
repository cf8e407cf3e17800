//! The `Model` calls the engine (`tensorfold-engine/src/target.rs`, `solo.rs`), the bin and the tests make today,
//! kept as thin wrappers over [`Model::forward_batch`] and [`Model::draft_batch`] while the engine moves to them;
//! removed at merge.

use crate::batch::{Batch, ForwardOut, LogitRows};
use crate::drafter::{DraftBatch, DraftBlock, DraftOut, Drafts, HeldBlocks, HeldRows, Picker};
use crate::forward::{ForwardError, Model};
use crate::state::StreamState;
use tensorfold_kernels::{Backend, Segment};

impl<B: Backend> Model<B> {
    /// Wraps [`Model::forward_batch`] of `Batch::new(tokens, segs, states, which)`: every layer once over all rows
    /// of `tokens`; `segs[i].cache` indexes `states`. Errors leave all states unchanged.
    pub fn forward(
        &self,
        tokens: &[u32],
        segs: &[Segment],
        states: &mut [&mut StreamState<B>],
        which: LogitRows,
    ) -> Result<ForwardOut, ForwardError> {
        self.forward_batch(Batch::new(tokens, segs, states, which))
    }

    /// Wraps [`Model::forward_batch`] of `Batch::new(..).with_held(blocks, runs)` when `held` is given: rows whose
    /// ids are held drafts ([`Model::draft_held`]), taken on the device. Errors as `forward`, and
    /// [`ForwardError::Batch`] for held rows outside the call or the blocks.
    pub fn forward_held(
        &self,
        tokens: &[u32],
        held: Option<(&HeldBlocks<B>, &[HeldRows])>,
        segs: &[Segment],
        states: &mut [&mut StreamState<B>],
        which: LogitRows,
    ) -> Result<ForwardOut, ForwardError> {
        let batch = Batch::new(tokens, segs, states, which);
        self.forward_batch(match held {
            Some((blocks, runs)) => batch.with_held(blocks, runs),
            None => batch,
        })
    }

    /// Wraps [`Model::draft_batch`] with no pickers (greedy drafts) and [`DraftOut::Read`] (`scores` as
    /// `want_scores`).
    pub fn draft(
        &self,
        states: &[&StreamState<B>],
        anchors: &[u32],
        want_scores: bool,
    ) -> Result<Vec<DraftBlock>, ForwardError> {
        self.draft_with(states, anchors, want_scores, &[])
    }

    /// Wraps [`Model::draft_batch`] with `pickers` and [`DraftOut::Read`] (`scores` as `want_scores`).
    pub fn draft_with(
        &self,
        states: &[&StreamState<B>],
        anchors: &[u32],
        want_scores: bool,
        pickers: &[Option<Picker>],
    ) -> Result<Vec<DraftBlock>, ForwardError> {
        match self.draft_batch(DraftBatch { states, anchors, pickers, out: DraftOut::Read { scores: want_scores } })? {
            Drafts::Read(blocks) => Ok(blocks),
            Drafts::Held(_) => unreachable!("a read pass returns read blocks"),
        }
    }

    /// Wraps [`Model::draft_batch`] with `pickers` and [`DraftOut::Held`]: the picks held on the device for
    /// [`Model::forward_held`].
    pub fn draft_held(
        &self,
        states: &[&StreamState<B>],
        anchors: &[u32],
        pickers: &[Option<Picker>],
    ) -> Result<HeldBlocks<B>, ForwardError> {
        match self.draft_batch(DraftBatch { states, anchors, pickers, out: DraftOut::Held })? {
            Drafts::Held(held) => Ok(held),
            Drafts::Read(_) => unreachable!("a held pass returns held blocks"),
        }
    }
}
