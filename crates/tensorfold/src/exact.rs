//! `tensorfold exact`: the engine's logits against a reference file; one line per check, then a count.

use crate::{Device, default_model};
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use tensorfold_kernels::{Backend, CpuBackend};
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
    /// GPU number with `--device cuda`.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
}

/// Runs the command.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.device {
        Device::Cpu => run_on(CpuBackend, &a),
        Device::Cuda => run_cuda(&a),
    }
}

/// The checks on GPU `--gpu`; a machine without a driver or that GPU is refused by name.
#[cfg(feature = "cuda")]
fn run_cuda(a: &Args) -> anyhow::Result<ExitCode> {
    let be = tensorfold_kernels::CudaBackend::new(a.gpu).map_err(|e| anyhow::anyhow!("--device cuda: {e}"))?;
    tracing::info!(device = be.device_name(), arch = be.arch(), "exact on CUDA device {}", a.gpu);
    run_on(be, a)
}

/// Without the `cuda` feature `--device cuda` is refused by name.
#[cfg(not(feature = "cuda"))]
fn run_cuda(a: &Args) -> anyhow::Result<ExitCode> {
    crate::check_device(a.device)?;
    anyhow::bail!("--device cuda: this build has no CUDA backend")
}

/// Opens the model on `backend` and runs every check.
fn run_on<B: Backend>(backend: B, a: &Args) -> anyhow::Result<ExitCode> {
    let src = default_model::source(a.model.clone())?;
    let loaded = tensorfold_model::open(&src, backend).with_context(|| format!("opening {}", src.describe()))?;
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
