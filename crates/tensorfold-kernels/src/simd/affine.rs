//! MLX affine weight rows (4- and 8-bit codes) widened 16 codes at a time in registers: each weight exactly
//! `fma(q, scale, bias)` in f32, the value [`WRow::get`] gives, so the dots over them keep the canonical bits.
//!
//! A row takes these forms when its groups hold whole 16-element chunks (a power-of-two group of at least 16
//! that divides the row): then chunk `c` has the one scale and bias of group `16 c / group`, and the row has no
//! tail chunk. Other rows keep the element-by-element [`WRow::get`] path.

use super::{LANES, WRow};

/// An affine row in chunk form: 16 codes of one group a chunk (the default is the empty row).
#[derive(Clone, Copy, Default)]
pub struct Chunked<'a> {
    /// Codes: one a byte (8-bit) or two a byte, element `2i` in the low nibble of byte `i` (4-bit).
    pub codes: &'a [u8],
    /// One scale a group.
    pub scales: &'a [f32],
    /// One bias a group.
    pub biases: &'a [f32],
    /// `log2(group)`.
    pub shift: u32,
    /// 4-bit codes (else 8-bit).
    pub nibbles: bool,
    /// Elements (a multiple of the group, so of 16).
    pub len: usize,
}

impl<'a> Chunked<'a> {
    /// The chunk form of `w`, when it is affine with a power-of-two group of at least 16 dividing its length and
    /// a scale and bias for every group; `None` otherwise.
    pub fn of(w: WRow<'a>) -> Option<Self> {
        let (codes, scales, biases, group, nibbles) = match w {
            WRow::Q8 { codes, scales, biases, group } => (codes, scales, biases, group, false),
            WRow::Q4 { codes, scales, biases, group } => (codes, scales, biases, group, true),
            _ => return None,
        };
        let len = w.len();
        let groups = len.checked_div(group)?;
        let ok = group >= LANES
            && group.is_power_of_two()
            && len.is_multiple_of(group)
            && scales.len() >= groups
            && biases.len() >= groups;
        ok.then_some(Self { codes, scales, biases, shift: group.trailing_zeros(), nibbles, len })
    }

    /// Scale and bias of the chunk starting at element `o`.
    #[inline(always)]
    pub fn scale_bias(&self, o: usize) -> (f32, f32) {
        (self.scales[o >> self.shift], self.biases[o >> self.shift])
    }

    /// Code `i` (0 to 15 or 0 to 255).
    #[inline(always)]
    fn code(&self, i: usize) -> u8 {
        if self.nibbles { (self.codes[i / 2] >> (4 * (i % 2))) & 15 } else { self.codes[i] }
    }

    /// The 16 weights of the chunk at element `o` (`o % 16 == 0`), portable: `fma(q, scale, bias)` each.
    pub fn widen_portable(&self, o: usize) -> [f32; LANES] {
        let (s, b) = self.scale_bias(o);
        std::array::from_fn(|l| (self.code(o + l) as f32).mul_add(s, b))
    }
}

/// A whole affine matrix whose rows take the chunk form: row `j` is [`ChunkedMat::row`].
#[derive(Clone, Copy)]
pub struct ChunkedMat<'a> {
    codes: &'a [u8],
    scales: &'a [f32],
    biases: &'a [f32],
    cols: usize,
    shift: u32,
    nibbles: bool,
}

impl<'a> ChunkedMat<'a> {
    /// The chunk form of a matrix of `cols` columns (codes, scales and biases row-major, `group` elements a group),
    /// when its group is a power of two of at least 16 dividing `cols`; `None` otherwise.
    pub fn of(
        codes: &'a [u8],
        scales: &'a [f32],
        biases: &'a [f32],
        cols: usize,
        group: usize,
        nibbles: bool,
    ) -> Option<Self> {
        let ok = group >= LANES && group.is_power_of_two() && cols.is_multiple_of(group);
        ok.then_some(Self { codes, scales, biases, cols, shift: group.trailing_zeros(), nibbles })
    }

    /// Row `j` (panics past the last row).
    #[inline(always)]
    pub fn row(&self, j: usize) -> Chunked<'a> {
        let (k, g) = (self.cols, self.cols >> self.shift);
        let codes =
            if self.nibbles { &self.codes[j * k / 2..(j + 1) * k / 2] } else { &self.codes[j * k..(j + 1) * k] };
        Chunked {
            codes,
            scales: &self.scales[j * g..(j + 1) * g],
            biases: &self.biases[j * g..(j + 1) * g],
            shift: self.shift,
            nibbles: self.nibbles,
            len: k,
        }
    }
}

/// Writes every weight of `w` (`out.len() == w.len`) as f32, on the best path `level` allows: the same values
/// as [`WRow::get`].
pub fn widen_into(level: super::Level, w: &Chunked, out: &mut [f32]) {
    assert_eq!(out.len(), w.len, "widen_into: out is not the row's length");
    #[cfg(target_arch = "x86_64")]
    if level != super::Level::Portable {
        // SAFETY: a SIMD level is only chosen where detect() found avx2 and fma (and avx512f, avx512vl for Avx512).
        return unsafe { x86::widen_into(level, w, out) };
    }
    let _ = level;
    for (c, o) in out.chunks_exact_mut(LANES).enumerate() {
        o.copy_from_slice(&w.widen_portable(c * LANES));
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use super::Chunked;
    use crate::simd::{LANES, Level};
    use std::arch::x86_64::*;

    /// Byte `i / 2` of the low 8 in lane `i`: each code byte twice, the low nibble's lane first.
    #[inline(always)]
    unsafe fn twice(p: *const u8) -> __m128i {
        // SAFETY: caller guarantees 8 readable bytes at p and ssse3 (implied by avx2).
        unsafe {
            let b = _mm_loadl_epi64(p.cast());
            _mm_shuffle_epi8(b, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7))
        }
    }

    /// The 16 values a 4-bit code takes, as f32 lanes (exact).
    const CODES16: __m512 = unsafe {
        // SAFETY: 16 f32 are the bits of one __m512.
        std::mem::transmute::<[f32; 16], __m512>([
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        ])
    };

    /// The 16 weights a 4-bit code of the group holding element `o` can stand for: lane `q` is `fma(q, scale,
    /// bias)` in f32, the value [`WRow::get`](crate::simd::WRow::get) gives code `q`, so a permute by the codes
    /// gives each weight with one shuffle instead of a convert and an FMA.
    ///
    /// # Safety
    /// avx512f and avx512vl present; `o < w.len`.
    #[inline(always)]
    pub unsafe fn q4_table(w: &Chunked, o: usize) -> __m512 {
        let g = o >> w.shift;
        // SAFETY: `Chunked::of` checked a scale and bias for every group.
        unsafe {
            let (s, b) = (*w.scales.get_unchecked(g), *w.biases.get_unchecked(g));
            _mm512_fmadd_ps(CODES16, _mm512_set1_ps(s), _mm512_set1_ps(b))
        }
    }

    /// The 16 weights of a 4-bit chunk at element `o` from its group's [`q4_table`].
    ///
    /// # Safety
    /// avx512f and avx512vl present; `o + 16 <= w.len`, `w.nibbles`.
    #[inline(always)]
    pub unsafe fn q4_chunk(w: &Chunked, table: __m512, o: usize) -> __m512 {
        debug_assert!(o + LANES <= w.len && w.nibbles);
        // SAFETY: the chunk's 8 code bytes are inside the row.
        unsafe { _mm512_permutexvar_ps(nibble_lanes(w.codes.as_ptr().add(o / 2)), table) }
    }

    /// [`q4_chunk`] on AVX-512 VBMI: the same lanes from one 8-byte broadcast and one `vpmultishiftqb` (quadword
    /// `q` takes its low dword's byte from bit `8 q`, code `2 q`, its high dword's from bit `8 q + 4`, code `2 q +
    /// 1`), where [`nibble_lanes`] takes two loads, two broadcasts and a shift: the same weights.
    ///
    /// # Safety
    /// avx512f, avx512vl and avx512vbmi present; `o + 16 <= w.len`, `w.nibbles`.
    #[inline(always)]
    pub unsafe fn q4_chunk_vbmi(w: &Chunked, table: __m512, o: usize) -> __m512 {
        debug_assert!(o + LANES <= w.len && w.nibbles);
        const SHIFTS: [i64; 8] = {
            let mut c = [0i64; 8];
            let mut q = 0;
            while q < 8 {
                c[q] = (8 * q as i64) | ((8 * q as i64 + 4) << 32);
                q += 1;
            }
            c
        };
        // SAFETY: the chunk's 8 code bytes are inside the row; features from the caller.
        unsafe {
            let codes = _mm512_set1_epi64(w.codes.as_ptr().add(o / 2).cast::<i64>().read_unaligned());
            let ctl = _mm512_loadu_si512(SHIFTS.as_ptr().cast());
            _mm512_permutexvar_ps(_mm512_multishift_epi64_epi8(ctl, codes), table)
        }
    }

    /// Code `l` of the 16 at `p` (8 bytes, element `2i` in the low nibble of byte `i`) in the low 4 bits of lane
    /// `l`; the bits above are other codes, which `vpermps` ignores. Two 4-byte broadcasts and one shift, no
    /// byte shuffle: lanes 0 to 7 shift bytes 0 to 3 by `4 l`, lanes 8 to 15 bytes 4 to 7 by `4 (l - 8)`.
    ///
    /// # Safety
    /// avx512f and avx512vl present; 8 readable bytes at `p`.
    #[inline(always)]
    unsafe fn nibble_lanes(p: *const u8) -> __m512i {
        // SAFETY: forwarded.
        unsafe {
            let lo = p.cast::<i32>().read_unaligned();
            let hi = p.add(4).cast::<i32>().read_unaligned();
            let v = _mm512_mask_set1_epi32(_mm512_set1_epi32(lo), 0xFF00, hi);
            _mm512_srlv_epi32(v, _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28))
        }
    }

    /// The 16 weights of the chunk at element `o` as one AVX-512 register.
    ///
    /// # Safety
    /// avx512f and avx512vl present; `o + 16 <= w.len`.
    #[inline(always)]
    pub unsafe fn chunk512(w: &Chunked, o: usize) -> __m512 {
        // SAFETY: forwarded.
        unsafe { if w.nibbles { chunk512_as::<true>(w, o) } else { chunk512_as::<false>(w, o) } }
    }

    /// [`chunk512`] for a row known to hold 4-bit (`Q4`) or 8-bit codes (`w.nibbles == Q4`).
    ///
    /// # Safety
    /// As [`chunk512`], and `w.nibbles == Q4`.
    #[inline(always)]
    pub unsafe fn chunk512_as<const Q4: bool>(w: &Chunked, o: usize) -> __m512 {
        debug_assert!(o + LANES <= w.len && w.nibbles == Q4);
        // SAFETY: the chunk's codes, scale and bias are inside the row (o + 16 <= len, and `Chunked::of` checked a
        // scale and bias for every group); features from the caller.
        unsafe {
            if Q4 {
                return q4_chunk(w, q4_table(w, o), o);
            }
            let g = o >> w.shift;
            let (s, b) = (*w.scales.get_unchecked(g), *w.biases.get_unchecked(g));
            let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(w.codes.as_ptr().add(o).cast()));
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(s), _mm512_set1_ps(b))
        }
    }

    /// The 16 weights of the chunk at element `o` as two AVX2 registers (elements 0 to 7, 8 to 15).
    ///
    /// # Safety
    /// avx2 and fma present; `o + 16 <= w.len`.
    #[inline(always)]
    pub unsafe fn chunk256(w: &Chunked, o: usize) -> (__m256, __m256) {
        debug_assert!(o + LANES <= w.len);
        let (s, b) = w.scale_bias(o);
        // SAFETY: as chunk512.
        unsafe {
            let (lo, hi) = if w.nibbles {
                let d = twice(w.codes.as_ptr().add(o / 2));
                let sh = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
                let m = _mm256_set1_epi32(15);
                let f = |v: __m128i| _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(v), sh), m);
                (f(d), f(_mm_srli_si128::<8>(d)))
            } else {
                let p = w.codes.as_ptr().add(o);
                (
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())),
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8).cast())),
                )
            };
            let (vs, vb) = (_mm256_set1_ps(s), _mm256_set1_ps(b));
            (_mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), vs, vb), _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), vs, vb))
        }
    }

    /// [`super::widen_into`] on a SIMD level.
    ///
    /// # Safety
    /// The features of `level` present (never Portable); `out.len() == w.len`.
    pub unsafe fn widen_into(level: Level, w: &Chunked, out: &mut [f32]) {
        // SAFETY: forwarded.
        unsafe {
            match level {
                Level::Avx512 => widen512(w, out),
                _ => widen256(w, out),
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512vl")]
    unsafe fn widen512(w: &Chunked, out: &mut [f32]) {
        for o in (0..w.len).step_by(LANES) {
            // SAFETY: o + 16 <= len == out.len().
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(o), chunk512(w, o)) };
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn widen256(w: &Chunked, out: &mut [f32]) {
        for o in (0..w.len).step_by(LANES) {
            // SAFETY: as widen512.
            unsafe {
                let (lo, hi) = chunk256(w, o);
                _mm256_storeu_ps(out.as_mut_ptr().add(o), lo);
                _mm256_storeu_ps(out.as_mut_ptr().add(o + 8), hi);
            }
        }
    }

    /// `R` canonical dots of x rows against one chunked affine row on AVX-512 (no tail: `len % 16 == 0`).
    ///
    /// # Safety
    /// avx512f and avx512vl present; every `xs[r]` has `w.len` elements.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub unsafe fn dot512<const R: usize>(xs: &[&[f32]; R], w: &Chunked) -> [f32; R] {
        let mut acc = [_mm512_setzero_ps(); R];
        for o in (0..w.len).step_by(LANES) {
            // SAFETY: o + 16 <= len for w and every x.
            unsafe {
                let wv = chunk512(w, o);
                for r in 0..R {
                    acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xs[r].as_ptr().add(o)), wv, acc[r]);
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            let mut l = [0f32; LANES];
            // SAFETY: l holds 16 f32.
            unsafe { _mm512_storeu_ps(l.as_mut_ptr(), acc[r]) };
            out[r] = crate::simd::fold(&l);
        }
        out
    }

    /// [`dot512`] on AVX2 + FMA (lanes 0 to 7 and 8 to 15 in two registers).
    ///
    /// # Safety
    /// avx2 and fma present; every `xs[r]` has `w.len` elements.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot256<const R: usize>(xs: &[&[f32]; R], w: &Chunked) -> [f32; R] {
        let (mut lo, mut hi) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
        for o in (0..w.len).step_by(LANES) {
            // SAFETY: as dot512.
            unsafe {
                let (wl, wh) = chunk256(w, o);
                for r in 0..R {
                    let xp = xs[r].as_ptr().add(o);
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
            out[r] = crate::simd::fold(&l);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::available_levels;

    #[test]
    fn widening_gives_get_on_every_level() {
        let codes: Vec<u8> = (0..256u32).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8).collect();
        let scales: Vec<f32> = (0..16).map(|g| 0.013 * (g as f32 + 1.0) / 7.0).collect();
        let biases: Vec<f32> = (0..16).map(|g| -0.11 + g as f32 / 97.0).collect();
        let q8 = WRow::Q8 { codes: &codes, scales: &scales, biases: &biases, group: 32 };
        let q4 = WRow::Q4 { codes: &codes, scales: &scales, biases: &biases, group: 64 };
        for row in [q8, q4] {
            let c = Chunked::of(row).expect("chunk form");
            let want: Vec<u32> = (0..row.len()).map(|i| row.get(i).to_bits()).collect();
            for lv in available_levels() {
                let mut got = vec![f32::NAN; row.len()];
                widen_into(lv, &c, &mut got);
                assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "{lv:?}");
            }
        }
        let odd = WRow::Q8 { codes: &codes[..48], scales: &scales, biases: &biases, group: 48 };
        assert!(Chunked::of(odd).is_none(), "a group of 48 keeps the element path");
        let narrow = WRow::Q8 { codes: &codes[..64], scales: &scales, biases: &biases, group: 8 };
        assert!(Chunked::of(narrow).is_none(), "a group of 8 keeps the element path");
    }
}
