//! Running a round, its second stage: the plan's inputs (token rows, segments, each segment's wants, the rows that
//! take held drafts) and the ONE target forward over them (or one per stream when shared rounds are off, or after a
//! failed shared forward for each stream whose state it left whole, so only a stream that fails alone fails).

use super::Core;
use super::plan::{Entry, RoundPlan};
use crate::keyed::DrawSpec;
use crate::target::{ForwardCall, SegOut, SegWant, Target};
use tensorfold_kernels::Segment;
use tensorfold_model::drafter::HeldRows;

/// A forward's failure as its streams finish with it: the message, and whether it was out of memory (the event says
/// so: a retry may succeed).
#[derive(Clone, Debug)]
pub(super) struct RowsError {
    pub(super) message: String,
    pub(super) out_of_memory: bool,
}

impl<T: Target> Core<T> {
    /// One forward over every planned row (or one per stream when shared rounds are off): each entry's
    /// draws (and logits where asked), or its error. Windows with drafts get a draw for every row.
    pub(super) fn run_forward(&mut self, plan: &RoundPlan<T::Held>) -> Vec<Result<SegOut, RowsError>> {
        let held = plan.held.as_ref();
        let alone =
            |core: &mut Self, e: &Entry| core.forward_rows(std::slice::from_ref(e), held).map(|mut l| l.remove(0));
        if !self.cfg.shared_rounds {
            return plan.entries.iter().map(|e| alone(self, e)).collect();
        }
        match self.forward_rows(&plan.entries, held) {
            Ok(l) => l.into_iter().map(Ok).collect(),
            // A device failure stops the engine: no retries.
            Err(e) if self.failure.is_some() => plan.entries.iter().map(|_| Err(e.clone())).collect(),
            // A refusal (checked before any state is written) or a failure that tore states (out of memory inside a
            // layer): each stream whose state is whole runs again alone, so only a stream that fails alone fails;
            // a torn one ends with the shared failure.
            Err(e) => plan
                .entries
                .iter()
                .map(|en| if self.target.torn(&self.lanes[en.lane].state) { Err(e.clone()) } else { alone(self, en) })
                .collect(),
        }
    }

    /// One target forward over the rows of `entries`.
    fn forward_rows(&mut self, entries: &[Entry], held: Option<&T::Held>) -> Result<Vec<SegOut>, RowsError> {
        if let Some(f) = &self.failure {
            return Err(RowsError { message: f.clone(), out_of_memory: false });
        }
        let mut tokens = Vec::new();
        let mut segs = Vec::new();
        let mut wants = Vec::new();
        let mut runs = Vec::new();
        for (k, e) in entries.iter().enumerate() {
            let start_pos = self.target.pos(&self.lanes[e.lane].state);
            if let Some(stream) = e.held.filter(|_| e.held_rows > 0) {
                runs.push(HeldRows { row: tokens.len() + 1, stream, count: e.held_rows });
            }
            segs.push(Segment { first_row: tokens.len(), rows: e.rows.len(), start_pos, cache: k });
            wants.push(self.want(e.lane, start_pos, e.rows.len()));
            tokens.extend_from_slice(&e.rows);
        }
        let held = held.filter(|_| !runs.is_empty()).map(|h| (h, runs.as_slice()));
        let call = ForwardCall { tokens: &tokens, segs: &segs, wants: &wants, held };
        let mut picked: Vec<Option<&mut super::stream::Stream<T::State>>> = self.lanes.iter_mut().map(Some).collect();
        let mut states: Vec<&mut T::State> =
            entries.iter().map(|e| &mut picked[e.lane].take().expect("one segment a lane").state).collect();
        self.target.forward(&call, &mut states).map_err(|e| {
            self.note_device(&e);
            RowsError { message: e.to_string(), out_of_memory: e.is_out_of_memory() }
        })
    }

    /// What a lane's segment of `rows` rows from `start` needs back: a decode window a draw a row (row `r` for
    /// position `start + 1 + r`), the prompt's last chunk the first token's draw, an earlier chunk nothing;
    /// logits only for logprobs or a planted fault.
    fn want(&self, lane: usize, start: usize, rows: usize) -> SegWant {
        let s = &self.lanes[lane];
        let (params, logprobs) = (s.req.params, s.req.logprobs.is_some());
        if s.controls.is_some() {
            return Self::controlled_want(s.pending.is_some(), start + rows == s.req.prompt.len(), rows);
        }
        if s.pending.is_none() {
            let last = start + rows == s.req.prompt.len();
            let draws = if last { vec![DrawSpec { params, position: (start + rows) as u64 }] } else { Vec::new() };
            // A group's leader hands its last row's logits to its followers (`fanout.rs`).
            return SegWant { all_rows: false, draws, logits: last && (logprobs || self.leads(lane)) };
        }
        let shift = |r: usize| usize::from(self.planted.draw_at_wrong_position() && r + 1 < rows);
        let draws = (0..rows).map(|r| DrawSpec { params, position: (start + 1 + r + shift(r)) as u64 }).collect();
        SegWant { all_rows: rows > 1, draws, logits: logprobs || self.planted.any() }
    }
}
