//! The dense SwiGLU feed-forward and its forward, with the residual add and the next layer's norm fused after it.

use super::{Acts, Cx, NextNorm};
use tensorfold_kernels::Backend;
use tensorfold_kernels::backend::Ffn;

/// A dense feed-forward: the weights of [`super::FfnWeights::Dense`] (`w1` gate, `w3` up, `w2` down), borrowed,
/// since callers match on that variant's contents.
pub struct DenseMlp<'w, B: Backend>(pub &'w Ffn<B::Mat>);

impl<B: Backend> DenseMlp<'_, B> {
    /// `acts.x += swiglu(acts.normed)`, then `acts.normed = rmsnorm(acts.x)` with `next` (the next layer's operator
    /// norm; `None` after the last layer: the add alone). Uses `acts.mixed` as its output scratch.
    pub(crate) fn forward(&self, cx: &Cx<'_, B>, acts: &mut Acts<B>, next: NextNorm<'_, B>) {
        let (b, rows, h) = (cx.b, cx.rows, cx.cfg.hidden);
        b.swiglu(&acts.normed, rows, self.0, &mut acts.mixed);
        match next {
            Some((norm, eps)) => b.add_rmsnorm(&mut acts.x, &acts.mixed, norm, eps, h, &mut acts.normed),
            None => b.add(&mut acts.x, &acts.mixed),
        }
    }
}

/// Bytes of one SwiGLU's three matrices on the device.
pub(crate) fn ffn_bytes<B: Backend>(b: &B, f: &Ffn<B::Mat>) -> usize {
    b.mat_bytes(&f.w1) + b.mat_bytes(&f.w2) + b.mat_bytes(&f.w3)
}
