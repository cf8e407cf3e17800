//! CUDA contract entry of the tensor-core forms (dense_tc.cu): the linear, the dense SwiGLU and the MoE experts (bf16, and MLX Q8 / Q4 codes) with three bf16 pieces of each activation on mma.sync, one K order (segments of 32-element chunks) at every width.

use super::dense::ffn;
use super::{Planted, TensorCoresOn, device_gate, limits, poisoned, rd, up};
use super::{WideAt, with_fault};
use crate::cases::*;
use crate::{Claim, Entry, Gate, Kernel, Scale};
use rand::rngs::StdRng;
use tensorfold_kernels::backend::Ffn;
use tensorfold_kernels::bytes::{Dtype, MatView};
use tensorfold_kernels::cuda::{CudaBackend, Src};
use tensorfold_kernels::prelude::*;

pub fn kernels(be: &CudaBackend) -> Vec<Box<dyn Entry>> {
    vec![Box::new(LinearTc(be.clone()))]
}

/// Shapes `(n, k)`, all bf16 with k % 32 == 0 (what the tensor-core form serves). Quick: chunk counts 1 (three
/// empty segments), 2, 5 (segments of unequal length), 64 and 65, and n past a whole 8-, 16- and 128-column block.
fn shapes(scale: Scale) -> Vec<(usize, usize)> {
    let mut v = vec![(40, 32), (96, 64), (130, 160), (72, 2048), (24, 2080)];
    if scale == Scale::Served {
        v.extend([(6144, 2048), (2048, 2048), (512, 2048), (1536, 2048), (2048, 1536), (128_000, 2048)]);
    }
    v
}

/// Quantized shapes `(n, k, dtype, group)` the tensor-core forms serve (k % 32 == 0, groups of 32 times a power of
/// two): chunk counts 2 to 65, groups of 1, 2 and 4 chunks, n past a whole block.
fn affine_shapes(scale: Scale) -> Vec<(usize, usize, Dtype, usize)> {
    let mut v = vec![
        (40, 64, Dtype::Q4, 32),
        (96, 128, Dtype::Q8, 64),
        (130, 256, Dtype::Q4, 128),
        (24, 2080, Dtype::Q8, 32),
        (72, 2048, Dtype::Q4, 64),
    ];
    if scale == Scale::Served {
        v.extend([(6144, 2048, Dtype::Q4, 64), (2048, 2048, Dtype::Q8, 64), (2048, 1536, Dtype::Q4, 64)]);
    }
    v
}

/// SwiGLU shapes `(hidden, inter, kind)` the tensor-core gate-up and down serve (both k % 32 == 0).
fn swiglu_shapes(scale: Scale) -> Vec<(usize, usize, &'static str)> {
    let mut v = vec![(64, 96, "bf16"), (256, 64, "bf16"), (1056, 32, "bf16"), (64, 96, "q4"), (256, 64, "q8")];
    if scale == Scale::Served {
        v.push((2048, 1536, "bf16"));
    }
    v
}

/// MoE shapes `(hidden, experts, width, top-k, dtype)` whose experts the tensor-core tiles serve.
fn moe_shapes(scale: Scale) -> Vec<(usize, usize, usize, usize, &'static str)> {
    let mut v = vec![(64, 8, 96, 2, "bf16"), (128, 8, 64, 4, "bf16"), (32, 100, 32, 3, "bf16")];
    v.extend([(64, 8, 96, 2, "q4"), (128, 8, 64, 4, "q8")]);
    if scale == Scale::Served {
        v.insert(0, (2048, 64, 1536, 4, "bf16"));
    }
    v
}

pub(super) const TC_PLANTS: &[Planted<TcFault>] = &[
    (TcFault::DroppedPieces, Src::Dense, "FAULT_TC_DROP_LO"),
    (TcFault::WidthSplit, Src::Dense, "FAULT_TC_WIDTH_SPLIT"),
    (TcFault::RowMix, Src::Dense, "FAULT_TC_ROW_MIX"),
    (TcFault::GroupOrder, Src::Dense, "FAULT_TC_GROUP_ORDER"),
    (TcFault::FewOrder, Src::Dense, "FAULT_TC_FEW_ORDER"),
    (TcFault::QuantBias, Src::Dense, "FAULT_TC_Q_BIAS"),
];

faults! {
    /// The planted controls of `cuda.tensor_cores`.
    enum TcFault {
        DroppedPieces = ("dropped-pieces", "the activations enter as one bf16 piece (lo and lo2 dropped)"),
        WidthSplit = ("width-split", "the wide form splits k into 2 segments, the narrow into 4 (a split chosen by width)"),
        RowMix = ("row-mix", "a row of a wide tile (linear, gate-up, experts) reads the next row's activations"),
        GroupOrder = ("group-order", "narrow and few-row blocks of several column groups add the K segments in reverse"),
        FewOrder = ("few-order", "the few-row form (at most 8 rows, MoE tiles) adds a chunk's pieces in reverse order"),
        QuantBias = ("quant-bias", "a quantized chunk's value drops its bias term (s * sum(q x) alone)"),
    }
}

/// Bound of the tensor-core chain of length `k`: `(2 ceil(k/32) + 8) * 2^-24 * sum|x*w|`: per chunk one f32 fold
/// and the partial's own rounding on the tensor cores (their internal sum is not IEEE round-to-nearest; measured at
/// most 7.3 x 2^-24 of sum|x*w| over a whole 2048-long dot, tools/cuda/tc), the 3 segment adds, the pieces' 2^-24
/// of x, and one for second-order terms.
fn tc_bound(k: usize, abs_sum: f64) -> f64 {
    (2.0 * k.div_ceil(32) as f64 + 8.0) * f64::powi(2.0, -24) * abs_sum
}

/// Bound of a quantized matrix's chain of length `k`: `(2 ceil(k/32) + 20) * 2^-24 * sum (|s q| + |b|) |x|`: the
/// bf16 chain's terms over the magnitudes a chunk's value combines, plus per chunk the 10 adds of its sum of x,
/// the product b X and the fmaf that joins it to s P.
fn tc_affine_bound(k: usize, mag: f64) -> f64 {
    (2.0 * k.div_ceil(32) as f64 + 20.0) * f64::powi(2.0, -24) * mag
}

/// Gate `reference` of a quantized tensor-core linear: two rows against float64 over the widened weights, each
/// output within [`tc_affine_bound`] of `sum (|w - b| + |b|) |x|` (`|w - b|` is the group's `|s q|`).
fn affine_reference(be: &CudaBackend, rng: &mut StdRng, w: &MatView, shape: &str) -> Gate {
    let (n, k) = (w.rows, w.cols);
    let a = w.affine.as_ref().expect("a quantized matrix");
    let biases: Vec<f32> =
        a.biases.as_slice().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let wm = be.upload_mat(w).expect("upload the matrix");
    let x = uniform(rng, 2 * k);
    let mut out = poisoned(be, 2 * n);
    be.linear(&up(be, &x), 2, &wm, None, &mut out);
    let out = rd(be, &out);
    let mut err = 0f64;
    for r in 0..2 {
        let xr = wide(&x[r * k..(r + 1) * k]);
        for j in 0..n {
            let wr = row64(w, j);
            let b = |c: usize| biases[j * (k / a.group) + c / a.group] as f64;
            let mag: f64 = xr.iter().enumerate().map(|(c, v)| ((wr[c] - b(c)).abs() + b(c).abs()) * v.abs()).sum();
            err = err.max((out[r * n + j] as f64 - dot64(&xr, &wr)).abs() / tc_affine_bound(k, mag));
        }
    }
    reference_gate(shape, err, 1.0)
}

struct LinearTc(CudaBackend);

impl LinearTc {
    /// Gate `multi`: q/k/v-style linears of one input in one call (one few-row launch at 1 and 3 rows, at 1, 2 and
    /// 4 column groups) give each output a `linear`'s bits.
    fn multi(be: &CudaBackend, rng: &mut StdRng, dtype: (Dtype, usize)) -> Gate {
        let ws: Vec<_> =
            [40, 8, 72].iter().map(|&n| be.upload_mat(&tc_mat(rng, n, 64, dtype)).expect("upload")).collect();
        let mut diffs = 0;
        for (rows, groups) in [(1, 1), (3, 2), (3, 4), (70, 1)] {
            let _g = GroupsAt::new(be, groups);
            let x = up(be, &uniform(rng, rows * 64));
            let mut outs: Vec<_> = ws.iter().map(|w| poisoned(be, rows * w.rows)).collect();
            be.linears(&x, rows, &ws.iter().collect::<Vec<_>>(), &mut outs.iter_mut().collect::<Vec<_>>());
            for (w, o) in ws.iter().zip(&outs) {
                let mut one = poisoned(be, rows * w.rows);
                be.linear(&x, rows, w, None, &mut one);
                diffs += bit_diffs(&rd(be, o), &rd(be, &one));
            }
        }
        Gate::new(
            "multi",
            diffs == 0,
            format!("three {:?} linears in one call against one each: {diffs} values differ", dtype.0),
        )
    }
}

/// A `[n, k]` test matrix of `dtype` for the tensor-core forms: bf16, or bf16 values quantized to Q8 / Q4 in
/// groups of `group`.
fn tc_mat(rng: &mut StdRng, n: usize, k: usize, (dtype, group): (Dtype, usize)) -> MatView {
    let w = bf16_mat(rng, n, k, 0.5);
    if dtype.is_affine() { w.quantize_affine(dtype, group).expect("k divides into groups") } else { w }
}

/// Sets the narrow forms' column groups for a gate and puts the host's choice back when dropped.
struct GroupsAt<'a>(&'a CudaBackend, Option<usize>);

impl<'a> GroupsAt<'a> {
    fn new(be: &'a CudaBackend, groups: usize) -> Self {
        let was = be.set_tc_group(Some(groups));
        GroupsAt(be, was)
    }
}

impl Drop for GroupsAt<'_> {
    fn drop(&mut self) {
        self.0.set_tc_group(self.1);
    }
}

impl LinearTc {
    /// Gate `groups`: the few-row (1 row) and narrow (9 and 16 rows) forms at 1, 2 and 4 column groups a block (the
    /// linear; the gate-up reads two matrices, so 1 and 2) give every output the same bits.
    fn groups(be: &CudaBackend, rng: &mut StdRng, dtype: (Dtype, usize)) -> Gate {
        // k = 1056: 33 chunks, segments of 8, 8, 8 and 9, so every group count walks full and partial batches.
        let k = 1056;
        let w = be.upload_mat(&tc_mat(rng, 72, k, dtype)).expect("upload");
        let kind = match dtype.0 {
            Dtype::Q8 => "q8",
            Dtype::Q4 => "q4",
            _ => "bf16",
        };
        let f = ffn(rng, k, 96, kind);
        let up_mat = |m: &MatView| be.upload_mat(m).expect("upload");
        let fm = Ffn { w1: up_mat(&f.w1), w3: up_mat(&f.w3), w2: up_mat(&f.w2) };
        let mut diffs = 0;
        for rows in [1, 9, 16] {
            let (x, xh) = (up(be, &uniform(rng, rows * k)), up(be, &uniform(rng, rows * k)));
            let run = |groups: usize| {
                let _g = GroupsAt::new(be, groups);
                let (mut o, mut s) = (poisoned(be, rows * 72), poisoned(be, rows * k));
                be.linear(&x, rows, &w, None, &mut o);
                be.swiglu(&xh, rows, &fm, &mut s);
                (rd(be, &o), rd(be, &s))
            };
            let (o1, s1) = run(1);
            for groups in [2, 4] {
                let (o, s) = run(groups);
                diffs += bit_diffs(&o, &o1) + bit_diffs(&s, &s1);
            }
        }
        Gate::new(
            "groups",
            diffs == 0,
            format!("{:?} narrow forms at 2 and 4 column groups against 1: {diffs} values differ", dtype.0),
        )
    }
}

impl Kernel for LinearTc {
    fn name(&self) -> &'static str {
        "cuda.tensor_cores"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::Bound(
            "(2*ceil(k/32)+8)*2^-24*sum|x*w| of float64 per output (three bf16 pieces; a chunk's partial on the tensor cores, chunks and segments folded in f32); Q8 / Q4: (2*ceil(k/32)+20)*2^-24*sum(|s*q|+|b|)*|x|, a chunk's value fmaf(s, sum q*x, b * sum x)",
        )
    }
    fn reference(&self) -> &'static str {
        "float64 matrix-vector product of the f32 activations and the bf16 (or widened Q8 / Q4) weights; float64 SwiGLU; float64 MoE as cuda.moe"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        let linear = shapes(scale).into_iter().map(|(n, k)| format!("linear [{n},{k}] bf16"));
        let affine = affine_shapes(scale).into_iter().map(|(n, k, d, g)| format!("linear [{n},{k}] {d:?} group {g}"));
        let linear = linear.chain(affine);
        let swiglu = swiglu_shapes(scale).into_iter().map(|(h, i, d)| format!("swiglu hidden {h}, width {i}, {d}"));
        let moe = moe_shapes(scale)
            .into_iter()
            .map(|(h, e, i, k, d)| format!("moe hidden {h}, {e} experts of {i}, top-{k}, {d}"));
        linear.chain(swiglu).chain(moe).collect()
    }
    type Fault = TcFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, TC_PLANTS, fault);
        let _wide = WideAt::new(&be);
        let _tc = TensorCoresOn::new(&be, true);
        let mut gates = Vec::new();
        for (n, k) in shapes(scale) {
            let w = bf16_mat(rng, n, k, 0.5);
            let shape = format!("[{n},{k}] bf16");
            gates.extend(super::dense::linear_reference(&be, rng, (&w, &shape), tc_bound));
            gates.push(super::dense::linear_invariance(&be, rng, &w, &shape));
        }
        for (n, k, dtype, group) in affine_shapes(scale) {
            let w = bf16_mat(rng, n, k, 0.5).quantize_affine(dtype, group).expect("k divides into groups");
            let shape = format!("[{n},{k}] {dtype:?} group {group}");
            gates.push(affine_reference(&be, rng, &w, &shape));
            gates.push(super::dense::linear_invariance(&be, rng, &w, &shape));
        }
        for dtype in [(Dtype::Bf16, 1), (Dtype::Q8, 64), (Dtype::Q4, 32)] {
            gates.push(Self::multi(&be, rng, dtype));
        }
        // k = 1056 is 33 chunks: groups of 32 (one chunk) only.
        for dtype in [(Dtype::Bf16, 1), (Dtype::Q8, 32), (Dtype::Q4, 32)] {
            gates.push(Self::groups(&be, rng, dtype));
        }
        gates.extend(super::dense::swiglu_gates(&be, &swiglu_shapes(scale), rng));
        gates.extend(super::moe::moe_gates(&be, &moe_shapes(scale), rng));
        gates.push(device_gate(&be));
        merge(gates)
    }
    fn limits(&self) -> Vec<String> {
        // (kind, most column groups, the forms under the wide one: narrow "tc", few-row "tcf")
        let narrow: [(&str, usize, &[&str]); 4] = [
            ("linear", 4, &["tc", "tcf"]),
            ("gateup", 2, &["tc", "tcf"]),
            ("moe_gateup", 2, &["tcf"]),
            ("moe_down", 4, &["tcf"]),
        ];
        let names = narrow
            .iter()
            .flat_map(|&(k, most, forms)| {
                let groups = [1, 2, 4].into_iter().filter(move |&g| g <= most);
                let small = forms.iter().flat_map(move |f| {
                    let groups = groups.clone();
                    ["bf16", "q8", "q4"]
                        .into_iter()
                        .flat_map(move |d| groups.clone().map(move |g| format!("{k}_{f}{g}_{d}")))
                });
                small.chain(["bf16", "q8", "q4"].map(|d| format!("{k}_tcw_{d}")))
            })
            .chain(["bf16", "q8", "q4"].into_iter().flat_map(|d| [1, 2, 4].map(move |g| format!("linear3_tcf{g}_{d}"))))
            .collect::<Vec<_>>();
        limits(&self.0, Src::Dense, &names.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    }
}
