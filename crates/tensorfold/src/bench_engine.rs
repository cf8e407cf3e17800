//! `tensorfold bench engine`: shared-round throughput of the threaded engine in process. For each level L and
//! temperature: L requests with distinct seeded prompts submitted at once; aggregate decode tok/s (generated
//! tokens over the wall time from submission to the last `Finished`), per-stream decode tok/s and TTFT medians
//! over the reps; then every concurrent reply's token_sha256 is checked against its solo run (non-zero exit on
//! any mismatch). With a drafter, each repetition runs plain (`"draft": false`) and drafted requests, in
//! alternating order, and reports both with the drafted and accepted counts and the mean accepted length. `fwd %`
//! is the share of the engine's round time spent inside the target's forward (the rest is host work).
//! `--json FILE` writes the same figures, per-repetition values and reply hashes as a JSON summary.

use crate::default_model;
use crate::memory_budget::{BudgetAsk, stream_budget};
use anyhow::Context;
use serde_json::{Value, json};
use std::process::ExitCode;
use std::sync::mpsc::Receiver;
use std::time::Instant;
use tensorfold_engine::core::EngineConfig;
use tensorfold_engine::keyed::{SamplingParams, token_sha256};
use tensorfold_engine::model_target::MAX_DRAFT;
use tensorfold_engine::single::{GenerateOptions, generate};
use tensorfold_engine::{Engine, Event, FinishReason, ModelTarget, Request, Stats};

/// Options of `bench engine`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (default: the default pair, models/lfm2-moe-pycode, compiled into the binary unless built
    /// without `embedded-model`).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Concurrency levels, tokens, repetitions and temperatures.
    #[command(flatten)]
    grid: crate::bench::Grid,
    /// Lanes (default: the largest level).
    #[arg(long)]
    parallel: Option<usize>,
    /// Memory admission's budget in GiB (default: 8 on the CPU; on a GPU what `serve` takes by default, 0.9 of the
    /// device memory free after the weights, less the prompt cache and one round's activations).
    #[arg(long)]
    memory_gib: Option<f64>,
    /// One forward over all streams' rows a round (true) or one forward per stream (false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    shared_rounds: bool,
    /// Most drafts a verify window carries (0: plain decode rounds only).
    #[arg(long, default_value_t = 0)]
    max_draft: usize,
    /// DSpark drafter directory (default: the default pair's own drafter, when the model is the default pair).
    #[arg(long)]
    drafter: Option<std::path::PathBuf>,
    /// Quantize the drafter's linears at load: 8 = 8-bit affine codes.
    #[arg(long, value_parser = default_model::parse_drafter_bits)]
    drafter_bits: Option<tensorfold_model::drafter::DrafterBits>,
    /// How many drafts a verify window carries.
    #[arg(long, value_enum, default_value_t = crate::Verify::Depth)]
    verify: crate::Verify,
    /// Turn off the guards (every round drafts): for measuring acceptance.
    #[arg(long)]
    no_round_guard: bool,
    /// Read each drafter block before its verify (the A/B baseline of held drafts).
    #[arg(long, env = "TENSORFOLD_NO_HELD_DRAFTS")]
    no_held_drafts: bool,
    /// Context copies: shortest recurring suffix (0: copies off, only the drafter drafts).
    #[arg(long, default_value_t = 8)]
    copy_min: usize,
    #[command(flatten)]
    dev: crate::devices::DeviceArgs,
    /// Prompts as JSON lines (one JSON string a line), tokenized with the model's tokenizer; request i
    /// takes line i mod n (default: random token ids).
    #[arg(long, conflicts_with = "prompt_tokens")]
    prompts: Option<std::path::PathBuf>,
    /// Random prompts of exactly this many tokens (default: 32 to 64), e.g. 1920 with `--tokens 128` for streams of
    /// 2,048-token contexts.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    prompt_tokens: Option<u32>,
    /// Replies of each run checked against their solo runs (default: all); the summary says how many were.
    #[arg(long)]
    check: Option<usize>,
    /// Top-k of the sampled requests (0: off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Top-p of the sampled requests (1: off); a refused value fails every sampled reply by name.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Also write a JSON summary of every printed figure (with the per-repetition values) to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
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
            Event::Finished { reason, error, stats, .. } => return Ok(Reply { tokens, reason, error, stats }),
            _ => {}
        }
    }
    anyhow::bail!("the engine stopped before the request finished")
}

/// Runs the benchmark on `--device`.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    crate::on_device(a.dev, a)
}

impl crate::OnBackend for Args {
    fn run<B: crate::devices::Ranks>(self, dev: crate::devices::Devices<B>) -> anyhow::Result<ExitCode> {
        run_on(dev, self)
    }
}

fn run_on<B: crate::devices::Ranks>(dev: crate::devices::Devices<B>, a: Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !a.grid.levels.is_empty() && a.grid.levels.iter().all(|&l| l > 0),
        "--levels needs numbers above 0"
    );
    anyhow::ensure!(a.grid.reps > 0 && a.grid.tokens > 0, "--reps and --tokens must be at least 1");
    anyhow::ensure!(a.check != Some(0), "--check must be at least 1 (every run's replies are checked)");
    let src = default_model::source(a.model.clone())?;
    let mut loaded = dev.open(&src)?;
    if a.max_draft > 0 {
        let d = default_model::drafter_source(&a.model, a.drafter.clone());
        default_model::attach_drafter(&mut loaded.model, d, a.drafter_bits.unwrap_or_default())?;
        crate::check_verify(a.verify, &loaded.model)?;
    }
    let prompts = match a.prompts.as_deref() {
        Some(path) => Prompts::Lines(read_prompts(path, loaded.text.as_ref())?),
        None => Prompts::Random(a.prompt_tokens.map(|n| n as usize)),
    };
    let drafting = a.max_draft > 0;
    let (vocab, context) = (loaded.model.cfg.vocab as u64, loaded.model.cfg.max_positions);
    let max_level = a.grid.levels.iter().copied().max().unwrap_or(1);
    let parallel = a.parallel.unwrap_or(max_level).max(1);
    let mut cfg = EngineConfig {
        parallel,
        round_rows: EngineConfig::default_round_rows(parallel, EngineConfig::default().prefill_chunk),
        queue_capacity: max_level.max(64),
        shared_rounds: a.shared_rounds,
        max_draft: a.max_draft,
        copy_min: a.copy_min,
        verify: a.verify.into(),
        round_guard: !a.no_round_guard,
        stream_guard: !a.no_round_guard,
        held_drafts: !a.no_held_drafts,
        ..EngineConfig::default()
    };
    println!(
        "model: {}  backend: {} x{}  threads: {}  simd: {:?}  parallel: {}  shared_rounds: {}  max_draft: {}  tokens: {}  reps: {}",
        src.describe(),
        dev.backend.name(),
        dev.world(),
        tensorfold_kernels::cpu::threads(),
        tensorfold_kernels::simd::level(),
        cfg.parallel,
        cfg.shared_rounds,
        cfg.max_draft,
        a.grid.tokens,
        a.grid.reps
    );
    let mut out = crate::bench::summary_head("engine");
    if let Value::Object(run) = json!({
        "model": src.describe(), "backend": dev.backend.name(), "world": dev.world(),
        "threads": tensorfold_kernels::cpu::threads(), "simd": format!("{:?}", tensorfold_kernels::simd::level()),
        "parallel": cfg.parallel, "shared_rounds": cfg.shared_rounds, "max_draft": cfg.max_draft,
        "tokens": a.grid.tokens, "reps": a.grid.reps, "levels": a.grid.levels,
        "temperatures": a.grid.temperatures.iter().map(|&t| crate::bench::f32_json(t)).collect::<Vec<_>>(),
        "top_k": a.top_k, "top_p": crate::bench::f32_json(a.top_p),
    }) {
        out.extend(run);
    }
    let mut rows_json = Vec::new();
    let chunk = cfg.prefill_chunk;
    // Plain runs: the solo runs share the engine's weights (the engine is idle while they run), one copy on the
    // device. Drafted runs: the solo reference is a second copy without the drafter, independent of its code path.
    let model = std::sync::Arc::new(loaded.model);
    let solo_model = if drafting {
        std::sync::Arc::new(dev.open(&src).context("opening the model for the solo runs")?.model)
    } else {
        model.clone()
    };
    // After the solo copy is loaded: on a GPU the budget is what the weights leave.
    let ask = BudgetAsk {
        gib: a.memory_gib,
        host_gib: 8.0,
        prompt_cache_bytes: cfg.prompt_cache_bytes,
        round_rows: cfg.round_rows,
        parallel: cfg.parallel,
        verify_rows: cfg.verify_rows(MAX_DRAFT),
    };
    let budget = stream_budget(&model, &ask)?;
    cfg.memory_bytes = budget.bytes;
    println!("memory admission: {}", budget.how);
    let profiled = model.clone();
    // The first report would hold the loads' and warm-ups' kernels too.
    let _loads = (profiled.backend.take_profile(), solo_model.backend.take_profile());
    let engine = Engine::start(ModelTarget { model, eos: loaded.eos_ids }, cfg);
    let h = engine.handle();
    println!("sampled requests: top_k {} top_p {} (greedy ones: off)", a.top_k, a.top_p);
    println!(
        "level  temp  mode     aggregate tok/s  per-stream tok/s  TTFT ms  drafted  accepted  mean acc len  fwd %  equal"
    );
    let (mut equal_all, mut total_all) = (0usize, 0usize);
    for &level in &a.grid.levels {
        for (ti, &temp) in a.grid.temperatures.iter().enumerate() {
            let modes: &[bool] = if drafting { &[false, true] } else { &[false] };
            let mut rows: Vec<Row> = modes.iter().map(|_| Row::default()).collect();
            for rep in 0..a.grid.reps {
                let key = splitmix((level as u64) << 40 ^ (ti as u64) << 20 ^ rep as u64);
                let reqs = requests(key, level, (temp, a.top_k, a.top_p), a.grid.tokens, vocab, &prompts);
                // A/B alternated: odd repetitions run drafted first.
                let order: Vec<usize> =
                    if rep % 2 == 1 { (0..modes.len()).rev().collect() } else { (0..modes.len()).collect() };
                for m in order {
                    let reqs: Vec<Request> = reqs.iter().map(|r| Request { draft: modes[m], ..r.clone() }).collect();
                    let m0 = h.metrics();
                    let t0 = Instant::now();
                    // One command for the level: `submit` in a loop would admit one request a round.
                    let rxs = h
                        .submit_all(reqs.clone())
                        .into_iter()
                        .map(|s| s.map(|(_, rx)| rx))
                        .collect::<Result<Vec<_>, _>>()?;
                    let replies = rxs.into_iter().map(collect).collect::<anyhow::Result<Vec<_>>>()?;
                    rows[m].add(&replies, t0.elapsed().as_secs_f64());
                    // A kernel profile (TENSORFOLD_CUDA_PROFILE) of the concurrent run alone, apart from its checks.
                    if let Some(p) = profiled.backend.take_profile() {
                        println!("level {level} temp {temp} rep {rep}: the concurrent run's kernels: {p}");
                    }
                    let m1 = h.metrics();
                    rows[m].round_s += m1.round_seconds - m0.round_seconds;
                    rows[m].forward_s += m1.forward_seconds - m0.forward_seconds;
                    for (r, got) in reqs.iter().zip(&replies).take(a.check.unwrap_or(usize::MAX)) {
                        let solo_cfg = GenerateOptions {
                            chunk,
                            max_tokens: r.max_tokens,
                            context,
                            stop_ids: Vec::new(),
                            params: r.params,
                            penalties: r.penalties.clone(),
                            grammar: r.grammar.clone(),
                            drafts: None,
                        };
                        let (want, _) = generate(&solo_model, &r.prompt, &solo_cfg, |_| true)?;
                        total_all += 1;
                        if got.reason == FinishReason::Length && token_sha256(&got.tokens) == token_sha256(&want) {
                            equal_all += 1;
                            rows[m].equal += 1;
                        } else {
                            eprintln!(
                                "mismatch: level {level} temp {temp} rep {rep} draft {}: {:?} {:?}, {} tokens (solo {}), sha {} vs {}",
                                modes[m],
                                got.reason,
                                got.error,
                                got.tokens.len(),
                                want.len(),
                                token_sha256(&got.tokens),
                                token_sha256(&want)
                            );
                        }
                        rows[m].total += 1;
                    }
                    let _solo_runs = (profiled.backend.take_profile(), solo_model.backend.take_profile());
                }
            }
            let mut figures = Vec::new();
            for (m, row) in rows.iter_mut().enumerate() {
                figures.push(row.print(level, temp, if modes[m] { "drafted" } else { "plain" }));
            }
            // Compare runs (devices, commits) by these: every reply's tokens, in request order.
            for (m, row) in rows.iter().enumerate() {
                let mode = if modes[m] { "drafted" } else { "plain" };
                println!(
                    "replies: level {level} temp {temp:.2} {mode}: token_sha256 {}",
                    token_sha256(&row.all_tokens)
                );
                let mut f = figures[m].take();
                f["replies_token_sha256"] = json!(token_sha256(&row.all_tokens));
                rows_json.push(f);
            }
        }
    }
    out.insert("rows".into(), json!(rows_json));
    let m = h.metrics();
    println!("held drafts: {} of {} verify windows held their drafts on the device", m.held_windows, m.draft_windows);
    out.insert("held_windows".into(), json!(m.held_windows));
    out.insert("draft_windows".into(), json!(m.draft_windows));
    // GiB from 1 GiB up, MiB below (a small model's share would print as 0.00 GiB).
    let size = |b: usize| match b as f64 / (1u64 << 30) as f64 {
        g if g >= 1.0 => format!("{g:.2} GiB"),
        g => format!("{:.1} MiB", g * 1024.0),
    };
    let mut devices = Vec::new();
    for (d, (w, high)) in
        solo_model.weight_bytes_by_rank().into_iter().zip(solo_model.memory_high_by_rank()).enumerate()
    {
        devices.push(json!({"rank": d, "weight_bytes": w, "allocated_bytes": high.map(|h| h.0),
            "reserved_bytes": high.map(|h| h.1)}));
        let high =
            high.map_or("host memory".into(), |(a, r)| format!("peak {} allocated, {} reserved", size(a), size(r)));
        println!("device {d}: weights {}, {high}", size(w));
    }
    out.insert("devices".into(), json!(devices));
    if let Some(g) = solo_model.backend.graph_report() {
        println!("{g}");
        out.insert("graphs".into(), json!(g.to_string()));
    }
    println!("equal: {equal_all} of {total_all} concurrent replies checked equal their solo runs");
    out.insert("equal".into(), json!(equal_all));
    out.insert("checked".into(), json!(total_all));
    if let Some(path) = &a.json {
        crate::bench::write_summary(path, &Value::Object(out))?;
    }
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

/// One (level, temperature, mode) line: medians over the repetitions and the draft counters.
#[derive(Default)]
struct Row {
    aggregate: Vec<f64>,
    per_stream: Vec<f64>,
    ttft: Vec<f64>,
    drafted: usize,
    accepted: usize,
    windows: usize,
    equal: usize,
    total: usize,
    /// Engine round seconds and, of those, seconds inside the target's forward, over this line's runs.
    round_s: f64,
    forward_s: f64,
    /// Every reply's length then tokens, in request order over the repetitions (one hash to compare runs by).
    all_tokens: Vec<u32>,
}

impl Row {
    fn add(&mut self, replies: &[Reply], wall: f64) {
        for r in replies {
            self.all_tokens.push(r.tokens.len() as u32);
            self.all_tokens.extend(&r.tokens);
        }
        let generated: usize = replies.iter().map(|r| r.tokens.len()).sum();
        self.aggregate.push(generated as f64 / wall);
        for r in replies {
            let decode = r.stats.decode.as_secs_f64();
            if r.tokens.len() > 1 && decode > 0.0 {
                self.per_stream.push((r.tokens.len() - 1) as f64 / decode);
            }
            self.ttft.push(r.stats.ttft.as_secs_f64() * 1e3);
            (self.drafted, self.accepted, self.windows) =
                (self.drafted + r.stats.drafted, self.accepted + r.stats.accepted, self.windows + r.stats.windows);
        }
    }

    /// Prints the line; returns its figures (and the per-repetition values the medians come from) as JSON.
    fn print(&mut self, level: usize, temp: f32, mode: &str) -> Value {
        let mean = tensorfold_engine::request::mean_accepted_length(self.accepted as u64, self.windows as u64);
        let reps = self.aggregate.clone();
        let (aggregate, per_stream, ttft) =
            (median(&mut self.aggregate), median(&mut self.per_stream), median(&mut self.ttft));
        let fwd = 100.0 * self.forward_s / self.round_s.max(f64::MIN_POSITIVE);
        println!(
            "{level:>5}  {temp:>4.2}  {mode:<7}  {:>15.1}  {:>16.1}  {:>7.2}  {:>7}  {:>8}  {:>12.2}  {:>5.1}  {} of {}",
            aggregate, per_stream, ttft, self.drafted, self.accepted, mean, fwd, self.equal, self.total
        );
        json!({
            "level": level, "temperature": crate::bench::f32_json(temp), "mode": mode, "aggregate_tok_s": aggregate,
            "per_stream_tok_s": per_stream, "ttft_ms": ttft, "drafted": self.drafted, "accepted": self.accepted,
            "windows": self.windows, "mean_accepted_length": mean, "forward_percent": fwd, "equal": self.equal,
            "checked": self.total, "aggregate_tok_s_reps": reps,
        })
    }
}

/// Where the requests' prompts come from.
enum Prompts {
    /// Seeded random token ids, of this many tokens (default: 32 to 64).
    Random(Option<usize>),
    /// The prompt file's lines, tokenized (at least one).
    Lines(Vec<Vec<u32>>),
}

/// `level` requests with distinct seeds: random token prompts, or line `i mod n` of the prompt file.
fn requests(
    key: u64,
    level: usize,
    filters: (f32, usize, f32),
    tokens: usize,
    vocab: u64,
    prompts: &Prompts,
) -> Vec<Request> {
    let (temp, top_k, top_p) = filters;
    (0..level as u64)
        .map(|i| {
            let seed = splitmix(key ^ i.wrapping_mul(0x9e37_79b9));
            let prompt = match prompts {
                Prompts::Random(len) => {
                    let len = len.unwrap_or(32 + (seed % 33) as usize);
                    (0..len as u64).map(|j| (10 + splitmix(seed ^ j) % (vocab - 10)) as u32).collect()
                }
                Prompts::Lines(lines) => lines[(key as usize).wrapping_add(i as usize) % lines.len()].clone(),
            };
            let (top_k, top_p) = if temp > 0.0 { (top_k, top_p) } else { (0, 1.0) };
            let params = SamplingParams { temperature: temp, seed, top_k, top_p, ..SamplingParams::greedy() };
            Request { params, ignore_eos: true, ..Request::greedy(prompt, tokens) }
        })
        .collect()
}

/// Reads a JSON-lines prompt file (one JSON string a line) and tokenizes each line.
fn read_prompts(path: &std::path::Path, text: Option<&tensorfold_text::Text>) -> anyhow::Result<Vec<Vec<u32>>> {
    let text = text.ok_or_else(|| anyhow::anyhow!("--prompts needs a model with tokenizer files"))?;
    let body = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in body.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let s: String = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not a JSON string", path.display(), n + 1))?;
        let ids = text.encode_prompt(&s)?;
        anyhow::ensure!(!ids.is_empty(), "{} line {}: an empty prompt", path.display(), n + 1);
        out.push(ids);
    }
    anyhow::ensure!(!out.is_empty(), "{} holds no prompts", path.display());
    Ok(out)
}
