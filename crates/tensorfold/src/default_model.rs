//! The embedded default model: the trained pair under `models/` (an LFM2-MoE on Python code and its DSpark
//! drafter, recipe in `tools/train/`) compiled into the binary, so `serve` and `generate` run with no download.

use std::path::PathBuf;
use tensorfold_model::Source;
use tensorfold_model::drafter::DrafterBits;

#[cfg(feature = "embedded-model")]
macro_rules! embed {
    ($dir:literal: $($name:literal),*) => {
        &[$(($name, include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/", $dir, "/", $name)) as &[u8])),*]
    };
}

/// `models/lfm2-moe-pycode`: the trained 10 M-parameter LFM2-MoE on CPython's standard library (bf16).
#[cfg(feature = "embedded-model")]
static FILES: &[(&str, &[u8])] = embed!("lfm2-moe-pycode":
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors"
);

/// `models/lfm2-moe-pycode-dspark`: its DSpark drafter (bf16).
#[cfg(feature = "embedded-model")]
static DRAFTER: &[(&str, &[u8])] = embed!("lfm2-moe-pycode-dspark": "config.json", "model.safetensors");

/// Prefix of `--model` that asks for a synthetic checkpoint: `synthetic:SHAPE[@SEED]`.
pub const SYNTHETIC: &str = "synthetic:";

/// The model directory given, a synthetic checkpoint (`synthetic:lfm2.5-24b-a2b`, `synthetic:lfm2-8b-a1b`, either
/// with `-mlx4` / `-mlx8`, or `synthetic:path/config.json`, each with an optional `@SEED`), or the embedded default. Errors: an unknown shape
/// or a bad seed, by name.
pub fn source(dir: Option<PathBuf>) -> anyhow::Result<Source> {
    Ok(match dir {
        Some(d) => match d.to_str().and_then(|s| s.strip_prefix(SYNTHETIC)) {
            Some(spec) => Source::Synthetic(std::sync::Arc::new(tensorfold_model::synthetic::Synthetic::parse(spec)?)),
            None => Source::Dir(d),
        },
        None => default_model()?,
    })
}

/// The default model: embedded (the `embedded-model` feature, on by default).
#[cfg(feature = "embedded-model")]
fn default_model() -> anyhow::Result<Source> {
    Ok(Source::Embedded(FILES))
}

/// The default model of a build without `embedded-model` (a slim binary for machines that get the repository
/// beside it): read from `models/lfm2-moe-pycode` under the working directory. Errors: that folder is missing.
#[cfg(not(feature = "embedded-model"))]
fn default_model() -> anyhow::Result<Source> {
    let dir = PathBuf::from("models/lfm2-moe-pycode");
    anyhow::ensure!(
        dir.is_dir(),
        "this binary was built without the embedded default model (--no-default-features): it reads {} under the \
         working directory ({}), which is missing; run it from the repository root or pass --model DIR",
        dir.display(),
        std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default()
    );
    Ok(Source::Dir(dir))
}

#[cfg(feature = "embedded-model")]
fn default_drafter() -> Source {
    Source::Embedded(DRAFTER)
}

#[cfg(not(feature = "embedded-model"))]
fn default_drafter() -> Source {
    Source::Dir(PathBuf::from("models/lfm2-moe-pycode-dspark"))
}

/// The drafter to attach: `--drafter DIR`, else the embedded default's own drafter when the model is the
/// embedded default (none for a model directory given without `--drafter`).
pub fn drafter_source(model: &Option<PathBuf>, drafter: Option<PathBuf>) -> Option<Source> {
    match (drafter, model) {
        (Some(d), _) => Some(Source::Dir(d)),
        (None, None) => Some(default_drafter()),
        (None, Some(_)) => None,
    }
}

/// Opens the drafter at `src` against `model` and attaches it (its weights count in the model's bytes).
pub fn attach_drafter<B: tensorfold_kernels::Backend>(
    model: &mut tensorfold_model::Model<B>,
    src: Option<Source>,
    bits: DrafterBits,
) -> anyhow::Result<()> {
    let Some(src) = src else { return Ok(()) };
    if let Source::Dir(d) = &src
        && !d.is_dir()
    {
        anyhow::bail!("drafter directory {} does not exist or is not a directory", d.display());
    }
    let d = tensorfold_model::drafter::open_drafter_with(&src, &model.cfg, &model.backend, bits)
        .map_err(|e| anyhow::anyhow!("opening the drafter {}: {e}", src.describe()))?;
    tracing::info!(
        "drafter {}: DSpark, {} layers, block {}, taps {:?}, Markov rank {}, confidence head {}, linears {}, {:.1} MiB",
        src.describe(),
        d.cfg.layers,
        d.cfg.block,
        d.cfg.taps,
        d.cfg.markov_rank,
        d.cfg.confidence,
        if bits == DrafterBits::Eight { "8-bit affine (--drafter-bits 8)" } else { "as stored" },
        d.weight_bytes(&model.backend) as f64 / (1 << 20) as f64
    );
    model.drafter = Some(d);
    Ok(())
}

/// Parses `--drafter-bits`: 8 quantizes the drafter's linears to 8-bit affine codes at load; every other
/// value is refused by name.
pub fn parse_drafter_bits(s: &str) -> Result<DrafterBits, String> {
    match s {
        "8" => Ok(DrafterBits::Eight),
        other => {
            Err(format!("--drafter-bits {other} is not supported: only 8 (8-bit affine codes, quantized at load)"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafter_bits_eight_is_served_and_every_other_width_refused_by_name() {
        assert_eq!(parse_drafter_bits("8"), Ok(DrafterBits::Eight));
        for bad in ["4", "16", "bf16", ""] {
            let e = parse_drafter_bits(bad).expect_err(bad);
            assert!(e.starts_with(&format!("--drafter-bits {bad} is not supported")), "{e}");
        }
    }
}
