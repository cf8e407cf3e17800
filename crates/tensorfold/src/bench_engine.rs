//! `tensorfold bench engine`: shared-round throughput of the threaded engine in process. For each level L and
//! temperature: L requests with distinct seeded prompts submitted at once; aggregate decode tok/s (generated
//! tokens over the wall time from submission to the last `Finished`), per-stream decode tok/s and TTFT medians
//! over the reps; then every concurrent reply's token_sha256 is checked against its solo run (non-zero exit on
//! any mismatch).

use crate::default_model;
use anyhow::Context;
use std::process::ExitCode;
use std::sync::mpsc::Receiver;
use std::time::Instant;
use tensorfold_engine::core::EngineConfig;
use tensorfold_engine::sampler::{SamplingParams, token_sha256};
use tensorfold_engine::solo::{SoloConfig, generate};
use tensorfold_engine::{Engine, Event, FinishReason, ModelTarget, Request, Stats};
use tensorfold_kernels::CpuBackend;

/// Options of `bench engine`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (default: the embedded default).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Concurrency levels, tokens, repetitions and temperatures.
    #[command(flatten)]
    grid: crate::bench::Grid,
    /// Lanes (default: the largest level).
    #[arg(long)]
    parallel: Option<usize>,
    /// One forward over all streams' rows a round (true) or one forward per stream (false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    shared_rounds: bool,
    /// Most context-copy drafts a verify window carries (0: plain decode rounds).
    #[arg(long, default_value_t = 0)]
    max_draft: usize,
}

/// One concurrent reply and how it arrived.
struct Reply {
    tokens: Vec<u32>,
    reason: FinishReason,
    error: Option<String>,
    stats: Stats,
}

fn collect(rx: Receiver<Event>) -> anyhow::Result<Reply> {
    let mut tokens = Vec::new();
    for e in rx.iter() {
        match e {
            Event::Token(t) => tokens.push(t),
            Event::Finished { reason, error, stats } => return Ok(Reply { tokens, reason, error, stats }),
            _ => {}
        }
    }
    anyhow::bail!("the engine stopped before the request finished")
}

/// Runs the benchmark.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !a.grid.levels.is_empty() && a.grid.levels.iter().all(|&l| l > 0),
        "--levels needs numbers above 0"
    );
    anyhow::ensure!(a.grid.reps > 0 && a.grid.tokens > 0, "--reps and --tokens must be at least 1");
    let src = default_model::source(a.model);
    let open = || tensorfold_model::open(&src, CpuBackend).with_context(|| format!("opening {}", src.describe()));
    let solo_model = open()?.model;
    let loaded = open()?;
    let (vocab, context) = (solo_model.cfg.vocab as u64, solo_model.cfg.max_positions);
    let max_level = a.grid.levels.iter().copied().max().unwrap_or(1);
    let cfg = EngineConfig {
        parallel: a.parallel.unwrap_or(max_level).max(1),
        queue_capacity: max_level.max(64),
        shared_rounds: a.shared_rounds,
        max_draft: a.max_draft,
        planted: None,
        ..EngineConfig::default()
    };
    println!(
        "model: {}  threads: {}  simd: {:?}  parallel: {}  shared_rounds: {}  max_draft: {}  tokens: {}  reps: {}",
        src.describe(),
        tensorfold_kernels::cpu::threads(),
        tensorfold_kernels::simd::level(),
        cfg.parallel,
        cfg.shared_rounds,
        cfg.max_draft,
        a.grid.tokens,
        a.grid.reps
    );
    let chunk = cfg.prefill_chunk;
    let engine = Engine::start(ModelTarget { model: loaded.model, eos: loaded.eos_ids }, cfg);
    let h = engine.handle();
    println!("level  temp  aggregate tok/s  per-stream tok/s  TTFT ms  equal");
    let (mut equal_all, mut total_all) = (0, 0);
    for &level in &a.grid.levels {
        for (ti, &temp) in a.grid.temperatures.iter().enumerate() {
            let (mut aggregate, mut per_stream, mut ttft) = (Vec::new(), Vec::new(), Vec::new());
            let (mut equal, mut total) = (0, 0);
            for rep in 0..a.grid.reps {
                let key = splitmix((level as u64) << 40 ^ (ti as u64) << 20 ^ rep as u64);
                let reqs: Vec<Request> = (0..level as u64)
                    .map(|i| {
                        let seed = splitmix(key ^ i.wrapping_mul(0x9e37_79b9));
                        let len = 32 + (seed % 33) as usize;
                        let prompt = (0..len as u64).map(|j| (10 + splitmix(seed ^ j) % (vocab - 10)) as u32).collect();
                        let params = SamplingParams { temperature: temp, seed, ..SamplingParams::greedy() };
                        Request { params, ignore_eos: true, ..Request::greedy(prompt, a.grid.tokens) }
                    })
                    .collect();
                let t0 = Instant::now();
                let rxs = reqs.iter().map(|r| h.submit(r.clone()).map(|(_, rx)| rx)).collect::<Result<Vec<_>, _>>()?;
                let replies = rxs.into_iter().map(collect).collect::<anyhow::Result<Vec<_>>>()?;
                let wall = t0.elapsed().as_secs_f64();
                let generated: usize = replies.iter().map(|r| r.tokens.len()).sum();
                aggregate.push(generated as f64 / wall);
                for r in &replies {
                    let decode = r.stats.decode.as_secs_f64();
                    if r.tokens.len() > 1 && decode > 0.0 {
                        per_stream.push((r.tokens.len() - 1) as f64 / decode);
                    }
                    ttft.push(r.stats.ttft.as_secs_f64() * 1e3);
                }
                for (r, got) in reqs.iter().zip(&replies) {
                    let solo_cfg =
                        SoloConfig { chunk, max_tokens: r.max_tokens, context, stop_ids: Vec::new(), params: r.params };
                    let (want, _) = generate(&solo_model, &r.prompt, &solo_cfg, |_| true)?;
                    total += 1;
                    if got.reason == FinishReason::Length && token_sha256(&got.tokens) == token_sha256(&want) {
                        equal += 1;
                    } else {
                        eprintln!(
                            "mismatch: level {level} temp {temp} rep {rep}: {:?} {:?}, {} tokens (solo {}), sha {} vs {}",
                            got.reason,
                            got.error,
                            got.tokens.len(),
                            want.len(),
                            token_sha256(&got.tokens),
                            token_sha256(&want)
                        );
                    }
                }
            }
            println!(
                "{level:>5}  {temp:>4.2}  {:>15.1}  {:>16.1}  {:>7.2}  {equal} of {total}",
                median(&mut aggregate),
                median(&mut per_stream),
                median(&mut ttft)
            );
            equal_all += equal;
            total_all += total;
        }
    }
    println!("equal: {equal_all} of {total_all} concurrent replies equal their solo runs");
    Ok(if equal_all == total_all { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
