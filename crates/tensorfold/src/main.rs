//! `tensorfold`: the command line (serve, generate, exact, inspect, contract, bench).

mod bench;
mod bench_engine;
mod bench_serve;
mod contract_cmd;
mod default_model;
mod devices;
mod exact;
mod generate;
mod hub;
mod inspect;
mod memory_budget;
mod serve;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Activation buffers on cache lines: the CPU kernels' wide loads then never split (same bits, faster prefill).
#[global_allocator]
static ALLOC: tensorfold_kernels::cpu::LineAligned = tensorfold_kernels::cpu::LineAligned;

/// TensorFold: an inference server for LiquidAI LFM2 / LFM2-MoE models.
#[derive(Parser)]
#[command(name = "tensorfold", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Worker threads of the CPU kernels, on every command (default: the cores, or RAYON_NUM_THREADS).
    #[arg(long, global = true, env = "TENSORFOLD_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
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
        /// Hugging Face model directory (default: the default pair, models/lfm2-moe-pycode, compiled into the binary
        /// unless built without `embedded-model`).
        dir: Option<PathBuf>,
    },
    /// Run the kernel contract: references, row invariance, edge cases and planted controls.
    Contract(contract_cmd::Args),
    /// Write a synthetic checkpoint (a shape's config with seeded random bf16 weights, or MLX affine codes in
    /// mlx-lm's layout for a quantized shape) as a model directory, for peers (transformers, mlx-lm) to load the same
    /// weights `--model synthetic:SHAPE` makes in memory.
    Synth {
        /// `SHAPE[@SEED]`: `lfm2.5-24b-a2b`, `lfm2-8b-a1b`, either with `-mlx4` / `-mlx8`, or a config.json path.
        shape: String,
        /// Directory to write (`config.json`, `model.safetensors`).
        #[arg(long)]
        out: PathBuf,
    },
    /// Benchmarks (commands that print figures; never tests).
    Bench {
        #[command(subcommand)]
        what: bench::What,
    },
    /// A chat-template render worker (started by `serve`, which talks to it over stdin and stdout; docs/fuzzing.md).
    #[command(hide = true)]
    RenderWorker {
        /// Address space the worker may map, in MiB (default 2048; a template past it ends the worker): 256 to
        /// 2^44 - 1, so that its bytes fit 64 bits.
        #[arg(long, value_parser = clap::value_parser!(u64).range(256..=MAX_ADDRESS_SPACE_MIB))]
        address_space_mib: Option<u64>,
    },
}

/// The largest `render-worker --address-space-mib` whose bytes fit a u64 (past it `m << 20` would wrap to a small
/// or zero limit).
const MAX_ADDRESS_SPACE_MIB: u64 = u64::MAX >> 20;

fn main() -> ExitCode {
    // NVLink multicast stays off for NCCL (shared hosts), set before any thread starts.
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY: the first statement of main: no other thread exists yet to read the environment.
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal, never in a redirected log.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    if let Some(n) = cli.threads {
        // Before any kernel runs: the first use of rayon's global pool would fix its size at the default.
        if let Err(e) = rayon::ThreadPoolBuilder::new().num_threads(n.into()).build_global() {
            eprintln!("error: --threads {n}: {e}");
            return ExitCode::FAILURE;
        }
    }
    let result = match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Exact(a) => exact::run(a),
        Command::Inspect { dir } => inspect::run(dir),
        Command::Contract(a) => contract_cmd::run(a),
        Command::Synth { shape, out } => synth(&shape, &out),
        Command::Bench { what } => bench::run(what),
        Command::RenderWorker { address_space_mib } => render_worker(address_space_mib),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `tensorfold render-worker`: renders chat templates for its parent until its stdin ends
/// (`tensorfold_text::render_worker`).
fn render_worker(address_space_mib: Option<u64>) -> anyhow::Result<ExitCode> {
    let bytes = match address_space_mib {
        None => tensorfold_text::render_worker::WORKER_ADDRESS_SPACE,
        // clap bounds it already; checked again so no value can wrap.
        Some(m) => m
            .checked_mul(1 << 20)
            .with_context(|| format!("--address-space-mib {m}: out of range (at most {MAX_ADDRESS_SPACE_MIB} MiB)"))?,
    };
    tensorfold_text::render_worker::run_stdio(bytes).context("render worker")?;
    Ok(ExitCode::SUCCESS)
}

/// `tensorfold synth`: generates the tensors and writes them.
fn synth(spec: &str, out: &std::path::Path) -> anyhow::Result<ExitCode> {
    // The `--model` form (`synthetic:SHAPE`) is accepted too.
    let spec = spec.strip_prefix(default_model::SYNTHETIC).unwrap_or(spec);
    let s = tensorfold_model::synthetic::Synthetic::parse(spec)?;
    let cfg = tensorfold_model::ModelConfig::parse(&s.config)?;
    let t = std::time::Instant::now();
    let table = s.table(&cfg)?;
    tensorfold_model::synthetic::write(out, &s.config, &table)?;
    println!(
        "{}: {} tensors, {:.2} GiB, written to {} in {:.1} s",
        s.name,
        table.tensors.len(),
        table.total_bytes() as f64 / (1u64 << 30) as f64,
        out.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// The device flag shared by every command.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The CPU backend (threads + SIMD).
    #[default]
    Cpu,
    /// An NVIDIA GPU (`--gpu N` picks one) in builds with the `cuda` feature; refused by name elsewhere.
    Cuda,
}

/// How many drafts a verify window carries (`--verify`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Verify {
    /// The depth with the most expected committed tokens per second, from measured acceptance and round cost.
    Depth,
    /// DSpark's confidence-scheduled verification across the round's streams (needs a confidence head).
    Scheduled,
    /// Always --max-draft drafts (measurement runs).
    Fixed,
}

impl From<Verify> for tensorfold_engine::schedule::VerifyMode {
    fn from(v: Verify) -> Self {
        match v {
            Verify::Depth => Self::Depth,
            Verify::Scheduled => Self::Scheduled,
            Verify::Fixed => Self::Fixed,
        }
    }
}

/// Refuses `--verify scheduled` for a model whose drafter has no confidence head (or no drafter), by name.
pub fn check_verify<B: tensorfold_kernels::Backend>(
    v: Verify,
    model: &tensorfold_model::Model<B>,
) -> anyhow::Result<()> {
    let conf = model.drafter.as_ref().is_some_and(|d| d.cfg.confidence);
    if v == Verify::Scheduled && !conf {
        anyhow::bail!("--verify scheduled needs a drafter with a confidence head (enable_confidence_head: true)");
    }
    Ok(())
}

/// Refuses devices this build lacks, by name.
pub fn check_device(d: Device) -> anyhow::Result<()> {
    match d {
        Device::Cpu => Ok(()),
        Device::Cuda if cfg!(feature = "cuda") => Ok(()),
        Device::Cuda => {
            anyhow::bail!("--device cuda: this build has no CUDA backend (build with `--features cuda`)")
        }
    }
}

/// A command body that runs on any backend (the CPU, or GPUs in `cuda` builds).
pub trait OnBackend {
    /// Runs on `dev`.
    fn run<B: devices::Ranks>(self, dev: devices::Devices<B>) -> anyhow::Result<ExitCode>;
}

/// Runs `job` on the CPU, or on GPU `gpu` for `--device cuda` (refused by name without the `cuda` feature or
/// without a driver or that GPU); with `gpus`, on that many ranks from `gpu` on (CPU ranks: the host stand-in).
pub fn on_device(d: devices::DeviceArgs, job: impl OnBackend) -> anyhow::Result<ExitCode> {
    check_device(d.device)?;
    match d.device {
        Device::Cpu => job.run(devices::cpu(&d)?),
        #[cfg(feature = "cuda")]
        Device::Cuda => job.run(devices::cuda(&d)?),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda => unreachable!("check_device refused it (gpu {})", d.gpu),
    }
}
