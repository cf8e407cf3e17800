//! Binds a DSpark drafter checkpoint's tensors (released names, optional `model.` prefix) to the
//! admitted drafter config: shapes checked, missing and unexpected tensors refused by name.

use super::config::DrafterConfig;
use crate::checkpoint::{StoredDtype, TensorTable};
use crate::weights::{Binder, WeightError, to_f32, to_mat};
use tensorfold_kernels::{Backend, MatView, backend::Ffn};

/// One Qwen3-style drafter layer.
pub struct DrafterLayer<B: Backend> {
    /// `input_layernorm.weight` `[d]`.
    pub in_norm: B::Buf,
    /// `self_attn.q_proj.weight` `[heads*hd, d]`.
    pub q: B::Mat,
    /// `self_attn.k_proj.weight` `[kv_heads*hd, d]`.
    pub k: B::Mat,
    /// `self_attn.v_proj.weight` `[kv_heads*hd, d]`.
    pub v: B::Mat,
    /// `self_attn.o_proj.weight` `[d, heads*hd]`.
    pub o: B::Mat,
    /// `self_attn.q_norm.weight` `[hd]`.
    pub q_norm: B::Buf,
    /// `self_attn.k_norm.weight` `[hd]`.
    pub k_norm: B::Buf,
    /// `post_attention_layernorm.weight` `[d]`.
    pub post_norm: B::Buf,
    /// `mlp.{gate,up,down}_proj` as a SwiGLU (`w1` gate, `w3` up, `w2` down).
    pub mlp: Ffn<B::Mat>,
}

/// Every drafter weight on the device. The embedding and output head are the target's.
pub struct DrafterWeights<B: Backend> {
    /// `fc.weight` `[d, m*d]` split by tap into m matrices `[d, d]` (column block j reads tap j).
    pub fc: Vec<B::Mat>,
    /// `hidden_norm.weight` `[d]`.
    pub hidden_norm: B::Buf,
    /// The layers.
    pub layers: Vec<DrafterLayer<B>>,
    /// `norm.weight` `[d]`: the final norm before the target's head.
    pub norm: B::Buf,
    /// `markov_head.markov_w1.weight` `[V, r]`: a table gathered at the previous token.
    pub markov_w1: B::Mat,
    /// `markov_head.markov_w2.weight` `[V, r]`: the rank -> vocab projection.
    pub markov_w2: B::Mat,
    /// `confidence_head.proj.weight` `[1, d + r]` split into its `[1, d]` and `[1, r]` parts, and its bias.
    pub confidence: Option<(B::Mat, B::Mat, f32)>,
}

/// The table with any `model.` prefix stripped from its names; a name stored both ways is refused.
fn strip_prefix(table: &TensorTable) -> Result<TensorTable, WeightError> {
    let mut tensors = std::collections::BTreeMap::new();
    for (k, v) in &table.tensors {
        let name = k.strip_prefix("model.").unwrap_or(k).to_string();
        if tensors.insert(name.clone(), v.clone()).is_some() {
            return Err(WeightError::Unexpected(format!("{name} (stored both with and without `model.`)")));
        }
    }
    Ok(TensorTable { tensors, files: table.files.clone() })
}

/// Weight format of the drafter's linears (`--drafter-bits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DrafterBits {
    /// As released (bf16, or whatever the checkpoint stores).
    #[default]
    Stored,
    /// 8-bit affine codes in groups of 64 columns (32, 16 or the whole row where the width needs), quantized
    /// at load.
    Eight,
}

/// 8-bit affine codes in groups of 64 columns (32 or 16 where the width needs; one group a row else).
fn q8(v: &MatView) -> MatView {
    [64, 32, 16, v.cols].into_iter().find_map(|g| v.quantize_q8(g)).expect("a row is always one group")
}

/// A linear's binder: quantizes to 8-bit affine codes when asked.
struct Linears<'a, 'b, B: Backend> {
    b: &'b mut Binder<'a, B>,
    bits: DrafterBits,
}

impl<B: Backend> Linears<'_, '_, B> {
    fn mat(&mut self, name: &str, rows: usize, cols: usize) -> Result<B::Mat, WeightError> {
        let v = self.b.view(name, rows, cols)?;
        let v = match self.bits {
            DrafterBits::Stored => v,
            DrafterBits::Eight => q8(&v),
        };
        self.b.upload(name, &v)
    }
}

/// Binds and uploads every drafter tensor; `bits` quantizes the linears (fc, the layers' projections and
/// MLPs, the Markov head's rank -> vocab projection) at load.
pub fn bind<B: Backend>(
    c: &DrafterConfig,
    table: &TensorTable,
    backend: &B,
    bits: DrafterBits,
) -> Result<DrafterWeights<B>, WeightError> {
    let table = strip_prefix(table)?;
    let mut b = Binder::new(&table, backend);
    b.finite = false;
    let (d, m, r, v) = (c.hidden, c.taps.len(), c.markov_rank, c.vocab);
    let fc = split_columns(&mut b, "fc.weight", d, m, d, bits)?;
    let hidden_norm = b.vec("hidden_norm.weight", &[d])?;
    let layers = (0..c.layers).map(|i| bind_layer(c, &mut b, i, bits)).collect::<Result<Vec<_>, _>>()?;
    let norm = b.vec("norm.weight", &[d])?;
    let markov_w1 = b.mat("markov_head.markov_w1.weight", v, r)?;
    let markov_w2 = Linears { b: &mut b, bits }.mat("markov_head.markov_w2.weight", v, r)?;
    let confidence = if c.confidence {
        let split = split_at(&mut b, "confidence_head.proj.weight", d, r)?;
        let bias = if table.tensors.contains_key("confidence_head.proj.bias") {
            to_f32(b.entry("confidence_head.proj.bias", &[1])?)[0]
        } else {
            0.0
        };
        Some((split.0, split.1, bias))
    } else {
        None
    };
    b.finish()?;
    Ok(DrafterWeights { fc, hidden_norm, layers, norm, markov_w1, markov_w2, confidence })
}

fn bind_layer<B: Backend>(
    c: &DrafterConfig,
    b: &mut Binder<B>,
    i: usize,
    bits: DrafterBits,
) -> Result<DrafterLayer<B>, WeightError> {
    let p = format!("layers.{i}");
    let (d, qd, kd) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
    let in_norm = b.vec(&format!("{p}.input_layernorm.weight"), &[d])?;
    let q_norm = b.vec(&format!("{p}.self_attn.q_norm.weight"), &[c.head_dim])?;
    let k_norm = b.vec(&format!("{p}.self_attn.k_norm.weight"), &[c.head_dim])?;
    let post_norm = b.vec(&format!("{p}.post_attention_layernorm.weight"), &[d])?;
    let mut l = Linears { b, bits };
    Ok(DrafterLayer {
        in_norm,
        q: l.mat(&format!("{p}.self_attn.q_proj.weight"), qd, d)?,
        k: l.mat(&format!("{p}.self_attn.k_proj.weight"), kd, d)?,
        v: l.mat(&format!("{p}.self_attn.v_proj.weight"), kd, d)?,
        o: l.mat(&format!("{p}.self_attn.o_proj.weight"), d, qd)?,
        q_norm,
        k_norm,
        post_norm,
        mlp: Ffn {
            w1: l.mat(&format!("{p}.mlp.gate_proj.weight"), c.inter, d)?,
            w3: l.mat(&format!("{p}.mlp.up_proj.weight"), c.inter, d)?,
            w2: l.mat(&format!("{p}.mlp.down_proj.weight"), d, c.inter)?,
        },
    })
}

/// Column block `j` of a `[rows, parts*cols]` tensor as `parts` matrices `[rows, cols]` (copies; bf16 stays bf16).
fn split_columns<B: Backend>(
    b: &mut Binder<B>,
    name: &str,
    rows: usize,
    parts: usize,
    cols: usize,
    bits: DrafterBits,
) -> Result<Vec<B::Mat>, WeightError> {
    let e = b.entry(name, &[rows, parts * cols])?.clone();
    let whole = to_mat(&e, rows, parts * cols);
    (0..parts)
        .map(|j| {
            let view = column_block(&whole, e.dtype, j * cols, cols);
            let view = match bits {
                DrafterBits::Stored => view,
                DrafterBits::Eight => q8(&view),
            };
            b.upload(name, &view)
        })
        .collect()
}

/// A `[1, a + c]` row split into `[1, a]` and `[1, c]`.
fn split_at<B: Backend>(b: &mut Binder<B>, name: &str, a: usize, c: usize) -> Result<(B::Mat, B::Mat), WeightError> {
    let e = b.entry(name, &[1, a + c])?.clone();
    let whole = to_mat(&e, 1, a + c);
    let up =
        |v: MatView| b.backend.upload_mat(&v).map_err(|source| WeightError::Upload { name: name.to_string(), source });
    Ok((up(column_block(&whole, e.dtype, 0, a))?, up(column_block(&whole, e.dtype, a, c))?))
}

/// Columns `[start, start + cols)` of every row, copied into a new matrix of the view's element type.
fn column_block(w: &MatView, stored: StoredDtype, start: usize, cols: usize) -> MatView {
    let bytes = w.bytes.as_slice();
    if stored == StoredDtype::Bf16 {
        let bits: Vec<u16> = (0..w.rows)
            .flat_map(|r| (start..start + cols).map(move |c| (r * w.cols + c) * 2))
            .map(|i| u16::from_le_bytes([bytes[i], bytes[i + 1]]))
            .collect();
        MatView::from_bf16_bits(w.rows, cols, &bits)
    } else {
        let vals: Vec<f32> = (0..w.rows).flat_map(|r| (start..start + cols).map(move |c| w.get(r, c))).collect();
        MatView::from_f32(w.rows, cols, &vals)
    }
}
