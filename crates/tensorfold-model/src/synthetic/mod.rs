//! Synthetic checkpoints: every tensor a config asks for, filled with seeded random bf16 values in memory, so the
//! released shapes (LFM2.5-24B-A2B, LFM2-8B-A1B) can be benchmarked without their weights.
//!
//! The values are uniform in `[-a, a]` with `a = sqrt(3 / fan_in)` (unit variance through each linear; the embedding
//! and tied head as a linear of fan-in `hidden`), norms are 1.0 and expert biases small f32 values, so activations
//! stay finite over 40 layers and greedy decoding does not just repeat the input token (tested). Names and layouts
//! are the released ones (experts one by one), so [`write`] gives a directory that transformers and our loader both
//! open. A config with a `quantization` block (the `-mlx4` / `-mlx8` presets) is made in mlx-lm's layout instead,
//! with seeded codes, scales and biases ([`mlx`]).

mod mlx;

use crate::checkpoint::{CheckpointError, StoredDtype, TensorEntry, TensorTable};
use crate::config::{Mixer, ModelConfig};
use rayon::prelude::*;
use std::path::Path;
use tensorfold_kernels::HostBytes;

/// Shapes we ship as presets: `(name, config.json)`. Each also serves as `NAME-mlx4` and `NAME-mlx8`: the same
/// shape quantized as mlx-lm converts it ([`mlx::QUANT_SUFFIXES`]).
pub const PRESETS: &[(&str, &str)] = &[
    ("lfm2.5-24b-a2b", include_str!("../shapes/lfm2.5-24b-a2b.json")),
    ("lfm2-8b-a1b", include_str!("../shapes/lfm2-8b-a1b.json")),
];

/// A synthetic checkpoint: a config and the seed its values come from.
#[derive(Clone, Debug)]
pub struct Synthetic {
    /// What it was asked as (a preset name or a config path) and the seed, for logs.
    pub name: String,
    /// `config.json` bytes.
    pub config: Vec<u8>,
    /// Seed of every value.
    pub seed: u64,
}

/// How a tensor is filled.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fill {
    /// bf16 uniform in `[-a, a]`.
    Uniform(f32),
    /// bf16 ones (RMSNorm weights).
    Ones,
    /// f32 uniform in `[-a, a]` (expert biases, stored f32 as released).
    UniformF32(f32),
    /// MLX affine codes of `bits`, packed little-endian into u32 words (uniform codes).
    Codes(u32),
    /// MLX affine scales (bf16) of a matrix whose float form would be uniform in `[-a, a]`, at `bits`.
    Scales(f32, u32),
    /// The biases matching [`Fill::Scales`] of the same module (bf16): centred codes.
    Biases(f32, u32),
}

impl Fill {
    /// How the tensor is stored.
    fn stored(self) -> StoredDtype {
        match self {
            Fill::UniformF32(_) => StoredDtype::F32,
            Fill::Codes(_) => StoredDtype::U32,
            _ => StoredDtype::Bf16,
        }
    }
}

impl Synthetic {
    /// Parses `SPEC[@SEED]`: SPEC is a preset name ([`PRESETS`]) or a `config.json` path; the seed defaults to 0.
    /// A suffix after the last `@` is a seed only when it is a number, so a path may hold `@`. Errors: an unknown
    /// preset, a bad seed or an unreadable file, named.
    pub fn parse(spec: &str) -> Result<Self, CheckpointError> {
        let (what, seed) = match spec.rsplit_once('@') {
            Some((w, s)) => match s.parse::<u64>() {
                Ok(seed) => (w, seed),
                Err(_) if spec.ends_with(".json") => (spec, 0),
                Err(_) => return Err(CheckpointError::Synthetic(format!("seed {s:?} is not a u64"))),
            },
            None => (spec, 0),
        };
        let config = match preset(what)? {
            Some(json) => json,
            None if what.ends_with(".json") => std::fs::read(what)
                .map_err(|e| CheckpointError::Synthetic(format!("cannot read the config {what}: {e}")))?,
            None => {
                let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
                return Err(CheckpointError::Synthetic(format!(
                    "no shape {what:?}: give one of {names:?} (each also as NAME-mlx4 and NAME-mlx8) or a \
                     config.json path"
                )));
            }
        };
        Ok(Self { name: format!("synthetic:{what}@{seed}"), config, seed })
    }

    /// Every tensor's name, shape and stored dtype, without making any values (`inspect`).
    pub fn shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>, StoredDtype)> {
        tensors(cfg).into_iter().map(|(n, shape, f)| (n, shape, f.stored())).collect()
    }

    /// Every tensor of `cfg`, generated (in parallel) from the seed. Errors: a tensor too large to allocate (a
    /// refused allocation, never an abort).
    pub fn table(&self, cfg: &ModelConfig) -> Result<TensorTable, CheckpointError> {
        let mut out = std::collections::BTreeMap::new();
        for (name, shape, fill) in tensors(cfg) {
            let entry = make(&name, &shape, fill, self.seed)?;
            out.insert(name, entry);
        }
        Ok(TensorTable { tensors: out, files: vec![self.name.clone()] })
    }
}

/// A preset's `config.json` by name, quantized for a `-mlx4` / `-mlx8` suffix; `None` when no preset has the name.
fn preset(what: &str) -> Result<Option<Vec<u8>>, CheckpointError> {
    let find = |n: &str| PRESETS.iter().find(|(p, _)| *p == n).map(|(_, json)| json.as_bytes());
    if let Some(json) = find(what) {
        return Ok(Some(json.to_vec()));
    }
    for (suffix, bits) in mlx::QUANT_SUFFIXES {
        if let Some(json) = what.strip_suffix(suffix).and_then(find) {
            return mlx::quantized_config(json, bits).map(Some);
        }
    }
    Ok(None)
}

/// Expert biases: small, so they move routing without deciding it.
const EXPERT_BIAS: f32 = 0.01;

/// The tensors a config needs: `(name, shape, fill)`, in the released naming, or in mlx-lm's with its matrices
/// quantized when the config has a `quantization` block.
fn tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>, Fill)> {
    match &cfg.quant {
        Some(q) => mlx::quantize(float_tensors(cfg, true), q),
        None => float_tensors(cfg, false),
    }
}

/// The float tensors of `cfg` in the released naming, or (`mlx`) in mlx-lm's: the conv kernel `[h, taps, 1]` and, for
/// LFM2-MoE (`lfm2_moe.py`; dense LFM2 keeps `w1` / `w3` / `w2`), `gate_proj` / `up_proj` / `down_proj` with the
/// experts stacked as `switch_mlp`.
fn float_tensors(cfg: &ModelConfig, mlx: bool) -> Vec<(String, Vec<usize>, Fill)> {
    let (h, v) = (cfg.hidden, cfg.vocab);
    let lin = |fan_in: usize| Fill::Uniform((3.0 / fan_in as f32).sqrt());
    // The embedding (and tied head) at 1/sqrt(h), as a linear of fan-in h: a unit-variance embedding would dominate
    // the residual stream, and the tied head would then pick the input token again at every step.
    let mut t = vec![
        ("model.embed_tokens.weight".to_string(), vec![v, h], lin(h)),
        ("model.embedding_norm.weight".to_string(), vec![h], Fill::Ones),
    ];
    if !cfg.tied {
        t.push(("lm_head.weight".to_string(), vec![v, h], lin(h)));
    }
    let moe_names = mlx && cfg.family == crate::config::Family::Lfm2Moe;
    let [n1, n3, n2] = if moe_names { ["gate_proj", "up_proj", "down_proj"] } else { ["w1", "w3", "w2"] };
    // `lead` is the stacked experts' dimension (empty for one FFN).
    let ffn = |t: &mut Vec<(String, Vec<usize>, Fill)>, p: &str, lead: &[usize], inter: usize| {
        let shape = |a: usize, b: usize| [lead, &[a, b]].concat();
        t.push((format!("{p}.{n1}.weight"), shape(inter, h), lin(h)));
        t.push((format!("{p}.{n3}.weight"), shape(inter, h), lin(h)));
        t.push((format!("{p}.{n2}.weight"), shape(h, inter), lin(inter)));
    };
    let conv_shape = if mlx { vec![h, cfg.conv_taps, 1] } else { vec![h, 1, cfg.conv_taps] };
    for (i, mixer) in cfg.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        t.push((format!("{p}.operator_norm.weight"), vec![h], Fill::Ones));
        t.push((format!("{p}.ffn_norm.weight"), vec![h], Fill::Ones));
        match mixer {
            Mixer::Conv => {
                t.push((format!("{p}.conv.in_proj.weight"), vec![3 * h, h], lin(h)));
                t.push((format!("{p}.conv.conv.weight"), conv_shape.clone(), lin(cfg.conv_taps)));
                t.push((format!("{p}.conv.out_proj.weight"), vec![h, h], lin(h)));
                if cfg.conv_bias {
                    t.push((format!("{p}.conv.in_proj.bias"), vec![3 * h], lin(h)));
                    t.push((format!("{p}.conv.conv.bias"), vec![h], lin(h)));
                    t.push((format!("{p}.conv.out_proj.bias"), vec![h], lin(h)));
                }
            }
            Mixer::Attention => {
                let (qd, kd) = (cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
                t.push((format!("{p}.self_attn.q_proj.weight"), vec![qd, h], lin(h)));
                t.push((format!("{p}.self_attn.k_proj.weight"), vec![kd, h], lin(h)));
                t.push((format!("{p}.self_attn.v_proj.weight"), vec![kd, h], lin(h)));
                t.push((format!("{p}.self_attn.out_proj.weight"), vec![h, qd], lin(qd)));
                t.push((format!("{p}.self_attn.q_layernorm.weight"), vec![cfg.head_dim], Fill::Ones));
                t.push((format!("{p}.self_attn.k_layernorm.weight"), vec![cfg.head_dim], Fill::Ones));
            }
        }
        let f = format!("{p}.feed_forward");
        match &cfg.moe {
            Some(m) if cfg.is_moe_layer(i) => {
                t.push((format!("{f}.gate.weight"), vec![m.experts, h], lin(h)));
                if m.use_expert_bias {
                    t.push((format!("{f}.expert_bias"), vec![m.experts], Fill::UniformF32(EXPERT_BIAS)));
                }
                if mlx {
                    ffn(&mut t, &format!("{f}.switch_mlp"), &[m.experts], m.inter);
                } else {
                    for e in 0..m.experts {
                        ffn(&mut t, &format!("{f}.experts.{e}"), &[], m.inter);
                    }
                }
            }
            _ => ffn(&mut t, &f, &[], cfg.dense_inter),
        }
    }
    t
}

/// Values a splitmix64 output yields: four 16-bit uniforms.
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a of a tensor's name: each tensor draws its own stream.
fn name_key(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x1000_0000_01b3))
}

/// Uniform in `[-a, a)` from 16 random bits.
fn uniform(bits: u64, a: f32) -> f32 {
    ((bits & 0xffff) as f32 / 32768.0 - 1.0) * a
}

/// `n` zeroed values, or a named error when they cannot be allocated.
fn alloc<T: Clone + Default>(name: &str, n: usize) -> Result<Vec<T>, CheckpointError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| CheckpointError::Synthetic(format!("tensor {name} ({n} values) cannot be allocated")))?;
    v.resize(n, T::default());
    Ok(v)
}

/// `n` zeroed words, or a named error. Zeroed by the allocator (fresh pages of a large block arrive zeroed and are
/// touched first by the parallel fill below, so a 24B checkpoint is not paged in by one thread).
fn zeroed_words(name: &str, n: usize) -> Result<Vec<u32>, CheckpointError> {
    let refused = || CheckpointError::Synthetic(format!("tensor {name} ({n} words) cannot be allocated"));
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u32>(n).map_err(|_| refused())?;
    // SAFETY: the layout is non-zero-sized; a null result is the refusal; the block is n zeroed u32s (a valid
    // value) allocated by the global allocator with Vec's layout for capacity n, so the Vec may own it.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut u32;
        if p.is_null() {
            return Err(refused());
        }
        Ok(Vec::from_raw_parts(p, n, n))
    }
}

/// One tensor's entry, its values a function of (seed, name, index) only.
fn make(name: &str, shape: &[usize], fill: Fill, seed: u64) -> Result<TensorEntry, CheckpointError> {
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| CheckpointError::Synthetic(format!("tensor {name} of shape {shape:?} overflows")))?;
    let key = splitmix(seed ^ name_key(name));
    let (dtype, bytes) = match fill {
        Fill::Ones => {
            let mut v = alloc::<u16>(name, n)?;
            v.fill(half::bf16::ONE.to_bits());
            (StoredDtype::Bf16, HostBytes::from_bf16_bits(&v))
        }
        Fill::Uniform(a) => {
            let mut words = zeroed_words(name, n.div_ceil(2))?;
            let v = &mut bytemuck::cast_slice_mut::<u32, u16>(&mut words)[..n];
            // Blocks of 4 values share one draw; 64 Ki values a task.
            v.par_chunks_mut(1 << 16).enumerate().for_each(|(c, chunk)| {
                for (j, quad) in chunk.chunks_mut(4).enumerate() {
                    let r = splitmix(key ^ ((c << 14) + j) as u64);
                    for (q, x) in quad.iter_mut().enumerate() {
                        *x = half::bf16::from_f32(uniform(r >> (16 * q), a)).to_bits();
                    }
                }
            });
            let bytes = HostBytes::from_words(words, 2 * n)
                .ok_or_else(|| CheckpointError::Synthetic(format!("tensor {name}: {n} values overflow their words")))?;
            (StoredDtype::Bf16, bytes)
        }
        Fill::UniformF32(a) => {
            let mut v = alloc::<f32>(name, n)?;
            v.iter_mut().enumerate().for_each(|(i, x)| *x = uniform(splitmix(key ^ i as u64), a));
            (StoredDtype::F32, HostBytes::from_f32(&v))
        }
        Fill::Codes(_) => (StoredDtype::U32, mlx::codes(name, n, key)?),
        Fill::Scales(a, bits) => (StoredDtype::Bf16, mlx::scales(name, n, seed, (a, bits), false)?),
        Fill::Biases(a, bits) => (StoredDtype::Bf16, mlx::scales(name, n, seed, (a, bits), true)?),
    };
    Ok(TensorEntry { dtype, shape: shape.to_vec(), bytes })
}

/// Writes `table` and `config` as a model directory (`config.json` and one `model.safetensors`) that transformers
/// and `--model DIR` open. Errors: I/O or serialization, with the path.
pub fn write(dir: &Path, config: &[u8], table: &TensorTable) -> Result<(), CheckpointError> {
    let io = |path: &Path| {
        let p = path.display().to_string();
        move |e: std::io::Error| CheckpointError::Synthetic(format!("cannot write {p}: {e}"))
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, config).map_err(io(&cfg_path))?;
    let views = table.tensors.iter().map(|(name, e)| {
        let dt = match e.dtype {
            StoredDtype::Bf16 => safetensors::Dtype::BF16,
            StoredDtype::F16 => safetensors::Dtype::F16,
            StoredDtype::F32 => safetensors::Dtype::F32,
            StoredDtype::U32 => safetensors::Dtype::U32,
        };
        let view = safetensors::tensor::TensorView::new(dt, e.shape.clone(), e.bytes.as_slice())
            .expect("a generated tensor's bytes match its shape");
        (name.clone(), view)
    });
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path)
        .map_err(|e| CheckpointError::Safetensors { file: path.display().to_string(), message: e.to_string() })?;
    // Readable by others (peers may run as another user), as a plain file write would leave it.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).map_err(io(&path))?;
    }
    Ok(())
}
