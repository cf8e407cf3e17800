//! Register-blocked canonical dots: every pair of a set of x rows and a set of weight rows, 16 pairs a block.
//!
//! Each pair is still the canonical dot of [`super`] (its own 16 FMA lanes over its own K in chunk order, the
//! same tree fold), so a grid gives the bits of `dot` at every width. What the block shares is the loads: a
//! weight chunk is read once for 4 (or 1) x rows and an x chunk once for 4 weight rows (16 for f32 rows of a
//! one-row block), and the 16 folds run as one transposed tree of shuffles instead of 16 scalar trees.

use super::affine::Chunked;
use super::{Level, WRow, dot_tile};

/// `out[a * stride + b] = dot(xs[a], ws[b])` for every pair, on `level`, in the canonical order. Every row
/// must have the same length; `out` must reach `(xs.len() - 1) * stride + ws.len()`.
pub fn dot_grid(level: Level, xs: &[&[f32]], ws: &[WRow], out: &mut [f32], stride: usize) {
    if xs.is_empty() || ws.is_empty() {
        return;
    }
    let n = ws[0].len();
    assert!(xs.iter().all(|x| x.len() == n) && ws.iter().all(|w| w.len() == n), "dot_grid: lengths differ");
    assert!(out.len() >= (xs.len() - 1) * stride + ws.len() && stride >= ws.len(), "dot_grid: out too short");
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512
        && let Some(ws) = Weights::of(ws)
    {
        // SAFETY: Avx512 is only the level when detect() found avx512f and avx512vl; lengths checked above.
        unsafe { x86::grid(xs, &ws, out, stride) };
        return;
    }
    if let Some(chunked) = ws.iter().map(|w| Chunked::of(*w)).collect::<Option<Vec<_>>>() {
        return dot_grid_chunked(level, xs, &chunked, out, stride);
    }
    by_columns(level, xs, ws, out, stride);
}

/// A matrix's rows stored one after another, `k` elements each: f32 values or bf16 bit patterns.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    /// f32 weights, `[rows, k]` row-major.
    F32(&'a [f32], usize),
    /// bf16 weights as raw bits, `[rows, k]` row-major.
    Bf16(&'a [u16], usize),
}

/// `out[i] = dot(x, w[cols.start + i])` for one x row: [`dot_grid`]'s bits (each output its own canonical dot) with
/// none of its per-block work (building, checking and copying a block's row list and results), which at a decode
/// step's small matrices cost as much as the dots. AVX-512 only; `false` (nothing done) on other levels.
pub fn dot_rows(level: Level, x: &[f32], w: Rows, cols: std::ops::Range<usize>, out: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 {
        let k = match w {
            Rows::F32(_, k) | Rows::Bf16(_, k) => k,
        };
        assert!(x.len() == k && out.len() == cols.len(), "dot_rows: lengths differ");
        // SAFETY: Avx512 is only the level when detect() found avx512f and avx512vl; lengths checked above, rows
        // by slicing.
        unsafe {
            match w {
                Rows::F32(v, _) => x86::rows1(x, &v[cols.start * k..cols.end * k], k, out),
                Rows::Bf16(v, _) => x86::rows1(x, &v[cols.start * k..cols.end * k], k, out),
            }
        }
        return true;
    }
    let _ = (x, w, cols, out);
    false
}

/// [`dot_grid`] over affine rows in chunk form (a linear's column block, read without building [`WRow`]s): the
/// same bits as `dot_grid` over the same rows.
pub fn dot_grid_chunked(level: Level, xs: &[&[f32]], ws: &[Chunked], out: &mut [f32], stride: usize) {
    if xs.is_empty() || ws.is_empty() {
        return;
    }
    let n = ws[0].len;
    assert!(xs.iter().all(|x| x.len() == n) && ws.iter().all(|w| w.len == n), "dot_grid: lengths differ");
    assert!(out.len() >= (xs.len() - 1) * stride + ws.len() && stride >= ws.len(), "dot_grid: out too short");
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 {
        // SAFETY: Avx512 is only the level when detect() found avx512f and avx512vl; lengths checked above.
        unsafe { x86::grid_chunked(xs, ws, out, stride) };
        return;
    }
    let mut col = vec![0f32; xs.len()];
    for (b, w) in ws.iter().enumerate() {
        super::affine_tile(level, xs, w, &mut col);
        for (a, v) in col.iter().enumerate() {
            out[a * stride + b] = *v;
        }
    }
}

/// The fallback: one [`dot_tile`] a weight row (the same bits: each pair is its own canonical dot).
fn by_columns(level: Level, xs: &[&[f32]], ws: &[WRow], out: &mut [f32], stride: usize) {
    let mut col = vec![0f32; xs.len()];
    for (b, w) in ws.iter().enumerate() {
        dot_tile(level, xs, *w, &mut col);
        for (a, v) in col.iter().enumerate() {
            out[a * stride + b] = *v;
        }
    }
}

/// The weight rows of a grid when they share one plain form, f32 or bf16 (affine rows go to
/// [`dot_grid_chunked`] or the fallback).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Weights<'a> {
    F32(Few<&'a [f32]>),
    Bf16(Few<&'a [u16]>),
}

/// Weight rows of one form: on the stack for a linear's column block (at most 16, no allocation a block),
/// else in a vector.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Few<T> {
    Stack([T; 16], usize),
    Heap(Vec<T>),
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl<T: Copy + Default> Few<T> {
    /// Every `f(w)`, or `None` when one is `None`.
    fn collect<'a>(ws: &[WRow<'a>], f: impl Fn(WRow<'a>) -> Option<T>) -> Option<Self> {
        if ws.len() > 16 {
            return ws.iter().map(|w| f(*w)).collect::<Option<_>>().map(Few::Heap);
        }
        let mut a = [T::default(); 16];
        for (o, w) in a.iter_mut().zip(ws) {
            *o = f(*w)?;
        }
        Some(Few::Stack(a, ws.len()))
    }

    fn as_slice(&self) -> &[T] {
        match self {
            Few::Stack(a, n) => &a[..*n],
            Few::Heap(v) => v,
        }
    }
}

impl<'a> Weights<'a> {
    fn of(ws: &[WRow<'a>]) -> Option<Self> {
        match ws[0] {
            WRow::F32(_) => Few::collect(ws, |w| if let WRow::F32(r) = w { Some(r) } else { None }).map(Weights::F32),
            WRow::Bf16(_) => {
                Few::collect(ws, |w| if let WRow::Bf16(r) = w { Some(r) } else { None }).map(Weights::Bf16)
            }
            WRow::Q8 { .. } | WRow::Q4 { .. } => None,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::{Dtype, MatView};
    use crate::cpu::ops::wrow;
    use crate::simd::available_levels;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0).collect()
    }

    #[test]
    fn every_grid_shape_gives_the_single_dots_bits() {
        for n in [1, 15, 16, 17, 32, 48, 100, 256] {
            for (na, nb) in [(1, 1), (1, 16), (1, 19), (3, 5), (4, 4), (5, 9), (8, 16), (9, 33)] {
                let xs: Vec<Vec<f32>> = (0..na).map(|r| data(n, 100 + r as u32)).collect();
                let wf: Vec<Vec<f32>> = (0..nb).map(|r| data(n, 7 + 31 * r as u32)).collect();
                let wb: Vec<Vec<u16>> =
                    wf.iter().map(|w| w.iter().map(|v| (v.to_bits() >> 16) as u16).collect()).collect();
                let xr: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
                let rows_f: Vec<WRow> = wf.iter().map(|w| WRow::F32(w)).collect();
                let rows_b: Vec<WRow> = wb.iter().map(|w| WRow::Bf16(w)).collect();
                let groups = [(Dtype::Q4, 16), (Dtype::Q4, 32), (Dtype::Q4, 64), (Dtype::Q4, 128), (Dtype::Q4, 256)];
                let mats: Vec<MatView> = groups
                    .into_iter()
                    .chain([(Dtype::Q8, 16)])
                    .filter(|(_, g)| n % g == 0)
                    .filter_map(|(d, g)| MatView::from_f32(nb, n, &wf.concat()).quantize_affine(d, g))
                    .collect();
                let mut affine: Vec<Vec<WRow>> = mats.iter().map(|m| (0..nb).map(|j| wrow(m, j)).collect()).collect();
                if mats.len() >= 2 {
                    // 4- and 8-bit rows in one grid (the mixed form), and 4-bit rows of two group sizes.
                    let (first, last) = (&mats[0], &mats[mats.len() - 1]);
                    affine.push((0..nb).map(|j| wrow(if j % 2 == 0 { first } else { last }, j)).collect());
                }
                if mats.len() >= 3 {
                    affine.push((0..nb).map(|j| wrow(&mats[j % 2], j)).collect());
                }
                for ws in [rows_f, rows_b].into_iter().chain(affine) {
                    for lv in available_levels() {
                        let stride = nb + 3;
                        let mut got = vec![f32::NAN; na * stride];
                        dot_grid(lv, &xr, &ws, &mut got, stride);
                        for a in 0..na {
                            for (b, w) in ws.iter().enumerate() {
                                let mut one = [0f32];
                                dot_tile(Level::Portable, &xr[a..a + 1], *w, &mut one);
                                assert_eq!(got[a * stride + b].to_bits(), one[0].to_bits(), "n={n} {na}x{nb} {lv:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// The one-row path gives each output the portable single dot's bits, at row lengths with and without a tail
    /// chunk, row counts with and without a partial block of 16, and column ranges that start inside a block.
    #[test]
    fn dot_rows_gives_the_single_dots_bits() {
        for k in [16, 40, 48, 256] {
            for (n, cols) in [(16, 0..16), (19, 0..19), (40, 3..37), (64, 16..64), (5, 0..5)] {
                let x = data(k, 11);
                let wf = data(n * k, 5);
                let wb: Vec<u16> = wf.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
                for rows in [Rows::F32(&wf, k), Rows::Bf16(&wb, k)] {
                    let mut got = vec![f32::NAN; cols.len()];
                    if !available_levels().contains(&Level::Avx512) {
                        continue; // the AVX-512 path may not run here; its decline is checked below
                    }
                    assert!(dot_rows(Level::Avx512, &x, rows, cols.clone(), &mut got), "AVX-512 present but not taken");
                    for (i, j) in cols.clone().enumerate() {
                        let w = match rows {
                            Rows::F32(v, _) => WRow::F32(&v[j * k..(j + 1) * k]),
                            Rows::Bf16(v, _) => WRow::Bf16(&v[j * k..(j + 1) * k]),
                        };
                        let mut one = [0f32];
                        dot_tile(Level::Portable, &[&x], w, &mut one);
                        assert_eq!(got[i].to_bits(), one[0].to_bits(), "k={k} n={n} column {j}");
                    }
                }
            }
        }
        // Other levels decline (the caller then takes the column blocks).
        let mut out = [0f32; 1];
        assert!(!dot_rows(Level::Portable, &[1.0; 16], Rows::F32(&[1.0; 16], 16), 0..1, &mut out));
    }
}
