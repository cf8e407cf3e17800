//! CUDA contract entries of the dense kernels: the linear (every dtype and chunk form, and several in one launch) and the fused SwiGLU FFN.

use super::{CUDA_WIDTHS, DISTINCT, MAX_WIDTH, Planted, cyclic, dense_names, device_gate, limits, poisoned, rd, up};
use super::{WideAt, warp_dot_bound, wide_names, with_fault};
use crate::cases::*;
use crate::{Claim, Entry, Gate, Kernel, Scale};
use rand::rngs::StdRng;
use tensorfold_kernels::backend::Ffn;
use tensorfold_kernels::bytes::{Dtype, MatView};
use tensorfold_kernels::cuda::{CudaBackend, CudaBuf, CudaMat, Src};
use tensorfold_kernels::prelude::*;

pub fn kernels(be: &CudaBackend) -> Vec<Box<dyn Entry>> {
    vec![Box::new(Linear(be.clone())), Box::new(Swiglu(be.clone()))]
}

/// A random matrix of `kind`: f32, bf16, q8 / q4 (groups of 64) or q8-12 / q4-12 (groups of 12: the one-element
/// chunk form).
fn make(rng: &mut StdRng, n: usize, k: usize, kind: &str) -> MatView {
    match kind {
        "q4" => bf16_mat(rng, n, k, 0.5).quantize_affine(Dtype::Q4, 64).expect("k divides into groups of 64"),
        "q4-12" => bf16_mat(rng, n, k, 0.5).quantize_affine(Dtype::Q4, 12).expect("k divides into groups of 12"),
        "f32" => f32_mat(rng, n, k, 0.5),
        "q8" => bf16_mat(rng, n, k, 0.5).quantize_q8(64).expect("k divides into groups of 64"),
        "q8-12" => bf16_mat(rng, n, k, 0.5).quantize_q8(12).expect("k divides into groups of 12"),
        _ => bf16_mat(rng, n, k, 0.5),
    }
}

/// Linear shapes `(n, k, kind)`: the CPU contract's (LFM2.5-24B-A2B's projections, head, the drafter's 8-bit
/// linears) plus shapes that take the one-element chunk form (k = 33, Q8 groups of 12) and lanes of several chunks.
fn linear_shapes(scale: Scale) -> Vec<(usize, usize, &'static str)> {
    let mut v = match scale {
        Scale::Quick => vec![(96, 80, "f32"), (300, 64, "bf16"), (48, 128, "q8"), (40, 128, "q4")],
        Scale::Served => vec![
            (6144, 2048, "bf16"),
            (2048, 2048, "bf16"),
            (512, 2048, "bf16"),
            (1536, 2048, "bf16"),
            (2048, 1536, "bf16"),
            (128_000, 2048, "bf16"),
            (96, 80, "f32"),
            (2048, 2048, "q8"),
            (6144, 2048, "q8"),
            (2048, 2048, "q4"),
            (6144, 2048, "q4"),
        ],
    };
    // k = 2312 (9 x 256 + 8): lane class 0 has 10 chunks, the others 9, so the wide tiles run classes over two
    // stages of unequal length.
    v.extend([(40, 33, "bf16"), (40, 33, "f32"), (24, 36, "q8-12"), (24, 36, "q4-12")]);
    v.extend([(64, 1024, "bf16"), (40, 2312, "bf16")]);
    v
}

struct Linear(CudaBackend);

pub(super) const LINEAR_PLANTS: &[Planted<LinearFault>] = &[
    (LinearFault::DroppedLastColumn, Src::Dense, "FAULT_LINEAR_DROP_LAST"),
    (LinearFault::BatchDependentOrder, Src::Dense, "FAULT_LINEAR_BATCH_ORDER"),
    (LinearFault::OneRowOrder, Src::Dense, "FAULT_LINEAR_R1_ORDER"),
    (LinearFault::MultiSkipsBlock, Src::Dense, "FAULT_LINEAR_MULTI_OFFSET"),
    (LinearFault::WideTree, Src::Dense, "FAULT_LINEAR_WIDE_TREE"),
];

impl Linear {
    /// Three matrices of one input in one launch (`linears`, the q/k/v form) and two (the drafter's context k/v)
    /// against a `linear` each: bit-equal outputs at 1, 3, 33 and 70 rows (the one-row, tile and wide forms), for
    /// each chunk form and dtype.
    fn multi(be: &CudaBackend, rng: &mut StdRng) -> Gate {
        let mut diffs = 0;
        let sets: [(usize, &str, &[usize]); 5] = [
            (64, "bf16", &[40, 8, 72]),
            (33, "f32", &[40, 8, 72]),
            (36, "q8-12", &[40, 8, 72]),
            (36, "q4-12", &[40, 8, 72]),
            (64, "bf16", &[24, 9]),
        ];
        for (k, kind, ns) in sets {
            let ws: Vec<CudaMat> = ns.iter().map(|&n| be.upload_mat(&make(rng, n, k, kind)).expect("upload")).collect();
            for rows in [1, 3, 33, MAX_WIDTH] {
                let x = up(be, &uniform(rng, rows * k));
                let mut outs: Vec<CudaBuf> = ws.iter().map(|w| poisoned(be, rows * w.rows)).collect();
                be.linears(&x, rows, &ws.iter().collect::<Vec<_>>(), &mut outs.iter_mut().collect::<Vec<_>>());
                for (w, o) in ws.iter().zip(&outs) {
                    let mut one = poisoned(be, rows * w.rows);
                    be.linear(&x, rows, w, None, &mut one);
                    diffs += bit_diffs(&rd(be, o), &rd(be, &one));
                }
            }
        }
        Gate::new(
            "multi",
            diffs == 0,
            format!("q/k/v-style linears in one launch against one each: {diffs} values differ"),
        )
    }

    /// Gate 2 on two rows and the bias edge: with a bias, each output is bit-equal to the unbiased output + bias.
    fn reference(be: &CudaBackend, rng: &mut StdRng, w: &MatView, shape: &str) -> Vec<Gate> {
        linear_reference(be, rng, (w, shape), warp_dot_bound)
    }

    /// Gate 3 over the first (at most 4096) outputs: one-row calls against calls of every width.
    fn invariance(be: &CudaBackend, rng: &mut StdRng, w: &MatView, shape: &str) -> Gate {
        linear_invariance(be, rng, w, shape)
    }
}

/// The linear's gate 2 on two rows against float64, the error over `bound(k, sum|x*w|)`, and the bias edge (with a
/// bias, each output is bit-equal to the unbiased output + bias), on `be` as it is set (faults, tensor cores).
pub(super) fn linear_reference(
    be: &CudaBackend,
    rng: &mut StdRng,
    (w, shape): (&MatView, &str),
    bound: fn(usize, f64) -> f64,
) -> Vec<Gate> {
    let (n, k) = (w.rows, w.cols);
    let wm = be.upload_mat(w).expect("upload the matrix");
    let x = uniform(rng, 2 * k);
    let bias = uniform(rng, n);
    let (mut out, mut outb) = (poisoned(be, 2 * n), poisoned(be, 2 * n));
    let xb = up(be, &x);
    be.linear(&xb, 2, &wm, None, &mut out);
    be.linear(&xb, 2, &wm, Some(&up(be, &bias)), &mut outb);
    let (out, outb) = (rd(be, &out), rd(be, &outb));
    let mut err = 0f64;
    for r in 0..2 {
        let xr = wide(&x[r * k..(r + 1) * k]);
        for j in 0..n {
            let wr = row64(w, j);
            let abs: f64 = xr.iter().zip(&wr).map(|(a, b)| (a * b).abs()).sum();
            err = err.max((out[r * n + j] as f64 - dot64(&xr, &wr)).abs() / bound(k, abs));
        }
    }
    let biased: Vec<f32> = out.iter().enumerate().map(|(i, v)| v + bias[i % n]).collect();
    let bd = bit_diffs(&outb, &biased);
    vec![
        reference_gate(shape, err, 1.0),
        Gate::new("edges", bd == 0, format!("{shape}: bias added after the reduction: {bd} differ")),
    ]
}

/// The linear's gate 3 over the first (at most 4096) outputs: one-row calls against calls of every width.
pub(super) fn linear_invariance(be: &CudaBackend, rng: &mut StdRng, w: &MatView, shape: &str) -> Gate {
    let k = w.cols;
    let wn = w.row_range(0, w.rows.min(4096)).expect("prefix");
    let wm = be.upload_mat(&wn).expect("upload the matrix");
    let n = wn.rows;
    let xs = cyclic(&uniform(rng, DISTINCT * k), k);
    let call = |x: &[f32], rows: usize| {
        let mut o = poisoned(be, rows * n);
        be.linear(&up(be, x), rows, &wm, None, &mut o);
        rd(be, &o)
    };
    let one: Vec<Vec<f32>> = (0..DISTINCT).map(|r| call(&xs[r * k..(r + 1) * k], 1)).collect();
    let diffs: usize = CUDA_WIDTHS
        .iter()
        .map(|&wd| {
            let o = call(&xs[..wd * k], wd);
            (0..wd).map(|r| bit_diffs(&o[r * n..(r + 1) * n], &one[r % DISTINCT])).sum::<usize>()
        })
        .sum();
    invariance_gate(shape, diffs)
}

faults! {
    /// The planted controls of `cuda.linear`.
    enum LinearFault {
        DroppedLastColumn = ("dropped-last-column", "the last input column is skipped"),
        BatchDependentOrder = ("batch-dependent-order", "calls of several rows walk each lane's chunks in reverse"),
        OneRowOrder = (
            "one-row-order",
            "the one-row kernels multiply each group of in-flight chunks in reverse (their own order)",
        ),
        MultiSkipsBlock = ("multi-skips-block", "the one-launch form skips the last matrix's first block"),
        WideTree = ("wide-tree", "the wide tiles fold the lane classes in lane order, not the butterfly's"),
    }
}

impl Kernel for Linear {
    fn name(&self) -> &'static str {
        "cuda.linear"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::Bound("(ceil(k/32)+6)*2^-24*sum|x*w| of float64 per output (a lane's fmaf chain and the warp butterfly)")
    }
    fn reference(&self) -> &'static str {
        "float64 matrix-vector product of the f32/bf16 weights (8-bit affine: of the dequantized values fma(code, scale, bias))"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        linear_shapes(scale).iter().map(|(n, k, d)| format!("[{n},{k}] {d}")).collect()
    }
    type Fault = LinearFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, LINEAR_PLANTS, fault);
        let _wide = WideAt::new(&be);
        let mut gates = Vec::new();
        for (n, k, kind) in linear_shapes(scale) {
            let w = make(rng, n, k, kind);
            let shape = format!("[{n},{k}] {kind}");
            gates.extend(Self::reference(&be, rng, &w, &shape));
            gates.push(Self::invariance(&be, rng, &w, &shape));
        }
        gates.push(Self::multi(&be, rng));
        gates.push(device_gate(&be));
        merge(gates)
    }
    fn limits(&self) -> Vec<String> {
        let names: Vec<String> =
            dense_names("linear").into_iter().chain(dense_names("linear3")).chain(wide_names("linear")).collect();
        limits(&self.0, Src::Dense, &names.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    }
}

/// SwiGLU shapes `(hidden, inter, kind)`.
fn swiglu_shapes(scale: Scale) -> Vec<(usize, usize, &'static str)> {
    // Hidden 2312: the gate-up's wide tiles over stages of unequal length (as the linear's k = 2312).
    let mut v = vec![(48, 24, "bf16"), (48, 24, "q8"), (64, 32, "q4"), (33, 20, "f32"), (2312, 24, "bf16")];
    if scale == Scale::Served {
        v.extend([(2048, 1536, "bf16"), (2048, 6144, "bf16")]);
    }
    v
}

struct Swiglu(CudaBackend);

pub(super) const SWIGLU_PLANTS: &[Planted<SwigluFault>] = &[
    (SwigluFault::UpGateSwapped, Src::Dense, "FAULT_SWIGLU_SWAPPED"),
    (SwigluFault::WideTree, Src::Dense, "FAULT_LINEAR_WIDE_TREE"),
];

/// An FFN of `kind`; q8 quantizes each matrix in the first of groups 64, 32, 16 or the whole row that divides it
/// (as `--drafter-bits 8` does).
pub(super) fn ffn(rng: &mut StdRng, h: usize, inter: usize, kind: &str) -> Ffn<MatView> {
    let mut m = |n, k| {
        let w = if kind == "f32" { f32_mat(rng, n, k, 0.2) } else { bf16_mat(rng, n, k, 0.2) };
        if kind == "q8" {
            [64, 32, 16, k].into_iter().find_map(|g| w.quantize_q8(g)).expect("a row is one group")
        } else if kind == "q4" {
            w.quantize_affine(Dtype::Q4, 32).expect("the widths divide into groups of 32")
        } else {
            w
        }
    };
    Ffn { w1: m(inter, h), w3: m(inter, h), w2: m(h, inter) }
}

/// float64 `w2(silu(w1 x) * w3 x)`.
fn swiglu64(x: &[f64], f: &Ffn<MatView>) -> Vec<f64> {
    let a: Vec<f64> = (0..f.w1.rows)
        .map(|i| {
            let g = dot64(x, &row64(&f.w1, i));
            g / (1.0 + (-g).exp()) * dot64(x, &row64(&f.w3, i))
        })
        .collect();
    (0..f.w2.rows).map(|j| dot64(&a, &row64(&f.w2, j))).collect()
}

faults! {
    /// The planted controls of `cuda.swiglu`.
    enum SwigluFault {
        UpGateSwapped = ("up-gate-swapped", "silu is applied to the up projection instead of the gate"),
        WideTree = ("wide-tree", "the wide gate-up tiles fold the lane classes in lane order"),
    }
}

impl Kernel for Swiglu {
    fn name(&self) -> &'static str {
        "cuda.swiglu"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::Bound("1e-5 of the row's largest output (two warp dots, f32 silu, one warp dot)")
    }
    fn reference(&self) -> &'static str {
        "float64 w2(silu(w1 x) * w3 x)"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        swiglu_shapes(scale).iter().map(|(h, i, d)| format!("hidden {h}, width {i}, {d}")).collect()
    }
    type Fault = SwigluFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, SWIGLU_PLANTS, fault);
        let _wide = WideAt::new(&be);
        let mut gates = swiglu_gates(&be, &swiglu_shapes(scale), rng);
        gates.push(device_gate(&be));
        merge(gates)
    }
    fn limits(&self) -> Vec<String> {
        let names: Vec<String> = dense_names("gateup").into_iter().chain(wide_names("gateup")).collect();
        limits(&self.0, Src::Dense, &names.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    }
}

/// The SwiGLU gates at `shapes` `(hidden, inter, kind)` on `be` as it is set (faults, wide threshold, tensor cores):
/// reference on two rows and invariance over [`CUDA_WIDTHS`].
pub(super) fn swiglu_gates(be: &CudaBackend, shapes: &[(usize, usize, &str)], rng: &mut StdRng) -> Vec<Gate> {
    let mut gates = Vec::new();
    for &(h, inter, kind) in shapes {
        let f = ffn(rng, h, inter, kind);
        let up_mat = |m: &MatView| be.upload_mat(m).expect("upload");
        let fm = Ffn { w1: up_mat(&f.w1), w3: up_mat(&f.w3), w2: up_mat(&f.w2) };
        let call = |x: &[f32], rows: usize| {
            let mut o = poisoned(be, rows * h);
            be.swiglu(&up(be, x), rows, &fm, &mut o);
            rd(be, &o)
        };
        let x = cyclic(&uniform(rng, DISTINCT * h), h);
        let out = call(&x[..2 * h], 2);
        let mut err = 0f64;
        for r in 0..2 {
            let want = swiglu64(&wide(&x[r * h..(r + 1) * h]), &f);
            err = err.max(max_err(&out[r * h..(r + 1) * h], &want, max_abs(&want)));
        }
        let shape = format!("hidden {h}, width {inter}, {kind}");
        gates.push(reference_gate(&shape, err, 1e-5));
        let one: Vec<Vec<f32>> = (0..DISTINCT).map(|r| call(&x[r * h..(r + 1) * h], 1)).collect();
        let inv: usize = CUDA_WIDTHS
            .iter()
            .map(|&w| {
                let o = call(&x[..w * h], w);
                (0..w).map(|r| bit_diffs(&o[r * h..(r + 1) * h], &one[r % DISTINCT])).sum::<usize>()
            })
            .sum();
        gates.push(invariance_gate(&shape, inv));
    }
    gates
}
