//! `tensorfold serve`: the OpenAI-compatible server on the embedded default model, a model directory or a Hugging
//! Face hub id (`hub.rs`).

use crate::devices::{self, Devices};
use crate::memory_budget::{BudgetAsk, stream_budget};
use crate::{Device, Verify, check_device, default_model};
use anyhow::{Context, bail};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tensorfold_engine::model_target::MAX_DRAFT;
use tensorfold_engine::{Engine, EngineConfig, ModelTarget};
use tensorfold_server::access_log::AccessLog;
use tensorfold_server::{ServeOptions, state::Ready};

/// Arguments of `tensorfold serve`; every flag has a `TENSORFOLD_*` environment mirror (the flag wins).
#[derive(clap::Args)]
pub struct Args {
    /// Hugging Face model directory, hub id `Org/Name[@REVISION]` (from the local hub cache, downloaded into it when
    /// the hub is reachable), or `synthetic:SHAPE[@SEED]` (default: the default pair, models/lfm2-moe-pycode,
    /// compiled into the binary unless built without `embedded-model`).
    #[arg(env = "TENSORFOLD_MODEL")]
    model: Option<PathBuf>,
    /// The same as the positional MODEL, as the other commands spell it.
    #[arg(long = "model", value_name = "MODEL", conflicts_with = "model")]
    model_flag: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", env = "TENSORFOLD_HOST")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080, env = "TENSORFOLD_PORT")]
    port: u16,
    /// Streams decoded together in shared rounds (lanes).
    #[arg(long, default_value_t = 8, env = "TENSORFOLD_PARALLEL")]
    parallel: usize,
    /// Requests that may wait for a lane (more: 429).
    #[arg(long, default_value_t = 64, env = "TENSORFOLD_QUEUE")]
    queue: usize,
    /// Context limit in tokens (default and maximum: the model's max_position_embeddings).
    #[arg(long, env = "TENSORFOLD_CONTEXT")]
    context: Option<usize>,
    /// max_tokens of a request that gives none (clipped to what the context leaves).
    #[arg(long, default_value_t = 256, env = "TENSORFOLD_MAX_TOKENS")]
    max_tokens: usize,
    /// Prompt cache size in GiB (0 turns it off).
    #[arg(long, default_value_t = 1.0, env = "TENSORFOLD_PROMPT_CACHE_GIB")]
    prompt_cache_gib: f64,
    /// Memory budget for the streams' KV rows, conv states and scratch, in GiB [default: 4 on the CPU; on a GPU 0.9
    /// of the device memory free after the weights, less the prompt cache and one round's activations]
    #[arg(long, env = "TENSORFOLD_MEMORY_GIB")]
    memory_gib: Option<f64>,
    /// Rows a shared round may hold (decode rows first, then prompt chunks) [default: --parallel plus
    /// --prefill-chunk, at least 512]
    #[arg(long, env = "TENSORFOLD_ROUND_ROWS")]
    round_rows: Option<usize>,
    /// Prompt chunk in tokens (prompt-cache states are kept at its multiples).
    #[arg(long, default_value_t = 256, env = "TENSORFOLD_PREFILL_CHUNK")]
    prefill_chunk: usize,
    /// Context copies: a suffix of at least this many tokens must recur for its continuation to be drafted.
    #[arg(long, default_value_t = 8, env = "TENSORFOLD_COPY_MIN")]
    copy_min: usize,
    /// Most drafted tokens verified in one window.
    #[arg(long, default_value_t = 8, env = "TENSORFOLD_MAX_DRAFT")]
    max_draft: usize,
    /// DSpark drafter directory (default: the default pair's own drafter, when the model is the default pair).
    #[arg(long, env = "TENSORFOLD_DRAFTER")]
    drafter: Option<PathBuf>,
    /// Quantize the drafter's linears at load: 8 = 8-bit affine codes (default: as stored, bf16).
    #[arg(long, value_parser = default_model::parse_drafter_bits, env = "TENSORFOLD_DRAFTER_BITS")]
    drafter_bits: Option<tensorfold_model::drafter::DrafterBits>,
    /// How many drafts a verify window carries: depth (measured), scheduled (confidence head), fixed.
    #[arg(long, value_enum, default_value_t = Verify::Depth, env = "TENSORFOLD_VERIFY")]
    verify: Verify,
    /// Turn off the guards (plain rounds where drafted ones do not pay; a stream's pause after rejected
    /// windows): every round drafts. For measuring acceptance.
    #[arg(long, env = "TENSORFOLD_NO_ROUND_GUARD")]
    no_round_guard: bool,
    /// Read each drafter block before its verify instead of holding the picks on the device (the same tokens; an
    /// A/B baseline).
    #[arg(long, env = "TENSORFOLD_NO_HELD_DRAFTS")]
    no_held_drafts: bool,
    /// Never draft (every reply runs the plain serial path; replies are the same tokens either way).
    #[arg(long, env = "TENSORFOLD_NO_DRAFTS")]
    no_drafts: bool,
    /// Model name for /v1/models and the `model` field (default: the hub repo id for a hub id or a snapshot in a hub
    /// cache, else the directory name, or `tensorfold-default` for the embedded model).
    #[arg(long, env = "TENSORFOLD_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on API routes.
    #[arg(long, env = "TENSORFOLD_API_KEY", conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the API key from a file (first line).
    #[arg(long, env = "TENSORFOLD_API_KEY_FILE")]
    api_key_file: Option<PathBuf>,
    /// Seconds in-flight requests may run after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30, env = "TENSORFOLD_GRACE_SECONDS")]
    grace_seconds: u64,
    /// Seconds a connection may take to send a request head (then it is closed; hyper's default).
    #[arg(long, default_value_t = 30.0, env = "TENSORFOLD_HEADER_TIMEOUT")]
    header_timeout: f64,
    /// Seconds a request body may take to arrive after its head (then 408).
    #[arg(long, default_value_t = 30.0, env = "TENSORFOLD_BODY_TIMEOUT")]
    body_timeout: f64,
    /// Seconds an idle kept-alive connection stays open after its last response (uvicorn's and so vLLM's default).
    #[arg(long, default_value_t = 5.0, env = "TENSORFOLD_IDLE_TIMEOUT")]
    idle_timeout: f64,
    /// Open connections served at once; one more is answered 503 and closed at once.
    #[arg(long, default_value_t = 512, env = "TENSORFOLD_MAX_CONNECTIONS")]
    max_connections: usize,
    /// Origins browser pages may call the API from: `*`, or a comma list such as
    /// `http://localhost:3000,https://app.example` (default: none, no CORS headers).
    #[arg(long, value_parser = parse_origins, env = "TENSORFOLD_ALLOWED_ORIGINS")]
    allowed_origins: Option<tensorfold_server::cors::Origins>,
    /// No access-log line per finished request.
    #[arg(long, env = "TENSORFOLD_DISABLE_ACCESS_LOG")]
    disable_access_log: bool,
    /// Quote each request's body (prompt text included) on its access-log line.
    #[arg(long, env = "TENSORFOLD_ENABLE_LOG_REQUESTS", conflicts_with = "disable_access_log")]
    enable_log_requests: bool,
    /// Render chat templates on threads of this process instead of in killable worker processes (`tensorfold
    /// render-worker`, Linux only; elsewhere renders are in-process anyway). In-process, work inside one of the
    /// template engine's own steps is not bounded (docs/fuzzing.md).
    #[arg(long, env = "TENSORFOLD_TEMPLATE_IN_PROCESS")]
    template_in_process: bool,
    #[command(flatten)]
    dev: crate::devices::DeviceArgs,
}

fn parse_origins(s: &str) -> Result<tensorfold_server::cors::Origins, String> {
    tensorfold_server::cors::Origins::parse(s).map_err(|e| e.to_string())
}

/// Runs the server until SIGINT/SIGTERM.
pub fn run(mut a: Args) -> anyhow::Result<ExitCode> {
    check_device(a.dev.device)?;
    if a.model_flag.is_some() {
        a.model = a.model_flag.take();
    }
    // What needs no model is refused before the port opens.
    devices::check_gpus(a.dev.gpu, a.dev.gpus)?;
    a.dev.deadline()?;
    let round_rows = a.round_rows.unwrap_or(EngineConfig::default_round_rows(a.parallel, a.prefill_chunk));
    for (flag, v) in [("--parallel", a.parallel), ("--round-rows", round_rows), ("--prefill-chunk", a.prefill_chunk)] {
        if v == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    if a.context == Some(0) {
        bail!("--context must be at least 1");
    }
    if a.memory_gib.is_some_and(|g| !(g > 0.0 && g.is_finite())) {
        bail!("--memory-gib must be positive: every request would be refused");
    }
    let (model, hub_name) = model_dir(a.model.take())?;
    a.model = model;
    let api_key = match (&a.api_key, &a.api_key_file) {
        (Some(k), _) => Some(k.clone()),
        (None, Some(f)) => {
            let s = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            let key = s.lines().next().unwrap_or_default().trim().to_string();
            if key.is_empty() {
                bail!(
                    "--api-key-file {}: the first line is empty (refusing to serve without the key it meant)",
                    f.display()
                );
            }
            Some(key)
        }
        (None, None) => None,
    };
    if api_key.as_deref().is_some_and(|k| k.trim().is_empty() || k.contains(char::is_whitespace)) {
        bail!("--api-key must be a non-empty key without spaces");
    }
    let name = a.served_model_name.clone().or(hub_name).unwrap_or_else(|| match &a.model {
        Some(d) => d.file_name().map_or_else(|| d.display().to_string(), |n| n.to_string_lossy().into_owned()),
        None => "tensorfold-default".into(),
    });
    let addr =
        format!("{}:{}", a.host, a.port).parse().with_context(|| format!("--host {} --port {}", a.host, a.port))?;
    let conn = conn_limits(&a)?;
    let http = tensorfold_server::HttpOptions {
        allowed_origins: a.allowed_origins.clone().unwrap_or_default(),
        access_log: AccessLog { enabled: !a.disable_access_log, log_requests: a.enable_log_requests },
    };
    let grace = Duration::from_secs(a.grace_seconds);
    let opts = ServeOptions { addr, model_name: name, api_key, grace, conn, http };
    let gib = |g: f64| (g.max(0.0) * (1u64 << 30) as f64) as usize;
    let cfg = EngineConfig {
        parallel: a.parallel,
        queue_capacity: a.queue,
        round_rows,
        prefill_chunk: a.prefill_chunk,
        // Set once the model is loaded (`memory_budget`): on a GPU it depends on what the weights left.
        memory_bytes: 0,
        prompt_cache_bytes: gib(a.prompt_cache_gib),
        copy_min: a.copy_min,
        max_draft: if a.no_drafts { 0 } else { a.max_draft },
        verify: a.verify.into(),
        round_guard: !a.no_round_guard,
        stream_guard: !a.no_round_guard,
        held_drafts: !a.no_held_drafts,
        // Shared rounds on, and no planted fault (the engine's tests' feature may be on in a workspace test build).
        ..EngineConfig::default()
    };
    let plan = LoadPlan {
        src: default_model::source(a.model.clone())?,
        drafter: if a.no_drafts { None } else { default_model::drafter_source(&a.model, a.drafter.clone()) },
        drafter_bits: a.drafter_bits.unwrap_or_default(),
        context: a.context,
        max_tokens: a.max_tokens,
        verify: a.verify,
        cfg,
        memory_gib: a.memory_gib,
        dev: a.dev,
    };
    render_workers(a.template_in_process)?;
    let load = move || plan.load();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let served = rt.block_on(tensorfold_server::serve(opts, load));
    // A signal during loading must not wait for the load to finish.
    rt.shutdown_background();
    served.map_err(anyhow::Error::msg)?;
    Ok(ExitCode::SUCCESS)
}

/// Installs the process's chat-template render workers (one a text-pool task) before anything opens a template,
/// so the probe render at open runs in one too; unless `in_process`, or off Linux (logged).
fn render_workers(in_process: bool) -> anyhow::Result<()> {
    if in_process {
        tracing::info!("chat templates render in this process (--template-in-process)");
        return Ok(());
    }
    if !cfg!(target_os = "linux") {
        tracing::info!("chat templates render in this process: render workers are Linux-only");
        return Ok(());
    }
    // This very binary: a package upgrade that renames or replaces its file leaves `current_exe()` naming a
    // missing path or another version, while `/proc/self/exe` opens the running one. Render workers are
    // Linux-only (above), so /proc is there.
    let program = std::path::PathBuf::from("/proc/self/exe");
    let workers = tensorfold_server::limits::text_tasks();
    let pool = tensorfold_text::render_pool::RenderPool::new(tensorfold_text::render_pool::PoolConfig {
        program,
        args: vec!["render-worker".into()],
        workers,
    });
    if tensorfold_text::render_pool::install(pool).is_err() {
        bail!("chat-template render workers were installed twice");
    }
    tracing::info!("chat templates render in {workers} worker processes, started as needed");
    Ok(())
}

/// The model directory to open and the name a hub model serves under: a directory as given (a snapshot in a hub
/// cache named by its repo id), `synthetic:...` as given, a hub id resolved (`hub.rs`). Errors: a path that is
/// neither a directory nor a hub id, a hub id not in the cache and not downloaded, an incomplete snapshot.
fn model_dir(model: Option<PathBuf>) -> anyhow::Result<(Option<PathBuf>, Option<String>)> {
    let Some(d) = model else { return Ok((None, None)) };
    let arg = d.to_str().unwrap_or_default();
    if arg.starts_with(default_model::SYNTHETIC) {
        return Ok((Some(d), None));
    }
    if d.is_dir() {
        let name = crate::hub::repo_of_path(&d);
        return Ok((Some(d), name));
    }
    match crate::hub::HubId::parse(arg) {
        Some(id) => Ok((Some(crate::hub::resolve(&id)?), Some(id.repo))),
        None => bail!("model directory {} does not exist or is not a directory", d.display()),
    }
}

/// The connection flags, each refused by name unless positive and finite (a timeout of 0 would close every
/// connection at once).
fn conn_limits(a: &Args) -> anyhow::Result<tensorfold_server::listen::ConnLimits> {
    let secs = |flag: &str, v: f64| {
        if v.is_finite() && v > 0.0 && v <= 86_400.0 {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(anyhow::anyhow!("{flag} must be a number of seconds in (0, 86400], not {v}"))
        }
    };
    if a.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    Ok(tensorfold_server::listen::ConnLimits {
        header_timeout: secs("--header-timeout", a.header_timeout)?,
        body_timeout: secs("--body-timeout", a.body_timeout)?,
        idle_timeout: secs("--idle-timeout", a.idle_timeout)?,
        max_connections: a.max_connections,
    })
}

/// What the server loads once it listens: the model and drafter on `--device`, then the engine.
struct LoadPlan {
    src: tensorfold_model::Source,
    drafter: Option<tensorfold_model::Source>,
    drafter_bits: tensorfold_model::drafter::DrafterBits,
    context: Option<usize>,
    max_tokens: usize,
    verify: Verify,
    cfg: EngineConfig,
    memory_gib: Option<f64>,
    dev: devices::DeviceArgs,
}

impl LoadPlan {
    /// Opens on the CPU, or on GPU `gpu` (refused by name without the `cuda` feature or a driver), over `gpus`
    /// ranks with `--gpus`.
    fn load(self) -> Result<(Ready, Engine), String> {
        let e = |e: anyhow::Error| format!("{e:#}");
        let d = self.dev;
        match d.device {
            Device::Cpu => {
                let dev = devices::cpu(&d).map_err(e)?;
                self.load_on(dev)
            }
            #[cfg(feature = "cuda")]
            Device::Cuda => {
                let dev = devices::cuda(&d).map_err(e)?;
                self.load_on(dev)
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda => Err(format!("--device cuda (gpu {}): this build has no CUDA backend", d.gpu)),
        }
    }

    fn load_on<B: devices::Ranks>(mut self, dev: Devices<B>) -> Result<(Ready, Engine), String> {
        let src = &self.src;
        tracing::info!("loading {} on {} x{} ...", src.describe(), dev.backend.name(), dev.world());
        let mut loaded = dev.open(src).map_err(|e| format!("{e:#}"))?;
        default_model::attach_drafter(&mut loaded.model, self.drafter, self.drafter_bits).map_err(|e| e.to_string())?;
        if self.cfg.max_draft > 0 {
            crate::check_verify(self.verify, &loaded.model).map_err(|e| e.to_string())?;
        }
        let max = loaded.model.cfg.max_positions;
        if let Some(c) = self.context.filter(|&c| c > max) {
            tracing::warn!("--context {c} exceeds the model's max_position_embeddings; using {max}");
        }
        loaded.model.cfg.max_positions = self.context.unwrap_or(max).min(max);
        let ctx = loaded.model.cfg.max_positions;
        tracing::info!(
            "loaded {} ({} layers, {:.1} MiB of weights); context {ctx}, {} lanes, rounds of up to {} rows",
            loaded.model.cfg.family.as_str(),
            loaded.model.cfg.layers.len(),
            loaded.model.weight_bytes() as f64 / (1 << 20) as f64,
            self.cfg.parallel,
            self.cfg.round_rows
        );
        let ask = BudgetAsk {
            gib: self.memory_gib,
            host_gib: 4.0,
            prompt_cache_bytes: self.cfg.prompt_cache_bytes,
            round_rows: self.cfg.round_rows,
            parallel: self.cfg.parallel,
            verify_rows: self.cfg.verify_rows(MAX_DRAFT),
        };
        let budget = stream_budget(&loaded.model, &ask).map_err(|e| format!("{e:#}"))?;
        tracing::info!("memory admission: {}", budget.how);
        self.cfg.memory_bytes = budget.bytes;
        let text = loaded.text.map(Arc::new);
        let model = Arc::new(loaded.model);
        let m = model.clone();
        let devices: tensorfold_server::state::DeviceReport =
            Arc::new(move || m.weight_bytes_by_rank().into_iter().zip(m.memory_high_by_rank()).collect());
        let engine = Engine::start(ModelTarget { model, eos: loaded.eos_ids }, self.cfg);
        let ready = Ready {
            engine: engine.handle(),
            text,
            context: ctx,
            default_max_tokens: self.max_tokens,
            devices: Some(devices),
        };
        Ok((ready, engine))
    }
}
