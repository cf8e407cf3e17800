//! Deferred stream operations and CUDA graphs: a device queues its launches, small copies and memsets until
//! something waits for them, then replays a captured graph of that exact sequence when it ran before, else issues
//! them one by one (docs/cuda.md, "CUDA graphs").
//!
//! Why: a 24B decode step is about 560 launches of a few microseconds each, and the stream sat idle between them
//! (the events profile). A graph launch hands the device the whole step at once. A replay is only taken when the
//! recorded sequence (kernels, grids, every argument word, copy addresses and sizes) equals the captured one
//! exactly, so it runs the same kernels on the same addresses with the same arguments as issuing them would: the
//! bits cannot differ. What changes from step to step (positions, cache addresses, token ids) travels in small
//! host-to-device copies out of a page-locked arena, which a graph's copy nodes read when the graph runs.

use super::CudaError;
use super::device::driver;
use cudarc::driver::{result, sys};
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::hash::{Hash, Hasher};

/// Queues shorter than this are issued one by one: a graph's launch and bookkeeping would not pay.
pub(crate) const MIN_GRAPH_OPS: usize = 16;
/// Graphs kept (least recently used evicted): the parts of a step, for each round shape (rows, streams, attention
/// key chunks) in use.
const GRAPHS_MAX: usize = 64;
/// Sequences remembered as seen once (cleared when full): a sequence is captured on its second sighting, so a
/// one-off prefill chunk is never captured.
const SEEN_MAX: usize = 4096;

/// One stream operation, as recorded. Launch arguments live in the queue's flat `args` at `args.0 .. +args.1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    /// `cuLaunchKernel(func, grid, (block, 1, 1), smem, args)`; `func` is the `CUfunction` handle's address.
    Launch { func: usize, grid: (u32, u32, u32), block: u32, smem: u32, args: (u32, u32) },
    /// `bytes` from the arena at offset `at` to device address `dst`.
    Htod { dst: u64, at: usize, bytes: usize },
    /// `bytes` from device address `src` to `dst`.
    Dtod { dst: u64, src: u64, bytes: usize },
    /// `bytes` at `dst` set to `value`.
    Memset { dst: u64, value: u8, bytes: usize },
}

/// Recorded operations not yet issued: the ops in stream order and their launch arguments (one 8-byte slot each).
#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) ops: Vec<Op>,
    pub(crate) args: Vec<u64>,
}

impl Queue {
    /// Records a launch.
    pub(crate) fn launch(&mut self, func: usize, grid: (u32, u32, u32), block: u32, smem: u32, slots: &[u64]) {
        let args = (self.args.len() as u32, slots.len() as u32);
        self.args.extend_from_slice(slots);
        self.ops.push(Op::Launch { func, grid, block, smem, args });
    }

    /// The sequence's hash (ops and argument words).
    fn key(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.ops.hash(&mut h);
        self.args.hash(&mut h);
        h.finish()
    }

    pub(crate) fn clear(&mut self) {
        self.ops.clear();
        self.args.clear();
    }
}

/// Where recorded ops are issued: the stream, the page-locked block an [`Op::Htod`] copies from, and whether a
/// launch may start while the kernel before it finishes (programmatic dependent launch, sm_90 on: each kernel waits
/// at its entry for the one before, `PDL_ENTRY` in common.cuh, so the results are the same bits).
#[derive(Clone, Copy)]
pub(crate) struct Issuer {
    pub(crate) stream: sys::CUstream,
    pub(crate) arena: *const u8,
    pub(crate) pdl: bool,
}

/// Issues `op` on `t.stream` now (or into the capture the stream is in).
///
/// # Safety
/// Every address in `op` must be a live allocation of the stream's context holding the sizes recorded (the
/// launchers check); `t.arena` must hold `at + bytes` bytes that stay unchanged until the copy has run.
pub(crate) unsafe fn issue(t: Issuer, op: &Op, args: &[u64]) -> Result<(), CudaError> {
    match *op {
        Op::Launch { func, grid, block, smem, args: (a, n) } => {
            let slots = &args[a as usize..(a + n) as usize];
            // The driver reads each parameter through its pointer during the call and copies it.
            let mut params: Vec<*mut c_void> = slots.iter().map(|s| s as *const u64 as *mut c_void).collect();
            if t.pdl {
                // SAFETY: as below; the attribute lives through the call.
                return unsafe { launch_pdl(t.stream, func as sys::CUfunction, grid, block, smem, &mut params) };
            }
            // SAFETY: per this function's contract; the slots outlive the call.
            unsafe { result::launch_kernel(func as sys::CUfunction, grid, (block, 1, 1), smem, t.stream, &mut params) }
                .map_err(|e| driver("cuLaunchKernel", e))
        }
        Op::Htod { dst, at, bytes } => {
            // SAFETY: per this function's contract.
            let src = unsafe { std::slice::from_raw_parts(t.arena.add(at), bytes) };
            unsafe { result::memcpy_htod_async(dst, src, t.stream) }.map_err(|e| driver("cuMemcpyHtoD", e))
        }
        Op::Dtod { dst, src, bytes } => {
            // SAFETY: per this function's contract.
            unsafe { result::memcpy_dtod_async(dst, src, bytes, t.stream) }.map_err(|e| driver("cuMemcpyDtoD", e))
        }
        Op::Memset { dst, value, bytes } => {
            // SAFETY: per this function's contract.
            unsafe { result::memset_d8_async(dst, value, bytes, t.stream) }.map_err(|e| driver("cuMemsetD8", e))
        }
    }
}

/// `cuLaunchKernelEx` with programmatic stream serialization: the kernel may be scheduled before the previous
/// kernel on the stream has finished (CUDA programming guide, "Programmatic Dependent Launch"); it waits for it at
/// its entry. Captured into a graph as a programmatic edge.
///
/// # Safety
/// As [`issue`]'s launch.
unsafe fn launch_pdl(
    stream: sys::CUstream,
    f: sys::CUfunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    // SAFETY: a plain-data union; zeroed is a valid value, and the one field the attribute's id names is set.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let cfg = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: per the caller's contract; `cfg` and `attr` outlive the call, which copies the parameters.
    unsafe { sys::cuLaunchKernelEx(&cfg, f, params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .map_err(|e| driver("cuLaunchKernelEx", e))
}

/// A planted fault of the graph machinery (the contract's `cuda.graphs` controls; feature `planted-faults`).
#[cfg(feature = "planted-faults")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphFault {
    /// A capture records the kernels only: the staged copies are issued once, before it, so a replay reuses the
    /// tables copied for the capture.
    KernelsOnly,
    /// A sequence without an exact match replays any held graph with as many operations.
    ReplayByLength,
}

/// What to do with a flushed queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Launch the cached graph of this key.
    Replay(u64),
    /// Capture the sequence into a graph (it was seen before), launch it and keep it under this key.
    Capture(u64),
    /// Issue the operations one by one.
    Eager,
}

/// Counters of what flushes did, for the bench's report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Flushes replayed from a cached graph.
    pub(crate) replays: u64,
    /// Flushes captured into a new graph (then launched).
    pub(crate) captures: u64,
    /// Captures the driver refused (the sequence was then issued one by one).
    pub(crate) failed: u64,
    /// Flushes issued one by one.
    pub(crate) eager: u64,
    /// Operations run by graph launches, and in all.
    pub(crate) graph_ops: u64,
    pub(crate) ops: u64,
}

/// A cached graph with the exact sequence it was captured from.
struct Cached<E> {
    ops: Vec<Op>,
    args: Vec<u64>,
    exec: E,
    used: u64,
}

/// The graph cache: graphs by sequence hash (each checked against its full sequence before a replay), the hashes
/// seen once, and the counters. Generic over the executable so the policy is testable without a GPU.
pub(crate) struct Graphs<E> {
    cached: HashMap<u64, Cached<E>>,
    seen: HashSet<u64>,
    /// Sequences whose capture the driver refused: never captured again.
    never: HashSet<u64>,
    tick: u64,
    pub(crate) stats: Stats,
    /// The last sequence issued one by one at each part position of a step, and where the next one there first
    /// differed from it (the first [`MISSES_KEPT`]): what keeps a step from replaying.
    last: HashMap<usize, (Vec<Op>, Vec<u64>)>,
    pub(crate) misses: Vec<String>,
    /// Why the driver last refused a capture.
    pub(crate) refusal: Option<String>,
    /// A planted fault (the contract's controls only).
    #[cfg(feature = "planted-faults")]
    pub(crate) fault: Option<GraphFault>,
}

/// Differences kept for the report.
const MISSES_KEPT: usize = 6;
/// Part positions the miss report follows.
const MISSES_PARTS: usize = 64;

/// Where `q` first differs from `(ops, args)`: the op's index and both sides, or the lengths.
fn first_difference(ops: &[Op], args: &[u64], q: &Queue) -> Option<String> {
    let words = |o: &Op, a: &[u64]| match *o {
        Op::Launch { args: (s, n), .. } => a[s as usize..(s + n) as usize].to_vec(),
        _ => Vec::new(),
    };
    let strip = |o: &Op| match *o {
        Op::Launch { func, grid, block, smem, .. } => Op::Launch { func, grid, block, smem, args: (0, 0) },
        o => o,
    };
    let first = ops.iter().zip(&q.ops).enumerate().find_map(|(i, (a, b))| {
        let (wa, wb) = (words(a, args), words(b, &q.args));
        if strip(a) != strip(b) || wa.len() != wb.len() {
            return Some(format!("op {i} of {}: {a:?} then {b:?}", ops.len()));
        }
        let j = wa.iter().zip(&wb).position(|(x, y)| x != y)?;
        Some(format!("op {i} of {} ({b:?}): argument {j} was {:#x}, now {:#x}", ops.len(), wa[j], wb[j]))
    });
    match first {
        None if ops.len() != q.ops.len() => Some(format!("{} ops, then {}", ops.len(), q.ops.len())),
        d => d,
    }
}

impl<E> Default for Graphs<E> {
    fn default() -> Self {
        Graphs {
            cached: HashMap::new(),
            seen: HashSet::new(),
            never: HashSet::new(),
            tick: 0,
            stats: Stats::default(),
            last: HashMap::new(),
            misses: Vec::new(),
            refusal: None,
            #[cfg(feature = "planted-faults")]
            fault: None,
        }
    }
}

impl<E> Graphs<E> {
    /// Decides what to do with `q`, the `slot`-th part flushed since the last sync, and counts it.
    pub(crate) fn plan(&mut self, q: &Queue, slot: usize) -> Plan {
        self.tick += 1;
        self.stats.ops += q.ops.len() as u64;
        if q.ops.len() < MIN_GRAPH_OPS {
            self.stats.eager += 1;
            return Plan::Eager;
        }
        let key = q.key();
        if let Some(c) = self.cached.get_mut(&key)
            && c.ops == q.ops
            && c.args == q.args
        {
            c.used = self.tick;
            self.stats.replays += 1;
            self.stats.graph_ops += q.ops.len() as u64;
            return Plan::Replay(key);
        }
        #[cfg(feature = "planted-faults")]
        if let Some(k) = self.planted_replay(q) {
            self.stats.replays += 1;
            return Plan::Replay(k);
        }
        // A hash collision with a different sequence is issued one by one, never replayed.
        let capturable = !self.cached.contains_key(&key) && !self.never.contains(&key);
        if self.seen.contains(&key) && capturable {
            return Plan::Capture(key);
        }
        if self.seen.len() >= SEEN_MAX {
            self.seen.clear();
        }
        self.seen.insert(key);
        self.stats.eager += 1;
        self.note_miss(q, slot);
        Plan::Eager
    }

    /// The planted [`GraphFault::ReplayByLength`]: any held graph of as many operations as `q`.
    #[cfg(feature = "planted-faults")]
    fn planted_replay(&self, q: &Queue) -> Option<u64> {
        let by_length = self.fault == Some(GraphFault::ReplayByLength);
        by_length.then(|| self.cached.iter().find(|(_, c)| c.ops.len() == q.ops.len()).map(|(&k, _)| k)).flatten()
    }

    /// Keeps where `q` differs from the last sequence issued one by one at its part position (a measuring aid).
    fn note_miss(&mut self, q: &Queue, slot: usize) {
        if self.misses.len() >= MISSES_KEPT {
            return self.last.clear();
        }
        if let Some((ops, args)) = self.last.get(&slot)
            && let Some(d) = first_difference(ops, args, q)
        {
            self.misses.push(format!("part {slot}: {d}"));
        }
        if slot < MISSES_PARTS {
            self.last.insert(slot, (q.ops.clone(), q.args.clone()));
        }
    }

    /// The executable a [`Plan::Replay`] named.
    pub(crate) fn exec(&self, key: u64) -> Option<&E> {
        self.cached.get(&key).map(|c| &c.exec)
    }

    /// Keeps a graph captured from `q` under `key` (evicting the least recently used past [`GRAPHS_MAX`]).
    pub(crate) fn keep(&mut self, key: u64, q: &Queue, exec: E) {
        if self.cached.len() >= GRAPHS_MAX
            && let Some(old) = self.cached.iter().min_by_key(|(_, c)| c.used).map(|(k, _)| *k)
        {
            self.cached.remove(&old);
        }
        self.stats.captures += 1;
        self.stats.graph_ops += q.ops.len() as u64;
        self.cached.insert(key, Cached { ops: q.ops.clone(), args: q.args.clone(), exec, used: self.tick });
    }

    /// A capture the driver refused: the sequence is issued one by one, and never captured again.
    pub(crate) fn refused(&mut self, key: u64, why: &CudaError) {
        self.refusal = Some(why.to_string());
        self.stats.failed += 1;
        self.stats.eager += 1;
        if self.never.len() >= SEEN_MAX {
            self.never.clear();
        }
        self.never.insert(key);
    }

    /// Graphs held.
    pub(crate) fn len(&self) -> usize {
        self.cached.len()
    }

    /// Drops every held graph (the device is closing: before its modules and context go).
    pub(crate) fn clear(&mut self) {
        self.cached.clear();
    }
}

/// A captured, instantiated graph (the driver's handles, destroyed on drop). Only touched under the device's lane
/// mutex, one thread at a time, as the driver requires of graph objects.
pub(crate) struct Exec {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: see the type's doc; the driver's graph handles are valid on any thread of the process.
unsafe impl Send for Exec {}

impl Exec {
    /// Launches the graph on `stream` (the stream it was captured from, context bound).
    pub(crate) fn launch(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        // SAFETY: `exec` is a live instantiated graph of this context.
        unsafe { result::graph::launch(self.exec, stream) }.map_err(|e| driver("cuGraphLaunch", e))
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        // SAFETY: both handles were created by capture() and are destroyed once; a launched graph still running
        // is released by the driver when it completes.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}

/// Why a capture did not give a graph.
pub(crate) enum Refusal {
    /// The stream could not enter capture mode (the error is the device's, to be reported; nothing was captured).
    Begin(CudaError),
    /// The driver refused the sequence as a graph: it is issued one by one instead.
    Capture(CudaError),
}

/// Captures `q` on `stream` (issuing nothing) and instantiates it. Raw driver calls, so no earlier error recorded
/// by cudarc is taken for this one, and once capture began the stream always leaves capture mode here.
///
/// # Safety
/// As [`issue`] for every op of `q`; the stream's context is bound on this thread.
pub(crate) unsafe fn capture(t: Issuer, q: &Queue) -> Result<Exec, Refusal> {
    // SAFETY: per this function's contract.
    unsafe { capture_ops(t, q, |_| true) }
}

/// The planted [`GraphFault::KernelsOnly`]: the staged copies issued now, the capture recording the kernels only.
///
/// # Safety
/// As [`capture`].
#[cfg(feature = "planted-faults")]
pub(crate) unsafe fn capture_kernels_only(t: Issuer, q: &Queue) -> Result<Exec, Refusal> {
    let copy = |op: &Op| matches!(op, Op::Htod { .. });
    for op in q.ops.iter().filter(|op| copy(op)) {
        // SAFETY: per this function's contract.
        unsafe { issue(t, op, &q.args) }.map_err(Refusal::Begin)?;
    }
    // SAFETY: per this function's contract.
    unsafe { capture_ops(t, q, |op| !copy(op)) }
}

/// [`capture`] of the ops of `q` that `recorded` keeps.
///
/// # Safety
/// As [`capture`].
unsafe fn capture_ops(t: Issuer, q: &Queue, recorded: impl Fn(&Op) -> bool) -> Result<Exec, Refusal> {
    let stream = t.stream;
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    // SAFETY: the stream is live.
    unsafe { result::stream::begin_capture(stream, mode) }
        .map_err(|e| Refusal::Begin(driver("cuStreamBeginCapture", e)))?;
    // SAFETY: per this function's contract.
    let recorded = q.ops.iter().filter(|op| recorded(op)).try_for_each(|op| unsafe { issue(t, op, &q.args) });
    // SAFETY: the stream is capturing (begun above).
    let ended = unsafe { result::stream::end_capture(stream) };
    if let Err(e) = recorded {
        if let Ok(g) = ended
            && !g.is_null()
        {
            // SAFETY: the graph just captured, never instantiated; destroyed once.
            let _ = unsafe { result::graph::destroy(g) };
        }
        return Err(Refusal::Capture(e));
    }
    let graph = ended.map_err(|e| Refusal::Capture(driver("cuStreamEndCapture", e)))?;
    if graph.is_null() {
        let e = CudaError::Driver { what: "cuStreamEndCapture".into(), message: "no graph was captured".into() };
        return Err(Refusal::Capture(e));
    }
    // SAFETY: `graph` is the graph just captured.
    match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
        Ok(exec) => Ok(Exec { graph, exec }),
        Err(e) => {
            // SAFETY: not instantiated; destroyed once.
            let _ = unsafe { result::graph::destroy(graph) };
            Err(Refusal::Capture(driver("cuGraphInstantiate", e)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(n: usize, word: u64) -> Queue {
        let mut q = Queue::default();
        for i in 0..n {
            q.launch(0x1000 + i, (1, 1, 1), 256, 0, &[word, i as u64]);
        }
        q.ops.push(Op::Htod { dst: 0x2000, at: 0, bytes: 64 });
        q
    }

    #[test]
    fn a_sequence_is_captured_on_its_second_sighting_and_replayed_after() {
        let mut g = Graphs::<u32>::default();
        let q = queue(MIN_GRAPH_OPS, 7);
        assert_eq!(g.plan(&q, 0), Plan::Eager);
        let Plan::Capture(key) = g.plan(&q, 0) else { panic!("second sighting must capture") };
        g.keep(key, &q, 42);
        assert_eq!(g.plan(&q, 0), Plan::Replay(key));
        assert_eq!(g.exec(key), Some(&42));
        assert_eq!(g.stats, Stats { replays: 1, captures: 1, failed: 0, eager: 1, graph_ops: 2 * 17, ops: 3 * 17 });
    }

    #[test]
    fn any_changed_word_or_copy_is_not_a_replay() {
        let mut g = Graphs::<u32>::default();
        let q = queue(MIN_GRAPH_OPS, 7);
        g.plan(&q, 0);
        let Plan::Capture(key) = g.plan(&q, 0) else { panic!() };
        g.keep(key, &q, 1);
        // One argument word differs.
        assert_eq!(g.plan(&queue(MIN_GRAPH_OPS, 8), 0), Plan::Eager);
        // One copy's size differs (same length).
        let mut other = queue(MIN_GRAPH_OPS, 7);
        if let Some(Op::Htod { bytes, .. }) = other.ops.last_mut() {
            *bytes = 128;
        }
        assert_eq!(g.plan(&other, 0), Plan::Eager);
        // A grid differs.
        let mut grid = queue(MIN_GRAPH_OPS, 7);
        if let Op::Launch { grid: gr, .. } = &mut grid.ops[0] {
            gr.0 = 2;
        }
        assert_eq!(g.plan(&grid, 0), Plan::Eager);
        assert_eq!(g.plan(&q, 0), Plan::Replay(key));
    }

    #[test]
    fn a_miss_names_the_first_word_that_differs() {
        let mut g = Graphs::<u32>::default();
        g.plan(&queue(MIN_GRAPH_OPS, 7), 0);
        g.plan(&queue(MIN_GRAPH_OPS, 8), 0);
        assert_eq!(g.misses.len(), 1);
        assert!(g.misses[0].starts_with("part 0: op 0 of 17 (Launch"), "{}", g.misses[0]);
        assert!(g.misses[0].ends_with("argument 0 was 0x7, now 0x8"), "{}", g.misses[0]);
    }

    #[test]
    fn a_hash_collision_is_never_replayed() {
        let mut g = Graphs::<u32>::default();
        let q = queue(MIN_GRAPH_OPS, 7);
        // A graph kept under q's key but captured from another sequence (what a collision would look like).
        g.keep(q.key(), &queue(MIN_GRAPH_OPS, 9), 5);
        g.seen.insert(q.key());
        assert_eq!(g.plan(&q, 0), Plan::Eager);
    }

    /// `q` planned with a graph kept under its own key but captured from `other` (a hash collision): never a replay.
    fn collides(q: &Queue, other: &Queue) -> Plan {
        let mut g = Graphs::<u32>::default();
        g.keep(q.key(), other, 5);
        g.seen.insert(q.key());
        g.plan(q, 0)
    }

    #[test]
    fn only_the_whole_sequence_compared_makes_a_replay() {
        let q = queue(MIN_GRAPH_OPS, 7);
        assert_eq!(collides(&q, &q), Plan::Replay(q.key()), "the same sequence replays");
        // Ops differ, argument words the same.
        let mut grid = queue(MIN_GRAPH_OPS, 7);
        if let Op::Launch { grid: gr, .. } = &mut grid.ops[3] {
            gr.1 = 9;
        }
        assert_eq!(collides(&q, &grid), Plan::Eager);
        // The same flat words split differently between two launches: f(a, b); g(c) against f(a); g(b, c).
        let (mut split1, mut split2) = (Queue::default(), Queue::default());
        split1.launch(1, (1, 1, 1), 32, 0, &[10, 11]);
        split1.launch(2, (1, 1, 1), 32, 0, &[12]);
        split2.launch(1, (1, 1, 1), 32, 0, &[10]);
        split2.launch(2, (1, 1, 1), 32, 0, &[11, 12]);
        for _ in 0..MIN_GRAPH_OPS {
            split1.ops.push(Op::Memset { dst: 1, value: 0, bytes: 4 });
            split2.ops.push(Op::Memset { dst: 1, value: 0, bytes: 4 });
        }
        assert_eq!(split1.args, split2.args);
        assert_eq!(collides(&split1, &split2), Plan::Eager);
        // One staged copy's arena offset differs.
        let mut at = queue(MIN_GRAPH_OPS, 7);
        if let Some(Op::Htod { at: o, .. }) = at.ops.last_mut() {
            *o = 16;
        }
        assert_eq!(collides(&q, &at), Plan::Eager);
    }

    #[test]
    fn short_queues_are_eager_and_refused_captures_are_not_retried() {
        let mut g = Graphs::<u32>::default();
        let short = queue(MIN_GRAPH_OPS - 2, 7);
        assert_eq!((g.plan(&short, 0), g.plan(&short, 0), g.plan(&short, 0)), (Plan::Eager, Plan::Eager, Plan::Eager));
        let q = queue(MIN_GRAPH_OPS, 7);
        g.plan(&q, 0);
        let Plan::Capture(key) = g.plan(&q, 0) else { panic!() };
        g.refused(key, &CudaError::Unallocated);
        assert_eq!((g.plan(&q, 0), g.plan(&q, 0)), (Plan::Eager, Plan::Eager), "never captured again");
        assert_eq!(g.stats.failed, 1);
    }

    #[test]
    fn the_least_recently_used_graph_goes_first() {
        let mut g = Graphs::<usize>::default();
        let qs: Vec<Queue> = (0..=GRAPHS_MAX as u64).map(|w| queue(MIN_GRAPH_OPS, w)).collect();
        for (i, q) in qs.iter().enumerate().take(GRAPHS_MAX) {
            g.plan(q, 0);
            let Plan::Capture(k) = g.plan(q, 0) else { panic!() };
            g.keep(k, q, i);
        }
        // Touch the first so the second is the oldest.
        assert!(matches!(g.plan(&qs[0], 0), Plan::Replay(_)));
        let last = &qs[GRAPHS_MAX];
        g.plan(last, 0);
        let Plan::Capture(k) = g.plan(last, 0) else { panic!() };
        g.keep(k, last, GRAPHS_MAX);
        assert_eq!(g.len(), GRAPHS_MAX);
        assert!(matches!(g.plan(&qs[0], 0), Plan::Replay(_)));
        assert!(matches!(g.plan(&qs[1], 0), Plan::Capture(_)), "evicted, so captured again");
    }
}
