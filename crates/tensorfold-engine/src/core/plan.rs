//! A round's own state, apart from the streams': which lanes draft and their drafter blocks (decided before the
//! forward), and the [`RoundPlan`] the forward runs (one [`Entry`] of rows a stream, and the round's held blocks).

use crate::schedule::Mode;

/// One lane's drafting this round, decided before the plan.
#[derive(Clone, Debug, Default)]
pub(crate) struct LaneDraft {
    /// The lane drafts this round: decoding, its request drafts, its stream guard open, its drafter healthy.
    pub open: bool,
    /// The drafter's block (drafts for the positions after the pending token); placeholders when held.
    pub block: Vec<u32>,
    /// The drafter's confidence in each draft of `block` (empty without a confidence head).
    pub conf: Vec<f32>,
    /// The block is held: the stream's index in the round's held blocks.
    pub held: Option<usize>,
}

/// A round's drafting before its plan: one [`LaneDraft`] a lane (in lane order) and the blocks held on the device.
pub(crate) struct RoundDrafts<H> {
    /// By lane.
    pub lanes: Vec<LaneDraft>,
    /// The held blocks ([`LaneDraft::held`] indexes their streams).
    pub held: Option<H>,
}

/// One stream's rows in a round.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// Its lane (re-pointed when finishing other lanes reorders them).
    pub lane: usize,
    /// A decode window (the pending token, then drafts) or a prompt chunk.
    pub rows: Vec<u32>,
    /// Its block is held: the stream's index in the round's held blocks.
    pub held: Option<usize>,
    /// Rows after the pending token that take held drafts (0 when the window carries none of them).
    pub held_rows: usize,
}

impl Entry {
    /// An entry of `rows` on `lane`, with no held drafts.
    pub(crate) fn new(lane: usize, rows: Vec<u32>) -> Self {
        Self { lane, rows, held: None, held_rows: 0 }
    }
}

/// What one round runs: its mode, every stream's rows (decode windows first, then prompt chunks within the row
/// budget), and the drafter blocks held on the device that some windows take.
pub(crate) struct RoundPlan<H> {
    /// Plain or drafted.
    pub mode: Mode,
    /// One a stream that runs this round.
    pub entries: Vec<Entry>,
    /// The round's held blocks, read after the verify.
    pub held: Option<H>,
}

impl<H> RoundPlan<H> {
    /// Rows of the round.
    pub(crate) fn rows(&self) -> usize {
        self.entries.iter().map(|e| e.rows.len()).sum()
    }
}
