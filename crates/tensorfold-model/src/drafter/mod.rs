//! The DSpark block drafter (docs/drafter.md): context K/V absorbed from the target's taps, a
//! non-causal block pass of the anchor and mask tokens, the Markov chain and the confidence head.

pub mod config;
pub mod weights;

use crate::checkpoint::{CheckpointError, Source, TensorTable};
use crate::config::ModelConfig;
use crate::forward::ForwardError;
use crate::weights::WeightError;
pub use config::{DrafterConfig, DrafterConfigError, MAX_BLOCK};
use tensorfold_kernels::backend::{DRAWN, DRAWN_GREEDY};
use tensorfold_kernels::sample::{DrawSpec, SamplingParams};
use tensorfold_kernels::{Backend, KernelError, RopeParams, Segment};
pub use weights::{DrafterBits, DrafterWeights};

/// Why a drafter checkpoint could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DrafterError {
    /// A file is missing, unreadable or corrupt.
    #[error("drafter: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// `config.json` refused.
    #[error(transparent)]
    Config(#[from] DrafterConfigError),
    /// A tensor does not fit the config.
    #[error("drafter: {0}")]
    Weights(#[from] WeightError),
}

/// A loaded drafter on a backend (its embedding and head are the target's).
pub struct Drafter<B: Backend> {
    /// Admitted config.
    pub cfg: DrafterConfig,
    /// Weights on the device.
    pub weights: DrafterWeights<B>,
}

/// One stream's drafter context: per drafter layer, the K/V of every position the target consumed.
pub struct DraftState<B: Backend> {
    /// Context K/V per drafter layer (rows = the target's position).
    pub kv: Vec<B::Kv>,
}

impl<B: Backend> Clone for DraftState<B> {
    fn clone(&self) -> Self {
        Self { kv: self.kv.clone() }
    }
}

/// A stream's keyed draft pick for sampled requests: block row `k` (the draft for position `first + k`) is the keyed
/// draw ([`tensorfold_kernels::sample::draw`]) of that row's scores with `params` at `first + k`, made where the
/// scores live (`Backend::draw_into`). The engine passes the request's params and the position after the anchor:
/// sharing the target's Gumbel noise couples the two draws, so a drafter close to the target proposes the token the
/// target will draw (lossless either way: only equal tokens are kept). Refused params draft the greedy pick; so does,
/// under CUDA, a top-p nucleus longer than the device's 2048-key window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Picker {
    /// The request's sampling parameters.
    pub params: SamplingParams,
    /// Position of block row 0's draft (the anchor's position + 1).
    pub first: u64,
}

/// The Markov chain's per-row device buffers, read after its last row: draw words `[streams * 3]`, confidence logits
/// `[streams]` (with a confidence head), scores `[streams, vocab]` (when asked).
struct ChainBufs<B: Backend> {
    words: Vec<B::Buf>,
    conf: Vec<B::Buf>,
    scores: Vec<B::Buf>,
}

/// A batch's drafted blocks left on the device (held drafts, docs/drafter.md): block row `k`'s `[token, status,
/// index]` words of every stream, `[block, streams, 3]` u32 bits in f32 slots, the layout [`Backend::draw_into`]
/// writes a row.
pub struct HeldBlocks<B: Backend> {
    words: B::Buf,
    streams: usize,
    block: usize,
    vocab: usize,
}

impl<B: Backend> HeldBlocks<B> {
    /// Streams of the batch.
    pub fn streams(&self) -> usize {
        self.streams
    }

    /// Drafts a stream holds (the drafter's block size).
    pub fn block(&self) -> usize {
        self.block
    }

    /// The words on the device (`[block, streams, 3]`).
    pub fn words(&self) -> &B::Buf {
        &self.words
    }

    /// The word triple of stream `stream`'s draft `k` (an index for [`Backend::embed_held`]).
    pub fn pick(&self, stream: usize, k: usize) -> usize {
        k * self.streams + stream
    }

    /// Every stream's drafts after the verify (one copy to the host), each refused as the synchronous read refuses
    /// it: a row whose status is not drawn, or whose id is past the vocabulary, makes that stream's block
    /// [`ForwardError::DraftNonfinite`] with `stream: 0` (the stream's own pass, as the engine's retry reports it). A
    /// device failure recorded before the read ([`Backend::check`]) is every stream's error instead.
    pub fn read(&self, b: &B) -> Vec<Result<Vec<u32>, ForwardError>> {
        if let Err(e) = b.check() {
            return (0..self.streams).map(|_| Err(ForwardError::Kernel(e.clone()))).collect();
        }
        let w = b.read(&self.words);
        (0..self.streams)
            .map(|i| {
                (0..self.block)
                    .map(|k| {
                        let at = 3 * self.pick(i, k);
                        let (t, status) = (w.get(at).map(|x| x.to_bits()), w.get(at + 1).map(|x| x.to_bits()));
                        match (t, status) {
                            (Some(t), Some(st)) if (st == DRAWN || st == DRAWN_GREEDY) && (t as usize) < self.vocab => {
                                Ok(t)
                            }
                            _ => Err(ForwardError::DraftNonfinite { stream: 0, row: k }),
                        }
                    })
                    .collect()
            })
            .collect()
    }
}

/// Rows of a forward whose ids are one stream's held drafts: rows `row .. row + count` of the call take drafts
/// `0 .. count` of stream `stream` of a [`HeldBlocks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldRows {
    /// First row of the call.
    pub row: usize,
    /// The stream's index in the blocks' batch.
    pub stream: usize,
    /// Drafts taken (at most the block).
    pub count: usize,
}

/// One stream's drafted block: `tokens[k]` proposes position `anchor_pos + k + 1`.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftBlock {
    /// The Markov chain's greedy picks `[block]`.
    pub tokens: Vec<u32>,
    /// `P(draft k accepted | drafts before it accepted)` `[block]` from the confidence head; empty without one.
    pub confidence: Vec<f32>,
    /// Markov-corrected scores `[block, vocab]` when asked for (tests, references); empty otherwise.
    pub scores: Vec<f32>,
}

/// Opens a drafter checkpoint directory against the target's config, its linears as stored.
pub fn open_drafter<B: Backend>(src: &Source, target: &ModelConfig, backend: &B) -> Result<Drafter<B>, DrafterError> {
    open_drafter_with(src, target, backend, DrafterBits::Stored)
}

/// Opens a drafter checkpoint with its linears in `bits` (`--drafter-bits 8`: 8-bit affine codes).
pub fn open_drafter_with<B: Backend>(
    src: &Source,
    target: &ModelConfig,
    backend: &B,
    bits: DrafterBits,
) -> Result<Drafter<B>, DrafterError> {
    let bytes = src
        .read("config.json")?
        .ok_or_else(|| CheckpointError::Missing { dir: src.describe(), file: "config.json".into() })?;
    let cfg = DrafterConfig::parse(&bytes, target)?;
    let table = TensorTable::open(src)?;
    let weights = weights::bind(&cfg, &table, backend, bits)?;
    Ok(Drafter { cfg, weights })
}

impl<B: Backend> Drafter<B> {
    fn rope(&self) -> RopeParams {
        RopeParams { theta: self.cfg.rope_theta, head_dim: self.cfg.head_dim, interleaved: self.cfg.interleaved }
    }

    /// An empty context.
    pub fn new_state(&self, b: &B) -> DraftState<B> {
        DraftState { kv: (0..self.cfg.layers).map(|_| b.new_kv(self.cfg.kv_heads * self.cfg.head_dim)).collect() }
    }

    /// Bytes of K/V a context of `tokens` positions holds (f32 K and V rows of every layer).
    pub fn context_bytes(&self, tokens: usize) -> usize {
        self.cfg.layers * 2 * self.cfg.kv_heads * self.cfg.head_dim * 4 * tokens
    }

    /// Bytes of the drafter's weights on the device.
    pub fn weight_bytes(&self, b: &B) -> usize {
        let w = &self.weights;
        let mut n = w.fc.iter().map(|m| b.mat_bytes(m)).sum::<usize>();
        n += b.mat_bytes(&w.markov_w1) + b.mat_bytes(&w.markov_w2);
        for l in &w.layers {
            n +=
                [&l.q, &l.k, &l.v, &l.o, &l.mlp.w1, &l.mlp.w2, &l.mlp.w3].iter().map(|m| b.mat_bytes(m)).sum::<usize>();
        }
        n
    }

    /// Absorbs the call's rows into each stream's context: `ctx = hidden_norm(fc(concat taps))`, then every
    /// layer's `k_norm(k_proj(ctx))` with RoPE and `v_proj(ctx)` appended at the segments' positions.
    /// `taps[j]` is `[rows, d]`, the output of target layer `cfg.taps[j]` for every row of the call.
    pub fn absorb(
        &self,
        b: &B,
        taps: &[B::Buf],
        rows: usize,
        segs: &[Segment],
        states: &mut [&mut DraftState<B>],
    ) -> Result<(), KernelError> {
        let (c, w) = (&self.cfg, &self.weights);
        let d = c.hidden;
        let mut pre = b.zeros(rows * d);
        let mut part = b.zeros(rows * d);
        for (j, (tap, fc)) in taps.iter().zip(&w.fc).enumerate() {
            // Tap 0 lands in `pre`; later taps are added in tap order (a fixed order: row-invariant).
            b.linear(tap, rows, fc, None, if j == 0 { &mut pre } else { &mut part });
            if j > 0 {
                b.add(&mut pre, &part);
            }
        }
        let mut ctx = b.zeros(rows * d);
        b.rmsnorm(&pre, &w.hidden_norm, c.eps, d, &mut ctx);
        let kd = c.kv_heads * c.head_dim;
        for (l, lw) in w.layers.iter().enumerate() {
            let (mut k, mut v) = (b.zeros(rows * kd), b.zeros(rows * kd));
            b.linears(&ctx, rows, &[&lw.k, &lw.v], &mut [&mut k, &mut v]);
            b.qk_norm_rope(&mut k, c.kv_heads, &lw.k_norm, c.eps, self.rope(), segs)?;
            let mut caches: Vec<&mut B::Kv> = states.iter_mut().map(|s| &mut s.kv[l]).collect();
            b.kv_append(&k, &v, segs, &mut caches)?;
        }
        Ok(())
    }

    /// Drops context rows past `pos` (the target rolled back to `pos` positions).
    pub fn truncate(&self, b: &B, s: &mut DraftState<B>, pos: usize) {
        for kv in &mut s.kv {
            b.kv_truncate(kv, pos);
        }
    }

    /// The block pass for several streams at once: stream i's block is `[anchors[i].0, mask x (B-1)]` at
    /// positions `anchors[i].1 ..`, which must equal its context length. `embed`/`head` are the target's
    /// `[vocab, d]` tables. `pickers[i]`, when present, picks stream i's drafts instead of the greedy chain (see
    /// [`Picker`]). Returns one block per stream; a non-finite score is [`ForwardError::DraftNonfinite`].
    pub fn block(
        &self,
        b: &B,
        tables: (&B::Mat, &B::Mat),
        anchors: &[(u32, usize)],
        states: &[&DraftState<B>],
        want_scores: bool,
        pickers: &[Option<Picker>],
    ) -> Result<Vec<DraftBlock>, ForwardError> {
        let kept = self.chain(b, tables, anchors, states, (want_scores, true), pickers)?;
        self.read_blocks(b, anchors.len(), &kept)
    }

    /// [`Drafter::block`] with the picks left on the device (held drafts, no confidences): a verify embeds them
    /// ([`Backend::embed_held`]) and reads them after ([`HeldBlocks::read`]). Errors before any pick exists (a
    /// bad anchor, a context mismatch) are returned here; a non-finite score only by the read.
    pub fn block_held(
        &self,
        b: &B,
        tables: (&B::Mat, &B::Mat),
        anchors: &[(u32, usize)],
        states: &[&DraftState<B>],
        pickers: &[Option<Picker>],
    ) -> Result<HeldBlocks<B>, ForwardError> {
        let kept = self.chain(b, tables, anchors, states, (false, false), pickers)?;
        let words = b.concat(&kept.words.iter().collect::<Vec<_>>());
        Ok(HeldBlocks { words, streams: anchors.len(), block: kept.words.len(), vocab: self.cfg.vocab })
    }

    /// The block's layers, head and Markov chain, leaving every row's picks on the device; `keep` = (scores,
    /// confidences) to keep too.
    fn chain(
        &self,
        b: &B,
        (embed, head): (&B::Mat, &B::Mat),
        anchors: &[(u32, usize)],
        states: &[&DraftState<B>],
        keep: (bool, bool),
        pickers: &[Option<Picker>],
    ) -> Result<ChainBufs<B>, ForwardError> {
        let (c, w) = (&self.cfg, &self.weights);
        let (n, bs, d, v) = (anchors.len(), c.block, c.hidden, c.vocab);
        let rows = n * bs;
        let tokens: Vec<u32> = anchors
            .iter()
            .flat_map(|&(t, _)| std::iter::once(t).chain(std::iter::repeat_n(c.mask_id, bs - 1)))
            .collect();
        let segs: Vec<Segment> = anchors
            .iter()
            .enumerate()
            .map(|(i, &(_, pos))| Segment { first_row: i * bs, rows: bs, start_pos: pos, cache: i })
            .collect();
        let mut h = b.zeros(rows * d);
        b.embed(embed, &tokens, &mut h)?;
        for (l, lw) in w.layers.iter().enumerate() {
            let caches: Vec<&B::Kv> = states.iter().map(|s| &s.kv[l]).collect();
            self.layer(b, lw, &mut h, rows, &segs, &caches)?;
        }
        let mut y = b.zeros(rows * d);
        b.rmsnorm(&h, &w.norm, c.eps, d, &mut y);
        let mut logits = b.zeros(rows * v);
        b.linear(&y, rows, head, None, &mut logits);
        self.markov(b, (&logits, &y), anchors, keep, pickers)
    }

    fn layer(
        &self,
        b: &B,
        lw: &weights::DrafterLayer<B>,
        h: &mut B::Buf,
        rows: usize,
        segs: &[Segment],
        caches: &[&B::Kv],
    ) -> Result<(), KernelError> {
        let c = &self.cfg;
        let (d, qd, kd) = (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let mut x = b.zeros(rows * d);
        b.rmsnorm(h, &lw.in_norm, c.eps, d, &mut x);
        let (mut q, mut k, mut v) = (b.zeros(rows * qd), b.zeros(rows * kd), b.zeros(rows * kd));
        b.linears(&x, rows, &[&lw.q, &lw.k, &lw.v], &mut [&mut q, &mut k, &mut v]);
        b.qk_norm_rope_pair((&mut q, c.heads, &lw.q_norm), (&mut k, c.kv_heads, &lw.k_norm), c.eps, self.rope(), segs)?;
        let mut a = b.zeros(rows * qd);
        b.block_attention(&q, &k, &v, c.heads, c.kv_heads, segs, caches, &mut a)?;
        let mut o = b.zeros(rows * d);
        b.linear(&a, rows, &lw.o, None, &mut o);
        b.add(h, &o);
        b.rmsnorm(h, &lw.post_norm, c.eps, d, &mut x);
        b.swiglu(&x, rows, &lw.mlp, &mut o);
        b.add(h, &o);
        Ok(())
    }

    /// Block row `k`'s draw specs, one a stream: its picker's keyed draw at `first + k`, or the greedy pick.
    fn specs(pickers: &[Option<Picker>], n: usize, k: usize) -> Vec<DrawSpec> {
        (0..n)
            .map(|i| match pickers.get(i).copied().flatten() {
                Some(p) => DrawSpec { params: p.params, position: p.first + k as u64 },
                None => DrawSpec { params: SamplingParams::greedy(), position: 0 },
            })
            .collect()
    }

    /// The Markov chain, one block row at a time for all streams: `s_k = logits_k + W2 . W1[prev_k]`, the greedy
    /// pick (ties to the lowest id) or the stream's keyed draw ([`Picker`]), and the confidence
    /// `sigmoid(w . [y_k ; W1[prev_k]] + b)`. Each row's picks stay where the scores live and feed the next row
    /// (`Backend::draw_into`, `Backend::embed_words`); the host reads the block's picks, confidences and scores only
    /// after the last row (one wait for the device, then a copy a row).
    fn markov(
        &self,
        b: &B,
        (logits, y): (&B::Buf, &B::Buf),
        anchors: &[(u32, usize)],
        (want_scores, want_conf): (bool, bool),
        pickers: &[Option<Picker>],
    ) -> Result<ChainBufs<B>, ForwardError> {
        let (c, w) = (&self.cfg, &self.weights);
        let (n, bs, d, v, r) = (anchors.len(), c.block, c.hidden, c.vocab, c.markov_rank);
        let anchor_ids: Vec<u32> = anchors.iter().map(|a| a.0).collect();
        let mut kept = ChainBufs::<B> { words: Vec::new(), conf: Vec::new(), scores: Vec::new() };
        for k in 0..bs {
            let rows_k: Vec<usize> = (0..n).map(|i| i * bs + k).collect();
            let mut s = b.gather_rows(logits, v, &rows_k);
            let mut m1 = b.zeros(n * r);
            match kept.words.last() {
                None => b.embed(&w.markov_w1, &anchor_ids, &mut m1)?,
                Some(prev) => b.embed_words(&w.markov_w1, prev, n, &mut m1)?,
            }
            let mut m2 = b.zeros(n * v);
            b.linear(&m1, n, &w.markov_w2, None, &mut m2);
            b.add(&mut s, &m2);
            let mut picked = b.zeros(3 * n);
            b.draw_into(&s, v, &Self::specs(pickers, n, k), &mut picked);
            kept.words.push(picked);
            if let Some((wy, wm, _)) = w.confidence.as_ref().filter(|_| want_conf) {
                let yk = b.gather_rows(y, d, &rows_k);
                let (mut cy, mut cm) = (b.zeros(n), b.zeros(n));
                b.linear(&yk, n, wy, None, &mut cy);
                b.linear(&m1, n, wm, None, &mut cm);
                b.add(&mut cy, &cm);
                kept.conf.push(cy);
            }
            if want_scores {
                kept.scores.push(s);
            }
        }
        Ok(kept)
    }

    /// The blocks of `n` streams from the chain's per-row device buffers: each row's draw words (a status other than
    /// drawn is [`ForwardError::DraftNonfinite`]), confidence logits `w . [y ; W1[prev]]` and, when kept, scores.
    fn read_blocks(&self, b: &B, n: usize, kept: &ChainBufs<B>) -> Result<Vec<DraftBlock>, ForwardError> {
        let v = self.cfg.vocab;
        let mut out: Vec<DraftBlock> =
            (0..n).map(|_| DraftBlock { tokens: Vec::new(), confidence: Vec::new(), scores: Vec::new() }).collect();
        for (k, wk) in kept.words.iter().enumerate() {
            let wk = b.read(wk);
            for (i, blk) in out.iter_mut().enumerate() {
                let (t, status) = (wk[3 * i].to_bits(), wk[3 * i + 1].to_bits());
                if !(status == DRAWN || status == DRAWN_GREEDY) || t as usize >= v {
                    return Err(ForwardError::DraftNonfinite { stream: i, row: k });
                }
                blk.tokens.push(t);
            }
        }
        let bias = self.weights.confidence.as_ref().map_or(0.0, |cw| cw.2);
        for c in &kept.conf {
            // `add` is the f32 sum cy + cm, the order the host used.
            let c = b.read(c);
            for (i, blk) in out.iter_mut().enumerate() {
                blk.confidence.push(1.0 / (1.0 + (-(c[i] + bias)).exp()));
            }
        }
        for sk in &kept.scores {
            let sk = b.read(sk);
            for (i, blk) in out.iter_mut().enumerate() {
                blk.scores.extend_from_slice(&sk[i * v..(i + 1) * v]);
            }
        }
        Ok(out)
    }
}
