//! `tensorfold generate`: one prompt, streamed to stdout, then prompt/decode counts and speeds.

use crate::{Verify, default_model};
use anyhow::{Context, bail};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use tensorfold_engine::Penalties;
use tensorfold_engine::keyed::{SamplingParams, resolve_seed, token_sha256};
use tensorfold_engine::model_target::MAX_DRAFT;
use tensorfold_engine::single::{DraftSettings, GenerateOptions, generate};
use tensorfold_text::ChatMessage;

/// Arguments of `tensorfold generate`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "prompt_file", "chat", "prompt_ids"])))]
pub struct Args {
    /// Hugging Face model directory (default: the default pair, models/lfm2-moe-pycode, compiled into the binary unless
    /// built without `embedded-model`).
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
    /// Subtracted once from every token already generated, in [-2, 2] (0 = off; vLLM's semantics).
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Subtracted once per occurrence in the generated tokens, in [-2, 2] (0 = off).
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens in the prompt or the reply, > 0 (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Sampling seed (default: a fresh random one, printed so the reply can be reproduced).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep generating past end-of-sequence ids.
    #[arg(long)]
    ignore_eos: bool,
    /// Prompt rows per prefill call.
    #[arg(long, default_value_t = 512)]
    chunk: usize,
    /// DSpark drafter directory (default: the default pair's own drafter, when the model is the default pair).
    #[arg(long, env = "TENSORFOLD_DRAFTER")]
    drafter: Option<PathBuf>,
    /// Quantize the drafter's linears at load: 8 = 8-bit affine codes (default: as stored, bf16).
    #[arg(long, value_parser = default_model::parse_drafter_bits)]
    drafter_bits: Option<tensorfold_model::drafter::DrafterBits>,
    /// Never draft: run the plain serial path (the reply is the same tokens either way).
    #[arg(long)]
    no_drafts: bool,
    /// Most drafted tokens verified in one window (at most 32).
    #[arg(long, default_value_t = 8)]
    max_draft: usize,
    /// Context copies: a suffix of at least this many tokens must recur for its continuation to be drafted.
    #[arg(long, default_value_t = 8)]
    copy_min: usize,
    /// How many drafts a verify window carries: depth (measured), scheduled (confidence head), fixed.
    #[arg(long, value_enum, default_value_t = Verify::Depth)]
    verify: Verify,
    /// Turn off the guards (plain rounds where drafted ones do not pay; a stream's pause after rejected
    /// windows): every round drafts. For measuring acceptance.
    #[arg(long)]
    no_round_guard: bool,
    #[command(flatten)]
    dev: crate::devices::DeviceArgs,
}

impl crate::OnBackend for Args {
    fn run<B: crate::devices::Ranks>(self, dev: crate::devices::Devices<B>) -> anyhow::Result<ExitCode> {
        run_on(dev, self)
    }
}

/// Runs the command on `--device`.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    crate::on_device(a.dev, a)
}

fn run_on<B: crate::devices::Ranks>(dev: crate::devices::Devices<B>, a: Args) -> anyhow::Result<ExitCode> {
    let src = default_model::source(a.model.clone())?;
    let mut loaded = dev.open(&src)?;
    if !a.no_drafts {
        default_model::attach_drafter(
            &mut loaded.model,
            default_model::drafter_source(&a.model, a.drafter.clone()),
            a.drafter_bits.unwrap_or_default(),
        )?;
    }
    let text = loaded.text.as_ref();
    let need_text = || text.ok_or(tensorfold_text::TextError::NoTokenizer);
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
    let mut cfg = GenerateOptions {
        chunk: a.chunk,
        max_tokens: a.max_tokens,
        context: a.context.unwrap_or(loaded.model.cfg.max_positions).min(loaded.model.cfg.max_positions),
        stop_ids: if a.ignore_eos { Vec::new() } else { loaded.eos_ids.clone() },
        params,
        penalties: Penalties {
            presence: a.presence_penalty,
            frequency: a.frequency_penalty,
            repetition: a.repetition_penalty,
            logit_bias: Vec::new(),
        },
        grammar: None,
        drafts: None,
    };
    let mut detok = text.map(|t| t.detokenizer(false));
    let mut stdout = std::io::stdout().lock();
    let mut write_err = None;
    let on_token = |tok: u32| {
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
    };
    if loaded.model.drafter.is_some() {
        crate::check_verify(a.verify, &loaded.model)?;
        cfg.drafts = Some(DraftSettings {
            max_draft: a.max_draft.min(MAX_DRAFT),
            copy_min: a.copy_min,
            verify: a.verify.into(),
            guards: !a.no_round_guard,
        });
    }
    let (ids, run) = generate(&std::sync::Arc::new(loaded.model), &prompt, &cfg, on_token)?;
    let drafts = run.drafts.as_ref().map(|st| {
        let acc: Vec<String> = st.accepted_at.iter().map(|n| n.to_string()).collect();
        format!(
            "drafted: {}  accepted: {}  verify windows: {}  mean accepted length: {:.2}  accepted by position: [{}]",
            st.drafted,
            st.accepted,
            st.windows,
            st.mean_accepted_length(),
            acc.join(", ")
        )
    });
    let summary = Summary {
        ids,
        prompt_tokens: run.prompt_tokens,
        finish: format!("{:?}", run.finish).to_lowercase(),
        prefill: run.prefill.as_secs_f64(),
        decode: run.decode.as_secs_f64(),
        drafts,
    };
    if let Some(d) = detok {
        let _ = stdout.write_all(d.finish().as_bytes());
    }
    let _ = writeln!(stdout);
    if let Some(e) = write_err {
        return Err(e);
    }
    summary.print(params.seed);
    Ok(ExitCode::SUCCESS)
}

/// What `generate` prints after the reply.
struct Summary {
    ids: Vec<u32>,
    prompt_tokens: usize,
    finish: String,
    prefill: f64,
    decode: f64,
    drafts: Option<String>,
}

impl Summary {
    fn print(&self, seed: u64) {
        let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        eprintln!(
            "prompt tokens: {}  generated tokens: {}  finish: {}\nprefill: {:.1} tok/s  decode: {:.1} tok/s\nseed: {}  token_sha256: {}",
            self.prompt_tokens,
            self.ids.len(),
            self.finish,
            rate(self.prompt_tokens, self.prefill),
            rate(self.ids.len().saturating_sub(1), self.decode),
            seed,
            token_sha256(&self.ids)
        );
        if let Some(d) = &self.drafts {
            eprintln!("{d}");
        }
    }
}
