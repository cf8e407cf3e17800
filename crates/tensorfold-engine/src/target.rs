//! What the lane core needs of a model: one forward over a round's rows and segments, stream states it
//! can snapshot (prompt cache) and size (memory admission). `Model<B>` is the real target; `fake` has a
//! test target.

use tensorfold_kernels::{Backend, Segment};
use tensorfold_model::drafter::{DraftBlock, Picker};
use tensorfold_model::{ForwardError, LogitRows, Model, StreamState};

/// A model the engine can run.
pub trait Target: Send + 'static {
    /// One stream's state (`Clone` is a snapshot at the same position).
    type State: Send + Clone;
    /// Logits a row.
    fn vocab(&self) -> usize;
    /// Context limit in positions.
    fn context(&self) -> usize;
    /// End-of-sequence ids (generation_config.json and config.json).
    fn eos_ids(&self) -> Vec<u32>;
    /// A fresh state at position 0.
    fn new_state(&self) -> Self::State;
    /// Positions a state has consumed.
    fn pos(&self, s: &Self::State) -> usize;
    /// Bytes a state holds now.
    fn state_bytes(&self, s: &Self::State) -> usize;
    /// Bytes a stream of `tokens` positions needs at most (memory admission).
    fn stream_bytes(&self, tokens: usize) -> usize;
    /// One forward over every row of the round; `segs[i].cache` indexes `states`. Returns, in segment
    /// order, the logits of each segment's last row (`[vocab]`), or of every row when `all_rows[i]`
    /// (`[rows * vocab]`, a verify window). An error leaves states unchanged.
    fn forward(
        &self,
        tokens: &[u32],
        segs: &[Segment],
        states: &mut [&mut Self::State],
        all_rows: &[bool],
    ) -> Result<Vec<Vec<f32>>, ForwardError>;
    /// Rolls a state back to `pos` positions (at least its last call's first row): the kept path of a
    /// verify window. Refuses a position outside the last call.
    fn keep(&self, s: &mut Self::State, pos: usize) -> Result<(), ForwardError>;
    /// Reserves room for `tokens` positions, so the stream holds what memory admission counted.
    fn reserve(&self, _s: &mut Self::State, _tokens: usize) {}
    /// A copy of a state to keep in the prompt cache (no rollback window; exact capacity).
    fn snapshot(&self, s: &Self::State) -> Self::State {
        s.clone()
    }
    /// Drafts a block for each stream whose pending token is `anchors[i]` (the block drafter); `None` when
    /// the target has no drafter. `blocks[i].tokens[k]` proposes the token after position `pos + k`.
    fn draft(&self, _states: &[&Self::State], _anchors: &[u32]) -> Option<Result<Vec<DraftBlock>, ForwardError>> {
        None
    }
    /// [`Target::draft`] with a picker per stream for sampled requests (`None`: greedy drafts); targets without
    /// pickers ignore them.
    fn draft_keyed(
        &self,
        states: &[&Self::State],
        anchors: &[u32],
        _pickers: &[Option<&Picker>],
    ) -> Option<Result<Vec<DraftBlock>, ForwardError>> {
        self.draft(states, anchors)
    }
}

/// A loaded LFM2 model with its end-of-sequence ids.
pub struct ModelTarget<B: Backend> {
    /// The model (shared: a benchmark's solo runs may use the same weights).
    pub model: std::sync::Arc<Model<B>>,
    /// End-of-sequence ids.
    pub eos: Vec<u32>,
}

impl<B: Backend + 'static> Target for ModelTarget<B> {
    type State = StreamState<B>;

    fn vocab(&self) -> usize {
        self.model.cfg.vocab
    }

    fn context(&self) -> usize {
        self.model.cfg.max_positions
    }

    fn eos_ids(&self) -> Vec<u32> {
        self.eos.clone()
    }

    fn new_state(&self) -> StreamState<B> {
        self.model.new_state()
    }

    fn pos(&self, s: &StreamState<B>) -> usize {
        s.pos
    }

    fn state_bytes(&self, s: &StreamState<B>) -> usize {
        self.model.state_bytes(s)
    }

    fn stream_bytes(&self, tokens: usize) -> usize {
        self.model.stream_bytes(tokens)
    }

    fn forward(
        &self,
        tokens: &[u32],
        segs: &[Segment],
        states: &mut [&mut StreamState<B>],
        all_rows: &[bool],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let v = self.model.cfg.vocab;
        if segs.iter().any(|s| s.rows == 0) {
            return Err(ForwardError::Batch("a segment has no rows".into()));
        }
        let all = |i: usize| all_rows.get(i).copied().unwrap_or(false);
        let rows: Vec<usize> = segs
            .iter()
            .enumerate()
            .flat_map(|(i, s)| {
                if all(i) { s.first_row..s.first_row + s.rows } else { s.first_row + s.rows - 1..s.first_row + s.rows }
            })
            .collect();
        let out = self.model.forward(tokens, segs, states, LogitRows::Rows(rows))?;
        let mut at = 0;
        Ok(segs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let n = if all(i) { s.rows } else { 1 };
                at += n;
                out.logits[(at - n) * v..at * v].to_vec()
            })
            .collect())
    }

    fn keep(&self, s: &mut StreamState<B>, pos: usize) -> Result<(), ForwardError> {
        self.model.keep(s, pos)
    }

    fn draft(&self, states: &[&StreamState<B>], anchors: &[u32]) -> Option<Result<Vec<DraftBlock>, ForwardError>> {
        self.model.drafter.as_ref()?;
        Some(self.model.draft(states, anchors, false))
    }

    fn draft_keyed(
        &self,
        states: &[&StreamState<B>],
        anchors: &[u32],
        pickers: &[Option<&Picker>],
    ) -> Option<Result<Vec<DraftBlock>, ForwardError>> {
        self.model.drafter.as_ref()?;
        Some(self.model.draft_with(states, anchors, false, pickers))
    }

    fn reserve(&self, s: &mut StreamState<B>, tokens: usize) {
        self.model.reserve(s, tokens)
    }

    fn snapshot(&self, s: &StreamState<B>) -> StreamState<B> {
        self.model.snapshot(s)
    }
}
