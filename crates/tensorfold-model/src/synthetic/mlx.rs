//! Synthetic checkpoints in mlx-lm's quantized layout: the `-mlx4` / `-mlx8` presets' `quantization` block and
//! seeded codes, scales and biases for every matrix mlx-lm's `convert -q` quantizes.
//!
//! mlx-lm's rule (`mlx_lm.utils.quantize_model`, `lfm2_moe.py`): every linear and the embedding whose input width
//! divides into groups is quantized at the checkpoint-wide bits and group size; LFM2-MoE's routers
//! (`feed_forward.gate`) are overridden to 8 bits, group 64; the conv kernel and the norms stay float. A matrix whose
//! float form would be uniform in `[-a, a]` gets codes uniform in `[0, 2^bits)`, a scale per group of
//! `2a / (2^bits - 1)` times a seeded factor in `[0.75, 1.25)` and the bias that centres the codes, so activations
//! keep the float presets' scale.

use super::{Fill, name_key, splitmix, zeroed_words};
use crate::checkpoint::CheckpointError;
use crate::quant::QuantConfig;
use rayon::prelude::*;
use serde_json::{Value, json};
use tensorfold_kernels::HostBytes;

/// Preset suffixes and their code widths: `lfm2.5-24b-a2b-mlx4` is the 24B shape at 4 bits.
pub(super) const QUANT_SUFFIXES: [(&str, u32); 2] = [("-mlx4", 4), ("-mlx8", 8)];

/// mlx-lm's default group size (`--q-group-size`), used by the presets.
const GROUP: usize = 64;

/// The router override mlx-lm's LFM2-MoE conversion writes (8 bits, group 64).
const ROUTER: (u32, usize) = (8, 64);

/// A preset's `config.json` with mlx-lm's `quantization` block (and its `quantization_config` mirror) at `bits`,
/// group 64, every MoE layer's router at 8 bits. Errors: a preset that is not a JSON object (named).
pub(super) fn quantized_config(json: &[u8], bits: u32) -> Result<Vec<u8>, CheckpointError> {
    let bad = |why: &str| CheckpointError::Synthetic(format!("preset config {why}"));
    let mut v: Value = serde_json::from_slice(json).map_err(|e| bad(&e.to_string()))?;
    let o = v.as_object_mut().ok_or_else(|| bad("is not an object"))?;
    let layers = o.get("num_hidden_layers").and_then(Value::as_u64).unwrap_or(0);
    let dense = o.get("num_dense_layers").and_then(Value::as_u64);
    let mut q = json!({ "group_size": GROUP, "bits": bits, "mode": "affine" });
    // Only MoE configs have routers: layers from num_dense_layers on.
    if let (Some(dense), Some(m)) = (dense.filter(|_| o.contains_key("num_experts")), q.as_object_mut()) {
        for i in dense..layers {
            m.insert(
                format!("model.layers.{i}.feed_forward.gate"),
                json!({ "group_size": ROUTER.1, "bits": ROUTER.0 }),
            );
        }
    }
    o.insert("quantization".into(), q.clone());
    o.insert("quantization_config".into(), q);
    serde_json::to_vec_pretty(&v).map_err(|e| bad(&e.to_string()))
}

/// `float` (mlx-lm's naming) with each matrix mlx-lm quantizes replaced by its `weight` codes, `scales` and
/// `biases`; a matrix whose width does not divide into its groups stays float, as mlx-lm leaves it.
pub(super) fn quantize(float: Vec<(String, Vec<usize>, Fill)>, q: &QuantConfig) -> Vec<(String, Vec<usize>, Fill)> {
    let mut out = Vec::with_capacity(float.len() * 3);
    for (name, shape, fill) in float {
        let (Fill::Uniform(a), Some(module)) = (fill, matrix_module(&name, &shape)) else {
            out.push((name, shape, fill));
            continue;
        };
        let k = shape[shape.len() - 1];
        match q.params(module) {
            Some(p) if k.is_multiple_of(p.group) && (k * p.bits as usize).is_multiple_of(32) => {
                let lead = &shape[..shape.len() - 1];
                let with = |last: usize| [lead, &[last]].concat();
                out.push((format!("{module}.weight"), with(k * p.bits as usize / 32), Fill::Codes(p.bits)));
                out.push((format!("{module}.scales"), with(k / p.group), Fill::Scales(a, p.bits)));
                out.push((format!("{module}.biases"), with(k / p.group), Fill::Biases(a, p.bits)));
            }
            _ => out.push((name, shape, fill)),
        }
    }
    out
}

/// The module of a matrix mlx-lm can quantize (a `.weight` of two or more dimensions, not the conv kernel).
fn matrix_module<'a>(name: &'a str, shape: &[usize]) -> Option<&'a str> {
    name.strip_suffix(".weight").filter(|_| shape.len() >= 2 && !name.ends_with("conv.conv.weight"))
}

/// `words` uniform random u32 code words of tensor `name` (every code uniform at any width).
pub(super) fn codes(name: &str, words: usize, key: u64) -> Result<HostBytes, CheckpointError> {
    let mut w = zeroed_words(name, words)?;
    w.par_chunks_mut(1 << 16).enumerate().for_each(|(c, chunk)| {
        for (j, x) in chunk.iter_mut().enumerate() {
            *x = splitmix(key ^ ((c << 16) + j) as u64) as u32;
        }
    });
    let len = words
        .checked_mul(4)
        .ok_or_else(|| CheckpointError::Synthetic(format!("tensor {name}: {words} words overflow")))?;
    HostBytes::from_words(w, len).ok_or_else(|| CheckpointError::Synthetic(format!("tensor {name}: words")))
}

/// The `n` bf16 scales (or, `bias`, the matching biases) of tensor `name` (`MODULE.scales` / `MODULE.biases`): both
/// drawn from the module's key, so a group's bias is `-(2^bits - 1) / 2` times its scale as stored.
pub(super) fn scales(
    name: &str,
    n: usize,
    seed: u64,
    (a, bits): (f32, u32),
    bias: bool,
) -> Result<HostBytes, CheckpointError> {
    let module = name.rsplit_once('.').map_or(name, |(m, _)| m);
    let key = splitmix(seed ^ name_key(module) ^ 0x5ca1e);
    let levels = ((1u32 << bits) - 1) as f32;
    let mut v = super::alloc::<u16>(name, n)?;
    v.par_chunks_mut(1 << 16).enumerate().for_each(|(c, chunk)| {
        for (j, x) in chunk.iter_mut().enumerate() {
            let u = (splitmix(key ^ ((c << 16) + j) as u64) & 0xffff) as f32 / 65536.0;
            let s = half::bf16::from_f32(2.0 * a / levels * (0.75 + 0.5 * u));
            let out = if bias { half::bf16::from_f32(-0.5 * levels * s.to_f32()) } else { s };
            *x = out.to_bits();
        }
    });
    Ok(HostBytes::from_bf16_bits(&v))
}
