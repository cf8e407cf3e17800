//! The LFM2-MoE feed-forward and its forward: routing and the experts (or the expert-parallel hook in their place),
//! then the combine fused with the residual add and the next layer's norm.

use super::{Acts, Cx, NextNorm};
use crate::forward::ForwardError;
use crate::hooks::Hooks;
use tensorfold_kernels::backend::Ffn;
use tensorfold_kernels::{Backend, MoeParams};

/// A MoE feed-forward: the weights of [`super::FfnWeights::Moe`], borrowed (callers match on that variant's
/// named fields), and its layer index (which expert parallelism's ranks look their experts up by).
pub struct Moe<'w, B: Backend> {
    /// Its layer in the model.
    pub layer: usize,
    /// Router `[experts, h]`.
    pub gate: &'w B::Mat,
    /// Optional f32 expert bias `[experts]`.
    pub bias: Option<&'w B::Buf>,
    /// The experts this device holds (all of them without expert parallelism).
    pub experts: &'w [Ffn<B::Mat>],
}

/// Routed assignments and the experts' outputs of a MoE layer, before the combine: `sel` and `wts` `[rows, k]`,
/// `y` `[rows * k, hidden]` f32.
pub(crate) struct Routed<B: Backend> {
    /// Expert ids of each row, in rank order (f32, exact below 2^24).
    pub sel: B::Buf,
    /// Their weights.
    pub wts: B::Buf,
    /// Each assignment's expert output.
    pub y: B::Buf,
    /// Experts a row (`min(top_k, experts)`).
    pub k: usize,
}

impl<B: Backend> Moe<'_, B> {
    /// `acts.x += combine(experts(route(acts.normed)))`, then `acts.normed = rmsnorm(acts.x)` with `next` (`None`
    /// after the last layer: the add alone). With an experts hook (expert parallelism) the hook routes and runs
    /// every rank's experts; without, rank 0's fused routing and experts do. Errors: a kernel's or a collective's.
    pub(crate) fn forward(
        &self,
        cx: &Cx<'_, B>,
        acts: &mut Acts<B>,
        next: NextNorm<'_, B>,
        hooks: &Hooks<'_, B>,
    ) -> Result<(), ForwardError> {
        let (b, rows, h) = (cx.b, cx.rows, cx.cfg.hidden);
        let m = cx.cfg.moe.as_ref().expect("MoE weights imply a MoE config");
        let p = MoeParams {
            top_k: m.top_k,
            norm_topk_prob: m.norm_topk_prob,
            routed_scaling_factor: m.routed_scaling_factor,
        };
        let k = p.top_k.min(m.experts);
        let mut r = Routed { sel: b.scratch(rows * k), wts: b.scratch(rows * k), y: b.scratch(rows * k * h), k };
        match hooks.experts {
            None => b.moe_route_experts(
                &acts.normed,
                rows,
                self.gate,
                self.bias,
                self.experts,
                p,
                (&mut r.sel, &mut r.wts),
                &mut r.y,
            )?,
            Some(ep) => ep.route_experts(cx, &acts.normed, self, p, &mut r)?,
        }
        // The combine, the residual add and the next norm: one step (the same bits as three).
        b.moe_combine_add_rmsnorm((&r.y, &r.wts), rows, k, &mut acts.x, next, h, &mut acts.normed)?;
        Ok(())
    }
}
