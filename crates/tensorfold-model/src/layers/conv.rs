//! The LFM2 short-conv mixer: its weights and its forward (`in_proj`, the causal depthwise conv over each
//! stream's conv state, `out_proj`).

use super::Cx;
use tensorfold_kernels::{Backend, KernelError};

/// Conv mixer weights (`conv.*`).
pub struct ConvWeights<B: Backend> {
    /// `in_proj` `[3h, h]` giving B, C, x.
    pub in_proj: B::Mat,
    /// `in_proj.bias` `[3h]` when `conv_bias`.
    pub in_bias: Option<B::Buf>,
    /// Depthwise kernel `[h, taps]` (from `conv.conv.weight` `[h, 1, taps]`).
    pub kernel: B::Buf,
    /// `conv.conv.bias` `[h]` when `conv_bias`.
    pub kernel_bias: Option<B::Buf>,
    /// `out_proj` `[h, h]`.
    pub out_proj: B::Mat,
    /// `out_proj.bias` `[h]` when `conv_bias`.
    pub out_bias: Option<B::Buf>,
}

impl<B: Backend> ConvWeights<B> {
    /// Mixes `normed` `[rows, h]` f32 into `out` `[rows, h]`: `in_proj` to B, C, x `[rows, 3h]`, the short conv
    /// reading `states` (one a segment, in segment order) and advancing each to its segment's last row, then
    /// `out_proj`. Errors: the conv kernel's refusal (a state that does not fit its segment).
    pub(crate) fn forward(
        &self,
        cx: &Cx<'_, B>,
        normed: &B::Buf,
        states: &mut [&mut B::Conv],
        out: &mut B::Buf,
    ) -> Result<(), KernelError> {
        let (b, rows, h) = (cx.b, cx.rows, cx.cfg.hidden);
        let mut bcx = b.scratch(rows * 3 * h);
        b.linear(normed, rows, &self.in_proj, self.in_bias.as_ref(), &mut bcx);
        let mut y = b.scratch(rows * h);
        b.short_conv(&bcx, h, &self.kernel, self.kernel_bias.as_ref(), cx.segs, states, &mut y)?;
        b.linear(&y, rows, &self.out_proj, self.out_bias.as_ref(), out);
        Ok(())
    }

    /// Bytes of its matrices on the device.
    pub fn bytes(&self, b: &B) -> usize {
        b.mat_bytes(&self.in_proj) + b.mat_bytes(&self.out_proj)
    }
}
