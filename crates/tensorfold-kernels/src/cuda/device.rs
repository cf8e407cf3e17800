//! The CUDA device behind a `CudaBackend`: its context and one stream, device memory, kernel modules compiled at
//! first use (with a planted fault's define when the contract asks for one), launches, and the sticky error that
//! the trait's infallible methods leave for the next fallible one.

use super::CudaError;
use super::nvrtc::{self, Image};
use super::profile::Profile;
use crate::backend::KernelError;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DriverError, result, sys,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
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
/// Output columns a warp of a tile kernel covers (common.cuh's `CT`; the `_r1` kernels cover 1).
pub const CT: usize = 4;
/// Keys an attention block covers (common.cuh's `KEY_CHUNK`).
pub const KEY_CHUNK: usize = 256;
/// Largest grid y or z dimension.
pub const GRID_YZ: usize = 65535;

const COMMON: &str = include_str!("common.cuh");

/// A kernel source: one `.cu` file of this folder, compiled as its own module after `common.cuh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Src {
    /// `rows.cu`: embed, rmsnorm, add, gather, greedy.
    Rows,
    /// `dense.cu`: linear, SwiGLU gate-up, MoE expert tiles.
    Dense,
    /// `rope.cu`: q/k norm and rotary embedding.
    Rope,
    /// `attention.cu`: K/V append, chunked attention.
    Attention,
    /// `conv.cu`: the short conv.
    Conv,
    /// `moe.cu`: routing, plan, combine.
    Moe,
}

impl Src {
    /// Module name (the file stem).
    pub fn name(self) -> &'static str {
        match self {
            Src::Rows => "rows",
            Src::Dense => "dense",
            Src::Rope => "rope",
            Src::Attention => "attention",
            Src::Conv => "conv",
            Src::Moe => "moe",
        }
    }

    fn body(self) -> &'static str {
        match self {
            Src::Rows => include_str!("rows.cu"),
            Src::Dense => include_str!("dense.cu"),
            Src::Rope => include_str!("rope.cu"),
            Src::Attention => include_str!("attention.cu"),
            Src::Conv => include_str!("conv.cu"),
            Src::Moe => include_str!("moe.cu"),
        }
    }

    /// The text NVRTC compiles: `common.cuh` then the module.
    pub fn source(self) -> String {
        format!("{COMMON}\n{}", self.body())
    }
}

/// A planted fault: module `src` compiled with `-D<define>` (the contract's controls; production never sets one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plant {
    /// The module the fault lives in.
    pub src: Src,
    /// The preprocessor symbol that switches it on (e.g. `FAULT_LINEAR_DROP_LAST`).
    pub define: &'static str,
}

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

/// Device memory of `bytes > 0` bytes, freed (stream-ordered) on drop.
pub struct Mem {
    slice: CudaSlice<u8>,
    /// Device address.
    pub ptr: u64,
    /// Size in bytes.
    pub bytes: usize,
}

impl Drop for Mem {
    fn drop(&mut self) {
        // The free that follows (CudaSlice's drop) needs this context current on the dropping thread, which may
        // never have launched anything.
        let _ = self.slice.context().bind_to_thread();
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
    modules: Mutex<Modules>,
    /// The first failure waiting to be reported, and whether it left the device unusable.
    error: Mutex<Option<(String, bool)>>,
    /// Page-locked staging for small host-to-device copies (see [`Staging`]).
    staging: Mutex<Option<Staging>>,
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
        _ => CudaError::Driver { what, message },
    }
}

impl Dev {
    /// Opens device `ordinal`. Errors by name when the driver or NVRTC library is missing or there is no such device.
    pub fn open(ordinal: usize) -> Result<Arc<Dev>, CudaError> {
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
        let r1_rows = match std::env::var("TENSORFOLD_CUDA_R1_ROWS") {
            Ok(v) => {
                Some(v.trim().parse().map_err(|_| CudaError::Setting { name: "TENSORFOLD_CUDA_R1_ROWS", value: v })?)
            }
            Err(_) => None,
        };
        let ctx = CudaContext::new(ordinal).map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: called before any allocation; every operation of this backend is ordered on its one stream, so
        // cudarc's cross-stream event tracking has nothing to order.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| driver("cuStreamCreate", e))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| driver("cuDeviceGetAttribute", e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown device".to_string());
        keep_pool_memory(&ctx);
        // The staging ring is allocated in this context.
        ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        Ok(Arc::new(Dev {
            ctx,
            stream,
            arch: format!("sm_{major}{minor}"),
            name,
            cache: nvrtc::cache_dir(),
            modules: Mutex::default(),
            error: Mutex::default(),
            consts: Mutex::default(),
            staging: Mutex::new(Staging::new()),
            profile: std::env::var_os("TENSORFOLD_CUDA_PROFILE").map(|v| Mutex::new(Profile::new(v == "events"))),
            fused: std::env::var_os("TENSORFOLD_CUDA_UNFUSED").is_none(),
            r1_rows,
        }))
    }

    fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))
    }

    /// The device's ordinal (as `CudaBackend::new` took it).
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The one stream every operation of this device is ordered on (for NCCL calls), with the context bound.
    pub fn stream(&self) -> Result<sys::CUstream, CudaError> {
        self.bind()?;
        Ok(self.stream.cu_stream())
    }

    /// `bytes` of uninitialized device memory; `None` for zero bytes (nothing is allocated).
    pub fn alloc(&self, bytes: usize) -> Result<Option<Mem>, CudaError> {
        if bytes == 0 {
            return Ok(None);
        }
        self.bind()?;
        // SAFETY: every launcher writes memory (copy, memset or kernel) before anything reads it.
        let slice = unsafe { self.stream.alloc::<u8>(bytes) }.map_err(|e| driver("cuMemAllocAsync", e))?;
        let ptr = slice.device_ptr(&self.stream).0;
        Ok(Some(Mem { slice, ptr, bytes }))
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

    /// Copies `src` to device address `dst` (which must hold `size_of_val(src)` bytes). Small copies (a call's
    /// segment tables) go through page-locked staging, so they queue without the driver staging pageable memory.
    pub fn htod<T: Copy>(&self, dst: u64, src: &[T]) -> Result<(), CudaError> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let bytes = std::mem::size_of_val(src);
        if bytes <= STAGED_MAX {
            let mut g = lock(&self.staging);
            if let Some(st) = g.as_mut() {
                if st.at + bytes > STAGING_BYTES {
                    // Every copy queued from the ring so far must have run before its bytes are overwritten.
                    self.sync()?;
                    st.at = 0;
                }
                // SAFETY: [at, at + bytes) lies inside the page-locked block (checked above); nothing queued still
                // reads it (the sync above, the ring only moving forward in between); src and the block don't overlap.
                let staged = unsafe {
                    let p = st.ptr.add(st.at);
                    std::ptr::copy_nonoverlapping(src.as_ptr() as *const u8, p, bytes);
                    std::slice::from_raw_parts(p as *const u8, bytes)
                };
                st.at += bytes.next_multiple_of(16);
                // SAFETY: `dst` holds `bytes` (callers size it); `staged` stays untouched until the copy has run.
                return unsafe { result::memcpy_htod_async(dst, staged, self.stream.cu_stream()) }
                    .map_err(|e| driver("cuMemcpyHtoD", e));
            }
        }
        // SAFETY: `dst` holds the bytes (callers size it); a copy from pageable memory is staged before this
        // returns, so `src` may be dropped afterwards.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }.map_err(|e| driver("cuMemcpyHtoD", e))
    }

    /// Copies device bytes at `src` into `dst`, then waits for the stream (so `dst` is ready and every earlier
    /// kernel's failure surfaces here).
    pub fn dtoh<T: Copy>(&self, dst: &mut [T], src: u64) -> Result<(), CudaError> {
        if !dst.is_empty() {
            self.bind()?;
            // SAFETY: `src` holds `size_of_val(dst)` bytes (callers check); the stream is synchronized below
            // before `dst` is used.
            unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
                .map_err(|e| driver("cuMemcpyDtoH", e))?;
        }
        self.sync()
    }

    /// Copies `bytes` between device addresses (stream-ordered).
    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges hold `bytes` bytes (callers check).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(|e| driver("cuMemcpyDtoD", e))
    }

    /// Sets `bytes` bytes at `dst` to `value` (0x00 gives f32 zeros, 0xff gives NaNs).
    pub fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` holds `bytes` bytes (callers check).
        unsafe { result::memset_d8_async(dst, value, bytes, self.stream.cu_stream()) }
            .map_err(|e| driver("cuMemsetD8", e))
    }

    /// Waits for every operation queued so far.
    pub fn sync(&self) -> Result<(), CudaError> {
        self.bind()?;
        self.stream.synchronize().map_err(|e| driver("cuStreamSynchronize", e))
    }

    /// Whether a call of `rows` rows (dense, or a MoE layer's) runs the `_r1` linears: at most [`R1_ROWS`], or
    /// `TENSORFOLD_CUDA_R1_ROWS`.
    pub fn one_row(&self, rows: usize) -> bool {
        one_row(self.r1_rows, rows)
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
        let source = src.source();
        let opts = nvrtc::options(&self.arch, define);
        let key = nvrtc::cache_key(&source, &self.arch, &opts);
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
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::P(v) | Arg::U(v) => v,
                Arg::I(v) => low_bytes(v.to_ne_bytes()),
                Arg::F(v) => low_bytes(v.to_ne_bytes()),
            })
            .collect();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        let (synced, evented) = self.profiled();
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let t0 = match synced {
            true => Some((self.sync()?, std::time::Instant::now()).1),
            false => None,
        };
        let before = match evented {
            true => Some(self.stream.record_event(timing).map_err(|e| driver("cuEventRecord", e))?),
            false => None,
        };
        // SAFETY: each launcher passes exactly its kernel's parameters in order with matching sizes; pointers are
        // live allocations of this context (or null where the kernel never reads them), and the kernels stay in
        // the bounds their launchers checked. The slots outlive the call, which copies them.
        unsafe {
            result::launch_kernel(f.cu_function(), grid, (block, 1, 1), smem, self.stream.cu_stream(), &mut params)
        }
        .map_err(|e| driver("cuLaunchKernel", e))?;
        if let (Some(p), Some(t0)) = (&self.profile, t0) {
            self.sync()?;
            lock(p).timed(f.cu_function() as usize, t0.elapsed().as_secs_f64());
        }
        if let (Some(p), Some(before)) = (&self.profile, before) {
            let after = self.stream.record_event(timing).map_err(|e| driver("cuEventRecord", e))?;
            lock(p).evented(f.cu_function() as usize, before, after);
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
                *g = Some((format!("{what}: {e}"), e.is_lost()));
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
            Some((message, true)) => Err(KernelError::DeviceLost { kernel, message }),
            Some((message, false)) => Err(KernelError::Device { kernel, message }),
            None => Ok(()),
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // Queued copies may still read the staging ring, which is freed with the Dev.
        let _ = self.sync();
    }
}

/// [`Dev::one_row`] with the override `r1_rows` given.
pub(crate) fn one_row(r1_rows: Option<usize>, rows: usize) -> bool {
    rows <= r1_rows.unwrap_or(R1_ROWS)
}

fn low_bytes(b: [u8; 4]) -> u64 {
    let mut s = [0u8; 8];
    s[..4].copy_from_slice(&b);
    u64::from_ne_bytes(s)
}

impl Dev {
    /// Best of 5 device-to-device copies of 512 MiB, in bytes moved (read + write) per second.
    pub fn copy_bandwidth(&self) -> Result<f64, CudaError> {
        let n = 512usize << 20;
        let (src, dst) = (self.alloc(n)?, self.alloc(n)?);
        let (Some(src), Some(dst)) = (src, dst) else { return Err(CudaError::Unallocated) };
        // Not zeros (METHOD: zeros can run faster than real data); a copy's speed does not depend on the values.
        self.memset(src.ptr, 0x5a, n)?;
        self.dtod(dst.ptr, src.ptr, n)?;
        self.sync()?;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            self.dtod(dst.ptr, src.ptr, n)?;
            self.sync()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(2.0 * n as f64 / best)
    }

    /// The default pool's high-water marks: `(used, reserved)` bytes.
    pub fn pool_high(&self) -> Result<(usize, usize), CudaError> {
        self.bind()?;
        let attr = |a: sys::CUmemPool_attribute| -> Result<usize, CudaError> {
            let mut v = 0u64;
            // SAFETY: the device handle belongs to a live context; both attributes are u64.
            unsafe {
                let pool = result::device::get_default_mem_pool(self.ctx.cu_device())
                    .map_err(|e| driver("cuDeviceGetDefaultMemPool", e))?;
                result::mem_pool::get_attribute(pool, a, &mut v as *mut u64 as *mut c_void)
                    .map_err(|e| driver("cuMemPoolGetAttribute", e))?;
            }
            Ok(v as usize)
        };
        Ok((
            attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        ))
    }
}

/// Largest copy that goes through [`Staging`].
const STAGED_MAX: usize = 64 << 10;
/// Size of the page-locked staging ring.
const STAGING_BYTES: usize = 4 << 20;

/// A page-locked host ring for small host-to-device copies: a copy from pageable memory may make the driver stage it
/// (and wait) on every call, and a decode step makes a hundred such copies. Bytes are written at `at` and only
/// reused after a stream sync.
struct Staging {
    ptr: *mut u8,
    at: usize,
}

// SAFETY: the ring is only touched under Dev's mutex; the pointer is a driver allocation valid on every thread.
unsafe impl Send for Staging {}

impl Staging {
    /// The ring, or `None` when page-locked memory cannot be had (copies then stay pageable).
    fn new() -> Option<Self> {
        // SAFETY: plain page-locked allocation; freed in Drop.
        let p = unsafe { result::malloc_host(STAGING_BYTES, 0) }.ok()?;
        Some(Self { ptr: p as *mut u8, at: 0 })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_host; Dev (its owner) is dropped after its stream's work is done.
        let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
    }
}

/// Keeps freed memory in the device's default pool instead of returning it at every synchronization (the
/// forward allocates and frees its activations every call). Best effort: a failure changes only speed.
fn keep_pool_memory(ctx: &CudaContext) {
    // SAFETY: the device handle belongs to a live context; the attribute takes a u64, which `v` is.
    unsafe {
        if let Ok(pool) = result::device::get_default_mem_pool(ctx.cu_device()) {
            let mut v = u64::MAX;
            let _ = result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut v as *mut u64 as *mut c_void,
            );
        }
    }
}
