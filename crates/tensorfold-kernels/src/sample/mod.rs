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
    greedy_at(crate::simd::level(), logits)
}

/// [`greedy_pick`] with the pass at `level` (every level gives the same id).
fn greedy_at(level: Level, logits: &[f32]) -> Result<u32, SampleError> {
    check_logits(logits)?;
    // check_logits proved every index fits in u32.
    Ok(scan::first_max(level, logits) as u32)
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
        return greedy_at(level, logits);
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
        None => greedy_at(level, logits)?,
    };
    let s_max = scaled(top);
    let min_p = f64::from(params.min_p);
    let key = position_key(params.seed, position);

    let floors = uniform_floors();
    let mut best_id = top;
    let start = s_max + gumbel(key, top);
    let mut best = start;
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
        None => scan::Scan { logits, inv_t, key, floors }.each(level, start, consider),
    }
    Ok(best_id)
}

#[cfg(test)]
mod tests;
