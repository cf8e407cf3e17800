//! Causal attention by tiles: each task is a run of consecutive query rows of one segment and one KV head, all
//! the heads of that KV group together, so a block of keys is read once for the tile's every query.
//!
//! Each query still takes [`super::attend_row`]'s one fixed order over its own keys `[0, pos]`: scores by the
//! canonical dot (a register-blocked grid of them, the same bits), the max, `exp(s - max)` summed in key order,
//! values accumulated in key order (multiply, then add) from +0, divided by the sum. A tile only shares loads, so
//! a row's bits depend on its own key count alone: chunked == whole and concurrent == solo, bit for bit.

use super::CpuKv;
use crate::backend::Segment;
use crate::cpu::ops::{SendPtr, worth_threads};
use crate::simd::{self, Level, WRow, exp};
use rayon::prelude::*;
use std::cell::RefCell;

/// Query rows a task takes (times the group's heads): enough to reuse each key block, small enough that a chunk
/// of prefill rows makes many tasks for the threads to balance (later tiles have more keys).
const TILE_ROWS: usize = 8;
/// Keys a score pass takes at once: their rows of one KV head stay in L1 while every query of the tile meets them.
const KEY_BLOCK: usize = 64;

/// The shapes and inputs every tile reads.
pub(super) struct Call<'a> {
    /// Queries `[rows, heads * hd]`.
    pub q: &'a [f32],
    /// Query heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head width.
    pub hd: usize,
    /// Score scale (`1 / sqrt(hd)`).
    pub scale: f32,
    /// Each segment's cache, after its rows were appended.
    pub caches: &'a [&'a CpuKv],
}

/// One task: rows `row0 .. row0 + rows` (positions from `pos0`) of the segment on cache `cache`, KV head `kvh`.
#[derive(Clone, Copy)]
struct Tile {
    cache: usize,
    row0: usize,
    rows: usize,
    pos0: usize,
    kvh: usize,
}

thread_local! {
    /// A thread's scores and value sums, kept between tiles (a 4,000-key tile's scores are half a MiB).
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Every segment's rows over its cache's keys `[0, pos]`, into `out` `[rows, heads * hd]`.
pub(super) fn causal(c: &Call, segs: &[Segment], out: &mut [f32]) {
    let mut tiles = Vec::new();
    for s in segs {
        for t0 in (0..s.rows).step_by(TILE_ROWS) {
            for kvh in 0..c.kv_heads {
                let rows = TILE_ROWS.min(s.rows - t0);
                tiles.push(Tile { cache: s.cache, row0: s.first_row + t0, rows, pos0: s.start_pos + t0, kvh });
            }
        }
    }
    let ptr = SendPtr(out.as_mut_ptr());
    let level = simd::level();
    let run = |t: &Tile| SCRATCH.with_borrow_mut(|(scores, acc)| tile_on(level, c, t, scores, acc, ptr));
    // Scores and value sums: two multiply-adds a head element of a (query, key) pair.
    let group = c.heads / c.kv_heads;
    let macs: usize = tiles.iter().map(|t| 2 * t.rows * group * (t.pos0 + t.rows) * c.hd).sum();
    if worth_threads(macs) {
        tiles.par_iter().for_each(run);
    } else {
        tiles.iter().for_each(run);
    }
}

/// [`tile`], its value sums compiled for AVX-512 where the CPU has it (the same operations, wider registers).
fn tile_on(level: Level, c: &Call, t: &Tile, scores: &mut Vec<f32>, acc: &mut Vec<f32>, out: SendPtr) {
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 {
        // SAFETY: Avx512 is only the level when detect() found avx512f and avx512vl.
        return unsafe { tile_avx512(level, c, t, scores, acc, out) };
    }
    tile(level, c, t, scores, acc, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn tile_avx512(level: Level, c: &Call, t: &Tile, scores: &mut Vec<f32>, acc: &mut Vec<f32>, out: SendPtr) {
    tile(level, c, t, scores, acc, out)
}

/// One tile: scores of its `rows * group` queries over keys `[0, pos0 + rows)`, each query's softmax over its
/// own keys, the weighted value sums, written to the queries' output heads.
#[inline(always)]
fn tile(level: Level, c: &Call, t: &Tile, scores: &mut Vec<f32>, acc: &mut Vec<f32>, out: SendPtr) {
    let (hd, group) = (c.hd, c.heads / c.kv_heads);
    let cache = c.caches[t.cache];
    let (n_q, stride) = (t.rows * group, t.pos0 + t.rows);
    let q_at = |i: usize| ((t.row0 + i / group) * c.heads + t.kvh * group + i % group) * hd;
    let keys = |i: usize| t.pos0 + i / group + 1;
    let qs: Vec<&[f32]> = (0..n_q).map(|i| &c.q[q_at(i)..q_at(i) + hd]).collect();
    let (w, off) = (cache.width, t.kvh * hd);
    let ks: Vec<WRow> = (0..stride).map(|j| WRow::F32(&cache.k[j * w + off..j * w + off + hd])).collect();
    scores.resize(n_q * stride, 0.0);
    for j0 in (0..stride).step_by(KEY_BLOCK) {
        let j1 = (j0 + KEY_BLOCK).min(stride);
        simd::dot_grid(level, &qs, &ks[j0..j1], &mut scores[j0..], stride);
    }
    let mut sums = vec![0f32; n_q];
    for (i, sum) in sums.iter_mut().enumerate() {
        *sum = softmax_numerators(level, &mut scores[i * stride..i * stride + keys(i)], c.scale);
    }
    acc.clear();
    acc.resize(n_q * hd, 0.0);
    let vs = Values { v: &cache.v, width: w, off, hd };
    for i0 in (0..n_q).step_by(4) {
        let i1 = (i0 + 4).min(n_q);
        let ps: Vec<&[f32]> = (i0..i1).map(|i| &scores[i * stride..i * stride + keys(i)]).collect();
        let acc = &mut acc[i0 * hd..i1 * hd];
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx512 && ps.len() == 4 {
            // SAFETY: Avx512 is only the level when detect() found avx512f and avx512vl; acc holds 4 head rows.
            let done = unsafe { x86::weighted_sums4(&ps, &vs, acc) };
            if done {
                continue;
            }
        }
        weighted_sums(&ps, &vs, acc);
    }
    for (i, sum) in sums.iter().enumerate() {
        // SAFETY: each query head of each row belongs to one tile only, and the call's out holds it.
        let o = unsafe { std::slice::from_raw_parts_mut(out.at(q_at(i)), hd) };
        for (o, a) in o.iter_mut().zip(&acc[i * hd..(i + 1) * hd]) {
            *o = a / sum;
        }
    }
}

/// Scales a query's scores, then replaces each by `exp(s - max)` ([`exp::expf`]); returns their sum in key order.
#[inline(always)]
fn softmax_numerators(level: Level, s: &mut [f32], scale: f32) -> f32 {
    for v in s.iter_mut() {
        *v *= scale;
    }
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in s.iter_mut() {
        *v -= max;
    }
    exp::exp_in_place(level, s);
    s.iter().fold(0f32, |sum, &v| sum + v)
}

/// One KV head's value rows in a cache.
struct Values<'a> {
    v: &'a [f32],
    width: usize,
    off: usize,
    hd: usize,
}

impl Values<'_> {
    #[inline(always)]
    fn row(&self, j: usize) -> &[f32] {
        &self.v[j * self.width + self.off..j * self.width + self.off + self.hd]
    }
}

/// `acc[i] += p[i][j] * v_j` over each query's keys in order (`acc` `[ps.len(), hd]`, from +0): the keys all of
/// them have together, one value row read for all, then each query's own further keys.
#[inline(always)]
fn weighted_sums(ps: &[&[f32]], vs: &Values, acc: &mut [f32]) {
    let hd = vs.hd;
    let common = ps.iter().map(|p| p.len()).min().unwrap_or(0);
    let mut rows: Vec<&mut [f32]> = acc.chunks_exact_mut(hd).collect();
    for j in 0..common {
        let v = vs.row(j);
        for (a, p) in rows.iter_mut().zip(ps) {
            axpy(a, p[j], v);
        }
    }
    for (a, p) in rows.iter_mut().zip(ps) {
        for (j, &pj) in p.iter().enumerate().skip(common) {
            axpy(a, pj, vs.row(j));
        }
    }
}

/// `a += p * v` elementwise, the product rounded before the add (no fused multiply-add: the reference's order).
#[inline(always)]
fn axpy(a: &mut [f32], p: f32, v: &[f32]) {
    for (a, &x) in a.iter_mut().zip(v) {
        *a += p * x;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Values;
    use std::arch::x86_64::*;

    /// [`super::weighted_sums`] of 4 queries with their sums in registers, for head widths of 16, 32 or 64 (false
    /// otherwise, nothing done): the same multiply, then add, of each element in key order.
    ///
    /// # Safety
    /// avx512f and avx512vl present; `ps.len() == 4`, `acc.len() == 4 * vs.hd`.
    pub unsafe fn weighted_sums4(ps: &[&[f32]], vs: &Values, acc: &mut [f32]) -> bool {
        // SAFETY: forwarded.
        unsafe {
            match vs.hd {
                16 => sums::<1>(ps, vs, acc),
                32 => sums::<2>(ps, vs, acc),
                64 => sums::<4>(ps, vs, acc),
                _ => return false,
            }
        }
        true
    }

    #[target_feature(enable = "avx512f,avx512vl")]
    unsafe fn sums<const C: usize>(ps: &[&[f32]], vs: &Values, acc: &mut [f32]) {
        let common = ps.iter().map(|p| p.len()).min().unwrap_or(0);
        let mut a = [[_mm512_setzero_ps(); C]; 4];
        for j in 0..common {
            // SAFETY: avx512f and avx512vl present (this function's features).
            let v = unsafe { load::<C>(vs.row(j)) };
            for (ai, p) in a.iter_mut().zip(ps) {
                let p = _mm512_set1_ps(p[j]);
                for (x, vc) in ai.iter_mut().zip(&v) {
                    *x = _mm512_add_ps(*x, _mm512_mul_ps(p, *vc));
                }
            }
        }
        for (i, (p, mut r)) in ps.iter().zip(a).enumerate() {
            for (j, &pj) in p.iter().enumerate().skip(common) {
                // SAFETY: as above.
                let v = unsafe { load::<C>(vs.row(j)) };
                let p = _mm512_set1_ps(pj);
                for (x, vc) in r.iter_mut().zip(&v) {
                    *x = _mm512_add_ps(*x, _mm512_mul_ps(p, *vc));
                }
            }
            for (c, rc) in r.iter().enumerate() {
                // SAFETY: acc holds 4 rows of C * 16.
                unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add((i * C + c) * 16), *rc) };
            }
        }
    }

    /// The row's first `C * 16` values, 16 a register.
    ///
    /// # Safety
    /// avx512f and avx512vl present.
    #[inline(always)]
    unsafe fn load<const C: usize>(row: &[f32]) -> [__m512; C] {
        assert!(row.len() >= C * 16);
        // SAFETY: the caller's promise.
        let mut v = [unsafe { _mm512_setzero_ps() }; C];
        for (c, x) in v.iter_mut().enumerate() {
            // SAFETY: the row holds C * 16 f32 (checked); the caller's promise.
            *x = unsafe { _mm512_loadu_ps(row.as_ptr().add(c * 16)) };
        }
        v
    }
}
