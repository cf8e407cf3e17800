//! The drafter's block pass: the anchor and mask rows through the drafter's layers (non-causal block attention
//! over each stream's context), the target's head, the Markov chain and the confidence head; its blocks read to
//! the host or held on the device.

use super::weights::DrafterLayer;
use super::{DraftBlock, DraftState, Drafter, HeldBlocks, Picker};
use crate::forward::ForwardError;
use tensorfold_kernels::backend::{DRAWN, DRAWN_GREEDY};
use tensorfold_kernels::sample::{DrawSpec, SamplingParams};
use tensorfold_kernels::{Backend, KernelError, Segment};

/// What a block pass leaves: the option of a draft call ([`crate::drafter::DraftBatch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftOut {
    /// Read each stream's block to the host ([`Drafts::Read`]): picks, confidences (with a confidence head) and,
    /// when `scores`, the Markov-corrected scores.
    Read {
        /// Keep the scores `[block, vocab]` (tests, references).
        scores: bool,
    },
    /// Leave the picks on the device for a verify to embed ([`Drafts::Held`]): no confidences, no scores.
    Held,
}

/// A block pass's blocks, as its [`DraftOut`] asked.
pub enum Drafts<B: Backend> {
    /// One block a stream, read.
    Read(Vec<DraftBlock>),
    /// Every stream's picks, on the device.
    Held(HeldBlocks<B>),
}

impl<B: Backend> Drafts<B> {
    /// The read blocks (`None` for held picks).
    pub fn blocks(self) -> Option<Vec<DraftBlock>> {
        match self {
            Self::Read(blocks) => Some(blocks),
            Self::Held(_) => None,
        }
    }

    /// The held picks (`None` for read blocks).
    pub fn held(self) -> Option<HeldBlocks<B>> {
        match self {
            Self::Held(held) => Some(held),
            Self::Read(_) => None,
        }
    }
}

/// A block pass's inputs: the target's tables and, per stream, its anchor and context.
pub struct BlockPass<'a, B: Backend> {
    /// The target's embedding `[vocab, d]`.
    pub embed: &'a B::Mat,
    /// The target's output head `[vocab, d]`.
    pub head: &'a B::Mat,
    /// Stream i's `(pending token, position)`; the position must equal its context length.
    pub anchors: &'a [(u32, usize)],
    /// Stream i's context.
    pub states: &'a [&'a DraftState<B>],
    /// Stream i's picker ([`Picker`]); `None` or missing: greedy drafts.
    pub pickers: &'a [Option<Picker>],
}

/// The Markov chain's per-row device buffers, read after its last row: draw words `[streams * 3]`, confidence logits
/// `[streams]` (with a confidence head), scores `[streams, vocab]` (when asked).
struct ChainBufs<B: Backend> {
    words: Vec<B::Buf>,
    conf: Vec<B::Buf>,
    scores: Vec<B::Buf>,
}

impl<B: Backend> Drafter<B> {
    /// The block pass for several streams at once: stream i's block is `[anchors[i].0, mask x (B-1)]` at positions
    /// `anchors[i].1 ..`. Returns, as `out` asks, one read block a stream (a non-finite score is
    /// [`ForwardError::DraftNonfinite`]) or the picks held on the device (errors before any pick exists, a bad anchor
    /// or a context mismatch, are returned here; a non-finite score only by [`HeldBlocks::read`]).
    pub fn pass(&self, b: &B, pass: &BlockPass<'_, B>, out: DraftOut) -> Result<Drafts<B>, ForwardError> {
        match out {
            DraftOut::Read { scores } => {
                let kept = self.chain(b, pass, (scores, true))?;
                Ok(Drafts::Read(self.read_blocks(b, pass.anchors.len(), &kept)?))
            }
            DraftOut::Held => {
                let kept = self.chain(b, pass, (false, false))?;
                let words = b.concat(&kept.words.iter().collect::<Vec<_>>());
                let (streams, block, vocab) = (pass.anchors.len(), kept.words.len(), self.cfg.vocab);
                Ok(Drafts::Held(HeldBlocks { words, streams, block, vocab }))
            }
        }
    }

    /// The block's layers, head and Markov chain, leaving every row's picks on the device; `keep` = (scores,
    /// confidences) to keep too.
    fn chain(&self, b: &B, pass: &BlockPass<'_, B>, keep: (bool, bool)) -> Result<ChainBufs<B>, ForwardError> {
        let (c, w) = (&self.cfg, &self.weights);
        let (n, bs, d, v) = (pass.anchors.len(), c.block, c.hidden, c.vocab);
        let rows = n * bs;
        let tokens: Vec<u32> = pass
            .anchors
            .iter()
            .flat_map(|&(t, _)| std::iter::once(t).chain(std::iter::repeat_n(c.mask_id, bs - 1)))
            .collect();
        let segs: Vec<Segment> = pass
            .anchors
            .iter()
            .enumerate()
            .map(|(i, &(_, pos))| Segment { first_row: i * bs, rows: bs, start_pos: pos, cache: i })
            .collect();
        let mut h = b.zeros(rows * d);
        b.embed(pass.embed, &tokens, &mut h)?;
        for (l, lw) in w.layers.iter().enumerate() {
            let caches: Vec<&B::Kv> = pass.states.iter().map(|s| &s.kv[l]).collect();
            self.layer(b, lw, &mut h, rows, &segs, &caches)?;
        }
        let mut y = b.zeros(rows * d);
        b.rmsnorm(&h, &w.norm, c.eps, d, &mut y);
        let mut logits = b.zeros(rows * v);
        b.linear(&y, rows, pass.head, None, &mut logits);
        self.markov(b, (&logits, &y), pass, keep)
    }

    fn layer(
        &self,
        b: &B,
        lw: &DrafterLayer<B>,
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
        pass: &BlockPass<'_, B>,
        (want_scores, want_conf): (bool, bool),
    ) -> Result<ChainBufs<B>, ForwardError> {
        let (c, w) = (&self.cfg, &self.weights);
        let (n, bs, d, v, r) = (pass.anchors.len(), c.block, c.hidden, c.vocab, c.markov_rank);
        let anchor_ids: Vec<u32> = pass.anchors.iter().map(|a| a.0).collect();
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
            b.draw_into(&s, v, &Self::specs(pass.pickers, n, k), &mut picked);
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
                blk.confidence.push(1.0 / (1.0 + tensorfold_kernels::simd::exp::expf(-(c[i] + bias))));
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
