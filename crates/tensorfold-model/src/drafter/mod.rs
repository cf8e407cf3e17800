//! The DSpark block drafter (docs/drafter.md): context K/V absorbed from the target's taps (`taps`), a
//! non-causal block pass of the anchor and mask tokens with the Markov chain and the confidence head (`block`),
//! its blocks read or held on the device (`held`), one draft call as data (`batch`).

mod batch;
mod block;
pub mod config;
mod held;
mod taps;
pub mod weights;

use crate::checkpoint::{CheckpointError, Source, TensorTable};
use crate::config::ModelConfig;
use crate::weights::WeightError;
pub use batch::DraftBatch;
pub use block::{BlockPass, DraftOut, Drafts};
pub use config::{DrafterConfig, DrafterConfigError, MAX_BLOCK};
pub use held::{HeldBlocks, HeldRows};
pub(crate) use taps::Taps;
use tensorfold_kernels::sample::SamplingParams;
use tensorfold_kernels::{Backend, RopeParams};
pub use weights::{DrafterBits, DrafterWeights};

/// Why a drafter checkpoint could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DrafterError {
    /// A file is missing, unreadable or corrupt.
    #[error("drafter: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// `config.json` refused.
    #[error(transparent)]
    Config(#[from] DrafterConfigError),
    /// A tensor does not fit the config.
    #[error("drafter: {0}")]
    Weights(#[from] WeightError),
    /// The backend's kernels cannot serve the drafter's attention shape (refused before any weight is bound).
    #[error("drafter: the device cannot serve its attention: {0} (serve without it: --no-drafts)")]
    Unserved(tensorfold_kernels::KernelError),
}

/// A loaded drafter on a backend (its embedding and head are the target's).
pub struct Drafter<B: Backend> {
    /// Admitted config.
    pub cfg: DrafterConfig,
    /// Weights on the device.
    pub weights: DrafterWeights<B>,
}

/// One stream's drafter context: per drafter layer, the K/V of every position the target consumed.
pub struct DraftState<B: Backend> {
    /// Context K/V per drafter layer (rows = the target's position).
    pub kv: Vec<B::Kv>,
}

impl<B: Backend> Clone for DraftState<B> {
    fn clone(&self) -> Self {
        Self { kv: self.kv.clone() }
    }
}

/// A stream's keyed draft pick for sampled requests: block row `k` (the draft for position `first + k`) is the keyed
/// draw ([`tensorfold_kernels::sample::draw`]) of that row's scores with `params` at `first + k`, made where the
/// scores live (`Backend::draw_into`). The engine passes the request's params and the position after the anchor:
/// sharing the target's Gumbel noise couples the two draws, so a drafter close to the target proposes the token the
/// target will draw (lossless either way: only equal tokens are kept). Refused params draft the greedy pick; so does,
/// under CUDA, a top-p nucleus longer than the device's 2048-key window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Picker {
    /// The request's sampling parameters.
    pub params: SamplingParams,
    /// Position of block row 0's draft (the anchor's position + 1).
    pub first: u64,
}

/// One stream's drafted block: `tokens[k]` proposes position `anchor_pos + k + 1`.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftBlock {
    /// The Markov chain's greedy picks `[block]`.
    pub tokens: Vec<u32>,
    /// `P(draft k accepted | drafts before it accepted)` `[block]` from the confidence head; empty without one.
    pub confidence: Vec<f32>,
    /// Markov-corrected scores `[block, vocab]` when asked for (tests, references); empty otherwise.
    pub scores: Vec<f32>,
}

/// Opens a drafter checkpoint directory against the target's config, its linears as stored.
pub fn open_drafter<B: Backend>(src: &Source, target: &ModelConfig, backend: &B) -> Result<Drafter<B>, DrafterError> {
    open_drafter_with(src, target, backend, DrafterBits::Stored)
}

/// Opens a drafter checkpoint with its linears in `bits` (`--drafter-bits 8`: 8-bit affine codes).
pub fn open_drafter_with<B: Backend>(
    src: &Source,
    target: &ModelConfig,
    backend: &B,
    bits: DrafterBits,
) -> Result<Drafter<B>, DrafterError> {
    let bytes = src
        .read("config.json")?
        .ok_or_else(|| CheckpointError::Missing { dir: src.describe(), file: "config.json".into() })?;
    let cfg = DrafterConfig::parse(&bytes, target)?;
    backend.check_attention(cfg.heads, cfg.kv_heads, cfg.head_dim).map_err(DrafterError::Unserved)?;
    let table = TensorTable::open(src)?;
    let weights = weights::bind(&cfg, &table, backend, bits)?;
    Ok(Drafter { cfg, weights })
}

impl<B: Backend> Drafter<B> {
    fn rope(&self) -> RopeParams {
        RopeParams { theta: self.cfg.rope_theta, head_dim: self.cfg.head_dim, interleaved: self.cfg.interleaved }
    }

    /// An empty context.
    pub fn new_state(&self, b: &B) -> DraftState<B> {
        DraftState { kv: (0..self.cfg.layers).map(|_| b.new_kv(self.cfg.kv_heads * self.cfg.head_dim)).collect() }
    }

    /// Bytes of K/V a context of `tokens` positions holds (f32 K and V rows of every layer).
    pub fn context_bytes(&self, tokens: usize) -> usize {
        let c = &self.cfg;
        [c.layers, 2, c.kv_heads, c.head_dim, 4, tokens].into_iter().fold(1usize, usize::saturating_mul)
    }

    /// Bytes of the drafter's weights on the device.
    pub fn weight_bytes(&self, b: &B) -> usize {
        let w = &self.weights;
        let mut n = w.fc.iter().map(|m| b.mat_bytes(m)).sum::<usize>();
        n += b.mat_bytes(&w.markov_w1) + b.mat_bytes(&w.markov_w2);
        for l in &w.layers {
            n +=
                [&l.q, &l.k, &l.v, &l.o, &l.mlp.w1, &l.mlp.w2, &l.mlp.w3].iter().map(|m| b.mat_bytes(m)).sum::<usize>();
        }
        n
    }

    /// Drops context rows past `pos` (the target rolled back to `pos` positions).
    pub fn truncate(&self, b: &B, s: &mut DraftState<B>, pos: usize) {
        for kv in &mut s.kv {
            b.kv_truncate(kv, pos);
        }
    }
}
