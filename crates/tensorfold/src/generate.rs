//! `tensorfold generate`: one prompt, streamed to stdout, then prompt/decode counts and speeds.

use crate::{Device, check_device, default_model};
use anyhow::{Context, bail};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use tensorfold_engine::sampler::{SamplingParams, resolve_seed, token_sha256};
use tensorfold_engine::solo::{SoloConfig, generate};
use tensorfold_kernels::CpuBackend;
use tensorfold_model::text::ChatMessage;

/// Arguments of `tensorfold generate`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "prompt_file", "chat", "prompt_ids"])))]
pub struct Args {
    /// Hugging Face model directory (default: the embedded default model).
    #[arg(long, env = "TENSORFOLD_MODEL")]
    model: Option<PathBuf>,
    /// Raw prompt text (encoded with the tokenizer's special tokens).
    #[arg(long)]
    prompt: Option<String>,
    /// Read the raw prompt from a UTF-8 file.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// One user message, rendered with the checkpoint's own chat template.
    #[arg(long)]
    chat: Option<String>,
    /// Prompt token ids, comma-separated (works without tokenizer files).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Context limit (default: the config's max_position_embeddings).
    #[arg(long, env = "TENSORFOLD_CONTEXT")]
    context: Option<usize>,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Drop tokens below min_p times the top probability (0 = off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Sampling seed (default: a fresh random one, printed so the reply can be reproduced).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep generating past end-of-sequence ids.
    #[arg(long)]
    ignore_eos: bool,
    /// Prompt rows per prefill call.
    #[arg(long, default_value_t = 512)]
    chunk: usize,
    /// Device to run on.
    #[arg(long, value_enum, default_value_t = Device::Cpu, env = "TENSORFOLD_DEVICE")]
    device: Device,
}

/// Runs the command.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    check_device(a.device)?;
    let src = default_model::source(a.model.clone());
    let loaded = tensorfold_model::open(&src, CpuBackend).with_context(|| format!("opening {}", src.describe()))?;
    let text = loaded.text.as_ref();
    let need_text = || text.ok_or(tensorfold_model::text::TextError::NoTokenizer);
    let prompt: Vec<u32> = if let Some(ids) = &a.prompt_ids {
        ids.clone()
    } else if let Some(c) = &a.chat {
        need_text()?.encode_chat(&[ChatMessage::new("user", c.as_str())], true)?
    } else {
        let p = match (&a.prompt, &a.prompt_file) {
            (Some(p), _) => p.clone(),
            (None, Some(f)) => {
                let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
                String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("prompt file {} is not UTF-8", f.display()))?
            }
            (None, None) => bail!("no prompt given"),
        };
        need_text()?.encode_prompt(&p)?
    };
    if a.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let params = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        seed: resolve_seed(a.seed),
    };
    let cfg = SoloConfig {
        chunk: a.chunk,
        max_tokens: a.max_tokens,
        context: a.context.unwrap_or(loaded.model.cfg.max_positions).min(loaded.model.cfg.max_positions),
        stop_ids: if a.ignore_eos { Vec::new() } else { loaded.eos_ids.clone() },
        params,
    };
    let mut detok = text.map(|t| t.detokenizer(false));
    let mut stdout = std::io::stdout().lock();
    let mut write_err = None;
    let (ids, stats) = generate(&loaded.model, &prompt, &cfg, |tok| {
        let piece = match detok.as_mut().map(|d| d.push(tok)) {
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                write_err =
                    Some(anyhow::anyhow!("the model produced token {tok}, which the tokenizer cannot decode: {e}"));
                return false;
            }
            None => format!("{tok} "),
        };
        if let Err(e) = stdout.write_all(piece.as_bytes()).and_then(|_| stdout.flush()) {
            write_err = Some(anyhow::anyhow!("writing to stdout: {e}"));
            return false;
        }
        true
    })?;
    if let Some(d) = detok {
        let _ = stdout.write_all(d.finish().as_bytes());
    }
    let _ = writeln!(stdout);
    if let Some(e) = write_err {
        return Err(e);
    }
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    eprintln!(
        "prompt tokens: {}  generated tokens: {}  finish: {}\nprefill: {:.1} tok/s  decode: {:.1} tok/s\nseed: {}  token_sha256: {}",
        stats.prompt_tokens,
        stats.generated,
        format!("{:?}", stats.finish).to_lowercase(),
        rate(stats.prompt_tokens, stats.prefill.as_secs_f64()),
        rate(stats.generated.saturating_sub(1), stats.decode.as_secs_f64()),
        params.seed,
        token_sha256(&ids)
    );
    Ok(ExitCode::SUCCESS)
}
