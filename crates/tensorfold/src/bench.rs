//! `tensorfold bench`: `forward` here (prefill and decode speed, peak memory, the decode floor; exactness
//! first: the decoded tokens must equal the greedy picks of one whole prefill before any speed is printed),
//! `engine` and `serve` in their own files. Each writes, with `--json FILE`, a JSON summary of what it printed
//! (its command line, model, device and every figure with its token hashes) beside the unchanged text.

use crate::bench_engine;
use crate::bench_serve;
use crate::default_model;
use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;
use tensorfold_engine::keyed::token_sha256;
use tensorfold_engine::solo::prefill;
use tensorfold_kernels::{Backend, Segment};
use tensorfold_model::weights::{FfnWeights, MixerWeights};
use tensorfold_model::{Batch, LogitRows, Model};

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
    /// Also write a JSON summary of every printed figure to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    #[command(flatten)]
    dev: crate::devices::DeviceArgs,
}

/// The head of every bench's JSON summary: which bench and the command line it ran with.
pub fn summary_head(bench: &str) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("bench".into(), json!(bench));
    m.insert("args".into(), json!(std::env::args().collect::<Vec<_>>()));
    m
}

/// An f32 option (a temperature, top-p) as the JSON number it was written as (0.95, not 0.949999988...).
pub fn f32_json(x: f32) -> Value {
    json!(x.to_string().parse::<f64>().unwrap_or(f64::from(x)))
}

/// Writes a bench's JSON summary (pretty-printed); the error names the file.
pub fn write_summary(path: &Path, summary: &Value) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(summary)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
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
    let load_s = t.elapsed().as_secs_f64();
    println!(
        "model: {}  backend: {} x{}  threads: {}  simd: {:?}  loaded in {:.1} s",
        src.describe(),
        m.backend.name(),
        m.world(),
        rayon_threads(),
        tensorfold_kernels::simd::level(),
        load_s
    );
    let mut out = summary_head("forward");
    out.insert("model".into(), json!(src.describe()));
    out.insert("backend".into(), json!(m.backend.name()));
    out.insert("world".into(), json!(m.world()));
    out.insert("threads".into(), json!(rayon_threads()));
    out.insert("simd".into(), json!(format!("{:?}", tensorfold_kernels::simd::level())));
    out.insert("load_s".into(), json!(load_s));
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
    // The decode check runs the prompt and then its steps but the last: prompt + steps - 1 positions.
    fits_context(m.cfg.max_positions, &a.prompt_lens, prompt.len() + a.decode.max(2) - 1)?;
    let (tokens, decode_secs, prefill_profile) = greedy_decode(m, &prompt, a.decode.max(2), a.chunk)?;
    if let Some(p) = prefill_profile {
        out.insert("prompt_prefill_profile".into(), json!(p));
    }
    // Taken before the checks and prefill runs below add to it: the prompt's prefill and the decode steps.
    let decode_graphs = m.backend.graph_report();
    if let Some(p) = m.backend.take_profile() {
        println!("{p}");
        out.insert("decode_profile".into(), json!(p.to_string()));
    }
    let mut seq = prompt.clone();
    seq.extend_from_slice(&tokens[..tokens.len().saturating_sub(1)]);
    let mut state = m.new_state();
    let seg = Segment { first_row: 0, rows: seq.len(), start_pos: 0, cache: 0 };
    let picks = m.forward(Batch::new(&seq, &[seg], &mut [&mut state], LogitRows::All))?.picks;
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
    out.insert(
        "exactness".into(),
        json!({"decoded_tokens": tokens.len(), "equal_to_whole_prefill": true, "token_sha256": token_sha256(&tokens)}),
    );
    out.insert("prompt_sha256".into(), json!(token_sha256(&prompt)));
    let mut prefills = Vec::new();
    for &n in &a.prompt_lens {
        let p = ids(n);
        let t = Instant::now();
        prefill(m, &p, a.chunk)?;
        let s = t.elapsed().as_secs_f64();
        println!("prefill {n:>5} tokens: {s:>8.3} s  {:>9.1} tok/s (chunks of {})", n as f64 / s, a.chunk);
        prefills.push(json!({"tokens": n, "seconds": s, "tok_s": n as f64 / s, "chunk": a.chunk}));
    }
    out.insert("prefill".into(), json!(prefills));
    let steps = tokens.len().saturating_sub(1);
    let step_s = decode_secs / steps.max(1) as f64;
    println!(
        "decode  {steps:>5} steps:  {decode_secs:>8.3} s  {:>9.1} tok/s (one stream, after a {}-token prompt)",
        1.0 / step_s,
        prompt.len()
    );
    out.insert(
        "decode".into(),
        json!({"steps": steps, "seconds": decode_secs, "tok_s": 1.0 / step_s, "prompt_tokens": prompt.len()}),
    );
    if let Some(g) = decode_graphs {
        println!("{g}");
        out.insert("decode_graphs".into(), json!(g.to_string()));
    }
    out.insert("memory".into(), print_memory(m));
    out.insert("floor".into(), print_floor(m, step_s));
    if let Some(path) = &a.json {
        write_summary(path, &Value::Object(out))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the peak memory line (the device pool's high-water marks, else the process's peak RSS); returns its
/// figures in bytes (KiB for the RSS).
fn print_memory<B: Backend>(m: &Model<B>) -> Value {
    match m.backend.memory_high() {
        Some((used, reserved)) => {
            println!(
                "peak device memory: {:.2} GiB allocated, {:.2} GiB reserved by the pool (weights {:.2} GiB)",
                gib(used),
                gib(reserved),
                gib(m.weight_bytes())
            );
            json!({"device_allocated_bytes": used, "device_reserved_bytes": reserved, "weight_bytes": m.weight_bytes()})
        }
        None => {
            let rss = peak_rss_kib();
            println!("peak RSS: {:.1} MiB (before the bandwidth probe's buffers)", rss as f64 / 1024.0);
            json!({"peak_rss_kib": rss, "weight_bytes": m.weight_bytes()})
        }
    }
}

/// Refuses, before any forward runs, a prefill length that is 0 or past the model's `context` positions, and a decode
/// (its prompt plus its steps, `decode_len` positions) past it, naming the option.
fn fits_context(context: usize, prompt_lens: &[usize], decode_len: usize) -> anyhow::Result<()> {
    if let Some(&n) = prompt_lens.iter().find(|&&n| n == 0 || n > context) {
        bail!(
            "--prompt-lens {n}: a prefill takes 1 to {context} tokens, the model's context (max_position_embeddings)"
        );
    }
    if decode_len > context {
        bail!(
            "the decode check's prompt and --decode steps take {decode_len} positions, past the model's context of \
             {context} (max_position_embeddings)"
        );
    }
    Ok(())
}

/// Prints the decode floor line: the weight bytes a step reads over the measured copy bandwidth, against this
/// run's `step_s` seconds a step; returns its figures.
fn print_floor<B: Backend>(m: &Model<B>, step_s: f64) -> Value {
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
    json!({
        "step_bytes": bytes, "copy_bytes_per_s": bw, "floor_ms_per_step": floor_s * 1e3,
        "floor_steps_per_s": 1.0 / floor_s, "run_ms_per_step": step_s * 1e3, "percent_of_floor": 100.0 * floor_s / step_s,
    })
}

fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// A greedy decode: its tokens, the seconds of the steps after the first, and the profile of the prompt's
/// prefill (TENSORFOLD_CUDA_PROFILE) as printed.
type Decoded = (Vec<u32>, f64, Option<String>);

/// Greedy decode of `n` tokens after `prompt`.
fn greedy_decode<B: Backend>(m: &Model<B>, prompt: &[u32], n: usize, chunk: usize) -> anyhow::Result<Decoded> {
    let (mut state, logits) = prefill(m, prompt, chunk)?;
    // A profile (TENSORFOLD_CUDA_PROFILE) of the prompt's prefill is printed apart; the next covers the decode steps.
    let prefill_profile = m.backend.take_profile().map(|p| {
        println!("prefill of the {}-token prompt in chunks of {chunk}: {p}", prompt.len());
        p.to_string()
    });
    let mut tok = tensorfold_engine::keyed::greedy_pick(&logits)?;
    let mut out = vec![tok];
    let t = Instant::now();
    while out.len() < n {
        let seg = Segment { first_row: 0, rows: 1, start_pos: state.pos, cache: 0 };
        let f = m.forward(Batch::new(&[tok], &[seg], &mut [&mut state], LogitRows::Last))?;
        if f.picks[0].nonfinite {
            bail!("a non-finite logit at position {}", state.pos);
        }
        tok = f.picks[0].token;
        out.push(tok);
    }
    Ok((out, t.elapsed().as_secs_f64(), prefill_profile))
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
