//! What the lane core needs of a model: its stated capabilities, one forward over a round's rows and segments (what
//! each segment wants back is data: drawn rows, logits, held drafts), one drafter pass, and stream states it can
//! snapshot (prompt cache), size (memory admission) and roll back (verify). `ModelTarget` (`model_target.rs`) is the
//! real target; `fake` has a test target.

use crate::keyed::{DrawSpec, SampleError, draw};
use rayon::prelude::*;
use tensorfold_kernels::Segment;
use tensorfold_model::ForwardError;
use tensorfold_model::drafter::{DraftBlock, HeldRows, Picker};

/// What a target states about itself; the core reads it once, when it is made.
#[derive(Clone, Debug, PartialEq)]
pub struct Caps {
    /// Logits a row.
    pub vocab: usize,
    /// Context limit in positions.
    pub context: usize,
    /// End-of-sequence ids (generation_config.json and config.json).
    pub eos: Vec<u32>,
    /// Most drafts a verify window may carry: a window's rows must stay within what [`Target::keep`] can roll back
    /// (the engine caps `EngineConfig::max_draft` at it).
    pub max_draft: usize,
    /// The drafter's picks can stay where they were drawn ([`DraftCall::hold`]) and feed a verify without a host read.
    pub holds_drafts: bool,
}

/// What one segment of a round wants back from [`Target::forward`].
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
    pub fn rows(&self, seg: &Segment) -> std::ops::Range<usize> {
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

/// One forward over a round's rows: `segs[i].cache` indexes the states passed beside it, `wants[i]` says what
/// segment `i` wants back, and `held` names rows that take held drafts (their entries in `tokens` are placeholders).
pub struct ForwardCall<'a, H> {
    /// Every row's token id, segments back to back.
    pub tokens: &'a [u32],
    /// The segments (one a stream).
    pub segs: &'a [Segment],
    /// One a segment.
    pub wants: &'a [SegWant],
    /// The round's held blocks and the rows that take them; `None` when no row does.
    pub held: Option<(&'a H, &'a [HeldRows])>,
}

/// One drafter block pass over several streams.
#[derive(Clone, Copy, Debug)]
pub struct DraftCall<'a> {
    /// Each stream's pending token, at its position.
    pub anchors: &'a [u32],
    /// A picker a stream for sampled requests (`None` or missing: greedy drafts); targets without pickers ignore them.
    pub pickers: &'a [Option<Picker>],
    /// Keep the picks where they were drawn, for a [`ForwardCall::held`] (only where [`Caps::holds_drafts`]).
    pub hold: bool,
}

/// A block pass's result.
pub enum Drafts<H> {
    /// Every stream's block, read: `blocks[i].tokens[k]` proposes the token after position `pos + k`.
    Read(Vec<DraftBlock>),
    /// The picks left where they were drawn ([`DraftCall::hold`]): `block` drafts a stream, read after the verify
    /// with [`Target::read_held`].
    Held {
        /// The batch's blocks.
        held: H,
        /// Drafts each stream's block holds.
        block: usize,
    },
}

/// A model the engine can run.
pub trait Target: Send + 'static {
    /// One stream's state (`Clone` is a snapshot at the same position).
    type State: Send + Clone;
    /// A batch's drafted blocks left where the drafter ran (held drafts; `()` for targets without them).
    type Held: Send;
    /// What the target states about itself.
    fn caps(&self) -> Caps;
    /// The watch of its device waits, when they have a deadline: the engine's watchdog stops the engine with a
    /// `DeviceFailure` once a wait runs past it (`Engine::start`). `None` (the default, a target without a device):
    /// no deadline. The model target always has one.
    fn device_watch(&self) -> Option<std::sync::Arc<tensorfold_kernels::DeviceWatch>> {
        None
    }
    /// A fresh state at position 0.
    fn new_state(&self) -> Self::State;
    /// Positions a state has consumed.
    fn pos(&self, s: &Self::State) -> usize;
    /// Bytes a state holds now.
    fn state_bytes(&self, s: &Self::State) -> usize;
    /// Bytes a stream of `tokens` positions needs at most (memory admission), with verify windows of at most
    /// `verify_rows` rows (the engine's most drafts + 1).
    fn stream_bytes(&self, tokens: usize, verify_rows: usize) -> usize;
    /// One forward over every row of the call, serving each segment's [`SegWant`]: the draws where the logits live,
    /// logits copied only where asked, in segment order. A bad `wants` (a draw count that is not the row count) is
    /// refused, and so is a held row on a target that holds no drafts. A refusal leaves states unchanged; a failure
    /// after the forward began writing them leaves the call's states torn ([`Target::torn`]).
    fn forward(
        &self,
        call: &ForwardCall<'_, Self::Held>,
        states: &mut [&mut Self::State],
    ) -> Result<Vec<SegOut>, ForwardError>;
    /// Whether a failed forward left this state part-written: it cannot run on, so the engine ends its stream with
    /// that failure rather than run it again alone. The default: never (a target whose errors are all refusals).
    fn torn(&self, _s: &Self::State) -> bool {
        false
    }
    /// Rolls a state back to `pos` positions (at least its last call's first row): the kept path of a
    /// verify window. Refuses a position outside the last call.
    fn keep(&self, s: &mut Self::State, pos: usize) -> Result<(), ForwardError>;
    /// Reserves room for `tokens` positions and verify windows of `verify_rows` rows, so the stream holds what
    /// memory admission counted. Errors: the device cannot give that room now (`KernelError::OutOfMemory`: the
    /// engine finishes that request alone with it) or is lost (`DeviceLost`: the engine stops).
    fn reserve(&self, _s: &mut Self::State, _tokens: usize, _verify_rows: usize) -> Result<(), ForwardError> {
        Ok(())
    }
    /// A copy of a state to keep in the prompt cache or hand a group's follower (no rollback window; exact
    /// capacity). Errors: the copy could not be made (out of memory, a lost device) or the state is torn.
    fn snapshot(&self, s: &Self::State) -> Result<Self::State, ForwardError> {
        Ok(s.clone())
    }
    /// The drafter's block pass for each stream of `states`; `None` when the target has no drafter. With
    /// [`DraftCall::hold`] an error is one the read pass would give too; a non-finite score surfaces only in
    /// [`Target::read_held`].
    fn draft(
        &self,
        _states: &[&Self::State],
        _call: &DraftCall<'_>,
    ) -> Option<Result<Drafts<Self::Held>, ForwardError>> {
        None
    }
    /// Every stream's held drafts, read after the verify that used them: stream `j`'s block, or the error the
    /// read pass would have given that stream alone.
    fn read_held(&self, _held: &Self::Held) -> Vec<Result<Vec<u32>, ForwardError>> {
        Vec::new()
    }
}

/// [`Target::forward`] for targets that compute logits on the host: checks the call, runs `logits` (given, per
/// segment, whether it wants every row; it returns each segment's last row, `[vocab]`, or every row,
/// `[rows * vocab]`), then makes the keyed draws there. Held rows are refused: such targets hold no drafts.
pub fn host_forward<H>(
    call: &ForwardCall<'_, H>,
    vocab: usize,
    logits: impl FnOnce(&[bool]) -> Result<Vec<Vec<f32>>, ForwardError>,
) -> Result<Vec<SegOut>, ForwardError> {
    if call.held.is_some() {
        return Err(ForwardError::Batch("this target holds no drafts".into()));
    }
    check_wants(call.segs, call.wants)?;
    let all: Vec<bool> = call.wants.iter().map(|w| w.all_rows).collect();
    let logits = logits(&all)?;
    Ok(logits
        .into_par_iter()
        .zip(call.wants.par_iter())
        .map(|(l, w)| SegOut {
            draws: w
                .draws
                .iter()
                .enumerate()
                .map(|(r, d)| draw(&d.params, d.position, &l[r * vocab..(r + 1) * vocab]))
                .collect(),
            logits: if w.logits { l } else { Vec::new() },
        })
        .collect())
}

/// One [`SegWant`] a segment, every segment with rows, and a draw a wanted row or none.
pub fn check_wants(segs: &[Segment], wants: &[SegWant]) -> Result<(), ForwardError> {
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
