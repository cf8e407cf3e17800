//! The AVX-512 form of the dot grid (`super`): weight-row sources (f32, bf16, MLX codes), their prefetch, the 4 x 4
//! and one-row blocks and the canonical fold of 16 accumulators at once.

use super::Weights;
use crate::simd::LANES;
use crate::simd::affine::Chunked;
use crate::simd::affine::x86::{chunk512, chunk512_as, q4_chunk, q4_chunk_vbmi, q4_table};
use crate::simd::x86::{bf16x16, pad};
use std::arch::x86_64::*;

/// A weight row the block reads 16 elements at a time as f32 lanes.
pub(super) trait Src: Copy {
    /// Whether a one-row block over rows of whole chunks runs its 16 weight rows 4 at a time ([`Src::fours`]:
    /// each loaded value is used once, so the 16 widened rows need not be held in registers together); the
    /// same accumulations either way.
    const SPLIT: bool = false;
    /// Elements.
    fn len(&self) -> usize;
    /// Elements `o .. o + 16` widened to f32.
    ///
    /// # Safety
    /// `o + 16 <= self.len()`; avx512f and avx512vl present.
    unsafe fn load(&self, o: usize) -> __m512;
    /// Elements `o ..` (fewer than 16), zero-padded to 16 lanes.
    ///
    /// # Safety
    /// avx512f and avx512vl present.
    unsafe fn tail(&self, o: usize) -> __m512;
    /// Asks for the cache lines `d` bytes past element `o`'s 64 elements of codes or bf16 values (a hint: never
    /// faults, changes no value); f32 rows (the float test checkpoints) do nothing.
    #[inline(always)]
    fn prefetch(&self, _o: usize, _d: usize) {}
    /// The row's bytes in memory (bf16 values or codes), which set [`pf_distance`]; 0 for rows never prefetched.
    #[inline(always)]
    fn row_bytes(&self) -> usize {
        0
    }
    /// [`row_by_fours`]' walk of 4 weight rows: `acc[i]` takes `x[o..o + 16] * w4[i]`'s chunk `o` by FMA, for
    /// every chunk in order (whole chunks only, `SPLIT` rows).
    ///
    /// # Safety
    /// avx512f and avx512vl present; `x` and every row hold the same whole number of chunks.
    #[inline(always)]
    unsafe fn fours(x: &[f32], w4: &[Self; 4]) -> [__m512; 4] {
        // SAFETY: forwarded.
        unsafe { fours_by_chunk(x, w4) }
    }
}
impl Src for &[f32] {
    fn len(&self) -> usize {
        <[f32]>::len(self)
    }
    #[inline(always)]
    unsafe fn load(&self, o: usize) -> __m512 {
        // SAFETY: forwarded.
        unsafe { _mm512_loadu_ps(self.as_ptr().add(o)) }
    }
    #[inline(always)]
    unsafe fn tail(&self, o: usize) -> __m512 {
        // SAFETY: the padded copy holds 16 f32.
        unsafe { _mm512_loadu_ps(pad(&self[o..]).as_ptr()) }
    }
}
impl Src for &[u16] {
    const SPLIT: bool = true;
    fn len(&self) -> usize {
        <[u16]>::len(self)
    }
    #[inline(always)]
    unsafe fn load(&self, o: usize) -> __m512 {
        // SAFETY: forwarded.
        unsafe { bf16x16(self.as_ptr().add(o)) }
    }
    #[inline(always)]
    unsafe fn tail(&self, o: usize) -> __m512 {
        // SAFETY: the padded copy holds 16 u16.
        unsafe { bf16x16(pad(&self[o..]).as_ptr()) }
    }
    #[inline(always)]
    fn prefetch(&self, o: usize, d: usize) {
        // Called every 64 elements: two lines of bf16.
        ahead(self.as_ptr().wrapping_add(o).cast(), d);
        ahead(self.as_ptr().wrapping_add(o + 32).cast(), d);
    }
    #[inline(always)]
    fn row_bytes(&self) -> usize {
        2 * self.len()
    }
}
/// A chunked row of 4-bit codes (`Q4`) or of 8-bit codes: the code width fixed at compile time.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Codes<'a, const Q4: bool>(Chunked<'a>);
impl<const Q4: bool> Src for Codes<'_, Q4> {
    const SPLIT: bool = true;
    fn len(&self) -> usize {
        self.0.len
    }
    #[inline(always)]
    unsafe fn load(&self, o: usize) -> __m512 {
        // SAFETY: forwarded; `grid_chunked` wraps only rows of this code width.
        unsafe { chunk512_as::<Q4>(&self.0, o) }
    }
    unsafe fn tail(&self, _: usize) -> __m512 {
        unreachable!("a chunked affine row is a whole number of chunks")
    }
    #[inline(always)]
    fn prefetch(&self, o: usize, d: usize) {
        self.0.prefetch(o, d);
    }
    #[inline(always)]
    fn row_bytes(&self) -> usize {
        self.0.row_bytes()
    }
    #[inline(always)]
    unsafe fn fours(x: &[f32], w4: &[Self; 4]) -> [__m512; 4] {
        let shift = w4[0].0.shift;
        if !Q4 || w4.iter().any(|w| w.0.shift != shift) {
            // SAFETY: forwarded (the trait's walk).
            return unsafe { fours_by_chunk(x, w4) };
        }
        // SAFETY: `Q4` rows are `Codes<true>` (the same type).
        let w4 = unsafe { &*(w4 as *const [Self; 4]).cast::<[Codes<true>; 4]>() };
        if std::arch::is_x86_feature_detected!("avx512vbmi") {
            // SAFETY: avx512vbmi detected; the rest is the caller's promise.
            unsafe { fours_q4_vbmi(x, w4) }
        } else {
            // SAFETY: the caller's promise.
            unsafe { fours_q4::<false>(x, w4) }
        }
    }
}
/// [`Codes::fours`] over 4-bit rows of one group size: each row's group table built once a group, then one
/// permute a chunk (the same values `load` gives, taken by the same FMAs in the same order); `VBMI` picks how the
/// codes become permute lanes ([`q4_chunk_vbmi`] or [`q4_chunk`]: the same lanes).
///
/// # Safety
/// As [`Src::fours`], every row 4-bit with one group size; with `VBMI`, avx512vbmi present.
#[inline(always)]
unsafe fn fours_q4<const VBMI: bool>(x: &[f32], w4: &[Codes<true>; 4]) -> [__m512; 4] {
    let (n, shift) = (w4[0].0.len, w4[0].0.shift);
    let d = pf_distance(w4[0].row_bytes());
    // SAFETY: avx512f and avx512vl present (the caller's promise).
    let mut a = [unsafe { _mm512_setzero_ps() }; 4];
    for g0 in (0..n).step_by(1 << shift) {
        // SAFETY: g0 < n; the chunks below are inside every row and x (groups hold whole chunks).
        unsafe {
            let mut t = [_mm512_setzero_ps(); 4];
            for i in 0..4 {
                t[i] = q4_table(&w4[i].0, g0);
            }
            for o in (g0..g0 + (1 << shift)).step_by(LANES) {
                if (o / 2).is_multiple_of(64) {
                    // Each 64-byte line of codes once, at any group size.
                    w4.iter().for_each(|w| w.prefetch(o, d));
                }
                let xv = _mm512_loadu_ps(x.as_ptr().add(o));
                for i in 0..4 {
                    let w = if VBMI { q4_chunk_vbmi(&w4[i].0, t[i], o) } else { q4_chunk(&w4[i].0, t[i], o) };
                    a[i] = _mm512_fmadd_ps(xv, w, a[i]);
                }
            }
        }
    }
    a
}
/// [`fours_q4`] compiled with VBMI.
///
/// # Safety
/// As [`fours_q4`]; avx512f, avx512vl and avx512vbmi present.
#[target_feature(enable = "avx512f,avx512vl,avx512vbmi")]
unsafe fn fours_q4_vbmi(x: &[f32], w4: &[Codes<true>; 4]) -> [__m512; 4] {
    // SAFETY: forwarded.
    unsafe { fours_q4::<true>(x, w4) }
}
/// How far ahead [`row_by_fours`] prefetches a weight row of `row_bytes` bytes (bf16 values or codes), in bytes.
/// The walk reads 4 adjacent rows together, so a line `d` past row `r`'s position is useful only once it is past
/// the 4 rows: `d >= 4 row_bytes` (the next rows' same lines, one walk ahead, at least [`PF_MIN`]), while that
/// fits [`PF_MAX`] (about a third of L1 for the lines in flight); longer rows prefetch [`PF_MIN`] ahead in their
/// own row (the last [`PF_MIN`] of a row then falls on the walk's other rows). Session 24 fixed 2 KiB for every
/// row, which left the 8B plan's 1 KiB bf16 rows prefetching rows already being read: one-stream decode 1.19 to
/// 1.25x in bf16 there (docs/receipts/2026-12-07-cpu-prefetch-walk.md); the first prefetch's receipt:
/// docs/receipts/2026-12-06-cpu-prefetch.md.
#[inline(always)]
fn pf_distance(row_bytes: usize) -> usize {
    let walk = 4 * row_bytes;
    if walk <= PF_MAX { walk.max(PF_MIN) } else { PF_MIN }
}
/// The nearest a prefetch goes, in bytes (time for a line to arrive while the walk reads 4 rows' lines).
const PF_MIN: usize = 2048;
/// The farthest, in bytes.
const PF_MAX: usize = 16 << 10;

/// Prefetches the line `d` bytes past `p` into L1 (a hint: `p + d` need not point into any allocation).
#[inline(always)]
fn ahead(p: *const u8, d: usize) {
    // SAFETY: a prefetch never faults and reads nothing the program sees; sse is baseline on x86_64.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(d).cast()) }
}

/// The trait's default [`Src::fours`], for an override that falls back to it.
///
/// # Safety
/// As [`Src::fours`].
#[inline(always)]
unsafe fn fours_by_chunk<T: Src>(x: &[f32], w4: &[T; 4]) -> [__m512; 4] {
    // SAFETY: avx512f and avx512vl present (the caller's promise).
    let mut a = [unsafe { _mm512_setzero_ps() }; 4];
    let d = pf_distance(w4[0].row_bytes());
    for o in (0..w4[0].len()).step_by(LANES) {
        if o.is_multiple_of(64) {
            w4.iter().for_each(|w| w.prefetch(o, d));
        }
        // SAFETY: o + 16 <= the length of x and of every row.
        unsafe {
            let xv = _mm512_loadu_ps(x.as_ptr().add(o));
            for i in 0..4 {
                a[i] = _mm512_fmadd_ps(xv, w4[i].load(o), a[i]);
            }
        }
    }
    a
}
impl Src for Chunked<'_> {
    const SPLIT: bool = true;
    fn len(&self) -> usize {
        self.len
    }
    #[inline(always)]
    unsafe fn load(&self, o: usize) -> __m512 {
        // SAFETY: forwarded.
        unsafe { chunk512(self, o) }
    }
    #[inline(always)]
    fn prefetch(&self, o: usize, d: usize) {
        ahead(self.codes.as_ptr().wrapping_add(if self.nibbles { o / 2 } else { o }), d);
    }
    #[inline(always)]
    fn row_bytes(&self) -> usize {
        if self.nibbles { self.len / 2 } else { self.len }
    }
    unsafe fn tail(&self, _: usize) -> __m512 {
        unreachable!("a chunked affine row is a whole number of chunks")
    }
}

/// The whole grid: 4 x 4 blocks, then a last group of fewer than 4 x rows by 1 x 16 blocks, then what is
/// left by single pairs (1 x 1 blocks, the same canonical dot).
///
/// # Safety
/// avx512f and avx512vl present; lengths as [`super::dot_grid`] checked.
pub unsafe fn grid(xs: &[&[f32]], ws: &Weights, out: &mut [f32], stride: usize) {
    // SAFETY: forwarded.
    unsafe {
        match ws {
            Weights::F32(w) => grid_of(xs, w.as_slice(), out, stride),
            Weights::Bf16(w) => grid_of(xs, w.as_slice(), out, stride),
        }
    }
}

/// [`grid`] over chunked affine rows.
///
/// # Safety
/// As [`grid`].
pub unsafe fn grid_chunked(xs: &[&[f32]], ws: &[Chunked], out: &mut [f32], stride: usize) {
    let q4 = ws[0].nibbles;
    if ws.iter().any(|w| w.nibbles != q4) {
        // SAFETY: forwarded.
        return unsafe { grid_of(xs, ws, out, stride) };
    }
    // SAFETY: `Codes` is a transparent wrapper of `Chunked` and every row has the width it names; the rest is
    // forwarded.
    unsafe {
        if q4 {
            grid_of(xs, std::slice::from_raw_parts(ws.as_ptr().cast::<Codes<true>>(), ws.len()), out, stride)
        } else {
            grid_of(xs, std::slice::from_raw_parts(ws.as_ptr().cast::<Codes<false>>(), ws.len()), out, stride)
        }
    }
}

/// [`super::dot_rows`]: `out[j] = dot(x, w[j * k..(j + 1) * k])` for every row of `w`, 16 rows a register
/// block as [`grid_of`] takes one x row, the rows past the last whole 16 one at a time (the same dots).
///
/// # Safety
/// avx512f and avx512vl present; `x.len() == k`, `w.len() == out.len() * k`.
#[target_feature(enable = "avx512f,avx512vl")]
pub unsafe fn rows1<E>(x: &[f32], w: &[E], k: usize, out: &mut [f32])
where
    for<'b> &'b [E]: Src,
{
    let n = out.len();
    let n16 = n / 16 * 16;
    for b in (0..n16).step_by(16) {
        let ws: [&[E]; 16] = std::array::from_fn(|i| &w[(b + i) * k..(b + i + 1) * k]);
        // SAFETY: avx512f and avx512vl present (this function's feature); every row has k elements, as x.
        let r = unsafe { block::<1, 16, &[E]>(&[x], &ws) };
        out[b..b + 16].copy_from_slice(&r);
    }
    for b in n16..n {
        // SAFETY: as above.
        out[b] = unsafe { block::<1, 1, &[E]>(&[x], &[&w[b * k..(b + 1) * k]]) }[0];
    }
}

#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn grid_of<T: Src>(xs: &[&[f32]], ws: &[T], out: &mut [f32], stride: usize) {
    let (na, nb) = (xs.len(), ws.len());
    let (a4, b4) = (na / 4 * 4, nb / 4 * 4);
    for a in (0..a4).step_by(4) {
        let x: &[&[f32]; 4] = xs[a..a + 4].try_into().expect("4 rows");
        for b in (0..b4).step_by(4) {
            let w: &[T; 4] = ws[b..b + 4].try_into().expect("4 rows");
            // SAFETY: avx512f and avx512vl present (this function's feature); rows share one length.
            let r = unsafe { block::<4, 4, T>(x, w) };
            for i in 0..4 {
                out[(a + i) * stride + b..(a + i) * stride + b + 4].copy_from_slice(&r[i * 4..i * 4 + 4]);
            }
        }
        for b in b4..nb {
            for i in 0..4 {
                // SAFETY: as above.
                out[(a + i) * stride + b] = unsafe { block::<1, 1, T>(&[x[i]], &[ws[b]]) }[0];
            }
        }
    }
    for a in a4..na {
        let b16 = nb / 16 * 16;
        for b in (0..b16).step_by(16) {
            let w: &[T; 16] = ws[b..b + 16].try_into().expect("16 rows");
            // SAFETY: as above.
            let r = unsafe { block::<1, 16, T>(&[xs[a]], w) };
            out[a * stride + b..a * stride + b + 16].copy_from_slice(&r);
        }
        for b in b16..nb {
            // SAFETY: as above.
            out[a * stride + b] = unsafe { block::<1, 1, T>(&[xs[a]], &[ws[b]]) }[0];
        }
    }
}

/// `A x B` canonical dots (`A * B` is 16, or 1 x 1), results row-major by x (`r[a * B + b]`). Pair `p = a * B +
/// b` accumulates in register `acc[p]` exactly as the single dot does, zero-padded tail chunk included.
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn block<const A: usize, const B: usize, T: Src>(xs: &[&[f32]; A], ws: &[T; B]) -> [f32; 16] {
    if T::SPLIT && A == 1 && B == 16 && ws[0].len().is_multiple_of(LANES) {
        // SAFETY: forwarded.
        return unsafe { row_by_fours(xs[0], ws) };
    }
    let n = ws[0].len();
    let full = n / LANES;
    let mut acc = [_mm512_setzero_ps(); 16];
    for c in 0..full {
        let o = c * LANES;
        // SAFETY: o + 16 <= n for every row.
        unsafe {
            let mut w = [_mm512_setzero_ps(); B];
            for b in 0..B {
                w[b] = ws[b].load(o);
            }
            for a in 0..A {
                let x = _mm512_loadu_ps(xs[a].as_ptr().add(o));
                for b in 0..B {
                    acc[a * B + b] = _mm512_fmadd_ps(x, w[b], acc[a * B + b]);
                }
            }
        }
    }
    if n > full * LANES {
        let o = full * LANES;
        // SAFETY: tails are padded copies; avx512f and avx512vl present.
        unsafe {
            let mut w = [_mm512_setzero_ps(); B];
            for b in 0..B {
                w[b] = ws[b].tail(o);
            }
            for a in 0..A {
                let x = _mm512_loadu_ps(pad(&xs[a][o..]).as_ptr());
                for b in 0..B {
                    acc[a * B + b] = _mm512_fmadd_ps(x, w[b], acc[a * B + b]);
                }
            }
        }
    }
    let mut r = [0f32; 16];
    if A * B == 1 {
        let mut l = [0f32; LANES];
        // SAFETY: l holds 16 f32.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), acc[0]) };
        r[0] = crate::simd::fold(&l);
    } else {
        // SAFETY: avx512f and avx512vl present; r holds 16 f32.
        unsafe { _mm512_storeu_ps(r.as_mut_ptr(), fold16(&acc)) };
    }
    r
}

/// One x row by 16 weight rows, 4 weight rows at a time over the whole row (the x row is re-read from cache,
/// the widened weights never leave registers), then one [`fold16`]: each pair's accumulator takes the same
/// chunks in the same order as in [`block`].
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn row_by_fours<T: Src, const B: usize>(x: &[f32], ws: &[T; B]) -> [f32; 16] {
    let n = ws[0].len();
    debug_assert!(n.is_multiple_of(LANES) && B == 16);
    let mut acc = [_mm512_setzero_ps(); 16];
    for q in 0..B / 4 {
        let w4: &[T; 4] = ws[q * 4..q * 4 + 4].try_into().expect("4 rows");
        // SAFETY: every row holds n elements in whole chunks (`SPLIT` rows), as x.
        let a = unsafe { T::fours(x, w4) };
        acc[q * 4..q * 4 + 4].copy_from_slice(&a);
    }
    let mut r = [0f32; 16];
    // SAFETY: avx512f and avx512vl present; r holds 16 f32.
    unsafe { _mm512_storeu_ps(r.as_mut_ptr(), fold16(&acc)) };
    r
}

/// The canonical fold of 16 accumulators at once: lane `p` of the result is `fold(acc[p])`. Each level is
/// the scalar tree's level for all 16 (`l[i] + l[i+8]`, then `+4`, `+2`, `+1`), its operands gathered by
/// shuffles, so every sum is the same IEEE addition as in [`crate::simd::fold`].
#[target_feature(enable = "avx512f,avx512vl")]
fn fold16(acc: &[__m512; 16]) -> __m512 {
    // Level 1 (+8): pair (2i, 2i+1) into one register, lanes 0..8 the first's s8, 8..16 the second's.
    let mut l1 = [_mm512_setzero_ps(); 8];
    for (i, r) in l1.iter_mut().enumerate() {
        let (u, v) = (acc[2 * i], acc[2 * i + 1]);
        *r = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(u, v), _mm512_shuffle_f32x4::<0xEE>(u, v));
    }
    // Level 2 (+4): 128-bit chunk c of register m holds accumulator 4m + c's s4.
    let mut l2 = [_mm512_setzero_ps(); 4];
    for (m, r) in l2.iter_mut().enumerate() {
        let (u, v) = (l1[2 * m], l1[2 * m + 1]);
        *r = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(u, v), _mm512_shuffle_f32x4::<0xDD>(u, v));
    }
    // Level 3 (+2): chunk c of register n holds the s2 of accumulators 8n + c (lanes 0, 1) and 8n + 4 + c.
    let mut l3 = [_mm512_setzero_ps(); 2];
    for (n, r) in l3.iter_mut().enumerate() {
        let (u, v) = (l2[2 * n], l2[2 * n + 1]);
        *r = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(u, v), _mm512_shuffle_ps::<0xEE>(u, v));
    }
    // Level 4 (+1): lane 4c + t holds accumulator c + 4t; the permute puts accumulator p in lane p.
    let (u, v) = (l3[0], l3[1]);
    let sum = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(u, v), _mm512_shuffle_ps::<0xDD>(u, v));
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(idx, sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::{Dtype, MatView};
    use crate::cpu::ops::wrow;

    /// The VBMI walk of 4-bit rows and the plain one give every accumulator the same bits (the grid tests reach only
    /// the one this CPU picks), at each group size.
    #[test]
    fn vbmi_and_plain_q4_walks_agree() {
        let have =
            |f| std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512vl") && f;
        if !have(std::arch::is_x86_feature_detected!("avx512vbmi")) {
            return;
        }
        let n = 512;
        let v = |i: usize, s: u32| ((i as u32).wrapping_mul(2654435761).wrapping_add(s) % 2001) as f32 / 1000.0 - 1.0;
        let x: Vec<f32> = (0..n).map(|i| v(i, 5)).collect();
        let w: Vec<f32> = (0..4 * n).map(|i| v(i, 11)).collect();
        for g in [16, 32, 64, 128] {
            let m = MatView::from_f32(4, n, &w).quantize_affine(Dtype::Q4, g).expect("4-bit rows");
            let rows: Vec<Codes<true>> = (0..4).map(|j| Codes(Chunked::of(wrow(&m, j)).expect("chunked"))).collect();
            let w4: &[Codes<true>; 4] = rows.as_slice().try_into().expect("4 rows");
            let bits = |a: [__m512; 4]| {
                a.map(|r| {
                    let mut l = [0f32; 16];
                    // SAFETY: avx512f present (checked); l holds 16 f32.
                    unsafe { _mm512_storeu_ps(l.as_mut_ptr(), r) };
                    l.map(f32::to_bits)
                })
            };
            // SAFETY: avx512f, avx512vl and avx512vbmi checked; x and the rows hold n elements in whole groups.
            let (plain, vbmi) = unsafe { (fours_q4::<false>(&x, w4), fours_q4_vbmi(&x, w4)) };
            assert_eq!(bits(plain), bits(vbmi), "group {g}");
        }
    }
}
