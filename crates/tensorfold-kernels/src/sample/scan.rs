//! Whole-vocabulary passes of a draw 16 or 8 ids at a time on AVX-512: the greedy pick, and the Gumbel-max scan's skip tests, so the exact scalar test of [`super::draw`] runs only on ids that may win.
//!
//! Both give the scalar code's result bit for bit: the greedy pick compares with the same float `>` and takes the
//! first of equal maxima; the scan computes the same f64 operations as the scalar skip tests, with the best score
//! as of the start of each 8 ids, which can only be lower than the scalar loop's at that id (it never falls), so
//! the scan passes on every id the scalar loop would test (and some it would have skipped: the exact test skips
//! them again). Ids are passed in increasing order.

#[cfg(test)]
use super::uniform_floor;
use super::{GAMMA, GUMBEL_MAX};
use crate::simd::Level;

/// The scan's inputs: the logits (finite, ids fit `u32`), `1 / T`, the position's key and the uniform floors
/// ([`super::uniform_floors`]).
pub(super) struct Scan<'a> {
    pub logits: &'a [f32],
    pub inv_t: f64,
    pub key: u64,
    pub floors: &'a [f64; 41],
}

impl Scan<'_> {
    /// Calls `consider(id)` for every id the scalar skip tests might keep against the best score so far: `id`'s
    /// score `logit * inv_t` plus [`GUMBEL_MAX`] reaches it and its keyed uniform is at least
    /// `uniform_floor` of its shortfall. `consider` runs the exact test and returns the best score after it;
    /// `best` is the score before the first id.
    pub(super) fn each(&self, level: Level, best: f64, consider: impl FnMut(u32) -> f64) {
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx512 {
            // SAFETY: Level::Avx512 means avx512f and avx512vl were detected.
            unsafe { x86::each(self, best, consider) };
            return;
        }
        let _ = (level, best);
        self.each_scalar(0, consider);
    }

    /// The scalar form of [`Scan::each`] from id `from`: every id, the exact test doing the skipping.
    fn each_scalar(&self, from: usize, mut consider: impl FnMut(u32) -> f64) {
        (from..self.logits.len()).for_each(|i| {
            consider(i as u32);
        });
    }
}

/// The greedy pick of finite `logits` (non-empty): the first largest, as [`super::greedy_pick`]'s loop.
pub(super) fn first_max(level: Level, logits: &[f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 {
        // SAFETY: Level::Avx512 means avx512f and avx512vl were detected.
        return unsafe { x86::first_max(logits) };
    }
    let _ = level;
    first_max_scalar(logits, 0, 0)
}

/// The first largest of `logits[from..]` and `logits[best]`, ties to the lower index.
fn first_max_scalar(logits: &[f32], mut best: usize, from: usize) -> usize {
    for (i, &x) in logits.iter().enumerate().skip(from) {
        if x > logits[best] {
            best = i;
        }
    }
    best
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{GAMMA, GUMBEL_MAX, Scan};
    use std::arch::x86_64::*;

    /// splitmix64's finaliser on 8 lanes (as `super::super::mix64`); 64-bit products from 32-bit halves
    /// (avx512f has no 64-bit multiply).
    #[target_feature(enable = "avx512f")]
    fn mix64(z: __m512i) -> __m512i {
        let z = _mm512_xor_si512(z, _mm512_srli_epi64::<30>(z));
        let z = mul64(z, 0xbf58_476d_1ce4_e5b9);
        let z = _mm512_xor_si512(z, _mm512_srli_epi64::<27>(z));
        let z = mul64(z, 0x94d0_49bb_1331_11eb);
        _mm512_xor_si512(z, _mm512_srli_epi64::<31>(z))
    }

    /// `a * c` mod 2^64 on 8 lanes: lo(a) lo(c) + (lo(a) hi(c) + hi(a) lo(c)) << 32.
    #[target_feature(enable = "avx512f")]
    fn mul64(a: __m512i, c: u64) -> __m512i {
        let cv = _mm512_set1_epi64(c as i64);
        let ch = _mm512_set1_epi64((c >> 32) as i64);
        let lo = _mm512_mul_epu32(a, cv);
        let cross = _mm512_add_epi64(_mm512_mul_epu32(a, ch), _mm512_mul_epu32(_mm512_srli_epi64::<32>(a), cv));
        _mm512_add_epi64(lo, _mm512_slli_epi64::<32>(cross))
    }

    /// As [`Scan::each`].
    ///
    /// # Safety
    /// avx512f present.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn each(scan: &Scan, mut best: f64, mut consider: impl FnMut(u32) -> f64) {
        let n = scan.logits.len();
        let whole = n - n % 8;
        let (inv_t, forty) = (_mm512_set1_pd(scan.inv_t), _mm512_set1_pd(GUMBEL_MAX));
        let (two, cap, one) = (_mm512_set1_pd(2.0), _mm512_set1_pd(42.0), _mm256_set1_epi32(1));
        let key = _mm512_set1_epi64(scan.key as i64);
        let g3 = GAMMA.wrapping_mul(3);
        // (c >> 12) + 2^52 as f64 bits, less 2^52: the integer exactly (it is below 2^52), as `as f64` gives it.
        let (magic_bits, magic) = (_mm512_set1_epi64(0x4330_0000_0000_0000), _mm512_set1_pd(4_503_599_627_370_496.0));
        let (half, ulp) = (_mm512_set1_pd(0.5), _mm512_set1_pd(1.0 / 4_503_599_627_370_496.0));
        let lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
        for i in (0..whole).step_by(8) {
            // SAFETY: i + 8 <= n.
            let s = _mm512_mul_pd(_mm512_cvtps_pd(unsafe { _mm256_loadu_ps(scan.logits.as_ptr().add(i)) }), inv_t);
            let bv = _mm512_set1_pd(best);
            let near = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(_mm512_add_pd(s, forty), bv);
            if near == 0 {
                continue;
            }
            // The floor of the shortfall d = best - s: 0 below 2, else floors[min(trunc(d), 41) - 1].
            let d = _mm512_sub_pd(bv, s);
            let far = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(d, two);
            let idx = _mm256_sub_epi32(_mm512_cvttpd_epi32(_mm512_min_pd(d, cap)), one);
            let idx = _mm256_min_epi32(idx, _mm256_set1_epi32(40));
            // SAFETY: the masked lanes' indices are 1 to 40 (d >= 2), inside the 41 floors.
            let floor =
                unsafe { _mm512_mask_i32gather_pd::<8>(_mm512_setzero_pd(), far, idx, scan.floors.as_ptr().cast()) };
            let ids = _mm512_add_epi64(_mm512_set1_epi64(i as i64), lane);
            let c = mix64(_mm512_xor_si512(key, _mm512_add_epi64(ids, _mm512_set1_epi64(g3 as i64))));
            let x = _mm512_sub_pd(_mm512_castsi512_pd(_mm512_or_si512(_mm512_srli_epi64::<12>(c), magic_bits)), magic);
            let u = _mm512_mul_pd(_mm512_add_pd(x, half), ulp);
            let mut keep = near & _mm512_cmp_pd_mask::<_CMP_GE_OQ>(u, floor);
            while keep != 0 {
                best = consider((i + keep.trailing_zeros() as usize) as u32);
                keep &= keep - 1;
            }
        }
        scan.each_scalar(whole, consider);
    }

    /// As [`super::first_max`].
    ///
    /// # Safety
    /// avx512f present.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn first_max(logits: &[f32]) -> usize {
        let whole = logits.len() - logits.len() % 16;
        if whole == 0 {
            return super::first_max_scalar(logits, 0, 0);
        }
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in (0..whole).step_by(16) {
            // SAFETY: i + 16 <= len.
            m = _mm512_max_ps(m, unsafe { _mm512_loadu_ps(logits.as_ptr().add(i)) });
        }
        let top = _mm512_reduce_max_ps(m);
        // The first id equal to the largest of the whole 16s (-0.0 == +0.0, as the scalar `>` sees them).
        let tv = _mm512_set1_ps(top);
        let mut best = 0;
        for i in (0..whole).step_by(16) {
            // SAFETY: as above.
            let eq = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(unsafe { _mm512_loadu_ps(logits.as_ptr().add(i)) }, tv);
            if eq != 0 {
                best = i + eq.trailing_zeros() as usize;
                break;
            }
        }
        super::first_max_scalar(logits, best, whole)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded logits with a model's spread, ties and signed zeros planted.
    fn logits(n: usize, seed: u64) -> Vec<f32> {
        let mut z = seed;
        let mut v: Vec<f32> = (0..n)
            .map(|_| {
                z = z.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                let u = (z >> 40) as f32 / (1u64 << 24) as f32;
                -12.0 + 20.0 * u * u
            })
            .collect();
        if n > 40 {
            v[n / 3] = 9.5;
            v[n / 2] = 9.5;
            v[7] = -0.0;
            v[n - 1] = 0.0;
        }
        v
    }

    /// Both levels give the scalar pick on every length 1 to 70 and at vocabulary sizes, ties and zeros included.
    #[test]
    fn first_max_is_the_scalar_pick() {
        for n in (1..70).chain([65_536, 65_543]) {
            for seed in 0..4 {
                let mut v = logits(n, seed);
                let want = first_max_scalar(&v, 0, 0);
                assert_eq!(first_max(crate::simd::level(), &v), want, "n {n} seed {seed}");
                if n > 20 {
                    v.iter_mut().for_each(|x| *x = if *x > 0.0 { 0.0 } else { -0.0 });
                    assert_eq!(first_max(crate::simd::level(), &v), first_max_scalar(&v, 0, 0), "zeros, n {n}");
                }
            }
        }
    }

    /// The vector scan passes every id the draw's skip tests would keep, against the same evolving best score.
    #[test]
    fn scan_passes_every_id_the_skip_tests_keep() {
        let floors = super::super::uniform_floors();
        for (n, inv_t) in [(65_536, 1.0), (65_541, 1.0 / 0.7), (1_003, 4.0), (13, 1.0)] {
            for seed in 0..3u64 {
                let v = logits(n, seed);
                let scan = Scan { logits: &v, inv_t, key: super::super::position_key(seed, 17), floors };
                let start = f64::from(v[0]) * inv_t;
                // The exact test of draw (skip tests, then the best score grows with each id's Gumbel score);
                // `kept` records the ids past the skip tests.
                let exact = |seen: &mut Vec<u32>, kept: &mut Vec<u32>, best: &mut f64, id: u32| {
                    seen.push(id);
                    let s = f64::from(v[id as usize]) * inv_t;
                    let u = super::super::keyed_uniform(scan.key, id);
                    if s + GUMBEL_MAX >= *best && u >= uniform_floor(floors, *best - s) {
                        kept.push(id);
                        *best = best.max(s + super::super::noise(u));
                    }
                    *best
                };
                let (mut seen, mut kept, mut all, mut want) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                let (mut best_a, mut best_b) = (start, start);
                scan.each(crate::simd::level(), start, |id| exact(&mut seen, &mut kept, &mut best_a, id));
                scan.each_scalar(0, |id| exact(&mut all, &mut want, &mut best_b, id));
                assert_eq!((best_a, &kept), (best_b, &want), "n {n} seed {seed}");
                assert_eq!(all.len(), n);
                if crate::simd::level() == Level::Avx512 {
                    assert!(seen.len() < n / 4 || n < 100, "n {n}: the scan skipped little ({} of {n})", seen.len());
                }
            }
        }
    }
}
