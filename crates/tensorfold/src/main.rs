//! `tensorfold`: the command line (serve, generate, exact, inspect, contract, bench).

mod bench;
mod bench_engine;
mod bench_serve;
mod contract_cmd;
mod default_model;
mod exact;
mod generate;
mod inspect;
mod serve;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// TensorFold: an inference server for LiquidAI LFM2 / LFM2-MoE models.
#[derive(Parser)]
#[command(name = "tensorfold", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible HTTP API (completions, chat, models, tokenize, health, metrics).
    Serve(serve::Args),
    /// Generate a completion for one prompt and print prompt/decode speeds.
    Generate(generate::Args),
    /// Check the engine's logits against a reference file (whole prefill, chunked prefill, decode).
    Exact(exact::Args),
    /// Print a checkpoint's family, layer plan, parameter count, dtypes and bytes.
    Inspect {
        /// Hugging Face model directory (default: the embedded default model).
        dir: Option<PathBuf>,
    },
    /// Run the kernel contract: references, row invariance, edge cases and planted controls.
    Contract(contract_cmd::Args),
    /// Benchmarks (commands that print figures; never tests).
    Bench {
        #[command(subcommand)]
        what: bench::What,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Exact(a) => exact::run(a),
        Command::Inspect { dir } => inspect::run(dir),
        Command::Contract(a) => contract_cmd::run(a),
        Command::Bench { what } => bench::run(what),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The device flag shared by every command.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The CPU backend (threads + SIMD).
    #[default]
    Cpu,
    /// NVIDIA GPUs (not in this build).
    Cuda,
}

/// Refuses devices this build lacks, by name.
pub fn check_device(d: Device) -> anyhow::Result<()> {
    match d {
        Device::Cpu => Ok(()),
        Device::Cuda => anyhow::bail!(
            "--device cuda: this build has no CUDA backend (the `cuda` feature lands with the CUDA backend)"
        ),
    }
}
