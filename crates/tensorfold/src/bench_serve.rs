//! `tensorfold bench serve`: a client benchmark against any OpenAI-compatible server (ours, llama.cpp's
//! llama-server, vLLM). For each level L, temperature and rep: L concurrent streaming `/v1/completions` requests
//! (one thread each, distinct prompts, `ignore_eos`, a fixed seed per stream for sampled cells); per stream TTFT,
//! gaps between content chunks and completion tokens; per cell the medians over reps of aggregate tok/s (all
//! completion tokens over the level's wall time), per-stream decode tok/s, TTFT and ITL p50/p99. Where the server
//! reports `tensorfold.token_sha256`, `--alone` checks each concurrent reply equal to the same request sent alone
//! and `--serial` checks the default reply equal to `"draft": false`; any unequal hash exits non-zero.
//! `--json FILE` writes every raw figure (each stream's reply, each cell's medians, the checks) as JSON.

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Options of `bench serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Server base URL, e.g. http://127.0.0.1:8080 (a trailing /v1 is accepted).
    #[arg(long)]
    url: String,
    /// Model name to send (default: the first id of GET /v1/models, or none).
    #[arg(long)]
    model: Option<String>,
    /// Concurrency levels, tokens, repetitions and temperatures.
    #[command(flatten)]
    grid: crate::bench::Grid,
    /// Prompts, one a line (default: a built-in list of 16).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Re-send each request alone and check its token_sha256 equals the concurrent replies'.
    #[arg(long)]
    alone: bool,
    /// Send each request alone with `"draft": false` and check its token_sha256 equals the default reply's.
    #[arg(long)]
    serial: bool,
    /// Also write a JSON summary with every raw figure (each stream's reply and hash) to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Send `Authorization: Bearer KEY`.
    #[arg(long)]
    api_key: Option<String>,
    /// Seconds one request may take, from connect to the end of its stream.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
}

/// The built-in prompts: short, varied English and Python.
const PROMPTS: [&str; 16] = [
    "The history of the printing press begins",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Write a short poem about the sea at night.",
    "import json\n\ndef load_config(path):\n",
    "Explain in simple terms why the sky is blue.",
    "class Stack:\n    def __init__(self):\n",
    "Here is a recipe for a quick vegetable soup:",
    "The three most important ideas in economics are",
    "def quicksort(xs):\n",
    "Dear hiring manager, I am writing to apply for",
    "# Parse a CSV file and print the average of the second column\nimport csv\n",
    "Once upon a time, in a village at the edge of a forest,",
    "Q: What is the capital of Australia?\nA:",
    "async def fetch_all(urls):\n",
    "A summary of the rules of chess for beginners:",
    "for i in range(10):\n    if i % 3 == 0:\n",
];

/// Longest SSE line accepted.
const MAX_LINE: usize = 1 << 20;

/// Why one request failed; named so a bad server reply never panics the benchmark.
#[derive(Debug, thiserror::Error)]
enum ReplyError {
    #[error("transport: {0}")]
    Transport(String),
    #[error("HTTP {status}: {message}")]
    Status { status: u16, message: String },
    #[error("the server sent an error event: {0}")]
    Event(String),
    #[error("an SSE data line is not JSON: {0}")]
    BadJson(String),
    #[error("the stream ended without [DONE] or a finish_reason")]
    NoDone,
    #[error("an SSE line longer than {MAX_LINE} bytes")]
    LineTooLong,
    #[error("reading the stream: {0}")]
    Read(String),
}

/// One request: which prompt, the temperature, the seed (sampled cells) and the `draft` field (if sent).
#[derive(Clone, Copy, Debug)]
struct Job {
    prompt: usize,
    temperature: f32,
    seed: Option<u64>,
    draft: Option<bool>,
}

impl Job {
    /// Identifies the request apart from `draft` (equal keys send equal bodies).
    fn key(&self) -> (usize, u32, Option<u64>) {
        (self.prompt, self.temperature.to_bits(), self.seed)
    }
}

impl std::fmt::Display for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "prompt {} temp {} seed {:?}", self.prompt, self.temperature, self.seed)?;
        self.draft.map_or(Ok(()), |d| write!(f, " draft {d}"))
    }
}

/// When one stream started and ended.
#[derive(Debug)]
struct Span(Instant, Instant);

impl Default for Span {
    fn default() -> Self {
        Span(Instant::now(), Instant::now())
    }
}

/// What one stream measured.
#[derive(Debug, Default)]
struct Reply {
    span: Span,
    ttft_s: Option<f64>,
    gaps_s: Vec<f64>,
    chunks: usize,
    usage_tokens: Option<u64>,
    token_sha256: Option<String>,
    finish_reason: Option<String>,
    text: String,
}

impl Reply {
    /// Completion tokens: the usage chunk's count, else the number of content chunks.
    fn tokens(&self) -> u64 {
        self.usage_tokens.unwrap_or(self.chunks as u64)
    }

    fn elapsed_s(&self) -> f64 {
        (self.span.1 - self.span.0).as_secs_f64()
    }

    /// Decode tok/s of this stream: the tokens after the first over the time after the first content chunk.
    fn stream_tok_s(&self) -> Option<f64> {
        let decode = self.elapsed_s() - self.ttft_s?;
        (self.tokens() > 1 && decode > 0.0).then(|| (self.tokens() - 1) as f64 / decode)
    }

    fn to_json(&self) -> Value {
        json!({
            "elapsed_s": self.elapsed_s(), "ttft_s": self.ttft_s, "gaps_s": self.gaps_s, "chunks": self.chunks,
            "usage_tokens": self.usage_tokens, "tokens": self.tokens(), "stream_tok_s": self.stream_tok_s(),
            "token_sha256": self.token_sha256, "finish_reason": self.finish_reason, "text": self.text,
        })
    }
}

type Outcome = Result<Reply, ReplyError>;

/// The HTTP side: one agent, the base URL and what every request carries.
struct Client {
    agent: ureq::Agent,
    base: String,
    model: Option<String>,
    api_key: Option<String>,
    tokens: usize,
    prompts: Vec<String>,
}

impl Client {
    fn body(&self, job: &Job) -> Value {
        let mut b = json!({
            "prompt": self.prompts[job.prompt % self.prompts.len()], "max_tokens": self.tokens,
            "temperature": job.temperature, "stream": true, "stream_options": {"include_usage": true},
            "ignore_eos": true,
        });
        let optional = [("model", self.model.as_ref().map(|m| json!(m))), ("seed", job.seed.map(|s| json!(s)))];
        for (k, v) in optional.into_iter().chain([("draft", job.draft.map(|d| json!(d)))]) {
            if let Some(v) = v {
                b[k] = v;
            }
        }
        b
    }

    /// Sends one streaming request and measures its reply.
    fn send(&self, job: &Job) -> Outcome {
        let body = self.body(job).to_string();
        let started = Instant::now();
        let mut req = self
            .agent
            .post(format!("{}/v1/completions", self.base))
            .header("content-type", "application/json")
            .header("accept", "text/event-stream");
        if let Some(k) = &self.api_key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let resp = req.send(body.as_bytes()).map_err(|e| ReplyError::Transport(e.to_string()))?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        if status != 200 {
            let text = body.read_to_string().unwrap_or_default();
            return Err(ReplyError::Status { status, message: error_message(&text) });
        }
        parse_sse(BufReader::new(body.into_reader()), started)
    }

    /// `GET /v1/models`: the first model id, if the server lists one.
    fn first_model(&self) -> Option<String> {
        let mut req = self.agent.get(format!("{}/v1/models", self.base));
        if let Some(k) = &self.api_key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let mut resp = req.call().ok().filter(|r| r.status().as_u16() == 200)?;
        let v: Value = serde_json::from_str(&resp.body_mut().read_to_string().ok()?).ok()?;
        v.pointer("/data/0/id").and_then(Value::as_str).map(str::to_string)
    }
}

/// The message of an OpenAI-shaped error body, else the body itself (cut short).
fn error_message(text: &str) -> String {
    let v: Option<Value> = serde_json::from_str(text).ok();
    let msg = v.as_ref().and_then(|v| {
        v.pointer("/error/message").or_else(|| v.get("error")).or_else(|| v.get("message")).map(|m| match m {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    });
    msg.unwrap_or_else(|| text.chars().take(300).collect())
}

/// Reads an SSE reply by lines: `data:` fields joined per event, comments and keepalives skipped, stops at
/// `[DONE]`. A stream that ends without `[DONE]` is accepted once a finish_reason came.
fn parse_sse(mut r: impl BufRead, started: Instant) -> Outcome {
    let mut reply = Reply { span: Span(started, started), ..Reply::default() };
    let (mut data, mut event) = (String::new(), String::new());
    let mut last: Option<Instant> = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut r)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| ReplyError::Read(e.to_string()))?;
        if n > MAX_LINE {
            return Err(ReplyError::LineTooLong);
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\r', '\n']);
        if n == 0 || text.is_empty() {
            if !data.is_empty() {
                if data.trim() == "[DONE]" {
                    reply.span.1 = Instant::now();
                    return Ok(reply);
                }
                on_event(&event, &data, &mut reply, &mut last)?;
            }
            data.clear();
            event.clear();
            if n == 0 {
                break;
            }
            continue;
        }
        // A comment (`: ...`) has the empty field name and is skipped with the other unknown fields.
        let (field, value) = text.split_once(':').unwrap_or((text, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "data" => {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value);
            }
            "event" => event = value.to_string(),
            _ => {}
        }
    }
    reply.span.1 = Instant::now();
    if reply.finish_reason.is_some() { Ok(reply) } else { Err(ReplyError::NoDone) }
}

fn on_event(event: &str, data: &str, reply: &mut Reply, last: &mut Option<Instant>) -> Result<(), ReplyError> {
    let v: Value = serde_json::from_str(data).map_err(|_| ReplyError::BadJson(data.chars().take(200).collect()))?;
    if event == "error" || v.get("error").is_some_and(|e| !e.is_null()) {
        return Err(ReplyError::Event(error_message(data)));
    }
    let now = Instant::now();
    if let Some(c) = v.pointer("/choices/0") {
        let piece = c.get("text").or_else(|| c.pointer("/delta/content")).and_then(Value::as_str).unwrap_or("");
        if !piece.is_empty() {
            match *last {
                Some(prev) => reply.gaps_s.push((now - prev).as_secs_f64()),
                None => reply.ttft_s = Some((now - reply.span.0).as_secs_f64()),
            }
            *last = Some(now);
            reply.chunks += 1;
            reply.text.push_str(piece);
        }
        if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
            reply.finish_reason = Some(f.to_string());
        }
    }
    if let Some(u) = v.pointer("/usage/completion_tokens").and_then(Value::as_u64) {
        reply.usage_tokens = Some(u);
    }
    if let Some(h) = v.pointer("/tensorfold/token_sha256").and_then(Value::as_str) {
        reply.token_sha256 = Some(h.to_string());
    }
    Ok(())
}

/// Sends `jobs` at once, one thread each, released together.
fn concurrent(client: &Client, jobs: &[Job]) -> Vec<Outcome> {
    let barrier = &Barrier::new(jobs.len());
    let send = move |j| {
        barrier.wait();
        client.send(j)
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs.iter().map(|j| s.spawn(move || send(j))).collect();
        let lost = || Err(ReplyError::Transport("the client thread panicked".into()));
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| lost())).collect()
    })
}

/// Counts of hash comparisons.
#[derive(Default)]
struct Checks {
    equal: usize,
    unequal: usize,
    unavailable: usize,
}

impl Checks {
    fn compare(&mut self, a: &Outcome, b: &Outcome, what: &str) {
        let hash = |o: &Outcome| o.as_ref().ok().and_then(|r| r.token_sha256.clone());
        match (hash(a), hash(b)) {
            (Some(x), Some(y)) if x == y => self.equal += 1,
            (Some(x), Some(y)) => {
                self.unequal += 1;
                eprintln!("unequal: {what}: {x} vs {y}");
            }
            _ => self.unavailable += 1,
        }
    }
}

fn outcome_json(job: &Job, o: &Outcome) -> Value {
    let mut v = o.as_ref().map_or_else(|e| json!({"error": e.to_string()}), Reply::to_json);
    v["job"] =
        json!({"prompt_index": job.prompt, "temperature": job.temperature, "seed": job.seed, "draft": job.draft});
    v
}

/// Runs the benchmark.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    ensure!(!a.grid.levels.is_empty() && a.grid.levels.iter().all(|&l| l > 0), "--levels needs numbers above 0");
    ensure!(a.grid.reps > 0 && a.grid.tokens > 0, "--reps and --tokens must be at least 1");
    ensure!(!a.grid.temperatures.is_empty(), "--temperatures needs at least one value");
    let prompts: Vec<String> = match &a.prompts {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("reading {}", f.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
        None => PROMPTS.iter().map(|p| p.to_string()).collect(),
    };
    ensure!(!prompts.is_empty(), "--prompts: the file has no prompts");
    let base = a.url.trim_end_matches('/').trim_end_matches("/v1").trim_end_matches('/').to_string();
    ensure!(base.starts_with("http://"), "--url must start with http:// (this client speaks no TLS)");
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(10)))
        .timeout_global(Some(Duration::from_secs(a.timeout.max(1))))
        .build();
    let (agent, api_key, tokens) = (ureq::Agent::new_with_config(config), a.api_key.clone(), a.grid.tokens);
    let mut client = Client { agent, base, model: None, api_key, tokens, prompts };
    client.model = a.model.clone().or_else(|| client.first_model());
    let (base, model, n) = (&client.base, client.model.as_deref().unwrap_or("(none sent)"), client.prompts.len());
    println!("server: {base}  model: {model}  tokens: {}  reps: {}  prompts: {n}", a.grid.tokens, a.grid.reps);
    println!("level  temp  aggregate tok/s  per-stream tok/s  TTFT ms  ITL p50 ms  ITL p99 ms  tok/stream  errors");
    let (mut errors, mut short) = (0usize, 0usize);
    let mut cells = Vec::new();
    // Every concurrent reply, for the checks after the runs.
    let mut sent: Vec<(Job, Outcome, String)> = Vec::new();
    for &level in &a.grid.levels {
        for &temp in &a.grid.temperatures {
            let jobs: Vec<Job> = (0..level)
                .map(|i| Job {
                    prompt: i % client.prompts.len(),
                    temperature: temp,
                    seed: (temp > 0.0).then_some(1000 + i as u64),
                    draft: None,
                })
                .collect();
            let (mut figures, mut reps_json, mut cell_errors) = (Vec::new(), Vec::new(), 0);
            for rep in 0..a.grid.reps {
                let outs = concurrent(&client, &jobs);
                let ok: Vec<&Reply> = outs.iter().filter_map(|o| o.as_ref().ok()).collect();
                let wall = match (ok.iter().map(|r| r.span.0).min(), ok.iter().map(|r| r.span.1).max()) {
                    (Some(s), Some(e)) => (e - s).as_secs_f64(),
                    _ => f64::NAN,
                };
                let total: u64 = ok.iter().map(|r| r.tokens()).sum();
                figures.push(rep_figures(&ok, wall));
                for (i, o) in outs.iter().enumerate() {
                    match o {
                        Err(e) => {
                            cell_errors += 1;
                            eprintln!("error: level {level} rep {rep} stream {i} ({}): {e}", jobs[i]);
                        }
                        Ok(r) if r.tokens() != a.grid.tokens as u64 || r.finish_reason.as_deref() != Some("length") => {
                            short += 1;
                            let (n, f) = (r.tokens(), &r.finish_reason);
                            eprintln!("note: level {level} rep {rep} stream {i}: {n} tokens, finish_reason {f:?}");
                        }
                        Ok(_) => {}
                    }
                }
                reps_json.push(json!({
                    "rep": rep, "wall_s": wall, "completion_tokens": total, "aggregate_tok_s": total as f64 / wall,
                    "streams": jobs.iter().zip(&outs).map(|(j, o)| outcome_json(j, o)).collect::<Vec<_>>(),
                }));
                sent.extend(
                    jobs.iter()
                        .zip(outs)
                        .enumerate()
                        .map(|(i, (j, o))| (*j, o, format!("level {level} rep {rep} stream {i}"))),
                );
            }
            let med: Vec<f64> =
                (0..FIGURES.len()).map(|k| median(&figures.iter().map(|f| f[k]).collect::<Vec<_>>())).collect();
            println!(
                "{level:>5}  {temp:>4.2}  {:>15.1}  {:>16.1}  {:>7.1}  {:>10.2}  {:>10.2}  {:>10.0}  {cell_errors:>6}",
                med[0], med[1], med[2], med[3], med[4], med[5]
            );
            let mut summary: serde_json::Map<String, Value> =
                FIGURES.iter().zip(&med).map(|(k, v)| (k.to_string(), json!(v))).collect();
            summary.insert("errors".into(), json!(cell_errors));
            errors += cell_errors;
            cells.push(json!({"level": level, "temperature": temp, "summary": summary, "reps": reps_json}));
        }
    }
    let mut checks = Checks::default();
    let mut seen = HashSet::new();
    let unique: Vec<Job> = sent.iter().map(|s| s.0).filter(|j| seen.insert(j.key())).collect();
    // Each distinct request alone (`--alone`) and with draft false (`--serial`).
    let (mut alone, mut serial) = (Vec::new(), Vec::new());
    for j in unique {
        for (on, draft, out) in [(a.alone, None, &mut alone), (a.serial, Some(false), &mut serial)] {
            if on {
                let j = Job { draft, ..j };
                let o = client.send(&j);
                if let Err(e) = &o {
                    errors += 1;
                    eprintln!("error: {j} alone: {e}");
                }
                out.push((j, o));
            }
        }
    }
    let concurrent_of = |k: (usize, u32, Option<u64>)| sent.iter().filter(move |s| s.0.key() == k);
    for (j, al) in &alone {
        concurrent_of(j.key()).for_each(|(_, c, w)| checks.compare(c, al, &format!("{w}, {j}: concurrent vs alone")));
    }
    for (j, se) in &serial {
        match alone.iter().find(|(k, _)| k.key() == j.key()) {
            Some((_, al)) => checks.compare(al, se, &format!("{j}: alone vs draft false")),
            None => concurrent_of(j.key())
                .for_each(|(_, c, w)| checks.compare(c, se, &format!("{w}, {j}: concurrent vs serial"))),
        }
    }
    if short > 0 {
        println!("note: {short} replies were not {} tokens with finish_reason length (see stderr)", a.grid.tokens);
    }
    if errors > 0 {
        println!("errors: {errors} requests failed (see stderr)");
    }
    println!("hash checks: {} equal, {} unequal, {} unavailable", checks.equal, checks.unequal, checks.unavailable);
    if let Some(path) = &a.json {
        let mut report = crate::bench::summary_head("serve");
        if let Value::Object(r) = json!({
            "url": client.base, "model": client.model, "tokens": a.grid.tokens, "reps": a.grid.reps, "levels": a.grid.levels,
            "temperatures": a.grid.temperatures, "prompts": client.prompts, "cells": cells,
            "alone": alone.iter().map(|(j, o)| outcome_json(j, o)).collect::<Vec<_>>(),
            "serial": serial.iter().map(|(j, o)| outcome_json(j, o)).collect::<Vec<_>>(), "errors": errors, "short_replies": short,
            "checks": {"equal": checks.equal, "unequal": checks.unequal, "unavailable": checks.unavailable},
        }) {
            report.extend(r);
        }
        crate::bench::write_summary(path, &Value::Object(report))?;
    }
    Ok(if checks.unequal == 0 && errors == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Names of the figures of a rep, in the order of `rep_figures`.
const FIGURES: [&str; 6] =
    ["aggregate_tok_s", "stream_tok_s", "ttft_ms", "itl_p50_ms", "itl_p99_ms", "tokens_per_stream"];

/// One rep's figures from its successful replies and wall time.
fn rep_figures(ok: &[&Reply], wall: f64) -> [f64; 6] {
    let total: u64 = ok.iter().map(|r| r.tokens()).sum();
    let gaps: Vec<f64> = ok.iter().flat_map(|r| r.gaps_s.iter().map(|g| g * 1e3)).collect();
    [
        total as f64 / wall,
        median(&ok.iter().filter_map(|r| r.stream_tok_s()).collect::<Vec<_>>()),
        median(&ok.iter().filter_map(|r| r.ttft_s.map(|t| t * 1e3)).collect::<Vec<_>>()),
        percentile(&gaps, 0.50),
        percentile(&gaps, 0.99),
        median(&ok.iter().map(|r| r.tokens() as f64).collect::<Vec<_>>()),
    ]
}

/// The median of the finite values (NaN if none).
fn median(v: &[f64]) -> f64 {
    let v = finite_sorted(v);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The nearest-rank `p` quantile of the finite values (NaN if none).
fn percentile(v: &[f64], p: f64) -> f64 {
    let v = finite_sorted(v);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn finite_sorted(v: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn parse(s: &str) -> Outcome {
        parse_sse(Cursor::new(s.as_bytes().to_vec()), Instant::now())
    }

    #[test]
    fn reads_chunks_usage_hash_and_chat_deltas() {
        let s = ": keepalive\n\ndata: {\"choices\":[{\"text\":\"Hel\",\"finish_reason\":null}]}\n\n\
                 data: {\"choices\":[{\"text\":\"\",\"finish_reason\":null}]}\r\n\r\n\
                 data:{\"choices\":[{\"text\":\"lo\",\"finish_reason\":null}]}\n\n\
                 data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}],\
                 \"tensorfold\":{\"token_sha256\":\"ab\"}}\n\n\
                 data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\ndata: [DONE]\n\n";
        let r = parse(s).unwrap();
        assert_eq!((r.text.as_str(), r.chunks, r.gaps_s.len(), r.tokens()), ("Hello", 2, 1, 3));
        assert_eq!((r.finish_reason.as_deref(), r.token_sha256.as_deref()), (Some("length"), Some("ab")));
        assert!(r.ttft_s.is_some());
        let s = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
                 data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\n";
        let r = parse(s).unwrap();
        assert_eq!((r.chunks, r.tokens(), r.token_sha256), (1, 1, None), "chat deltas, no usage, no [DONE]");
    }

    #[test]
    fn named_errors() {
        let e = parse("data: {\"error\":{\"message\":\"boom\"}}\n\n").unwrap_err();
        assert!(matches!(&e, ReplyError::Event(m) if m == "boom"), "{e}");
        assert!(matches!(parse("event: error\ndata: {\"x\":1}\n\n"), Err(ReplyError::Event(_))));
        assert!(matches!(parse("data: {not json\n\n"), Err(ReplyError::BadJson(_))));
        assert!(matches!(parse("data: {\"choices\":[{\"text\":\"a\"}]}\n\n"), Err(ReplyError::NoDone)));
        assert!(matches!(parse(""), Err(ReplyError::NoDone)));
    }

    #[test]
    fn medians_and_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((median(&[3.0, f64::NAN, 1.0, 2.0]), percentile(&v, 0.5), percentile(&v, 0.99)), (2.0, 50.0, 99.0));
        assert!(median(&[]).is_nan());
    }
}
