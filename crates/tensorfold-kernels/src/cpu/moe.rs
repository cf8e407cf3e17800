//! CPU LFM2-MoE block: sigmoid routing with expert bias, experts grouped so each reads its weights once
//! per call, and a per-row combine in rank order (so a row's bits do not depend on the other rows).

use super::ops::{linear, linear_serial, silu_mul, silu_mul_serial, worth_threads};
use crate::backend::{Ffn, MoeParams};
use crate::bytes::MatView;
use crate::simd::exp::expf;
use rayon::prelude::*;

/// Routing of one row: `(expert, weight)` in rank order (highest `score + bias` first, ties to the lower
/// expert id). Follows transformers `Lfm2MoeSparseMoeBlock.route_tokens_to_experts`: weights are the
/// sigmoid scores of the selected experts, divided by `sum + 1e-6` when `norm_topk_prob`, then scaled
/// by `routed_scaling_factor`.
pub fn route_row(logits: &[f32], bias: Option<&[f32]>, p: MoeParams) -> Vec<(usize, f32)> {
    let scores: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + expf(-l))).collect();
    let key = |e: usize| scores[e] + bias.map_or(0.0, |b| b[e]);
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    order.truncate(p.top_k);
    let sum: f32 = order.iter().map(|&e| scores[e]).sum();
    order
        .into_iter()
        .map(|e| {
            let w = if p.norm_topk_prob { scores[e] / (sum + 1e-6) } else { scores[e] };
            (e, w * p.routed_scaling_factor)
        })
        .collect()
}

/// SwiGLU FFN of `rows` rows: `w2(silu(w1 x) * w3 x)`, each linear split across threads.
pub fn swiglu(x: &[f32], rows: usize, f: &Ffn<MatView>, out: &mut [f32]) {
    let inter = f.w1.rows;
    let mut g = vec![0f32; rows * inter];
    let mut u = vec![0f32; rows * inter];
    linear(x, rows, &f.w1, None, &mut g);
    linear(x, rows, &f.w3, None, &mut u);
    silu_mul(&mut g, &u);
    linear(&g, rows, &f.w2, None, out);
}

/// [`swiglu`] on the calling thread (the MoE block parallelizes over experts instead). Same bits.
fn swiglu_serial(x: &[f32], rows: usize, f: &Ffn<MatView>, out: &mut [f32]) {
    let inter = f.w1.rows;
    let mut g = vec![0f32; rows * inter];
    let mut u = vec![0f32; rows * inter];
    linear_serial(x, rows, &f.w1, None, &mut g);
    linear_serial(x, rows, &f.w3, None, &mut u);
    silu_mul_serial(&mut g, &u);
    linear_serial(&g, rows, &f.w2, None, out);
}

/// The MoE block over `x` `[rows, hidden]` into `out` `[rows, hidden]`: [`route`], [`experts`] over every expert,
/// [`combine`].
pub fn moe(
    x: &[f32],
    rows: usize,
    gate: &MatView,
    expert_bias: Option<&[f32]>,
    experts_all: &[Ffn<MatView>],
    p: MoeParams,
    out: &mut [f32],
) {
    let k = p.top_k.min(gate.rows);
    let (mut sel, mut wts) = (vec![0f32; rows * k], vec![0f32; rows * k]);
    route(x, rows, gate, expert_bias, p, &mut sel, &mut wts);
    let mut y = vec![0f32; rows * k * gate.cols];
    experts(x, rows, &sel, k, experts_all, 0, &mut y);
    combine(&y, &wts, rows, k, out);
}

/// Routing of every row: the router linear, then [`route_row`] into `sel` `[rows, k]` (expert ids as f32) and
/// `wts` `[rows, k]`, `k = min(top_k, experts)`.
pub fn route(
    x: &[f32],
    rows: usize,
    gate: &MatView,
    expert_bias: Option<&[f32]>,
    p: MoeParams,
    sel: &mut [f32],
    wts: &mut [f32],
) {
    let ne = gate.rows;
    let k = p.top_k.min(ne);
    let mut logits = vec![0f32; rows * ne];
    linear(x, rows, gate, None, &mut logits);
    for (r, l) in logits.chunks_exact(ne.max(1)).take(rows).enumerate() {
        for (j, (e, w)) in route_row(l, expert_bias, p).into_iter().enumerate() {
            (sel[r * k + j], wts[r * k + j]) = (e as f32, w);
        }
    }
}

/// The owned experts' outputs of every assignment: `owned` are experts `first .. first + owned.len()`; assignment
/// `a` (row `a / k`) of expert `sel[a]` gets `y[a] = expert(x[a / k])` when owned and `+0` otherwise, so ranks
/// that own disjoint experts sum to one rank's `y` exactly.
pub fn experts(x: &[f32], rows: usize, sel: &[f32], k: usize, owned: &[Ffn<MatView>], first: usize, y: &mut [f32]) {
    let h = owned.first().map_or(0, |f| f.w1.cols);
    y.fill(0.0);
    if h == 0 {
        return;
    }
    // Assignments of each owned expert, in assignment order.
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); owned.len()];
    for (a, &e) in sel.iter().enumerate().take(rows * k) {
        if let Some(local) = (e as usize).checked_sub(first).filter(|&l| l < owned.len()) {
            by_expert[local].push(a);
        }
    }
    // One task per active expert (each reads its weights once for all its rows): far fewer thread dispatches than
    // splitting each small expert matrix across threads.
    let run = |(e, members): (usize, &Vec<usize>)| {
        let mut xe = Vec::with_capacity(members.len() * h);
        for &a in members {
            xe.extend_from_slice(&x[(a / k) * h..(a / k + 1) * h]);
        }
        let mut ye = vec![0f32; members.len() * h];
        swiglu_serial(&xe, members.len(), &owned[e], &mut ye);
        (e, ye)
    };
    let macs: usize = by_expert.iter().zip(owned).map(|(m, f)| 3 * m.len() * h * f.w1.rows).sum();
    let active = by_expert.iter().enumerate().filter(|(_, m)| !m.is_empty());
    let results: Vec<(usize, Vec<f32>)> = if worth_threads(macs) {
        by_expert.par_iter().enumerate().filter(|(_, m)| !m.is_empty()).map(run).collect()
    } else {
        active.map(run).collect()
    };
    for (e, ye) in &results {
        for (i, &a) in by_expert[*e].iter().enumerate() {
            y[a * h..(a + 1) * h].copy_from_slice(&ye[i * h..(i + 1) * h]);
        }
    }
}

/// `out[r] = sum over rank j, in rank order from +0, of wts[r, j] * y[r * k + j]` (`out` `[rows, hidden]`).
pub fn combine(y: &[f32], wts: &[f32], rows: usize, k: usize, out: &mut [f32]) {
    let h = out.len().checked_div(rows).unwrap_or(0);
    for r in 0..rows {
        let o = &mut out[r * h..(r + 1) * h];
        o.fill(0.0);
        for j in 0..k {
            let (w, ya) = (wts[r * k + j], &y[(r * k + j) * h..(r * k + j + 1) * h]);
            for (a, &b) in o.iter_mut().zip(ya) {
                *a += w * b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::{Ffn, KernelError};
    use crate::bytes::MatView;
    use crate::cpu::CpuBackend;
    use crate::prelude::*;

    fn expert(h: usize, inter: usize) -> Ffn<MatView> {
        let m = |r: usize, c: usize| MatView::from_f32(r, c, &vec![0.01; r * c]);
        Ffn { w1: m(inter, h), w3: m(inter, h), w2: m(h, inter) }
    }

    #[test]
    fn moe_experts_refuses_mismatched_shapes_and_owners_by_name() {
        let (h, k, rows) = (8, 2, 3);
        let x = vec![0.5f32; rows * h];
        let sel: Vec<f32> = vec![0.0, 1.0, 1.0, 2.0, 3.0, 0.0];
        let owned = [expert(h, 4), expert(h, 4)];
        let mut y = vec![f32::NAN; rows * k * h];
        CpuBackend.moe_experts(&x, rows, &sel, k, &owned, 1, 4, &mut y).expect("experts 1 and 2 of 4");
        // Assignments of experts 0 and 3 (not owned) are +0; the owned ones are not.
        for (a, &e) in sel.iter().enumerate() {
            let row = &y[a * h..(a + 1) * h];
            assert_eq!(row.iter().all(|v| v.to_bits() == 0), !(1.0..=2.0).contains(&e), "assignment {a}");
        }
        let shape = |r: Result<(), KernelError>| matches!(r, Err(KernelError::Shape { kernel: "moe_experts", .. }));
        assert!(shape(CpuBackend.moe_experts(&x, rows, &sel, k, &owned, 3, 4, &mut y)), "past the last expert");
        assert!(shape(CpuBackend.moe_experts(&x, rows, &sel[..5].to_vec(), k, &owned, 0, 4, &mut y)), "short sel");
        let bad = [Ffn { w3: MatView::from_f32(3, h, &[0.0; 24]), ..expert(h, 4) }];
        assert!(shape(CpuBackend.moe_experts(&x, rows, &sel, k, &bad, 0, 4, &mut y)), "w3 of another width");
        assert!(shape(CpuBackend.moe_experts(&x, rows, &sel, k, &owned, usize::MAX, 4, &mut y)), "overflowing owner");
    }
}
