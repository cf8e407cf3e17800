//! CUDA contract entries of the row kernels: embedding, RMSNorm, add and row gather, and the greedy pick.

use super::{Planted, device_gate, limits, poisoned, rd, up, with_fault};
use crate::cases::*;
use crate::shared::{RMS_EPS, greedy_gates, rmsnorm_gates};
use crate::{Claim, Entry, Gate, Kernel, Scale, WIDTHS};
use rand::{Rng, rngs::StdRng};
use tensorfold_kernels::KernelError;
use tensorfold_kernels::backend::Pick;
use tensorfold_kernels::cuda::{CudaBackend, CudaBuf, CudaMat, Src};
use tensorfold_kernels::prelude::*;

pub fn kernels(be: &CudaBackend) -> Vec<Box<dyn Entry>> {
    vec![
        Box::new(Embed(be.clone())),
        Box::new(RmsNorm(be.clone())),
        Box::new(Rows(be.clone())),
        Box::new(Greedy(be.clone())),
    ]
}

struct Embed(CudaBackend);

pub(super) const EMBED_PLANTS: &[Planted<EmbedFault>] = &[
    (EmbedFault::OffByOneRow, Src::Rows, "FAULT_EMBED_OFF_BY_ONE"),
    (EmbedFault::ClampsOutOfRange, Src::Rows, "FAULT_EMBED_CLAMP"),
    (EmbedFault::DrawnStrideIgnored, Src::Rows, "FAULT_EMBED_STRIDE_IGNORED"),
    (EmbedFault::HeldPickBefore, Src::Rows, "FAULT_EMBED_HELD_PREV"),
];

faults! {
    /// The planted controls of `cuda.embed`.
    enum EmbedFault {
        OffByOneRow = ("off-by-one-row", "gathers row id + 1"),
        ClampsOutOfRange = (
            "clamps-out-of-range",
            "the host check is skipped and the kernel reads the last row for an id past the table",
        ),
        DrawnStrideIgnored = (
            "drawn-stride-ignored",
            "ids a draw left on the device are read one word apart, not three",
        ),
        HeldPickBefore = ("held-pick-before", "a held row embeds the pick before its own"),
    }
}

impl Kernel for Embed {
    fn name(&self) -> &'static str {
        "cuda.embed"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::BitEqual(
            "the table row widened exactly (bf16 bits << 16, Q8 and Q4 fmaf(code, scale, bias)); ids past the table refused on the host; a held row takes its own pick's id",
        )
    }
    fn reference(&self) -> &'static str {
        "exact widening of the stored row (MatView::get)"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        let t = if scale == Scale::Served { "[128000,2048] bf16" } else { "[1000,64] bf16" };
        vec![t.into(), "[500,64] q8 (groups of 16)".into()]
    }
    type Fault = EmbedFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, EMBED_PLANTS, fault);
        let (v, h) = if scale == Scale::Served { (128_000, 2048) } else { (1000, 64) };
        let t = bf16_mat(rng, v, h, 1.0);
        let tm = be.upload_mat(&t).expect("upload the table");
        let call = |ids: &[u32], out: &mut CudaBuf| -> Result<(), KernelError> {
            match fault {
                Some(EmbedFault::ClampsOutOfRange) => be
                    .embed_unchecked(&tm, ids, out)
                    .map_err(|e| KernelError::Device { kernel: "embed", message: e.to_string() }),
                _ => be.embed(&tm, ids, out),
            }
        };
        let ids: Vec<u32> =
            (0..33).map(|i| if i == 0 { v as u32 - 1 } else { rng.random_range(0..v as u32) }).collect();
        let mut out = poisoned(&be, 33 * h);
        let ok = call(&ids, &mut out).is_ok();
        let got = rd(&be, &out);
        let want: Vec<f32> = ids.iter().flat_map(|&i| row64(&t, i as usize).into_iter().map(|x| x as f32)).collect();
        let one: Vec<Vec<f32>> = (0..33)
            .map(|r| {
                let mut o = poisoned(&be, h);
                let _ = call(&ids[r..r + 1], &mut o);
                rd(&be, &o)
            })
            .collect();
        let inv: usize = WIDTHS
            .iter()
            .map(|&w| {
                let mut o = poisoned(&be, w * h);
                let _ = call(&ids[..w], &mut o);
                let o = rd(&be, &o);
                (0..w).map(|r| bit_diffs(&o[r * h..(r + 1) * h], &one[r])).sum::<usize>()
            })
            .sum();
        let refused = matches!(call(&[v as u32], &mut poisoned(&be, h)), Err(KernelError::TokenOutOfRange { .. }));
        // 8-bit affine tables widen as MatView::get computes them.
        let q = bf16_mat(rng, 500, 64, 1.0).quantize_q8(16).expect("groups of 16");
        let qm = be.upload_mat(&q).expect("upload the Q8 table");
        let qids: Vec<u32> = (0..9).map(|_| rng.random_range(0..500)).collect();
        let mut qo = poisoned(&be, 9 * 64);
        let q_ok = be.embed(&qm, &qids, &mut qo).is_ok();
        let qwant: Vec<f32> =
            qids.iter().flat_map(|&i| (0..64).map(move |c| (i, c))).map(|(i, c)| q.get(i as usize, c)).collect();
        let mut qd = bit_diffs(&rd(&be, &qo), &qwant);
        // 4-bit tables (two codes a byte, MLX's order) likewise.
        let q4 = bf16_mat(rng, 500, 64, 1.0).quantize_affine(tensorfold_kernels::Dtype::Q4, 32).expect("groups of 32");
        let q4m = be.upload_mat(&q4).expect("upload the Q4 table");
        let mut q4o = poisoned(&be, 9 * 64);
        let q_ok = q_ok && be.embed(&q4m, &qids, &mut q4o).is_ok();
        let q4want: Vec<f32> =
            qids.iter().flat_map(|&i| (0..64).map(move |c| (i, c))).map(|(i, c)| q4.get(i as usize, c)).collect();
        qd += bit_diffs(&rd(&be, &q4o), &q4want);
        vec![
            Gate::new(
                "reference",
                ok && q_ok && bit_diffs(&got, &want) == 0 && qd == 0,
                format!(
                    "bf16: {} of {} values differ; q8 and q4: {qd} of {} differ",
                    bit_diffs(&got, &want),
                    got.len(),
                    qwant.len() + q4want.len()
                ),
            ),
            invariance_gate("33 ids", inv),
            Gate::new("edges", refused, format!("id {v} past a table of {v}: refused = {refused}")),
            drawn_ids(&be, &tm, &ids, &want, v, h),
            held_ids(&be, &tm, &ids, &want, v, h),
            device_gate(&be),
        ]
    }
    fn limits(&self) -> Vec<String> {
        limits(&self.0, Src::Rows, &["embed"])
    }
}

/// Gate `drawn ids`: `embed_words` over `[id, status, index]` words on the device gives the rows `embed` gives for
/// the same ids, and an id past the table a NaN row.
fn drawn_ids(be: &CudaBackend, tm: &CudaMat, ids: &[u32], want: &[f32], v: usize, h: usize) -> Gate {
    let mut ws: Vec<u32> = ids.iter().flat_map(|&i| [i, 0, 7]).collect();
    ws.extend([v as u32, 0, 7]);
    let words: Vec<f32> = ws.into_iter().map(f32::from_bits).collect();
    // Zeros, not NaN: the id past the table must be written NaN by the kernel, not left as poisoned.
    let mut out = up(be, &vec![0.0; (ids.len() + 1) * h]);
    let ok = be.embed_words(tm, &up(be, &words), ids.len() + 1, &mut out).is_ok();
    let got = rd(be, &out);
    let diffs = bit_diffs(&got[..ids.len() * h], want);
    let nan = got[ids.len() * h..].iter().all(|x| x.is_nan());
    let detail = format!("{} ids: {diffs} values differ; id {v} past the table gives a NaN row: {nan}", ids.len());
    Gate::new("drawn ids", ok && diffs == 0 && nan, detail)
}

/// Gate `held ids`: `embed_held` gives `embed`'s rows for a round whose rows 1, 2, 5 and 30 to 32 take held picks
/// (words in [`tensorfold_kernels::backend::Sampling::draw_into`]'s layout, picks out of order), the other rows their host ids; a
/// held id past the table gives a NaN row, a pick past the words is refused by name.
fn held_ids(be: &CudaBackend, tm: &CudaMat, ids: &[u32], want: &[f32], v: usize, h: usize) -> Gate {
    let rows = [1usize, 2, 5, 30, 31, 32];
    // Pick j holds the id of row rows[5 - j]; pick 6 an id past the table.
    let mut ws: Vec<u32> = rows.iter().rev().flat_map(|&r| [ids[r], 0, 7]).collect();
    ws.extend([v as u32, 0, 7]);
    let words = up(be, &ws.into_iter().map(f32::from_bits).collect::<Vec<_>>());
    let mut host = ids.to_vec();
    rows.iter().for_each(|&r| host[r] = 0);
    let from: Vec<(usize, usize)> = rows.iter().enumerate().map(|(j, &r)| (r, 5 - j)).collect();
    let mut out = up(be, &vec![0.0; ids.len() * h]);
    let ok = be.embed_held(tm, &host, &words, &from, &mut out).is_ok();
    let diffs = bit_diffs(&rd(be, &out), want);
    let mut one = up(be, &vec![0.0; 2 * h]);
    let nan_ok = be.embed_held(tm, &[ids[0], 0], &words, &[(1, 6)], &mut one).is_ok();
    let one = rd(be, &one);
    let nan = nan_ok && bit_diffs(&one[..h], &want[..h]) == 0 && one[h..].iter().all(|x| x.is_nan());
    let past = be.embed_held(tm, &[0], &words, &[(0, 7)], &mut up(be, &vec![0.0; h]));
    let refused = matches!(past, Err(KernelError::Shape { what: "held pick", .. }));
    let detail = format!(
        "{} rows, {} held: {diffs} values differ; a held id past the table gives a NaN row: {nan}; pick 7 of 7 \
         refused: {refused}",
        ids.len(),
        rows.len()
    );
    Gate::new("held ids", ok && diffs == 0 && nan && refused, detail)
}

struct RmsNorm(CudaBackend);

pub(super) const RMS_PLANTS: &[Planted<RmsNormFault>] = &[
    (RmsNormFault::EpsDropped, Src::Rows, "FAULT_RMS_NO_EPS"),
    (RmsNormFault::MeanOverWidthMinusOne, Src::Rows, "FAULT_RMS_WIDTH_M1"),
    (RmsNormFault::FusedNormBeforeAdd, Src::Rows, "FAULT_ADDNORM_PRE"),
];

faults! {
    /// The planted controls of `cuda.rmsnorm`.
    enum RmsNormFault {
        EpsDropped = ("eps-dropped", "eps is not added before the rsqrt"),
        MeanOverWidthMinusOne = ("mean-over-width-minus-one", "the mean divides by width - 1"),
        FusedNormBeforeAdd = ("fused-norm-before-add", "add_rmsnorm sums the squares of the residual before the add"),
    }
}

impl Kernel for RmsNorm {
    fn name(&self) -> &'static str {
        "cuda.rmsnorm"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::Bound(
            "2e-6 of the row's largest output (a warp's f32 sum of squares of <= 6144 values and one IEEE sqrt and divide)",
        )
    }
    fn reference(&self) -> &'static str {
        "float64 x / sqrt(mean(x^2) + eps) * weight"
    }
    fn shapes(&self, _: Scale) -> Vec<String> {
        vec!["width 2048 (hidden), 64 (head), 6144, 33".into()]
    }
    type Fault = RmsNormFault;
    fn gates(&self, _: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, RMS_PLANTS, fault);
        let call = |x: &[f32], w: &[f32], width: usize| -> Vec<f32> {
            let mut o = poisoned(&be, x.len());
            be.rmsnorm(&up(&be, x), &up(&be, w), RMS_EPS, width, &mut o);
            rd(&be, &o)
        };
        let mut gates = rmsnorm_gates(rng, &call);
        gates.push(fused_gate(&be, rng, RMS_EPS));
        gates.push(device_gate(&be));
        merge(gates)
    }
    fn limits(&self) -> Vec<String> {
        limits(&self.0, Src::Rows, &["rmsnorm", "add_rmsnorm"])
    }
}

/// `add_rmsnorm` against `add` then `rmsnorm` on the same device: the residual and the normed rows bit-equal, at
/// 1 and 33 rows of widths 2048 and 33 (the one-pass form) and 3 rows of width 2304 (the wide form).
fn fused_gate(be: &CudaBackend, rng: &mut StdRng, eps: f32) -> Gate {
    let mut diffs = 0;
    for (width, rows) in [(2048, 33), (2048, 1), (33, 33), (2304, 3)] {
        let w = up(be, &uniform(rng, width).iter().map(|v| 1.0 + 0.2 * v).collect::<Vec<_>>());
        let (x, y) = (uniform(rng, rows * width), uniform(rng, rows * width));
        let (mut fx, mut fo) = (up(be, &x), poisoned(be, rows * width));
        be.add_rmsnorm(&mut fx, &up(be, &y), &w, eps, width, &mut fo);
        let (mut sx, mut so) = (up(be, &x), poisoned(be, rows * width));
        be.add(&mut sx, &up(be, &y));
        be.rmsnorm(&sx, &w, eps, width, &mut so);
        diffs += bit_diffs(&rd(be, &fx), &rd(be, &sx)) + bit_diffs(&rd(be, &fo), &rd(be, &so));
    }
    Gate::new("fused add", diffs == 0, format!("add_rmsnorm against add then rmsnorm: {diffs} values differ in bits"))
}

struct Rows(CudaBackend);

pub(super) const ROWS_PLANTS: &[Planted<RowsFault>] =
    &[(RowsFault::GatherOffByOne, Src::Rows, "FAULT_GATHER_OFF_BY_ONE")];

faults! {
    /// The planted controls of `cuda.rows`.
    enum RowsFault {
        GatherOffByOne = ("gather-off-by-one", "gather_rows copies row index + 1"),
    }
}

impl Kernel for Rows {
    fn name(&self) -> &'static str {
        "cuda.rows"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::BitEqual(
            "add: the f32 sum of each pair; gather_rows: the named rows' values, indices past the buffer refused; concat: the parts in order",
        )
    }
    fn reference(&self) -> &'static str {
        "exact host f32 add and row copy"
    }
    fn shapes(&self, _: Scale) -> Vec<String> {
        vec!["[40, 2048] add; 33 of 40 rows gathered".into()]
    }
    type Fault = RowsFault;
    fn gates(&self, _: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, ROWS_PLANTS, fault);
        let (n, w) = (40, 2048);
        let (x, y) = (uniform(rng, n * w), uniform(rng, n * w));
        let mut acc = up(&be, &x);
        be.add(&mut acc, &up(&be, &y));
        let sum: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        let add_diff = bit_diffs(&rd(&be, &acc), &sum);
        let idx: Vec<usize> = (0..33).map(|i| if i == 0 { n - 1 } else { rng.random_range(0..n) }).collect();
        let xb = up(&be, &x);
        let g = rd(&be, &be.gather_rows(&xb, w, &idx));
        let want: Vec<f32> = idx.iter().flat_map(|&r| x[r * w..(r + 1) * w].iter().copied()).collect();
        let gd = bit_diffs(&g, &want);
        let inv: usize = WIDTHS
            .iter()
            .map(|&wd| {
                let part = rd(&be, &be.gather_rows(&xb, w, &idx[..wd]));
                (0..wd)
                    .map(|r| bit_diffs(&part[r * w..(r + 1) * w], &rd(&be, &be.gather_rows(&xb, w, &idx[r..r + 1]))))
                    .sum::<usize>()
            })
            .sum();
        let bad = rd(&be, &be.gather_rows(&xb, w, &[n]));
        let refused = bad.iter().all(|v| v.is_nan()) && be.take_error("gather_rows").is_err();
        // concat (held drafts' words): the parts' values in order, an empty part included.
        let parts = [up(&be, &x[..3 * w]), up(&be, &[]), up(&be, &y[..5])];
        let joined = rd(&be, &be.concat(&parts.iter().collect::<Vec<_>>()));
        let cd = bit_diffs(&joined, &[&x[..3 * w], &y[..5]].concat());
        vec![
            Gate::new(
                "reference",
                add_diff == 0 && gd == 0 && cd == 0,
                format!("add: {add_diff} values differ; gather: {gd} differ; concat: {cd} differ"),
            ),
            invariance_gate("gathers of widths 1..33 vs one row", inv),
            Gate::new(
                "edges",
                refused,
                format!("a row past the buffer reads back NaN and reports a device error: {refused}"),
            ),
            device_gate(&be),
        ]
    }
    fn limits(&self) -> Vec<String> {
        limits(&self.0, Src::Rows, &["add_inplace", "gather_rows"])
    }
}

struct Greedy(CudaBackend);

pub(super) const GREEDY_PLANTS: &[Planted<GreedyFault>] = &[
    (GreedyFault::TiesToHigherId, Src::Rows, "FAULT_GREEDY_TIES_HIGH"),
    (GreedyFault::NanNotFlagged, Src::Rows, "FAULT_GREEDY_NAN"),
];

faults! {
    /// The planted controls of `cuda.greedy`.
    enum GreedyFault {
        TiesToHigherId = ("ties-to-higher-id", "a tie goes to the higher id"),
        NanNotFlagged = ("nan-not-flagged", "a NaN logit is skipped without flagging the row"),
    }
}

impl Kernel for Greedy {
    fn name(&self) -> &'static str {
        "cuda.greedy"
    }
    fn backend(&self) -> &'static str {
        "cuda"
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
        let be = with_fault(&self.0, GREEDY_PLANTS, fault);
        let pick = |rows: &[f32], v: usize| -> Vec<Pick> { be.greedy(&up(&be, rows), v) };
        let mut gates = greedy_gates(scale, rng, &pick);
        gates.push(device_gate(&be));
        merge(gates)
    }
    fn limits(&self) -> Vec<String> {
        limits(&self.0, Src::Rows, &["greedy"])
    }
}
