//! The decoder's layers, one kind a file (the conv and attention mixers, the dense and MoE feed-forwards, the
//! embedding and head), and one decoder layer's forward over a batch's rows: mixer, residual add and FFN norm, FFN,
//! residual add and the next layer's norm.

pub mod attention;
pub mod conv;
pub mod head;
pub mod mlp;
pub mod moe;

use crate::config::ModelConfig;
use crate::forward::ForwardError;
use crate::hooks::Hooks;
use crate::state::{StreamState, conv_states, kv_states};
pub use attention::AttnWeights;
pub use conv::ConvWeights;
pub use mlp::DenseMlp;
use mlp::ffn_bytes;
pub use moe::Moe;
use tensorfold_kernels::backend::Ffn;
use tensorfold_kernels::{Backend, Segment};

/// A layer's mixer.
pub enum MixerWeights<B: Backend> {
    /// Short conv.
    Conv(ConvWeights<B>),
    /// Attention.
    Attn(AttnWeights<B>),
}

/// A layer's feed-forward.
pub enum FfnWeights<B: Backend> {
    /// Dense SwiGLU ([`DenseMlp`] runs it).
    Dense(Ffn<B::Mat>),
    /// MoE: router `[experts, h]`, optional f32 expert bias `[experts]`, SwiGLU experts ([`Moe`] runs it).
    Moe { gate: B::Mat, bias: Option<B::Buf>, experts: Vec<Ffn<B::Mat>> },
}

/// One decoder layer.
pub struct LayerWeights<B: Backend> {
    /// `operator_norm.weight` `[h]`.
    pub operator_norm: B::Buf,
    /// `ffn_norm.weight` `[h]`.
    pub ffn_norm: B::Buf,
    /// Mixer.
    pub mixer: MixerWeights<B>,
    /// Feed-forward.
    pub ffn: FfnWeights<B>,
}

/// What every layer of one forward reads: the backend, the config, the segment table and the row count.
pub(crate) struct Cx<'a, B: Backend> {
    /// The device.
    pub b: &'a B,
    /// The model's config.
    pub cfg: &'a ModelConfig,
    /// The batch's segments (checked: they cover `rows` in order).
    pub segs: &'a [Segment],
    /// Rows of the batch.
    pub rows: usize,
}

/// The row buffers the layers read and write, each `[rows, hidden]` f32.
pub(crate) struct Acts<B: Backend> {
    /// The residual stream.
    pub x: B::Buf,
    /// The normed rows the next sub-block reads.
    pub normed: B::Buf,
    /// A mixer's or dense MLP's output before its residual add.
    pub mixed: B::Buf,
}

/// The norm fused after a feed-forward's residual add: the next layer's operator norm and eps, `None` after the
/// last layer.
pub(crate) type NextNorm<'a, B> = Option<(&'a <B as tensorfold_kernels::backend::Memory>::Buf, f32)>;

impl<B: Backend> LayerWeights<B> {
    /// Layer `i` over every row: the mixer on `acts.normed` (reading and advancing each stream's layer-`i` state),
    /// its residual add fused with this layer's FFN norm, then the feed-forward with its residual add fused with
    /// `next` (the next layer's operator norm). Errors: a kernel's or a collective's.
    pub(crate) fn forward(
        &self,
        cx: &Cx<'_, B>,
        i: usize,
        next: Option<&B::Buf>,
        acts: &mut Acts<B>,
        states: &mut [&mut StreamState<B>],
        hooks: &Hooks<'_, B>,
    ) -> Result<(), ForwardError> {
        let (b, eps, h) = (cx.b, cx.cfg.norm_eps, cx.cfg.hidden);
        match &self.mixer {
            MixerWeights::Conv(w) => w.forward(cx, &acts.normed, &mut conv_states(states, i), &mut acts.mixed)?,
            MixerWeights::Attn(w) => w.forward(cx, &acts.normed, &mut kv_states(states, i), &mut acts.mixed)?,
        }
        b.add_rmsnorm(&mut acts.x, &acts.mixed, &self.ffn_norm, eps, h, &mut acts.normed);
        let next = next.map(|n| (n, eps));
        match &self.ffn {
            FfnWeights::Dense(f) => DenseMlp(f).forward(cx, acts, next),
            FfnWeights::Moe { gate, bias, experts } => {
                Moe { layer: i, gate, bias: bias.as_ref(), experts }.forward(cx, acts, next, hooks)?
            }
        }
        Ok(())
    }

    /// Bytes of its matrices on the device (norms and biases are not counted).
    pub fn bytes(&self, b: &B) -> usize {
        let mixer = match &self.mixer {
            MixerWeights::Conv(c) => c.bytes(b),
            MixerWeights::Attn(a) => a.bytes(b),
        };
        let ffn = match &self.ffn {
            FfnWeights::Dense(f) => ffn_bytes(b, f),
            FfnWeights::Moe { gate, experts, .. } => {
                b.mat_bytes(gate) + experts.iter().map(|f| ffn_bytes(b, f)).sum::<usize>()
            }
        };
        mixer + ffn
    }
}
