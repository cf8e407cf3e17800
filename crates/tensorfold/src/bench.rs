//! `tensorfold bench`: `forward` here (prefill and decode speed, peak memory, the decode floor; exactness
//! first: the decoded tokens must equal the greedy picks of one whole prefill before any speed is printed),
//! `engine` and `serve` in their own files.

use crate::bench_engine;
use crate::bench_serve;
use crate::default_model;
use anyhow::bail;
use std::process::ExitCode;
use std::time::Instant;
use tensorfold_engine::keyed::token_sha256;
use tensorfold_engine::solo::prefill;
use tensorfold_kernels::{Backend, Segment};
use tensorfold_model::weights::{FfnWeights, MixerWeights};
use tensorfold_model::{LogitRows, Model};

/// The measurement grid shared by `bench engine` and `bench serve`.
#[derive(clap::Args, Clone, Debug)]
pub struct Grid {
    /// Numbers of concurrent streams.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    pub levels: Vec<usize>,
    /// Tokens generated per request (max_tokens; EOS ignored).
    #[arg(long, default_value_t = 256)]
    pub tokens: usize,
    /// Repetitions per level and temperature (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Sampling temperatures (0 = greedy; sampled requests carry a fixed seed per stream).
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    pub temperatures: Vec<f32>,
}

/// Options of `bench forward`.
#[derive(clap::Args)]
pub struct ForwardArgs {
    /// Model directory or `synthetic:SHAPE[@SEED]` (default: the default pair, models/lfm2-moe-pycode, compiled into
    /// the binary unless built without `embedded-model`).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Prompt lengths to time a whole prefill at.
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    prompt_lens: Vec<usize>,
    /// Greedy decode steps after a 512-token prompt.
    #[arg(long, default_value_t = 64)]
    decode: usize,
    /// Read the decode prompt from a file of comma-separated ids (default: seeded random ids).
    #[arg(long)]
    prompt_ids: Option<std::path::PathBuf>,
    /// Prefill chunk (rows per call).
    #[arg(long, default_value_t = 2048)]
    chunk: usize,
    #[command(flatten)]
    dev: crate::devices::DeviceArgs,
}

/// Benchmarks.
#[derive(clap::Subcommand)]
pub enum What {
    /// Prefill and decode speed of the forward, peak memory, and the decode floor.
    Forward(ForwardArgs),
    /// Shared-round throughput of the threaded engine at several concurrency levels, every concurrent reply
    /// checked equal to its solo run.
    Engine(bench_engine::Args),
    /// Client benchmark of any OpenAI-compatible server: concurrent streams, TTFT, ITL, tok/s, hash checks.
    Serve(bench_serve::Args),
}

/// Runs a benchmark.
pub fn run(w: What) -> anyhow::Result<ExitCode> {
    match w {
        What::Forward(a) => crate::on_device(a.dev, a),
        What::Engine(a) => bench_engine::run(a),
        What::Serve(a) => bench_serve::run(a),
    }
}

impl crate::OnBackend for ForwardArgs {
    fn run<B: crate::devices::Ranks>(self, dev: crate::devices::Devices<B>) -> anyhow::Result<ExitCode> {
        forward(dev, self)
    }
}

fn forward<B: crate::devices::Ranks>(dev: crate::devices::Devices<B>, a: ForwardArgs) -> anyhow::Result<ExitCode> {
    let src = default_model::source(a.model)?;
    let t = Instant::now();
    let loaded = dev.open(&src)?;
    let m = &loaded.model;
    println!(
        "model: {}  backend: {} x{}  threads: {}  simd: {:?}  loaded in {:.1} s",
        src.describe(),
        m.backend.name(),
        m.world(),
        rayon_threads(),
        tensorfold_kernels::simd::level(),
        t.elapsed().as_secs_f64()
    );
    let vocab = m.cfg.vocab as u32;
    let ids = |n: usize| -> Vec<u32> {
        (0..n as u64).map(|i| (splitmix(i ^ 0x5eed) % (vocab as u64 - 10)) as u32 + 10).collect()
    };
    // Exactness first.
    let prompt = match a.prompt_ids {
        Some(f) => std::fs::read_to_string(&f)?
            .trim()
            .split(',')
            .map(|s| s.trim().parse::<u32>())
            .collect::<Result<Vec<_>, _>>()?,
        None => ids(512),
    };
    let (tokens, decode_secs) = greedy_decode(m, &prompt, a.decode.max(2), a.chunk)?;
    // Taken before the checks and prefill runs below add to it: the prompt's prefill and the decode steps.
    let decode_graphs = m.backend.graph_report();
    if let Some(p) = m.backend.take_profile() {
        println!("{p}");
    }
    let mut seq = prompt.clone();
    seq.extend_from_slice(&tokens[..tokens.len().saturating_sub(1)]);
    let mut state = m.new_state();
    let seg = Segment { first_row: 0, rows: seq.len(), start_pos: 0, cache: 0 };
    let picks = m.forward(&seq, &[seg], &mut [&mut state], LogitRows::All)?.picks;
    drop(state);
    let teacher: Vec<u32> = picks[prompt.len() - 1..].iter().map(|p| p.token).collect();
    if teacher != tokens {
        bail!("exactness: decoded tokens differ from the whole prefill's greedy picks; no speed is reported");
    }
    println!(
        "exactness: {} decoded tokens equal the whole prefill's greedy picks; token_sha256 {}",
        tokens.len(),
        token_sha256(&tokens)
    );
    println!("prompt_sha256 {}", token_sha256(&prompt));
    for &n in &a.prompt_lens {
        let p = ids(n);
        let t = Instant::now();
        prefill(m, &p, a.chunk)?;
        let s = t.elapsed().as_secs_f64();
        println!("prefill {n:>5} tokens: {s:>8.3} s  {:>9.1} tok/s (chunks of {})", n as f64 / s, a.chunk);
    }
    let steps = tokens.len().saturating_sub(1);
    let step_s = decode_secs / steps.max(1) as f64;
    println!(
        "decode  {steps:>5} steps:  {decode_secs:>8.3} s  {:>9.1} tok/s (one stream, after a {}-token prompt)",
        1.0 / step_s,
        prompt.len()
    );
    if let Some(g) = decode_graphs {
        println!("{g}");
    }
    match m.backend.memory_high() {
        Some((used, reserved)) => println!(
            "peak device memory: {:.2} GiB allocated, {:.2} GiB reserved by the pool (weights {:.2} GiB)",
            gib(used),
            gib(reserved),
            gib(m.weight_bytes())
        ),
        None => println!("peak RSS: {:.1} MiB (before the bandwidth probe's buffers)", peak_rss_kib() as f64 / 1024.0),
    }
    let bytes = step_bytes(m);
    let bw = m.backend.copy_bandwidth();
    let floor_s = bytes as f64 / bw;
    println!(
        "floor: {:.1} MiB of weights read per decode step / {:.2} GB/s copy (read+write) = {:.3} ms a step, {:.1} steps/s at most; this run: {:.3} ms a step, {:.1}% of the floor",
        bytes as f64 / (1 << 20) as f64,
        bw / 1e9,
        floor_s * 1e3,
        1.0 / floor_s,
        step_s * 1e3,
        100.0 * floor_s / step_s
    );
    Ok(ExitCode::SUCCESS)
}

fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Greedy decode of `n` tokens after `prompt`; returns the tokens and the seconds of the steps after the first.
fn greedy_decode<B: Backend>(m: &Model<B>, prompt: &[u32], n: usize, chunk: usize) -> anyhow::Result<(Vec<u32>, f64)> {
    let (mut state, logits) = prefill(m, prompt, chunk)?;
    // A profile (TENSORFOLD_CUDA_PROFILE) of the prompt's prefill is printed apart; the next covers the decode steps.
    if let Some(p) = m.backend.take_profile() {
        println!("prefill of the {}-token prompt in chunks of {chunk}: {p}", prompt.len());
    }
    let mut tok = tensorfold_engine::keyed::greedy_pick(&logits)?;
    let mut out = vec![tok];
    let t = Instant::now();
    while out.len() < n {
        let seg = Segment { first_row: 0, rows: 1, start_pos: state.pos, cache: 0 };
        let f = m.forward(&[tok], &[seg], &mut [&mut state], LogitRows::Last)?;
        if f.picks[0].nonfinite {
            bail!("a non-finite logit at position {}", state.pos);
        }
        tok = f.picks[0].token;
        out.push(tok);
    }
    Ok((out, t.elapsed().as_secs_f64()))
}

/// Weight bytes one decode step reads: every dense matrix, the router and top-k experts of each MoE
/// layer (as if each expert were read whole), and the head.
fn step_bytes<B: Backend>(m: &Model<B>) -> usize {
    let (b, w) = (&m.backend, &m.weights);
    let mut n = b.mat_bytes(w.head.as_ref().unwrap_or(&w.embed));
    for l in &w.layers {
        n += match &l.mixer {
            MixerWeights::Conv(c) => b.mat_bytes(&c.in_proj) + b.mat_bytes(&c.out_proj),
            MixerWeights::Attn(a) => b.mat_bytes(&a.q) + b.mat_bytes(&a.k) + b.mat_bytes(&a.v) + b.mat_bytes(&a.o),
        };
        n += match &l.ffn {
            FfnWeights::Dense(f) => b.mat_bytes(&f.w1) + b.mat_bytes(&f.w2) + b.mat_bytes(&f.w3),
            FfnWeights::Moe { gate, experts, .. } => {
                let k = m.cfg.moe.as_ref().map_or(0, |c| c.top_k);
                let e = &experts[0];
                b.mat_bytes(gate) + k * (b.mat_bytes(&e.w1) + b.mat_bytes(&e.w2) + b.mat_bytes(&e.w3))
            }
        };
    }
    n
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn rayon_threads() -> usize {
    tensorfold_kernels::cpu::threads()
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
