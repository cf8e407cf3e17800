//! The LFM2 attention mixer: its weights and its forward (q/k/v projections, per-head norm and RoPE, causal GQA
//! attention over each stream's KV rows, the output projection).

use super::Cx;
use tensorfold_kernels::{Backend, KernelError, RopeParams};

/// Attention mixer weights (`self_attn.*`).
pub struct AttnWeights<B: Backend> {
    /// `q_proj` `[heads*hd, h]`.
    pub q: B::Mat,
    /// `k_proj` `[kv_heads*hd, h]`.
    pub k: B::Mat,
    /// `v_proj` `[kv_heads*hd, h]`.
    pub v: B::Mat,
    /// `out_proj` `[h, heads*hd]`.
    pub o: B::Mat,
    /// `q_layernorm.weight` `[hd]`.
    pub q_norm: B::Buf,
    /// `k_layernorm.weight` `[hd]`.
    pub k_norm: B::Buf,
}

impl<B: Backend> AttnWeights<B> {
    /// Mixes `normed` `[rows, h]` f32 into `out` `[rows, h]`: q, k, v, their head norms and RoPE at each row's
    /// position, then attention, which appends each segment's K/V rows to its stream's cache (`kv`, one a segment,
    /// in segment order) before attending over them. Errors: a kernel's refusal (a cache that does not hold its
    /// segment's `start_pos` rows).
    pub(crate) fn forward(
        &self,
        cx: &Cx<'_, B>,
        normed: &B::Buf,
        kv: &mut [&mut B::Kv],
        out: &mut B::Buf,
    ) -> Result<(), KernelError> {
        let (b, c, rows) = (cx.b, cx.cfg, cx.rows);
        let (qd, kd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let rope = RopeParams { theta: c.rope_theta, head_dim: c.head_dim, interleaved: false };
        let (mut q, mut k, mut v) = (b.scratch(rows * qd), b.scratch(rows * kd), b.scratch(rows * kd));
        b.linears(normed, rows, &[&self.q, &self.k, &self.v], &mut [&mut q, &mut k, &mut v]);
        let (qn, kn) = ((&mut q, c.heads, &self.q_norm), (&mut k, c.kv_heads, &self.k_norm));
        b.qk_norm_rope_pair(qn, kn, c.norm_eps, rope, cx.segs)?;
        let mut a = b.scratch(rows * qd);
        b.attention(&q, &k, &v, c.heads, c.kv_heads, cx.segs, kv, &mut a)?;
        b.linear(&a, rows, &self.o, None, out);
        Ok(())
    }

    /// Bytes of its matrices on the device.
    pub fn bytes(&self, b: &B) -> usize {
        [&self.q, &self.k, &self.v, &self.o].iter().map(|m| b.mat_bytes(m)).sum()
    }
}
