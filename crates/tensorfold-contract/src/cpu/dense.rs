//! Contract entries of the row-wise CPU kernels: the canonical dot, linear, embedding, RMSNorm, MoE, greedy.

use crate::cases::*;
use crate::shared::{RMS_EPS, greedy_gates, rmsnorm_gates};
use crate::{Claim, Entry, Gate, Kernel, Scale, WIDTHS};
use rand::{Rng, rngs::StdRng};
use tensorfold_kernels::Pick;
use tensorfold_kernels::backend::MoeParams;
use tensorfold_kernels::bytes::MatView;
use tensorfold_kernels::cpu::{CpuBackend, moe, ops};
use tensorfold_kernels::simd::{self, Level, WRow};

pub fn kernels() -> Vec<Box<dyn Entry>> {
    vec![Box::new(Dot), Box::new(Linear), Box::new(Embed), Box::new(RmsNorm), Box::new(Moe), Box::new(Greedy)]
}

struct Dot;
faults! {
    /// The planted controls of `cpu.dot`.
    enum DotFault {
        SequentialFold = ("sequential-fold", "the SIMD paths sum products in one sequential f32 accumulator"),
    }
}

impl Kernel for Dot {
    fn name(&self) -> &'static str {
        "cpu.dot"
    }
    fn claim(&self) -> Claim {
        Claim::BitEqual(
            "the portable 16-lane dot on every SIMD level and tile width; (k/16+5)*2^-24*sum|x*w| of float64",
        )
    }
    fn reference(&self) -> &'static str {
        "float64 sum of products"
    }
    fn shapes(&self, _: Scale) -> Vec<String> {
        vec!["k in 1, 15, 16, 17, 64, 1536, 2048, 6144".into()]
    }
    type Fault = DotFault;
    fn gates(&self, _: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let mut gates = Vec::new();
        for k in [1, 15, 16, 17, 64, 1536, 2048, 6144] {
            let w = uniform(rng, k);
            let wb: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let q8 = (k % 16 == 0).then(|| MatView::from_f32(1, k, &w).quantize_q8(16).expect("groups of 16"));
            let q8_row = q8.as_ref().map(|m| ops::wrow(m, 0));
            let xs: Vec<Vec<f32>> = (0..33).map(|_| uniform(rng, k)).collect();
            let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
            let call = |lv: Level, xs: &[&[f32]], row: WRow, out: &mut [f32]| {
                if fault.is_some() && lv != Level::Portable {
                    for (o, x) in out.iter_mut().zip(xs) {
                        *o = (0..k).map(|i| x[i] * row_get(row, i)).sum();
                    }
                } else {
                    simd::dot_tile(lv, xs, row, out)
                }
            };
            for row in [Some(WRow::F32(&w)), Some(WRow::Bf16(&wb)), q8_row].into_iter().flatten() {
                let mut want = vec![0f32; 33];
                simd::dot_tile(Level::Portable, &refs, row, &mut want);
                let (mut err, mut diffs, mut inv) = (0f64, 0, 0);
                for (r, x) in xs.iter().enumerate() {
                    let exact: f64 = (0..k).map(|i| x[i] as f64 * row_get(row, i) as f64).sum();
                    let abs: f64 = (0..k).map(|i| (x[i] as f64 * row_get(row, i) as f64).abs()).sum();
                    err = err.max((want[r] as f64 - exact).abs() / dot_bound(k, abs));
                }
                for lv in simd::available_levels() {
                    let mut got = vec![0f32; 33];
                    call(lv, &refs, row, &mut got);
                    diffs += bit_diffs(&got, &want);
                    for w in WIDTHS {
                        let mut part = vec![0f32; w];
                        call(lv, &refs[..w], row, &mut part);
                        inv += bit_diffs(&part, &want[..w]);
                    }
                }
                gates.push(reference_gate(&format!("k={k}"), err, 1.0));
                gates.push(Gate::new("paths", diffs == 0, format!("{diffs} results differ from the portable path")));
                gates.push(invariance_gate("tile widths", inv));
            }
        }
        merge(gates)
    }
}

fn row_get(row: WRow, i: usize) -> f32 {
    row.get(i)
}

/// Linear shapes `(n, k, dtype)`: LFM2.5-24B-A2B's conv in_proj, square projections, KV, expert up/down,
/// head; and the 24B drafter's projections as `--drafter-bits 8` quantizes them.
fn linear_shapes(scale: Scale) -> Vec<(usize, usize, &'static str)> {
    match scale {
        Scale::Quick => vec![(96, 80, "f32"), (40, 33, "bf16"), (300, 64, "bf16"), (48, 128, "q8")],
        Scale::Served => {
            vec![
                (6144, 2048, "bf16"),
                (2048, 2048, "bf16"),
                (512, 2048, "bf16"),
                (1536, 2048, "bf16"),
                (2048, 1536, "bf16"),
                (128_000, 2048, "bf16"),
                (96, 80, "f32"),
                (2048, 2048, "q8"),
                (6144, 2048, "q8"),
            ]
        }
    }
}

struct Linear;
impl Linear {
    fn call(fault: Option<LinearFault>, x: &[f32], rows: usize, w: &MatView, out: &mut [f32]) {
        match fault {
            Some(LinearFault::DroppedLastColumn) => {
                let mut x = x.to_vec();
                x.chunks_mut(w.cols).for_each(|r| r[w.cols - 1] = 0.0);
                ops::linear(&x, rows, w, None, out)
            }
            Some(LinearFault::BatchDependentOrder) if rows > 1 => {
                for r in 0..rows {
                    for j in 0..w.rows {
                        out[r * w.rows + j] = (0..w.cols).map(|c| x[r * w.cols + c] * w.get(j, c)).sum();
                    }
                }
            }
            _ => ops::linear(x, rows, w, None, out),
        }
    }
}
faults! {
    /// The planted controls of `cpu.linear`.
    enum LinearFault {
        DroppedLastColumn = ("dropped-last-column", "the last input column is skipped"),
        BatchDependentOrder = ("batch-dependent-order", "calls of several rows reduce in a plain sequential order"),
    }
}

impl Kernel for Linear {
    fn name(&self) -> &'static str {
        "cpu.linear"
    }
    fn claim(&self) -> Claim {
        Claim::Bound("(k/16+5)*2^-24*sum|x*w| of float64 per output (the canonical dot's error bound)")
    }
    fn reference(&self) -> &'static str {
        "float64 matrix-vector product of the bf16/f32 weights (8-bit affine: of the dequantized values fma(code, scale, bias))"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        linear_shapes(scale).iter().map(|(n, k, d)| format!("[{n},{k}] {d}")).collect()
    }
    type Fault = LinearFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let mut gates = Vec::new();
        for (n, k, dtype) in linear_shapes(scale) {
            let w = match dtype {
                "f32" => f32_mat(rng, n, k, 0.5),
                "q8" => bf16_mat(rng, n, k, 0.5).quantize_q8(64).expect("k divides into groups of 64"),
                _ => bf16_mat(rng, n, k, 0.5),
            };
            let x = uniform(rng, 2 * k);
            let mut out = vec![0f32; 2 * n];
            Self::call(fault, &x, 2, &w, &mut out);
            let mut err = 0f64;
            for r in 0..2 {
                let xr = wide(&x[r * k..(r + 1) * k]);
                for j in 0..n {
                    let wr = row64(&w, j);
                    let abs: f64 = xr.iter().zip(&wr).map(|(a, b)| (a * b).abs()).sum();
                    err = err.max((out[r * n + j] as f64 - dot64(&xr, &wr)).abs() / dot_bound(k, abs));
                }
            }
            gates.push(reference_gate(&format!("[{n},{k}]"), err, 1.0));
            // Invariance over a prefix of the outputs: each output's reduction is independent of n.
            let wn = w.row_range(0, n.min(4096)).expect("prefix");
            let xs = uniform(rng, 33 * k);
            let mut one = vec![0f32; 33 * wn.rows];
            for r in 0..33 {
                Self::call(fault, &xs[r * k..(r + 1) * k], 1, &wn, &mut one[r * wn.rows..(r + 1) * wn.rows]);
            }
            let mut diffs = 0;
            for wdt in WIDTHS {
                let mut o = vec![0f32; wdt * wn.rows];
                Self::call(fault, &xs[..wdt * k], wdt, &wn, &mut o);
                diffs += bit_diffs(&o, &one[..wdt * wn.rows]);
            }
            gates.push(invariance_gate(&format!("[{},{k}]", wn.rows), diffs));
        }
        merge(gates)
    }
}

struct Embed;
faults! {
    /// The planted controls of `cpu.embed`.
    enum EmbedFault {
        OffByOneRow = ("off-by-one-row", "gathers row id + 1"),
        ClampsOutOfRange = ("clamps-out-of-range", "an id past the table reads the last row instead of failing"),
    }
}

impl Kernel for Embed {
    fn name(&self) -> &'static str {
        "cpu.embed"
    }
    fn claim(&self) -> Claim {
        Claim::BitEqual("the table row widened exactly (bf16 bits << 16); ids past the table refused")
    }
    fn reference(&self) -> &'static str {
        "exact widening of the stored row"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        vec![if scale == Scale::Served { "[128000,2048] bf16".into() } else { "[1000,64] bf16".into() }]
    }
    type Fault = EmbedFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let (v, h) = if scale == Scale::Served { (128_000, 2048) } else { (1000, 64) };
        let t = bf16_mat(rng, v, h, 1.0);
        let call = |ids: &[u32], out: &mut [f32]| -> Result<(), tensorfold_kernels::KernelError> {
            match fault {
                Some(EmbedFault::OffByOneRow) => {
                    ops::embed(&t, &ids.iter().map(|i| (i + 1).min(v as u32 - 1)).collect::<Vec<_>>(), out)
                }
                Some(EmbedFault::ClampsOutOfRange) => {
                    ops::embed(&t, &ids.iter().map(|&i| i.min(v as u32 - 1)).collect::<Vec<_>>(), out)
                }
                _ => ops::embed(&t, ids, out),
            }
        };
        let ids: Vec<u32> =
            (0..33).map(|i| if i == 0 { v as u32 - 1 } else { rng.random_range(0..v as u32) }).collect();
        let mut out = vec![0f32; 33 * h];
        let ok = call(&ids, &mut out).is_ok();
        let want: Vec<f32> = ids.iter().flat_map(|&i| row64(&t, i as usize).into_iter().map(|x| x as f32)).collect();
        let mut one = vec![0f32; h];
        let inv: usize = WIDTHS
            .iter()
            .map(|&w| {
                let mut o = vec![0f32; w * h];
                let _ = call(&ids[..w], &mut o);
                (0..w)
                    .map(|r| {
                        let _ = call(&ids[r..r + 1], &mut one);
                        bit_diffs(&o[r * h..(r + 1) * h], &one)
                    })
                    .sum::<usize>()
            })
            .sum();
        let refused =
            matches!(call(&[v as u32], &mut one), Err(tensorfold_kernels::KernelError::TokenOutOfRange { .. }));
        vec![
            Gate::new(
                "reference",
                ok && bit_diffs(&out, &want) == 0,
                format!("{} of {} values differ", bit_diffs(&out, &want), out.len()),
            ),
            invariance_gate("33 ids", inv),
            Gate::new("edges", refused, format!("id {v} past a table of {v}: refused = {refused}")),
        ]
    }
}

struct RmsNorm;
faults! {
    /// The planted controls of `cpu.rmsnorm`.
    enum RmsNormFault {
        EpsDropped = ("eps-dropped", "eps is not added before the rsqrt"),
        MeanOverWidthMinusOne = ("mean-over-width-minus-one", "the mean divides by width - 1"),
    }
}

impl Kernel for RmsNorm {
    fn name(&self) -> &'static str {
        "cpu.rmsnorm"
    }
    fn claim(&self) -> Claim {
        Claim::Bound("2e-6 of the row's largest output (an f32 sum of squares of <= 6144 values and one rsqrt)")
    }
    fn reference(&self) -> &'static str {
        "float64 x / sqrt(mean(x^2) + eps) * weight"
    }
    fn shapes(&self, _: Scale) -> Vec<String> {
        vec!["width 2048 (hidden), 64 (head), 6144, 33".into()]
    }
    type Fault = RmsNormFault;
    fn gates(&self, _: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let eps = RMS_EPS;
        let call = |x: &[f32], w: &[f32], width: usize, out: &mut [f32]| match fault {
            Some(RmsNormFault::EpsDropped) => ops::rmsnorm(x, w, 0.0, width, out),
            Some(RmsNormFault::MeanOverWidthMinusOne) => {
                for (o, r) in out.chunks_mut(width).zip(x.chunks(width)) {
                    let ss = simd::dot(r, WRow::F32(r));
                    let s = 1.0 / (ss / (width - 1) as f32 + eps).sqrt();
                    o.iter_mut().zip(r).zip(w).for_each(|((o, v), w)| *o = v * s * w);
                }
            }
            _ => ops::rmsnorm(x, w, eps, width, out),
        };
        // NaN first, as the CUDA suite's outputs: an element the kernel fails to write fails its check.
        let out = |x: &[f32], w: &[f32], width: usize| {
            let mut o = vec![f32::NAN; x.len()];
            call(x, w, width, &mut o);
            o
        };
        merge(rmsnorm_gates(rng, &out))
    }
}

/// MoE shapes: (hidden, experts, width, top-k).
fn moe_shapes(scale: Scale) -> Vec<(usize, usize, usize, usize)> {
    match scale {
        Scale::Quick => vec![(48, 8, 24, 4)],
        Scale::Served => vec![(2048, 64, 1536, 4), (48, 8, 24, 4)],
    }
}

struct Moe;
faults! {
    /// The planted controls of `cpu.moe`.
    enum MoeFault {
        SelectWithoutBias = ("select-without-bias", "experts are selected by the score alone, ignoring expert_bias"),
        WeightWithBias = ("weight-with-bias", "selected experts are weighted by score + expert_bias"),
        ForgottenOffset = (
            "forgotten-offset",
            "an expert-parallel rank numbers its experts from 0, not from its first expert",
        ),
    }
}

impl Kernel for Moe {
    fn name(&self) -> &'static str {
        "cpu.moe"
    }
    fn claim(&self) -> Claim {
        Claim::Bound("1e-5 of the row's largest output (three chained canonical dots, f32 sigmoid/silu)")
    }
    fn reference(&self) -> &'static str {
        "float64 sigmoid router, top-k by score + expert_bias, weights by score, SwiGLU experts"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        moe_shapes(scale).iter().map(|(h, e, i, k)| format!("hidden {h}, {e} experts of {i}, top-{k}, bf16")).collect()
    }
    type Fault = MoeFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let mut gates = Vec::new();
        let p = MoeParams { top_k: 4, norm_topk_prob: true, routed_scaling_factor: 1.5 };
        for (h, ne, inter, k) in moe_shapes(scale) {
            let p = MoeParams { top_k: k, ..p };
            let gate = bf16_mat(rng, ne, h, 2.0 / (h as f32).sqrt());
            let bias: Vec<f32> = uniform(rng, ne).iter().map(|v| v * 0.3).collect();
            let ex = moe_experts(rng, h, ne, inter, false);
            let call = |x: &[f32], rows: usize, out: &mut [f32]| match fault {
                Some(MoeFault::SelectWithoutBias) => moe::moe(x, rows, &gate, None, &ex, p, out),
                Some(MoeFault::WeightWithBias) => {
                    // Weighting by score + bias: fold the bias into the weights after routing.
                    let mut logits = vec![0f32; rows * ne];
                    ops::linear(x, rows, &gate, None, &mut logits);
                    for r in 0..rows {
                        let route = moe::route_row(&logits[r * ne..(r + 1) * ne], Some(&bias), p);
                        let o = &mut out[r * h..(r + 1) * h];
                        o.fill(0.0);
                        for (e, w) in route {
                            let mut y = vec![0f32; h];
                            moe::swiglu(&x[r * h..(r + 1) * h], 1, &ex[e], &mut y);
                            o.iter_mut().zip(&y).for_each(|(a, b)| *a += (w + bias[e] * p.routed_scaling_factor) * b);
                        }
                    }
                }
                _ => moe::moe(x, rows, &gate, Some(&bias), &ex, p, out),
            };
            let x = uniform(rng, 33 * h);
            let mut out = vec![0f32; 2 * h];
            call(&x[..2 * h], 2, &mut out);
            let mut err = 0f64;
            for r in 0..2 {
                let want = moe64(&wide(&x[r * h..(r + 1) * h]), &gate, &bias, &ex, p);
                err = err.max(max_err(&out[r * h..(r + 1) * h], &want, max_abs(&want)));
            }
            gates.push(reference_gate(&format!("hidden {h}, {ne} experts"), err, 1e-5));
            let mut one = vec![0f32; 33 * h];
            for r in 0..33 {
                call(&x[r * h..(r + 1) * h], 1, &mut one[r * h..(r + 1) * h]);
            }
            let inv: usize = WIDTHS
                .iter()
                .map(|&w| {
                    let mut o = vec![0f32; w * h];
                    call(&x[..w * h], w, &mut o);
                    bit_diffs(&o, &one[..w * h])
                })
                .sum();
            gates.push(invariance_gate(&format!("hidden {h}"), inv));
            let mut want = vec![0f32; 5 * h];
            moe::moe(&x[..5 * h], 5, &gate, Some(&bias), &ex, p, &mut want);
            let forget = fault == Some(MoeFault::ForgottenOffset);
            let r = shard_diffs(&CpuBackend, (&x[..5 * h], 5, h), &gate, Some(&bias), &ex, p, &want, forget);
            gates.push(shard_gate(&format!("hidden {h}, {ne} experts"), r));
        }
        let tied = moe::route_row(
            &[0.0; 8],
            Some(&[0.0; 8]),
            MoeParams { top_k: 4, norm_topk_prob: false, routed_scaling_factor: 1.0 },
        );
        let ids: Vec<usize> = tied.iter().map(|r| r.0).collect();
        gates.push(Gate::new("edges", ids == [0, 1, 2, 3], format!("all-equal scores select {ids:?} (lowest ids)")));
        merge(gates)
    }
}

struct Greedy;
faults! {
    /// The planted controls of `cpu.greedy`.
    enum GreedyFault {
        TiesToHigherId = ("ties-to-higher-id", "a tie goes to the higher id"),
        NanNotFlagged = ("nan-not-flagged", "a NaN logit is skipped without flagging the row"),
    }
}

impl Kernel for Greedy {
    fn name(&self) -> &'static str {
        "cpu.greedy"
    }
    fn claim(&self) -> Claim {
        Claim::BitEqual("the exact integer rule: first largest logit (ties to the lower id), non-finite rows flagged")
    }
    fn reference(&self) -> &'static str {
        "exact scan"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        vec![if scale == Scale::Served { "128000 and 65536 logits a row".into() } else { "1000 logits a row".into() }]
    }
    type Fault = GreedyFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let call = |row: &[f32]| -> Pick {
            let mut p = ops::greedy_row(row);
            match fault {
                Some(GreedyFault::TiesToHigherId) => {
                    let best = row[p.token as usize];
                    p.token = row.iter().rposition(|v| *v == best).unwrap_or(0) as u32;
                }
                Some(GreedyFault::NanNotFlagged) => p.nonfinite = row.iter().any(|v| v.is_infinite()),
                _ => {}
            }
            p
        };
        let pick = |flat: &[f32], v: usize| -> Vec<Pick> { flat.chunks(v.max(1)).map(call).collect() };
        merge(greedy_gates(scale, rng, &pick))
    }
}
