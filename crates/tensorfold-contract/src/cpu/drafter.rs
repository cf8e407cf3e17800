//! Contract entry of the DSpark drafter's attention kernels: the context append and the non-causal block
//! attention over each stream's context K/V plus its own block, several streams a call.

use crate::cases::*;
use crate::{Claim, Entry, Gate, Kernel, Scale};
use rand::{Rng, rngs::StdRng};
use tensorfold_kernels::backend::Segment;
use tensorfold_kernels::cpu::{CpuKv, attention};

pub fn kernels() -> Vec<Box<dyn Entry>> {
    vec![Box::new(BlockAttention)]
}

/// (heads, kv_heads, head_dim, block, context rows per stream): the released 24B drafter's shape when served.
fn shape(scale: Scale) -> (usize, usize, usize, usize, Vec<usize>) {
    match scale {
        Scale::Served => (32, 8, 64, 9, vec![0, 1, 700, 4095]),
        Scale::Quick => (4, 2, 16, 4, vec![0, 1, 9, 40]),
    }
}

struct BlockAttention;
impl BlockAttention {
    /// Appends `ctx` rows to each stream's cache (kv_append), then runs the block pass (with a planted fault).
    #[allow(clippy::too_many_arguments)]
    fn call(
        fault: Option<BlockAttentionFault>,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        shape: (usize, usize, usize),
        segs: &[Segment],
        caches: &[CpuKv],
        out: &mut [f32],
    ) -> Result<(), tensorfold_kernels::KernelError> {
        let (heads, kvh, hd) = shape;
        let refs: Vec<&CpuKv> = caches.iter().collect();
        attention::block_attention(q, k, v, heads, kvh, segs, &refs, out)?;
        let Some(f) = fault else { return Ok(()) };
        let w = kvh * hd;
        for s in segs {
            for r in s.first_row..s.first_row + s.rows {
                // BlockAttentionFault::CausalBlock: a row sees block rows up to itself; BlockAttentionFault::ReadsFirstStream: stream 0's context.
                let (cache, rows) = match f {
                    BlockAttentionFault::ReadsFirstStream => (&caches[0], s.rows),
                    _ => (&caches[s.cache], r - s.first_row + 1),
                };
                let block = attention::BlockKv { k: &k[s.first_row * w..], v: &v[s.first_row * w..], rows, width: w };
                for h in 0..heads {
                    let i = r * heads + h;
                    let o = &mut out[i * hd..(i + 1) * hd];
                    let scale = 1.0 / (hd as f32).sqrt();
                    attention::attend_block_row(
                        &q[i * hd..(i + 1) * hd],
                        cache,
                        &block,
                        h / (heads / kvh),
                        hd,
                        scale,
                        o,
                    );
                }
            }
        }
        Ok(())
    }
}

faults! {
    /// The planted controls of `cpu.block_attention`.
    enum BlockAttentionFault {
        CausalBlock = ("causal-block", "a block row sees only the block rows up to itself"),
        ReadsFirstStream = ("reads-first-stream", "every block attends over the first stream's context"),
    }
}

impl Kernel for BlockAttention {
    fn name(&self) -> &'static str {
        "cpu.block_attention"
    }
    fn claim(&self) -> Claim {
        Claim::Bound("(2*keys+16)*2^-24*max|v| of float64 (f32 sums in key order of weights that sum to 1)")
    }
    fn reference(&self) -> &'static str {
        "float64 non-causal GQA softmax attention of every block row over its stream's context keys and all its block's keys"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        let (h, kv, hd, b, ctx) = shape(scale);
        vec![format!("{h} heads, {kv} KV heads of {hd}; blocks of {b} over 4 streams holding {ctx:?} context rows")]
    }
    type Fault = BlockAttentionFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let (heads, kvh, hd, bs, held) = shape(scale);
        let kw = kvh * hd;
        // Contexts built through kv_append (the drafter's absorb), checked against their source rows.
        let mut caches: Vec<CpuKv> = held.iter().map(|_| CpuKv { width: kw, ..CpuKv::default() }).collect();
        let ctx: Vec<(Vec<f32>, Vec<f32>)> =
            held.iter().map(|&n| (uniform(rng, n * kw), uniform(rng, n * kw))).collect();
        let mut appended = true;
        for (i, (ck, cv)) in ctx.iter().enumerate() {
            let n = held[i];
            let split = rng.random_range(0..=n);
            for (a, b) in [(0, split), (split, n)] {
                if b > a {
                    let seg = [Segment { first_row: 0, rows: b - a, start_pos: a, cache: 0 }];
                    let mut one = [&mut caches[i]];
                    appended &= attention::kv_append(&ck[a * kw..b * kw], &cv[a * kw..b * kw], &seg, &mut one).is_ok();
                }
            }
            appended &= caches[i].k == *ck && caches[i].v == *cv;
        }
        let n = held.len();
        let rows = n * bs;
        let (q, k, v) = (uniform(rng, rows * heads * hd), uniform(rng, rows * kw), uniform(rng, rows * kw));
        let segs: Vec<Segment> =
            (0..n).map(|i| Segment { first_row: i * bs, rows: bs, start_pos: held[i], cache: i }).collect();
        let mut out = vec![0f32; rows * heads * hd];
        let ran = Self::call(fault, &q, &k, &v, (heads, kvh, hd), &segs, &caches, &mut out).is_ok();
        let mut err = if ran { 0f64 } else { f64::INFINITY };
        for s in &segs {
            let c = &caches[s.cache];
            let keys: Vec<(&[f32], &[f32])> = (0..c.len())
                .map(|j| (&c.k[j * kw..(j + 1) * kw], &c.v[j * kw..(j + 1) * kw]))
                .chain(
                    (s.first_row..s.first_row + s.rows).map(|j| (&k[j * kw..(j + 1) * kw], &v[j * kw..(j + 1) * kw])),
                )
                .collect();
            for r in s.first_row..s.first_row + s.rows {
                for h in 0..heads {
                    let qh = &q[(r * heads + h) * hd..(r * heads + h + 1) * hd];
                    let (want, bound) = attention64(qh, &keys, h / (heads / kvh), hd);
                    err = err.max(max_err(&out[(r * heads + h) * hd..(r * heads + h + 1) * hd], &want, bound));
                }
            }
        }
        let mut gates = vec![reference_gate(&format!("{n} blocks of {bs}, |err| / bound"), err, 1.0)];
        // Row invariance: each stream's block alone equals its rows in the batched call, bit for bit.
        let mut inv = 0;
        for s in &segs {
            let (a, b) = (s.first_row, s.first_row + s.rows);
            let seg = [Segment { first_row: 0, rows: bs, start_pos: s.start_pos, cache: 0 }];
            let one_cache = [caches[s.cache].clone()];
            let mut one = vec![0f32; bs * heads * hd];
            let cache_fault = if fault == Some(BlockAttentionFault::ReadsFirstStream) { None } else { fault };
            let _ = Self::call(
                cache_fault,
                &q[a * heads * hd..b * heads * hd],
                &k[a * kw..b * kw],
                &v[a * kw..b * kw],
                (heads, kvh, hd),
                &seg,
                &one_cache,
                &mut one,
            );
            inv += bit_diffs(&out[a * heads * hd..b * heads * hd], &one);
        }
        gates.push(invariance_gate("each block alone vs 4 streams batched", inv));
        let bad = [Segment { first_row: 0, rows: bs, start_pos: held[1] + 1, cache: 1 }];
        let refused = matches!(
            attention::block_attention(
                &q[..bs * heads * hd],
                &k[..bs * kw],
                &v[..bs * kw],
                heads,
                kvh,
                &bad,
                &[&caches[0], &caches[1]],
                &mut vec![0f32; bs * heads * hd]
            ),
            Err(tensorfold_kernels::KernelError::KeyCount { .. })
        );
        let unchanged = caches.iter().zip(&held).all(|(c, &n)| c.len() == n);
        gates.push(Gate::new(
            "edges",
            appended && refused && unchanged,
            format!("kv_append in two calls equals the context rows: {appended}; a wrong context length refused: {refused}; caches unchanged by the block pass: {unchanged}; an empty context included"),
        ));
        gates
    }
}
