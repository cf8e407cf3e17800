//! DSpark drafter `config.json` admission: every field the block pass reads, checked against the target;
//! every value we do not run refused by name (docs/drafter.md).

use crate::config::ModelConfig;
use serde_json::{Map, Value};

/// Most drafts a block may propose (the engine's verify window is one row longer).
pub const MAX_BLOCK: usize = 32;

/// A refused drafter config. Each variant names the field and the value.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DrafterConfigError {
    /// Not a JSON object.
    #[error("drafter config.json is not a JSON object: {0}")]
    Json(String),
    /// A field the block pass needs is absent.
    #[error("drafter config.json lacks `{0}`")]
    Missing(&'static str),
    /// A value we do not run, or one out of range.
    #[error("drafter config.json `{field}` = {value} is not supported: {why}")]
    Unsupported { field: &'static str, value: String, why: String },
    /// A value that must equal the target's.
    #[error("drafter config.json `{field}` = {drafter} does not match the target's {target}")]
    Mismatch { field: &'static str, drafter: usize, target: usize },
}

/// The admitted drafter config (Qwen3-style layers plus DSpark's block, taps, Markov and confidence heads).
#[derive(Clone, Debug, PartialEq)]
pub struct DrafterConfig {
    /// `hidden_size` d (the target's).
    pub hidden: usize,
    /// `num_hidden_layers`.
    pub layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim` (default `hidden / heads`).
    pub head_dim: usize,
    /// `intermediate_size` of each layer's SwiGLU MLP.
    pub inter: usize,
    /// `rms_norm_eps`.
    pub eps: f32,
    /// `rope_theta`.
    pub rope_theta: f64,
    /// `vocab_size` (the target's).
    pub vocab: usize,
    /// `block_size`: drafts a block (anchor-first: every block row is a draft).
    pub block: usize,
    /// `dflash_config.mask_token_id`.
    pub mask_id: u32,
    /// `dflash_config.target_layer_ids`: 0-based target layers whose outputs are tapped, in concat order.
    pub taps: Vec<usize>,
    /// `markov_rank` r.
    pub markov_rank: usize,
    /// `enable_confidence_head`.
    pub confidence: bool,
    /// `!rope_is_neox_style`: interleaved (GPT-J) pairs.
    pub interleaved: bool,
}

impl DrafterConfig {
    /// Parses `config.json` bytes and admits them against the target's config.
    pub fn parse(bytes: &[u8], target: &ModelConfig) -> Result<Self, DrafterConfigError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| DrafterConfigError::Json(e.to_string()))?;
        let o = v.as_object().ok_or_else(|| DrafterConfigError::Json("top level is not an object".into()))?;
        admit(o, target)
    }
}

fn unsupported(field: &'static str, value: impl ToString, why: impl Into<String>) -> DrafterConfigError {
    DrafterConfigError::Unsupported { field, value: value.to_string(), why: why.into() }
}

fn size(o: &Map<String, Value>, field: &'static str) -> Result<usize, DrafterConfigError> {
    let v = o.get(field).ok_or(DrafterConfigError::Missing(field))?;
    v.as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| unsupported(field, v, "must be a positive integer"))
}

/// A finite number above `above` (`default` when absent), else refused by name.
fn positive(o: &Map<String, Value>, field: &'static str, default: f64, above: f64) -> Result<f64, DrafterConfigError> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite() && *x > above)
            .ok_or_else(|| unsupported(field, v, format!("must be a finite number above {above}"))),
    }
}

/// A boolean (false when absent), else refused by name.
fn flag(o: &Map<String, Value>, field: &'static str) -> Result<bool, DrafterConfigError> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(v) => v.as_bool().ok_or_else(|| unsupported(field, v, "must be a bool")),
    }
}

fn same(field: &'static str, drafter: usize, target: usize) -> Result<(), DrafterConfigError> {
    if drafter == target { Ok(()) } else { Err(DrafterConfigError::Mismatch { field, drafter, target }) }
}

fn admit(o: &Map<String, Value>, t: &ModelConfig) -> Result<DrafterConfig, DrafterConfigError> {
    if let Some(act) = o.get("hidden_act").filter(|a| a.as_str() != Some("silu")) {
        return Err(unsupported("hidden_act", act, "the drafter's MLP is SwiGLU (silu)"));
    }
    if let Some(h) = o.get("markov_head_type").filter(|h| h.as_str() != Some("vanilla")) {
        return Err(unsupported("markov_head_type", h, "only the vanilla Markov head (W2 . W1[prev]) runs"));
    }
    for flag in ["attention_bias", "mlp_bias"] {
        if let Some(b) = o.get(flag).filter(|b| b.as_bool() == Some(true)) {
            return Err(unsupported(flag, b, "no biases"));
        }
    }
    for field in ["quantization", "quantization_config"] {
        if let Some(q) = o.get(field).filter(|q| !q.is_null()) {
            let why = "a quantized (MLX) drafter is not served: load the released bf16 drafter (`--drafter-bits 8` \
                       quantizes its linears to 8-bit codes at load)";
            return Err(unsupported(field, q, why));
        }
    }
    if let Some(r) = o.get("rope_scaling").filter(|r| !r.is_null()) {
        return Err(unsupported("rope_scaling", r, "the drafter runs plain RoPE"));
    }
    if let Some(a) = o.get("anchor_first").filter(|a| a.as_bool() != Some(true)) {
        return Err(unsupported("anchor_first", a, "only anchor-first blocks (row k predicts anchor + k + 1) run"));
    }
    let hidden = size(o, "hidden_size")?;
    same("hidden_size", hidden, t.hidden)?;
    let vocab = size(o, "vocab_size")?;
    same("vocab_size", vocab, t.vocab)?;
    let heads = size(o, "num_attention_heads")?;
    let kv_heads = size(o, "num_key_value_heads")?;
    let head_dim = if o.contains_key("head_dim") { size(o, "head_dim")? } else { hidden / heads };
    if heads % kv_heads != 0 || head_dim % 2 != 0 {
        return Err(unsupported(
            "num_key_value_heads",
            kv_heads,
            format!("needs heads % kv_heads == 0 and an even head_dim ({heads} heads of {head_dim})"),
        ));
    }
    let block = size(o, "block_size")?;
    if block > MAX_BLOCK {
        return Err(unsupported("block_size", block, format!("at most {MAX_BLOCK} drafts a block")));
    }
    let df = o.get("dflash_config").and_then(Value::as_object).ok_or(DrafterConfigError::Missing("dflash_config"))?;
    let mask = df.get("mask_token_id").ok_or(DrafterConfigError::Missing("dflash_config.mask_token_id"))?;
    let mask_id =
        mask.as_u64().filter(|&m| (m as usize) < vocab).ok_or_else(|| {
            unsupported("dflash_config.mask_token_id", mask, format!("must be a token id below {vocab}"))
        })? as u32;
    same("dflash_config.num_target_layers", size(df, "num_target_layers")?, t.layers.len())?;
    let taps_v = df.get("target_layer_ids").ok_or(DrafterConfigError::Missing("dflash_config.target_layer_ids"))?;
    let taps: Vec<usize> = taps_v
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_u64().map(|n| n as usize)).collect())
        .filter(|v: &Vec<usize>| !v.is_empty() && v.len() == taps_v.as_array().map_or(0, Vec::len))
        .ok_or_else(|| {
            unsupported("dflash_config.target_layer_ids", taps_v, "must be a non-empty list of layer ids")
        })?;
    if let Some(bad) = taps.iter().find(|&&l| l + 1 >= t.layers.len()) {
        return Err(unsupported(
            "dflash_config.target_layer_ids",
            bad,
            format!("a tap must lie before the target's last layer ({} layers)", t.layers.len()),
        ));
    }
    let neox = o.get("rope_is_neox_style").map_or(Some(true), Value::as_bool);
    let neox = neox.ok_or_else(|| unsupported("rope_is_neox_style", &o["rope_is_neox_style"], "must be a bool"))?;
    Ok(DrafterConfig {
        hidden,
        layers: size(o, "num_hidden_layers")?,
        heads,
        kv_heads,
        head_dim,
        inter: size(o, "intermediate_size")?,
        eps: positive(o, "rms_norm_eps", 1e-6, 0.0)? as f32,
        rope_theta: positive(o, "rope_theta", 1e6, 1.0)?,
        vocab,
        block,
        mask_id,
        taps,
        markov_rank: size(o, "markov_rank")?,
        confidence: flag(o, "enable_confidence_head")?,
        interleaved: !neox,
    })
}
