//! A planted stall for one device (feature `planted-faults` only): a backend that runs another's kernels and, once
//! armed, blocks its next device sync (a read of results to the host) for a while, as a GPU that stops answering
//! without an error does. The single-device twin of `deadline::StallingCollective`. It can also record a planted
//! failure, as a CUDA call that cannot return one leaves it for the next `Diagnostics::check`.

use crate::backend::{
    Diagnostics, Ffn, KernelError, Memory, MoeParams, Ops, Pick, RopeParams, Sampling, Segment, StreamState,
};
use crate::bytes::MatView;
use crate::sample::{DrawSpec, SampleError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// `inner`'s kernels; once `armed` is set, the next host read (`read`, `greedy`, `draw_rows`: where a GPU's host
/// waits for its queue) sleeps `stall` first, once. Everything else is `inner`'s, unchanged.
#[derive(Clone)]
pub struct StallingBackend<B> {
    inner: B,
    armed: Arc<AtomicBool>,
    stall: Duration,
    planted: Arc<Mutex<Recorded>>,
}

/// A planted failure: recorded now, or at the next host read; `check` and `flush_check` take the recorded one.
#[derive(Default)]
struct Recorded {
    at_read: Option<KernelError>,
    now: Option<KernelError>,
}

impl<B> StallingBackend<B> {
    /// `inner` whose next sync after `armed` is set stalls for `stall`.
    pub fn new(inner: B, armed: Arc<AtomicBool>, stall: Duration) -> Self {
        Self { inner, armed, stall, planted: Arc::default() }
    }

    /// Records `e` as an infallible call's failure: the next `check` or `flush_check` returns it.
    pub fn record(&self, e: KernelError) {
        self.recorded().now = Some(e);
    }

    /// Records `e` at the next host read (`read`, `greedy`, `draw_rows`): a failure met inside a forward's head.
    pub fn record_at_read(&self, e: KernelError) {
        self.recorded().at_read = Some(e);
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.planted.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take_recorded(&self) -> Result<(), KernelError> {
        self.recorded().now.take().map_or(Ok(()), Err)
    }

    fn maybe_stall(&self) {
        let mut r = self.recorded();
        if let Some(e) = r.at_read.take() {
            r.now.get_or_insert(e);
        }
        drop(r);
        if self.armed.swap(false, Ordering::AcqRel) {
            std::thread::sleep(self.stall);
        }
    }
}

impl<B: Memory> Memory for StallingBackend<B> {
    type Buf = B::Buf;
    type Mat = B::Mat;
    type Kv = B::Kv;
    type Conv = B::Conv;

    fn upload_mat(&self, m: &MatView) -> Result<B::Mat, KernelError> {
        self.inner.upload_mat(m)
    }
    fn mat_bytes(&self, m: &B::Mat) -> usize {
        self.inner.mat_bytes(m)
    }
    fn upload(&self, data: &[f32]) -> B::Buf {
        self.inner.upload(data)
    }
    fn zeros(&self, len: usize) -> B::Buf {
        self.inner.zeros(len)
    }
    fn scratch(&self, len: usize) -> B::Buf {
        self.inner.scratch(len)
    }
    fn read(&self, b: &B::Buf) -> Vec<f32> {
        self.maybe_stall();
        self.inner.read(b)
    }
    fn mat_rows(&self, m: &B::Mat) -> usize {
        self.inner.mat_rows(m)
    }
    fn concat(&self, parts: &[&B::Buf]) -> B::Buf {
        self.inner.concat(parts)
    }
}

impl<B: StreamState> StreamState for StallingBackend<B> {
    fn new_kv(&self, width: usize) -> B::Kv {
        self.inner.new_kv(width)
    }
    fn kv_len(&self, kv: &B::Kv) -> usize {
        self.inner.kv_len(kv)
    }
    fn kv_reserve(&self, kv: &mut B::Kv, tokens: usize) -> Result<(), KernelError> {
        self.inner.kv_reserve(kv, tokens)
    }
    fn kv_truncate(&self, kv: &mut B::Kv, len: usize) {
        self.inner.kv_truncate(kv, len)
    }
    fn kv_bytes(&self, kv: &B::Kv) -> usize {
        self.inner.kv_bytes(kv)
    }
    fn new_conv(&self, channels: usize, taps: usize) -> B::Conv {
        self.inner.new_conv(channels, taps)
    }
    fn conv_keep(&self, c: &mut B::Conv, rows: usize) -> Result<(), KernelError> {
        self.inner.conv_keep(c, rows)
    }
    fn conv_bytes(&self, c: &B::Conv) -> usize {
        self.inner.conv_bytes(c)
    }
    fn conv_drop_window(&self, c: &mut B::Conv) {
        self.inner.conv_drop_window(c)
    }
    fn conv_reserve(&self, c: &mut B::Conv, rows: usize) -> Result<(), KernelError> {
        self.inner.conv_reserve(c, rows)
    }
}

type Buf<B> = <B as Memory>::Buf;

impl<B: Ops> Ops for StallingBackend<B> {
    fn embed(&self, table: &B::Mat, ids: &[u32], out: &mut Buf<B>) -> Result<(), KernelError> {
        self.inner.embed(table, ids, out)
    }
    fn rmsnorm(&self, x: &Buf<B>, weight: &Buf<B>, eps: f32, width: usize, out: &mut Buf<B>) {
        self.inner.rmsnorm(x, weight, eps, width, out)
    }
    fn linear(&self, x: &Buf<B>, rows: usize, w: &B::Mat, bias: Option<&Buf<B>>, out: &mut Buf<B>) {
        self.inner.linear(x, rows, w, bias, out)
    }
    fn linears(&self, x: &Buf<B>, rows: usize, mats: &[&B::Mat], outs: &mut [&mut Buf<B>]) {
        self.inner.linears(x, rows, mats, outs)
    }
    fn gather_rows(&self, x: &Buf<B>, width: usize, rows: &[usize]) -> Buf<B> {
        self.inner.gather_rows(x, width, rows)
    }
    fn add(&self, acc: &mut Buf<B>, y: &Buf<B>) {
        self.inner.add(acc, y)
    }
    fn add_rmsnorm(&self, acc: &mut Buf<B>, y: &Buf<B>, weight: &Buf<B>, eps: f32, width: usize, out: &mut Buf<B>) {
        self.inner.add_rmsnorm(acc, y, weight, eps, width, out)
    }
    fn qk_norm_rope(
        &self,
        x: &mut Buf<B>,
        heads: usize,
        norm: &Buf<B>,
        eps: f32,
        rope: RopeParams,
        segs: &[Segment],
    ) -> Result<(), KernelError> {
        self.inner.qk_norm_rope(x, heads, norm, eps, rope, segs)
    }
    fn qk_norm_rope_pair(
        &self,
        q: (&mut Buf<B>, usize, &Buf<B>),
        k: (&mut Buf<B>, usize, &Buf<B>),
        eps: f32,
        rope: RopeParams,
        segs: &[Segment],
    ) -> Result<(), KernelError> {
        self.inner.qk_norm_rope_pair(q, k, eps, rope, segs)
    }
    // The trait's own signatures, delegated as they are.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Buf<B>,
        k: &Buf<B>,
        v: &Buf<B>,
        heads: usize,
        kv_heads: usize,
        segs: &[Segment],
        caches: &mut [&mut B::Kv],
        out: &mut Buf<B>,
    ) -> Result<(), KernelError> {
        self.inner.attention(q, k, v, heads, kv_heads, segs, caches, out)
    }
    fn kv_append(
        &self,
        k: &Buf<B>,
        v: &Buf<B>,
        segs: &[Segment],
        caches: &mut [&mut B::Kv],
    ) -> Result<(), KernelError> {
        self.inner.kv_append(k, v, segs, caches)
    }
    #[allow(clippy::too_many_arguments)]
    fn block_attention(
        &self,
        q: &Buf<B>,
        k: &Buf<B>,
        v: &Buf<B>,
        heads: usize,
        kv_heads: usize,
        segs: &[Segment],
        caches: &[&B::Kv],
        out: &mut Buf<B>,
    ) -> Result<(), KernelError> {
        self.inner.block_attention(q, k, v, heads, kv_heads, segs, caches, out)
    }
    #[allow(clippy::too_many_arguments)]
    fn short_conv(
        &self,
        bcx: &Buf<B>,
        width: usize,
        weight: &Buf<B>,
        bias: Option<&Buf<B>>,
        segs: &[Segment],
        states: &mut [&mut B::Conv],
        out: &mut Buf<B>,
    ) -> Result<(), KernelError> {
        self.inner.short_conv(bcx, width, weight, bias, segs, states, out)
    }
    fn swiglu(&self, x: &Buf<B>, rows: usize, ffn: &Ffn<B::Mat>, out: &mut Buf<B>) {
        self.inner.swiglu(x, rows, ffn, out)
    }
    #[allow(clippy::too_many_arguments)]
    fn moe_route(
        &self,
        x: &Buf<B>,
        rows: usize,
        gate: &B::Mat,
        expert_bias: Option<&Buf<B>>,
        p: MoeParams,
        sel: &mut Buf<B>,
        wts: &mut Buf<B>,
    ) -> Result<(), KernelError> {
        self.inner.moe_route(x, rows, gate, expert_bias, p, sel, wts)
    }
    #[allow(clippy::too_many_arguments)]
    fn moe_experts(
        &self,
        x: &Buf<B>,
        rows: usize,
        sel: &Buf<B>,
        k: usize,
        owned: &[Ffn<B::Mat>],
        first: usize,
        total: usize,
        y: &mut Buf<B>,
    ) -> Result<(), KernelError> {
        self.inner.moe_experts(x, rows, sel, k, owned, first, total, y)
    }
    #[allow(clippy::too_many_arguments)]
    fn moe_route_experts(
        &self,
        x: &Buf<B>,
        rows: usize,
        gate: &B::Mat,
        expert_bias: Option<&Buf<B>>,
        experts: &[Ffn<B::Mat>],
        p: MoeParams,
        routed: (&mut Buf<B>, &mut Buf<B>),
        y: &mut Buf<B>,
    ) -> Result<(), KernelError> {
        self.inner.moe_route_experts(x, rows, gate, expert_bias, experts, p, routed, y)
    }
    fn moe_combine(
        &self,
        y: &Buf<B>,
        wts: &Buf<B>,
        rows: usize,
        k: usize,
        out: &mut Buf<B>,
    ) -> Result<(), KernelError> {
        self.inner.moe_combine(y, wts, rows, k, out)
    }
    #[allow(clippy::too_many_arguments)]
    fn moe_combine_add_rmsnorm(
        &self,
        yw: (&Buf<B>, &Buf<B>),
        rows: usize,
        k: usize,
        acc: &mut Buf<B>,
        norm: Option<(&Buf<B>, f32)>,
        width: usize,
        out: &mut Buf<B>,
    ) -> Result<(), KernelError> {
        self.inner.moe_combine_add_rmsnorm(yw, rows, k, acc, norm, width, out)
    }
}

impl<B: Sampling> Sampling for StallingBackend<B> {
    fn greedy(&self, logits: &Buf<B>, vocab: usize) -> Vec<Pick> {
        self.maybe_stall();
        self.inner.greedy(logits, vocab)
    }
    fn draw_rows(&self, logits: &Buf<B>, vocab: usize, specs: &[DrawSpec]) -> Vec<Result<u32, SampleError>> {
        self.maybe_stall();
        self.inner.draw_rows(logits, vocab, specs)
    }
    fn draw_into(&self, logits: &Buf<B>, vocab: usize, specs: &[DrawSpec], out: &mut Buf<B>) {
        self.inner.draw_into(logits, vocab, specs, out)
    }
    fn embed_words(&self, table: &B::Mat, words: &Buf<B>, rows: usize, out: &mut Buf<B>) -> Result<(), KernelError> {
        self.inner.embed_words(table, words, rows, out)
    }
    fn embed_held(
        &self,
        table: &B::Mat,
        ids: &[u32],
        held: &Buf<B>,
        from: &[(usize, usize)],
        out: &mut Buf<B>,
    ) -> Result<(), KernelError> {
        self.inner.embed_held(table, ids, held, from, out)
    }
}

impl<B: Diagnostics> Diagnostics for StallingBackend<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn copy_bandwidth(&self) -> f64 {
        self.inner.copy_bandwidth()
    }
    fn check(&self) -> Result<(), KernelError> {
        self.take_recorded()?;
        self.inner.check()
    }
    fn flush_check(&self) -> Result<(), KernelError> {
        self.take_recorded()?;
        self.inner.flush_check()
    }
    fn memory_high(&self) -> Option<(usize, usize)> {
        self.inner.memory_high()
    }
    fn check_attention(&self, heads: usize, kv_heads: usize, head_dim: usize) -> Result<(), KernelError> {
        self.inner.check_attention(heads, kv_heads, head_dim)
    }
    fn memory_free(&self) -> Option<usize> {
        self.inner.memory_free()
    }
    fn take_profile(&self) -> Option<String> {
        self.inner.take_profile()
    }
    fn graph_report(&self) -> Option<String> {
        self.inner.graph_report()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend;
    use std::time::Instant;

    #[test]
    fn an_armed_backend_stalls_its_next_read_once_and_computes_as_its_inner_one() {
        let armed = Arc::new(AtomicBool::new(false));
        let b = StallingBackend::new(CpuBackend, armed.clone(), Duration::from_millis(50));
        let x = b.upload(&[1.0, 2.0]);
        let t = Instant::now();
        assert_eq!(b.read(&x), vec![1.0, 2.0]);
        assert!(t.elapsed() < Duration::from_millis(50), "not armed: no stall");
        armed.store(true, Ordering::Release);
        let t = Instant::now();
        assert_eq!(b.greedy(&x, 2)[0].token, CpuBackend.greedy(&x, 2)[0].token);
        assert!(t.elapsed() >= Duration::from_millis(50), "armed: the sync stalls");
        assert!(!armed.load(Ordering::Acquire), "once");
    }
}
