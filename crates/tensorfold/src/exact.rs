//! `tensorfold exact`: the engine's logits against a reference file; one line per check, then a count.

use crate::{Device, default_model};
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use tensorfold_model::exact::{Reference, run_checks};

/// Arguments of `tensorfold exact`.
#[derive(clap::Args)]
pub struct Args {
    /// Hugging Face model directory (default: the embedded default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Reference safetensors file: `input_ids` (I64 [n]) and `logits` (F32 [n, vocab]); see docs/exact.md.
    #[arg(long)]
    reference: PathBuf,
    /// Largest allowed |engine - reference| over a row, relative to the row's largest |logit|.
    #[arg(long, default_value_t = 1e-4)]
    tolerance: f64,
    /// Device to run on.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// GPU number with `--device cuda` (the first, with `--gpus`).
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Split the MoE experts over this many GPUs from `--gpu` on (expert parallelism through NCCL; with `--device
    /// cpu`, host ranks: the stand-in CI runs). At most the model's experts a layer; a dense model takes only 1.
    /// Default: one device, no collectives.
    #[arg(long)]
    gpus: Option<usize>,
}

/// Runs the command on `--device`.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    crate::on_device(a.device, a.gpu, a.gpus, a)
}

impl crate::OnBackend for Args {
    fn run<B: crate::devices::Ranks>(self, dev: crate::devices::Devices<B>) -> anyhow::Result<ExitCode> {
        let src = default_model::source(self.model.clone())?;
        let loaded = dev.open(&src)?;
        let bytes = std::fs::read(&self.reference).with_context(|| format!("reading {}", self.reference.display()))?;
        let reference = Reference::parse(&bytes)?;
        let checks = run_checks(&loaded.model, &reference, self.tolerance)?;
        let failed = checks.iter().filter(|c| !c.pass).count();
        for c in &checks {
            println!("{} {}: {}", if c.pass { "PASS" } else { "FAIL" }, c.name, c.detail);
        }
        println!("{} passed, {} failed", checks.len() - failed, failed);
        Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
    }
}
