//! The CUDA device behind a `CudaBackend`: its context and one stream, device memory, kernel modules compiled at
//! first use (with a planted fault's define when the contract asks for one), launches, and the sticky error that
//! the trait's infallible methods leave for the next fallible one.

use super::CudaError;
use super::graphs::{self, Op};
use super::nvrtc::{self, Image};
use super::profile::Profile;
use crate::backend::KernelError;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DriverError, result, sys,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Threads of every block the launchers use, except the combine, plan and greedy kernels (which say their own).
pub const BLOCK: u32 = 256;
/// Warps a block of the warp-per-item kernels (common.cuh's `WPB`).
pub const WPB: usize = 8;
/// Rows a linear tile covers (common.cuh's `RT`).
pub const RT: usize = 8;
/// Calls of at most this many rows run the `_r1` forms by default: one chunk load in flight a step of a tile
/// kernel costs a memory round trip per step, while an `_r1` kernel issues 8 at once and re-reads the weights from
/// cache for each further row. Measured (docs/receipts/2026-11-29-llama-cuda.md): up to 4 rows it is not slower;
/// MoE calls of up to 2 assignments an expert on the `_r1` forms were 5 to 10% slower at 8 and 16 streams.
pub const R1_ROWS: usize = 4;
/// Rows (MoE: slots) a wide tile covers (dense.cu's `WTM`); the MoE plan cuts experts into tiles of this many for
/// wide calls.
pub const WTM: usize = 32;
/// Output columns a wide tile covers (dense.cu's `WTN`; half that for the gate-up forms).
pub const WTN: usize = 128;
/// Dense calls of at least this many rows run the wide tiles by default (prefill chunks, wide verify rounds). On
/// the H200 (docs/receipts/2026-12-01-cuda-wide-tiles.md) they were 1.35x faster at 512 rows and slower at 128.
pub const WIDE_ROWS: usize = 256;
/// MoE calls run the wide expert tiles by default when they also hold at least this many assignments an expert on
/// average (a wide tile is [`WTM`] slots: fewer leave it part empty; 1.4x faster at 32, 2x slower at 8).
pub const WIDE_SLOTS: usize = 32;
/// Output columns a warp of a tile kernel covers (common.cuh's `CT`; the `_r1` kernels cover 1).
pub const CT: usize = 4;
/// Keys an attention block covers (common.cuh's `KEY_CHUNK`).
pub const KEY_CHUNK: usize = 256;
/// Rows of a segment an attention tile shares each key chunk's loads over (attention.cu's `attn_tiled`), and the
/// default fewest rows a call's largest segment holds for the tiled form to run (`TENSORFOLD_CUDA_ATTN_TILE_ROWS`).
pub const ATTN_TILE: usize = 16;
/// Rows and columns a block of the wide tensor-core linear covers (dense_tc.cu's `TCM`, `TCN`).
pub const TCM: usize = 64;
pub const TCN: usize = 128;
/// K segments of the tensor-core chain, one warp each in the narrow form (dense_tc.cu's `TC_SEGS`).
pub const TC_SEGS: usize = 4;
/// Largest grid y or z dimension.
pub const GRID_YZ: usize = 65535;

mod blocks;
mod settings;
mod sources;
mod stream_host;

use settings::rows_setting;
pub(crate) use settings::{attn_mma_setting, one_row, tensor_cores_setting, wide};
pub use sources::Src;
/// Device memory the block cache may keep and hold back at its caps (memory admission leaves it out).
pub(crate) const OWN_RESERVE: usize = blocks::CACHE_MAX + blocks::HELD_MAX;

use stream_host::{Staging, StreamHost, keep_pool_memory};
pub(crate) use stream_host::{graphs_setting, part_setting, pdl_setting};

/// A kernel argument: every kernel parameter is a pointer, a 64-bit integer, a 32-bit integer or an f32.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A device pointer (0 for a null pointer).
    P(u64),
    /// A 64-bit unsigned integer.
    U(u64),
    /// A 32-bit signed integer.
    I(i32),
    /// An f32.
    F(f32),
}

/// Device memory of `bytes > 0` bytes. On drop it is kept in the device's block cache for reuse (while operations
/// are deferred, blocks of up to 256 MiB), or freed (stream-ordered): at once, or after the queued operations when
/// some are waiting (they may still use it, and the driver refuses a copy to a freed address). See `blocks.rs`.
pub struct Mem {
    slice: Option<CudaSlice<u8>>,
    /// Device address.
    pub ptr: u64,
    /// Size in bytes.
    pub bytes: usize,
    host: Arc<Mutex<StreamHost>>,
}

impl Drop for Mem {
    fn drop(&mut self) {
        let Some(slice) = self.slice.take() else { return };
        // The free (CudaSlice's drop) needs this context current on the dropping thread, which may never have
        // launched anything.
        let _ = slice.context().bind_to_thread();
        lock(&self.host).release(slice);
    }
}

/// Compiled modules by source and planted define.
type Modules = HashMap<(Src, Option<&'static str>), Arc<Loaded>>;

struct Loaded {
    module: Arc<CudaModule>,
    funcs: Mutex<HashMap<String, CudaFunction>>,
}

/// One device: context, stream, compiled modules, sticky error.
pub struct Dev {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// NVRTC target, e.g. `sm_90`.
    pub arch: String,
    /// The device's name as the driver reports it.
    pub name: String,
    cache: Option<PathBuf>,
    /// NVRTC's version ([`nvrtc::version`]), part of every kernel cache key.
    nvrtc: String,
    modules: Mutex<Modules>,
    /// The first failure waiting to be reported: the call and the error, and the error itself (whether it left the
    /// device unusable, or was out of memory).
    error: Mutex<Option<(String, CudaError)>>,
    /// Everything that touches the stream: the staging arena, the queue of deferred operations and the graphs.
    /// Held while an operation is recorded or issued, so no thread's work of this device lands inside another's
    /// capture (work enqueued through [`Dev::stream`] is outside it: see there).
    host: Arc<Mutex<StreamHost>>,
    /// Device copies of constant u64 tables (a MoE layer's expert table), keyed by their contents.
    consts: Mutex<HashMap<Vec<u64>, Mem>>,
    /// With `TENSORFOLD_CUDA_PROFILE` set: kernel names by function handle, and (launches, seconds) by name.
    profile: Option<Mutex<Profile>>,
    /// False with `TENSORFOLD_CUDA_UNFUSED` set: fused kernels run as their parts (a measuring aid for A/B runs in
    /// one binary; the bits are the same either way).
    pub fused: bool,
    /// `TENSORFOLD_CUDA_R1_ROWS=N` (a measuring aid for A/B runs in one binary; the bits are the same either way):
    /// calls of at most N rows, dense or MoE, run the `_r1` forms (0: never). Unset: [`R1_ROWS`].
    pub r1_rows: Option<usize>,
    /// `TENSORFOLD_CUDA_WIDE_ROWS=N` (a measuring aid, the bits are the same either way), or the contract's
    /// [`Dev::set_wide_rows`]: calls of at least N rows, dense or MoE, run the wide tiles (0: never; MoE calls of
    /// at most 16 rows keep the fused routing and plan, so the warp kernels). [`UNSET`]: [`WIDE_ROWS`] and
    /// [`WIDE_SLOTS`].
    wide_rows: AtomicUsize,
    /// Kernels launch with programmatic dependent launch (sm_90 and later, unless `TENSORFOLD_CUDA_PDL=0`): a
    /// kernel's blocks are scheduled while the kernel before it finishes and wait at their entry, hiding the launch
    /// gap between the two. Off under a profile (each kernel is timed alone).
    pub pdl: bool,
    /// `--tensor-cores` or `TENSORFOLD_CUDA_TENSOR_CORES=1` (sm_80 and later), or the contract's [`Dev::set_tensor_cores`]: bf16
    /// matrices with k % 32 == 0, and MLX Q8 / Q4 ones whose group is 32 times a power of two, run the tensor-core
    /// linears (dense_tc.cu, dense_tcw.cu) at every width. Their bits differ from
    /// the CUDA-core forms' (another fixed order, the same bound), so the setting holds for the process: a row's
    /// bits never depend on the call. Off by default until the decode forms match the CUDA cores' speed.
    tensor_cores: AtomicBool,
    /// The contract's [`Dev::set_tc_group`] ([`UNSET`]: the host's choice): column groups of the narrow
    /// tensor-core forms, which change no bit (the contract checks each).
    tc_group: AtomicUsize,
    /// Streaming multiprocessors (the narrow tensor-core forms size their blocks by it).
    sms: usize,
    /// Dynamic shared memory a block may opt in to, in bytes (the tiled attention needs about 170 KiB).
    smem_optin: usize,
    /// `TENSORFOLD_CUDA_ATTN_TILE_ROWS=N` (a measuring aid, the bits are the same either way), or the contract's
    /// [`Dev::set_attn_tile_rows`]: attention calls whose largest segment holds at least N rows run the tiled form
    /// (0: never). [`UNSET`]: [`ATTN_TILE`].
    attn_tile_rows: AtomicUsize,
    /// `TENSORFOLD_CUDA_ATTN_MMA` (default on; 0 is a measuring aid), or the contract's `set_attn_mma`: with tensor
    /// cores on, attention runs on them too ([`Dev::attn_mma`]).
    attn_mma: AtomicBool,
    /// Dynamic shared memory each kernel (by function handle) was let use past 48 KiB ([`Dev::allow_smem`]).
    smem_allowed: Mutex<HashMap<usize, usize>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A driver failure as a [`CudaError`].
pub fn driver(what: &str, e: DriverError) -> CudaError {
    use sys::CUresult::*;
    let (what, message) = (what.to_string(), format!("{e}"));
    // Sticky errors: the context can run nothing more (CUDA's programming guide, "error checking").
    match e.0 {
        CUDA_ERROR_ILLEGAL_ADDRESS
        | CUDA_ERROR_LAUNCH_FAILED
        | CUDA_ERROR_HARDWARE_STACK_ERROR
        | CUDA_ERROR_ILLEGAL_INSTRUCTION
        | CUDA_ERROR_MISALIGNED_ADDRESS
        | CUDA_ERROR_INVALID_ADDRESS_SPACE
        | CUDA_ERROR_INVALID_PC
        | CUDA_ERROR_ECC_UNCORRECTABLE
        | CUDA_ERROR_LAUNCH_TIMEOUT
        | CUDA_ERROR_DEINITIALIZED
        | CUDA_ERROR_CONTEXT_IS_DESTROYED
        | CUDA_ERROR_DEVICE_UNAVAILABLE => CudaError::Lost { what, message },
        CUDA_ERROR_OUT_OF_MEMORY => CudaError::OutOfMemory { what, message },
        _ => CudaError::Driver { what, message },
    }
}

impl Dev {
    /// Opens device `ordinal`. Errors by name when the driver or NVRTC library is missing or there is no such device.
    pub fn open(ordinal: usize, opts: super::CudaOptions) -> Result<Arc<Dev>, CudaError> {
        // SAFETY: only probes whether the shared libraries can be opened.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        // SAFETY: as above.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaError::NoNvrtc);
        }
        result::init().map_err(|e| match e.0 {
            sys::CUresult::CUDA_ERROR_NO_DEVICE => CudaError::NoDevice { ordinal, count: 0 },
            _ => driver("cuInit", e),
        })?;
        let count = result::device::get_count().map_err(|e| driver("cuDeviceGetCount", e))?.max(0) as usize;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let r1_rows = rows_setting("TENSORFOLD_CUDA_R1_ROWS")?;
        let wide_rows = AtomicUsize::new(rows_setting("TENSORFOLD_CUDA_WIDE_ROWS")?.unwrap_or(UNSET));
        let graphs = graphs_setting(std::env::var("TENSORFOLD_CUDA_GRAPHS").ok())?;
        let part = part_setting(std::env::var("TENSORFOLD_CUDA_GRAPH_OPS").ok())?;
        let pdl = pdl_setting(std::env::var("TENSORFOLD_CUDA_PDL").ok())?;
        let ctx = CudaContext::new(ordinal).map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: called before any allocation; every operation of this backend is ordered on its one stream, so
        // cudarc's cross-stream event tracking has nothing to order.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| driver("cuStreamCreate", e))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| driver("cuDeviceGetAttribute", e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown device".to_string());
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| driver("cuDeviceGetAttribute", e))?
            .max(1) as usize;
        let smem_optin = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|e| driver("cuDeviceGetAttribute", e))?
            .max(0) as usize;
        let attn_tile_rows = AtomicUsize::new(rows_setting("TENSORFOLD_CUDA_ATTN_TILE_ROWS")?.unwrap_or(UNSET));
        keep_pool_memory(&ctx);
        // The staging arena is allocated in this context.
        ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        let profile = std::env::var_os("TENSORFOLD_CUDA_PROFILE").map(|v| Mutex::new(Profile::new(v == "events")));
        let arena = Staging::new(&stream);
        let deferred = graphs && profile.is_none() && arena.is_some();
        let pdl = pdl && major >= 9 && profile.is_none() && driver_version() >= 12030;
        let tensor_cores =
            tensor_cores_setting(std::env::var("TENSORFOLD_CUDA_TENSOR_CORES").ok(), opts.tensor_cores, major)?;
        let attn_mma = attn_mma_setting(std::env::var("TENSORFOLD_CUDA_ATTN_MMA").ok())?;
        let host = StreamHost::new(arena, deferred, part);
        Ok(Arc::new(Dev {
            ctx,
            stream,
            arch: format!("sm_{major}{minor}"),
            name,
            cache: nvrtc::cache_dir(),
            nvrtc: nvrtc::version(),
            modules: Mutex::default(),
            error: Mutex::default(),
            consts: Mutex::default(),
            host: Arc::new(Mutex::new(host)),
            profile,
            fused: std::env::var_os("TENSORFOLD_CUDA_UNFUSED").is_none(),
            r1_rows,
            wide_rows,
            pdl,
            tensor_cores: AtomicBool::new(tensor_cores),
            tc_group: AtomicUsize::new(UNSET),
            sms,
            smem_optin,
            attn_tile_rows,
            attn_mma: AtomicBool::new(attn_mma),
            smem_allowed: Mutex::default(),
        }))
    }

    fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))
    }

    /// The device's ordinal (as `CudaBackend::new` took it).
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The one stream every operation of this device is ordered on (for NCCL calls), with the context bound and
    /// every queued operation issued ahead of what the caller enqueues. The caller enqueues from the thread that
    /// drives this device (the engine's), as the expert-parallel forward does: captures run only inside this
    /// device's flushes on that thread, and work another thread enqueued during one would join the graph.
    pub fn stream(&self) -> Result<sys::CUstream, CudaError> {
        self.bind()?;
        self.flush(&mut lock(&self.host))?;
        Ok(self.stream.cu_stream())
    }

    /// `bytes` of uninitialized device memory; `None` for zero bytes (nothing is allocated).
    pub fn alloc(&self, bytes: usize) -> Result<Option<Mem>, CudaError> {
        if bytes == 0 {
            return Ok(None);
        }
        self.bind()?;
        // Stream-ordered and issued now, ahead of queued work (which runs before any later use of the memory).
        let mut l = lock(&self.host);
        if l.reclaim.must_flush() {
            // Memory freed behind the queue comes back only after a flush.
            self.flush(&mut l)?;
        }
        let (size, cached) = l.reclaim.size(bytes);
        let slice = match cached.then(|| l.reclaim.take(size)).flatten() {
            Some(s) => s,
            None => self.fresh(&mut l, size)?,
        };
        let ptr = slice.device_ptr(&self.stream).0;
        Ok(Some(Mem { slice: Some(slice), ptr, bytes, host: self.host.clone() }))
    }

    /// `size` new bytes from the driver; out of memory, the cached blocks go back first and it tries once more.
    fn fresh(&self, l: &mut StreamHost, size: usize) -> Result<CudaSlice<u8>, CudaError> {
        // SAFETY: every launcher writes memory (copy, memset or kernel) before anything reads it.
        match unsafe { self.stream.alloc::<u8>(size) } {
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                // Not a settle: the caller may hold staged tables.
                self.drain(l)?;
                l.reclaim.uncache();
                // SAFETY: as above.
                unsafe { self.stream.alloc::<u8>(size) }.map_err(|e| driver("cuMemAllocAsync", e))
            }
            r => r.map_err(|e| driver("cuMemAllocAsync", e)),
        }
    }

    /// Device memory holding a copy of `data`.
    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<Option<Mem>, CudaError> {
        let m = self.alloc(std::mem::size_of_val(data))?;
        if let Some(m) = &m {
            self.htod(m.ptr, data)?;
        }
        Ok(m)
    }

    /// The device address of a copy of `words`, uploaded on first use and kept (keyed by the words themselves, so a
    /// hit is always the same contents): tables that do not change between calls skip a host-to-device copy. Never
    /// evicted, so a returned address stays valid for the device's life; there is one table a MoE layer of each
    /// model opened (about 4.6 KiB for 64 experts).
    pub fn constant(&self, words: &[u64]) -> Result<u64, CudaError> {
        let mut c = lock(&self.consts);
        if let Some(m) = c.get(words) {
            return Ok(m.ptr);
        }
        let m = self.upload(words)?.ok_or(CudaError::Unallocated)?;
        let ptr = m.ptr;
        c.insert(words.to_vec(), m);
        Ok(ptr)
    }

    /// Whether a call of `rows` rows (dense, or a MoE layer's) runs the `_r1` linears: at most [`R1_ROWS`], or
    /// `TENSORFOLD_CUDA_R1_ROWS`.
    pub fn one_row(&self, rows: usize) -> bool {
        one_row(self.r1_rows, rows)
    }

    /// Whether a dense call of `rows` rows runs the wide tiles: at least [`WIDE_ROWS`], or the override (0: never).
    pub fn wide(&self, rows: usize) -> bool {
        wide(self.wide_override(), rows, None)
    }

    /// Whether a MoE call of `rows` rows and `assignments` over `experts` experts runs the wide expert tiles: at
    /// least [`WIDE_ROWS`] rows and [`WIDE_SLOTS`] assignments an expert, or at least the override's rows.
    pub fn wide_moe(&self, rows: usize, assignments: usize, experts: usize) -> bool {
        wide(self.wide_override(), rows, Some((assignments, experts)))
    }

    /// Sets the wide-tile override (`None`: the defaults) and returns the one before: the contract checks the wide
    /// tiles at widths under the defaults.
    #[cfg(feature = "planted-faults")]
    pub fn set_wide_rows(&self, rows: Option<usize>) -> Option<usize> {
        let was = self.wide_rows.swap(rows.unwrap_or(UNSET), Ordering::Relaxed);
        (was != UNSET).then_some(was)
    }

    /// Whether the tensor-core linears serve the matrices they can (`CudaMat::tc`; the mode is the process's: see
    /// `TENSORFOLD_CUDA_TENSOR_CORES`).
    pub fn tensor_cores(&self) -> bool {
        self.tensor_cores.load(Ordering::Relaxed)
    }

    /// Sets the tensor-core mode and returns the one before: the contract checks both forms in one process.
    #[cfg(feature = "planted-faults")]
    pub fn set_tensor_cores(&self, on: bool) -> bool {
        self.tensor_cores.swap(on, Ordering::Relaxed)
    }

    /// The column groups the contract set for the narrow tensor-core forms (`None`: the host's choice).
    pub fn tc_group(&self) -> Option<usize> {
        let v = self.tc_group.load(Ordering::Relaxed);
        (v != UNSET).then_some(v)
    }

    /// Sets the narrow tensor-core forms' column groups (`None`: the host's choice) and returns the one before.
    #[cfg(feature = "planted-faults")]
    pub fn set_tc_group(&self, groups: Option<usize>) -> Option<usize> {
        let was = self.tc_group.swap(groups.unwrap_or(UNSET), Ordering::Relaxed);
        (was != UNSET).then_some(was)
    }

    /// Streaming multiprocessors of the device.
    pub fn sms(&self) -> usize {
        self.sms
    }

    fn wide_override(&self) -> Option<usize> {
        let v = self.wide_rows.load(Ordering::Relaxed);
        (v != UNSET).then_some(v)
    }

    /// Module `src` (no planted fault) compiled and loaded now.
    pub fn warm(&self, src: Src) -> Result<(), CudaError> {
        self.module(src, None).map(|_| ())
    }

    /// Kernel `name` of module `src`, compiled with `define` (a planted fault) or without.
    pub fn function(&self, src: Src, define: Option<&'static str>, name: &str) -> Result<CudaFunction, CudaError> {
        let loaded = self.module(src, define)?;
        let mut funcs = lock(&loaded.funcs);
        if let Some(f) = funcs.get(name) {
            return Ok(f.clone());
        }
        self.bind()?;
        let f = loaded.module.load_function(name).map_err(|e| driver(&format!("cuModuleGetFunction({name})"), e))?;
        if let Some(p) = &self.profile {
            lock(p).name(f.cu_function() as usize, name);
        }
        funcs.insert(name.to_string(), f.clone());
        Ok(f)
    }

    fn module(&self, src: Src, define: Option<&'static str>) -> Result<Arc<Loaded>, CudaError> {
        // Held across a compile so two threads never compile the same module.
        let mut modules = lock(&self.modules);
        if let Some(l) = modules.get(&(src, define)) {
            return Ok(l.clone());
        }
        let l = Arc::new(Loaded { module: self.load(src, define)?, funcs: Mutex::default() });
        modules.insert((src, define), l.clone());
        Ok(l)
    }

    /// The module from the disk cache when a stored image loads, else compiled by NVRTC (and stored).
    fn load(&self, src: Src, define: Option<&'static str>) -> Result<Arc<CudaModule>, CudaError> {
        let source = src.source_for(define);
        let opts = nvrtc::options(&self.arch, define);
        let key = nvrtc::cache_key(&source, &self.arch, &self.nvrtc, &opts);
        if let Some(dir) = &self.cache
            && let Some(img) = nvrtc::cached(dir, src.name(), &key)
            && let Ok(m) = self.load_image(img)
        {
            return Ok(m);
        }
        let img = nvrtc::compile(src.name(), &source, &self.arch, &opts)?;
        let module = self.load_image(img.clone())?;
        if let Some(dir) = &self.cache {
            nvrtc::store(dir, src.name(), &key, &img);
        }
        Ok(module)
    }

    fn load_image(&self, img: Image) -> Result<Arc<CudaModule>, CudaError> {
        let ptx = match img {
            Image::Cubin(b) => Ptx::from_binary(b),
            Image::Ptx(s) => Ptx::from_src(s),
        };
        self.bind()?;
        self.ctx.load_module(ptx).map_err(|e| driver("cuModuleLoadData", e))
    }

    /// Launches `f` on the stream with `block` threads a block and `smem` bytes of dynamic shared memory. A grid
    /// with a zero dimension launches nothing.
    pub fn launch(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        self.bind()?;
        // One 8-byte slot an argument; the driver reads each parameter's size from the start of its slot, so a
        // 32-bit value goes into the slot's first 4 bytes.
        let slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::P(v) | Arg::U(v) => v,
                Arg::I(v) => low_bytes(v.to_ne_bytes()),
                Arg::F(v) => low_bytes(v.to_ne_bytes()),
            })
            .collect();
        let func = f.cu_function() as usize;
        let op = Op::Launch { func, grid, block, smem, args: (0, slots.len() as u32) };
        let (synced, evented) = self.profiled();
        if !synced && !evented {
            let mut l = lock(&self.host);
            if l.deferred() {
                l.queue.launch(func, grid, block, smem, &slots);
                if l.part > 0 && l.queue.ops.len() >= l.part {
                    // The device starts on this part while the host records the next.
                    self.flush(&mut l)?;
                }
                return Ok(());
            }
            // SAFETY: each launcher passes exactly its kernel's parameters in order with matching sizes; pointers
            // are live allocations of this context (or null where the kernel never reads them), and the kernels
            // stay in the bounds their launchers checked.
            return unsafe { graphs::issue(self.issuer(&l), &op, &slots) };
        }
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let t0 = match synced {
            true => Some((self.drain(&mut lock(&self.host))?, std::time::Instant::now()).1),
            false => None,
        };
        let before = match evented {
            true => Some(self.stream.record_event(timing).map_err(|e| driver("cuEventRecord", e))?),
            false => None,
        };
        // SAFETY: as above. A profiled kernel runs alone (no programmatic overlap with the one before).
        let alone = graphs::Issuer { stream: self.stream.cu_stream(), arena: std::ptr::null(), pdl: false };
        unsafe { graphs::issue(alone, &op, &slots) }?;
        if let (Some(p), Some(t0)) = (&self.profile, t0) {
            self.drain(&mut lock(&self.host))?;
            lock(p).timed(func, t0.elapsed().as_secs_f64());
        }
        if let (Some(p), Some(before)) = (&self.profile, before) {
            let after = self.stream.record_event(timing).map_err(|e| driver("cuEventRecord", e))?;
            lock(p).evented(func, before, after);
        }
        Ok(())
    }

    /// How the next launch is profiled: (timed between syncs, timed by events).
    fn profiled(&self) -> (bool, bool) {
        self.profile.as_ref().map_or((false, false), |p| lock(p).mode())
    }

    /// The profile table (kernel, launches, total ms, µs a launch; largest first), cleared; `None` unless
    /// `TENSORFOLD_CUDA_PROFILE` was set when the device opened.
    pub fn take_profile(&self) -> Option<String> {
        let p = self.profile.as_ref()?;
        let synced = self.sync().is_ok();
        Some(lock(p).report(synced))
    }

    /// A kernel's launch limits from the driver (`cuFuncGetAttribute`), for the contract's report.
    pub fn limits(&self, src: Src, name: &str) -> Result<String, CudaError> {
        let f = self.function(src, None, name)?;
        let attr = |r: Result<i32, DriverError>| r.map_err(|e| driver("cuFuncGetAttribute", e));
        Ok(format!(
            "{name}: {} registers/thread, {} B static shared, {} B local/thread, at most {} threads/block",
            attr(f.num_regs())?,
            attr(f.shared_size_bytes())?,
            attr(f.local_size_bytes())?,
            attr(f.max_threads_per_block())?
        ))
    }

    /// Records the first failure of an infallible trait method, to be reported by the next fallible one.
    pub fn note(&self, what: &str, r: Result<(), CudaError>) {
        if let Err(e) = r {
            let mut g = lock(&self.error);
            if g.is_none() {
                *g = Some((format!("{what}: {e}"), e));
            }
        }
    }

    /// Whether a failure is waiting to be reported.
    pub fn pending(&self) -> bool {
        lock(&self.error).is_some()
    }

    /// Reports (and clears) a waiting failure as `kernel`'s error.
    pub fn take(&self, kernel: &'static str) -> Result<(), KernelError> {
        match lock(&self.error).take() {
            Some((message, CudaError::Lost { .. })) => Err(KernelError::DeviceLost { kernel, message }),
            Some((message, CudaError::OutOfMemory { .. })) => Err(KernelError::DeviceOutOfMemory { kernel, message }),
            Some((message, _)) => Err(KernelError::Device { kernel, message }),
            None => Ok(()),
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // Queued copies may still read the staging arena, which is freed with the Dev.
        let _ = self.sync();
        // Graphs name kernels of this device's modules, which its fields unload next.
        lock(&self.host).graphs.clear();
    }
}

/// The driver's CUDA version (12030 for 12.3), 0 when it cannot say. Programmatic launches are captured into graphs
/// from 12.3 on.
fn driver_version() -> i32 {
    let mut v = 0;
    // SAFETY: writes one int.
    let _ = unsafe { sys::cuDriverGetVersion(&mut v) };
    v
}

/// The wide-tile override's "not set".
const UNSET: usize = usize::MAX;

fn low_bytes(b: [u8; 4]) -> u64 {
    let mut s = [0u8; 8];
    s[..4].copy_from_slice(&b);
    u64::from_ne_bytes(s)
}
