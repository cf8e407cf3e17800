//! One draft call, [`DraftBatch`]: the streams, their anchors, their pickers and what the pass leaves (read blocks
//! or held picks) as data; `Model::draft` checks it and runs the drafter's block pass.

use super::{BlockPass, DraftOut, DraftState, Drafts, Picker};
use crate::forward::{ForwardError, Model};
use crate::state::StreamState;
use tensorfold_kernels::Backend;

/// A block pass for several streams: `anchors[i]` is stream i's pending token, at the stream's position.
pub struct DraftBatch<'a, B: Backend> {
    /// The streams, each with its drafter context.
    pub states: &'a [&'a StreamState<B>],
    /// One pending token a stream.
    pub anchors: &'a [u32],
    /// A [`Picker`] a stream for sampled requests (`None` or missing: greedy drafts).
    pub pickers: &'a [Option<Picker>],
    /// Read the blocks, or hold the picks on the device.
    pub out: DraftOut,
}

impl<'a, B: Backend> DraftBatch<'a, B> {
    /// A read pass of greedy drafts; `scores` keeps the Markov-corrected scores (tests, references).
    pub fn read(states: &'a [&'a StreamState<B>], anchors: &'a [u32], scores: bool) -> Self {
        Self { states, anchors, pickers: &[], out: DraftOut::Read { scores } }
    }

    /// A pass that holds its picks on the device, greedy drafts.
    pub fn held(states: &'a [&'a StreamState<B>], anchors: &'a [u32]) -> Self {
        Self { states, anchors, pickers: &[], out: DraftOut::Held }
    }

    /// The same pass with a picker a stream (sampled requests).
    pub fn with_pickers(self, pickers: &'a [Option<Picker>]) -> Self {
        Self { pickers, ..self }
    }
}

impl<B: Backend> Model<B> {
    /// The drafter's block pass over `d`'s streams. Errors: [`ForwardError::NoDrafter`], a token past the
    /// vocabulary, not one anchor a stream, a position mismatch; a read pass also a non-finite score
    /// ([`ForwardError::DraftNonfinite`]); a held pass also a device failure recorded during the pass
    /// ([`Backend::check`]), its non-finite scores being found by [`crate::drafter::HeldBlocks::read`].
    pub fn draft(&self, d: DraftBatch<'_, B>) -> Result<Drafts<B>, ForwardError> {
        let drafter = self.drafter.as_ref().ok_or(ForwardError::NoDrafter)?;
        if let Some(&id) = d.anchors.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(ForwardError::TokenOutOfRange { id, vocab: self.cfg.vocab });
        }
        if d.anchors.len() != d.states.len() || d.anchors.is_empty() {
            return Err(ForwardError::Batch("one anchor a stream".into()));
        }
        let ds: Vec<&DraftState<B>> =
            d.states.iter().map(|s| s.draft.as_ref().ok_or(ForwardError::NoDrafter)).collect::<Result<_, _>>()?;
        let at: Vec<(u32, usize)> = d.anchors.iter().zip(d.states).map(|(&t, s)| (t, s.pos)).collect();
        let w = &self.weights;
        let pass = BlockPass { embed: &w.embed, head: w.head_mat(), anchors: &at, states: &ds, pickers: d.pickers };
        // One watched wait, as a forward (`crate::watch`): a read pass ends with the host reading its blocks.
        let _waiting = self.waiting("drafter pass")?;
        let out = drafter.pass(&self.backend, &pass, d.out)?;
        if d.out == DraftOut::Held {
            // A failure recorded on the way (out of memory) is the pass's error now, not the verify's later.
            self.backend.check()?;
        }
        self.answered()?;
        Ok(out)
    }
}
