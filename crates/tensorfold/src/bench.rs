//! `tensorfold bench`: benchmark commands that print figures.

use std::process::ExitCode;

/// Benchmarks.
#[derive(clap::Subcommand)]
pub enum What {
    /// Prefill and decode speed of the forward, peak memory, and the decode floor.
    Forward {
        /// Model directory (default: the embedded default).
        #[arg(long)]
        model: Option<std::path::PathBuf>,
    },
}

/// Runs a benchmark.
pub fn run(w: What) -> anyhow::Result<ExitCode> {
    let What::Forward { model } = w;
    let _ = model;
    anyhow::bail!("bench: not wired yet")
}
