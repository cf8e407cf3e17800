//! `tensorfold exact`: the engine's logits against a reference file; one line per check, then a count.

use crate::{Device, check_device, default_model};
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use tensorfold_kernels::CpuBackend;
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
}

/// Runs the command.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    check_device(a.device)?;
    let src = default_model::source(a.model);
    let loaded = tensorfold_model::open(&src, CpuBackend).with_context(|| format!("opening {}", src.describe()))?;
    let bytes = std::fs::read(&a.reference).with_context(|| format!("reading {}", a.reference.display()))?;
    let reference = Reference::parse(&bytes)?;
    let checks = run_checks(&loaded.model, &reference, a.tolerance)?;
    let failed = checks.iter().filter(|c| !c.pass).count();
    for c in &checks {
        println!("{} {}: {}", if c.pass { "PASS" } else { "FAIL" }, c.name, c.detail);
    }
    println!("{} passed, {} failed", checks.len() - failed, failed);
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
