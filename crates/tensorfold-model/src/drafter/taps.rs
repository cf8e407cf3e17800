//! The drafter's taps, the forward's after-layer hook: copies of the tap layers' output rows, absorbed after the
//! last layer into each stream's drafter context (`ctx = hidden_norm(fc(concat taps))`, then every drafter layer's
//! K/V of `ctx`).

use super::{DraftState, Drafter};
use crate::state::StreamState;
use tensorfold_kernels::{Backend, KernelError, Segment};

/// One forward's taps: the rows copied so far, by tap index.
pub(crate) struct Taps<'d, B: Backend> {
    drafter: &'d Drafter<B>,
    /// Every row of the call (the rows each copy takes).
    all: Vec<usize>,
    /// The target's hidden width.
    hidden: usize,
    /// `(tap index, [rows, hidden] copy)`, in layer order.
    taken: Vec<(usize, B::Buf)>,
}

impl<'d, B: Backend> Taps<'d, B> {
    /// No taps yet, for a forward of `rows` rows of width `hidden`.
    pub(crate) fn new(drafter: &'d Drafter<B>, rows: usize, hidden: usize) -> Self {
        Self { drafter, all: (0..rows).collect(), hidden, taken: Vec::new() }
    }

    /// Copies `x` `[rows, hidden]` once for each tap that reads layer `layer` (none where no tap does).
    pub(crate) fn after_layer(&mut self, b: &B, layer: usize, x: &B::Buf) {
        for (j, _) in self.drafter.cfg.taps.iter().enumerate().filter(|(_, l)| **l == layer) {
            self.taken.push((j, b.gather_rows(x, self.hidden, &self.all)));
        }
    }

    /// Absorbs the taps into each stream's drafter context ([`Drafter::absorb`]). Errors: a kernel's refusal.
    pub(crate) fn absorb(
        mut self,
        b: &B,
        segs: &[Segment],
        states: &mut [&mut StreamState<B>],
    ) -> Result<(), KernelError> {
        self.taken.sort_by_key(|t| t.0);
        let taps: Vec<B::Buf> = self.taken.into_iter().map(|t| t.1).collect();
        let mut ds: Vec<&mut DraftState<B>> =
            states.iter_mut().map(|s| s.draft.as_mut().expect("a drafter implies drafter states")).collect();
        self.drafter.absorb(b, &taps, self.all.len(), segs, &mut ds)
    }
}

impl<B: Backend> Drafter<B> {
    /// Absorbs the call's rows into each stream's context: `ctx = hidden_norm(fc(concat taps))`, then every
    /// layer's `k_norm(k_proj(ctx))` with RoPE and `v_proj(ctx)` appended at the segments' positions.
    /// `taps[j]` is `[rows, d]`, the output of target layer `cfg.taps[j]` for every row of the call.
    pub fn absorb(
        &self,
        b: &B,
        taps: &[B::Buf],
        rows: usize,
        segs: &[Segment],
        states: &mut [&mut DraftState<B>],
    ) -> Result<(), KernelError> {
        let (c, w) = (&self.cfg, &self.weights);
        let d = c.hidden;
        let mut pre = b.zeros(rows * d);
        let mut part = b.zeros(rows * d);
        for (j, (tap, fc)) in taps.iter().zip(&w.fc).enumerate() {
            // Tap 0 lands in `pre`; later taps are added in tap order (a fixed order: row-invariant).
            b.linear(tap, rows, fc, None, if j == 0 { &mut pre } else { &mut part });
            if j > 0 {
                b.add(&mut pre, &part);
            }
        }
        let mut ctx = b.zeros(rows * d);
        b.rmsnorm(&pre, &w.hidden_norm, c.eps, d, &mut ctx);
        let kd = c.kv_heads * c.head_dim;
        for (l, lw) in w.layers.iter().enumerate() {
            let (mut k, mut v) = (b.zeros(rows * kd), b.zeros(rows * kd));
            b.linears(&ctx, rows, &[&lw.k, &lw.v], &mut [&mut k, &mut v]);
            b.qk_norm_rope(&mut k, c.kv_heads, &lw.k_norm, c.eps, self.rope(), segs)?;
            let mut caches: Vec<&mut B::Kv> = states.iter_mut().map(|s| &mut s.kv[l]).collect();
            b.kv_append(&k, &v, segs, &mut caches)?;
        }
        Ok(())
    }
}
