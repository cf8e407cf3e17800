//! What the lane core needs of a model: one forward over a round's rows and segments, stream states it
//! can snapshot (prompt cache) and size (memory admission). `Model<B>` is the real target; `fake` has a
//! test target.

use crate::sampler::{DrawSpec, SampleError, draw};
use rayon::prelude::*;
use tensorfold_kernels::{Backend, Segment};
use tensorfold_model::drafter::{DraftBlock, HeldBlocks, HeldRows, Picker};
use tensorfold_model::{ForwardError, LogitRows, Model, RowWant, StreamState};

/// What one segment of a round wants back from [`Target::forward_drawn`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SegWant {
    /// Every row of the segment (a verify window), not only its last.
    pub all_rows: bool,
    /// The keyed draw of each of those rows, in order (empty: none; otherwise one a row).
    pub draws: Vec<DrawSpec>,
    /// Copy those rows' logits to the host (logprobs, the engine's planted faults).
    pub logits: bool,
}

impl SegWant {
    /// Rows this segment wants from the head: none when it asks for nothing (a prompt chunk before the last).
    fn rows(&self, seg: &Segment) -> std::ops::Range<usize> {
        let end = seg.first_row + seg.rows;
        match (self.draws.is_empty() && !self.logits, self.all_rows) {
            (true, _) => end..end,
            (false, true) => seg.first_row..end,
            (false, false) => end - 1..end,
        }
    }
}

/// What one segment got back: its draws and, when asked, its logits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SegOut {
    /// One result a requested draw, in row order.
    pub draws: Vec<Result<u32, SampleError>>,
    /// `[rows, vocab]` f32 when [`SegWant::logits`] asked for them; empty otherwise.
    pub logits: Vec<f32>,
}

/// A model the engine can run.
pub trait Target: Send + 'static {
    /// One stream's state (`Clone` is a snapshot at the same position).
    type State: Send + Clone;
    /// A batch's drafted blocks left where the drafter ran (held drafts; `()` for targets without them).
    type Held: Send;
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
    /// [`Target::forward`] serving each segment's [`SegWant`]: the draws where the logits live, logits copied
    /// only where asked. The default draws on the host from [`Target::forward`]'s logits (the same tokens);
    /// `ModelTarget` draws on its backend. A bad `wants` (a draw count that is not the row count) is refused.
    fn forward_drawn(
        &self,
        tokens: &[u32],
        segs: &[Segment],
        states: &mut [&mut Self::State],
        wants: &[SegWant],
    ) -> Result<Vec<SegOut>, ForwardError> {
        check_wants(segs, wants)?;
        let all: Vec<bool> = wants.iter().map(|w| w.all_rows).collect();
        let logits = self.forward(tokens, segs, states, &all)?;
        let v = self.vocab();
        Ok(logits
            .into_par_iter()
            .zip(wants.par_iter())
            .map(|(l, w)| SegOut {
                draws: w
                    .draws
                    .iter()
                    .enumerate()
                    .map(|(r, d)| draw(&d.params, d.position, &l[r * v..(r + 1) * v]))
                    .collect(),
                logits: if w.logits { l } else { Vec::new() },
            })
            .collect())
    }
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
        _pickers: &[Option<Picker>],
    ) -> Option<Result<Vec<DraftBlock>, ForwardError>> {
        self.draft(states, anchors)
    }
    /// [`Target::draft_keyed`] with the picks held where they were drawn, for [`Target::forward_held`]; `None` where
    /// the target cannot hold them (the engine then drafts with `draft_keyed`). An error here is one the synchronous
    /// pass would give too; a non-finite score surfaces only in [`Target::read_held`].
    fn draft_held(
        &self,
        _states: &[&Self::State],
        _anchors: &[u32],
        _pickers: &[Option<Picker>],
    ) -> Option<Result<Self::Held, ForwardError>> {
        None
    }
    /// Drafts each stream of `held` holds (the drafter's block).
    fn held_block(&self, _held: &Self::Held) -> usize {
        0
    }
    /// [`Target::forward_drawn`] whose `runs` take their rows' ids from `held` (the entries of `tokens` there are
    /// placeholders). Targets without held drafts refuse it.
    fn forward_held(
        &self,
        _tokens: &[u32],
        _held: (&Self::Held, &[HeldRows]),
        _segs: &[Segment],
        _states: &mut [&mut Self::State],
        _wants: &[SegWant],
    ) -> Result<Vec<SegOut>, ForwardError> {
        Err(ForwardError::Batch("this target holds no drafts".into()))
    }
    /// Every stream's held drafts, read after the verify that used them: stream `j`'s block, or the error the
    /// synchronous pass would have given that stream alone.
    fn read_held(&self, _held: &Self::Held) -> Vec<Result<Vec<u32>, ForwardError>> {
        Vec::new()
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
    type Held = HeldBlocks<B>;

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

    fn forward_drawn(
        &self,
        tokens: &[u32],
        segs: &[Segment],
        states: &mut [&mut StreamState<B>],
        wants: &[SegWant],
    ) -> Result<Vec<SegOut>, ForwardError> {
        self.drawn(tokens, None, segs, states, wants)
    }

    fn draft_held(
        &self,
        states: &[&StreamState<B>],
        anchors: &[u32],
        pickers: &[Option<Picker>],
    ) -> Option<Result<HeldBlocks<B>, ForwardError>> {
        self.model.drafter.as_ref()?;
        Some(self.model.draft_held(states, anchors, pickers))
    }

    fn held_block(&self, held: &HeldBlocks<B>) -> usize {
        held.block()
    }

    fn forward_held(
        &self,
        tokens: &[u32],
        held: (&HeldBlocks<B>, &[HeldRows]),
        segs: &[Segment],
        states: &mut [&mut StreamState<B>],
        wants: &[SegWant],
    ) -> Result<Vec<SegOut>, ForwardError> {
        self.drawn(tokens, Some(held), segs, states, wants)
    }

    fn read_held(&self, held: &HeldBlocks<B>) -> Vec<Result<Vec<u32>, ForwardError>> {
        held.read(&self.model.backend)
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
        pickers: &[Option<Picker>],
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

impl<B: Backend + 'static> ModelTarget<B> {
    /// [`Target::forward_drawn`], with held rows when given: the draws where the logits live.
    fn drawn(
        &self,
        tokens: &[u32],
        held: Option<(&HeldBlocks<B>, &[HeldRows])>,
        segs: &[Segment],
        states: &mut [&mut StreamState<B>],
        wants: &[SegWant],
    ) -> Result<Vec<SegOut>, ForwardError> {
        check_wants(segs, wants)?;
        let v = self.model.cfg.vocab;
        let mut rows = Vec::new();
        for (seg, w) in segs.iter().zip(wants) {
            for (k, row) in w.rows(seg).enumerate() {
                rows.push(RowWant { row, draw: w.draws.get(k).copied(), logits: w.logits });
            }
        }
        let out = self.model.forward_held(tokens, held, segs, states, LogitRows::Want(rows))?;
        let (mut draws, mut logits) = (out.draws.into_iter(), out.logits.chunks_exact(v.max(1)));
        Ok(segs
            .iter()
            .zip(wants)
            .map(|(seg, w)| {
                let n = w.rows(seg).len();
                let d: Vec<_> = draws.by_ref().take(n).flatten().collect();
                let l = if w.logits { logits.by_ref().take(n).flatten().copied().collect() } else { Vec::new() };
                SegOut { draws: d, logits: l }
            })
            .collect())
    }
}

/// One [`SegWant`] a segment, every segment with rows, and a draw a wanted row or none.
fn check_wants(segs: &[Segment], wants: &[SegWant]) -> Result<(), ForwardError> {
    if wants.len() != segs.len() {
        return Err(ForwardError::Batch(format!("{} wants for {} segments", wants.len(), segs.len())));
    }
    for (seg, w) in segs.iter().zip(wants) {
        if seg.rows == 0 {
            return Err(ForwardError::Batch("a segment has no rows".into()));
        }
        let rows = if w.all_rows { seg.rows } else { 1 };
        if !w.draws.is_empty() && w.draws.len() != rows {
            return Err(ForwardError::Batch(format!("{} draws for {rows} rows", w.draws.len())));
        }
    }
    Ok(())
}
