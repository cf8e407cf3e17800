//! The CPU kernels' one `exp` for f32 (softmax numerators, SiLU, sigmoid routing), scalar and 8 or 4 at a time.
//!
//! The algorithm is glibc's `expf` (2.27 and later, from Arm's optimized-routines), as its FMA build computes it:
//! `x * 32 / ln 2 = k + r` in f64 (the multiply fused into both the rounding shift and the remainder), `2^(k/32)`
//! from a 32-entry table with `k / 32` added to the exponent, a cubic in `r`, one rounding to f32. Every step is one
//! IEEE f64 operation, so the scalar form (`f64::mul_add`) and the AVX-512 and AVX2 forms give the same bits on every
//! CPU, whatever libm the host has. On glibc 2.36 with FMA (this project's machines) it equals `f32::exp` on all 2^32
//! inputs (`examples/exp_check.rs`), so the CPU's outputs kept their bits when the kernels moved off libm's `expf`.
//! Which products are fused matters: rounding `x * 32 / ln 2` once, then shifting and subtracting, differs from
//! glibc on 2 inputs (32.564632 and -63.09946, kept in the tests). Error: glibc states 0.502 ULP at most.

use super::Level;

/// `2^(i/32)` as f64 bits, less `i << 47` (so adding `k << 47` for `k = 32 q + i` gives `2^(k/32)`).
const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// `32 / ln 2` (0x1.71547652b82fep+5).
const INV_LN2_32: u64 = 0x40471547652b82fe;
/// `1.5 * 2^52`: adding it rounds an f64 below 2^51 to an integer in the low mantissa bits.
const SHIFT: u64 = 0x4338000000000000;
/// The cubic's coefficients for `r` in units of `ln 2 / 32`: `C0 r^3 + C1 r^2 + C2 r + 1`.
const C: [u64; 3] = [0x3ebc6af84b912394, 0x3f2ebfce50fac4f3, 0x3f962e42ff0c52d6];
/// Above this (0x1.62e42ep6, ~88.72) the result overflows to +inf.
const OVER: u32 = 0x42b17217;
/// Below minus this (0x1.9fe368p6, ~103.97) the result underflows to +0.
const UNDER: u32 = 0x42cff1b4;

/// `e^x` rounded to f32, bit-equal to glibc's FMA `expf`: NaN gives a quiet NaN (`x + x`), -inf and anything below
/// -103.97 give +0, anything above 88.72 gives +inf.
#[inline]
pub fn expf(x: f32) -> f32 {
    if x.is_nan() {
        return x + x;
    }
    if x > f32::from_bits(OVER) {
        return f32::INFINITY;
    }
    if x < -f32::from_bits(UNDER) {
        return 0.0;
    }
    let (m, shift) = (f64::from_bits(INV_LN2_32), f64::from_bits(SHIFT));
    let xd = f64::from(x);
    let k = m.mul_add(xd, shift);
    let ki = k.to_bits();
    let r = m.mul_add(xd, -(k - shift));
    let s = f64::from_bits(TABLE[(ki % 32) as usize].wrapping_add(ki << 47));
    let [c0, c1, c2] = C.map(f64::from_bits);
    let y = c0.mul_add(r, c1).mul_add(r * r, c2.mul_add(r, 1.0));
    (y * s) as f32
}

/// `xs[i] = expf(xs[i])` for every element, on `level` (the same bits on every level). `level` must be one this CPU
/// runs ([`super::level`], [`super::available_levels`]), as for every SIMD entry of this module.
pub fn exp_in_place(level: Level, xs: &mut [f32]) {
    let done = vector_part(level, xs);
    let tail = &mut xs[done..];
    if tail.is_empty() {
        return;
    }
    if level == Level::Portable {
        tail.iter_mut().for_each(|v| *v = expf(*v));
        return;
    }
    // The last few through the vector form too: the scalar form's `mul_add` is a libm call on a build without FMA.
    let mut pad = [0f32; 8];
    pad[..tail.len()].copy_from_slice(tail);
    vector_part(level, &mut pad);
    tail.copy_from_slice(&pad[..tail.len()]);
}

/// The leading multiple of 8 on the level's registers; returns how many elements it did.
#[cfg(target_arch = "x86_64")]
fn vector_part(level: Level, xs: &mut [f32]) -> usize {
    // SAFETY: `level` is Avx512 / Avx2 only when detect() found avx512f + avx512vl / avx2 + fma.
    unsafe {
        match level {
            Level::Avx512 => x86::exp512(xs),
            Level::Avx2 => x86::exp256(xs),
            Level::Portable => 0,
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn vector_part(_: Level, _: &mut [f32]) -> usize {
    0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{C, INV_LN2_32, OVER, SHIFT, TABLE, UNDER};
    use std::arch::x86_64::*;

    /// The f64 core on 8 lanes: `y * s` before the rounding to f32 (no special cases).
    #[target_feature(enable = "avx512f,avx512vl")]
    fn core8(xd: __m512d) -> __m512d {
        let m = _mm512_set1_pd(f64::from_bits(INV_LN2_32));
        let shift = _mm512_set1_pd(f64::from_bits(SHIFT));
        let k = _mm512_fmadd_pd(m, xd, shift);
        let ki = _mm512_castpd_si512(k);
        let r = _mm512_fmsub_pd(m, xd, _mm512_sub_pd(k, shift));
        let t = |i: usize| {
            _mm512_set_epi64(
                TABLE[i + 7] as i64,
                TABLE[i + 6] as i64,
                TABLE[i + 5] as i64,
                TABLE[i + 4] as i64,
                TABLE[i + 3] as i64,
                TABLE[i + 2] as i64,
                TABLE[i + 1] as i64,
                TABLE[i] as i64,
            )
        };
        // Entries 0..16 and 16..32 each from a two-register permute, picked by the index's bit 4.
        let lo = _mm512_permutex2var_epi64(t(0), ki, t(8));
        let hi = _mm512_permutex2var_epi64(t(16), ki, t(24));
        let high_half = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
        let entry = _mm512_mask_blend_epi64(high_half, lo, hi);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(entry, _mm512_slli_epi64::<47>(ki)));
        let [c0, c1, c2] = C.map(|c| _mm512_set1_pd(f64::from_bits(c)));
        let y = _mm512_fmadd_pd(
            _mm512_fmadd_pd(c0, r, c1),
            _mm512_mul_pd(r, r),
            _mm512_fmadd_pd(c2, r, _mm512_set1_pd(1.0)),
        );
        _mm512_mul_pd(y, s)
    }

    /// The special cases on 8 f32 lanes: NaN -> `x + x`, past [`OVER`] -> +inf, below -[`UNDER`] -> +0.
    #[target_feature(enable = "avx2,fma")]
    fn special8(x: __m256, y: __m256) -> __m256 {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        let over = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(f32::from_bits(OVER)));
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-f32::from_bits(UNDER)));
        let y = _mm256_andnot_ps(under, y);
        let y = _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), over);
        _mm256_blendv_ps(y, _mm256_add_ps(x, x), nan)
    }

    /// `expf` over the first `xs.len() / 8 * 8` elements; returns how many it did.
    ///
    /// # Safety
    /// The CPU must have avx512f and avx512vl.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub unsafe fn exp512(xs: &mut [f32]) -> usize {
        let n = xs.len() / 8 * 8;
        for c in xs[..n].chunks_exact_mut(8) {
            // SAFETY: the chunk holds 8 f32.
            let x = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            let y = _mm512_cvtpd_ps(core8(_mm512_cvtps_pd(x)));
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), special8(x, y)) };
        }
        n
    }

    /// The f64 core on 4 lanes (AVX2): [`core8`]'s operations in the same order.
    #[target_feature(enable = "avx2,fma")]
    fn core4(xd: __m256d) -> __m256d {
        let m = _mm256_set1_pd(f64::from_bits(INV_LN2_32));
        let shift = _mm256_set1_pd(f64::from_bits(SHIFT));
        let k = _mm256_fmadd_pd(m, xd, shift);
        let ki = _mm256_castpd_si256(k);
        let r = _mm256_fmsub_pd(m, xd, _mm256_sub_pd(k, shift));
        let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
        // SAFETY: every index is below 32, the table's length.
        let entry = unsafe { _mm256_i64gather_epi64::<8>(TABLE.as_ptr().cast(), idx) };
        let s = _mm256_castsi256_pd(_mm256_add_epi64(entry, _mm256_slli_epi64::<47>(ki)));
        let [c0, c1, c2] = C.map(|c| _mm256_set1_pd(f64::from_bits(c)));
        let y = _mm256_fmadd_pd(
            _mm256_fmadd_pd(c0, r, c1),
            _mm256_mul_pd(r, r),
            _mm256_fmadd_pd(c2, r, _mm256_set1_pd(1.0)),
        );
        _mm256_mul_pd(y, s)
    }

    /// [`exp512`] on AVX2 + FMA, two 4-lane halves a chunk of 8.
    ///
    /// # Safety
    /// The CPU must have avx2 and fma.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp256(xs: &mut [f32]) -> usize {
        let n = xs.len() / 8 * 8;
        for c in xs[..n].chunks_exact_mut(8) {
            // SAFETY: the chunk holds 8 f32.
            let x = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            let lo = _mm256_cvtpd_ps(core4(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
            let hi = _mm256_cvtpd_ps(core4(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x))));
            let y = _mm256_set_m128(hi, lo);
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), special8(x, y)) };
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs: every special case and boundary, then a sweep of bit patterns across the whole f32 range.
    fn inputs() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            88.0,
            -88.0,
            103.0,
            -103.0,
            -103.28,
            -104.0,
            // Where rounding `x * 32 / ln 2` before the shift and the remainder (not fusing it) differs from glibc.
            f32::from_bits(0x4202_422f),
            f32::from_bits(0xc27c_65d9),
        ];
        for b in [OVER, UNDER | 0x8000_0000] {
            v.extend((b - 3..=b + 3).map(f32::from_bits));
        }
        v.push(f32::from_bits(0x7fa0_0001)); // a signalling NaN
        v.extend((0..200_003u32).map(|i| f32::from_bits(i.wrapping_mul(21_473))));
        v
    }

    /// Every 61st bit pattern of the inputs whose result is neither 0, 1 nor inf (|x| from 2^-25 to 104), both
    /// signs: about 8.7 million values.
    fn in_range() -> impl Iterator<Item = f32> {
        let (lo, hi) = (0x3300_0000u32, 0x42d0_0000u32);
        (lo..hi).step_by(61).flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)])
    }

    #[test]
    fn every_level_gives_the_scalar_bits() {
        let xs = inputs();
        let want: Vec<u32> = xs.iter().map(|&x| expf(x).to_bits()).collect();
        let dense: Vec<f32> = in_range().collect();
        let dense_want: Vec<u32> = dense.iter().map(|&x| expf(x).to_bits()).collect();
        for lv in crate::simd::available_levels() {
            let mut got = dense.clone();
            exp_in_place(lv, &mut got);
            assert!(got.iter().zip(&dense_want).all(|(g, w)| g.to_bits() == *w), "{lv:?}, the dense sweep");
            for skip in [0, 3] {
                let mut got = xs[skip..].to_vec();
                exp_in_place(lv, &mut got);
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want[skip..], "{lv:?}, from {skip}");
            }
        }
    }

    #[test]
    fn within_one_ulp_of_f64() {
        for x in inputs() {
            let (got, want) = (expf(x), f64::from(x).exp());
            if x.is_nan() {
                assert!(got.is_nan());
                continue;
            }
            let ulp = |v: f32| (f32::from_bits(v.to_bits() + 1) - v).max(f32::from_bits(1));
            let err = (f64::from(got) - want).abs();
            let near = want as f32;
            assert!(
                err <= f64::from(ulp(near)) || (near.is_infinite() && got.is_infinite()),
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(1.0), std::f32::consts::E);
        assert_eq!(expf(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(expf(f32::INFINITY), f32::INFINITY);
        assert_eq!(expf(-104.0).to_bits(), 0);
        assert_eq!(expf(-103.0).to_bits(), 1, "a subnormal result");
    }

    /// Where glibc runs its FMA `expf` (x86-64 with FMA and AVX2: glibc's ifunc choice; this project's machines) the
    /// boundaries and a dense sweep of the finite range equal libm's, so a wrong coefficient or table entry shows;
    /// elsewhere libm's own build decides, so nothing is asserted.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    fn equals_glibc_fma_expf() {
        if !(std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2")) {
            return;
        }
        for x in inputs() {
            assert_eq!(expf(x).to_bits(), x.exp().to_bits(), "exp({x})");
        }
        let xs: Vec<f32> = in_range().collect();
        let mut got = xs.clone();
        exp_in_place(crate::simd::level(), &mut got);
        let off = xs.iter().zip(&got).filter(|(x, g)| x.exp().to_bits() != g.to_bits()).count();
        assert_eq!(off, 0, "{off} of {} in-range inputs differ from libm", xs.len());
    }
}
