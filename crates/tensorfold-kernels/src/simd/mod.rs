//! The canonical f32 dot product every CPU kernel reduces with, on AVX-512, AVX2+FMA and portable paths.
//!
//! One order for all paths and all batch widths: 16 lanes, lane `l` accumulates elements `l, l+16, ...`
//! with fused multiply-add (a zero-padded tail chunk), then the lanes fold as a fixed tree
//! (`l[i] + l[i+8]`, then `+4`, `+2`, `+1`). So a row's result depends only on its own inputs and length:
//! the same bits on every path (checked by the contract) and at every tile width (a tile shares the weight
//! load, never the accumulators).

use std::sync::OnceLock;

pub mod affine;
pub mod exp;
mod grid;
pub use grid::{Rows, dot_grid, dot_grid_chunked, dot_rows};

/// Accumulator lanes of the canonical dot.
pub const LANES: usize = 16;

/// Which instruction set a kernel runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// AVX-512F with AVX-512VL (16 f32 lanes in one register). The kernels are compiled with both: without VL,
    /// LLVM keeps 256-bit values (the bf16 loads) out of registers 16 to 31 and spills the grid's accumulators
    /// (1.5x slower, same bits). Every AVX-512 CPU since Skylake-SP has VL; Xeon Phi runs the AVX2 level.
    Avx512,
    /// AVX2 with FMA (two 8-lane registers).
    Avx2,
    /// Plain Rust with `f32::mul_add`.
    Portable,
}

/// The best level this CPU supports, detected once at run time. `TENSORFOLD_SIMD=portable|avx2`
/// forces a lower one (to compare paths).
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let forced = std::env::var("TENSORFOLD_SIMD").ok();
        let detected = detect();
        match forced.as_deref() {
            Some("portable") => Level::Portable,
            Some("avx2") if detected != Level::Portable => Level::Avx2,
            _ => detected,
        }
    })
}

/// The levels this CPU can run, best first.
pub fn available_levels() -> Vec<Level> {
    match detect() {
        Level::Avx512 => vec![Level::Avx512, Level::Avx2, Level::Portable],
        Level::Avx2 => vec![Level::Avx2, Level::Portable],
        Level::Portable => vec![Level::Portable],
    }
}

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512vl") {
            return Level::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return Level::Avx2;
        }
    }
    Level::Portable
}

/// One weight row: f32 values or bf16 bit patterns.
#[derive(Clone, Copy)]
pub enum WRow<'a> {
    /// f32 weights.
    F32(&'a [f32]),
    /// bf16 weights as raw bits (widened by `bits << 16`).
    Bf16(&'a [u16]),
    /// 8-bit affine codes: element `i` is `fma(code[i], scales[i / group], biases[i / group])`.
    Q8 {
        /// Codes.
        codes: &'a [u8],
        /// One scale a group.
        scales: &'a [f32],
        /// One bias a group.
        biases: &'a [f32],
        /// Elements a group.
        group: usize,
    },
    /// 4-bit affine codes, two a byte (element `2i` in the low nibble of byte `i`): element `i` is
    /// `fma(code(i), scales[i / group], biases[i / group])`.
    Q4 {
        /// Packed codes (`len / 2` bytes).
        codes: &'a [u8],
        /// One scale a group.
        scales: &'a [f32],
        /// One bias a group.
        biases: &'a [f32],
        /// Elements a group.
        group: usize,
    },
}

impl WRow<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            WRow::F32(w) => w.len(),
            WRow::Bf16(w) => w.len(),
            WRow::Q8 { codes, .. } => codes.len(),
            WRow::Q4 { codes, .. } => 2 * codes.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f32 (the value every SIMD path multiplies by).
    pub fn get(&self, i: usize) -> f32 {
        match self {
            WRow::F32(w) => w[i],
            WRow::Bf16(w) => f32::from_bits((w[i] as u32) << 16),
            WRow::Q8 { codes, scales, biases, group } => {
                (codes[i] as f32).mul_add(scales[i / group], biases[i / group])
            }
            WRow::Q4 { codes, scales, biases, group } => {
                let q = (codes[i / 2] >> (4 * (i % 2))) & 15;
                (q as f32).mul_add(scales[i / group], biases[i / group])
            }
        }
    }

    /// Whether the elements are affine codes (widened by [`WRow::get`] before the canonical dot).
    pub fn is_affine(&self) -> bool {
        matches!(self, WRow::Q8 { .. } | WRow::Q4 { .. })
    }
}

/// Folds the 16 lanes in the canonical tree order.
#[inline(always)]
pub fn fold(l: &[f32; LANES]) -> f32 {
    let mut s8 = [0f32; 8];
    for i in 0..8 {
        s8[i] = l[i] + l[i + 8];
    }
    let s4 = [s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]];
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// `out[r] = dot(xs[r], w)` for every row of the tile, in the canonical order, on `level`.
/// Every `xs[r]` must have `w.len()` elements; `out.len() == xs.len()`.
pub fn dot_tile(level: Level, xs: &[&[f32]], w: WRow, out: &mut [f32]) {
    // The SIMD paths load by `w.len()`: a shorter row would be read past its end.
    assert!(xs.iter().all(|x| x.len() == w.len()) && out.len() == xs.len(), "dot_tile: row lengths differ");
    if let Some(c) = affine::Chunked::of(w) {
        return affine_tile(level, xs, &c, out);
    }
    if w.is_affine() {
        // Other groups widen once a tile, each weight exactly `fma(q, scale, bias)` in f32 (the value the portable path
        // multiplies by), then run the f32 dot: the canonical order, the same bits on every level and width.
        let wide: Vec<f32> = (0..w.len()).map(|i| w.get(i)).collect();
        return dot_tile(level, xs, WRow::F32(&wide), out);
    }
    #[cfg(target_arch = "x86_64")]
    if level != Level::Portable {
        let mut r = 0;
        while r + 4 <= xs.len() {
            let tile = [xs[r], xs[r + 1], xs[r + 2], xs[r + 3]];
            // SAFETY: `level` is only Avx512/Avx2 when detect() found those features on this CPU.
            let o = unsafe { x86::dot::<4>(level, &tile, w) };
            out[r..r + 4].copy_from_slice(&o);
            r += 4;
        }
        while r < xs.len() {
            // SAFETY: as above.
            out[r] = unsafe { x86::dot::<1>(level, &[xs[r]], w) }[0];
            r += 1;
        }
        return;
    }
    for (x, o) in xs.iter().zip(out.iter_mut()) {
        *o = dot_portable(x, w);
    }
}

/// [`dot_tile`] over a chunked affine row: its codes widen 16 at a time in registers (each weight
/// `fma(q, scale, bias)`), shared by 4 x rows a tile; the same bits as the f32 dot over the widened row.
pub(crate) fn affine_tile(level: Level, xs: &[&[f32]], w: &affine::Chunked, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if level != Level::Portable {
        let one = |x: &[&[f32]; 1]| {
            // SAFETY: the features of `level` were detected; every row has `w.len` elements (checked by dot_tile).
            unsafe { if level == Level::Avx512 { affine::x86::dot512(x, w) } else { affine::x86::dot256(x, w) } }
        };
        let mut r = 0;
        while r + 4 <= xs.len() {
            let tile = [xs[r], xs[r + 1], xs[r + 2], xs[r + 3]];
            // SAFETY: as above.
            let o = unsafe {
                if level == Level::Avx512 { affine::x86::dot512(&tile, w) } else { affine::x86::dot256(&tile, w) }
            };
            out[r..r + 4].copy_from_slice(&o);
            r += 4;
        }
        for (x, o) in xs[r..].iter().zip(&mut out[r..]) {
            *o = one(&[*x])[0];
        }
        return;
    }
    for (x, o) in xs.iter().zip(out.iter_mut()) {
        let mut acc = [0f32; LANES];
        for c in (0..w.len).step_by(LANES) {
            let wv = w.widen_portable(c);
            for l in 0..LANES {
                acc[l] = x[c + l].mul_add(wv[l], acc[l]);
            }
        }
        *o = fold(&acc);
    }
}

/// One canonical dot on the best level.
pub fn dot(x: &[f32], w: WRow) -> f32 {
    let mut o = [0f32];
    dot_tile(level(), &[x], w, &mut o);
    o[0]
}

fn dot_portable(x: &[f32], w: WRow) -> f32 {
    let mut acc = [0f32; LANES];
    let n = w.len();
    for c in 0..n.div_ceil(LANES) {
        for (l, a) in acc.iter_mut().enumerate() {
            let i = c * LANES + l;
            let (xv, wv) = if i < n { (x[i], w.get(i)) } else { (0.0, 0.0) };
            *a = xv.mul_add(wv, *a);
        }
    }
    fold(&acc)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{LANES, Level, WRow, fold};
    use std::arch::x86_64::*;

    /// Dispatches to the feature-gated body. Caller guarantees the features of `level` exist.
    pub unsafe fn dot<const R: usize>(level: Level, xs: &[&[f32]; R], w: WRow) -> [f32; R] {
        // SAFETY: forwarded from the caller.
        unsafe {
            match (level, w) {
                (Level::Avx512, WRow::F32(w)) => avx512_f32::<R>(xs, w),
                (Level::Avx512, WRow::Bf16(w)) => avx512_bf16::<R>(xs, w),
                (_, WRow::F32(w)) => avx2_f32::<R>(xs, w),
                (_, WRow::Bf16(w)) => avx2_bf16::<R>(xs, w),
                // 8-bit rows widen each 16-element chunk to f32 with the same FMA as the portable path,
                // then take the f32 path: the same bits on every level.
                (_, q @ (WRow::Q8 { .. } | WRow::Q4 { .. })) => q8::<R>(level, xs, q),
            }
        }
    }

    /// Widens a whole Q8 row into f32 with the portable path's FMA, then runs the f32 body on it: the
    /// summation order is the canonical one.
    unsafe fn q8<const R: usize>(level: Level, xs: &[&[f32]; R], w: WRow) -> [f32; R] {
        let n = w.len();
        let mut wide = vec![0f32; n];
        for (i, o) in wide.iter_mut().enumerate() {
            *o = w.get(i);
        }
        // SAFETY: forwarded from the caller; `wide` has the row's length.
        unsafe {
            match level {
                Level::Avx512 => avx512_f32::<R>(xs, &wide),
                _ => avx2_f32::<R>(xs, &wide),
            }
        }
    }

    pub(super) fn pad<T: Copy + Default>(src: &[T]) -> [T; LANES] {
        let mut b = [T::default(); LANES];
        b[..src.len()].copy_from_slice(src);
        b
    }

    #[inline(always)]
    pub(super) unsafe fn bf16x16(p: *const u16) -> __m512 {
        // SAFETY: caller guarantees 16 readable u16 at p, and avx512f and avx512vl.
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast())))) }
    }

    #[inline(always)]
    unsafe fn bf16x8(p: *const u16) -> __m256 {
        // SAFETY: caller guarantees 8 readable u16 at p and avx2.
        unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())))) }
    }

    macro_rules! avx512_body {
        ($name:ident, $t:ty, $load:expr) => {
            #[target_feature(enable = "avx512f,avx512vl")]
            unsafe fn $name<const R: usize>(xs: &[&[f32]; R], w: &[$t]) -> [f32; R] {
                let n = w.len();
                let full = n / LANES;
                let mut acc = [_mm512_setzero_ps(); R];
                for c in 0..full {
                    // SAFETY: c * LANES + 16 <= n for both w and every x.
                    unsafe {
                        let wv = $load(w.as_ptr().add(c * LANES));
                        for r in 0..R {
                            acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xs[r].as_ptr().add(c * LANES)), wv, acc[r]);
                        }
                    }
                }
                if n > full * LANES {
                    let wt = pad(&w[full * LANES..]);
                    // SAFETY: padded buffers hold 16 elements.
                    unsafe {
                        let wv = $load(wt.as_ptr());
                        for r in 0..R {
                            let xt = pad(&xs[r][full * LANES..]);
                            acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xt.as_ptr()), wv, acc[r]);
                        }
                    }
                }
                let mut out = [0f32; R];
                for r in 0..R {
                    let mut l = [0f32; LANES];
                    // SAFETY: l holds 16 f32.
                    unsafe { _mm512_storeu_ps(l.as_mut_ptr(), acc[r]) };
                    out[r] = fold(&l);
                }
                out
            }
        };
    }

    macro_rules! avx2_body {
        ($name:ident, $t:ty, $load:expr) => {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn $name<const R: usize>(xs: &[&[f32]; R], w: &[$t]) -> [f32; R] {
                let n = w.len();
                let full = n / LANES;
                let mut lo = [_mm256_setzero_ps(); R];
                let mut hi = [_mm256_setzero_ps(); R];
                for c in 0..=full {
                    let tail = c == full;
                    if tail && n == full * LANES {
                        break;
                    }
                    let wt;
                    let wp = if tail {
                        wt = pad(&w[full * LANES..]);
                        wt.as_ptr()
                    } else {
                        // SAFETY: c * LANES < n.
                        unsafe { w.as_ptr().add(c * LANES) }
                    };
                    // SAFETY: wp points at 16 readable elements.
                    let (wl, wh) = unsafe { ($load(wp), $load(wp.add(8))) };
                    for r in 0..R {
                        let xt;
                        let xp = if tail {
                            xt = pad(&xs[r][full * LANES..]);
                            xt.as_ptr()
                        } else {
                            // SAFETY: as for w.
                            unsafe { xs[r].as_ptr().add(c * LANES) }
                        };
                        // SAFETY: xp points at 16 readable f32.
                        unsafe {
                            lo[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp), wl, lo[r]);
                            hi[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(8)), wh, hi[r]);
                        }
                    }
                }
                let mut out = [0f32; R];
                for r in 0..R {
                    let mut l = [0f32; LANES];
                    // SAFETY: l holds 16 f32.
                    unsafe {
                        _mm256_storeu_ps(l.as_mut_ptr(), lo[r]);
                        _mm256_storeu_ps(l.as_mut_ptr().add(8), hi[r]);
                    }
                    out[r] = fold(&l);
                }
                out
            }
        };
    }

    avx512_body!(avx512_f32, f32, |p: *const f32| _mm512_loadu_ps(p));
    avx512_body!(avx512_bf16, u16, |p: *const u16| bf16x16(p));
    avx2_body!(avx2_f32, f32, |p: *const f32| _mm256_loadu_ps(p));
    avx2_body!(avx2_bf16, u16, |p: *const u16| bf16x8(p));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::Dtype;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0).collect()
    }

    #[test]
    fn every_level_and_tile_width_gives_the_same_bits() {
        for n in [1, 15, 16, 17, 100, 2048, 2049] {
            let w = data(n, 7);
            let wb: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let xs: Vec<Vec<f32>> = (0..6).map(|r| data(n, 100 + r)).collect();
            let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
            let q = crate::bytes::MatView::from_f32(1, n, &w).quantize_q8(n.min(64)).filter(|_| n % 64 == 0 || n < 64);
            let q8 = q.as_ref().map(|m| crate::cpu::ops::wrow(m, 0));
            let q4m = (n % 32 == 0).then(|| crate::bytes::MatView::from_f32(1, n, &w).quantize_affine(Dtype::Q4, 32));
            let q4 = q4m.as_ref().and_then(|m| m.as_ref()).map(|m| crate::cpu::ops::wrow(m, 0));
            for row in [Some(WRow::F32(&w)), Some(WRow::Bf16(&wb)), q8, q4].into_iter().flatten() {
                let mut want = vec![0f32; 6];
                dot_tile(Level::Portable, &refs, row, &mut want);
                for (x, v) in refs.iter().zip(&want) {
                    assert_eq!(v.to_bits(), dot_portable(x, row).to_bits(), "n={n}: element-by-element dot");
                }
                for lv in available_levels() {
                    let mut got = vec![0f32; 6];
                    dot_tile(lv, &refs, row, &mut got);
                    assert_eq!(
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "n={n} {lv:?}"
                    );
                    let mut one = [0f32];
                    dot_tile(lv, &refs[5..6], row, &mut one);
                    assert_eq!(one[0].to_bits(), want[5].to_bits());
                }
            }
        }
    }

    #[test]
    fn dot_is_close_to_f64() {
        let x = data(1000, 3);
        let w = data(1000, 9);
        let exact: f64 = x.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum();
        assert!((dot(&x, WRow::F32(&w)) as f64 - exact).abs() < 1e-4);
    }
}
