//! The request's logit controls (`presence_penalty`, `frequency_penalty`, `repetition_penalty`, `logit_bias`) read
//! into the engine's `Penalties`, each with a named 400; the engine's `Request::validate` checks the ids against
//! the vocabulary and answers a named 400 through `SubmitError::Penalty`.

use crate::error::ApiError;
use crate::protocol::requests::{Field, RequestOptions};
use serde_json::Value;
use tensorfold_engine::Penalties;
use tensorfold_engine::penalties::{MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_ENTRIES};

/// Reads the controls, in this order: `presence_penalty`, `frequency_penalty` (numbers in [-2, 2], as OpenAI),
/// `repetition_penalty` (a number > 0, as vLLM), `logit_bias` (an object of token id strings to numbers in
/// [-100, 100], as OpenAI; an id twice, e.g. "7" and "07", is refused).
pub fn penalties(o: &RequestOptions) -> Result<Penalties, ApiError> {
    let presence = ranged(&o.presence_penalty, "presence_penalty", 0.0)?;
    let frequency = ranged(&o.frequency_penalty, "frequency_penalty", 0.0)?;
    let repetition = match &o.repetition_penalty {
        Field::Absent => 1.0,
        Field::Given(x) if *x > 0.0 && (*x as f32).is_finite() && *x as f32 > 0.0 => *x as f32,
        Field::Given(x) => {
            return Err(ApiError::invalid(
                "repetition_penalty",
                format!("`repetition_penalty` = {x} must be a number > 0 (1 = off)"),
            ));
        }
        Field::Wrong(_) => {
            return Err(ApiError::invalid("repetition_penalty", "`repetition_penalty` must be a number"));
        }
    };
    Ok(Penalties { presence, frequency, repetition, logit_bias: logit_bias(&o.logit_bias)? })
}

/// A penalty in [-2, 2].
fn ranged(f: &Field<f64>, k: &str, default: f32) -> Result<f32, ApiError> {
    match f {
        Field::Absent => Ok(default),
        Field::Given(x) if (-2.0..=2.0).contains(x) => Ok(*x as f32),
        Field::Given(x) => Err(ApiError::invalid(k, format!("`{k}` = {x} is out of range [-2, 2]"))),
        Field::Wrong(_) => Err(ApiError::invalid(k, format!("`{k}` must be a number"))),
    }
}

/// `logit_bias`: token id (a decimal string) -> bias, sorted by id.
fn logit_bias(f: &Field<serde_json::Map<String, Value>>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::invalid("logit_bias", m);
    let map = match f {
        Field::Absent => return Ok(Vec::new()),
        Field::Given(m) => m,
        Field::Wrong(_) => return Err(bad("`logit_bias` must be an object of token ids to numbers".into())),
    };
    if map.len() > MAX_LOGIT_BIAS_ENTRIES {
        return Err(bad(format!("`logit_bias` has {} entries; at most {MAX_LOGIT_BIAS_ENTRIES}", map.len())));
    }
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        let id: u32 = k.trim().parse().map_err(|_| bad(format!("`logit_bias` key {k:?} is not a token id")))?;
        let b = v.as_f64().ok_or_else(|| bad(format!("`logit_bias` value for {k:?} must be a number")))?;
        if !(-f64::from(MAX_LOGIT_BIAS)..=f64::from(MAX_LOGIT_BIAS)).contains(&b) {
            return Err(bad(format!("`logit_bias` value {b} for token id {id} is out of range [-100, 100]")));
        }
        out.push((id, b as f32));
    }
    out.sort_by_key(|&(id, _)| id);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(bad(format!("`logit_bias` names token id {} twice", w[0].0)));
    }
    Ok(out)
}
