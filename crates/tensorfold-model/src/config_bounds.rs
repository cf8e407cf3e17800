//! Size bounds on an admitted `config.json`: a context or width whose products (weights, KV cache at the full
//! context, per-row activations) overflow or exceed what any device holds is refused by name at open, so no
//! later memory estimate can wrap.

use crate::config::{ConfigError, Mixer, ModelConfig};

/// Largest `max_position_embeddings` served: 2^24 = 16,777,216 positions (the longest released contexts are
/// 10M tokens, Llama 4 Scout's); beyond it every estimate is a product with a number no checkpoint means.
pub const MAX_POSITIONS: usize = 1 << 24;
/// Largest single width (`hidden_size`, `vocab_size`, `intermediate_size`, heads, `head_dim`, layers, experts):
/// 2^24, far beyond any released model (vocabularies are ~2^18, widths ~2^15).
pub const MAX_WIDTH: usize = 1 << 24;
/// Largest weight count implied by the config: 2^42 elements (4.4 trillion parameters, ~8 TiB in bf16).
pub const MAX_WEIGHTS: u128 = 1 << 42;
/// Largest per-stream estimate at the full context (f32 KV rows of every attention layer plus conv states and one
/// row's activations): 2^44 bytes (16 TiB), more than any device or host holds.
pub const MAX_STREAM_BYTES: u128 = 1 << 44;

/// Checks every size field against [`MAX_WIDTH`] / [`MAX_POSITIONS`] and the products against
/// [`MAX_WEIGHTS`] / [`MAX_STREAM_BYTES`] (in u128, so the check itself cannot overflow).
pub fn check(c: &ModelConfig) -> Result<(), ConfigError> {
    let moe = c.moe.as_ref();
    let widths: [(&'static str, usize); 10] = [
        ("hidden_size", c.hidden),
        ("vocab_size", c.vocab),
        ("intermediate_size", c.dense_inter),
        ("num_attention_heads", c.heads),
        ("num_key_value_heads", c.kv_heads),
        ("head_dim", c.head_dim),
        ("num_hidden_layers", c.layers.len()),
        ("conv_L_cache", c.conv_taps),
        ("num_experts", moe.map_or(1, |m| m.experts)),
        ("moe_intermediate_size", moe.map_or(1, |m| m.inter)),
    ];
    for (field, v) in widths {
        check_width(field, v)?;
    }
    if c.max_positions > MAX_POSITIONS {
        let why = format!("exceeds the largest context served, {MAX_POSITIONS} positions");
        return Err(too_large("max_position_embeddings", c.max_positions, why));
    }
    let weights = weight_count(c);
    if weights > MAX_WEIGHTS {
        let why = format!("the config implies {weights} weights, more than {MAX_WEIGHTS} (what any device holds)");
        return Err(too_large("hidden_size", c.hidden, why));
    }
    let stream = full_stream_bytes(c);
    if stream > MAX_STREAM_BYTES {
        let why = format!("one stream at the full context needs {stream} bytes, more than {MAX_STREAM_BYTES}");
        return Err(too_large("max_position_embeddings", c.max_positions, why));
    }
    Ok(())
}

/// Refuses one width past [`MAX_WIDTH`] by name (called as fields are read, before anything derives from them).
pub(crate) fn check_width(field: &'static str, v: usize) -> Result<(), ConfigError> {
    if v > MAX_WIDTH {
        return Err(too_large(field, v, format!("exceeds the largest width served, {MAX_WIDTH}")));
    }
    Ok(())
}

/// Weight elements the config implies (embedding, head, every layer's mixer and FFN), in u128.
fn weight_count(c: &ModelConfig) -> u128 {
    let w = |x: usize| x as u128;
    let (h, v) = (w(c.hidden), w(c.vocab));
    let q = w(c.heads) * w(c.head_dim);
    let kv = w(c.kv_heads) * w(c.head_dim);
    let attn = h * (2 * q + 2 * kv);
    let conv = h * 3 * h + h * w(c.conv_taps) + h * h;
    let dense = 3 * h * w(c.dense_inter);
    let moe = c.moe.as_ref().map_or(0, |m| 3 * h * w(m.inter) * w(m.experts) + h * w(m.experts));
    let layers: u128 = (0..c.layers.len())
        .map(|i| {
            let mixer = if c.layers[i] == Mixer::Attention { attn } else { conv };
            mixer + if c.is_moe_layer(i) { moe } else { dense }
        })
        .sum();
    v * h * if c.tied { 1 } else { 2 } + layers
}

/// The per-stream estimate at the full context, in u128: `Model::stream_bytes`' formula without a drafter, with
/// verify windows of `KEEP_ROWS` rows (the most a stream keeps: an upper bound).
fn full_stream_bytes(c: &ModelConfig) -> u128 {
    let w = |x: usize| x as u128;
    let attn = w(c.layers.iter().filter(|m| **m == Mixer::Attention).count());
    let conv = w(c.layers.len()) - attn;
    let kv = attn * 2 * w(c.kv_heads) * w(c.head_dim) * 4 * w(c.max_positions);
    let ffn = c.moe.as_ref().map_or(w(c.dense_inter), |m| w(m.inter) * w(m.top_k));
    let scratch = 4 * (8 * w(c.hidden) + w(c.vocab) + 3 * ffn);
    let window = (w(c.conv_taps) * 2 + 64) * w(c.hidden) * 4;
    kv + conv * window + scratch
}

fn too_large(field: &'static str, value: usize, why: String) -> ConfigError {
    ConfigError::Invalid { field, value: value.to_string(), why }
}
