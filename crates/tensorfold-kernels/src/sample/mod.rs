//! The keyed sampler: every draw is a pure function of (seed, absolute position, logits); the host
//! reference of the device draw (`Backend::draw_rows`).
//!
//! Because no draw reads a stateful RNG, a reply produced by speculative decoding, by a
//! batched (concurrent) lane, or resumed from a cache equals the plain solo reply token for
//! token: the verifier recomputes `draw(params, position, target_logits)` and gets exactly
//! what the solo run would have drawn at that position.

/// Why a sampling request or a draw was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SampleError {
    /// A sampling parameter is out of its allowed range.
    #[error("invalid sampling parameter {name} = {value}: allowed {allowed}")]
    InvalidParam {
        /// The parameter's name as the API spells it (`temperature`, `top_p`, `min_p`).
        name: &'static str,
        /// The refused value.
        value: f64,
        /// The allowed range, in words.
        allowed: &'static str,
    },
    /// A logit is NaN or ±infinity; the forward produced garbage and no token is picked.
    #[error("logit at index {index} is not finite")]
    NonFinite {
        /// The first offending token id.
        index: usize,
    },
    /// The logits slice is empty.
    #[error("empty logits: no token to pick")]
    EmptyLogits,
    /// The device failed while drawing (the backend's own error follows the call).
    #[error("the device failed while drawing: {0}")]
    Device(String),
    /// The stream's constraint (a grammar) refused the row: a dead end, or the grammar's own failure.
    #[error("the stream's constraint failed: {0}")]
    Constraint(String),
    /// More logits than a `u32` token id can name.
    #[error("{len} logits exceed the u32 token id range")]
    TooManyLogits {
        /// The slice length.
        len: usize,
    },
}

/// Sampling parameters of one request, in the OpenAI / Hugging Face meaning.
///
/// Filters apply in the Hugging Face warper order: temperature, top-k, top-p, min-p.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy (argmax). Must be finite and `>= 0`.
    pub temperature: f32,
    /// Keep only the `top_k` largest logits; `0` (or `>=` vocabulary size) turns it off.
    pub top_k: usize,
    /// Nucleus mass in `(0, 1]`; `1` turns it off.
    pub top_p: f32,
    /// Drop tokens with `p < min_p * p_max`; in `[0, 1]`, `0` turns it off.
    pub min_p: f32,
    /// The key of every draw of the reply (see [`resolve_seed`]).
    pub seed: u64,
}

impl Default for SamplingParams {
    /// Same as [`SamplingParams::greedy`].
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    /// Greedy decoding: temperature 0, every filter off, seed 0.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 }
    }

    /// Whether draws are plain argmax (temperature exactly 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks every parameter's range.
    ///
    /// # Errors
    /// [`SampleError::InvalidParam`] naming the first bad parameter: `temperature` negative or
    /// not finite, `top_p` not in `(0, 1]`, `min_p` not in `[0, 1]` (NaN is refused everywhere).
    pub fn validate(&self) -> Result<(), SampleError> {
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return Err(SampleError::InvalidParam {
                name: "temperature",
                value: f64::from(t),
                allowed: "a finite number >= 0 (0 = greedy)",
            });
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(SampleError::InvalidParam {
                name: "top_p",
                value: f64::from(p),
                allowed: "a number in (0, 1] (1 = off)",
            });
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return Err(SampleError::InvalidParam {
                name: "min_p",
                value: f64::from(m),
                allowed: "a number in [0, 1] (0 = off)",
            });
        }
        Ok(())
    }
}

/// One logits row's draw: the request's parameters and the absolute position the drawn token takes
/// (the key of [`draw`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawSpec {
    /// The request's sampling parameters.
    pub params: SamplingParams,
    /// Absolute position of the drawn token in its stream.
    pub position: u64,
}

/// Checks the slice is non-empty, addressable by `u32` ids, and all finite.
fn check_logits(logits: &[f32]) -> Result<(), SampleError> {
    if logits.is_empty() {
        return Err(SampleError::EmptyLogits);
    }
    if u32::try_from(logits.len() - 1).is_err() {
        return Err(SampleError::TooManyLogits { len: logits.len() });
    }
    match logits.iter().position(|x| !x.is_finite()) {
        Some(index) => Err(SampleError::NonFinite { index }),
        None => Ok(()),
    }
}

/// Argmax of the logits: the FIRST largest logit, so ties go to the lower id.
///
/// # Errors
/// [`SampleError::EmptyLogits`] for an empty slice; [`SampleError::NonFinite`] with the first
/// NaN / ±inf index (never a silent pick); [`SampleError::TooManyLogits`] past `u32` ids.
pub fn greedy_pick(logits: &[f32]) -> Result<u32, SampleError> {
    check_logits(logits)?;
    // check_logits proved every index fits in u32.
    Ok(scan::first_max(crate::simd::level(), logits) as u32)
}

/// splitmix64's output mixing function (Steele, Lea & Flood 2014; constants of Vigna's
/// `splitmix64.c`): a bijection on `u64` with full avalanche.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The golden-ratio increment of splitmix64.
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// The per-(seed, position) part of the key: `mix64(mix64(seed + G) ^ (position + 2G))`.
fn position_key(seed: u64, position: u64) -> u64 {
    mix64(mix64(seed.wrapping_add(GAMMA)) ^ position.wrapping_add(GAMMA.wrapping_mul(2)))
}

/// The keyed uniform of one token: `c = mix64(key ^ (token + 3G))`, then
/// `u = ((c >> 12) + 0.5) / 2^52`, exactly representable and inside `[2^-53, 1 - 2^-53]`.
fn keyed_uniform(key: u64, token: u32) -> f64 {
    let c = mix64(key ^ u64::from(token).wrapping_add(GAMMA.wrapping_mul(3)));
    ((c >> 12) as f64 + 0.5) * (1.0 / 4_503_599_627_370_496.0)
}

/// Gumbel noise `-ln(-ln(u))`; with `u` in `[2^-53, 1 - 2^-53]` it lies in about `[-3.59, 36.74]`.
fn gumbel(key: u64, token: u32) -> f64 {
    noise(keyed_uniform(key, token))
}

/// The Gumbel noise of a uniform `u`: `-ln(-ln(u))`.
fn noise(u: f64) -> f64 {
    -(-u.ln()).ln()
}

/// A safe upper bound of [`gumbel`], used to skip tokens that cannot win.
const GUMBEL_MAX: f64 = 40.0;

mod filters;
mod scan;
use crate::simd::Level;
use filters::survivors;

/// The keyed uniform below which a token `need` short of the best score so far cannot reach it: the uniform whose
/// noise is `floor(need) - 1`, a whole unit under `need` (far past the rounding of the logarithms and of the score's
/// sum), 0 for `need < 2`. Noise grows with the uniform, so a token whose uniform is below cannot win or tie, and
/// [`draw`] skips its two logarithms: at temperature 1 most of a vocabulary is within [`GUMBEL_MAX`] of the best
/// but needs noise that one uniform in millions gives, and the logarithms were most of a draw's time.
#[inline(always)]
fn uniform_floor(floors: &[f64; 41], need: f64) -> f64 {
    if need < 2.0 {
        return 0.0;
    }
    // `need >= 2`: the cast is its floor (saturating for huge values), at least 2.
    floors[(need as usize - 1).min(40)]
}

/// `FLOORS[d] = exp(-exp(-d))`, the uniform whose noise is `d` (computed once).
fn uniform_floors() -> &'static [f64; 41] {
    static FLOORS: std::sync::OnceLock<[f64; 41]> = std::sync::OnceLock::new();
    FLOORS.get_or_init(|| std::array::from_fn(|d| (-(-(d as f64)).exp()).exp()))
}

/// Lanes of [`lane_sum`]: one a thread of the device draw's block.
pub const DRAW_LANES: usize = 1024;

/// `sum_{i<n} f(i)` in f64, in a fixed order a block of [`DRAW_LANES`] threads reproduces: lane `t`
/// adds `f(t), f(t + L), f(t + 2L), ...` in turn, then the lanes fold pairwise, `p[t] += p[t + s]` for
/// `s = L/2, L/4, ..., 1`.
pub fn lane_sum(n: usize, f: impl Fn(usize) -> f64) -> f64 {
    let mut p: Vec<f64> = (0..DRAW_LANES).map(|t| (t..n).step_by(DRAW_LANES).map(&f).fold(0.0, |a, w| a + w)).collect();
    let mut s = DRAW_LANES / 2;
    while s > 0 {
        for t in 0..s {
            p[t] += p[t + s];
        }
        s /= 2;
    }
    p[0]
}

/// Sort key: ascending key order = logit descending, then id ascending.
///
/// Scaling by `1/T > 0` is monotonic, so ordering raw logits orders scaled ones; `-0.0` is
/// folded into `+0.0` so the two compare equal as floats do.
fn order_key(id: usize, logit: f32) -> u64 {
    let bits = (logit + 0.0).to_bits();
    let ascending = if bits & 0x8000_0000 != 0 { !bits } else { bits | 0x8000_0000 };
    (u64::from(!ascending) << 32) | id as u64
}

/// Draws the token at absolute `position` of a reply from `logits` (one per vocabulary id).
///
/// Greedy ([`greedy_pick`]) when `temperature == 0`. Otherwise, with `s_i = logit_i / T` in
/// f64 and candidates ordered by logit descending then id ascending:
/// 1. top-k keeps the first `k` candidates of that order (boundary ties go to lower ids);
/// 2. top-p weighs the top-k survivors `w_i = exp(s_i - s_max)` in f64, sums `Z` in the fixed
///    lane order of [`lane_sum`] (so a device block gets the same bits), and keeps the smallest
///    prefix of the order whose running sum `w_0 + w_1 + ...` (added in that order) reaches
///    `top_p * Z` (at least one token);
/// 3. min-p drops candidates with `p_i < min_p * p_max`, evaluated as the equivalent
///    `exp(s_i - s_max) < min_p` (the normaliser cancels);
/// 4. Gumbel-max: the survivor with the largest `s_i + g_i` wins, ties to the lower id,
///    where `g_i = -ln(-ln(u_i))` and `u_i` is the keyed uniform
///    `key = mix64(mix64(seed + G) ^ (position + 2G))`,
///    `c = mix64(key ^ (id + 3G))`, `u_i = ((c >> 12) + 0.5) / 2^52`,
///    with `mix64` the splitmix64 finaliser, `G = 0x9e3779b97f4a7c15`, wrapping `u64`
///    arithmetic. No stateful RNG is involved, so equal inputs give equal tokens; tokens
///    with `s_i + 40 < best` so far are skipped, which cannot change the winner.
///
/// Sharing `g_i` across models (draft and target) at the same position couples their
/// draws, so close distributions agree often. Results are bit-reproducible on a given
/// platform; `ln`/`exp` come from the platform libm.
///
/// # Errors
/// [`SampleError::InvalidParam`] (see [`SamplingParams::validate`]),
/// [`SampleError::EmptyLogits`], [`SampleError::NonFinite`] with the first bad index,
/// [`SampleError::TooManyLogits`].
pub fn draw(params: &SamplingParams, position: u64, logits: &[f32]) -> Result<u32, SampleError> {
    draw_at(crate::simd::level(), params, position, logits)
}

/// [`draw`] with the whole-vocabulary scan at `level` (every level gives the same id).
fn draw_at(level: Level, params: &SamplingParams, position: u64, logits: &[f32]) -> Result<u32, SampleError> {
    params.validate()?;
    if params.is_greedy() {
        return greedy_pick(logits);
    }
    check_logits(logits)?;
    let inv_t = 1.0 / f64::from(params.temperature);
    let scaled = |id: u32| f64::from(logits[id as usize]) * inv_t;
    let n = logits.len();
    let top_k_on = params.top_k > 0 && params.top_k < n;
    let top_p_on = params.top_p < 1.0;

    // Candidates as a prefix of the sorted order, or `None` for "every id".
    let sorted = (top_k_on || top_p_on).then(|| survivors(params, logits, inv_t));

    let top = match &sorted {
        Some(ids) => ids[0],
        None => greedy_pick(logits)?,
    };
    let s_max = scaled(top);
    let min_p = f64::from(params.min_p);
    let key = position_key(params.seed, position);

    let floors = uniform_floors();
    let mut best_id = top;
    let mut best = s_max + gumbel(key, top);
    // The exact test of one id; returns the best score after it.
    let mut consider = |id: u32| {
        let s = scaled(id);
        if id == top || s + GUMBEL_MAX < best {
            return best;
        }
        if min_p > 0.0 && (s - s_max).exp() < min_p {
            return best;
        }
        let u = keyed_uniform(key, id);
        if u < uniform_floor(floors, best - s) {
            return best;
        }
        let score = s + noise(u);
        if score > best || (score == best && id < best_id) {
            best = score;
            best_id = id;
        }
        best
    };
    match &sorted {
        Some(ids) => ids.iter().for_each(|&id| {
            consider(id);
        }),
        // check_logits proved every index fits in u32; the scan passes every id this test might keep.
        None => scan::Scan { logits, inv_t, key, floors }.each(level, s_max + gumbel(key, top), consider),
    }
    Ok(best_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled(seed: u64) -> SamplingParams {
        SamplingParams { temperature: 1.0, seed, ..SamplingParams::greedy() }
    }

    /// Brute-force reference of `draw` for sampled params: no skipping, explicit sets.
    fn reference(p: &SamplingParams, position: u64, logits: &[f32]) -> u32 {
        let t = f64::from(p.temperature);
        let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
        ids.sort_by(|&a, &b| logits[b as usize].partial_cmp(&logits[a as usize]).unwrap().then(a.cmp(&b)));
        if p.top_k > 0 && p.top_k < ids.len() {
            ids.truncate(p.top_k);
        }
        let s = |id: u32| f64::from(logits[id as usize]) / t;
        let s_max = s(ids[0]);
        if p.top_p < 1.0 {
            let kept: std::collections::HashSet<u32> = ids.iter().copied().collect();
            let z =
                lane_sum(logits.len(), |i| if kept.contains(&(i as u32)) { (s(i as u32) - s_max).exp() } else { 0.0 });
            let mut mass = 0.0;
            let mut keep = ids.len();
            for (j, &i) in ids.iter().enumerate() {
                mass += (s(i) - s_max).exp();
                if mass >= f64::from(p.top_p) * z {
                    keep = j + 1;
                    break;
                }
            }
            ids.truncate(keep);
        }
        ids.retain(|&i| (s(i) - s_max).exp() >= f64::from(p.min_p));
        let key = position_key(p.seed, position);
        let mut best = (f64::NEG_INFINITY, u32::MAX);
        for &i in &ids {
            let score = s(i) + gumbel(key, i);
            if score > best.0 || (score == best.0 && i < best.1) {
                best = (score, i);
            }
        }
        best.1
    }

    /// Draws over wide logit spreads (where most tokens are skipped by their uniform) equal the brute-force
    /// reference, and the floor is exact at its ends: a token a unit of noise short still runs its logarithms.
    #[test]
    fn skipping_by_the_uniform_keeps_every_draw() {
        let mut state = 0x1234_5678_u64;
        for spread in [1.0f32, 4.0, 12.0, 30.0, 60.0] {
            let logits: Vec<f32> = (0..2_000)
                .map(|_| {
                    state = mix64(state.wrapping_add(GAMMA));
                    (state >> 40) as f32 / (1u64 << 24) as f32 * spread
                })
                .collect();
            for pos in 0..200 {
                for t in [0.5f32, 1.0, 2.0] {
                    let p = SamplingParams { temperature: t, seed: 9, ..SamplingParams::greedy() };
                    assert_eq!(
                        draw(&p, pos, &logits).unwrap(),
                        reference(&p, pos, &logits),
                        "spread {spread} pos {pos}"
                    );
                }
            }
        }
        assert_eq!(uniform_floor(uniform_floors(), 1.99), 0.0);
        for need in [2.0, 2.5, 7.9, 39.0, 1e30] {
            let floor = uniform_floor(uniform_floors(), need);
            // A floor of 1 skips every uniform: only right where even the largest noise is a unit short.
            let largest = noise(1.0 - 2f64.powi(-53));
            let ok =
                if floor == 1.0 { largest <= need.floor() - 1.0 } else { noise(floor) <= need.floor() - 1.0 + 1e-9 };
            assert!(floor > 0.0 && ok, "need {need}: floor {floor}, its noise {}", noise(floor));
        }
    }

    #[test]
    fn greedy_ties_go_to_lower_id() {
        assert_eq!(greedy_pick(&[1.0, 3.0, 3.0, 2.0]), Ok(1));
        assert_eq!(greedy_pick(&[5.0, 5.0]), Ok(0));
        assert_eq!(greedy_pick(&[-1.0]), Ok(0));
        assert_eq!(draw(&SamplingParams::greedy(), 9, &[0.0, 7.0, 7.0]), Ok(1));
    }

    #[test]
    fn bad_logits_are_named() {
        assert_eq!(greedy_pick(&[0.0, f32::NAN, 1.0]), Err(SampleError::NonFinite { index: 1 }));
        assert_eq!(greedy_pick(&[0.0, 1.0, f32::INFINITY]), Err(SampleError::NonFinite { index: 2 }));
        assert_eq!(draw(&sampled(1), 0, &[f32::NEG_INFINITY, 0.0]), Err(SampleError::NonFinite { index: 0 }));
        assert_eq!(greedy_pick(&[]), Err(SampleError::EmptyLogits));
        assert_eq!(draw(&sampled(1), 0, &[]), Err(SampleError::EmptyLogits));
    }

    #[test]
    fn draws_are_pure_functions_of_seed_position_logits() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        for pos in 0..100 {
            let a = draw(&sampled(42), pos, &logits).unwrap();
            let b = draw(&sampled(42), pos, &logits).unwrap();
            assert_eq!(a, b);
        }
        let run = |seed| -> Vec<u32> { (0..64).map(|pos| draw(&sampled(seed), pos, &logits).unwrap()).collect() };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn positions_spread_uniformly() {
        let logits = [0.0f32; 8];
        let mut counts = [0usize; 8];
        for pos in 0..2_000 {
            counts[draw(&sampled(3), pos, &logits).unwrap() as usize] += 1;
        }
        for (id, &c) in counts.iter().enumerate() {
            assert!((150..=350).contains(&c), "token {id} drawn {c} times");
        }
    }

    #[test]
    fn frequencies_match_the_distribution() {
        let probs = [0.6f64, 0.3, 0.1];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let mut counts = [0usize; 3];
        let n = 20_000;
        for pos in 0..n {
            counts[draw(&sampled(11), pos, &logits).unwrap() as usize] += 1;
        }
        for (c, p) in counts.iter().zip(probs) {
            let freq = *c as f64 / n as f64;
            assert!((freq - p).abs() < 0.02, "freq {freq} vs p {p}");
        }
    }

    #[test]
    fn degenerate_filters_equal_greedy() {
        // Distinct logits (13 is invertible mod 41): min_p = 1 keeps exactly the maximum.
        let logits: Vec<f32> = (0..40).map(|i| ((i * 13) % 41) as f32 * 0.25).collect();
        let g = greedy_pick(&logits).unwrap();
        for pos in 0..200 {
            for p in [
                SamplingParams { top_k: 1, ..sampled(5) },
                SamplingParams { top_p: 1e-6, ..sampled(5) },
                SamplingParams { min_p: 1.0, ..sampled(5) },
            ] {
                assert_eq!(draw(&p, pos, &logits), Ok(g), "{p:?} at {pos}");
            }
        }
        let separated = [0.0f32, 1.0, 3.0, 2.0];
        let cold = SamplingParams { temperature: 1e-4, ..sampled(5) };
        for pos in 0..200 {
            assert_eq!(draw(&cold, pos, &separated), Ok(2));
        }
    }

    #[test]
    fn filters_restrict_the_support() {
        let logits = [2.0f32, 1.9, 1.8, 0.0, -1.0];
        for pos in 0..500 {
            let k2 = draw(&SamplingParams { top_k: 2, ..sampled(9) }, pos, &logits).unwrap();
            assert!(k2 < 2);
            // exp(0 - 2) = 0.135 < 0.2 and exp(-3) too: only ids 0..3 survive min_p 0.2.
            let mp = draw(&SamplingParams { min_p: 0.2, ..sampled(9) }, pos, &logits).unwrap();
            assert!(mp < 3);
            // p = (0.329, 0.298, 0.269, 0.045, 0.017): top_p 0.6 keeps ids 0 and 1.
            let tp = draw(&SamplingParams { top_p: 0.6, ..sampled(9) }, pos, &logits).unwrap();
            assert!(tp < 2);
        }
    }

    /// Top-p walks that pass the first 256 and 4,096 sorted keys (flat logits) keep the reference's ids.
    #[test]
    fn long_top_p_walks_match_the_reference() {
        let logits: Vec<f32> = (0..6_000u64).map(|i| (mix64(i ^ 5) % 1_000) as f32 / 1_000.0).collect();
        for (top_k, top_p) in [(0, 0.99), (0, 0.5), (0, 0.03), (5_000, 0.9), (300, 0.95)] {
            let p = SamplingParams { top_k, top_p, ..sampled(11) };
            for pos in 0..6 {
                assert_eq!(draw(&p, pos, &logits).unwrap(), reference(&p, pos, &logits), "top_k {top_k} top_p {top_p}");
            }
        }
    }

    /// The whole-vocabulary scan and pick give the portable level's ids at every level, at a vocabulary's size and
    /// odd tails, across temperatures and min-p, and equal the brute-force reference.
    #[test]
    fn every_level_draws_the_same_id() {
        for (n, spread) in [(65_536usize, 30.0f32), (50_003, 8.0), (37, 3.0)] {
            let logits: Vec<f32> = (0..n as u64).map(|i| (mix64(i ^ 77) % 10_000) as f32 / 10_000.0 * spread).collect();
            for (t, min_p) in [(1.0, 0.0), (0.7, 0.0), (1.6, 0.02), (0.05, 0.0)] {
                let p = SamplingParams { temperature: t, min_p, ..sampled(9) };
                for pos in 0..12 {
                    let want = draw_at(Level::Portable, &p, pos, &logits).unwrap();
                    assert_eq!(draw_at(crate::simd::level(), &p, pos, &logits).unwrap(), want, "n {n} t {t} pos {pos}");
                    if n < 100 {
                        assert_eq!(want, reference(&p, pos, &logits));
                    }
                }
            }
        }
    }

    #[test]
    fn draw_matches_brute_force_reference() {
        let logits: Vec<f32> = (0..300u64).map(|i| (mix64(i) % 2_000) as f32 / 100.0 - 10.0).collect();
        let cases = [
            sampled(1),
            SamplingParams { temperature: 0.7, ..sampled(2) },
            SamplingParams { top_k: 20, ..sampled(3) },
            SamplingParams { top_p: 0.9, ..sampled(4) },
            SamplingParams { min_p: 0.05, ..sampled(5) },
            SamplingParams { temperature: 0.3, top_k: 50, top_p: 0.8, min_p: 0.1, seed: 6 },
        ];
        for p in cases {
            for pos in 0..100 {
                assert_eq!(draw(&p, pos, &logits).unwrap(), reference(&p, pos, &logits));
            }
        }
    }

    #[test]
    fn invalid_params_are_refused_by_name() {
        let name = |p: SamplingParams| match p.validate() {
            Err(SampleError::InvalidParam { name, .. }) => name,
            other => panic!("expected InvalidParam, got {other:?}"),
        };
        assert_eq!(name(SamplingParams { temperature: -0.1, ..sampled(0) }), "temperature");
        assert_eq!(name(SamplingParams { temperature: f32::NAN, ..sampled(0) }), "temperature");
        assert_eq!(name(SamplingParams { temperature: f32::INFINITY, ..sampled(0) }), "temperature");
        assert_eq!(name(SamplingParams { top_p: 0.0, ..sampled(0) }), "top_p");
        assert_eq!(name(SamplingParams { top_p: 1.5, ..sampled(0) }), "top_p");
        assert_eq!(name(SamplingParams { top_p: f32::NAN, ..sampled(0) }), "top_p");
        assert_eq!(name(SamplingParams { min_p: -0.5, ..sampled(0) }), "min_p");
        assert_eq!(name(SamplingParams { min_p: 1.01, ..sampled(0) }), "min_p");
        let bad = SamplingParams { top_p: 2.0, ..sampled(0) };
        assert!(matches!(draw(&bad, 0, &[1.0, 2.0]), Err(SampleError::InvalidParam { name: "top_p", .. })));
        assert_eq!(sampled(0).validate(), Ok(()));
        assert_eq!(SamplingParams::greedy().validate(), Ok(()));
        assert!(SamplingParams::greedy().is_greedy() && !sampled(0).is_greedy());
    }

    #[test]
    fn uniforms_stay_inside_the_open_interval() {
        for key in [0u64, u64::MAX, 12345] {
            for token in [0u32, 1, u32::MAX] {
                let u = keyed_uniform(key, token);
                assert!(u > 0.0 && u < 1.0);
                let g = gumbel(key, token);
                assert!(g.is_finite() && g < GUMBEL_MAX);
            }
        }
        // The extreme uniforms still give finite noise under the bound.
        let hi: f64 = 1.0 - 2f64.powi(-53);
        let lo: f64 = 2f64.powi(-53);
        assert!((-(-hi.ln()).ln()) < GUMBEL_MAX && (-(-lo.ln()).ln()).is_finite());
    }
}
