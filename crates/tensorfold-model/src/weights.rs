//! Binds checkpoint tensors to the LFM2 / LFM2-MoE layer structure: names, layouts (per-expert or fused
//! experts, tied or untied head), shapes checked against the config, missing and unexpected tensors refused.

use crate::checkpoint::{StoredDtype, TensorEntry, TensorTable};
use crate::config::{Mixer, ModelConfig};
pub use crate::layers::{AttnWeights, ConvWeights, FfnWeights, LayerWeights, MixerWeights};
use crate::quant::QuantConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use tensorfold_kernels::bytes::Affine;
use tensorfold_kernels::{Backend, Dtype, HostBytes, KernelError, MatView, backend::Ffn};

/// A tensor that does not fit the admitted config.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    /// A tensor the config requires is absent.
    #[error("tensor {0} is missing from the checkpoint")]
    Missing(String),
    /// A tensor the config does not use is present (a wrong config, or a layout we do not know).
    #[error("unexpected tensor {0}: the config does not use it (wrong config or unsupported layout)")]
    Unexpected(String),
    /// A tensor's shape disagrees with the config.
    #[error("tensor {name} has shape {got:?}, the config implies {want:?}")]
    Shape { name: String, got: Vec<usize>, want: Vec<usize> },
    /// The device refused a matrix.
    #[error("uploading {name}: {source}")]
    Upload { name: String, source: KernelError },
    /// A weight is NaN or infinite (a damaged or badly converted checkpoint: every request would fail).
    #[error("tensor {name} holds a non-finite value (NaN or inf) at element {index}")]
    NonFinite { name: String, index: usize },
    /// A tensor's dtype does not fit its role (codes outside a quantized module, float codes, integer scales).
    #[error("tensor {name} has dtype {dtype}: {why}")]
    Dtype { name: String, dtype: &'static str, why: &'static str },
    /// A quantized module that disagrees with `config.json`'s quantization (codes the config says are float, an
    /// override naming no module, a group size that does not divide the input width).
    #[error("quantized module {module}: {why}")]
    Quant { module: String, why: String },
}

/// Every weight of the model on the device.
pub struct Weights<B: Backend> {
    /// `model.embed_tokens.weight` `[vocab, h]`.
    pub embed: B::Mat,
    /// `lm_head.weight` `[vocab, h]`; `None` when tied to `embed`.
    pub head: Option<B::Mat>,
    /// `model.embedding_norm.weight` `[h]` (the final norm).
    pub final_norm: B::Buf,
    /// Decoder layers.
    pub layers: Vec<LayerWeights<B>>,
}

/// Tracks which tensors were used, so leftovers are refused.
pub(crate) struct Binder<'a, B: Backend> {
    pub(crate) table: &'a TensorTable,
    pub(crate) used: BTreeSet<String>,
    pub(crate) backend: &'a B,
    /// The MoE experts this device holds (expert parallelism); the others are shape-checked, marked used, and left
    /// on the host.
    pub(crate) owned: Range<usize>,
    /// `config.json`'s MLX quantization; `None` for a float checkpoint.
    pub(crate) quant: Option<QuantConfig>,
    /// Every matrix module bound (`name` less `.weight`), so an override naming none is refused.
    pub(crate) modules: BTreeSet<String>,
    /// Stacked `[E, rows, cols]` matrices viewed whole once (MLX `switch_mlp`), sliced per expert.
    stacks: BTreeMap<String, MatView>,
    /// Refuse non-finite values at bind (the target). The drafter's binder leaves it off: a non-finite drafter
    /// block is refused at run time, per stream, and drafting goes on without it (`docs/architecture.md`).
    pub(crate) finite: bool,
}

impl<'a, B: Backend> Binder<'a, B> {
    /// A binder over `table` with nothing used yet.
    pub(crate) fn new(table: &'a TensorTable, backend: &'a B) -> Self {
        let (used, modules, stacks) = (BTreeSet::new(), BTreeSet::new(), BTreeMap::new());
        Self { table, used, backend, owned: 0..usize::MAX, quant: None, modules, stacks, finite: true }
    }

    /// Refuses the first tensor no binding used, then the first quantization override naming no matrix bound.
    pub(crate) fn finish(&self) -> Result<(), WeightError> {
        if let Some(extra) = self.table.tensors.keys().find(|k| !self.used.contains(*k)) {
            return Err(WeightError::Unexpected(extra.clone()));
        }
        let overrides = self.quant.as_ref().map(|q| q.overrides.keys()).into_iter().flatten();
        match overrides.into_iter().find(|m| !self.modules.contains(*m)) {
            Some(m) => Err(WeightError::Quant {
                module: m.clone(),
                why: "config.json's quantization names it, but the model has no such matrix".into(),
            }),
            None => Ok(()),
        }
    }

    /// A float tensor of shape `want` (marked used); codes (U32) are refused here: only a quantized module has them.
    pub(crate) fn entry(&mut self, name: &str, want: &[usize]) -> Result<&TensorEntry, WeightError> {
        self.entry_of(name, want, false)
    }

    fn entry_of(&mut self, name: &str, want: &[usize], codes: bool) -> Result<&TensorEntry, WeightError> {
        let e = self.table.tensors.get(name).ok_or_else(|| WeightError::Missing(name.to_string()))?;
        if e.shape != want {
            return Err(WeightError::Shape { name: name.to_string(), got: e.shape.clone(), want: want.to_vec() });
        }
        let why = match (codes, e.dtype == StoredDtype::U32) {
            (false, true) => Some("U32 codes without a `.scales` beside them (codes belong to a quantized module)"),
            (true, false) => Some("a quantized module's weight must be U32 codes, as mlx-lm writes them"),
            _ => None,
        };
        if let Some(why) = why {
            return Err(WeightError::Dtype { name: name.to_string(), dtype: e.dtype.as_str(), why });
        }
        // A full scan by exponent bits: one pass over bytes the upload reads anyway (bounded by the weights' size).
        if let Some(index) = first_nonfinite(e).filter(|_| self.finite) {
            return Err(WeightError::NonFinite { name: name.to_string(), index });
        }
        self.used.insert(name.to_string());
        Ok(e)
    }

    pub(crate) fn mat(&mut self, name: &str, rows: usize, cols: usize) -> Result<B::Mat, WeightError> {
        let view = self.view(name, rows, cols)?;
        self.upload(name, &view)
    }

    /// The host view of a `[rows, cols]` matrix `name` (`MODULE.weight`; shape checked, marked used): float as
    /// stored, or MLX affine codes when `MODULE.scales` exists ([`Binder::stack_view`]).
    pub(crate) fn view(&mut self, name: &str, rows: usize, cols: usize) -> Result<MatView, WeightError> {
        self.stack_view(name, &[], rows, cols)
    }

    /// The host view of matrix `name` of shape `lead ++ [rows, cols]` as one `[prod(lead) * rows, cols]` matrix:
    /// float as stored, or, when `MODULE.scales` exists, MLX affine codes (`weight` U32 `[.., rows, cols * bits /
    /// 32]`, `scales` and `biases` `[.., rows, cols / group]` in a float dtype, widened to f32 exactly), the codes
    /// zero-copy in the mapped file.
    fn stack_view(&mut self, name: &str, lead: &[usize], rows: usize, cols: usize) -> Result<MatView, WeightError> {
        let module = name.strip_suffix(".weight").unwrap_or(name).to_string();
        self.modules.insert(module.clone());
        let n = lead.iter().product::<usize>() * rows;
        let shape = |last: usize| [lead, &[rows, last]].concat();
        let scales = format!("{module}.scales");
        let configured = self.quant.as_ref().and_then(|q| q.overrides.get(&module).copied().flatten());
        if !self.table.tensors.contains_key(&scales) {
            if configured.is_some() {
                let why = "config.json's quantization names it, but the checkpoint stores no `.scales` for it".into();
                return Err(WeightError::Quant { module, why });
            }
            let e = self.entry(name, &shape(cols))?.clone();
            return Ok(to_mat(&e, n, cols));
        }
        let quant_err = |why: String| WeightError::Quant { module: module.clone(), why };
        let p = self.quant.as_ref().and_then(|q| q.params(&module)).ok_or_else(|| {
            quant_err("the checkpoint stores codes and scales, but config.json's quantization keeps it float".into())
        })?;
        if !cols.is_multiple_of(p.group) {
            return Err(quant_err(format!("group size {} does not divide its input width {cols}", p.group)));
        }
        let codes = self.entry_of(name, &shape(cols * p.bits as usize / 32), true)?.bytes.clone();
        let groups = shape(cols / p.group);
        let scales = self.affine_part(&scales, &groups)?;
        let biases = self.affine_part(&format!("{module}.biases"), &groups)?;
        let affine = Affine { group: p.group, scales, biases };
        MatView::quantized(n, cols, p.dtype(), codes, affine)
            .ok_or_else(|| quant_err(format!("codes disagree with {} bits at [{n}, {cols}]", p.bits)))
    }

    /// A quantized module's `scales` or `biases` (a float dtype, shape `want`) widened to f32 exactly.
    fn affine_part(&mut self, name: &str, want: &[usize]) -> Result<HostBytes, WeightError> {
        let e = self.entry(name, want)?;
        Ok(match e.dtype {
            StoredDtype::F32 => e.bytes.clone(),
            _ => HostBytes::from_f32(&to_f32(e)),
        })
    }

    /// Uploads a host view.
    pub(crate) fn upload(&self, name: &str, view: &MatView) -> Result<B::Mat, WeightError> {
        self.backend.upload_mat(view).map_err(|source| WeightError::Upload { name: name.to_string(), source })
    }

    /// Rows `[start, start+count)` of expert `e` of a stacked `[experts, rows, cols]` matrix (float, or MLX codes).
    fn stacked(
        &mut self,
        name: &str,
        shape: [usize; 3],
        e: usize,
        start: usize,
        count: usize,
    ) -> Result<B::Mat, WeightError> {
        let full = match self.stacks.get(name) {
            Some(v) => v.clone(),
            None => {
                let v = self.stack_view(name, &shape[..1], shape[1], shape[2])?;
                self.stacks.insert(name.to_string(), v.clone());
                v
            }
        };
        let view = full.row_range(e * shape[1] + start, count).expect("in range: shape checked");
        self.backend.upload_mat(&view).map_err(|source| WeightError::Upload { name: name.to_string(), source })
    }

    pub(crate) fn vec(&mut self, name: &str, shape: &[usize]) -> Result<B::Buf, WeightError> {
        let values = to_f32(self.entry(name, shape)?);
        Ok(self.backend.upload(&values))
    }

    pub(crate) fn opt_vec(&mut self, on: bool, name: &str, len: usize) -> Result<Option<B::Buf>, WeightError> {
        if on { self.vec(name, &[len]).map(Some) } else { Ok(None) }
    }
}

/// The index of the first NaN or infinity in a stored tensor (all exponent bits set: f32 `0x7F80_0000`, bf16
/// `0x7F80`, f16 `0x7C00`), `None` when every value is finite.
pub fn first_nonfinite(e: &TensorEntry) -> Option<usize> {
    let b = e.bytes.as_slice();
    let half = |mask: u16| b.chunks_exact(2).position(|c| u16::from_le_bytes([c[0], c[1]]) & mask == mask);
    match e.dtype {
        StoredDtype::F32 => {
            let mask = 0x7F80_0000u32;
            b.chunks_exact(4).position(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & mask == mask)
        }
        StoredDtype::Bf16 => half(0x7F80),
        StoredDtype::F16 => half(0x7C00),
        StoredDtype::U32 => None, // MLX affine codes: integers, never non-finite
    }
}

/// Widens any stored dtype to f32 values.
pub fn to_f32(e: &TensorEntry) -> Vec<f32> {
    let b = e.bytes.as_slice();
    match e.dtype {
        StoredDtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        StoredDtype::Bf16 => {
            b.chunks_exact(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)).collect()
        }
        StoredDtype::F16 => {
            b.chunks_exact(2).map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect()
        }
        // Never reached through a binder (codes are refused outside a quantized module); the words' values.
        StoredDtype::U32 => b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32).collect(),
    }
}

/// A matrix view of a tensor: bf16 and f32 stay zero-copy; f16 is widened to f32 (exact).
pub(crate) fn to_mat(e: &TensorEntry, rows: usize, cols: usize) -> MatView {
    let (dtype, bytes) = match e.dtype {
        StoredDtype::Bf16 => (Dtype::Bf16, e.bytes.clone()),
        StoredDtype::F32 => (Dtype::F32, e.bytes.clone()),
        StoredDtype::F16 | StoredDtype::U32 => (Dtype::F32, HostBytes::from_f32(&to_f32(e))),
    };
    MatView::new(rows, cols, dtype, bytes).expect("byte length matches the checked shape")
}

/// Binds and uploads every tensor; refuses missing, misshapen and unexpected tensors by name.
pub fn bind<B: Backend>(cfg: &ModelConfig, table: &TensorTable, backend: &B) -> Result<Weights<B>, WeightError> {
    bind_owning(cfg, table, backend, 0..usize::MAX)
}

/// [`bind`] holding only MoE experts `owned` of each MoE layer on `backend` (expert parallelism's rank 0; the
/// others' experts are shape-checked and marked used, so a missing or misshapen one is still refused).
pub fn bind_owning<B: Backend>(
    cfg: &ModelConfig,
    table: &TensorTable,
    backend: &B,
    owned: Range<usize>,
) -> Result<Weights<B>, WeightError> {
    let mut b = Binder::new(table, backend);
    b.owned = owned;
    b.quant = cfg.quant.clone();
    let (h, v) = (cfg.hidden, cfg.vocab);
    let embed = b.mat("model.embed_tokens.weight", v, h)?;
    let head = if cfg.tied { None } else { Some(b.mat("lm_head.weight", v, h)?) };
    let final_norm = b.vec("model.embedding_norm.weight", &[h])?;
    let layers = (0..cfg.layers.len()).map(|i| bind_layer(cfg, &mut b, i)).collect::<Result<Vec<_>, _>>()?;
    b.finish()?;
    Ok(Weights { embed, head, final_norm, layers })
}

fn bind_layer<B: Backend>(cfg: &ModelConfig, b: &mut Binder<B>, i: usize) -> Result<LayerWeights<B>, WeightError> {
    let p = format!("model.layers.{i}");
    let h = cfg.hidden;
    let mixer = match cfg.layers[i] {
        Mixer::Conv => {
            let bias = cfg.conv_bias;
            let taps = cfg.conv_taps;
            MixerWeights::Conv(ConvWeights {
                in_proj: b.mat(&format!("{p}.conv.in_proj.weight"), 3 * h, h)?,
                in_bias: b.opt_vec(bias, &format!("{p}.conv.in_proj.bias"), 3 * h)?,
                kernel: conv_kernel(b, &format!("{p}.conv.conv.weight"), h, taps)?,
                kernel_bias: b.opt_vec(bias, &format!("{p}.conv.conv.bias"), h)?,
                out_proj: b.mat(&format!("{p}.conv.out_proj.weight"), h, h)?,
                out_bias: b.opt_vec(bias, &format!("{p}.conv.out_proj.bias"), h)?,
            })
        }
        Mixer::Attention => {
            let (qd, kd) = (cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
            MixerWeights::Attn(AttnWeights {
                q: b.mat(&format!("{p}.self_attn.q_proj.weight"), qd, h)?,
                k: b.mat(&format!("{p}.self_attn.k_proj.weight"), kd, h)?,
                v: b.mat(&format!("{p}.self_attn.v_proj.weight"), kd, h)?,
                o: b.mat(&format!("{p}.self_attn.out_proj.weight"), h, qd)?,
                q_norm: b.vec(&format!("{p}.self_attn.q_layernorm.weight"), &[cfg.head_dim])?,
                k_norm: b.vec(&format!("{p}.self_attn.k_layernorm.weight"), &[cfg.head_dim])?,
            })
        }
    };
    let ffn = match &cfg.moe {
        Some(m) if i >= m.dense_layers => {
            let f = format!("{p}.feed_forward");
            FfnWeights::Moe {
                gate: b.mat(&format!("{f}.gate.weight"), m.experts, h)?,
                bias: b.opt_vec(m.use_expert_bias, &format!("{f}.expert_bias"), m.experts)?,
                experts: bind_experts(b, &f, m.experts, m.inter, h)?,
            }
        }
        _ => FfnWeights::Dense(dense(b, &format!("{p}.feed_forward"), cfg.dense_inter, h)?),
    };
    Ok(LayerWeights {
        operator_norm: b.vec(&format!("{p}.operator_norm.weight"), &[h])?,
        ffn_norm: b.vec(&format!("{p}.ffn_norm.weight"), &[h])?,
        mixer,
        ffn,
    })
}

/// The depthwise conv kernel `[h, 1, taps]` as transformers stores it, or `[h, taps, 1]` as mlx-lm's sanitize
/// transposes it (the same values in the same order).
fn conv_kernel<B: Backend>(b: &mut Binder<B>, name: &str, h: usize, taps: usize) -> Result<B::Buf, WeightError> {
    let mlx = b.table.tensors.get(name).is_some_and(|e| e.shape == [h, taps, 1]);
    let shape = if mlx { [h, taps, 1] } else { [h, 1, taps] };
    b.vec(name, &shape)
}

/// A SwiGLU FFN: `w1` / `w3` / `w2` as released, or `gate_proj` / `up_proj` / `down_proj` as mlx-lm's LFM2-MoE
/// sanitize renames them.
fn dense<B: Backend>(b: &mut Binder<B>, p: &str, inter: usize, h: usize) -> Result<Ffn<B::Mat>, WeightError> {
    let mlx = b.table.tensors.contains_key(&format!("{p}.gate_proj.weight"));
    let [n1, n3, n2] = if mlx { ["gate_proj", "up_proj", "down_proj"] } else { ["w1", "w3", "w2"] };
    Ok(Ffn {
        w1: b.mat(&format!("{p}.{n1}.weight"), inter, h)?,
        w3: b.mat(&format!("{p}.{n3}.weight"), inter, h)?,
        w2: b.mat(&format!("{p}.{n2}.weight"), h, inter)?,
    })
}

/// Experts as released (`experts.{e}.w1/w3/w2.weight`) or fused as transformers 5 writes them
/// (`experts.gate_up_proj` `[E, 2I, h]`, gate rows first, and `experts.down_proj` `[E, h, I]`).
fn bind_experts<B: Backend>(
    b: &mut Binder<B>,
    f: &str,
    n: usize,
    inter: usize,
    h: usize,
) -> Result<Vec<Ffn<B::Mat>>, WeightError> {
    let fused = format!("{f}.experts.gate_up_proj");
    let owned = b.owned.start.min(n)..b.owned.end.min(n);
    if b.table.tensors.contains_key(&format!("{f}.switch_mlp.gate_proj.weight")) {
        return switch_mlp(b, f, [n, inter, h], owned);
    }
    if !b.table.tensors.contains_key(&fused) {
        for e in (0..n).filter(|e| !owned.contains(e)) {
            for (w, shape) in [("w1", [inter, h]), ("w3", [inter, h]), ("w2", [h, inter])] {
                b.entry(&format!("{f}.experts.{e}.{w}.weight"), &shape)?;
            }
        }
        return owned.map(|e| dense(b, &format!("{f}.experts.{e}"), inter, h)).collect();
    }
    let down = format!("{f}.experts.down_proj");
    b.entry(&fused, &[n, 2 * inter, h])?;
    b.entry(&down, &[n, h, inter])?;
    owned
        .map(|e| {
            Ok(Ffn {
                w1: b.stacked(&fused, [n, 2 * inter, h], e, 0, inter)?,
                w3: b.stacked(&fused, [n, 2 * inter, h], e, inter, inter)?,
                w2: b.stacked(&down, [n, h, inter], e, 0, h)?,
            })
        })
        .collect()
}

/// Experts stacked as mlx-lm writes them: `switch_mlp.{gate,up,down}_proj.weight` `[E, I, h]`, `[E, I, h]`,
/// `[E, h, I]` (float, or codes with `scales` and `biases` stacked alike). The whole stacks are checked once; the
/// `owned` experts are uploaded.
fn switch_mlp<B: Backend>(
    b: &mut Binder<B>,
    f: &str,
    [n, inter, h]: [usize; 3],
    owned: Range<usize>,
) -> Result<Vec<Ffn<B::Mat>>, WeightError> {
    let name = |p: &str| format!("{f}.switch_mlp.{p}.weight");
    owned
        .map(|e| {
            Ok(Ffn {
                w1: b.stacked(&name("gate_proj"), [n, inter, h], e, 0, inter)?,
                w3: b.stacked(&name("up_proj"), [n, inter, h], e, 0, inter)?,
                w2: b.stacked(&name("down_proj"), [n, h, inter], e, 0, h)?,
            })
        })
        .collect::<Result<Vec<_>, WeightError>>()
        .and_then(|v| {
            // Experts this device does not own are still checked whole (the stack views above cover every expert).
            for p in ["gate_proj", "up_proj", "down_proj"] {
                let shape = if p == "down_proj" { [n, h, inter] } else { [n, inter, h] };
                if !b.stacks.contains_key(&name(p)) {
                    let v = b.stack_view(&name(p), &shape[..1], shape[1], shape[2])?;
                    b.stacks.insert(name(p), v);
                }
            }
            Ok(v)
        })
}

/// One device's experts of every layer, in layer order: `None` for a dense layer.
pub type LayerExperts<B> = Vec<Option<Vec<Ffn<<B as tensorfold_kernels::backend::Memory>::Mat>>>>;

/// The experts `owned` of every MoE layer on `backend` (expert parallelism's ranks past 0), in layer order: `None` for
/// a dense layer. Shapes are checked as [`bind`] checks them; unused tensors are rank 0's to refuse.
pub fn bind_experts_only<B: Backend>(
    cfg: &ModelConfig,
    table: &TensorTable,
    backend: &B,
    owned: Range<usize>,
) -> Result<LayerExperts<B>, WeightError> {
    let mut b = Binder::new(table, backend);
    b.owned = owned;
    b.quant = cfg.quant.clone();
    (0..cfg.layers.len())
        .map(|i| match &cfg.moe {
            Some(m) if i >= m.dense_layers => {
                bind_experts(&mut b, &format!("model.layers.{i}.feed_forward"), m.experts, m.inter, cfg.hidden)
                    .map(Some)
            }
            _ => Ok(None),
        })
        .collect()
}
