//! CPU LFM2-MoE block: sigmoid routing with expert bias, experts grouped so each reads its weights once
//! per call, and a per-row combine in rank order (so a row's bits do not depend on the other rows).

use super::ops::{linear, linear_serial, silu_mul, silu_mul_serial};
use crate::backend::{Ffn, MoeParams};
use crate::bytes::MatView;
use rayon::prelude::*;

/// Routing of one row: `(expert, weight)` in rank order (highest `score + bias` first, ties to the lower
/// expert id). Follows transformers `Lfm2MoeSparseMoeBlock.route_tokens_to_experts`: weights are the
/// sigmoid scores of the selected experts, divided by `sum + 1e-6` when `norm_topk_prob`, then scaled
/// by `routed_scaling_factor`.
pub fn route_row(logits: &[f32], bias: Option<&[f32]>, p: MoeParams) -> Vec<(usize, f32)> {
    let scores: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
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

/// The MoE block over `x` `[rows, hidden]` into `out` `[rows, hidden]`.
pub fn moe(
    x: &[f32],
    rows: usize,
    gate: &MatView,
    expert_bias: Option<&[f32]>,
    experts: &[Ffn<MatView>],
    p: MoeParams,
    out: &mut [f32],
) {
    let h = gate.cols;
    let ne = gate.rows;
    let mut logits = vec![0f32; rows * ne];
    linear(x, rows, gate, None, &mut logits);
    let routes: Vec<Vec<(usize, f32)>> = logits.chunks_exact(ne).map(|l| route_row(l, expert_bias, p)).collect();
    // Rows of each expert, as (row, rank).
    let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); ne];
    for (r, route) in routes.iter().enumerate() {
        for (rank, &(e, _)) in route.iter().enumerate() {
            by_expert[e].push((r, rank));
        }
    }
    let k = p.top_k;
    // One task per active expert (each reads its weights once for all its rows): far fewer thread
    // dispatches than splitting each small expert matrix across threads.
    let results: Vec<(usize, Vec<f32>)> = by_expert
        .par_iter()
        .enumerate()
        .filter(|(_, m)| !m.is_empty())
        .map(|(e, members)| {
            let mut xe = Vec::with_capacity(members.len() * h);
            for &(r, _) in members {
                xe.extend_from_slice(&x[r * h..(r + 1) * h]);
            }
            let mut ye = vec![0f32; members.len() * h];
            swiglu_serial(&xe, members.len(), &experts[e], &mut ye);
            (e, ye)
        })
        .collect();
    let mut slots = vec![0f32; rows * k * h];
    for (e, ye) in &results {
        for (i, &(r, rank)) in by_expert[*e].iter().enumerate() {
            slots[(r * k + rank) * h..(r * k + rank + 1) * h].copy_from_slice(&ye[i * h..(i + 1) * h]);
        }
    }
    for (r, route) in routes.iter().enumerate() {
        let o = &mut out[r * h..(r + 1) * h];
        o.fill(0.0);
        for (rank, &(_, w)) in route.iter().enumerate() {
            let y = &slots[(r * k + rank) * h..(r * k + rank + 1) * h];
            for (a, &b) in o.iter_mut().zip(y) {
                *a += w * b;
            }
        }
    }
}
