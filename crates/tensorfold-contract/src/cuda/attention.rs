//! CUDA contract entries of the attention kernels: causal attention with its K/V append over a 4-stream segment
//! table, and the drafter's context append with the non-causal block attention.

use super::{Planted, TensorCoresOn, device_gate, limits, poisoned, rd, up, with_fault};
use crate::cases::*;
use crate::{Claim, Entry, Gate, Kernel, Scale, WIDTHS};
use rand::{Rng, rngs::StdRng};
use tensorfold_kernels::KernelError;
use tensorfold_kernels::backend::Segment;
use tensorfold_kernels::cuda::{CudaBackend, CudaKv, Src};
use tensorfold_kernels::prelude::*;

pub fn kernels(be: &CudaBackend) -> Vec<Box<dyn Entry>> {
    vec![
        Box::new(Attention(be.clone())),
        Box::new(BlockAttention(be.clone(), false)),
        Box::new(BlockAttention(be.clone(), true)),
    ]
}

/// The tensor-core form's claim (attention_mma.cu; see [`attend_err`]).
pub(super) const CLAIM_TC: &str = "(2*keys+16)*2^-24*max|v| + 2*(ceil(hd/16)+8)*2^-24*max_i(scale*sum|q k_i|)*max|v| of float64 (q, k, p and v as three bf16 pieces, six products a k16 step on mma.sync, each step a fresh partial folded in f32; fixed 64-key sub-blocks of fixed 256-key chunks, an ordered combine); a tile of many rows bit-equal to one-row calls";

const CLAIM: &str = "(2*keys+16)*2^-24*max|v| of float64 (fixed 256-key chunks: fixed-tree sums inside, an ordered combine); the tiled form (segments of many rows) bit-equal to one-row calls";

/// Host K and V rows `[n, width]` of one stream.
#[derive(Clone)]
struct HostKv {
    k: Vec<f32>,
    v: Vec<f32>,
}

impl HostKv {
    fn random(rng: &mut StdRng, n: usize, width: usize) -> Self {
        Self { k: uniform(rng, n * width), v: uniform(rng, n * width) }
    }

    fn with(&self, k: &[f32], v: &[f32]) -> Self {
        Self { k: [self.k.as_slice(), k].concat(), v: [self.v.as_slice(), v].concat() }
    }

    fn device(&self, be: &CudaBackend, width: usize) -> CudaKv {
        be.kv_from_host(width, &self.k, &self.v).expect("KV cache on the device")
    }
}

/// `|got - want| / bound` of one query head attending over `keys`' KV head `g` (the shared float64 reference). With
/// `tc` (the tensor-core form) the bound adds the scores' error on the tensor cores: `2 (ceil(hd/16) + 8) 2^-24 S
/// max|v|`, S the largest `scale * sum|q k|` over the keys: one rounding a k16 step's f32 fold, the pieces' 2^-24, and
/// 8 for a step's partial on the tensor cores, whose internal sum is not IEEE (the constant is the one the linears'
/// chunks measured, tools/cuda/tc: at most 7.3 x 2^-24 of sum|x w|; it is measured, not derived). An error d in the
/// scores moves the output by at most 2 d max|v|.
fn attend_err(q: &[f32], keys: &[(&[f32], &[f32])], g: usize, hd: usize, got: &[f32], tc: bool) -> f64 {
    let (want, mut bound) = attention64(q, keys, g, hd);
    if tc {
        let at = g * hd..(g + 1) * hd;
        let abs_dot = |k: &[f32]| q.iter().zip(&k[at.clone()]).map(|(a, b)| (a * b).abs() as f64).sum::<f64>();
        let s = keys.iter().map(|(k, _)| abs_dot(k)).fold(0f64, f64::max) / (hd as f64).sqrt();
        let vmax = keys.iter().flat_map(|(_, v)| &v[at.clone()]).fold(0f64, |m, x| m.max(x.abs() as f64));
        bound += 2.0 * (hd.div_ceil(16) + 8) as f64 * f64::powi(2.0, -24) * s * vmax;
    }
    max_err(got, &want, bound)
}

/// Rows `[a, b)` of a `[n, w]` buffer as (row) slices.
fn rows_of(x: &[f32], w: usize, a: usize, b: usize) -> impl Iterator<Item = &[f32]> {
    (a..b).map(move |j| &x[j * w..(j + 1) * w])
}

struct Attention(CudaBackend);

pub(super) const ATTN_PLANTS: &[Planted<AttentionFault>] = &[
    (AttentionFault::ReadsFirstStream, Src::Attention, "FAULT_ATTN_FIRST_STREAM"),
    (AttentionFault::SkipsNewestKey, Src::Attention, "FAULT_ATTN_SKIP_NEWEST"),
    (AttentionFault::BatchDependentChunkOrder, Src::Attention, "FAULT_ATTN_BATCH_ORDER"),
    (AttentionFault::AppendSkipped, Src::Attention, "FAULT_ATTN_NO_APPEND"),
    (AttentionFault::TileOrder, Src::Attention, "FAULT_ATTN_TILE_ORDER"),
];

/// Segments of at least this many rows take the tiled form in the gates (the default, 16, would leave it to the
/// widest calls only): every batched call of two or more rows a stream is then checked against one-row calls, which
/// take `attn_partial`.
const TILE_AT: usize = 2;

/// Sets the device's tiled-attention threshold to [`TILE_AT`] for an entry's gates, and puts the one before back
/// when dropped.
struct TilesAt<'a>(&'a CudaBackend, Option<usize>);

impl<'a> TilesAt<'a> {
    fn new(be: &'a CudaBackend) -> Self {
        let was = be.set_attn_tile_rows(Some(TILE_AT));
        TilesAt(be, was)
    }
}

impl Drop for TilesAt<'_> {
    fn drop(&mut self) {
        self.0.set_attn_tile_rows(self.1);
    }
}

/// (heads, kv_heads, head_dim, cached keys per stream, the long context's keys); a stream past 512 keys so rows
/// span three chunks. The tiled form has a path for head_dim 64 (served), 32 (quick, as the default pair) and any
/// other (block attention's quick shape, 16). With `tc` the quick shape has 4 query heads a KV head (as served), so
/// a tile holds 16 rows and widths 64 and 128 cut every stream into several tiles.
pub(super) fn attn_shape(scale: Scale, tc: bool) -> (usize, usize, usize, Vec<usize>, usize) {
    match scale {
        Scale::Quick if tc => (4, 1, 32, vec![5, 0, 700, 3], 1200),
        Scale::Quick => (4, 2, 32, vec![5, 0, 700, 3], 1200),
        Scale::Served => (32, 8, 64, vec![4095, 0, 700, 31], 32_767),
    }
}

/// One attention call's inputs: q `[rows, heads*hd]`, k and v `[rows, kw]`, and the streams' cached rows.
pub(super) struct AttnCase {
    heads: usize,
    kvh: usize,
    hd: usize,
    /// The tensor-core form's bound (see [`attend_err`]).
    tc: bool,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    base: Vec<HostKv>,
}

impl AttnCase {
    fn kw(&self) -> usize {
        self.kvh * self.hd
    }

    /// Rows `[a, b)` of the inputs through the kernel with `segs` (first_row relative to `a`) over `caches`.
    fn call(
        &self,
        be: &CudaBackend,
        a: usize,
        b: usize,
        segs: &[Segment],
        caches: &mut [CudaKv],
    ) -> Result<Vec<f32>, KernelError> {
        let (qw, kw) = (self.heads * self.hd, self.kw());
        let mut out = poisoned(be, (b - a) * qw);
        let mut refs: Vec<&mut CudaKv> = caches.iter_mut().collect();
        let (q, k, v) =
            (up(be, &self.q[a * qw..b * qw]), up(be, &self.k[a * kw..b * kw]), up(be, &self.v[a * kw..b * kw]));
        be.attention(&q, &k, &v, self.heads, self.kvh, segs, &mut refs, &mut out)?;
        Ok(rd(be, &out))
    }

    /// Worst `|err| / bound` of row `r` (all heads) over `keys`.
    fn row_err(&self, r: usize, out: &[f32], keys: &[(&[f32], &[f32])]) -> f64 {
        let qw = self.heads * self.hd;
        (0..self.heads)
            .map(|h| {
                let at = r * qw + h * self.hd;
                attend_err(
                    &self.q[at..at + self.hd],
                    keys,
                    h / (self.heads / self.kvh),
                    self.hd,
                    &out[at..at + self.hd],
                    self.tc,
                )
            })
            .fold(0.0, f64::max)
    }
}

faults! {
    /// The planted controls of `cuda.attention`.
    enum AttentionFault {
        ReadsFirstStream = ("reads-first-stream", "every row attends over the first stream's KV rows"),
        SkipsNewestKey = ("skips-newest-key", "a row attends keys [0, pos) (a wrong key count)"),
        BatchDependentChunkOrder = (
            "batch-dependent-chunk-order",
            "calls of several rows combine a row's key chunks in reverse",
        ),
        AppendSkipped = (
            "append-skipped",
            "the combine that also appends the call's K/V rows (causal attention) leaves the cache unwritten",
        ),
        TileOrder = (
            "tile-order",
            "the tiled form (segments of many rows) sums a chunk's probabilities in another tree order",
        ),
    }
}

impl Kernel for Attention {
    fn name(&self) -> &'static str {
        "cuda.attention"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::Bound(CLAIM)
    }
    fn reference(&self) -> &'static str {
        "float64 causal GQA softmax attention of each row over its own stream's keys [0, pos]"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        let (h, kv, hd, keys, long) = attn_shape(scale, false);
        vec![format!("{h} heads, {kv} KV heads of {hd}; 4 streams holding {keys:?} keys; one stream of {long} keys")]
    }
    type Fault = AttentionFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, ATTN_PLANTS, fault);
        let _tiles = TilesAt::new(&be);
        let _tc = TensorCoresOn::new(&be, false);
        causal_gates(&be, scale, rng, &WIDTHS, false)
    }
    fn limits(&self) -> Vec<String> {
        limits(&self.0, Src::Attention, &["kv_append", "attn_partial", "attn_tiled", "attn_combine"])
    }
}

/// The causal entries' gates on `be` (its mode set by the caller): the reference at 8 rows over 4 streams, the
/// call widths `widths` (at most 128) against one-row calls, the edges, the device. `tc`: the tensor-core bound.
pub(super) fn causal_gates(be: &CudaBackend, scale: Scale, rng: &mut StdRng, widths: &[usize], tc: bool) -> Vec<Gate> {
    let n = widths.iter().copied().max().unwrap_or(8).max(8);
    let (heads, kvh, hd, held, long) = attn_shape(scale, tc);
    let kw = kvh * hd;
    let base: Vec<HostKv> = held.iter().map(|&n| HostKv::random(rng, n, kw)).collect();
    let case = AttnCase {
        heads,
        kvh,
        hd,
        tc,
        q: uniform(rng, n * heads * hd),
        k: uniform(rng, n * kw),
        v: uniform(rng, n * kw),
        base,
    };
    let fresh = || case.base.iter().map(|h| h.device(be, kw)).collect::<Vec<_>>();
    let segs = split(8, 4, &held);
    let mut caches = fresh();
    let out = case.call(be, 0, 8, &segs, &mut caches);
    let mut err = if out.is_ok() { 0f64 } else { f64::INFINITY };
    let mut appended = out.is_ok();
    for s in segs.iter().filter(|_| out.is_ok()) {
        let c = &case.base[s.cache];
        for r in s.first_row..s.first_row + s.rows {
            let keys: Vec<(&[f32], &[f32])> = rows_of(&c.k, kw, 0, held[s.cache])
                .zip(rows_of(&c.v, kw, 0, held[s.cache]))
                .chain(rows_of(&case.k, kw, s.first_row, r + 1).zip(rows_of(&case.v, kw, s.first_row, r + 1)))
                .collect();
            err = err.max(case.row_err(r, out.as_ref().map_or(&[][..], |o| o), &keys));
        }
        let want = c.with(
            &case.k[s.first_row * kw..(s.first_row + s.rows) * kw],
            &case.v[s.first_row * kw..(s.first_row + s.rows) * kw],
        );
        let got = be.kv_to_host(&caches[s.cache]).unwrap_or_default();
        appended &= bit_diffs(&got.0, &want.k) + bit_diffs(&got.1, &want.v) == 0;
    }
    let mut gates = vec![reference_gate("8 rows over 4 streams, |err| / bound", err, 1.0)];
    let what = format!("widths {widths:?} over 4 streams");
    gates.push(invariance_gate(&what, Attention::invariance(be, &case, &held, widths)));
    gates.push(Attention::edges(be, &case, rng, long, appended));
    gates.push(device_gate(be));
    gates
}

impl Attention {
    /// Each row of calls of every width against a one-row call on its own stream's cache holding the segment's
    /// earlier rows.
    fn invariance(be: &CudaBackend, case: &AttnCase, held: &[usize], widths: &[usize]) -> usize {
        let (kw, qw) = (case.kw(), case.heads * case.hd);
        let mut inv = 0;
        for &w in widths {
            let segs = split(w, 4, held);
            let mut caches: Vec<CudaKv> = case.base.iter().map(|h| h.device(be, kw)).collect();
            let Ok(o) = case.call(be, 0, w, &segs, &mut caches) else {
                inv += 1;
                continue;
            };
            for s in &segs {
                for r in s.first_row..s.first_row + s.rows {
                    let solo =
                        case.base[s.cache].with(&case.k[s.first_row * kw..r * kw], &case.v[s.first_row * kw..r * kw]);
                    let seg = [Segment { first_row: 0, rows: 1, start_pos: solo.k.len() / kw, cache: 0 }];
                    let one = case.call(be, r, r + 1, &seg, &mut [solo.device(be, kw)]).unwrap_or_default();
                    inv += bit_diffs(&o[r * qw..(r + 1) * qw], &one);
                }
            }
        }
        inv
    }

    /// A wrong key count is refused; the call's K/V rows were appended exactly; the longest context still meets
    /// its reference.
    fn edges(be: &CudaBackend, case: &AttnCase, rng: &mut StdRng, long: usize, appended: bool) -> Gate {
        let kw = case.kw();
        let bad = [Segment { first_row: 0, rows: 1, start_pos: case.base[0].k.len() / kw + 1, cache: 0 }];
        let refused =
            matches!(case.call(be, 0, 1, &bad, &mut [case.base[0].device(be, kw)]), Err(KernelError::KeyCount { .. }));
        let lc = HostKv::random(rng, long, kw);
        let seg = [Segment { first_row: 0, rows: 1, start_pos: long, cache: 0 }];
        let out = case.call(be, 0, 1, &seg, &mut [lc.device(be, kw)]);
        let keys: Vec<(&[f32], &[f32])> = rows_of(&lc.k, kw, 0, long)
            .zip(rows_of(&lc.v, kw, 0, long))
            .chain(rows_of(&case.k, kw, 0, 1).zip(rows_of(&case.v, kw, 0, 1)))
            .collect();
        let err = out.as_ref().map_or(f64::INFINITY, |o| case.row_err(0, o, &keys));
        Gate::new(
            "edges",
            refused && appended && err <= 1.0,
            format!(
                "a wrong key count refused: {refused}; appended K/V rows exact: {appended}; {} keys: |err| / bound {err:.2e}",
                long + 1
            ),
        )
    }
}

/// The drafter's block attention; `.1`: in the tensor-core mode (attention_mma.cu), `cuda.block_attention_tc`.
struct BlockAttention(CudaBackend, bool);

pub(super) const BLOCK_PLANTS: &[Planted<BlockAttentionFault>] = &[
    (BlockAttentionFault::CausalBlock, Src::Attention, "FAULT_BLOCK_CAUSAL"),
    (BlockAttentionFault::ReadsFirstStream, Src::Attention, "FAULT_ATTN_FIRST_STREAM"),
];

/// (heads, kv_heads, head_dim, block, context rows per stream): the released 24B drafter's shape when served. With
/// `tc` the quick head_dim is 40, which the tensor-core form pads to 48 with zeros (its only check of that path),
/// and whose 6 groups of 8 output dims fall unevenly on attn_mma_few's 4 warps (a block of 4 rows is 8 pairs).
fn block_shape(scale: Scale, tc: bool) -> (usize, usize, usize, usize, Vec<usize>) {
    match scale {
        Scale::Served => (32, 8, 64, 9, vec![0, 1, 700, 4095]),
        Scale::Quick => (4, 2, if tc { 40 } else { 16 }, 4, vec![0, 1, 9, 300]),
    }
}

faults! {
    /// The planted controls of `cuda.block_attention`.
    enum BlockAttentionFault {
        CausalBlock = ("causal-block", "a block row sees only the block rows up to itself"),
        ReadsFirstStream = ("reads-first-stream", "every block attends over the first stream's context"),
    }
}

impl Kernel for BlockAttention {
    fn name(&self) -> &'static str {
        if self.1 { "cuda.block_attention_tc" } else { "cuda.block_attention" }
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::Bound(if self.1 { CLAIM_TC } else { CLAIM })
    }
    fn reference(&self) -> &'static str {
        "float64 non-causal GQA softmax attention of every block row over its stream's context keys and all its block's keys"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        let (h, kv, hd, b, ctx) = block_shape(scale, self.1);
        vec![format!("{h} heads, {kv} KV heads of {hd}; blocks of {b} over 4 streams holding {ctx:?} context rows")]
    }
    type Fault = BlockAttentionFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, BLOCK_PLANTS, fault);
        let _tiles = TilesAt::new(&be);
        let _tc = TensorCoresOn::new(&be, self.1);
        let (heads, kvh, hd, bs, held) = block_shape(scale, self.1);
        let kw = kvh * hd;
        // Contexts built through kv_append in two calls each (the drafter's absorb), checked against their rows.
        let ctx: Vec<HostKv> = held.iter().map(|&n| HostKv::random(rng, n, kw)).collect();
        let mut caches: Vec<CudaKv> = held.iter().map(|_| be.new_kv(kw)).collect();
        let mut appended = true;
        for (i, c) in ctx.iter().enumerate() {
            let n = held[i];
            let cut = rng.random_range(0..=n);
            for (a, b) in [(0, cut), (cut, n)].into_iter().filter(|(a, b)| b > a) {
                let seg = [Segment { first_row: 0, rows: b - a, start_pos: a, cache: 0 }];
                let (k, v) = (up(&be, &c.k[a * kw..b * kw]), up(&be, &c.v[a * kw..b * kw]));
                appended &= be.kv_append(&k, &v, &seg, &mut [&mut caches[i]]).is_ok();
            }
            let got = be.kv_to_host(&caches[i]).unwrap_or_default();
            appended &= got.0 == c.k && got.1 == c.v;
        }
        let n = held.len();
        let rows = n * bs;
        let case = AttnCase {
            heads,
            kvh,
            hd,
            tc: self.1,
            q: uniform(rng, rows * heads * hd),
            k: uniform(rng, rows * kw),
            v: uniform(rng, rows * kw),
            base: ctx,
        };
        let segs: Vec<Segment> =
            (0..n).map(|i| Segment { first_row: i * bs, rows: bs, start_pos: held[i], cache: i }).collect();
        let call = |a: usize, b: usize, segs: &[Segment], caches: &[&CudaKv]| -> Result<Vec<f32>, KernelError> {
            let (qw, kw) = (heads * hd, kw);
            let mut out = poisoned(&be, (b - a) * qw);
            let (q, k, v) =
                (up(&be, &case.q[a * qw..b * qw]), up(&be, &case.k[a * kw..b * kw]), up(&be, &case.v[a * kw..b * kw]));
            be.block_attention(&q, &k, &v, heads, kvh, segs, caches, &mut out)?;
            Ok(rd(&be, &out))
        };
        let refs: Vec<&CudaKv> = caches.iter().collect();
        let out = call(0, rows, &segs, &refs);
        let mut err = if out.is_ok() { 0f64 } else { f64::INFINITY };
        for s in segs.iter().filter(|_| out.is_ok()) {
            let c = &case.base[s.cache];
            let keys: Vec<(&[f32], &[f32])> = rows_of(&c.k, kw, 0, s.start_pos)
                .zip(rows_of(&c.v, kw, 0, s.start_pos))
                .chain(rows_of(&case.k, kw, s.first_row, s.first_row + s.rows).zip(rows_of(
                    &case.v,
                    kw,
                    s.first_row,
                    s.first_row + s.rows,
                )))
                .collect();
            for r in s.first_row..s.first_row + s.rows {
                err = err.max(case.row_err(r, out.as_ref().map_or(&[][..], |o| o), &keys));
            }
        }
        let mut gates = vec![reference_gate(&format!("{n} blocks of {bs}, |err| / bound"), err, 1.0)];
        // Row invariance: each stream's block alone (on attn_partial, the tiled form off) equals its rows in the
        // batched call (tiled), bit for bit. In the tensor-core mode both are attn_mma over the same one tile a
        // block, so this compares the launch's other segments only (cuda.attention_tc checks tiles and slots).
        let qw = heads * hd;
        be.set_attn_tile_rows(Some(0));
        let inv: usize = segs
            .iter()
            .map(|s| {
                let seg = [Segment { first_row: 0, rows: bs, start_pos: s.start_pos, cache: 0 }];
                let one = call(s.first_row, s.first_row + bs, &seg, &[&caches[s.cache]]).unwrap_or_default();
                let batched = out.as_ref().map_or(&[][..], |o| &o[s.first_row * qw..(s.first_row + bs) * qw]);
                bit_diffs(batched, &one)
            })
            .sum();
        be.set_attn_tile_rows(Some(TILE_AT));
        let what = if self.1 {
            "each block alone vs 4 streams batched (attn_mma both)"
        } else {
            "each block alone (attn_partial) vs 4 streams batched (tiled)"
        };
        gates.push(invariance_gate(what, inv));
        let bad = [Segment { first_row: 0, rows: bs, start_pos: held[1] + 1, cache: 1 }];
        let refused = matches!(call(0, bs, &bad, &[&caches[0], &caches[1]]), Err(KernelError::KeyCount { .. }));
        let unchanged =
            caches.iter().zip(&case.base).all(|(c, h)| be.kv_to_host(c).is_ok_and(|(k, v)| k == h.k && v == h.v));
        gates.push(Gate::new(
            "edges",
            appended && refused && unchanged,
            format!("kv_append in two calls equals the context rows: {appended}; a wrong context length refused: {refused}; caches unchanged by the block pass: {unchanged}; an empty context included"),
        ));
        gates.push(device_gate(&be));
        gates
    }
    fn limits(&self) -> Vec<String> {
        let names: &[&str] = if self.1 {
            &["kv_append", "attn_mma", "attn_mma_few", "attn_combine"]
        } else {
            &["kv_append", "attn_partial", "attn_tiled", "attn_combine"]
        };
        limits(&self.0, Src::Attention, names)
    }
}
