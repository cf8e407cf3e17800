//! Sampling controls applied to a row's logits before the keyed draw, with vLLM v1's semantics: `logit_bias`, then
//! the repetition, frequency and presence penalties, computed only from the stream's own tokens.
//!
//! Order (vLLM v1's `Sampler.forward`: logits processors that change the argmax, then `apply_penalties`, then the
//! draw): 1. `logit_bias` adds to its ids' logits; 2. `repetition_penalty` divides the positive logits and multiplies
//! the others of every id seen in the prompt or the output so far; 3. `frequency_penalty` subtracts
//! `frequency * count` of each id's occurrences in the output; 4. `presence_penalty` subtracts once for each id that
//! occurs in the output. Then the draw's own order: temperature, top-k, top-p, min-p (`tensorfold_kernels::sample`).
//! All in f32, as vLLM's tensors. "Output" is the stream's generated tokens, drafted ones counted only once the
//! verify commits them, so a drafted reply equals its plain reply.

use crate::keyed::{SampleError, SamplingParams, draw};
use std::collections::{BTreeMap, BTreeSet};

/// Largest absolute `logit_bias` value (OpenAI's range).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// Most `logit_bias` entries a request may carry (OpenAI's limit is 300; vLLM has none).
pub const MAX_LOGIT_BIAS_ENTRIES: usize = 1024;

/// A request's logit controls. [`Penalties::default`] (everything off) leaves the logits, and so the draw, as they
/// are.
#[derive(Clone, Debug, PartialEq)]
pub struct Penalties {
    /// `presence_penalty` in [-2, 2]: subtracted once from every id already in the output (0 = off).
    pub presence: f32,
    /// `frequency_penalty` in [-2, 2]: subtracted once per occurrence in the output (0 = off).
    pub frequency: f32,
    /// `repetition_penalty` > 0 (finite): an id seen in the prompt or the output has its logit divided by it when
    /// positive, multiplied by it otherwise (1 = off; above 1 discourages repeats).
    pub repetition: f32,
    /// `logit_bias`: (token id, bias in [-100, 100]) added to the logit, ids distinct.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for Penalties {
    fn default() -> Self {
        Self { presence: 0.0, frequency: 0.0, repetition: 1.0, logit_bias: Vec::new() }
    }
}

/// Why a request's logit controls were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PenaltyError {
    /// A penalty outside its range (or not finite).
    #[error("invalid {name} = {value}: allowed {allowed}")]
    OutOfRange {
        /// The API's name of the field.
        name: &'static str,
        /// The refused value.
        value: f32,
        /// The allowed range, in words.
        allowed: &'static str,
    },
    /// A `logit_bias` id past the vocabulary.
    #[error("logit_bias token id {id} is outside the vocabulary of {vocab}")]
    BiasTokenOutOfRange {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A `logit_bias` value outside [-100, 100] (or not finite).
    #[error("logit_bias value {value} for token id {id} is outside [-100, 100]")]
    BiasOutOfRange {
        /// The id.
        id: u32,
        /// The refused bias.
        value: f32,
    },
    /// The same id twice.
    #[error("logit_bias names token id {id} twice")]
    BiasDuplicate {
        /// The id.
        id: u32,
    },
    /// Too many entries.
    #[error("logit_bias has {len} entries; at most {MAX_LOGIT_BIAS_ENTRIES}")]
    BiasTooLong {
        /// The entry count.
        len: usize,
    },
}

impl PenaltyError {
    /// The request field it is about (`presence_penalty`, ..., `logit_bias`).
    pub fn param(&self) -> &'static str {
        match self {
            Self::OutOfRange { name, .. } => name,
            _ => "logit_bias",
        }
    }
}

impl Penalties {
    /// Whether any control is on (such rows are drawn on the host from the row's logits).
    pub fn is_on(&self) -> bool {
        *self != Self::default()
    }

    /// Checks every field against its range and the vocabulary.
    ///
    /// # Errors
    /// The first bad field, in this order: `presence_penalty` and `frequency_penalty` outside [-2, 2],
    /// `repetition_penalty` not finite or not above 0, `logit_bias` too long, an id past `vocab`, a value outside
    /// [-100, 100], an id twice.
    pub fn validate(&self, vocab: usize) -> Result<(), PenaltyError> {
        for (name, value) in [("presence_penalty", self.presence), ("frequency_penalty", self.frequency)] {
            if !(-2.0..=2.0).contains(&value) {
                return Err(PenaltyError::OutOfRange { name, value, allowed: "a number in [-2, 2] (0 = off)" });
            }
        }
        let r = self.repetition;
        if !(r.is_finite() && r > 0.0) {
            return Err(PenaltyError::OutOfRange {
                name: "repetition_penalty",
                value: r,
                allowed: "a finite number > 0 (1 = off)",
            });
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS_ENTRIES {
            return Err(PenaltyError::BiasTooLong { len: self.logit_bias.len() });
        }
        let mut seen = BTreeSet::new();
        for &(id, value) in &self.logit_bias {
            if id as usize >= vocab {
                return Err(PenaltyError::BiasTokenOutOfRange { id, vocab });
            }
            if !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&value) {
                return Err(PenaltyError::BiasOutOfRange { id, value });
            }
            if !seen.insert(id) {
                return Err(PenaltyError::BiasDuplicate { id });
            }
        }
        Ok(())
    }
}

/// One stream's penalty state: which ids its prompt holds and how often each occurs in its committed output.
/// Memory is bounded by the stream's distinct ids.
#[derive(Clone, Debug)]
pub struct PenaltyState {
    penalties: Penalties,
    prompt: BTreeSet<u32>,
    output: BTreeMap<u32, u32>,
}

impl PenaltyState {
    /// The state at the start of a reply to `prompt`.
    pub fn new(penalties: Penalties, prompt: &[u32]) -> Self {
        let prompt = if penalties.repetition != 1.0 { prompt.iter().copied().collect() } else { BTreeSet::new() };
        Self { penalties, prompt, output: BTreeMap::new() }
    }

    /// Applies the controls to one row's logits (`[vocab]`), in the order of this module's doc. Ids past the row
    /// are skipped (validation refuses them first).
    pub fn apply(&self, logits: &mut [f32]) {
        let p = &self.penalties;
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if p.repetition != 1.0 {
            let seen = self.prompt.iter().chain(self.output.keys().filter(|id| !self.prompt.contains(id)));
            for &id in seen {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 { *l / p.repetition } else { *l * p.repetition };
                }
            }
        }
        for (&id, &count) in &self.output {
            if let Some(l) = logits.get_mut(id as usize) {
                *l -= p.frequency * count as f32;
                *l -= p.presence;
            }
        }
    }

    /// Records a committed output token.
    pub fn push(&mut self, token: u32) {
        *self.output.entry(token).or_insert(0) += 1;
    }

    /// The keyed draw at `position` from a row's raw `logits` with the controls applied (a copy; the row is left as
    /// it is, for logprobs). Does not record the token: the caller pushes it once it is committed.
    ///
    /// # Errors
    /// The draw's [`SampleError`] (a non-finite logit, before or after the controls).
    pub fn draw(&self, params: &SamplingParams, position: u64, logits: &[f32]) -> Result<u32, SampleError> {
        let mut row = logits.to_vec();
        self.apply(&mut row);
        draw(params, position, &row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(p: Penalties, prompt: &[u32], out: &[u32]) -> PenaltyState {
        let mut s = PenaltyState::new(p, prompt);
        out.iter().for_each(|&t| s.push(t));
        s
    }

    #[test]
    fn each_control_matches_vllms_arithmetic() {
        let raw = [2.0f32, -1.0, 0.5, 3.0, -4.0];
        // Repetition over prompt (id 0) and output (id 1): positive divided, negative multiplied.
        let p = Penalties { repetition: 2.0, ..Penalties::default() };
        let mut l = raw;
        state(p, &[0], &[1]).apply(&mut l);
        assert_eq!(l, [1.0, -2.0, 0.5, 3.0, -4.0]);
        // Frequency counts output occurrences only; presence once per id; the prompt is not counted.
        let p = Penalties { frequency: 0.5, presence: 0.25, ..Penalties::default() };
        let mut l = raw;
        state(p, &[2], &[3, 3, 4]).apply(&mut l);
        assert_eq!(l, [2.0, -1.0, 0.5, 3.0 - 1.0 - 0.25, -4.0 - 0.5 - 0.25]);
        // Bias comes first, so the repetition penalty sees the biased logit (vLLM v1's order).
        let p = Penalties { repetition: 2.0, logit_bias: vec![(1, 3.0)], ..Penalties::default() };
        let mut l = raw;
        state(p, &[1], &[]).apply(&mut l);
        assert_eq!(l, [2.0, 1.0, 0.5, 3.0, -4.0]);
    }

    #[test]
    fn off_controls_leave_the_draw_unchanged_and_a_bias_forces_a_token() {
        let logits: Vec<f32> = (0..40).map(|i| ((i * 13) % 7) as f32 * 0.4).collect();
        let params = SamplingParams { temperature: 0.8, seed: 5, ..SamplingParams::greedy() };
        let off = PenaltyState::new(Penalties::default(), &[1, 2]);
        assert!(!Penalties::default().is_on());
        for pos in 0..20 {
            assert_eq!(off.draw(&params, pos, &logits), draw(&params, pos, &logits));
        }
        let forced = PenaltyState::new(Penalties { logit_bias: vec![(33, 100.0)], ..Penalties::default() }, &[]);
        assert!((0..20).all(|pos| forced.draw(&params, pos, &logits) == Ok(33)));
        let top = draw(&SamplingParams::greedy(), 0, &logits).unwrap();
        let banned = PenaltyState::new(Penalties { logit_bias: vec![(top, -100.0)], ..Penalties::default() }, &[]);
        let next = banned.draw(&SamplingParams::greedy(), 0, &logits).unwrap();
        assert!(
            next != top && logits[next as usize] == logits[top as usize]
                || logits[next as usize] < logits[top as usize]
        );
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let bad = |p: Penalties| p.validate(10).unwrap_err();
        let of = |name: &str, e: PenaltyError| matches!(e, PenaltyError::OutOfRange { name: n, .. } if n == name);
        assert!(of("presence_penalty", bad(Penalties { presence: 2.5, ..Penalties::default() })));
        assert!(of("frequency_penalty", bad(Penalties { frequency: f32::NAN, ..Penalties::default() })));
        assert!(of("repetition_penalty", bad(Penalties { repetition: 0.0, ..Penalties::default() })));
        assert!(of("repetition_penalty", bad(Penalties { repetition: f32::INFINITY, ..Penalties::default() })));
        let bias = |b: Vec<(u32, f32)>| bad(Penalties { logit_bias: b, ..Penalties::default() });
        assert_eq!(bias(vec![(10, 1.0)]), PenaltyError::BiasTokenOutOfRange { id: 10, vocab: 10 });
        assert_eq!(bias(vec![(2, 100.5)]), PenaltyError::BiasOutOfRange { id: 2, value: 100.5 });
        assert_eq!(bias(vec![(2, 1.0), (2, 2.0)]), PenaltyError::BiasDuplicate { id: 2 });
        assert_eq!(bias(vec![(1, 0.0); 1025]), PenaltyError::BiasTooLong { len: 1025 });
        let ok = Penalties { presence: -2.0, frequency: 2.0, repetition: 1.3, logit_bias: vec![(9, -100.0)] };
        assert_eq!(ok.validate(10), Ok(()));
    }
}
