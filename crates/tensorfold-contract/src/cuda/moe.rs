//! CUDA contract entry of the MoE block: device routing, expert tiles grouped by expert, the rank-order combine.

use super::{CUDA_WIDTHS, DISTINCT, MAX_WIDTH, Planted, cyclic, dense_names, device_gate, limits, poisoned, rd, up};
use super::{WideAt, wide_names, with_fault};
use crate::cases::*;
use crate::{Claim, Entry, Gate, Kernel, Scale};
use rand::rngs::StdRng;
use tensorfold_kernels::backend::{Ffn, MoeParams};
use tensorfold_kernels::bytes::{Dtype, MatView};
use tensorfold_kernels::cuda::{CudaBackend, CudaMat, Src};
use tensorfold_kernels::prelude::*;

pub fn kernels(be: &CudaBackend) -> Vec<Box<dyn Entry>> {
    vec![Box::new(Moe(be.clone()))]
}

/// MoE shapes: (hidden, experts, width, top-k, dtype). f32 at odd widths takes the one-element chunk kernels; q4
/// and q8 are MLX affine experts (groups of 32), as `switch_mlp` loads them.
fn moe_shapes(scale: Scale) -> Vec<(usize, usize, usize, usize, &'static str)> {
    // hidden 1024 gives each lane several chunks, so a reordered one-row kernel changes bits; 100 and 300 experts
    // take routing's 4- and 32-slot forms (6 to 64 experts: 1 and 2 slots a lane).
    let mut v = vec![
        (48, 8, 24, 4, "bf16"),
        (33, 6, 20, 2, "f32"),
        (1024, 8, 264, 2, "bf16"),
        (32, 100, 8, 3, "bf16"),
        (32, 300, 8, 5, "bf16"),
        (64, 8, 32, 4, "q4"),
        (64, 8, 64, 3, "q8"),
    ];
    if scale == Scale::Served {
        v.insert(0, (2048, 64, 1536, 4, "bf16"));
    }
    v
}

struct Moe(CudaBackend);

pub(super) const MOE_PLANTS: &[Planted<MoeFault>] = &[
    (MoeFault::SelectWithoutBias, Src::Moe, "FAULT_MOE_NO_BIAS"),
    (MoeFault::WeightWithBias, Src::Moe, "FAULT_MOE_WEIGHT_BIAS"),
    (MoeFault::PlanUnowned, Src::Moe, "FAULT_MOE_PLAN_ALL"),
    (MoeFault::OneRowOrder, Src::Dense, "FAULT_LINEAR_R1_ORDER"),
    (MoeFault::FusedCombineReversed, Src::Rows, "FAULT_COMBINE_FUSED_REVERSE"),
    (MoeFault::WideTree, Src::Dense, "FAULT_LINEAR_WIDE_TREE"),
];

/// One shape's device weights and host references.
struct MoeCase {
    h: usize,
    gate: MatView,
    bias: Vec<f32>,
    ex: Vec<Ffn<MatView>>,
    dgate: CudaMat,
    dex: Vec<Ffn<CudaMat>>,
}

impl MoeCase {
    fn call(&self, be: &CudaBackend, x: &[f32], rows: usize, p: MoeParams, bias: bool) -> Vec<f32> {
        let mut o = poisoned(be, rows * self.h);
        let b = bias.then(|| up(be, &self.bias));
        let layer = MoeLayer { hidden: self.h, gate: &self.dgate, bias: b.as_ref(), experts: &self.dex };
        match moe(be, &up(be, x), rows, &layer, p, &mut o) {
            Ok(()) => rd(be, &o),
            Err(_) => vec![f32::NAN; rows * self.h],
        }
    }

    /// Worst error over rows `0..rows` of `out` against the float64 reference, relative to each row's largest output.
    fn err(&self, x: &[f32], out: &[f32], rows: usize, p: MoeParams, bias: &[f32]) -> f64 {
        let h = self.h;
        (0..rows)
            .map(|r| {
                let want = moe64(&wide(&x[r * h..(r + 1) * h]), &self.gate, bias, &self.ex, p);
                max_err(&out[r * h..(r + 1) * h], &want, max_abs(&want))
            })
            .fold(0.0, f64::max)
    }
}

faults! {
    /// The planted controls of `cuda.moe`.
    enum MoeFault {
        SelectWithoutBias = ("select-without-bias", "experts are selected by the score alone, ignoring expert_bias"),
        WeightWithBias = ("weight-with-bias", "selected experts are weighted by score + expert_bias"),
        PlanUnowned = (
            "plan-unowned",
            "the expert plan gives an expert-parallel rank's assignments of other ranks' experts to its own",
        ),
        OneRowOrder = (
            "one-row-order",
            "the one-row expert kernels multiply each group of in-flight chunks in reverse",
        ),
        FusedCombineReversed = (
            "fused-combine-reversed",
            "the combine fused with the residual add and norm sums the ranks from the last",
        ),
        WideTree = ("wide-tree", "the wide expert tiles fold the lane classes in lane order"),
    }
}

impl Kernel for Moe {
    fn name(&self) -> &'static str {
        "cuda.moe"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::Bound("1e-5 of the row's largest output (three chained warp dots, f32 sigmoid/silu, rank-order combine)")
    }
    fn reference(&self) -> &'static str {
        "float64 sigmoid router, top-k by score + expert_bias, weights by score, SwiGLU experts"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        moe_shapes(scale)
            .iter()
            .map(|(h, e, i, k, d)| format!("hidden {h}, {e} experts of {i}, top-{k}, {d}"))
            .collect()
    }
    type Fault = MoeFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, MOE_PLANTS, fault);
        let _wide = WideAt::new(&be);
        let mut gates = moe_gates(&be, &moe_shapes(scale), rng);
        gates.push(fused_gate(&be, rng));
        gates.push(device_gate(&be));
        merge(gates)
    }
    fn limits(&self) -> Vec<String> {
        let mut names: Vec<String> =
            ["moe_route", "moe_plan", "moe_route_plan", "moe_combine"].iter().map(|s| s.to_string()).collect();
        let mut l = limits(&self.0, Src::Moe, &names.iter().map(|s| s.as_str()).collect::<Vec<_>>());
        l.extend(limits(&self.0, Src::Rows, &["moe_combine_add_rmsnorm"]));
        names = dense_names("moe_gateup")
            .into_iter()
            .chain(dense_names("moe_down"))
            .chain(wide_names("moe_gateup"))
            .chain(wide_names("moe_down"))
            .filter(|n| !n.contains("q8") && !n.contains("q4"))
            .collect();
        l.extend(limits(&self.0, Src::Dense, &names.iter().map(|s| s.as_str()).collect::<Vec<_>>()));
        l
    }
}

impl Moe {
    /// All-equal router scores select the lowest expert ids; top_k past the experts uses all of them; no bias.
    fn edges(be: &CudaBackend, case: &MoeCase, x: &[f32], ne: usize) -> Gate {
        let h = case.h;
        let zero_gate = MatView::from_f32(ne, h, &vec![0.0; ne * h]);
        let tied = MoeCase {
            h,
            dgate: be.upload_mat(&zero_gate).expect("upload"),
            gate: zero_gate,
            bias: vec![0.0; ne],
            ex: case.ex.iter().map(|f| Ffn { w1: f.w1.clone(), w3: f.w3.clone(), w2: f.w2.clone() }).collect(),
            dex: case
                .ex
                .iter()
                .map(|f| Ffn { w1: up_mat(be, &f.w1), w3: up_mat(be, &f.w3), w2: up_mat(be, &f.w2) })
                .collect(),
        };
        let p = MoeParams { top_k: ne / 2, norm_topk_prob: false, routed_scaling_factor: 1.0 };
        let ties = tied.err(x, &tied.call(be, &x[..3 * h], 3, p, true), 3, p, &tied.bias);
        let all = MoeParams { top_k: ne + 3, norm_topk_prob: true, routed_scaling_factor: 1.0 };
        let past =
            case.err(x, &case.call(be, &x[..3 * h], 3, all, true), 3, MoeParams { top_k: ne, ..all }, &case.bias);
        let nob = MoeParams { top_k: 2, norm_topk_prob: true, routed_scaling_factor: 1.0 };
        let none = case.err(x, &case.call(be, &x[..3 * h], 3, nob, false), 3, nob, &vec![0.0; ne]);
        Gate::new(
            "edges",
            ties <= 1e-5 && past <= 1e-5 && none <= 1e-5,
            format!(
                "tied scores pick the lowest ids: err {ties:.1e}; top_k {} of {ne}: err {past:.1e}; no expert_bias: err {none:.1e}",
                ne + 3
            ),
        )
    }
}

/// `moe_combine_add_rmsnorm` against `moe_combine` then `add_rmsnorm` (or `add`, without a norm) on the same device:
/// the residual and the normed rows bit-equal, at 1, 5 and 33 rows, top-1, 4, 6 and 8, widths 2048 and 33 (the
/// one-pass form) and 2304 (the wide form).
fn fused_gate(be: &CudaBackend, rng: &mut StdRng) -> Gate {
    let (eps, mut diffs, mut failed) = (1e-5f32, 0, 0);
    let cases = [(2048, 1, 4, true), (2048, 5, 8, true), (33, 33, 1, true), (2048, 5, 4, false), (2304, 3, 6, true)];
    for (width, rows, k, norm) in cases {
        let w = up(be, &uniform(rng, width).iter().map(|v| 1.0 + 0.2 * v).collect::<Vec<_>>());
        let (x, y, wts) = (uniform(rng, rows * width), uniform(rng, rows * k * width), uniform(rng, rows * k));
        let (y, wts) = (up(be, &y), up(be, &wts));
        let (mut fx, mut fo) = (up(be, &x), poisoned(be, rows * width));
        let nw = norm.then_some((&w, eps));
        failed += be.moe_combine_add_rmsnorm((&y, &wts), rows, k, &mut fx, nw, width, &mut fo).is_err() as usize;
        let (mut sx, mut so, mut mixed) = (up(be, &x), poisoned(be, rows * width), poisoned(be, rows * width));
        failed += be.moe_combine(&y, &wts, rows, k, &mut mixed).is_err() as usize;
        if norm {
            be.add_rmsnorm(&mut sx, &mixed, &w, eps, width, &mut so);
            diffs += bit_diffs(&rd(be, &fo), &rd(be, &so));
        } else {
            be.add(&mut sx, &mixed);
        }
        diffs += bit_diffs(&rd(be, &fx), &rd(be, &sx));
    }
    Gate::new(
        "fused combine",
        diffs == 0 && failed == 0,
        format!(
            "moe_combine_add_rmsnorm against moe_combine then add_rmsnorm or add: {diffs} values differ in bits, {failed} calls failed"
        ),
    )
}

fn up_mat(be: &CudaBackend, m: &MatView) -> CudaMat {
    be.upload_mat(m).expect("upload")
}

/// The MoE gates at `shapes` `(hidden, experts, width, top-k, dtype)` on `be` as it is set (faults, wide threshold,
/// tensor cores): reference, invariance over [`CUDA_WIDTHS`], expert shards, and the routing edges.
pub(super) fn moe_gates(
    be: &CudaBackend,
    shapes: &[(usize, usize, usize, usize, &str)],
    rng: &mut StdRng,
) -> Vec<Gate> {
    let mut gates = Vec::new();
    for &(h, ne, inter, k, dtype) in shapes {
        let p = MoeParams { top_k: k, norm_topk_prob: true, routed_scaling_factor: 1.5 };
        let gate = bf16_mat(rng, ne, h, 2.0 / (h as f32).sqrt());
        let bias: Vec<f32> = uniform(rng, ne).iter().map(|v| v * 0.3).collect();
        let ex = affine_experts(moe_experts(rng, h, ne, inter, dtype == "f32"), dtype);
        let upm = |m: &MatView| be.upload_mat(m).expect("upload");
        let dex = ex.iter().map(|f| Ffn { w1: upm(&f.w1), w3: upm(&f.w3), w2: upm(&f.w2) }).collect();
        let case = MoeCase { h, dgate: upm(&gate), gate, bias, ex, dex };
        let x = cyclic(&uniform(rng, DISTINCT * h), h);
        let out = case.call(be, &x[..2 * h], 2, p, true);
        let shape = format!("hidden {h}, {ne} experts, {dtype}");
        gates.push(reference_gate(&shape, case.err(&x, &out, 2, p, &case.bias), 1e-5));
        let one: Vec<Vec<f32>> = (0..DISTINCT).map(|r| case.call(be, &x[r * h..(r + 1) * h], 1, p, true)).collect();
        let inv: usize = CUDA_WIDTHS
            .iter()
            .map(|&w| {
                let o = case.call(be, &x[..w * h], w, p, true);
                (0..w).map(|r| bit_diffs(&o[r * h..(r + 1) * h], &one[r % DISTINCT])).sum::<usize>()
            })
            .sum();
        gates.push(invariance_gate(&shape, inv));
        let b = up(be, &case.bias);
        // 5 rows take the warp kernels, MAX_WIDTH the wide tiles (each rank plans its own experts' tiles; the
        // shapes of few experts, which fill the tiles).
        let widths: &[usize] = if ne <= 8 { &[5, MAX_WIDTH] } else { &[5] };
        for &rows in widths {
            let want = case.call(be, &x[..rows * h], rows, p, true);
            let r = shard_diffs(be, (&x[..rows * h], rows, h), &case.dgate, Some(&b), &case.dex, p, &want, false);
            gates.push(shard_gate(&format!("{shape}, {rows} rows"), r));
        }
        if ne <= 8 {
            gates.push(Moe::edges(be, &case, &x, ne));
        }
    }
    gates
}

/// `ex` as MLX affine experts of `dtype` (`q4`, `q8`; groups of 32); unchanged for a float dtype.
fn affine_experts(ex: Vec<Ffn<MatView>>, dtype: &str) -> Vec<Ffn<MatView>> {
    let dt = match dtype {
        "q4" => Dtype::Q4,
        "q8" => Dtype::Q8,
        _ => return ex,
    };
    let q = |m: &MatView| m.quantize_affine(dt, 32).expect("expert widths divide into groups of 32");
    ex.iter().map(|f| Ffn { w1: q(&f.w1), w3: q(&f.w3), w2: q(&f.w2) }).collect()
}
