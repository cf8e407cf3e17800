//! `config.json` admission for `lfm2` and `lfm2_moe`: every field the forward uses, read and checked;
//! every unsupported value refused by name.

use serde_json::{Map, Value};

/// A refused or unreadable config. Each variant names the field and the value.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// `config.json` is not valid JSON or not an object.
    #[error("config.json is not a JSON object: {0}")]
    Json(String),
    /// A field the forward needs is absent.
    #[error("config.json lacks `{0}`, which the forward needs")]
    Missing(&'static str),
    /// A field has the wrong JSON type or an out-of-range value.
    #[error("config.json `{field}` = {value} is invalid: {why}")]
    Invalid { field: &'static str, value: String, why: String },
    /// A value we do not run (named so the user knows what to change).
    #[error("config.json `{field}` = {value} is not supported: {why}")]
    Unsupported { field: &'static str, value: String, why: &'static str },
    /// The quantization block refused for one module path (or `quantization`, the checkpoint-wide values).
    #[error("config.json quantization of {module} is refused: {why}")]
    Quantization { module: String, why: String },
}

/// Model family (`model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Dense LFM2 (`Lfm2ForCausalLM`).
    Lfm2,
    /// LFM2-MoE (`Lfm2MoeForCausalLM`).
    Lfm2Moe,
}

impl Family {
    /// The `model_type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Lfm2 => "lfm2",
            Family::Lfm2Moe => "lfm2_moe",
        }
    }
}

/// A decoder layer's mixer (`layer_types[i]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    /// LFM2 short convolution (`"conv"`).
    Conv,
    /// Grouped-query attention (`"full_attention"`).
    Attention,
}

/// MoE settings of `lfm2_moe` (transformers `Lfm2MoeConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// `num_experts`.
    pub experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// `moe_intermediate_size`: each expert's SwiGLU width.
    pub inter: usize,
    /// `num_dense_layers`: the first layers use a dense FFN of `intermediate_size`.
    pub dense_layers: usize,
    /// `norm_topk_prob`.
    pub norm_topk_prob: bool,
    /// `routed_scaling_factor`.
    pub routed_scaling_factor: f32,
    /// `use_expert_bias`: a float32 `expert_bias` [experts] added to scores for selection only.
    pub use_expert_bias: bool,
}

/// The admitted configuration: everything the forward reads.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Family.
    pub family: Family,
    /// `vocab_size`: embedding rows and logits a row.
    pub vocab: usize,
    /// `hidden_size`.
    pub hidden: usize,
    /// Mixer of each layer, from `layer_types` or the older `full_attn_idxs`.
    pub layers: Vec<Mixer>,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim` (default `hidden / heads`).
    pub head_dim: usize,
    /// `norm_eps` (default 1e-5).
    pub norm_eps: f32,
    /// `rope_theta` or `rope_parameters.rope_theta` (default 1e6, as the reference).
    pub rope_theta: f64,
    /// `conv_L_cache`: taps of the depthwise conv (default 3).
    pub conv_taps: usize,
    /// `conv_bias`: bias on the conv's in_proj, conv and out_proj (default false).
    pub conv_bias: bool,
    /// Dense FFN width as the tensors must have it (LFM2 derives it from `block_*`, see [`dense_width`]).
    pub dense_inter: usize,
    /// `tie_embedding` (legacy key, wins) or `tie_word_embeddings` (default true): the head is `embed_tokens`.
    pub tied: bool,
    /// `max_position_embeddings`: the context limit.
    pub max_positions: usize,
    /// MoE settings (`lfm2_moe` only).
    pub moe: Option<MoeConfig>,
    /// `eos_token_id` (an id or a list).
    pub eos_ids: Vec<u32>,
    /// `bos_token_id`.
    pub bos_id: Option<u32>,
    /// MLX affine quantization (`quantization`, as mlx-lm writes it); `None` for a float checkpoint.
    pub quant: Option<crate::quant::QuantConfig>,
}

impl ModelConfig {
    /// Parses and admits `config.json` bytes; sizes past [`crate::config_bounds`] are refused by name.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(e.to_string()))?;
        let o = v.as_object().ok_or_else(|| ConfigError::Json("top level is not an object".into()))?;
        admit(o)
    }

    /// True when layer `i` uses a MoE FFN.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| i >= m.dense_layers)
    }
}

fn admit(o: &Map<String, Value>) -> Result<ModelConfig, ConfigError> {
    let family = match o.get("model_type").and_then(Value::as_str) {
        Some("lfm2") => Family::Lfm2,
        Some("lfm2_moe") => Family::Lfm2Moe,
        Some(other) => return Err(unsupported("model_type", other, "only lfm2 and lfm2_moe are served")),
        None => return Err(ConfigError::Missing("model_type")),
    };
    if let Some(act) = o.get("hidden_act").filter(|v| !v.is_null() && v.as_str() != Some("silu")) {
        return Err(unsupported("hidden_act", &act.to_string(), "LFM2 FFNs are SwiGLU (silu)"));
    }
    let quant = crate::quant::QuantConfig::parse(o)?;
    let hidden = usize_field(o, "hidden_size")?;
    let heads = usize_field(o, "num_attention_heads")?;
    let kv_heads = opt_usize(o, "num_key_value_heads")?.unwrap_or(heads);
    let n_layers = usize_field(o, "num_hidden_layers")?;
    for (field, v) in [("hidden_size", hidden), ("num_attention_heads", heads), ("num_hidden_layers", n_layers)] {
        crate::config_bounds::check_width(field, v)?;
    }
    let head_dim = opt_usize(o, "head_dim")?.unwrap_or(hidden / heads.max(1));
    positive("hidden_size", hidden)?;
    positive("num_attention_heads", heads)?;
    positive("num_key_value_heads", kv_heads)?;
    positive("num_hidden_layers", n_layers)?;
    if heads % kv_heads != 0 {
        return Err(invalid("num_key_value_heads", kv_heads, "must divide num_attention_heads"));
    }
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(invalid("head_dim", head_dim, "must be even and positive (half-split RoPE)"));
    }
    let layers = layer_plan(o, n_layers, family)?;
    let vocab = usize_field(o, "vocab_size")?;
    positive("vocab_size", vocab)?;
    let conv_taps = opt_usize(o, "conv_L_cache")?.unwrap_or(3);
    positive("conv_L_cache", conv_taps)?;
    let moe = match family {
        Family::Lfm2Moe => Some(moe_config(o, n_layers)?),
        Family::Lfm2 => None,
    };
    let dense_inter = match family {
        Family::Lfm2 => dense_width(o)?,
        Family::Lfm2Moe => usize_field(o, "intermediate_size")?,
    };
    positive("intermediate_size", dense_inter)?;
    let norm_eps = opt_f64(o, "norm_eps")?.unwrap_or(1e-5);
    if !(norm_eps.is_finite() && norm_eps > 0.0) {
        return Err(invalid("norm_eps", norm_eps, "must be finite and positive"));
    }
    let max_positions = opt_usize(o, "max_position_embeddings")?.unwrap_or(128_000);
    positive("max_position_embeddings", max_positions)?;
    let cfg = ModelConfig {
        family,
        vocab,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        norm_eps: norm_eps as f32,
        rope_theta: rope_theta(o)?,
        conv_taps,
        conv_bias: opt_bool(o, "conv_bias")?.unwrap_or(false),
        dense_inter,
        // As transformers' `Lfm2Config` / `Lfm2MoeConfig`: the legacy `tie_embedding` key wins when present.
        tied: match opt_bool(o, "tie_embedding")? {
            Some(t) => t,
            None => opt_bool(o, "tie_word_embeddings")?.unwrap_or(true),
        },
        max_positions,
        moe,
        eos_ids: id_list(o, "eos_token_id")?,
        bos_id: id_list(o, "bos_token_id")?.first().copied(),
        quant,
    };
    // Sizes whose products overflow or exceed any device are refused here, so no later estimate can wrap.
    crate::config_bounds::check(&cfg)?;
    Ok(cfg)
}

/// `layer_types` (preferred) or the older `full_attn_idxs`; other layer types are refused by name. A dense
/// `lfm2` config with neither has attention in every layer, as transformers' `Lfm2Config` defaults.
fn layer_plan(o: &Map<String, Value>, n: usize, family: Family) -> Result<Vec<Mixer>, ConfigError> {
    if let Some(types) = o.get("layer_types").filter(|v| !v.is_null()) {
        let arr = types.as_array().ok_or_else(|| invalid("layer_types", types, "must be a list"))?;
        if arr.len() != n {
            return Err(invalid("layer_types", arr.len(), &format!("has {} entries for {n} layers", arr.len())));
        }
        return arr
            .iter()
            .map(|t| match t.as_str() {
                Some("conv") => Ok(Mixer::Conv),
                Some("full_attention") => Ok(Mixer::Attention),
                _ => Err(unsupported("layer_types", &t.to_string(), "layer types are conv or full_attention")),
            })
            .collect();
    }
    let idxs = match o.get("full_attn_idxs").filter(|v| !v.is_null()) {
        Some(v) => v.as_array().ok_or_else(|| invalid("full_attn_idxs", v, "must be a list"))?.clone(),
        None if family == Family::Lfm2 => return Ok(vec![Mixer::Attention; n]),
        None => return Err(ConfigError::Missing("layer_types")),
    };
    let mut plan = vec![Mixer::Conv; n];
    for i in idxs {
        let k = i.as_u64().map(|k| k as usize).filter(|&k| k < n);
        plan[k.ok_or_else(|| invalid("full_attn_idxs", &i, &format!("entries must be layer indices below {n}")))?] =
            Mixer::Attention;
    }
    Ok(plan)
}

/// Dense LFM2 FFN width, as transformers' `Lfm2MLP` derives it: with `block_auto_adjust_ff_dim`,
/// `ff = int(2 * ff / 3)`, then, only when a multiplier is set, `ff = int(block_ffn_dim_multiplier * ff)` rounded
/// up to a multiple of `block_multiple_of`. An absent multiplier is `Lfm2Config`'s default 1.0; an explicit null
/// turns both steps off. `block_ff_dim` is the original key for `intermediate_size`.
pub fn dense_width(o: &Map<String, Value>) -> Result<usize, ConfigError> {
    let ff = match opt_usize(o, "block_ff_dim")? {
        Some(v) => v,
        None => usize_field(o, "intermediate_size")?,
    };
    let max = crate::config_bounds::MAX_WIDTH;
    if ff > max {
        return Err(invalid("intermediate_size", ff, &format!("exceeds the largest width served, {max}")));
    }
    if !opt_bool(o, "block_auto_adjust_ff_dim")?.unwrap_or(true) {
        return Ok(ff);
    }
    let mut ff = (2 * ff) / 3;
    let multiplier = match o.get("block_ffn_dim_multiplier") {
        None => Some(1.0),
        Some(_) => opt_f64(o, "block_ffn_dim_multiplier")?,
    };
    if let Some(m) = multiplier {
        if !(m.is_finite() && m > 0.0) {
            return Err(invalid("block_ffn_dim_multiplier", m, "must be positive"));
        }
        ff = (m * ff as f64) as usize;
        let multiple = opt_usize(o, "block_multiple_of")?.unwrap_or(256);
        positive("block_multiple_of", multiple)?;
        if ff > max || multiple > max {
            let why = format!("block_ffn_dim_multiplier {m} and block_multiple_of {multiple} exceed the largest width");
            return Err(invalid("intermediate_size", ff, &why));
        }
        ff = multiple * ff.div_ceil(multiple);
    }
    Ok(ff)
}

fn moe_config(o: &Map<String, Value>, n_layers: usize) -> Result<MoeConfig, ConfigError> {
    let experts = usize_field(o, "num_experts")?;
    let top_k = usize_field(o, "num_experts_per_tok")?;
    positive("num_experts", experts)?;
    if top_k == 0 || top_k > experts {
        return Err(invalid("num_experts_per_tok", top_k, &format!("must be in 1..={experts}")));
    }
    let dense_layers = opt_usize(o, "num_dense_layers")?.unwrap_or(2);
    if dense_layers > n_layers {
        return Err(invalid("num_dense_layers", dense_layers, "exceeds num_hidden_layers"));
    }
    let scale = opt_f64(o, "routed_scaling_factor")?.unwrap_or(1.0);
    if !scale.is_finite() {
        return Err(invalid("routed_scaling_factor", scale, "must be finite"));
    }
    let inter = usize_field(o, "moe_intermediate_size")?;
    positive("moe_intermediate_size", inter)?;
    Ok(MoeConfig {
        experts,
        top_k,
        inter,
        dense_layers,
        norm_topk_prob: opt_bool(o, "norm_topk_prob")?.unwrap_or(true),
        routed_scaling_factor: scale as f32,
        use_expert_bias: opt_bool(o, "use_expert_bias")?.unwrap_or(true),
    })
}

/// RoPE theta from `rope_parameters` (nested, transformers 5), `rope_theta` or `theta` (older keys);
/// any rope type but `default` (and any `rope_scaling`) is refused by name.
fn rope_theta(o: &Map<String, Value>) -> Result<f64, ConfigError> {
    if let Some(s) = o.get("rope_scaling").filter(|v| !v.is_null()) {
        return Err(unsupported("rope_scaling", &s.to_string(), "only default RoPE is implemented"));
    }
    let mut theta = opt_f64(o, "rope_theta")?.or(opt_f64(o, "theta")?);
    if let Some(p) = o.get("rope_parameters").filter(|v| !v.is_null()) {
        let p = p.as_object().ok_or_else(|| invalid("rope_parameters", p, "must be an object"))?;
        let kind = p.get("rope_type").and_then(Value::as_str).unwrap_or("default");
        if kind != "default" {
            return Err(unsupported("rope_parameters.rope_type", kind, "only default RoPE is implemented"));
        }
        if let Some(t) = opt_f64(p, "rope_theta")? {
            theta = Some(t);
        }
    }
    let t = theta.unwrap_or(1e6);
    if !(t.is_finite() && t > 1.0) {
        return Err(invalid("rope_theta", t, "must be finite and > 1"));
    }
    Ok(t)
}

fn id_list(o: &Map<String, Value>, key: &'static str) -> Result<Vec<u32>, ConfigError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(|v| as_id(key, v)).collect(),
        Some(v) => Ok(vec![as_id(key, v)?]),
    }
}

fn as_id(key: &'static str, v: &Value) -> Result<u32, ConfigError> {
    v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| invalid(key, v, "must be a token id"))
}

fn usize_field(o: &Map<String, Value>, key: &'static str) -> Result<usize, ConfigError> {
    opt_usize(o, key)?.ok_or(ConfigError::Missing(key))
}

fn opt_usize(o: &Map<String, Value>, key: &'static str) -> Result<Option<usize>, ConfigError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| invalid(key, v, "must be a non-negative integer"))
        }
    }
}

pub(crate) fn opt_f64(o: &Map<String, Value>, key: &'static str) -> Result<Option<f64>, ConfigError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| invalid(key, v, "must be a number")),
    }
}

fn opt_bool(o: &Map<String, Value>, key: &'static str) -> Result<Option<bool>, ConfigError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| invalid(key, v, "must be true or false")),
    }
}

fn positive(field: &'static str, v: usize) -> Result<(), ConfigError> {
    if v == 0 { Err(invalid(field, v, "must be positive")) } else { Ok(()) }
}

fn invalid(field: &'static str, value: impl std::fmt::Display, why: &str) -> ConfigError {
    ConfigError::Invalid { field, value: value.to_string(), why: why.to_string() }
}

fn unsupported(field: &'static str, value: &str, why: &'static str) -> ConfigError {
    ConfigError::Unsupported { field, value: value.to_string(), why }
}
