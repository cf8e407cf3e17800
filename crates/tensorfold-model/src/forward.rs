//! The LFM2 / LFM2-MoE model on a backend and its forward: one pass of every layer over a [`Batch`] (a table of
//! rows and segments with each stream's state), the layers in `crate::layers`, the drafter's taps and expert
//! parallelism called at fixed points (`crate::hooks`).

use crate::config::ModelConfig;
use crate::drafter::Drafter;
use crate::expert_parallel::ExpertParallel;
use crate::hooks::Hooks;
use crate::layers::{Acts, Cx};
use crate::state::{advance, tear};
use crate::weights::Weights;
use std::sync::Arc;
use tensorfold_kernels::{Backend, DeviceWatch, KernelError};

pub use crate::batch::{Batch, ForwardOut, HeldIds, LogitRows, RowWant};
pub use crate::state::{LayerState, StreamState};

/// A forward that could not run. A refusal (the call's rows, segments, positions, token ids, context, torn states)
/// is checked before any state changes and leaves every stream as it was; a failure after that (a kernel's, a
/// collective's, a device's) leaves every stream of the call torn (`StreamState::torn`).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ForwardError {
    /// A kernel refused its inputs.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A row would pass the model's context.
    #[error("position {pos} is past the context of {max} tokens")]
    ContextFull { pos: usize, max: usize },
    /// A token id past the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    /// A segment's start disagrees with its stream's position (an engine fault).
    #[error("segment of stream {cache} starts at {start} but the stream is at {pos}")]
    Position { cache: usize, start: usize, pos: usize },
    /// The call has no rows, or its segments do not cover them.
    #[error("invalid batch: {0}")]
    Batch(String),
    /// The drafter scored a non-finite value or picked past the vocabulary: refused, never a silent draft.
    #[error("DraftNonfinite: the drafter's score for block row {row} of stream {stream} is not finite")]
    DraftNonfinite { stream: usize, row: usize },
    /// A stream's state was left part-written by an earlier failed forward (`StreamState::torn`): it cannot run on.
    #[error("StateTorn: the stream's state was left part-written by a failed forward and cannot run on")]
    Torn,
    /// Drafts were asked of a model without a drafter.
    #[error("no drafter is attached")]
    NoDrafter,
}

impl ForwardError {
    /// Whether a kernel ran out of memory ([`KernelError::is_out_of_memory`]): the stream's alone, and a retry may
    /// succeed.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, ForwardError::Kernel(k) if k.is_out_of_memory())
    }
}

/// A loaded model on a backend.
pub struct Model<B: Backend> {
    /// Admitted config.
    pub cfg: ModelConfig,
    /// Weights on the device.
    pub weights: Weights<B>,
    /// The backend.
    pub backend: B,
    /// The DSpark drafter, when one is attached: every forward then copies its tap layers' rows and the
    /// drafter absorbs them.
    pub drafter: Option<Drafter<B>>,
    /// The experts' other devices, with expert parallelism (`crate::expert_parallel`); `None` on one device.
    pub ep: Option<ExpertParallel<B>>,
    /// The deadline on the model's device waits (`crate::watch`): every forward, block pass, held-draft read and
    /// stream-state call enters it, and a watchdog (the engine's) finds one past it. With expert parallelism, the collective's watch
    /// (`tensorfold_kernels::Watched`), so its calls and the forward around them are one wait.
    pub watch: Arc<DeviceWatch>,
}

impl<B: Backend> Model<B> {
    /// Runs every layer once over all rows of the batch. On success each stream's position advances by its rows
    /// and the rows `batch.want` names get their logits, picks or draws. Errors ([`ForwardError`]): a refused batch
    /// (rows, segments, positions, token ids, context, held runs, torn states) leaves all states unchanged, and so
    /// does a failure before the first layer (the embedding, the activations' buffers); a kernel's or a
    /// collective's failure after that is returned as it happened and tears every state of the call
    /// (`StreamState::torn`); a device given up by the watchdog (a wait past the deadline, this one or an earlier)
    /// is `KernelError::DeviceLost` ([`Model::answered`]).
    pub fn forward(&self, batch: Batch<'_, '_, B>) -> Result<ForwardOut, ForwardError> {
        // On the CPU, the whole forward runs on a worker of the kernels' pool: each kernel's split is then a cheap
        // fork from inside the pool instead of a cold hand-off from this thread and a sleep until it is done.
        self.backend.on_workers(|| self.forward_here(batch))
    }

    /// [`Model::forward`] on the calling thread.
    fn forward_here(&self, mut batch: Batch<'_, '_, B>) -> Result<ForwardOut, ForwardError> {
        self.check(&batch)?;
        // The whole forward is one watched wait (`crate::watch`): its launches, any collectives, and the sync that
        // reads its results, where a device that stops answering holds the host.
        let _waiting = self.waiting("forward")?;
        let rows = batch.tokens.len();
        let from = batch.held.as_ref().map(|h| h.picks(rows)).transpose()?;
        let (b, w, h) = (&self.backend, &self.weights, self.cfg.hidden);
        let mut x = b.scratch(rows * h);
        let held = batch.held.as_ref().map(|h| h.blocks.words()).zip(from.as_deref());
        w.embed_rows(b, batch.tokens, held, &mut x)?;
        let acts = Acts { x, normed: b.scratch(rows * h), mixed: b.scratch(rows * h) };
        // The last failure before any state is written: the activations' buffers.
        b.check()?;
        let out = self.write_states(&mut batch, acts);
        if out.is_err() {
            tear(batch.states);
        }
        out
    }

    /// The part of a forward that writes the streams' states: every layer, the hooks, the head. A failure here
    /// leaves the states part-written (the caller tears them). A failure recorded by an infallible call, or met
    /// sending the call's queued work (`Diagnostics::flush_check`), fails the call here rather than return garbage.
    fn write_states(&self, batch: &mut Batch<'_, '_, B>, mut acts: Acts<B>) -> Result<ForwardOut, ForwardError> {
        let (b, w, h) = (&self.backend, &self.weights, self.cfg.hidden);
        let rows = batch.tokens.len();
        let cx = Cx { b, cfg: &self.cfg, segs: batch.segs, rows };
        let mut hooks = Hooks::of(self, rows);
        // Each residual add is fused with the RMSNorm that follows it (`add_rmsnorm`, the same bits).
        if let Some(first) = w.layers.first() {
            b.rmsnorm(&acts.x, &first.operator_norm, self.cfg.norm_eps, h, &mut acts.normed);
        }
        for (i, layer) in w.layers.iter().enumerate() {
            let next = w.layers.get(i + 1).map(|n| &n.operator_norm);
            layer.forward(&cx, i, next, &mut acts, batch.states, &hooks)?;
            hooks.after_layer(b, i, &acts.x);
        }
        hooks.after_layers(b, batch.segs, batch.states)?;
        advance(batch.states, batch.segs);
        let out = w.head_rows(&cx, &acts.x, std::mem::replace(&mut batch.want, LogitRows::Last));
        // The logits are read: a hook's failure on the way fails the call (its results may be garbage).
        hooks.after_head(b, &acts.x, h, !out.rows.is_empty())?;
        // A read that came back after the watchdog gave the device up is not trusted: the engine has stopped.
        self.answered()?;
        // A forward without a head leaves its work queued: sent here, so its failure is this call's.
        b.flush_check()?;
        Ok(out)
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> usize {
        let b = &self.backend;
        let w = &self.weights;
        let layers: usize = w.layers.iter().map(|l| l.bytes(b)).sum();
        w.table_bytes(b) + layers + self.drafter.as_ref().map_or(0, |d| d.weight_bytes(b))
    }
}
