//! CPU GQA attention over each stream's KV rows, walking the call's segment table: causal (the target)
//! by tiles of query rows and KV heads (`tiled`), and non-causal over a block (the DSpark drafter's block pass),
//! and the drafter's context appends.

use super::ops::SendPtr;
use crate::backend::{KernelError, Segment};
use crate::shape::{check_cache_state, check_caches, check_len, row_positions};
use crate::simd::{self, WRow, exp};
use rayon::prelude::*;

mod tiled;

/// One attention layer's KV rows of one stream: `k` and `v` are `[len, width]`, `width = kv_heads * hd`.
#[derive(Clone, Debug, Default)]
pub struct CpuKv {
    /// Row width (`kv_heads * head_dim`).
    pub width: usize,
    /// Keys, row-major.
    pub k: Vec<f32>,
    /// Values, row-major.
    pub v: Vec<f32>,
}

impl CpuKv {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.k.len().checked_div(self.width).unwrap_or(0)
    }

    /// True when no rows are held.
    pub fn is_empty(&self) -> bool {
        self.k.is_empty()
    }
}

/// Appends each segment's new K/V rows to its cache (checking the cache holds exactly `start_pos` rows),
/// then computes every row's attention over keys `[0, pos]` of its own stream.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    kv_heads: usize,
    segs: &[Segment],
    caches: &mut [&mut CpuKv],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let width = caches.first().map_or(0, |c| c.width);
    let hd = width / kv_heads.max(1);
    let n_rows = k.len() / width.max(1);
    check_len("attention", "q", q.len(), n_rows * heads * hd)?;
    check_len("attention", "v", v.len(), n_rows * width)?;
    check_len("attention", "out", out.len(), n_rows * heads * hd)?;
    row_positions(segs, n_rows)?;
    check_caches(segs, caches.len())?;
    check_cache_state("attention", segs, width, |i| (caches[i].width, caches[i].len()))?;
    for s in segs {
        let c = &mut caches[s.cache];
        let r = s.first_row * width..(s.first_row + s.rows) * width;
        c.k.extend_from_slice(&k[r.clone()]);
        c.v.extend_from_slice(&v[r]);
    }
    let caches: Vec<&CpuKv> = caches.iter().map(|c| &**c).collect();
    let call = tiled::Call { q, heads, kv_heads, hd, scale: 1.0 / (hd as f32).sqrt(), caches: &caches };
    tiled::causal(&call, segs, out);
    Ok(())
}

/// Softmax attention of one query head over the first `keys` rows of `cache` for KV head `kvh`.
pub fn attend_row(q: &[f32], cache: &CpuKv, kvh: usize, hd: usize, keys: usize, scale: f32, out: &mut [f32]) {
    let w = cache.width;
    let key = |j: usize| {
        let r = j * w + kvh * hd..j * w + (kvh + 1) * hd;
        (&cache.k[r.clone()], &cache.v[r])
    };
    attend(q, keys, key, scale, out);
}

/// Softmax attention of `q` over `keys` (key, value) head rows given by `key(j)`, in the one fixed order every
/// attention kernel uses: scores by the canonical dot, max, `exp(s - max)` summed in key order, values
/// accumulated in key order (multiply, then add), then divided by the sum. `exp` is [`exp::expf`].
fn attend<'a>(q: &[f32], keys: usize, key: impl Fn(usize) -> (&'a [f32], &'a [f32]), scale: f32, out: &mut [f32]) {
    let mut scores: Vec<f32> = (0..keys).map(|j| simd::dot(q, WRow::F32(key(j).0)) * scale).collect();
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for s in scores.iter_mut() {
        *s -= max;
    }
    exp::exp_in_place(simd::level(), &mut scores);
    let sum = scores.iter().fold(0f32, |sum, &s| sum + s);
    out.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        for (o, &x) in out.iter_mut().zip(key(j).1) {
            *o += p * x;
        }
    }
    for o in out.iter_mut() {
        *o /= sum;
    }
}

/// Appends each segment's K/V rows to its cache, which must hold exactly `start_pos` rows.
pub fn kv_append(k: &[f32], v: &[f32], segs: &[Segment], caches: &mut [&mut CpuKv]) -> Result<(), KernelError> {
    check_caches(segs, caches.len())?;
    let width = caches.first().map_or(0, |c| c.width);
    let n_rows = segs.iter().map(|s| s.first_row + s.rows).max().unwrap_or(0);
    check_len("kv_append", "k", k.len(), n_rows * width)?;
    check_len("kv_append", "v", v.len(), n_rows * width)?;
    check_cache_state("kv_append", segs, width, |i| (caches[i].width, caches[i].len()))?;
    for s in segs {
        let r = s.first_row * width..(s.first_row + s.rows) * width;
        caches[s.cache].k.extend_from_slice(&k[r.clone()]);
        caches[s.cache].v.extend_from_slice(&v[r]);
    }
    Ok(())
}

/// Non-causal attention of each segment's rows over its cache's `start_pos` rows and all the segment's own
/// rows (DSpark's block pass); the cache is not changed.
#[allow(clippy::too_many_arguments)]
pub fn block_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    kv_heads: usize,
    segs: &[Segment],
    caches: &[&CpuKv],
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_caches(segs, caches.len())?;
    let width = caches.first().map_or(0, |c| c.width);
    let hd = width / kv_heads.max(1);
    let n_rows = segs.iter().map(|s| s.first_row + s.rows).max().unwrap_or(0);
    check_len("block_attention", "q", q.len(), n_rows * heads * hd)?;
    check_len("block_attention", "k", k.len(), n_rows * width)?;
    check_len("block_attention", "v", v.len(), n_rows * width)?;
    check_len("block_attention", "out", out.len(), n_rows * heads * hd)?;
    row_positions(segs, n_rows)?;
    check_cache_state("block_attention", segs, width, |i| (caches[i].width, caches[i].len()))?;
    let mut row_seg = vec![0usize; n_rows];
    for (i, s) in segs.iter().enumerate() {
        row_seg[s.first_row..s.first_row + s.rows].fill(i);
    }
    let group = heads / kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let ptr = SendPtr(out.as_mut_ptr());
    (0..n_rows * heads).into_par_iter().for_each(|i| {
        let (r, h) = (i / heads, i % heads);
        let s = &segs[row_seg[r]];
        let block = BlockKv { k: &k[s.first_row * width..], v: &v[s.first_row * width..], rows: s.rows, width };
        // SAFETY: each (row, head) task writes its own hd elements.
        let o = unsafe { std::slice::from_raw_parts_mut(ptr.at(i * hd), hd) };
        attend_block_row(&q[i * hd..(i + 1) * hd], caches[s.cache], &block, h / group, hd, scale, o);
    });
    Ok(())
}

/// A block's own K/V rows `[rows, width]` (row-major slices starting at the block's first row).
pub struct BlockKv<'a> {
    /// Keys.
    pub k: &'a [f32],
    /// Values.
    pub v: &'a [f32],
    /// Rows of the block.
    pub rows: usize,
    /// Row width (`kv_heads * head_dim`).
    pub width: usize,
}

/// Softmax attention of one query head over every cache row, then every block row, for KV head `kvh`, in
/// that key order and the fixed order of [`attend_row`].
pub fn attend_block_row(q: &[f32], cache: &CpuKv, block: &BlockKv, kvh: usize, hd: usize, scale: f32, out: &mut [f32]) {
    let (cw, bw) = (cache.width, block.width);
    let key = |j: usize| -> (&[f32], &[f32]) {
        let n = cache.len();
        if j < n {
            let r = j * cw + kvh * hd..j * cw + (kvh + 1) * hd;
            (&cache.k[r.clone()], &cache.v[r])
        } else {
            let r = (j - n) * bw + kvh * hd..(j - n) * bw + (kvh + 1) * hd;
            (&block.k[r.clone()], &block.v[r])
        }
    };
    attend(q, cache.len() + block.rows, key, scale, out);
}

#[cfg(test)]
mod tests;
