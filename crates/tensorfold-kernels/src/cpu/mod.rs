//! The CPU backend: host buffers, zero-copy weight views, and the row kernels of `ops`, `attention`,
//! `conv` and `moe`, with threads (rayon) and run-time SIMD detection.

pub mod attention;
pub mod conv;
mod keepers;
pub mod line_alloc;
pub mod moe;
pub mod ops;

pub use attention::CpuKv;
pub use conv::CpuConv;
pub use line_alloc::LineAligned;

use crate::backend::{Ffn, KernelError, MoeParams, Pick, RopeParams, Segment, drawn_words};
use crate::bytes::MatView;
use crate::prelude::*;
use crate::sample::{DrawSpec, SampleError, draw};
use rayon::prelude::*;

/// The CPU backend. Weights stay in the checkpoint's mapped pages (bf16 or f32); activations are f32.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl Memory for CpuBackend {
    type Buf = Vec<f32>;
    type Mat = MatView;
    type Kv = CpuKv;
    type Conv = CpuConv;

    fn upload_mat(&self, m: &MatView) -> Result<MatView, KernelError> {
        Ok(m.clone())
    }

    fn mat_bytes(&self, m: &MatView) -> usize {
        m.bytes.len() + m.affine.as_ref().map_or(0, |a| a.scales.len() + a.biases.len())
    }

    fn upload(&self, data: &[f32]) -> Vec<f32> {
        data.to_vec()
    }

    fn zeros(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    fn read(&self, b: &Vec<f32>) -> Vec<f32> {
        b.clone()
    }

    fn mat_rows(&self, m: &MatView) -> usize {
        m.rows
    }
}

impl StreamState for CpuBackend {
    fn new_kv(&self, width: usize) -> CpuKv {
        CpuKv { width, k: Vec::new(), v: Vec::new() }
    }

    fn kv_len(&self, kv: &CpuKv) -> usize {
        kv.len()
    }

    fn kv_truncate(&self, kv: &mut CpuKv, len: usize) {
        kv.k.truncate(len * kv.width);
        kv.v.truncate(len * kv.width);
    }

    fn kv_reserve(&self, kv: &mut CpuKv, tokens: usize) -> Result<(), KernelError> {
        let want = tokens.saturating_mul(kv.width);
        let r = reserve_to(&mut kv.k, want).and_then(|()| reserve_to(&mut kv.v, want));
        r.map_err(|_| out_of_memory("kv_reserve", want, 2))
    }

    fn kv_bytes(&self, kv: &CpuKv) -> usize {
        (kv.k.capacity() + kv.v.capacity()) * 4
    }

    fn new_conv(&self, channels: usize, taps: usize) -> CpuConv {
        CpuConv::new(channels, taps)
    }

    fn conv_keep(&self, c: &mut CpuConv, rows: usize) -> Result<(), KernelError> {
        c.keep(rows)
    }

    fn conv_bytes(&self, c: &CpuConv) -> usize {
        (c.state.capacity() + c.window.capacity()) * 4
    }

    fn conv_drop_window(&self, c: &mut CpuConv) {
        c.window = Vec::new();
    }

    fn conv_reserve(&self, c: &mut CpuConv, rows: usize) -> Result<(), KernelError> {
        c.keep_rows = rows.clamp(1, conv::KEEP_ROWS);
        let want = c.taps.saturating_sub(1).saturating_add(c.keep_rows).saturating_mul(c.width);
        reserve_to(&mut c.window, want).map_err(|_| out_of_memory("conv_reserve", want, 1))
    }
}

impl Ops for CpuBackend {
    fn on_workers<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        if rayon::current_num_threads() <= 1 || rayon::current_thread_index().is_some() {
            return f();
        }
        // The body of a scope runs on a worker of the pool; the kernels' `par_iter`s inside it are then forks
        // that the other workers steal (or this one runs itself), with no thread outside the pool to wake, and
        // keepers hold the other workers awake until it returns.
        keepers::kept_scope(f)
    }

    fn embed(&self, table: &MatView, ids: &[u32], out: &mut Vec<f32>) -> Result<(), KernelError> {
        ops::embed(table, ids, out)
    }

    fn rmsnorm(&self, x: &Vec<f32>, weight: &Vec<f32>, eps: f32, width: usize, out: &mut Vec<f32>) {
        ops::rmsnorm(x, weight, eps, width, out)
    }

    fn linear(&self, x: &Vec<f32>, rows: usize, w: &MatView, bias: Option<&Vec<f32>>, out: &mut Vec<f32>) {
        ops::linear(x, rows, w, bias.map(|b| b.as_slice()), out)
    }

    fn gather_rows(&self, x: &Vec<f32>, width: usize, rows: &[usize]) -> Vec<f32> {
        rows.iter().flat_map(|&r| x[r * width..(r + 1) * width].iter().copied()).collect()
    }

    fn add(&self, acc: &mut Vec<f32>, y: &Vec<f32>) {
        acc.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    }

    fn qk_norm_rope(
        &self,
        x: &mut Vec<f32>,
        heads: usize,
        norm: &Vec<f32>,
        eps: f32,
        rope: RopeParams,
        segs: &[Segment],
    ) -> Result<(), KernelError> {
        let width = heads * rope.head_dim;
        let pos = crate::shape::row_positions(segs, x.len() / width.max(1))?;
        x.par_chunks_mut(width).zip(pos).for_each(|(row, p)| ops::qk_norm_rope_row(row, norm, eps, rope, p));
        Ok(())
    }

    fn attention(
        &self,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        heads: usize,
        kv_heads: usize,
        segs: &[Segment],
        caches: &mut [&mut CpuKv],
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        attention::attention(q, k, v, heads, kv_heads, segs, caches, out)
    }

    fn kv_append(
        &self,
        k: &Vec<f32>,
        v: &Vec<f32>,
        segs: &[Segment],
        caches: &mut [&mut CpuKv],
    ) -> Result<(), KernelError> {
        attention::kv_append(k, v, segs, caches)
    }

    fn block_attention(
        &self,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        heads: usize,
        kv_heads: usize,
        segs: &[Segment],
        caches: &[&CpuKv],
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        attention::block_attention(q, k, v, heads, kv_heads, segs, caches, out)
    }

    fn short_conv(
        &self,
        bcx: &Vec<f32>,
        width: usize,
        weight: &Vec<f32>,
        bias: Option<&Vec<f32>>,
        segs: &[Segment],
        states: &mut [&mut CpuConv],
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        conv::short_conv(bcx, width, weight, bias.map(|b| b.as_slice()), segs, states, out)
    }

    fn swiglu(&self, x: &Vec<f32>, rows: usize, ffn: &Ffn<MatView>, out: &mut Vec<f32>) {
        moe::swiglu(x, rows, ffn, out)
    }

    fn moe_route(
        &self,
        x: &Vec<f32>,
        rows: usize,
        gate: &MatView,
        expert_bias: Option<&Vec<f32>>,
        p: MoeParams,
        sel: &mut Vec<f32>,
        wts: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        let k = p.top_k.min(gate.rows);
        shape("moe_route", "x", x.len(), rows * gate.cols)?;
        shape("moe_route", "sel", sel.len(), rows * k)?;
        shape("moe_route", "wts", wts.len(), rows * k)?;
        if let Some(b) = expert_bias {
            shape("moe_route", "expert_bias", b.len(), gate.rows)?;
        }
        moe::route(x, rows, gate, expert_bias.map(|b| b.as_slice()), p, sel, wts);
        Ok(())
    }

    fn moe_experts(
        &self,
        x: &Vec<f32>,
        rows: usize,
        sel: &Vec<f32>,
        k: usize,
        owned: &[Ffn<MatView>],
        first: usize,
        total: usize,
        y: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        let h = x.len().checked_div(rows).unwrap_or(0);
        let big = |what| KernelError::Shape { kernel: "moe_experts", what, got: usize::MAX, want: 0 };
        let assignments = rows.checked_mul(k).ok_or(big("assignments"))?;
        shape("moe_experts", "x", x.len(), rows * h)?;
        shape("moe_experts", "sel", sel.len(), assignments)?;
        shape("moe_experts", "y", y.len(), assignments.checked_mul(h).ok_or(big("y"))?)?;
        if first.checked_add(owned.len()).is_none_or(|end| end > total) {
            return Err(KernelError::Shape {
                kernel: "moe_experts",
                what: "owned experts' end",
                got: first,
                want: total,
            });
        }
        for f in owned {
            let inter = f.w1.rows;
            shape("moe_experts", "expert w1 columns", f.w1.cols, h)?;
            shape("moe_experts", "expert w3 columns", f.w3.cols, h)?;
            shape("moe_experts", "expert w3 rows", f.w3.rows, inter)?;
            shape("moe_experts", "expert w2 rows", f.w2.rows, h)?;
            shape("moe_experts", "expert w2 columns", f.w2.cols, inter)?;
        }
        moe::experts(x, rows, sel, k, owned, first, y);
        Ok(())
    }

    fn moe_combine(
        &self,
        y: &Vec<f32>,
        wts: &Vec<f32>,
        rows: usize,
        k: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        let h = out.len().checked_div(rows).unwrap_or(0);
        shape("moe_combine", "wts", wts.len(), rows * k)?;
        shape("moe_combine", "y", y.len(), rows * k * h)?;
        moe::combine(y, wts, rows, k, out);
        Ok(())
    }
}

impl Sampling for CpuBackend {
    fn greedy(&self, logits: &Vec<f32>, vocab: usize) -> Vec<Pick> {
        logits.par_chunks(vocab).map(ops::greedy_row).collect()
    }

    /// [`Sampling::draw_into`]'s words from the host reference, rows across threads.
    fn draw_into(&self, logits: &Vec<f32>, vocab: usize, specs: &[DrawSpec], out: &mut Vec<f32>) {
        let row = |r: usize| logits.get(r * vocab..(r + 1) * vocab).unwrap_or(&[]);
        let words: Vec<[u32; 3]> = specs.par_iter().enumerate().map(|(r, s)| drawn_words(row(r), s)).collect();
        *out = words.into_iter().flatten().map(f32::from_bits).collect();
    }

    /// The host reference itself, rows across threads, without copying the logits.
    fn draw_rows(&self, logits: &Vec<f32>, vocab: usize, specs: &[DrawSpec]) -> Vec<Result<u32, SampleError>> {
        let row = |r: usize| logits.get(r * vocab..(r + 1) * vocab).unwrap_or(&[]);
        specs.par_iter().enumerate().map(|(r, s)| draw(&s.params, s.position, row(r))).collect()
    }
}

impl Diagnostics for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }
}

/// Worker threads the CPU kernels use (rayon's global pool: `--threads` / `TENSORFOLD_THREADS`, else `RAYON_NUM_THREADS`).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// Room for `want` values in all in `v`, exactly (as memory admission counts them). Errors: the allocator's refusal
/// (or a size past `isize::MAX` bytes), returned rather than aborting; `v` is unchanged then.
fn reserve_to(v: &mut Vec<f32>, want: usize) -> Result<(), std::collections::TryReserveError> {
    v.try_reserve_exact(want.saturating_sub(v.len()))
}

/// [`KernelError::OutOfMemory`] of a reserve that asked for `buffers` buffers of `values` f32 each.
fn out_of_memory(what: &'static str, values: usize, buffers: usize) -> KernelError {
    KernelError::OutOfMemory { what, bytes: values.saturating_mul(4).saturating_mul(buffers) }
}

/// A named shape error when `got != want`.
fn shape(kernel: &'static str, what: &'static str, got: usize, want: usize) -> Result<(), KernelError> {
    if got == want { Ok(()) } else { Err(KernelError::Shape { kernel, what, got, want }) }
}

#[cfg(test)]
mod tests {
    use super::{CpuBackend, CpuConv, KernelError};
    use crate::bytes::MatView;
    use crate::prelude::*;

    /// A reserve past anything the host can allocate is refused by name, never a panic or an abort, and leaves the
    /// state as it was; a sane one still gives exactly the room asked for.
    #[test]
    fn an_absurd_reserve_is_out_of_memory_not_a_panic() {
        let b = CpuBackend;
        let mut kv = b.new_kv(8);
        b.kv_reserve(&mut kv, 4).expect("room for 4 rows");
        assert_eq!(b.kv_bytes(&kv), 2 * 4 * 8 * 4);
        let oom = |what, bytes| Err(KernelError::OutOfMemory { what, bytes });
        assert_eq!(b.kv_reserve(&mut kv, usize::MAX / 2), oom("kv_reserve", usize::MAX));
        // Past a Vec's limit above (capacity overflow); here 2^60 values within it, whose 2^62 bytes are past any
        // address space (the allocator's refusal).
        assert_eq!(b.kv_reserve(&mut kv, 1 << 57), oom("kv_reserve", 1 << 63));
        assert_eq!(b.kv_bytes(&kv), 2 * 4 * 8 * 4, "the room already held is kept");
        let width = usize::MAX / 4;
        let mut c = CpuConv { width, taps: 3, state: Vec::new(), window: Vec::new(), keep_rows: 64 };
        assert_eq!(b.conv_reserve(&mut c, 2), oom("conv_reserve", usize::MAX));
        assert_eq!(b.conv_bytes(&c), 0);
        let e = KernelError::OutOfMemory { what: "kv_reserve", bytes: 1 << 40 };
        assert_eq!(e.to_string(), "OutOfMemory: kv_reserve could not allocate 1099511627776 bytes");
    }

    /// A forward handed to `on_workers` runs on a worker of the pool (where there is more than one thread), returns
    /// its value, and runs in place when already on a worker, so a nested call cannot wait on itself.
    #[test]
    fn on_workers_runs_on_a_pool_worker() {
        let _alone = super::keepers::TESTS_ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let outer = rayon::current_thread_index();
        let (inside, nested) = CpuBackend
            .on_workers(|| (rayon::current_thread_index(), CpuBackend.on_workers(rayon::current_thread_index)));
        assert_eq!(outer, None, "the test thread is not a pool worker");
        assert_eq!(inside.is_some(), rayon::current_num_threads() > 1, "on a worker iff the pool has several");
        assert_eq!(nested, inside, "a nested call runs on the same thread");
    }

    /// A linear large enough to split across threads gives the same bits inside `on_workers` (forks within the pool)
    /// as outside it (a hand-off from this thread) and as on one thread alone.
    #[test]
    fn linear_bits_do_not_depend_on_where_it_runs() {
        let _alone = super::keepers::TESTS_ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (n, k, rows) = (1024, 256, 3);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect();
        let w = MatView::from_f32(n, k, &w);
        let x: Vec<f32> = (0..rows * k).map(|i| ((i * 104_729 % 997) as f32 - 498.0) * 1e-2).collect();
        let run = || {
            let mut out = vec![0f32; rows * n];
            CpuBackend.linear(&x, rows, &w, None, &mut out);
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let outside = run();
        let inside = CpuBackend.on_workers(run);
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a pool of one").install(run);
        assert_eq!(inside, outside, "inside the pool");
        assert_eq!(one, outside, "on one thread");
    }
}
