//! Shared pieces of the contract's gates: random inputs, float64 helpers, bit comparisons.

use crate::Gate;
use rand::{Rng, rngs::StdRng};
use tensorfold_kernels::backend::{Ffn, MoeParams, Segment};
use tensorfold_kernels::bytes::MatView;
use tensorfold_kernels::prelude::*;

/// `n` values uniform in `[-1, 1)`.
pub fn uniform(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect()
}

/// A random bf16 matrix `[rows, cols]` with entries in `[-scale, scale)`.
pub fn bf16_mat(rng: &mut StdRng, rows: usize, cols: usize, scale: f32) -> MatView {
    let bits: Vec<u16> = (0..rows * cols)
        .map(|_| ((rng.random::<f32>() * 2.0 - 1.0) * scale).to_bits())
        .map(|b| (b >> 16) as u16)
        .collect();
    MatView::from_bf16_bits(rows, cols, &bits)
}

/// A random f32 matrix.
pub fn f32_mat(rng: &mut StdRng, rows: usize, cols: usize, scale: f32) -> MatView {
    let v: Vec<f32> = uniform(rng, rows * cols).into_iter().map(|x| x * scale).collect();
    MatView::from_f32(rows, cols, &v)
}

/// Row `r` of a matrix widened to f64.
pub fn row64(m: &MatView, r: usize) -> Vec<f64> {
    (0..m.cols).map(|c| m.get(r, c) as f64).collect()
}

/// Float64 dot.
pub fn dot64(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// f32 slice widened to f64.
pub fn wide(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Bound of the canonical dot of length `k` (16 lanes, fused multiply-add, tree fold):
/// `(k/16 + 5) * 2^-24 * sum |x_i w_i|`.
pub fn dot_bound(k: usize, abs_sum: f64) -> f64 {
    ((k / 16) as f64 + 5.0) * f64::powi(2.0, -24) * abs_sum
}

/// Largest `|got - want| / scale` (infinite if a value is not finite).
pub fn max_err(got: &[f32], want: &[f64], scale: f64) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| if g.is_finite() { (*g as f64 - w).abs() / scale.max(1e-30) } else { f64::INFINITY })
        .fold(0.0, f64::max)
}

/// Largest magnitude of a slice.
pub fn max_abs(x: &[f64]) -> f64 {
    x.iter().fold(0.0, |m, v| m.max(v.abs()))
}

/// How many elements differ in bits.
pub fn bit_diffs(a: &[f32], b: &[f32]) -> usize {
    a.len().abs_diff(b.len()) + a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

/// Gate 2 from a relative error and its bound.
pub fn reference_gate(shape: &str, err: f64, bound: f64) -> Gate {
    Gate::new("reference", err <= bound, format!("{shape}: rel err {err:.2e} <= {bound:.1e}"))
}

/// Gate 3 from the number of differing elements over all widths.
pub fn invariance_gate(what: &str, differing: usize) -> Gate {
    Gate::new("invariance", differing == 0, format!("{what}: {differing} elements differ from the one-row calls"))
}

/// Merges per-shape gates of the same name into one: it fails if any failed, and its detail is the first
/// failure's (or, when all passed, every distinct detail).
pub fn merge(gates: Vec<Gate>) -> Vec<Gate> {
    let mut out: Vec<(Gate, Vec<String>)> = Vec::new();
    for g in gates {
        match out.iter_mut().find(|(o, _)| o.name == g.name) {
            Some((o, details)) => {
                if o.pass && !g.pass {
                    o.detail = g.detail.clone();
                }
                o.pass &= g.pass;
                if !details.contains(&g.detail) {
                    details.push(g.detail);
                }
            }
            None => {
                let d = vec![g.detail.clone()];
                out.push((g, d));
            }
        }
    }
    out.into_iter()
        .map(|(mut g, details)| {
            if g.pass {
                g.detail = details.join("; ");
            }
            g
        })
        .collect()
}

/// float64 softmax attention of one query head `qh` `[hd]` over `keys` (key row, value row) for KV head `g`
/// of `hd`: the wanted output and its bound `(2*keys+16)*2^-24*max|v|` (f32 sums in key order of weights
/// that sum to 1).
pub fn attention64(qh: &[f32], keys: &[(&[f32], &[f32])], g: usize, hd: usize) -> (Vec<f64>, f64) {
    let q = wide(qh);
    let sc: Vec<f64> =
        keys.iter().map(|(k, _)| dot64(&q, &wide(&k[g * hd..(g + 1) * hd])) / (hd as f64).sqrt()).collect();
    let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    let want =
        (0..hd).map(|d| keys.iter().zip(&e).map(|((_, v), p)| p * v[g * hd + d] as f64).sum::<f64>() / z).collect();
    let vmax = keys.iter().flat_map(|(_, v)| &v[g * hd..(g + 1) * hd]).fold(0f64, |m, x| m.max(x.abs() as f64));
    (want, (2 * keys.len() + 16) as f64 * f64::powi(2.0, -24) * vmax)
}

/// Distinct MoE experts as overlapping row windows of two random matrices (served shapes would be 1.2 GB on the
/// host), f32 or bf16.
pub fn moe_experts(rng: &mut StdRng, h: usize, e: usize, inter: usize, f32: bool) -> Vec<Ffn<MatView>> {
    let mat = |rng: &mut StdRng, n, k| if f32 { f32_mat(rng, n, k, 0.05) } else { bf16_mat(rng, n, k, 0.05) };
    let up = mat(rng, inter + 7 * e + 7, h);
    let down = mat(rng, h + 3 * e, inter);
    (0..e)
        .map(|i| Ffn {
            w1: up.row_range(7 * i, inter).expect("window"),
            w3: up.row_range(7 * i + 5, inter).expect("window"),
            w2: down.row_range(3 * i, h).expect("window"),
        })
        .collect()
}

/// float64 MoE of one row: sigmoid router, top-k by score + bias (ties to the lower id), weights by score
/// (normalized when `norm_topk_prob`, times `routed_scaling_factor`), SwiGLU experts summed.
pub fn moe64(x: &[f64], gate: &MatView, bias: &[f32], ex: &[Ffn<MatView>], p: MoeParams) -> Vec<f64> {
    let s: Vec<f64> = (0..gate.rows).map(|e| 1.0 / (1.0 + (-dot64(x, &row64(gate, e))).exp())).collect();
    let mut order: Vec<usize> = (0..s.len()).collect();
    order.sort_by(|&a, &b| (s[b] + bias[b] as f64).total_cmp(&(s[a] + bias[a] as f64)).then(a.cmp(&b)));
    order.truncate(p.top_k);
    let sum: f64 = order.iter().map(|&e| s[e]).sum();
    let mut out = vec![0f64; x.len()];
    for e in order {
        let w = if p.norm_topk_prob { s[e] / (sum + 1e-6) } else { s[e] } * p.routed_scaling_factor as f64;
        let f = &ex[e];
        let a: Vec<f64> = (0..f.w1.rows)
            .map(|i| {
                let g = dot64(x, &row64(&f.w1, i));
                g / (1.0 + (-g).exp()) * dot64(x, &row64(&f.w3, i))
            })
            .collect();
        for (j, o) in out.iter_mut().enumerate() {
            *o += w * dot64(&a, &row64(&f.w2, j));
        }
    }
    out
}

/// Splits `rows` rows over `streams` streams as contiguous segments at positions `starts` (stream i gets a share;
/// some may get none): the multi-stream segment tables of both suites.
pub fn split(rows: usize, streams: usize, starts: &[usize]) -> Vec<Segment> {
    let mut segs = Vec::new();
    let mut first = 0;
    for (s, &start_pos) in starts.iter().enumerate().take(streams) {
        let n = if s + 1 == streams { rows - first } else { (rows - first).min(rows.div_ceil(streams) + s % 2) };
        if n > 0 {
            segs.push(Segment { first_row: first, rows: n, start_pos, cache: s });
        }
        first += n;
    }
    segs
}

/// One MoE layer's weights on a backend (the CUDA suite's `cuda.moe`; the CPU suite checks `cpu::moe` directly): the router `gate` `[experts, hidden]`, its `expert_bias`, the experts.
#[cfg(feature = "cuda")]
pub struct MoeLayer<'a, B: Backend> {
    /// Hidden width.
    pub hidden: usize,
    /// Router `[experts, hidden]`.
    pub gate: &'a B::Mat,
    /// `expert_bias` `[experts]`, when the checkpoint has one.
    pub bias: Option<&'a B::Buf>,
    /// The experts, in id order.
    pub experts: &'a [Ffn<B::Mat>],
}

/// The LFM2-MoE block over the `Backend` seam, as the forward composes it on one device: routing and every expert
/// ([`Ops::moe_route_experts`]), then the rank-order combine ([`Ops::moe_combine`]) of `x` `[rows, hidden]`
/// into `out` `[rows, hidden]`. Errors: the backend's.
#[cfg(feature = "cuda")]
pub fn moe<B: Backend>(
    be: &B,
    x: &B::Buf,
    rows: usize,
    layer: &MoeLayer<B>,
    p: MoeParams,
    out: &mut B::Buf,
) -> Result<(), tensorfold_kernels::KernelError> {
    let k = p.top_k.min(layer.experts.len());
    let h = layer.hidden;
    let (mut sel, mut wts, mut y) = (be.scratch(rows * k), be.scratch(rows * k), be.scratch(rows * k * h));
    be.moe_route_experts(x, rows, layer.gate, layer.bias, layer.experts, p, (&mut sel, &mut wts), &mut y)?;
    be.moe_combine(&y, &wts, rows, k, out)
}

/// Expert parallelism's MoE on one device: `rows` rows of `x` routed once, each of 2 and 3 ranks' `moe_experts` over
/// its contiguous share (told it starts at expert 0 when `forget_offset`, the planted fault), the ranks' `y` summed in
/// rank order, then the combine. Returns the bit differences against `want` (the one-call `moe` output), over both
/// world sizes, and the elements of the sum that had more than one nonzero contributor.
#[allow(clippy::too_many_arguments)]
pub fn shard_diffs<B: Backend>(
    be: &B,
    (x, rows, h): (&[f32], usize, usize),
    gate: &B::Mat,
    bias: Option<&B::Buf>,
    ex: &[Ffn<B::Mat>],
    p: MoeParams,
    want: &[f32],
    forget_offset: bool,
) -> (usize, usize) {
    let k = p.top_k.min(ex.len());
    let xd = be.upload(x);
    let (mut sel, mut wts) = (be.zeros(rows * k), be.zeros(rows * k));
    if be.moe_route(&xd, rows, gate, bias, p, &mut sel, &mut wts).is_err() {
        return (usize::MAX, 0);
    }
    let (mut diffs, mut shared) = (0, 0);
    for world in [2, 3] {
        let mut sum = vec![0f32; rows * k * h];
        let mut nonzero = vec![0u8; sum.len()];
        for r in tensorfold_kernels::collective::expert_ranges(ex.len(), world).expect("a split") {
            let first = if forget_offset { 0 } else { r.start };
            let mut y = be.zeros(rows * k * h);
            if be.moe_experts(&xd, rows, &sel, k, &ex[r], first, ex.len(), &mut y).is_err() {
                return (usize::MAX, 0);
            }
            for ((s, n), v) in sum.iter_mut().zip(&mut nonzero).zip(be.read(&y)) {
                *s += v;
                *n += u8::from(v != 0.0);
            }
        }
        shared += nonzero.iter().filter(|&&n| n > 1).count();
        let mut out = be.zeros(rows * h);
        if be.moe_combine(&be.upload(&sum), &wts, rows, k, &mut out).is_err() {
            return (usize::MAX, shared);
        }
        diffs += bit_diffs(&be.read(&out), want);
    }
    (diffs, shared)
}

/// The gate over [`shard_diffs`]'s result.
pub fn shard_gate(shape: &str, (diffs, shared): (usize, usize)) -> Gate {
    Gate::new(
        "expert shards",
        diffs == 0 && shared == 0,
        format!(
            "{shape}: experts split over 2 and 3 ranks, summed, combined: {diffs} bits differ from one call; \
             {shared} elements with two contributors"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_covers_every_row_once_in_order() {
        for rows in [1, 2, 3, 8, 16, 33] {
            let segs = split(rows, 4, &[5, 0, 700, 3]);
            let mut next = 0;
            for s in &segs {
                assert_eq!(s.first_row, next);
                assert!(s.rows > 0);
                next += s.rows;
            }
            assert_eq!(next, rows);
        }
    }
}
