//! One forward's input, [`Batch`]: the row table (token ids), the segment table, the streams' states, held-draft
//! rows, and which rows want logits or draws; its output, [`ForwardOut`]; and the checks it passes before any
//! state changes.

use crate::drafter::{HeldBlocks, HeldRows};
use crate::forward::{ForwardError, Model};
use crate::state::{LayerState, StreamState};
use tensorfold_kernels::sample::{DrawSpec, SampleError};
use tensorfold_kernels::{Backend, Pick, Segment};

/// One forward over every row of a round: `segs[i].cache` indexes `states`, and the segments cover the rows of
/// `tokens` in order.
pub struct Batch<'a, 's, B: Backend> {
    /// Token id a row; under `held`, the held rows' entries are placeholders.
    pub tokens: &'a [u32],
    /// One segment a stream: its rows of the call and its start position.
    pub segs: &'a [Segment],
    /// The streams' states, advanced by their rows on success, untouched on a refusal, torn on a failure.
    pub states: &'a mut [&'s mut StreamState<B>],
    /// Rows whose ids are held drafts, taken on the device ([`Model::draft`] with
    /// [`crate::drafter::DraftOut::Held`]).
    pub held: Option<HeldIds<'a, B>>,
    /// Which rows get logits, picks or draws.
    pub want: LogitRows,
}

impl<'a, 's, B: Backend> Batch<'a, 's, B> {
    /// A batch of plain token rows.
    pub fn new(
        tokens: &'a [u32],
        segs: &'a [Segment],
        states: &'a mut [&'s mut StreamState<B>],
        want: LogitRows,
    ) -> Self {
        Self { tokens, segs, states, held: None, want }
    }

    /// The same batch with `runs` taking their rows' ids from `blocks`.
    pub fn with_held(self, blocks: &'a HeldBlocks<B>, runs: &'a [HeldRows]) -> Self {
        Self { held: Some(HeldIds { blocks, runs }), ..self }
    }
}

/// Rows of a batch whose ids are held drafts: each [`HeldRows`] of `runs` names rows that take a stream's picks
/// from `blocks`.
pub struct HeldIds<'a, B: Backend> {
    /// The drafted blocks, on the device.
    pub blocks: &'a HeldBlocks<B>,
    /// Which rows take which stream's drafts.
    pub runs: &'a [HeldRows],
}

impl<B: Backend> HeldIds<'_, B> {
    /// [`Backend::embed_held`]'s `(row, pick)` pairs, each run checked against the call's `rows` and the blocks.
    /// Errors: [`ForwardError::Batch`] for a run outside the call or the blocks.
    pub(crate) fn picks(&self, rows: usize) -> Result<Vec<(usize, usize)>, ForwardError> {
        let blocks = self.blocks;
        let mut from = Vec::new();
        for r in self.runs {
            if r.stream >= blocks.streams() || r.count > blocks.block() || r.row + r.count > rows {
                return Err(ForwardError::Batch(format!(
                    "held rows {}..{} of stream {} outside a call of {rows} rows or blocks of {} streams x {}",
                    r.row,
                    r.row + r.count,
                    r.stream,
                    blocks.streams(),
                    blocks.block()
                )));
            }
            from.extend((0..r.count).map(|k| (r.row + k, blocks.pick(r.stream, k))));
        }
        Ok(from)
    }
}

/// Which rows of a call get logits.
#[derive(Clone, Debug, PartialEq)]
pub enum LogitRows {
    /// Every row (verify windows, `tensorfold exact`).
    All,
    /// The last row of each segment (prefill chunks, decode).
    Last,
    /// These call rows, in this order (verify windows beside prompt chunks).
    Rows(Vec<usize>),
    /// These call rows, each drawn where its logits live and/or copied to the host; an empty list skips the
    /// head (a prompt chunk before the last).
    Want(Vec<RowWant>),
}

/// One call row the head serves under [`LogitRows::Want`].
#[derive(Clone, Debug, PartialEq)]
pub struct RowWant {
    /// The call row.
    pub row: usize,
    /// Its keyed draw ([`tensorfold_kernels::Backend::draw_rows`]), if any.
    pub draw: Option<DrawSpec>,
    /// Copy its logits to the host (logprobs).
    pub logits: bool,
}

/// Logits, greedy picks and draws of the rows that asked for them.
#[derive(Clone, Debug)]
pub struct ForwardOut {
    /// Call rows that have logits, in order.
    pub rows: Vec<usize>,
    /// `[rows.len(), vocab]` f32; under [`LogitRows::Want`] only the rows that asked for logits, in order.
    pub logits: Vec<f32>,
    /// Greedy pick of each logits row (first largest; non-finite rows flagged); empty under [`LogitRows::Want`].
    pub picks: Vec<Pick>,
    /// Under [`LogitRows::Want`], each row's draw (`None` where none was asked); empty otherwise.
    pub draws: Vec<Option<Result<u32, SampleError>>>,
}

impl<B: Backend> Model<B> {
    /// Validates a batch before it touches any state: rows and segments, token ids, positions (the target's
    /// and the drafter's), the context, and the rows asked for. Held runs are checked by [`HeldIds::picks`].
    pub(crate) fn check(&self, batch: &Batch<'_, '_, B>) -> Result<(), ForwardError> {
        let (tokens, segs, states) = (batch.tokens, batch.segs, &*batch.states);
        if tokens.is_empty() || segs.is_empty() {
            return Err(ForwardError::Batch("no rows".into()));
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(ForwardError::TokenOutOfRange { id, vocab: self.cfg.vocab });
        }
        let mut covered = 0;
        let mut seen = vec![false; states.len()];
        for s in segs {
            let st = states
                .get(s.cache)
                .ok_or_else(|| ForwardError::Batch(format!("segment names stream {} of {}", s.cache, states.len())))?;
            if std::mem::replace(&mut seen[s.cache], true) {
                return Err(ForwardError::Batch(format!("two segments name stream {}", s.cache)));
            }
            if s.rows == 0 || s.first_row != covered {
                return Err(ForwardError::Batch("segments must cover the rows in order, each non-empty".into()));
            }
            self.check_positions(s, st)?;
            if s.start_pos + s.rows > self.cfg.max_positions {
                return Err(ForwardError::ContextFull { pos: s.start_pos + s.rows, max: self.cfg.max_positions });
            }
            covered += s.rows;
        }
        if covered != tokens.len() {
            return Err(ForwardError::Batch(format!("segments cover {covered} of {} rows", tokens.len())));
        }
        let asked: Vec<usize> = match &batch.want {
            LogitRows::Rows(r) => r.clone(),
            LogitRows::Want(w) => w.iter().map(|w| w.row).collect(),
            _ => Vec::new(),
        };
        if let Some(bad) = asked.iter().find(|&&i| i >= covered) {
            return Err(ForwardError::Batch(format!("logits asked for row {bad} of {covered}")));
        }
        Ok(())
    }

    /// A segment's stream is at its start: its position, every attention layer's key rows and, with a drafter,
    /// the drafter's context rows all equal `start_pos`, so no layer can refuse mid-forward.
    fn check_positions(&self, s: &Segment, st: &StreamState<B>) -> Result<(), ForwardError> {
        if st.torn {
            return Err(ForwardError::Torn);
        }
        if st.pos != s.start_pos {
            return Err(ForwardError::Position { cache: s.cache, start: s.start_pos, pos: st.pos });
        }
        if let Some(held) = st.layers.iter().find_map(|l| match l {
            LayerState::Kv(k) => Some(self.backend.kv_len(k)).filter(|&n| n != st.pos),
            LayerState::Conv(_) => None,
        }) {
            return Err(ForwardError::Position { cache: s.cache, start: s.start_pos, pos: held });
        }
        if let Some(d) = &self.drafter {
            let held = st.draft.as_ref().and_then(|ds| ds.kv.first()).map(|k| self.backend.kv_len(k));
            if d.cfg.layers > 0 && held != Some(st.pos) {
                return Err(ForwardError::Position { cache: s.cache, start: s.start_pos, pos: held.unwrap_or(0) });
            }
        }
        Ok(())
    }
}
