//! The host side of a device's one stream: the page-locked staging arena, the queue of deferred operations and its
//! CUDA graphs (`graphs.rs`), the copies and syncs, and the memory pool's settings and probes.

use super::blocks::Reclaim;
use super::{Dev, Mem, driver, lock};
use crate::cuda::CudaError;
use crate::cuda::graphs::{self, Exec, Graphs, Op, Plan, Queue, Refusal};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, result, sys};
use std::ffi::c_void;
use std::sync::Arc;

/// The stream's host side (see [`Dev`]'s `host`).
pub(super) struct StreamHost {
    /// Page-locked staging for small host-to-device copies; `None` when it could not be had.
    pub(super) arena: Option<Staging>,
    /// Operations recorded since the last flush (only while `deferred`).
    pub(super) queue: Queue,
    /// Captured graphs and the flush counters.
    pub(super) graphs: Graphs<Exec>,
    /// Dropped memory: kept for reuse or given back, never before queued operations that may use it are issued.
    /// Its `deferred` flag is the device's (see [`StreamHost::deferred`]).
    pub(super) reclaim: Reclaim<CudaSlice<u8>>,
    /// Queued operations (launches, copies, memsets) that make a part: a launch that brings the queue to this many
    /// flushes it (as its own graph), so the device runs one part while the host records the next; 0: only when
    /// something waits.
    pub(super) part: usize,
    /// Flushes since the last settle: where a flushed part sits in its step (the miss report compares like parts).
    pub(super) parts: usize,
    /// Where the host's time went (the report's `host:` line).
    pub(super) times: HostTimes,
}

/// The host's time in the stream's waits and flushes since the device opened: with graphs the device runs a part
/// while the host records the next, so a step whose syncs barely wait is bound by the host's recording, not the
/// device.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct HostTimes {
    /// Stream synchronizations, and the seconds they (and the reads to the host before them) waited in all.
    syncs: u64,
    wait_s: f64,
    /// Flushes of a non-empty queue, and the seconds they took in all (capture, replay launch, or issue one by one).
    flushes: u64,
    flush_s: f64,
}

impl StreamHost {
    pub(super) fn new(arena: Option<Staging>, deferred: bool, part: usize) -> Self {
        let (queue, graphs, reclaim) = (Queue::default(), Graphs::default(), Reclaim::new(deferred));
        StreamHost { arena, queue, graphs, reclaim, part, parts: 0, times: HostTimes::default() }
    }

    /// Stream operations are queued until something waits for them, then replayed as graphs (`graphs.rs`). Off with
    /// `TENSORFOLD_CUDA_GRAPHS=0`, under a profile (it times launches one by one) or without a staging arena.
    pub(super) fn deferred(&self) -> bool {
        self.reclaim.deferred()
    }

    /// A dropped `Mem`'s memory (see [`Reclaim`]).
    pub(super) fn release(&mut self, slice: CudaSlice<u8>) {
        let queued = !self.queue.ops.is_empty();
        self.reclaim.release(slice, queued);
    }

    pub(super) fn arena_ptr(&self) -> *const u8 {
        self.arena.as_ref().map_or(std::ptr::null(), |a| a.ptr as *const u8)
    }

    /// Writes `src` into the arena and returns its offset; `None` when it is too large for a staged copy or does not
    /// fit before the next rewind (the caller then copies from `src` directly).
    fn put<T: Copy>(&mut self, src: &[T]) -> Option<usize> {
        let bytes = std::mem::size_of_val(src);
        let st = self.arena.as_mut()?;
        if bytes > STAGED_MAX || st.at + bytes > STAGING_BYTES {
            return None;
        }
        let at = st.at;
        // SAFETY: [at, at + bytes) lies inside the page-locked block (checked above); nothing queued or running
        // reads it (the arena only moves forward between rewinds); src and the block don't overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr() as *const u8, st.ptr.add(at), bytes) };
        st.at += bytes.next_multiple_of(16);
        Some(at)
    }
}

/// Captures `q` into a graph (`graphs::capture`), or with the contract's planted [`graphs::GraphFault::KernelsOnly`]
/// the kernels only.
///
/// # Safety
/// As `graphs::capture`.
unsafe fn capture(g: &Graphs<Exec>, t: graphs::Issuer, q: &Queue) -> Result<Exec, Refusal> {
    #[cfg(feature = "planted-faults")]
    if g.fault == Some(graphs::GraphFault::KernelsOnly) {
        // SAFETY: per this function's contract.
        return unsafe { graphs::capture_kernels_only(t, q) };
    }
    let _ = g;
    // SAFETY: per this function's contract.
    unsafe { graphs::capture(t, q) }
}

impl Dev {
    /// Copies `src` to device address `dst` (which must hold `size_of_val(src)` bytes). Small copies (a call's
    /// segment tables) go through the page-locked arena, so they queue (or join a graph) without the driver staging
    /// pageable memory; a larger one first issues everything queued, then copies from `src` directly.
    pub fn htod<T: Copy>(&self, dst: u64, src: &[T]) -> Result<(), CudaError> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let bytes = std::mem::size_of_val(src);
        let mut l = lock(&self.host);
        let Some(at) = l.put(src) else {
            self.flush(&mut l)?;
            // SAFETY: `dst` holds the bytes (callers size it); a copy from pageable memory is staged before this
            // returns, so `src` may be dropped afterwards.
            return unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
                .map_err(|e| driver("cuMemcpyHtoD", e));
        };
        let op = Op::Htod { dst, at, bytes };
        if l.deferred() {
            l.queue.ops.push(op);
            return Ok(());
        }
        // SAFETY: `dst` holds `bytes` (callers size it); the staged bytes stay untouched until the copy has run.
        unsafe { graphs::issue(self.issuer(&l), &op, &[]) }
    }

    /// Device memory holding `data` for the launches recorded next (a call's segment table, token ids, positions),
    /// or `None` for no data. Staged in the page-locked arena and sent to the device's mirror of the arena in one
    /// copy at the head of the part that uses it, so a graph part holds one copy node, not one a table. The address
    /// is valid until this device's next `sync` or `dtoh` (the arena rewinds there): a launcher stages its tables and
    /// launches, never waiting in between, and one thread drives a device (the engine's; a `sync` from another thread
    /// in between would rewind under it). Too large, or with the arena full or missing: [`Dev::upload`].
    pub fn stage<T: Copy>(&self, data: &[T]) -> Result<Option<Mem>, CudaError> {
        let bytes = std::mem::size_of_val(data);
        if bytes == 0 {
            return Ok(None);
        }
        self.bind()?;
        let mut l = lock(&self.host);
        let Some(at) = l.put(data) else {
            drop(l);
            return self.upload(data);
        };
        let Some(mirror) = l.arena.as_ref().map(|a| a.mirror) else { return Err(CudaError::Unallocated) };
        let ptr = mirror + at as u64;
        if !l.deferred() {
            // SAFETY: the mirror holds the arena's range; the staged bytes stay put until the next rewind.
            unsafe { graphs::issue(self.issuer(&l), &Op::Htod { dst: ptr, at, bytes }, &[]) }?;
        }
        Ok(Some(Mem { slice: None, ptr, bytes, host: self.host.clone() }))
    }

    /// Copies device bytes at `src` into `dst`, then waits for the stream (so `dst` is ready and every earlier
    /// kernel's failure surfaces here).
    pub fn dtoh<T: Copy>(&self, dst: &mut [T], src: u64) -> Result<(), CudaError> {
        self.bind()?;
        let mut l = lock(&self.host);
        self.flush(&mut l)?;
        if !dst.is_empty() {
            // A copy to pageable memory returns only when it is done: it waits for the queue like a sync.
            let t = std::time::Instant::now();
            // SAFETY: `src` holds `size_of_val(dst)` bytes (callers check); the stream is synchronized below
            // before `dst` is used.
            unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
                .map_err(|e| driver("cuMemcpyDtoH", e))?;
            l.times.wait_s += t.elapsed().as_secs_f64();
        }
        self.settle(&mut l)
    }

    /// Copies `bytes` between device addresses (stream-ordered).
    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges hold `bytes` bytes (callers check).
        unsafe { self.record(Op::Dtod { dst, src, bytes }) }
    }

    /// Sets `bytes` bytes at `dst` to `value` (0x00 gives f32 zeros, 0xff gives NaNs).
    pub fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `dst` holds `bytes` bytes (callers check).
        unsafe { self.record(Op::Memset { dst, value, bytes }) }
    }

    /// Queues `op` (deferred) or issues it now.
    ///
    /// # Safety
    /// As [`graphs::issue`].
    pub(super) unsafe fn record(&self, op: Op) -> Result<(), CudaError> {
        self.bind()?;
        let mut l = lock(&self.host);
        if l.deferred() {
            l.queue.ops.push(op);
            return Ok(());
        }
        // SAFETY: per this function's contract.
        unsafe { graphs::issue(self.issuer(&l), &op, &[]) }
    }

    /// Where this device issues: its stream, the host side's arena, and programmatic dependent launch when on.
    pub(super) fn issuer(&self, l: &StreamHost) -> graphs::Issuer {
        graphs::Issuer { stream: self.stream.cu_stream(), arena: l.arena_ptr(), pdl: self.pdl }
    }

    /// Issues every operation queued so far, without waiting for them: a failure to send them is returned here
    /// rather than met by whichever later call would have sent them.
    pub fn send(&self) -> Result<(), CudaError> {
        self.bind()?;
        self.flush(&mut lock(&self.host))
    }

    /// Waits for every operation queued so far.
    pub fn sync(&self) -> Result<(), CudaError> {
        self.bind()?;
        self.settle(&mut lock(&self.host))
    }

    /// [`Dev::drain`], then rewinds the arena: nothing reads it any more, and staged addresses end here.
    pub(super) fn settle(&self, l: &mut StreamHost) -> Result<(), CudaError> {
        self.drain(l)?;
        if let Some(a) = l.arena.as_mut() {
            (a.at, a.sent) = (0, 0);
        }
        l.parts = 0;
        Ok(())
    }

    /// Issues the queue and waits for the stream, keeping the arena (a wait inside a launcher: an allocation out of
    /// memory, a profiled launch).
    pub(super) fn drain(&self, l: &mut StreamHost) -> Result<(), CudaError> {
        self.flush(l)?;
        let t = std::time::Instant::now();
        self.stream.synchronize().map_err(|e| driver("cuStreamSynchronize", e))?;
        l.times.syncs += 1;
        l.times.wait_s += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Issues the queued operations: a cached graph's replay, a capture, or one by one (`graphs.rs` decides).
    pub(super) fn flush(&self, l: &mut StreamHost) -> Result<(), CudaError> {
        if l.queue.ops.is_empty() {
            return Ok(());
        }
        let t = std::time::Instant::now();
        if let Some(st) = l.arena.as_mut()
            && st.at > st.sent
        {
            // Everything staged since the last flush, in one copy ahead of the ops that read it.
            let op = Op::Htod { dst: st.mirror + st.sent as u64, at: st.sent, bytes: st.at - st.sent };
            l.queue.ops.insert(0, op);
            st.sent = st.at;
        }
        let (issuer, raw) = (self.issuer(l), self.stream.cu_stream());
        let StreamHost { queue, graphs, .. } = l;
        let one_by_one = |q: &Queue| {
            // SAFETY: every op was recorded by a launcher that checked its addresses and sizes; the arena's bytes
            // stay put until the next settle.
            q.ops.iter().try_for_each(|op| unsafe { graphs::issue(issuer, op, &q.args) })
        };
        let r = match graphs.plan(queue, l.parts) {
            Plan::Eager => one_by_one(queue),
            Plan::Replay(key) => match graphs.exec(key) {
                Some(e) => e.launch(raw),
                None => one_by_one(queue),
            },
            // SAFETY: as above; the context was bound by the caller.
            Plan::Capture(key) => match unsafe { capture(graphs, issuer, queue) } {
                Ok(exec) => {
                    let r = exec.launch(raw);
                    graphs.keep(key, queue, exec);
                    r
                }
                Err(Refusal::Capture(e)) => {
                    graphs.refused(key, &e);
                    one_by_one(queue)
                }
                Err(Refusal::Begin(e)) => Err(e),
            },
        };
        queue.clear();
        l.parts += 1;
        l.times.flushes += 1;
        l.times.flush_s += t.elapsed().as_secs_f64();
        // The frees are ordered after the operations that used the memory.
        l.reclaim.flushed();
        // A failure goes to the call that triggered the flush, which reports it (an infallible method leaves it
        // for the next fallible one): the round it belongs to fails.
        r
    }

    /// Plants a fault in this device's graph machinery (the contract's `cuda.graphs` controls only; open a device
    /// of its own for it).
    #[cfg(feature = "planted-faults")]
    pub fn plant_graph_fault(&self, f: graphs::GraphFault) {
        lock(&self.host).graphs.fault = Some(f);
    }

    /// `(replays, captures)`: flushes replayed and captured since the device opened.
    #[cfg(feature = "planted-faults")]
    pub fn graph_counts(&self) -> (u64, u64) {
        let l = lock(&self.host);
        (l.graphs.stats.replays, l.graphs.stats.captures)
    }

    /// Turns deferral on with parts of `part` operations, whatever the environment said (the contract's
    /// `cuda.graphs` entry, on a device of its own, before it allocates anything). False where graphs cannot run:
    /// under a profile or without a page-locked arena.
    #[cfg(feature = "planted-faults")]
    pub fn force_graphs(&self, part: usize) -> bool {
        let mut l = lock(&self.host);
        if self.profile.is_some() || l.arena.is_none() {
            return false;
        }
        l.part = part;
        l.reclaim.set_deferred(true);
        true
    }

    /// What the deferred queue did since the device opened (flushes replayed, captured, issued one by one), or
    /// that it is off.
    pub fn graph_report(&self) -> String {
        let l = lock(&self.host);
        let (s, t) = (l.graphs.stats, l.times);
        let per = |secs: f64, n: u64| secs * 1e6 / n.max(1) as f64;
        let host = format!(
            "\n  host: {} syncs waited {:.1} ms ({:.1} us each); {} flushes took {:.1} ms ({:.1} us each)",
            t.syncs,
            t.wait_s * 1e3,
            per(t.wait_s, t.syncs),
            t.flushes,
            t.flush_s * 1e3,
            per(t.flush_s, t.flushes)
        );
        if !l.deferred() {
            return "cuda graphs: off (TENSORFOLD_CUDA_GRAPHS=0, a profile, or no page-locked arena)".to_string()
                + &host;
        }
        let mut misses: String = l.graphs.misses.iter().map(|m| format!("\n  missed: {m}")).collect();
        if let Some(r) = &l.graphs.refusal {
            misses += &format!("\n  last refused capture: {r}");
        }
        format!(
            "cuda graphs: {} flushes replayed, {} captured ({} refused), {} issued op by op; {} of {} operations ran in graphs; {} graphs held; {:.1} MiB of freed blocks kept",
            s.replays,
            s.captures,
            s.failed,
            s.eager,
            s.graph_ops,
            s.ops,
            l.graphs.len(),
            l.reclaim.cached_bytes() as f64 / (1 << 20) as f64,
        ) + &host
            + &misses
    }
}

/// Operations a graph part holds by default (`TENSORFOLD_CUDA_GRAPH_OPS`): a 24B decode step (about 700) runs as
/// about 11 parts.
pub(crate) const PART_OPS: usize = 64;

/// `TENSORFOLD_CUDA_GRAPH_OPS=N` (a measuring aid; the bits are the same either way): graph parts of N operations, 0
/// for one part from one wait to the next. Unset: [`PART_OPS`].
pub(crate) fn part_setting(v: Option<String>) -> Result<usize, CudaError> {
    match v {
        None => Ok(PART_OPS),
        Some(s) => s.trim().parse().map_err(|_| CudaError::Setting {
            name: "TENSORFOLD_CUDA_GRAPH_OPS",
            value: s,
            want: "a count of operations (0: no parts)",
        }),
    }
}

/// `TENSORFOLD_CUDA_GRAPHS` (a measuring aid for A/B runs in one binary; the bits are the same either way): unset or
/// `1` defers stream operations and replays graphs, `0` issues each operation when it is made.
pub(crate) fn graphs_setting(v: Option<String>) -> Result<bool, CudaError> {
    on_off("TENSORFOLD_CUDA_GRAPHS", v, "0 (off) or 1 (on, the default)")
}

/// `TENSORFOLD_CUDA_PDL` (a measuring aid for A/B runs in one binary; the bits are the same either way): unset or `1`
/// launches kernels with programmatic dependent launch where the device has it (sm_90 on), `0` never.
pub(crate) fn pdl_setting(v: Option<String>) -> Result<bool, CudaError> {
    on_off("TENSORFOLD_CUDA_PDL", v, "0 (off) or 1 (on where the device has it, the default)")
}

/// A switch that is on unless set to `0`; any value but `0` and `1` is refused by name.
fn on_off(name: &'static str, v: Option<String>, want: &'static str) -> Result<bool, CudaError> {
    match v.as_deref().map(str::trim) {
        None | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(_) => Err(CudaError::Setting { name, value: v.unwrap_or_default(), want }),
    }
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
        Ok((
            self.pool_attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            self.pool_attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        ))
    }

    /// Bytes new allocations can still take: the driver's free device memory plus what the default pool holds
    /// reserved but unused (`cuMemGetInfo`, `cuMemPoolGetAttribute`).
    pub fn mem_free(&self) -> Result<usize, CudaError> {
        self.bind()?;
        let (free, _total) = result::mem_get_info().map_err(|e| driver("cuMemGetInfo", e))?;
        let reserved = self.pool_attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        let used = self.pool_attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
        Ok(free + reserved.saturating_sub(used))
    }

    /// One u64 attribute of the device's default pool (the context bound).
    fn pool_attr(&self, a: sys::CUmemPool_attribute) -> Result<usize, CudaError> {
        let mut v = 0u64;
        // SAFETY: the device handle belongs to a live context; the attributes read here are u64.
        unsafe {
            let pool = result::device::get_default_mem_pool(self.ctx.cu_device())
                .map_err(|e| driver("cuDeviceGetDefaultMemPool", e))?;
            result::mem_pool::get_attribute(pool, a, &mut v as *mut u64 as *mut c_void)
                .map_err(|e| driver("cuMemPoolGetAttribute", e))?;
        }
        Ok(v as usize)
    }
}

/// Largest copy that goes through [`Staging`].
const STAGED_MAX: usize = 64 << 10;
/// Size of the page-locked staging ring.
const STAGING_BYTES: usize = 4 << 20;

/// A page-locked host arena for small host-to-device copies: a copy from pageable memory may make the driver stage it
/// (and wait) on every call, a decode step makes a hundred such copies, and a graph's copy nodes read fixed host
/// addresses. Bytes are written at `at`, which only moves forward between syncs and rewinds at each one, so a step
/// that starts after a sync stages its tables at the same offsets every time. `mirror` is device memory of the
/// same size: [`Dev::stage`]d tables are read there, after one copy of `[sent, at)` a flush.
pub(super) struct Staging {
    ptr: *mut u8,
    at: usize,
    /// Arena bytes below this offset are on their way to the mirror (queued or issued).
    sent: usize,
    /// The mirror's device address, and its memory.
    mirror: u64,
    _mirror: CudaSlice<u8>,
}

// SAFETY: the ring is only touched under Dev's mutex; the pointer is a driver allocation valid on every thread.
unsafe impl Send for Staging {}

impl Staging {
    /// The ring and its device mirror, or `None` when either cannot be had (copies then stay pageable).
    pub(super) fn new(stream: &Arc<CudaStream>) -> Option<Self> {
        // SAFETY: written by the launchers before any copy reads it.
        let m = unsafe { stream.alloc::<u8>(STAGING_BYTES) }.ok()?;
        let mirror = m.device_ptr(stream).0;
        // SAFETY: plain page-locked allocation; freed in Drop.
        let p = unsafe { result::malloc_host(STAGING_BYTES, 0) }.ok()?;
        Some(Self { ptr: p as *mut u8, at: 0, sent: 0, mirror, _mirror: m })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_host; Dev (its owner) is dropped after its stream's work is done.
        let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
    }
}

/// Keeps freed memory in the device's default pool instead of returning it at every synchronization (the
/// forward allocates and frees its activations every call), and lets the pool hand freed memory only to later
/// allocations on the same stream. Frees are issued after the operations that use the memory (`blocks.rs`), so the
/// reuse limits are a second guard that matters only with a second stream, which this backend never creates. Best
/// effort: a failure changes only speed.
pub(super) fn keep_pool_memory(ctx: &CudaContext) {
    use sys::CUmemPool_attribute::*;
    // SAFETY: the device handle belongs to a live context; the threshold takes a u64, the reuse flags an int.
    unsafe {
        if let Ok(pool) = result::device::get_default_mem_pool(ctx.cu_device()) {
            let mut v = u64::MAX;
            let _ = result::mem_pool::set_attribute(
                pool,
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut v as *mut u64 as *mut c_void,
            );
            for a in [CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES] {
                let mut off: i32 = 0;
                let _ = result::mem_pool::set_attribute(pool, a, &mut off as *mut i32 as *mut c_void);
            }
        }
    }
}
