//! The real target: a loaded LFM2 model (and its drafter, when attached) behind [`Target`]: `Model::forward` of one
//! `Batch` serves every forward (the draws where the logits live), `Model::draft` of one `DraftBatch` the block
//! passes, `keep` the verify's rollback.

use crate::target::{Caps, DraftCall, Drafts, ForwardCall, SegOut, Target, check_wants};
use tensorfold_kernels::{Backend, Segment};
use tensorfold_model::drafter::{DraftOut, Drafts as ModelDrafts, HeldBlocks};
use tensorfold_model::{Batch, DraftBatch, ForwardError, LogitRows, Model, RowWant, StreamState};

/// Most drafts a window of the model target may carry: the conv kernels keep the rows of calls of at most
/// `KEEP_ROWS` (64), which a window of `MAX_DRAFT + 1` rows stays well within, so `keep` can roll any of it back.
pub const MAX_DRAFT: usize = 32;
const _: () = assert!(MAX_DRAFT < tensorfold_kernels::cpu::conv::KEEP_ROWS);

/// A loaded LFM2 model with its end-of-sequence ids.
pub struct ModelTarget<B: Backend> {
    /// The model (shared: a benchmark's solo runs may use the same weights).
    pub model: std::sync::Arc<Model<B>>,
    /// End-of-sequence ids.
    pub eos: Vec<u32>,
}

impl<B: Backend> Clone for ModelTarget<B> {
    fn clone(&self) -> Self {
        Self { model: self.model.clone(), eos: self.eos.clone() }
    }
}

impl<B: Backend + 'static> Target for ModelTarget<B> {
    type State = StreamState<B>;
    type Held = HeldBlocks<B>;

    /// Always the model's watch: every forward of every model, one device or several, is under the deadline.
    fn device_watch(&self) -> Option<std::sync::Arc<tensorfold_kernels::DeviceWatch>> {
        Some(self.model.watch.clone())
    }

    fn caps(&self) -> Caps {
        Caps {
            vocab: self.model.cfg.vocab,
            context: self.model.cfg.max_positions,
            eos: self.eos.clone(),
            max_draft: MAX_DRAFT,
            holds_drafts: true,
        }
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

    fn stream_bytes(&self, tokens: usize, verify_rows: usize) -> usize {
        self.model.stream_bytes(tokens, verify_rows)
    }

    fn forward(
        &self,
        call: &ForwardCall<'_, HeldBlocks<B>>,
        states: &mut [&mut StreamState<B>],
    ) -> Result<Vec<SegOut>, ForwardError> {
        check_wants(call.segs, call.wants)?;
        let v = self.model.cfg.vocab;
        let mut rows = Vec::new();
        for (seg, w) in call.segs.iter().zip(call.wants) {
            for (k, row) in w.rows(seg).enumerate() {
                rows.push(RowWant { row, draw: w.draws.get(k).copied(), logits: w.logits });
            }
        }
        let batch = Batch::new(call.tokens, call.segs, states, LogitRows::Want(rows));
        let out = self.model.forward(match call.held {
            Some((blocks, runs)) => batch.with_held(blocks, runs),
            None => batch,
        })?;
        let (mut draws, mut logits) = (out.draws.into_iter(), out.logits.chunks_exact(v.max(1)));
        Ok(call
            .segs
            .iter()
            .zip(call.wants)
            .map(|(seg, w)| {
                let n = w.rows(seg).len();
                let d: Vec<_> = draws.by_ref().take(n).flatten().collect();
                let l = if w.logits { logits.by_ref().take(n).flatten().copied().collect() } else { Vec::new() };
                SegOut { draws: d, logits: l }
            })
            .collect())
    }

    fn torn(&self, s: &StreamState<B>) -> bool {
        s.torn
    }

    fn keep(&self, s: &mut StreamState<B>, pos: usize) -> Result<(), ForwardError> {
        self.model.keep(s, pos)
    }

    fn reserve(&self, s: &mut StreamState<B>, tokens: usize, verify_rows: usize) -> Result<(), ForwardError> {
        self.model.reserve(s, tokens, verify_rows)
    }

    fn snapshot(&self, s: &StreamState<B>) -> Result<StreamState<B>, ForwardError> {
        self.model.snapshot(s)
    }

    fn draft(
        &self,
        states: &[&StreamState<B>],
        call: &DraftCall<'_>,
    ) -> Option<Result<Drafts<HeldBlocks<B>>, ForwardError>> {
        self.model.drafter.as_ref()?;
        let out = if call.hold { DraftOut::Held } else { DraftOut::Read { scores: false } };
        let pass = DraftBatch { states, anchors: call.anchors, pickers: call.pickers, out };
        Some(self.model.draft(pass).map(|d| match d {
            ModelDrafts::Read(blocks) => Drafts::Read(blocks),
            ModelDrafts::Held(held) => {
                let block = held.block();
                Drafts::Held { held, block }
            }
        }))
    }

    fn read_held(&self, held: &HeldBlocks<B>) -> Vec<Result<Vec<u32>, ForwardError>> {
        self.model.read_held(held)
    }
}

impl<B: Backend + 'static> ModelTarget<B> {
    /// The logits of a plain forward, copied to the host: each segment's last row (`[vocab]`), or every row when
    /// `all_rows[i]` (`[rows * vocab]`), in segment order. What [`Target::forward`]'s draws are checked against.
    pub fn logits(
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
        let out = self.model.forward(Batch::new(tokens, segs, states, LogitRows::Rows(rows)))?;
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
}
