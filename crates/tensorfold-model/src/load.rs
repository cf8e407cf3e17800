//! Opening a checkpoint: config admission, generation config, text files, weights bound to a backend.

use crate::checkpoint::{CheckpointError, Source, StoredDtype, TensorTable};
use crate::config::{ConfigError, Mixer, ModelConfig};
use crate::forward::Model;
use crate::weights::{WeightError, bind_owning};
use std::collections::{BTreeMap, BTreeSet};
use tensorfold_kernels::{Backend, DEFAULT_DEVICE_DEADLINE, DeviceWatch};
use tensorfold_text::{Text, TextError};

/// Why a checkpoint could not be opened. Everything loaded so far is dropped (mapped files unmapped).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A file is missing, unreadable or corrupt.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// `config.json` refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A tensor does not fit the config.
    #[error(transparent)]
    Weights(#[from] WeightError),
    /// Tokenizer or chat template files are present but unreadable.
    #[error(transparent)]
    Text(#[from] TextError),
    /// Expert parallelism cannot split this model over these devices.
    #[error("expert parallelism: {0}")]
    ExpertParallel(String),
    /// The backend's kernels cannot serve the model's attention shape (refused before any weight is bound).
    #[error("the device cannot serve this model's attention: {0}")]
    Unserved(tensorfold_kernels::KernelError),
    /// `generation_config.json` is unreadable.
    #[error("generation_config.json is invalid: {0}")]
    Generation(String),
}

/// What `tensorfold inspect` prints about a checkpoint, read without binding weights.
#[derive(Debug)]
pub struct Summary {
    /// Admitted config.
    pub cfg: ModelConfig,
    /// Parameters (elements of all tensors).
    pub params: usize,
    /// Bytes of all tensors.
    pub bytes: usize,
    /// Tensors and bytes by stored dtype.
    pub dtypes: BTreeMap<&'static str, (usize, usize)>,
    /// Weight files.
    pub files: Vec<String>,
    /// Whether tokenizer files are present.
    pub has_tokenizer: bool,
    /// How each kind of matrix is stored (`self_attn.q_proj` -> `4-bit g64`, `BF16`, ...): the module path less
    /// `model.` and the layer index ([`quant_kinds`]).
    pub quant: BTreeMap<String, BTreeSet<String>>,
}

/// A model ready to run, with its text side and stop ids.
pub struct Loaded<B: Backend> {
    /// The model.
    pub model: Model<B>,
    /// Tokenizer and chat template; `None` for a checkpoint without `tokenizer.json`.
    pub text: Option<Text>,
    /// End-of-sequence ids from `generation_config.json` and `config.json`, deduplicated.
    pub eos_ids: Vec<u32>,
    /// Where it came from.
    pub source: String,
}

/// Reads and admits `config.json`.
pub fn read_config(src: &Source) -> Result<ModelConfig, OpenError> {
    if let Source::Dir(d) = src
        && !d.is_dir()
    {
        return Err(CheckpointError::NoDir(d.clone()).into());
    }
    let bytes = src
        .read("config.json")?
        .ok_or_else(|| CheckpointError::Missing { dir: src.describe(), file: "config.json".into() })?;
    Ok(ModelConfig::parse(&bytes)?)
}

/// Config, tensor table and dtype totals, without binding weights.
pub fn summarize(src: &Source) -> Result<Summary, OpenError> {
    let cfg = read_config(src)?;
    if let Source::Synthetic(s) = src {
        return Ok(synthetic_summary(cfg, s));
    }
    let table = TensorTable::open(src)?;
    let mut dtypes: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    let mut params = 0;
    for (name, t) in &table.tensors {
        params += params_of(&cfg, (name, &t.shape, t.dtype), |n| table.tensors.contains_key(n));
        let e = dtypes.entry(t.dtype.as_str()).or_default();
        e.0 += 1;
        e.1 += t.bytes.len();
    }
    let has_tokenizer = src.read("tokenizer.json")?.is_some();
    let quant = quant_kinds(&cfg, &table);
    Ok(Summary { cfg, params, bytes: table.total_bytes(), dtypes, files: table.files.clone(), has_tokenizer, quant })
}

/// Each matrix kind's storage: a module with `.scales` by its quantization (override or checkpoint-wide), another
/// matrix (a `.weight` of two or more dimensions, the conv kernel aside) by its stored dtype. The kind is the module
/// path without `model.` and `layers.N.` (`feed_forward.switch_mlp.gate_proj`, `embed_tokens`).
pub fn quant_kinds(cfg: &ModelConfig, table: &TensorTable) -> BTreeMap<String, BTreeSet<String>> {
    let tensors = table.tensors.iter().map(|(n, e)| (n.as_str(), e.shape.as_slice(), e.dtype));
    kinds_of(cfg, tensors, |n| table.tensors.contains_key(n))
}

/// [`quant_kinds`] over `(name, shape, dtype)` rows; `has` says whether a tensor name exists.
fn kinds_of<'a>(
    cfg: &ModelConfig,
    tensors: impl Iterator<Item = (&'a str, &'a [usize], StoredDtype)>,
    has: impl Fn(&str) -> bool,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut kinds: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, shape, dtype) in tensors {
        let Some(module) =
            name.strip_suffix(".weight").filter(|_| shape.len() >= 2 && !name.ends_with("conv.conv.weight"))
        else {
            continue;
        };
        let how = match has(&format!("{module}.scales")) {
            true => match cfg.quant.as_ref().and_then(|q| q.params(module)) {
                Some(p) => p.describe(),
                None => "codes the config keeps float (refused at open)".into(),
            },
            false => dtype.as_str().to_string(),
        };
        let kind = module.strip_prefix("model.").unwrap_or(module);
        let kind = match kind.strip_prefix("layers.").and_then(|k| k.split_once('.')) {
            Some((_, rest)) => rest,
            None => kind,
        };
        kinds.entry(kind.to_string()).or_default().insert(how);
    }
    kinds
}

/// A synthetic checkpoint's summary from its tensor shapes, without making the values.
fn synthetic_summary(cfg: ModelConfig, s: &crate::synthetic::Synthetic) -> Summary {
    let mut dtypes: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    let (mut params, mut bytes) = (0, 0);
    let shapes = crate::synthetic::Synthetic::shapes(&cfg);
    let names: BTreeSet<&str> = shapes.iter().map(|(n, _, _)| n.as_str()).collect();
    for (name, shape, dt) in &shapes {
        let n: usize = shape.iter().product();
        let b = n * if matches!(dt, StoredDtype::F32 | StoredDtype::U32) { 4 } else { 2 };
        params += params_of(&cfg, (name, shape, *dt), |x| names.contains(x));
        bytes += b;
        let e = dtypes.entry(dt.as_str()).or_default();
        (e.0, e.1) = (e.0 + 1, e.1 + b);
    }
    let quant = kinds_of(&cfg, shapes.iter().map(|(n, s, d)| (n.as_str(), s.as_slice(), *d)), |n| names.contains(n));
    Summary { cfg, params, bytes, dtypes, files: vec![s.name.clone()], has_tokenizer: false, quant }
}

/// Opens a checkpoint on `backend`: admits the config, binds every tensor, reads the text files.
pub fn open<B: Backend>(src: &Source, backend: B) -> Result<Loaded<B>, OpenError> {
    let cfg = read_config(src)?;
    let table = TensorTable::open(src)?;
    open_table(src, cfg, &table, backend, 0..usize::MAX)
}

/// [`open`] from an opened table, holding MoE experts `owned` on `backend` (expert parallelism's rank 0).
pub(crate) fn open_table<B: Backend>(
    src: &Source,
    cfg: ModelConfig,
    table: &TensorTable,
    backend: B,
    owned: std::ops::Range<usize>,
) -> Result<Loaded<B>, OpenError> {
    if cfg.layers.contains(&Mixer::Attention) {
        backend.check_attention(cfg.heads, cfg.kv_heads, cfg.head_dim).map_err(OpenError::Unserved)?;
    }
    let weights = bind_owning(&cfg, table, &backend, owned)?;
    let text = open_text(src)?;
    let mut eos_ids = generation_eos(src)?;
    for id in &cfg.eos_ids {
        if !eos_ids.contains(id) {
            eos_ids.push(*id);
        }
    }
    // The default deadline until the caller sets its own (`--device-deadline`; expert parallelism: the collective's).
    let watch = DeviceWatch::new(DEFAULT_DEVICE_DEADLINE);
    Ok(Loaded {
        model: Model { cfg, weights, backend, drafter: None, ep: None, watch },
        text,
        eos_ids,
        source: src.describe(),
    })
}

fn open_text(src: &Source) -> Result<Option<Text>, OpenError> {
    let Some(tok) = src.read("tokenizer.json")? else { return Ok(None) };
    let cfg = src.read("tokenizer_config.json")?;
    let tpl = src.read("chat_template.jinja")?.map(|b| String::from_utf8_lossy(&b).into_owned());
    Ok(Some(Text::from_parts(&tok, cfg.as_deref(), tpl.as_deref())?))
}

fn generation_eos(src: &Source) -> Result<Vec<u32>, OpenError> {
    let Some(b) = src.read("generation_config.json")? else { return Ok(Vec::new()) };
    let v: serde_json::Value = serde_json::from_slice(&b).map_err(|e| OpenError::Generation(e.to_string()))?;
    let id = |x: &serde_json::Value| {
        x.as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| OpenError::Generation(format!("eos_token_id entry {x} is not a token id")))
    };
    match v.get("eos_token_id") {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(a)) => a.iter().map(id).collect(),
        Some(x) => Ok(vec![id(x)?]),
    }
}

/// The layer plan as one string, e.g. `CCACCA`: `C` conv, `A` attention.
pub fn layer_plan(cfg: &ModelConfig) -> String {
    cfg.layers.iter().map(|m| if *m == Mixer::Attention { 'A' } else { 'C' }).collect()
}

/// Per-layer FFN kind: `D` dense, `M` MoE.
pub fn ffn_plan(cfg: &ModelConfig) -> String {
    (0..cfg.layers.len()).map(|i| if cfg.is_moe_layer(i) { 'M' } else { 'D' }).collect()
}

/// Parameters one tensor `(name, shape, dtype)` holds: its elements, or for MLX codes (a U32 `weight` beside its
/// `.scales`, `has` telling which names exist) the codes its words pack at the module's bits.
fn params_of(
    cfg: &ModelConfig,
    (name, shape, dtype): (&str, &[usize], StoredDtype),
    has: impl Fn(&str) -> bool,
) -> usize {
    let n: usize = shape.iter().product();
    let bits = name
        .strip_suffix(".weight")
        .filter(|m| dtype == StoredDtype::U32 && has(&format!("{m}.scales")))
        .and_then(|m| cfg.quant.as_ref()?.params(m));
    bits.map_or(n, |p| n * 32 / p.bits as usize)
}
