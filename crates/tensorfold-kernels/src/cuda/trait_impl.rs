//! `Backend` for `CudaBackend`: each method delegates to its launcher. Methods the trait lets fail report device
//! failures as `KernelError::Device` (`DeviceLost`, `DeviceOutOfMemory` by kind); the infallible ones record a
//! failure (reported by the next fallible call) and fill their output with NaN, so a failed forward's logits are
//! flagged non-finite and refused, never used.

use super::types::{CudaBuf, CudaConv, CudaKv, CudaMat, f32_bytes};
use super::{CudaBackend, CudaError, attention, conv, draw, moe, ops};
use crate::backend::{Ffn, KernelError, MoeParams, Pick, RopeParams, Segment};
use crate::bytes::MatView;
use crate::prelude::*;
use crate::sample::{DrawSpec, SampleError};

impl CudaBackend {
    /// Records `r`'s failure and poisons `out` with NaN (0xff bytes), best effort.
    fn settle(&self, what: &str, r: Result<(), CudaError>, out: &CudaBuf) {
        if r.is_err() {
            if let Ok(p) = out.ptr() {
                let _ = f32_bytes(out.len()).and_then(|b| self.dev.memset(p, 0xff, b));
            }
            self.dev.note(what, r);
        }
    }

    /// A stream-state reserve's result (`bytes` asked for), returned now rather than recorded for the next call, which
    /// may be another stream's: out of memory (or a size past any) is [`KernelError::OutOfMemory`], another failure
    /// that leaves the device usable [`KernelError::Device`]. A lost device is recorded as well, as any call's.
    fn reserved(&self, what: &'static str, bytes: usize, r: Result<(), CudaError>) -> Result<(), KernelError> {
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.is_lost() => {
                self.dev.note(what, Err(e.clone()));
                Err(e.kernel(what))
            }
            Err(CudaError::OutOfMemory { .. } | CudaError::Shape(_)) => Err(KernelError::OutOfMemory { what, bytes }),
            Err(e) => Err(e.kernel(what)),
        }
    }

    /// A buffer of `len` NaN-poisoned values or, when even that fails, one without memory.
    fn lost(&self, len: usize) -> CudaBuf {
        let b = self.buf(len).unwrap_or(CudaBuf { mem: None, len });
        self.settle("allocating a buffer", Err(CudaError::Unallocated), &b);
        b
    }
}

impl Memory for CudaBackend {
    type Buf = CudaBuf;
    type Mat = CudaMat;
    type Kv = CudaKv;
    type Conv = CudaConv;

    fn upload_mat(&self, m: &MatView) -> Result<CudaMat, KernelError> {
        ops::upload_mat(self, m).map_err(|e| e.kernel("upload_mat"))
    }

    fn mat_bytes(&self, m: &CudaMat) -> usize {
        m.bytes()
    }

    fn upload(&self, data: &[f32]) -> CudaBuf {
        match self.dev.upload(data) {
            Ok(mem) => CudaBuf { mem, len: data.len() },
            Err(e) => {
                self.dev.note("upload", Err(e));
                CudaBuf { mem: None, len: data.len() }
            }
        }
    }

    fn zeros(&self, len: usize) -> CudaBuf {
        let b = self.buf(len).and_then(|b| {
            self.dev.memset(b.ptr()?, 0, f32_bytes(len)?)?;
            Ok(b)
        });
        match b {
            Ok(b) => b,
            Err(e) => {
                self.dev.note("zeros", Err(e));
                CudaBuf { mem: None, len }
            }
        }
    }

    fn scratch(&self, len: usize) -> CudaBuf {
        match self.buf(len) {
            Ok(b) => b,
            Err(e) => {
                self.dev.note("scratch", Err(e));
                CudaBuf { mem: None, len }
            }
        }
    }

    fn read(&self, b: &CudaBuf) -> Vec<f32> {
        let mut host = vec![f32::NAN; b.len()];
        if self.dev.pending() {
            return host;
        }
        let r = b.ptr().and_then(|p| self.dev.dtoh(&mut host, p));
        if r.is_err() {
            host.fill(f32::NAN);
            self.dev.note("read", r);
        }
        host
    }

    fn mat_rows(&self, m: &CudaMat) -> usize {
        m.rows
    }

    fn concat(&self, parts: &[&CudaBuf]) -> CudaBuf {
        let len = parts.iter().map(|p| p.len()).sum();
        let r = self.buf(len).and_then(|out| {
            let mut at = out.ptr()?;
            for p in parts.iter().filter(|p| !p.is_empty()) {
                let bytes = f32_bytes(p.len())?;
                self.dev.dtod(at, p.ptr()?, bytes)?;
                at += bytes as u64;
            }
            Ok(out)
        });
        match r {
            Ok(b) => b,
            Err(e) => {
                self.dev.note("concat", Err(e));
                CudaBuf { mem: None, len }
            }
        }
    }
}

impl StreamState for CudaBackend {
    fn new_kv(&self, width: usize) -> CudaKv {
        CudaKv::new(self.dev.clone(), width)
    }

    fn kv_len(&self, kv: &CudaKv) -> usize {
        kv.len
    }

    fn kv_reserve(&self, kv: &mut CudaKv, tokens: usize) -> Result<(), KernelError> {
        let bytes = [2, tokens, kv.width, 4].into_iter().fold(1, usize::saturating_mul);
        self.reserved("kv_reserve", bytes, kv.grow(tokens))
    }

    fn kv_truncate(&self, kv: &mut CudaKv, len: usize) {
        kv.len = kv.len.min(len);
    }

    fn kv_bytes(&self, kv: &CudaKv) -> usize {
        kv.k.as_ref().map_or(0, |m| m.bytes) + kv.v.as_ref().map_or(0, |m| m.bytes)
    }

    fn new_conv(&self, channels: usize, taps: usize) -> CudaConv {
        CudaConv::new(self.dev.clone(), channels, taps)
    }

    fn conv_keep(&self, c: &mut CudaConv, rows: usize) -> Result<(), KernelError> {
        self.dev.take("conv_keep")?;
        conv::conv_keep(c, rows)
    }

    fn conv_bytes(&self, c: &CudaConv) -> usize {
        c.bytes()
    }

    fn conv_drop_window(&self, c: &mut CudaConv) {
        (c.window, c.window_rows) = (None, None);
    }

    fn conv_reserve(&self, c: &mut CudaConv, rows: usize) -> Result<(), KernelError> {
        // On failure the window is allocated again when a call needs it.
        let r = c.reserve(rows);
        let bytes = c.hist().saturating_add(c.keep_rows).saturating_mul(c.width).saturating_mul(4);
        self.reserved("conv_reserve", bytes, r)
    }
}

impl Ops for CudaBackend {
    fn embed(&self, table: &CudaMat, ids: &[u32], out: &mut CudaBuf) -> Result<(), KernelError> {
        self.dev.take("embed")?;
        ops::embed(self, table, ids, out)
    }

    fn rmsnorm(&self, x: &CudaBuf, weight: &CudaBuf, eps: f32, width: usize, out: &mut CudaBuf) {
        let r = ops::rmsnorm(self, x, weight, eps, width, out);
        self.settle("rmsnorm", r, out);
    }

    fn linear(&self, x: &CudaBuf, rows: usize, w: &CudaMat, bias: Option<&CudaBuf>, out: &mut CudaBuf) {
        let r = ops::linear(self, x, rows, w, bias, out);
        self.settle("linear", r, out);
    }

    fn linears(&self, x: &CudaBuf, rows: usize, mats: &[&CudaMat], outs: &mut [&mut CudaBuf]) {
        let one_kind =
            mats.iter().all(|m| m.cols == mats[0].cols && m.dtype == mats[0].dtype && m.group == mats[0].group);
        if !self.dev.fused || mats.is_empty() || mats.len() > 3 || mats.len() != outs.len() || !one_kind {
            for (m, o) in mats.iter().zip(outs.iter_mut()) {
                self.linear(x, rows, m, None, o);
            }
            return;
        }
        let r = ops::linears(self, x, rows, mats, outs);
        if r.is_err() {
            self.settle("linears", r, outs[0]);
            // The real error is noted first; these only poison the other outputs.
            for o in &outs[1..] {
                self.settle("linears", Err(CudaError::Unallocated), o);
            }
        }
    }

    fn gather_rows(&self, x: &CudaBuf, width: usize, rows: &[usize]) -> CudaBuf {
        match ops::gather(self, x, width, rows) {
            Ok(b) => b,
            Err(e) => {
                self.dev.note("gather_rows", Err(e));
                self.lost(rows.len() * width)
            }
        }
    }

    fn add(&self, acc: &mut CudaBuf, y: &CudaBuf) {
        let r = ops::add(self, acc, y);
        self.settle("add", r, acc);
    }

    fn add_rmsnorm(&self, acc: &mut CudaBuf, y: &CudaBuf, weight: &CudaBuf, eps: f32, width: usize, out: &mut CudaBuf) {
        if !self.dev.fused {
            self.add(acc, y);
            return self.rmsnorm(acc, weight, eps, width, out);
        }
        let r = ops::add_rmsnorm(self, acc, y, (weight, eps, width), out);
        let failed = r.is_err();
        self.settle("add_rmsnorm", r, out);
        if failed {
            // The real error is noted first; this only poisons the half-updated residual.
            self.settle("add_rmsnorm", Err(CudaError::Unallocated), acc);
        }
    }

    fn qk_norm_rope(
        &self,
        x: &mut CudaBuf,
        heads: usize,
        norm: &CudaBuf,
        eps: f32,
        rope: RopeParams,
        segs: &[Segment],
    ) -> Result<(), KernelError> {
        self.dev.take("qk_norm_rope")?;
        ops::qk_norm_rope(self, (x, heads, norm), None, eps, rope, segs)
    }

    fn qk_norm_rope_pair(
        &self,
        q: (&mut CudaBuf, usize, &CudaBuf),
        k: (&mut CudaBuf, usize, &CudaBuf),
        eps: f32,
        rope: RopeParams,
        segs: &[Segment],
    ) -> Result<(), KernelError> {
        self.dev.take("qk_norm_rope")?;
        if !self.dev.fused {
            ops::qk_norm_rope(self, q, None, eps, rope, segs)?;
            return ops::qk_norm_rope(self, k, None, eps, rope, segs);
        }
        ops::qk_norm_rope(self, q, Some(k), eps, rope, segs)
    }

    fn attention(
        &self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        heads: usize,
        kv_heads: usize,
        segs: &[Segment],
        caches: &mut [&mut CudaKv],
        out: &mut CudaBuf,
    ) -> Result<(), KernelError> {
        self.dev.take("attention")?;
        attention::attention(self, q, k, v, heads, kv_heads, segs, caches, out)
    }

    fn kv_append(
        &self,
        k: &CudaBuf,
        v: &CudaBuf,
        segs: &[Segment],
        caches: &mut [&mut CudaKv],
    ) -> Result<(), KernelError> {
        self.dev.take("kv_append")?;
        attention::kv_append(self, k, v, segs, caches)
    }

    fn block_attention(
        &self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        heads: usize,
        kv_heads: usize,
        segs: &[Segment],
        caches: &[&CudaKv],
        out: &mut CudaBuf,
    ) -> Result<(), KernelError> {
        self.dev.take("block_attention")?;
        attention::block_attention(self, q, k, v, heads, kv_heads, segs, caches, out)
    }

    fn short_conv(
        &self,
        bcx: &CudaBuf,
        width: usize,
        weight: &CudaBuf,
        bias: Option<&CudaBuf>,
        segs: &[Segment],
        states: &mut [&mut CudaConv],
        out: &mut CudaBuf,
    ) -> Result<(), KernelError> {
        self.dev.take("short_conv")?;
        conv::short_conv(self, bcx, width, weight, bias, segs, states, out)
    }

    fn swiglu(&self, x: &CudaBuf, rows: usize, ffn: &Ffn<CudaMat>, out: &mut CudaBuf) {
        let r = ops::swiglu(self, x, rows, ffn, out);
        self.settle("swiglu", r, out);
    }

    fn moe_route(
        &self,
        x: &CudaBuf,
        rows: usize,
        gate: &CudaMat,
        expert_bias: Option<&CudaBuf>,
        p: MoeParams,
        sel: &mut CudaBuf,
        wts: &mut CudaBuf,
    ) -> Result<(), KernelError> {
        self.dev.take("moe_route")?;
        moe::route(self, x, rows, gate, expert_bias, p, sel, wts).map_err(|e| e.kernel("moe_route"))
    }

    fn moe_experts(
        &self,
        x: &CudaBuf,
        rows: usize,
        sel: &CudaBuf,
        k: usize,
        owned: &[Ffn<CudaMat>],
        first: usize,
        total: usize,
        y: &mut CudaBuf,
    ) -> Result<(), KernelError> {
        self.dev.take("moe_experts")?;
        ops::expect(first + owned.len() <= total, || format!("experts {first}.. +{} of {total}", owned.len()))
            .and_then(|()| moe::experts(self, x, rows, sel, k, (owned, first, total), y))
            .map_err(|e| e.kernel("moe_experts"))
    }

    fn moe_route_experts(
        &self,
        x: &CudaBuf,
        rows: usize,
        gate: &CudaMat,
        expert_bias: Option<&CudaBuf>,
        experts: &[Ffn<CudaMat>],
        p: MoeParams,
        sw: (&mut CudaBuf, &mut CudaBuf),
        y: &mut CudaBuf,
    ) -> Result<(), KernelError> {
        self.dev.take("moe")?;
        moe::route_experts(self, x, rows, gate, expert_bias, experts, p, sw, y).map_err(|e| e.kernel("moe"))
    }

    fn moe_combine(
        &self,
        y: &CudaBuf,
        wts: &CudaBuf,
        rows: usize,
        k: usize,
        out: &mut CudaBuf,
    ) -> Result<(), KernelError> {
        self.dev.take("moe_combine")?;
        moe::combine(self, y, wts, rows, k, out).map_err(|e| e.kernel("moe_combine"))
    }

    fn moe_combine_add_rmsnorm(
        &self,
        (y, wts): (&CudaBuf, &CudaBuf),
        rows: usize,
        k: usize,
        acc: &mut CudaBuf,
        norm: Option<(&CudaBuf, f32)>,
        width: usize,
        out: &mut CudaBuf,
    ) -> Result<(), KernelError> {
        if !self.dev.fused {
            crate::backend::combine_then_add_rmsnorm(self, (y, wts), rows, k, acc, norm, width, out)?;
            return self.dev.take("moe_combine_add_rmsnorm");
        }
        self.dev.take("moe_combine_add_rmsnorm")?;
        moe::combine_add_rmsnorm(self, (y, wts), rows, k, acc, norm, width, out)
            .map_err(|e| e.kernel("moe_combine_add_rmsnorm"))
    }
}

impl Sampling for CudaBackend {
    fn embed_held(
        &self,
        table: &CudaMat,
        ids: &[u32],
        held: &CudaBuf,
        from: &[(usize, usize)],
        out: &mut CudaBuf,
    ) -> Result<(), KernelError> {
        self.dev.take("embed_held")?;
        ops::embed_held(self, table, ids, held, from, out)
    }

    fn draw_rows(&self, logits: &CudaBuf, vocab: usize, specs: &[DrawSpec]) -> Vec<Result<u32, SampleError>> {
        let failed = |e: &CudaError| vec![Err(SampleError::Device(e.to_string())); specs.len()];
        if self.dev.pending() {
            return failed(&CudaError::Shape("an earlier kernel failed".into()));
        }
        match draw::draw_rows(self, logits, vocab, specs) {
            Ok(d) => d.0,
            Err(e) => {
                let out = failed(&e);
                self.dev.note("draw_rows", Err(e));
                out
            }
        }
    }

    fn draw_into(&self, logits: &CudaBuf, vocab: usize, specs: &[DrawSpec], out: &mut CudaBuf) {
        let r = draw::draw_into(self, logits, vocab, specs, out);
        self.settle("draw_into", r, out);
    }

    fn embed_words(&self, table: &CudaMat, words: &CudaBuf, rows: usize, out: &mut CudaBuf) -> Result<(), KernelError> {
        self.dev.take("embed_words")?;
        ops::embed_words(self, table, words, rows, out).map_err(|e| e.kernel("embed_words"))
    }

    fn greedy(&self, logits: &CudaBuf, vocab: usize) -> Vec<Pick> {
        let rows = logits.len().checked_div(vocab).map_or(0, |_| logits.len().div_ceil(vocab));
        let flagged = || vec![Pick { token: 0, nonfinite: true }; rows];
        if self.dev.pending() {
            return flagged();
        }
        match ops::greedy(self, logits, vocab) {
            Ok(p) => p,
            Err(e) => {
                self.dev.note("greedy", Err(e));
                flagged()
            }
        }
    }
}

impl Diagnostics for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn check(&self) -> Result<(), KernelError> {
        self.dev.take("check")
    }

    fn flush_check(&self) -> Result<(), KernelError> {
        self.dev.note("sending queued work", self.dev.send());
        self.dev.take("check")
    }

    fn copy_bandwidth(&self) -> f64 {
        self.dev.copy_bandwidth().unwrap_or(f64::NAN)
    }

    fn memory_high(&self) -> Option<(usize, usize)> {
        self.dev.pool_high().ok()
    }

    fn check_attention(&self, heads: usize, kv_heads: usize, head_dim: usize) -> Result<(), KernelError> {
        super::attention::check_shape(self, heads, kv_heads, head_dim)
    }

    fn memory_free(&self) -> Option<usize> {
        // Less what this backend may still take for itself at its caps: kept blocks, held frees, attention scratch.
        let own = super::device::OWN_RESERVE + 4 * super::attention::SCRATCH_FLOATS;
        self.dev.mem_free().ok().map(|f| f.saturating_sub(own))
    }

    fn take_profile(&self) -> Option<String> {
        self.dev.take_profile()
    }

    fn graph_report(&self) -> Option<String> {
        Some(self.dev.graph_report())
    }
}
