//! MLX affine quantization as mlx-lm writes it in `config.json`: the checkpoint-wide bits and group size, per-module
//! overrides keyed by module path, and the values served (4 and 8 bits at groups 32, 64 and 128).

use crate::config::ConfigError;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use tensorfold_kernels::Dtype;

/// Code widths served (MLX affine); mlx-lm can also write 2, 3, 5 and 6, which are refused by name.
pub const SERVED_BITS: [u32; 2] = [4, 8];
/// Group sizes served (mlx-lm's `--q-group-size` choices).
pub const SERVED_GROUPS: [usize; 3] = [32, 64, 128];

/// One module's quantization: `bits` a code, one f32-widened scale and bias per `group` input columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantParams {
    /// Bits a code (4 or 8).
    pub bits: u32,
    /// Input columns a group (32, 64 or 128).
    pub group: usize,
}

impl QuantParams {
    /// The kernels' code dtype.
    pub fn dtype(self) -> Dtype {
        if self.bits == 4 { Dtype::Q4 } else { Dtype::Q8 }
    }

    /// As `inspect` shows it, e.g. `4-bit g64`.
    pub fn describe(self) -> String {
        format!("{}-bit g{}", self.bits, self.group)
    }
}

/// `config.json` `quantization` (mlx-lm; its mirror `quantization_config` is read when only it is present).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantConfig {
    /// The checkpoint-wide parameters (`group_size`, `bits`; `mode` must be `affine`).
    pub default: QuantParams,
    /// Per-module overrides by module path (e.g. `model.layers.2.feed_forward.gate`: mlx-lm keeps every LFM2-MoE
    /// router at 8 bits, group 64); `None` for a module the config marks `false` (kept float).
    pub overrides: BTreeMap<String, Option<QuantParams>>,
}

impl QuantConfig {
    /// Reads the quantization block, or `None` for a float checkpoint. Errors name the module (or `quantization`
    /// for the checkpoint-wide values): a mode other than affine, bits or group size not served, a malformed entry,
    /// a `quantization_config` of another method (`quant_method`: AWQ, GPTQ, bitnet, ... are not served).
    pub fn parse(o: &Map<String, Value>) -> Result<Option<Self>, ConfigError> {
        let block = match (o.get("quantization"), o.get("quantization_config")) {
            (Some(q), _) if !q.is_null() => q,
            (_, Some(q)) if !q.is_null() => {
                if let Some(m) = q.get("quant_method") {
                    return Err(refuse(
                        "quantization_config",
                        format!("quant_method {m} is not served (MLX affine only)"),
                    ));
                }
                q
            }
            _ => return Ok(None),
        };
        let q = block.as_object().ok_or_else(|| refuse("quantization", format!("{block} is not an object")))?;
        let default =
            params("quantization", q)?.ok_or_else(|| refuse("quantization", "lacks group_size or bits".into()))?;
        let mut overrides = BTreeMap::new();
        for (k, v) in q.iter().filter(|(k, _)| !matches!(k.as_str(), "group_size" | "bits" | "mode")) {
            let p = match v {
                Value::Bool(false) => None,
                Value::Bool(true) => Some(default),
                Value::Object(m) => Some(params(k, m)?.ok_or_else(|| refuse(k, "lacks group_size or bits".into()))?),
                other => return Err(refuse(k, format!("{other} is not an object or a boolean"))),
            };
            overrides.insert(k.clone(), p);
        }
        Ok(Some(Self { default, overrides }))
    }

    /// The parameters of `module` (a path such as `model.layers.0.self_attn.q_proj`): its override, else the
    /// checkpoint-wide ones; `None` where the config keeps it float.
    pub fn params(&self, module: &str) -> Option<QuantParams> {
        self.overrides.get(module).copied().unwrap_or(Some(self.default))
    }
}

/// One entry's `group_size`, `bits` and `mode`, checked against what is served; `None` when both are absent.
fn params(module: &str, m: &Map<String, Value>) -> Result<Option<QuantParams>, ConfigError> {
    if let Some(mode) = m.get("mode").filter(|v| !v.is_null())
        && mode.as_str() != Some("affine")
    {
        return Err(refuse(module, format!("mode {mode} is not served (MLX affine only)")));
    }
    let int =
        |k: &str| m.get(k).map(|v| v.as_u64().ok_or_else(|| refuse(module, format!("{k} = {v} is not an integer"))));
    let (bits, group) = match (int("bits").transpose()?, int("group_size").transpose()?) {
        (None, None) => return Ok(None),
        (Some(b), Some(g)) => (b, g),
        _ => return Err(refuse(module, "needs both group_size and bits".into())),
    };
    if !SERVED_BITS.contains(&(bits as u32)) || bits > 8 {
        return Err(refuse(module, format!("bits {bits} is not served (4 and 8 are; MLX affine)")));
    }
    if !SERVED_GROUPS.contains(&(group as usize)) {
        return Err(refuse(module, format!("group_size {group} is not served (32, 64 and 128 are)")));
    }
    Ok(Some(QuantParams { bits: bits as u32, group: group as usize }))
}

fn refuse(module: &str, why: String) -> ConfigError {
    ConfigError::Quantization { module: module.to_string(), why }
}
