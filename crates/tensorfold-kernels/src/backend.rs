//! The `Backend` trait the forward is written against, and the types its kernels share.

use crate::bytes::MatView;
use crate::sample::{DrawSpec, SampleError, draw, greedy_pick};

pub use crate::error::KernelError;

/// One stream's rows in a call: rows `first_row .. first_row + rows` of every activation buffer belong
/// to the stream whose caches are `caches[cache]`, at absolute positions `start_pos ..`.
/// The shared round (docs/architecture.md) is a list of these over one set of buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First row of this stream in the call's activation buffers.
    pub first_row: usize,
    /// Number of rows (a prompt chunk, a decode row, or a verify window).
    pub rows: usize,
    /// Absolute position of the first row; equals the key rows already in the stream's KV cache.
    pub start_pos: usize,
    /// Index of the stream's caches in the slice passed to the stateful kernels.
    pub cache: usize,
}

/// Rotary embedding settings: pair `i` of a head rotates by `pos * theta^(-2i/head_dim)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// `rope_theta` (config `rope_theta` or `rope_parameters.rope_theta`).
    pub theta: f64,
    /// Rotated dimensions per head (the whole head).
    pub head_dim: usize,
    /// Pairs are `(2i, 2i+1)` (GPT-J "interleaved", DSpark drafters with `rope_is_neox_style: false`)
    /// instead of `(i, i + head_dim/2)` (NeoX / transformers' `rotate_half`, the LFM2 target).
    pub interleaved: bool,
}

/// Inverse frequency of rotary pair `i`, as transformers computes it in float32:
/// `1 / theta ^ (2i / head_dim)`.
pub fn rope_inv_freq(theta: f64, head_dim: usize, i: usize) -> f32 {
    let e = (2 * i) as f32 / head_dim as f32;
    1.0 / ((theta as f32) as f64).powf(e as f64) as f32
}

/// Longest segment whose `B * x` rows a backend keeps so a conv state can be rolled back (verify windows): a window
/// of at most this many rows can be kept to any prefix ([`StreamState::conv_keep`]); a state reserved for shorter
/// verify windows ([`StreamState::conv_reserve`]) keeps fewer.
pub const KEEP_ROWS: usize = 64;

/// MoE routing settings (transformers `Lfm2MoeSparseMoeBlock`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeParams {
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// `norm_topk_prob`: weights divided by their sum + 1e-6.
    pub norm_topk_prob: bool,
    /// `routed_scaling_factor`, applied after normalizing.
    pub routed_scaling_factor: f32,
}

/// One SwiGLU expert (or the dense FFN): `w2(silu(w1 x) * w3 x)`.
pub struct Ffn<M> {
    /// Gate projection `[inter, hidden]`.
    pub w1: M,
    /// Up projection `[inter, hidden]`.
    pub w3: M,
    /// Down projection `[hidden, inter]`.
    pub w2: M,
}

/// A row's greedy pick: the first largest logit (ties go to the lower id); `nonfinite` flags a row with
/// a NaN or infinite logit, whose `token` must not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    /// Picked token id.
    pub token: u32,
    /// The row held a non-finite logit: an error, never a silent pick.
    pub nonfinite: bool,
}

/// The kernels of the LFM2 forward on one device. Activation buffers are row-major f32 `[rows, width]`.
///
/// # Errors: one model for every backend
/// - **Fallible calls** return `Result<_, KernelError>`: those whose validity depends on what a request brings or on
///   a stream's state, which the caller cannot know without a check: token ids ([`Ops::embed`],
///   [`Sampling::embed_words`], [`Sampling::embed_held`]), segment tables and stream caches
///   ([`Ops::qk_norm_rope`] and its pair, [`Ops::attention`], [`Ops::kv_append`],
///   [`Ops::block_attention`], [`Ops::short_conv`], [`StreamState::conv_keep`]), the MoE steps (expert ids
///   and the routing's shapes), [`Memory::upload_mat`], [`Diagnostics::check`], and a stream state's reserves
///   ([`StreamState::kv_reserve`], [`StreamState::conv_reserve`]: [`KernelError::OutOfMemory`], the request's own).
///   Each validates every shape before it changes any state (the checks of `shape.rs`, the same on every
///   backend), so a refused call leaves every stream as it was, and the error names what was wrong
///   ([`KernelError::Shape`], `Segments`, `KeyCount`, `TokenOutOfRange`).
/// - **Infallible calls** return no `Result`: memory ([`Memory::upload`], [`Memory::zeros`],
///   [`Memory::scratch`], [`Memory::read`], [`Memory::concat`]) and the row-wise ops
///   ([`Ops::rmsnorm`], [`Ops::linear`], [`Ops::linears`], [`Ops::gather_rows`], [`Ops::add`],
///   [`Ops::add_rmsnorm`], [`Ops::swiglu`], [`Sampling::greedy`], [`Sampling::draw_into`]). Their shapes
///   come from the model's config, the same that sized the fallible call of the layer, so a mismatch there is the
///   caller's bug, not a request's: the CPU backend panics on it, the CUDA backend records it. Why not a `Result`
///   each: the forward makes several such calls a layer, and their only runtime failure is the device's.
/// - **A device failure is sticky** (the CUDA backend; the CPU has none): an infallible call that fails (a launch,
///   an allocation, a copy) poisons its output (NaN, or a buffer without memory), records the failure, and returns;
///   the next fallible call, or [`Diagnostics::check`], reports it as [`KernelError::Device`] (or
///   [`KernelError::DeviceLost`] when the device is unusable, [`KernelError::DeviceOutOfMemory`] when it was out of
///   memory) and clears it. While one is waiting, [`Memory::read`]
///   returns NaN and [`Sampling::draw_rows`] a device error for each row. Every layer of a forward makes a fallible
///   call (its attention or conv) and poisoned logits flag their rows as non-finite, so a round whose device work
///   failed never yields a token silently.
///
/// By concern, five traits: [`Memory`], [`StreamState`], [`Ops`], [`Sampling`], [`Diagnostics`]; a type that
/// implements all five is a `Backend`. A caller generic over `B: Backend` calls every method; one holding a concrete
/// backend imports [`crate::prelude`].
pub trait Backend: Memory + StreamState + Ops + Sampling + Diagnostics {}

impl<T: Memory + StreamState + Ops + Sampling + Diagnostics + ?Sized> Backend for T {}

/// Device memory: f32 buffers and weight matrices, to and from the host ([`Backend`]'s first concern).
pub trait Memory: Send + Sync {
    /// An f32 buffer on the device.
    type Buf: Send + Sync;
    /// A weight matrix `[rows, cols]` on the device.
    type Mat: Send + Sync;
    /// One attention layer's KV rows of one stream (`Clone` copies the rows: prompt-cache snapshots).
    type Kv: Send + Sync + Clone;
    /// One conv layer's state of one stream (the last `taps - 1` values of `B*x`).
    type Conv: Send + Sync + Clone;

    /// Moves a host matrix to the device (the CPU keeps a zero-copy view).
    fn upload_mat(&self, m: &MatView) -> Result<Self::Mat, KernelError>;
    /// Bytes of a device matrix.
    fn mat_bytes(&self, m: &Self::Mat) -> usize;
    /// Copies host values to a new device buffer.
    fn upload(&self, data: &[f32]) -> Self::Buf;
    /// A zeroed buffer of `len` elements.
    fn zeros(&self, len: usize) -> Self::Buf;
    /// A buffer of `len` elements for an output the next kernel writes whole (no zeroing pass on a device; every
    /// kernel's contract entry checks that it writes each output element). Defaults to [`Memory::zeros`].
    fn scratch(&self, len: usize) -> Self::Buf {
        self.zeros(len)
    }
    /// Copies a device buffer back to the host.
    fn read(&self, b: &Self::Buf) -> Vec<f32>;
    /// Rows of a matrix (of an embedding table: the vocabulary `embed` checks ids against).
    fn mat_rows(&self, m: &Self::Mat) -> usize;
    /// `parts` one after another (`[sum of their lengths]`): a chain's per-row words as one buffer, read with one
    /// copy. The default copies through the host. Infallible as `add`: a device failure is recorded (the buffer is
    /// then unallocated) and reported by the next fallible call or [`Diagnostics::check`].
    fn concat(&self, parts: &[&Self::Buf]) -> Self::Buf {
        let host: Vec<f32> = parts.iter().flat_map(|p| self.read(p)).collect();
        self.upload(&host)
    }
}

/// Per-stream state: each attention layer's KV rows and each conv layer's state, grown, measured and rolled back.
pub trait StreamState: Memory {
    /// An empty KV cache whose rows hold `width = kv_heads * head_dim` keys and as many values.
    fn new_kv(&self, width: usize) -> Self::Kv;
    /// Key rows held.
    fn kv_len(&self, kv: &Self::Kv) -> usize;
    /// Reserves room for `tokens` key rows in all, so appends never reallocate (memory admission counts
    /// exactly this). Errors: [`KernelError::OutOfMemory`] when that room cannot be allocated (the rows held are
    /// kept); on a device another failure, [`KernelError::Device`], or [`KernelError::DeviceLost`], which alone is
    /// also recorded for later calls (as any call's).
    fn kv_reserve(&self, kv: &mut Self::Kv, tokens: usize) -> Result<(), KernelError>;
    /// Drops key rows past `len` (rolls back a rejected window).
    fn kv_truncate(&self, kv: &mut Self::Kv, len: usize);
    /// Bytes the cache holds.
    fn kv_bytes(&self, kv: &Self::Kv) -> usize;
    /// A zeroed conv state for `channels` channels and a kernel of `taps` taps.
    fn new_conv(&self, channels: usize, taps: usize) -> Self::Conv;
    /// Rolls a conv state back to just after the first `rows` rows of its last call (rejected drafts):
    /// conv states cannot be truncated like KV rows.
    fn conv_keep(&self, c: &mut Self::Conv, rows: usize) -> Result<(), KernelError>;
    /// Bytes a conv state holds (state and any kept window).
    fn conv_bytes(&self, c: &Self::Conv) -> usize;
    /// Frees a conv state's kept window (it can then no longer roll back).
    fn conv_drop_window(&self, c: &mut Self::Conv);
    /// Keeps windows only for calls of at most `rows` rows (1 to [`KEEP_ROWS`]; a fresh state keeps them up to
    /// [`KEEP_ROWS`]) and makes room for such a window now, so the state holds what memory admission counted: the
    /// engine's longest verify window, not a 64-row window a stream of decode rows never rolls back. A longer call
    /// is not rolled back (its `conv_keep` errors), as a call past [`KEEP_ROWS`] today. Errors: as
    /// [`StreamState::kv_reserve`] (the state is kept; the window is allocated again when a call needs it).
    fn conv_reserve(&self, c: &mut Self::Conv, rows: usize) -> Result<(), KernelError>;
}

/// The forward's ops over a call's rows: embedding, norms, linears, RoPE, attention, the short conv, the FFN and MoE
/// steps. The stateful ones walk a segment table (one [`Segment`] a stream).
pub trait Ops: StreamState {
    /// Runs `f` (a whole forward, whose kernels this backend's ops are) where those kernels dispatch cheapest: the CPU
    /// runs it on a worker of its thread pool, so each kernel's split across threads is a fork inside the pool
    /// rather than a hand-off from a thread outside it. Never changes a result. The default runs `f` here.
    fn on_workers<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }
    /// `out[r] = table[ids[r]]` widened to f32. Errors on an id past the table.
    fn embed(&self, table: &Self::Mat, ids: &[u32], out: &mut Self::Buf) -> Result<(), KernelError>;
    /// Row-wise RMSNorm over `width`: `x * rsqrt(mean(x^2) + eps) * weight`.
    fn rmsnorm(&self, x: &Self::Buf, weight: &Self::Buf, eps: f32, width: usize, out: &mut Self::Buf);
    /// `out[r] = w x[r] (+ bias)`: `x` is `[rows, w.cols]`, `out` `[rows, w.rows]`.
    fn linear(&self, x: &Self::Buf, rows: usize, w: &Self::Mat, bias: Option<&Self::Buf>, out: &mut Self::Buf);
    /// Several linears of one input, no bias: `outs[i] = mats[i] x` for `x` `[rows, k]` and each matrix `[n_i, k]`
    /// (an attention layer's q, k and v). A backend may run them as one launch; each output's bits must equal its
    /// own [`Ops::linear`]'s (the CUDA contract checks it).
    fn linears(&self, x: &Self::Buf, rows: usize, mats: &[&Self::Mat], outs: &mut [&mut Self::Buf]) {
        for (m, o) in mats.iter().zip(outs.iter_mut()) {
            self.linear(x, rows, m, None, o);
        }
    }
    /// Rows `rows` of `x` `[*, width]`, in that order, as a new buffer `[rows.len(), width]`.
    fn gather_rows(&self, x: &Self::Buf, width: usize, rows: &[usize]) -> Self::Buf;
    /// `acc += y` elementwise.
    fn add(&self, acc: &mut Self::Buf, y: &Self::Buf);
    /// The residual add and the next RMSNorm: `acc += y`, then `out = rmsnorm(acc)` over `width` (as
    /// [`Ops::rmsnorm`]). A backend may fuse the two; the bits must equal [`Ops::add`] then
    /// [`Ops::rmsnorm`] (the CUDA contract checks it).
    fn add_rmsnorm(
        &self,
        acc: &mut Self::Buf,
        y: &Self::Buf,
        weight: &Self::Buf,
        eps: f32,
        width: usize,
        out: &mut Self::Buf,
    ) {
        self.add(acc, y);
        self.rmsnorm(acc, weight, eps, width, out);
    }
    /// Per-head RMSNorm (weight `[head_dim]`) then RoPE at each row's absolute position, in place on
    /// `x` `[rows, heads * head_dim]`.
    fn qk_norm_rope(
        &self,
        x: &mut Self::Buf,
        heads: usize,
        norm: &Self::Buf,
        eps: f32,
        rope: RopeParams,
        segs: &[Segment],
    ) -> Result<(), KernelError>;
    /// [`Ops::qk_norm_rope`] of an attention layer's queries `q.0` `[rows, q.1 * head_dim]` (weight `q.2`) and
    /// keys `k.0` `[rows, k.1 * head_dim]` (weight `k.2`). A backend may do both in one launch; the bits must equal
    /// the two calls' (the CUDA contract checks it).
    fn qk_norm_rope_pair(
        &self,
        q: (&mut Self::Buf, usize, &Self::Buf),
        k: (&mut Self::Buf, usize, &Self::Buf),
        eps: f32,
        rope: RopeParams,
        segs: &[Segment],
    ) -> Result<(), KernelError> {
        self.qk_norm_rope(q.0, q.1, q.2, eps, rope, segs)?;
        self.qk_norm_rope(k.0, k.1, k.2, eps, rope, segs)
    }
    /// Appends each segment's `k`, `v` rows to its stream's cache, then causal GQA attention of every
    /// row over its stream's keys `[0, pos]`, scale `1/sqrt(head_dim)`. `q` `[rows, heads*hd]`,
    /// `k`/`v` `[rows, kv_heads*hd]`, `out` `[rows, heads*hd]`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        heads: usize,
        kv_heads: usize,
        segs: &[Segment],
        caches: &mut [&mut Self::Kv],
        out: &mut Self::Buf,
    ) -> Result<(), KernelError>;
    /// Appends each segment's `k`, `v` rows `[rows, kv_heads*hd]` to its stream's cache, which must hold
    /// exactly `start_pos` rows (the drafter's context K/V: no attention is computed).
    fn kv_append(
        &self,
        k: &Self::Buf,
        v: &Self::Buf,
        segs: &[Segment],
        caches: &mut [&mut Self::Kv],
    ) -> Result<(), KernelError>;
    /// Non-causal GQA attention of a block (DSpark's block pass): every row of a segment attends to all
    /// `start_pos` key rows of its stream's cache and to ALL of the segment's own `k`, `v` rows, scale
    /// `1/sqrt(head_dim)`; nothing is appended. Shapes as [`Ops::attention`].
    #[allow(clippy::too_many_arguments)]
    fn block_attention(
        &self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        heads: usize,
        kv_heads: usize,
        segs: &[Segment],
        caches: &[&Self::Kv],
        out: &mut Self::Buf,
    ) -> Result<(), KernelError>;
    /// LFM2 short conv core over `bcx` `[rows, 3*width]` (B, C, x chunks): `C * conv(B * x)` with a
    /// depthwise causal kernel `weight` `[width, taps]` (+ bias) reading each stream's state, which is then
    /// advanced to the segment's last row. `out` `[rows, width]`.
    #[allow(clippy::too_many_arguments)]
    fn short_conv(
        &self,
        bcx: &Self::Buf,
        width: usize,
        weight: &Self::Buf,
        bias: Option<&Self::Buf>,
        segs: &[Segment],
        states: &mut [&mut Self::Conv],
        out: &mut Self::Buf,
    ) -> Result<(), KernelError>;
    /// Dense SwiGLU FFN over `rows` rows.
    fn swiglu(&self, x: &Self::Buf, rows: usize, ffn: &Ffn<Self::Mat>, out: &mut Self::Buf);
    /// The LFM2-MoE block is routing ([`Ops::moe_route`]), the experts ([`Ops::moe_experts`], or both in
    /// [`Ops::moe_route_experts`]) and the rank-order combine ([`Ops::moe_combine`], or fused with the next
    /// norm: [`Ops::moe_combine_add_rmsnorm`]); expert parallelism runs the steps apart.
    ///
    /// The MoE block's routing (the first step, which expert parallelism runs on one device):
    /// router logits `gate x`, then per row the top `k = min(top_k, experts)` experts by `sigmoid + bias` in rank
    /// order into `sel` `[rows, k]` (expert ids as f32, exact below 2^24) and their weights into `wts` `[rows, k]`
    /// (transformers `Lfm2MoeSparseMoeBlock.route_tokens_to_experts`).
    #[allow(clippy::too_many_arguments)]
    fn moe_route(
        &self,
        x: &Self::Buf,
        rows: usize,
        gate: &Self::Mat,
        expert_bias: Option<&Self::Buf>,
        p: MoeParams,
        sel: &mut Self::Buf,
        wts: &mut Self::Buf,
    ) -> Result<(), KernelError>;
    /// The MoE experts this device owns, over a routing's assignments: `owned` are experts `first .. first +
    /// owned.len()` of the layer's `total`; `y` `[rows * k, hidden]` gets, for assignment `a` (row `a / k`, expert `sel[a]`), the expert's
    /// SwiGLU output of `x[a / k]` where owned and `+0` elsewhere, so devices owning disjoint experts sum to one
    /// device's `y` exactly (each element has one nonzero contributor). Each owned expert's weights are read once.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts(
        &self,
        x: &Self::Buf,
        rows: usize,
        sel: &Self::Buf,
        k: usize,
        owned: &[Ffn<Self::Mat>],
        first: usize,
        total: usize,
        y: &mut Self::Buf,
    ) -> Result<(), KernelError>;
    /// [`Ops::moe_route`] then [`Ops::moe_experts`] over every expert of the layer (one device, no expert
    /// parallelism): `sel` and `wts` `[rows, k]`, `y` `[rows * k, hidden]`. A backend may fuse steps; the bits must
    /// equal the two calls' (the CUDA contract's `cuda.moe` runs both forms).
    #[allow(clippy::too_many_arguments)]
    fn moe_route_experts(
        &self,
        x: &Self::Buf,
        rows: usize,
        gate: &Self::Mat,
        expert_bias: Option<&Self::Buf>,
        experts: &[Ffn<Self::Mat>],
        p: MoeParams,
        (sel, wts): (&mut Self::Buf, &mut Self::Buf),
        y: &mut Self::Buf,
    ) -> Result<(), KernelError> {
        self.moe_route(x, rows, gate, expert_bias, p, sel, wts)?;
        self.moe_experts(x, rows, sel, p.top_k.min(experts.len()), experts, 0, experts.len(), y)
    }
    /// The MoE combine: `out[r] = sum over rank j, in rank order from +0, of wts[r, j] * y[r * k + j]`; `y`
    /// `[rows * k, hidden]`, `wts` `[rows, k]`, `out` `[rows, hidden]`.
    fn moe_combine(
        &self,
        y: &Self::Buf,
        wts: &Self::Buf,
        rows: usize,
        k: usize,
        out: &mut Self::Buf,
    ) -> Result<(), KernelError>;
    /// The MoE combine fused with the residual add and the next RMSNorm: `acc += moe_combine(y, wts)`, then with
    /// `norm = Some((weight, eps))` `out = rmsnorm(acc)` over `width` (the last layer passes `None`: the add
    /// alone, `out` untouched). `y` `[rows * k, width]`, `wts` `[rows, k]`, `acc` and `out` `[rows, width]`. A
    /// backend may fuse the steps; the bits must equal [`Ops::moe_combine`] then [`Ops::add_rmsnorm`] (or
    /// [`Ops::add`]), which the CUDA contract checks.
    #[allow(clippy::too_many_arguments)]
    fn moe_combine_add_rmsnorm(
        &self,
        (y, wts): (&Self::Buf, &Self::Buf),
        rows: usize,
        k: usize,
        acc: &mut Self::Buf,
        norm: Option<(&Self::Buf, f32)>,
        width: usize,
        out: &mut Self::Buf,
    ) -> Result<(), KernelError> {
        combine_then_add_rmsnorm(self, (y, wts), rows, k, acc, norm, width, out)
    }
}

/// The head's picks: greedy, the keyed draw, and the draws left on the device for the next step (the drafter's
/// chain, held drafts).
pub trait Sampling: Ops {
    /// Greedy pick of each row of `logits` `[rows, vocab]`.
    fn greedy(&self, logits: &Self::Buf, vocab: usize) -> Vec<Pick>;
    /// The keyed draw ([`crate::sample::draw`]) of each row of `logits` (`[specs.len(), vocab]` f32, row `r`
    /// drawn by `specs[r]`): the token id, or the row's [`SampleError`] (non-finite logit with its first
    /// index, bad parameter). The default copies the rows to the host and runs the reference; the CUDA
    /// backend draws on the device and copies back only the ids.
    fn draw_rows(&self, logits: &Self::Buf, vocab: usize, specs: &[DrawSpec]) -> Vec<Result<u32, SampleError>> {
        let host = self.read(logits);
        let row = |r: usize| host.get(r * vocab..(r + 1) * vocab).unwrap_or(&[]);
        specs.iter().enumerate().map(|(r, s)| draw(&s.params, s.position, row(r))).collect()
    }
    /// [`Sampling::draw_rows`] with the results left where the logits live, for a chain of picks that feeds its next
    /// step without a host read (the drafter's Markov chain). `out` (`[specs.len() * 3]`) gets each row's `[token,
    /// status, index]` as u32 bits in f32 slots: status [`DRAWN`] (a refused spec gives the greedy pick),
    /// [`DRAWN_NONFINITE`] (index = the first non-finite logit), or [`DRAWN_GREEDY`] (CUDA: the top-p nucleus was
    /// longer than the device's window, token = the greedy pick). The default draws on the host and uploads.
    fn draw_into(&self, logits: &Self::Buf, vocab: usize, specs: &[DrawSpec], out: &mut Self::Buf) {
        let host = self.read(logits);
        let row = |r: usize| host.get(r * vocab..(r + 1) * vocab).unwrap_or(&[]);
        let words: Vec<f32> =
            specs.iter().enumerate().flat_map(|(r, s)| drawn_words(row(r), s).map(f32::from_bits)).collect();
        *out = self.upload(&words);
    }
    /// `out[r] = table[words[3r]]` for `rows` ids a [`Sampling::draw_into`] left on the device, widened as
    /// [`Ops::embed`]; an id past the table gives a NaN row (a device cannot refuse it without a host read), which
    /// the next pick flags. Errors: a words buffer that is not `3 * rows` long.
    fn embed_words(
        &self,
        table: &Self::Mat,
        words: &Self::Buf,
        rows: usize,
        out: &mut Self::Buf,
    ) -> Result<(), KernelError> {
        let w = self.read(words);
        if w.len() != 3 * rows {
            return Err(KernelError::Shape { kernel: "embed_words", what: "words", got: w.len(), want: 3 * rows });
        }
        let ids: Vec<u32> = (0..rows).map(|r| w[3 * r].to_bits()).collect();
        embed_or_nan(self, table, &ids, out)
    }
    /// [`Ops::embed`] with some rows' ids taken from words a [`Sampling::draw_into`] left on the device (held
    /// drafts: a verify window embeds the drafter's picks without a host read). `ids` `[rows]` (a held row's entry
    /// is a placeholder, checked as any id); `held` `[picks * 3]` words; `from[j] = (row, pick)`: row `row` of
    /// `out` (`[rows, width]`) takes `table[held[3 * pick]]`, a NaN row when that id is past the table (as
    /// [`Sampling::embed_words`]; the verify's reader refuses the pick by its id). Errors: an id of `ids` past the
    /// table ([`KernelError::TokenOutOfRange`]); a row or pick out of range ([`KernelError::Shape`], `what` = "held
    /// row" / "held pick" / "held words"). The default reads `held` to the host.
    fn embed_held(
        &self,
        table: &Self::Mat,
        ids: &[u32],
        held: &Self::Buf,
        from: &[(usize, usize)],
        out: &mut Self::Buf,
    ) -> Result<(), KernelError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.mat_rows(table)) {
            return Err(KernelError::TokenOutOfRange { id, vocab: self.mat_rows(table) });
        }
        let w = self.read(held);
        check_held(ids.len(), w.len(), from)?;
        let mut all = ids.to_vec();
        for &(row, pick) in from {
            all[row] = w[3 * pick].to_bits();
        }
        embed_or_nan(self, table, &all, out)
    }
}

/// What a backend reports about itself: its name, the first recorded device failure, memory, bandwidth and launch
/// counters.
pub trait Diagnostics: Memory {
    /// Backend name (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// Measured copy bandwidth of the memory this backend's weights live in, in bytes moved (read plus write) per
    /// second: the best of 5 copies of 512 MiB (the decode floor's denominator; METHOD: measure the ceiling).
    /// The default times a host `memcpy`.
    fn copy_bandwidth(&self) -> f64 {
        host_copy_bandwidth()
    }
    /// The first device failure recorded since the last report, taken (an infallible call's failure, as the next
    /// fallible call would report it), without waiting for the device; `Ok` on backends that record none. Lets a
    /// caller that will not read a result yet (held drafts) learn that it is poisoned.
    fn check(&self) -> Result<(), KernelError> {
        Ok(())
    }
    /// [`Diagnostics::check`] after sending every queued operation to the device (without waiting for it), so a
    /// failure to send this caller's work is its own, not a later call's: the end of a forward, a state copy.
    fn flush_check(&self) -> Result<(), KernelError> {
        self.check()
    }
    /// Device memory high-water marks in bytes of the device's default pool, over the whole process (never reset):
    /// `(allocated, reserved by the pool)`; `None` where memory is the host's (read the process's peak RSS instead).
    fn memory_high(&self) -> Option<(usize, usize)> {
        None
    }
    /// Refuses, by name, an attention shape (`heads` query heads over `kv_heads` KV heads of `head_dim`) this
    /// backend's attention kernels cannot serve, so a model is refused at open instead of at its first request;
    /// `Ok` where every shape the config admission lets through is served.
    fn check_attention(&self, heads: usize, kv_heads: usize, head_dim: usize) -> Result<(), KernelError> {
        let _ = (heads, kv_heads, head_dim);
        Ok(())
    }
    /// Bytes of device memory streams and rounds can still take (free memory plus the pool's unused reserve, less
    /// what the backend may still take for itself at its caps), for memory admission's default budget; `None` where
    /// memory is the host's or the device cannot say.
    fn memory_free(&self) -> Option<usize> {
        None
    }
    /// Per-kernel counters gathered since the last call, as a table, where the backend keeps them (the CUDA
    /// backend with `TENSORFOLD_CUDA_PROFILE` set); `None` elsewhere. A measuring aid, never on by default.
    fn take_profile(&self) -> Option<String> {
        None
    }
    /// One line on how the backend batched its launches since it opened (the CUDA backend's graph replays,
    /// `cuda/graphs.rs`); `None` where there is nothing to say.
    fn graph_report(&self) -> Option<String> {
        None
    }
}

/// [`Sampling::draw_into`]'s status of a drawn row (or of a refused spec's greedy pick).
pub const DRAWN: u32 = 0;
/// [`Sampling::draw_into`]'s status of a row holding a non-finite logit.
pub const DRAWN_NONFINITE: u32 = 1;
/// [`Sampling::draw_into`]'s status of a row whose top-p nucleus was past the device's window: token = greedy pick.
pub const DRAWN_GREEDY: u32 = 2;

/// One row's `[token, status, index]` words of [`Sampling::draw_into`], drawn on the host.
pub fn drawn_words(row: &[f32], s: &DrawSpec) -> [u32; 3] {
    match draw(&s.params, s.position, row) {
        Ok(t) => [t, DRAWN, 0],
        Err(SampleError::NonFinite { index }) => [0, DRAWN_NONFINITE, index as u32],
        Err(_) => match greedy_pick(row) {
            Ok(t) => [t, DRAWN, 0],
            Err(SampleError::NonFinite { index }) => [0, DRAWN_NONFINITE, index as u32],
            Err(_) => [0, DRAWN_NONFINITE, 0],
        },
    }
}

/// [`Ops::embed`] where an id past the table gives a NaN row instead of an error (ids a device drew).
fn embed_or_nan<B: Ops + ?Sized>(b: &B, table: &B::Mat, ids: &[u32], out: &mut B::Buf) -> Result<(), KernelError> {
    match b.embed(table, ids, out) {
        Err(KernelError::TokenOutOfRange { vocab, .. }) => {
            let ok: Vec<u32> = ids.iter().map(|&i| if (i as usize) < vocab { i } else { 0 }).collect();
            b.embed(table, &ok, out)?;
            let mut o = b.read(out);
            let h = o.len() / ids.len().max(1);
            for (r, _) in ids.iter().enumerate().filter(|(_, i)| **i as usize >= vocab) {
                o[r * h..(r + 1) * h].fill(f32::NAN);
            }
            *out = b.upload(&o);
            Ok(())
        }
        r => r,
    }
}

/// [`Sampling::embed_held`]'s shape check: every `(row, pick)` names a row of `rows` and a pick of `words / 3`.
pub fn check_held(rows: usize, words: usize, from: &[(usize, usize)]) -> Result<(), KernelError> {
    let shape = |what, got, want| Err(KernelError::Shape { kernel: "embed_held", what, got, want });
    if !words.is_multiple_of(3) {
        return shape("held words", words, words / 3 * 3);
    }
    for &(row, pick) in from {
        if row >= rows {
            return shape("held row", row, rows);
        }
        if pick >= words / 3 {
            return shape("held pick", pick, words / 3);
        }
    }
    Ok(())
}

/// Best of 5 host copies of 512 MiB, in bytes moved (read + write) per second.
pub fn host_copy_bandwidth() -> f64 {
    let n = 512 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    2.0 * n as f64 / best
}

/// [`Ops::moe_combine_add_rmsnorm`] as its steps: [`Ops::moe_combine`] into a scratch row set, then
/// [`Ops::add_rmsnorm`] (or [`Ops::add`] without a norm). The trait's default, and a fusing backend's
/// unfused form.
#[allow(clippy::too_many_arguments)]
pub fn combine_then_add_rmsnorm<B: Ops + ?Sized>(
    b: &B,
    (y, wts): (&B::Buf, &B::Buf),
    rows: usize,
    k: usize,
    acc: &mut B::Buf,
    norm: Option<(&B::Buf, f32)>,
    width: usize,
    out: &mut B::Buf,
) -> Result<(), KernelError> {
    let mut mixed = b.scratch(rows * width);
    b.moe_combine(y, wts, rows, k, &mut mixed)?;
    match norm {
        Some((weight, eps)) => b.add_rmsnorm(acc, &mixed, weight, eps, width, out),
        None => b.add(acc, &mixed),
    }
    Ok(())
}
