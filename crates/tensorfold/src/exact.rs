//! `tensorfold exact`: the engine's logits against a reference file; one line per check, then a count.

use crate::default_model;
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use tensorfold_model::exact::{Reference, run_checks};

/// Arguments of `tensorfold exact`.
#[derive(clap::Args)]
pub struct Args {
    /// Hugging Face model directory (default: the default pair, models/lfm2-moe-pycode, compiled into the binary unless
    /// built without `embedded-model`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Reference safetensors file: `input_ids` (I64 [n]) and `logits` (F32 [n, vocab]); see docs/exact.md.
    #[arg(long)]
    reference: PathBuf,
    /// Largest allowed |engine - reference| over a row, relative to the row's largest |logit|.
    #[arg(long, default_value_t = 1e-4)]
    tolerance: f64,
    #[command(flatten)]
    dev: crate::devices::DeviceArgs,
}

/// Runs the command on `--device`.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    crate::on_device(a.dev, a)
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
