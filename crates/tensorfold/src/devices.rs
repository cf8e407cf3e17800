//! The devices a command runs on: one backend, or with `--gpus N` N ranks of expert parallelism (rank 0 first),
//! and the collectives between them (NCCL on GPUs, the host stand-in on CPU ranks).

use anyhow::Context;
use tensorfold_kernels::{Backend, Collective, CpuBackend, DeviceWatch, HostCollective, Watched};
use tensorfold_model::{Loaded, Source};

/// The device flags every running command takes (each has a `TENSORFOLD_*` environment mirror).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct DeviceArgs {
    /// Device to run on.
    #[arg(long, value_enum, default_value_t = crate::Device::Cpu, env = "TENSORFOLD_DEVICE")]
    pub device: crate::Device,
    /// GPU number with `--device cuda` (the first, with `--gpus`).
    #[arg(long, default_value_t = 0, env = "TENSORFOLD_GPU")]
    pub gpu: usize,
    /// Split the MoE experts over this many GPUs from `--gpu` on (expert parallelism through NCCL; the other layers
    /// and every KV cache stay on the first); with `--device cpu`, host ranks (the stand-in CI runs). At most the
    /// model's experts a layer; a dense model takes only 1. Default: one device, no collectives.
    #[arg(long, env = "TENSORFOLD_GPUS")]
    pub gpus: Option<usize>,
    /// Seconds a forward (its device sync), a drafter pass, a held-draft read or a collective may wait on a device
    /// before it counts as lost, on one device or `--gpus` ranks: past it the engine stops with `DeviceFailure` and
    /// `serve` exits non-zero (docs/multi-gpu.md). Default: 300 on GPUs; none on the CPU, where a forward is the
    /// computation itself (a long prefill chunk of a large model on few cores is slow, not lost), unless given.
    #[arg(long, value_name = "SECONDS", env = "TENSORFOLD_DEVICE_DEADLINE")]
    pub device_deadline: Option<f64>,
    /// With `--device cuda`: run the linears, MoE experts and attention on tensor cores (bf16 `mma.sync`, each f32
    /// activation as three bf16 pieces, f32 accumulation; MLX 4- and 8-bit matrices enter as their codes, scaled
    /// per 32-element chunk; sm_80 and later). Not lossy (the kernel contract's bounds
    /// hold) and row-invariant, but its bits differ from the default CUDA-core forms', so it is the whole process's
    /// mode. Faster prefill and many-stream decode, slower one-stream decode (docs/cuda.md). Off by default; the
    /// environment's `TENSORFOLD_CUDA_TENSOR_CORES=1` turns it on too.
    #[arg(long)]
    pub tensor_cores: bool,
}

/// The CPU's deadline when none is given: far past any forward (a watch always has one).
const CPU_NO_DEADLINE: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 86_400);

impl DeviceArgs {
    /// `--device-deadline` as a duration, `None` when not given. Errors: not a positive number of seconds (at most
    /// a day), by name.
    pub fn deadline(&self) -> anyhow::Result<Option<std::time::Duration>> {
        let Some(s) = self.device_deadline else { return Ok(None) };
        anyhow::ensure!(s.is_finite() && s > 0.0 && s <= 86_400.0, "--device-deadline {s}: give seconds in (0, 86400]");
        Ok(Some(std::time::Duration::from_secs_f64(s)))
    }
}

/// A backend whose devices can work together: how to make the collective over a list of them.
pub trait Ranks: Backend + Clone + 'static {
    /// The collective over `ranks` (rank 0 first).
    fn collective(ranks: &[Self], deadline: std::time::Duration) -> anyhow::Result<Box<dyn Collective<Self>>>;
}

impl Ranks for CpuBackend {
    fn collective(ranks: &[Self], deadline: std::time::Duration) -> anyhow::Result<Box<dyn Collective<Self>>> {
        Ok(Box::new(Watched::new(HostCollective::new(ranks.len()), DeviceWatch::new(deadline))))
    }
}

#[cfg(feature = "cuda")]
impl Ranks for tensorfold_kernels::CudaBackend {
    fn collective(ranks: &[Self], deadline: std::time::Duration) -> anyhow::Result<Box<dyn Collective<Self>>> {
        let c = tensorfold_kernels::cuda::NcclCollective::new(ranks).map_err(|e| anyhow::anyhow!("--gpus: {e}"))?;
        Ok(Box::new(Watched::new(c, DeviceWatch::new(deadline))))
    }
}

/// Rank 0's backend and, with `--gpus`, every rank's.
pub struct Devices<B> {
    /// Rank 0 (the only device without `--gpus`): every layer but the other ranks' experts, and the caches.
    pub backend: B,
    /// Every rank, rank 0 first, with `--gpus` (a world of 1 still takes the expert-parallel path).
    pub ranks: Option<Vec<B>>,
    /// The deadline on the model's device waits and the ranks' collectives (`--device-deadline`).
    pub deadline: std::time::Duration,
}

impl<B: Ranks> Devices<B> {
    /// Opens `src` on these devices: plainly, or with its experts split over the ranks (a new collective each time,
    /// so two models never share a communicator). Either way its device waits have the deadline (a plain model's
    /// own watch; the ranks' collective's, which the model adopts).
    pub fn open(&self, src: &Source) -> anyhow::Result<Loaded<B>> {
        let mut loaded = match &self.ranks {
            None => tensorfold_model::open(src, self.backend.clone()),
            Some(r) => tensorfold_model::open_expert_parallel(src, r.clone(), B::collective(r, self.deadline)?),
        }
        .with_context(|| format!("opening {}", src.describe()))?;
        if self.ranks.is_none() {
            loaded.model.watch = DeviceWatch::new(self.deadline);
        }
        tracing::info!("opened {} on {} x{}", src.describe(), self.backend.name(), loaded.model.world());
        Ok(loaded)
    }

    /// Devices in use.
    pub fn world(&self) -> usize {
        self.ranks.as_ref().map_or(1, Vec::len)
    }
}

/// The most ranks `--gpus` takes (a MoE layer has at most 1024 experts: the routing kernel's bound).
const MAX_RANKS: usize = 1024;

/// Refuses `--gpus` values that no model could take: 0, more than [`MAX_RANKS`], or past the last ordinal.
pub fn check_gpus(first: usize, gpus: Option<usize>) -> anyhow::Result<()> {
    match gpus {
        Some(0) => anyhow::bail!("--gpus must be at least 1"),
        Some(n) if n > MAX_RANKS => anyhow::bail!("--gpus {n}: at most {MAX_RANKS} devices"),
        Some(n) if first.checked_add(n).is_none() => anyhow::bail!("--gpu {first} --gpus {n}: no such GPUs"),
        _ => Ok(()),
    }
}

/// The ranks of `--gpus n` from `open(ordinal)`, ordinals `first .. first + n`; `None` without `--gpus`.
pub fn ranks<B>(
    first: usize,
    gpus: Option<usize>,
    open: impl Fn(usize) -> anyhow::Result<B>,
) -> anyhow::Result<Option<Vec<B>>> {
    check_gpus(first, gpus)?;
    match gpus {
        None => Ok(None),
        Some(n) => (first..first + n).map(open).collect::<anyhow::Result<Vec<_>>>().map(Some),
    }
}

/// The CPU, or `--gpus n` host ranks (the stand-in for the collectives CI runs).
pub fn cpu(d: &DeviceArgs) -> anyhow::Result<Devices<CpuBackend>> {
    anyhow::ensure!(!d.tensor_cores, "--tensor-cores: needs --device cuda (the CPU has no tensor-core mode)");
    let deadline = d.deadline()?.unwrap_or(CPU_NO_DEADLINE);
    Ok(Devices { backend: CpuBackend, ranks: ranks(0, d.gpus, |_| Ok(CpuBackend))?, deadline })
}

/// GPU `gpu`, or with `--gpus n` GPUs `gpu .. gpu + n` (refused by name without a driver or such a GPU).
#[cfg(feature = "cuda")]
pub fn cuda(d: &DeviceArgs) -> anyhow::Result<Devices<tensorfold_kernels::CudaBackend>> {
    let (gpu, gpus, deadline) = (d.gpu, d.gpus, d.deadline()?.unwrap_or(tensorfold_kernels::DEFAULT_DEVICE_DEADLINE));
    let open = |g: usize| {
        let opts = tensorfold_kernels::CudaOptions { tensor_cores: d.tensor_cores };
        let be = tensorfold_kernels::CudaBackend::open(g, opts).map_err(|e| anyhow::anyhow!("--device cuda: {e}"))?;
        let mode = if be.tensor_cores() { "tensor cores (bf16 mma, three pieces)" } else { "CUDA cores (f32)" };
        tracing::info!("CUDA device {g}: {} ({}), linears and attention on {mode}", be.device_name(), be.arch());
        let t = std::time::Instant::now();
        be.warm_up().map_err(|e| anyhow::anyhow!("--device cuda: compiling the kernels: {e}"))?;
        tracing::info!("CUDA device {g}: kernels ready in {:.1} s", t.elapsed().as_secs_f64());
        Ok(be)
    };
    let ranks = ranks(gpu, gpus, open)?;
    let backend = match &ranks {
        Some(r) => r[0].clone(),
        None => open(gpu)?,
    };
    Ok(Devices { backend, ranks, deadline })
}
