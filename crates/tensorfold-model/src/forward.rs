//! The LFM2 / LFM2-MoE forward over a table of rows and segments, generic over the `Backend`, with each
//! stream's state (KV rows per attention layer, conv state per conv layer).

use crate::config::{Mixer, ModelConfig};
use crate::drafter::{DraftBlock, DraftState, Drafter, HeldBlocks, HeldRows, Picker};
use crate::expert_parallel::MoeCall;
use crate::weights::{FfnWeights, MixerWeights, Weights};
use tensorfold_kernels::sample::{DrawSpec, SampleError};
use tensorfold_kernels::{Backend, KernelError, MoeParams, Pick, RopeParams, Segment};

/// A forward that could not run. Checked before any state changes, so a refused call leaves every
/// stream as it was.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ForwardError {
    /// A kernel refused its inputs.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A row would pass the model's context.
    #[error("position {pos} is past the context of {max} tokens")]
    ContextFull { pos: usize, max: usize },
    /// A token id past the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    /// A segment's start disagrees with its stream's position (an engine fault).
    #[error("segment of stream {cache} starts at {start} but the stream is at {pos}")]
    Position { cache: usize, start: usize, pos: usize },
    /// The call has no rows, or its segments do not cover them.
    #[error("invalid batch: {0}")]
    Batch(String),
    /// The drafter scored a non-finite value or picked past the vocabulary: refused, never a silent draft.
    #[error("DraftNonfinite: the drafter's score for block row {row} of stream {stream} is not finite")]
    DraftNonfinite { stream: usize, row: usize },
    /// Drafts were asked of a model without a drafter.
    #[error("no drafter is attached")]
    NoDrafter,
}

/// One layer's state of one stream.
pub enum LayerState<B: Backend> {
    /// KV rows of an attention layer.
    Kv(B::Kv),
    /// Conv state of a conv layer.
    Conv(B::Conv),
}

/// A stream's state: one entry per layer, and the number of positions it has consumed. `Clone` is a
/// snapshot (KV rows and conv states at the same position), as the prompt cache keeps them.
pub struct StreamState<B: Backend> {
    /// Per-layer state, in layer order.
    pub layers: Vec<LayerState<B>>,
    /// Positions consumed (equals the KV rows of every attention layer).
    pub pos: usize,
    /// Position of the last call's first row: [`Model::keep`] can roll back to any position from here.
    pub last_start: usize,
    /// The drafter's context (with a drafter attached): K/V of every consumed position.
    pub draft: Option<DraftState<B>>,
}

impl<B: Backend> Clone for LayerState<B> {
    fn clone(&self) -> Self {
        match self {
            LayerState::Kv(k) => LayerState::Kv(k.clone()),
            LayerState::Conv(c) => LayerState::Conv(c.clone()),
        }
    }
}

impl<B: Backend> Clone for StreamState<B> {
    fn clone(&self) -> Self {
        Self { layers: self.layers.clone(), pos: self.pos, last_start: self.last_start, draft: self.draft.clone() }
    }
}

/// Which rows of a call get logits.
#[derive(Clone, Debug, PartialEq)]
pub enum LogitRows {
    /// Every row (verify windows, `tensorfold exact`).
    All,
    /// The last row of each segment (prefill chunks, decode).
    Last,
    /// These call rows, in this order (verify windows beside prompt chunks).
    Rows(Vec<usize>),
    /// These call rows, each drawn where its logits live and/or copied to the host; an empty list skips the
    /// head (a prompt chunk before the last).
    Want(Vec<RowWant>),
}

/// One call row the head serves under [`LogitRows::Want`].
#[derive(Clone, Debug, PartialEq)]
pub struct RowWant {
    /// The call row.
    pub row: usize,
    /// Its keyed draw ([`tensorfold_kernels::Backend::draw_rows`]), if any.
    pub draw: Option<DrawSpec>,
    /// Copy its logits to the host (logprobs).
    pub logits: bool,
}

/// Logits, greedy picks and draws of the rows that asked for them.
#[derive(Clone, Debug)]
pub struct ForwardOut {
    /// Call rows that have logits, in order.
    pub rows: Vec<usize>,
    /// `[rows.len(), vocab]` f32; under [`LogitRows::Want`] only the rows that asked for logits, in order.
    pub logits: Vec<f32>,
    /// Greedy pick of each logits row (first largest; non-finite rows flagged); empty under [`LogitRows::Want`].
    pub picks: Vec<Pick>,
    /// Under [`LogitRows::Want`], each row's draw (`None` where none was asked); empty otherwise.
    pub draws: Vec<Option<Result<u32, SampleError>>>,
}

/// A loaded model on a backend.
pub struct Model<B: Backend> {
    /// Admitted config.
    pub cfg: ModelConfig,
    /// Weights on the device.
    pub weights: Weights<B>,
    /// The backend.
    pub backend: B,
    /// The DSpark drafter, when one is attached: every forward then copies its tap layers' rows and the
    /// drafter absorbs them.
    pub drafter: Option<Drafter<B>>,
    /// The experts' other devices, with expert parallelism (`crate::expert_parallel`); `None` on one device.
    pub ep: Option<crate::expert_parallel::ExpertParallel<B>>,
}

impl<B: Backend> Model<B> {
    /// A fresh stream state at position 0.
    pub fn new_state(&self) -> StreamState<B> {
        let c = &self.cfg;
        let layers = c
            .layers
            .iter()
            .map(|m| match m {
                Mixer::Attention => LayerState::Kv(self.backend.new_kv(c.kv_heads * c.head_dim)),
                Mixer::Conv => LayerState::Conv(self.backend.new_conv(c.hidden, c.conv_taps)),
            })
            .collect();
        let draft = self.drafter.as_ref().map(|d| d.new_state(&self.backend));
        StreamState { layers, pos: 0, last_start: 0, draft }
    }

    /// Rolls a stream back to `pos` positions, anywhere from its last call's first row to its current
    /// position (a verify window whose later rows were rejected): KV rows are truncated and conv states
    /// restored to the row at `pos`, never left at the window's end.
    pub fn keep(&self, s: &mut StreamState<B>, pos: usize) -> Result<(), ForwardError> {
        if pos < s.last_start || pos > s.pos {
            return Err(ForwardError::Batch(format!(
                "cannot keep {pos} positions: the last call covered {}..{}",
                s.last_start, s.pos
            )));
        }
        if pos == s.pos {
            return Ok(());
        }
        for l in &mut s.layers {
            match l {
                LayerState::Kv(k) => self.backend.kv_truncate(k, pos),
                LayerState::Conv(c) => self.backend.conv_keep(c, pos - s.last_start)?,
            }
        }
        if let (Some(d), Some(ds)) = (&self.drafter, &mut s.draft) {
            d.truncate(&self.backend, ds, pos);
        }
        s.pos = pos;
        Ok(())
    }

    /// Bytes a stream's state holds now (KV rows and conv states, with a verify window's kept rows).
    pub fn state_bytes(&self, s: &StreamState<B>) -> usize {
        let draft = s.draft.as_ref().map_or(0, |d| d.kv.iter().map(|k| self.backend.kv_bytes(k)).sum());
        s.layers
            .iter()
            .map(|l| match l {
                LayerState::Kv(k) => self.backend.kv_bytes(k),
                LayerState::Conv(c) => self.backend.conv_bytes(c),
            })
            .sum::<usize>()
            + draft
    }

    /// Reserves KV room for `tokens` positions, so the stream never reallocates (memory admission).
    pub fn reserve(&self, s: &mut StreamState<B>, tokens: usize) {
        for l in &mut s.layers {
            if let LayerState::Kv(k) = l {
                self.backend.kv_reserve(k, tokens);
            }
        }
        for k in s.draft.iter_mut().flat_map(|d| d.kv.iter_mut()) {
            self.backend.kv_reserve(k, tokens);
        }
    }

    /// A copy to keep (prompt cache): the same position, without the last call's rollback window.
    pub fn snapshot(&self, s: &StreamState<B>) -> StreamState<B> {
        let mut c = s.clone();
        for l in &mut c.layers {
            if let LayerState::Conv(conv) = l {
                self.backend.conv_drop_window(conv);
            }
        }
        c.last_start = c.pos;
        c
    }

    /// Bytes a stream of `tokens` positions needs: f32 K and V rows of every attention layer, the conv
    /// states, and the activations of one decode row (memory admission's per-stream estimate).
    pub fn stream_bytes(&self, tokens: usize) -> usize {
        let c = &self.cfg;
        let attn = c.layers.iter().filter(|m| **m == Mixer::Attention).count();
        let conv = c.layers.len() - attn;
        let kv = attn * 2 * c.kv_heads * c.head_dim * 4 * tokens;
        let scratch = 4 * (8 * c.hidden + c.vocab + c.moe.as_ref().map_or(c.dense_inter, |m| m.inter * m.top_k) * 3);
        // Each conv layer keeps its state and the rows of its last call of at most 64 rows (a verify window).
        let window = (c.conv_taps.saturating_sub(1) * 2 + 64) * c.hidden * 4;
        let draft = self.drafter.as_ref().map_or(0, |d| d.context_bytes(tokens));
        kv + conv * window + scratch + draft
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> usize {
        let b = &self.backend;
        let w = &self.weights;
        let mut n = b.mat_bytes(&w.embed) + w.head.as_ref().map_or(0, |m| b.mat_bytes(m));
        for l in &w.layers {
            n += match &l.mixer {
                MixerWeights::Conv(c) => b.mat_bytes(&c.in_proj) + b.mat_bytes(&c.out_proj),
                MixerWeights::Attn(a) => [&a.q, &a.k, &a.v, &a.o].iter().map(|m| b.mat_bytes(m)).sum(),
            };
            n += match &l.ffn {
                FfnWeights::Dense(f) => b.mat_bytes(&f.w1) + b.mat_bytes(&f.w2) + b.mat_bytes(&f.w3),
                FfnWeights::Moe { gate, experts, .. } => {
                    b.mat_bytes(gate)
                        + experts
                            .iter()
                            .map(|f| b.mat_bytes(&f.w1) + b.mat_bytes(&f.w2) + b.mat_bytes(&f.w3))
                            .sum::<usize>()
                }
            };
        }
        n + self.drafter.as_ref().map_or(0, |d| d.weight_bytes(b))
    }

    /// Runs every layer once over all rows of `tokens`; `segs[i].cache` indexes `states`. On success each
    /// stream's position advances by its rows. Errors leave all states unchanged.
    pub fn forward(
        &self,
        tokens: &[u32],
        segs: &[Segment],
        states: &mut [&mut StreamState<B>],
        which: LogitRows,
    ) -> Result<ForwardOut, ForwardError> {
        self.forward_held(tokens, None, segs, states, which)
    }

    /// [`Model::forward`] where some rows' ids are held drafts ([`Model::draft_held`]): each [`HeldRows`] names rows
    /// of `tokens` (whose entries there are placeholders) that take a stream's picks on the device, so a verify
    /// window runs without reading the drafts first. Errors as `forward`, and [`ForwardError::Batch`] for held rows
    /// outside the call or the blocks.
    pub fn forward_held(
        &self,
        tokens: &[u32],
        held: Option<(&HeldBlocks<B>, &[HeldRows])>,
        segs: &[Segment],
        states: &mut [&mut StreamState<B>],
        which: LogitRows,
    ) -> Result<ForwardOut, ForwardError> {
        self.check(tokens, segs, states, &which)?;
        let from = held.map(|(blocks, runs)| held_picks(blocks, runs, tokens.len())).transpose()?;
        let c = &self.cfg;
        let (b, w) = (&self.backend, &self.weights);
        let rows = tokens.len();
        let h = c.hidden;
        let mut x = b.scratch(rows * h);
        match (held, &from) {
            (Some((blocks, _)), Some(from)) => b.embed_held(&w.embed, tokens, blocks.words(), from, &mut x)?,
            _ => b.embed(&w.embed, tokens, &mut x)?,
        }
        let mut normed = b.scratch(rows * h);
        let mut mixed = b.scratch(rows * h);
        let all: Vec<usize> = (0..rows).collect();
        let mut taps: Vec<(usize, B::Buf)> = Vec::new();
        // Each residual add is fused with the RMSNorm that follows it (`add_rmsnorm`, the same bits).
        if let Some(first) = w.layers.first() {
            b.rmsnorm(&x, &first.operator_norm, c.norm_eps, h, &mut normed);
        }
        for (i, layer) in w.layers.iter().enumerate() {
            match &layer.mixer {
                MixerWeights::Conv(cw) => {
                    let mut st: Vec<&mut B::Conv> = states.iter_mut().map(|s| conv_of(&mut s.layers[i])).collect();
                    let mut bcx = b.scratch(rows * 3 * h);
                    b.linear(&normed, rows, &cw.in_proj, cw.in_bias.as_ref(), &mut bcx);
                    let mut y = b.scratch(rows * h);
                    b.short_conv(&bcx, h, &cw.kernel, cw.kernel_bias.as_ref(), segs, &mut st, &mut y)?;
                    b.linear(&y, rows, &cw.out_proj, cw.out_bias.as_ref(), &mut mixed);
                }
                MixerWeights::Attn(aw) => {
                    let mut kv: Vec<&mut B::Kv> = states.iter_mut().map(|s| kv_of(&mut s.layers[i])).collect();
                    self.attention(&normed, aw, segs, &mut kv, &mut mixed)?;
                }
            }
            b.add_rmsnorm(&mut x, &mixed, &layer.ffn_norm, c.norm_eps, h, &mut normed);
            let next = w.layers.get(i + 1).map(|n| (&n.operator_norm, c.norm_eps));
            match &layer.ffn {
                FfnWeights::Dense(f) => {
                    b.swiglu(&normed, rows, f, &mut mixed);
                    match next {
                        Some((norm, eps)) => b.add_rmsnorm(&mut x, &mixed, norm, eps, h, &mut normed),
                        None => b.add(&mut x, &mixed),
                    }
                }
                FfnWeights::Moe { gate, bias, experts } => {
                    let m = c.moe.as_ref().expect("MoE weights imply a MoE config");
                    let p = MoeParams {
                        top_k: m.top_k,
                        norm_topk_prob: m.norm_topk_prob,
                        routed_scaling_factor: m.routed_scaling_factor,
                    };
                    let call = MoeCall { layer: i, gate, bias: bias.as_ref(), experts, p };
                    let o = self.moe_layer(&normed, rows, call)?;
                    // The combine, the residual add and the next norm: one step (the same bits as three).
                    b.moe_combine_add_rmsnorm((&o.y, &o.wts), rows, o.k, &mut x, next, h, &mut normed)?;
                }
            }
            // Taps: copy this layer's output rows only when a drafter reads them.
            if let Some(d) = &self.drafter {
                for (j, _) in d.cfg.taps.iter().enumerate().filter(|(_, l)| **l == i) {
                    taps.push((j, b.gather_rows(&x, h, &all)));
                }
            }
        }
        if let Some(d) = &self.drafter {
            taps.sort_by_key(|t| t.0);
            let taps: Vec<B::Buf> = taps.into_iter().map(|t| t.1).collect();
            let mut ds: Vec<&mut DraftState<B>> =
                states.iter_mut().map(|s| s.draft.as_mut().expect("a drafter implies drafter states")).collect();
            d.absorb(b, &taps, rows, segs, &mut ds)?;
        }
        for s in segs {
            states[s.cache].last_start = s.start_pos;
            states[s.cache].pos += s.rows;
        }
        let out = self.head(&x, segs, which);
        // The logits are read: a collective that failed on the way fails the call (its results may be garbage).
        if let Some(ep) = &self.ep {
            if out.rows.is_empty() {
                // No head ran (prompt chunks before their last): one value read waits for the collectives.
                b.read(&b.gather_rows(&x, h, &[0]));
            }
            ep.comm.check()?;
        }
        Ok(out)
    }

    /// The drafter's block pass for several streams: `anchors[i]` is stream i's pending token, at the
    /// stream's position; greedy drafts. Errors: [`ForwardError::NoDrafter`], a non-finite score, or a position
    /// mismatch.
    pub fn draft(
        &self,
        states: &[&StreamState<B>],
        anchors: &[u32],
        want_scores: bool,
    ) -> Result<Vec<DraftBlock>, ForwardError> {
        self.draft_with(states, anchors, want_scores, &[])
    }

    /// [`Model::draft`] with a [`Picker`](crate::drafter::Picker) per stream (`None` or missing: greedy drafts).
    pub fn draft_with(
        &self,
        states: &[&StreamState<B>],
        anchors: &[u32],
        want_scores: bool,
        pickers: &[Option<Picker>],
    ) -> Result<Vec<DraftBlock>, ForwardError> {
        let (d, at, ds) = self.draft_inputs(states, anchors)?;
        let head = self.weights.head.as_ref().unwrap_or(&self.weights.embed);
        d.block(&self.backend, (&self.weights.embed, head), &at, &ds, want_scores, pickers)
    }

    /// [`Model::draft_with`] with the picks held on the device for [`Model::forward_held`] (no confidences, no
    /// scores); the same errors, and a device failure recorded during the pass ([`Backend::check`]), except that a
    /// non-finite score is found by [`HeldBlocks::read`].
    pub fn draft_held(
        &self,
        states: &[&StreamState<B>],
        anchors: &[u32],
        pickers: &[Option<Picker>],
    ) -> Result<HeldBlocks<B>, ForwardError> {
        let (d, at, ds) = self.draft_inputs(states, anchors)?;
        let head = self.weights.head.as_ref().unwrap_or(&self.weights.embed);
        let held = d.block_held(&self.backend, (&self.weights.embed, head), &at, &ds, pickers)?;
        // A failure recorded on the way (out of memory) is the pass's error now, not the verify's later.
        self.backend.check()?;
        Ok(held)
    }

    /// A block pass's checked inputs: the drafter, `(anchor, position)` a stream, and the drafter states.
    #[allow(clippy::type_complexity)]
    fn draft_inputs<'a>(
        &'a self,
        states: &[&'a StreamState<B>],
        anchors: &[u32],
    ) -> Result<(&'a Drafter<B>, Vec<(u32, usize)>, Vec<&'a DraftState<B>>), ForwardError> {
        let d = self.drafter.as_ref().ok_or(ForwardError::NoDrafter)?;
        if let Some(&id) = anchors.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(ForwardError::TokenOutOfRange { id, vocab: self.cfg.vocab });
        }
        if anchors.len() != states.len() || anchors.is_empty() {
            return Err(ForwardError::Batch("one anchor a stream".into()));
        }
        let ds: Vec<&DraftState<B>> =
            states.iter().map(|s| s.draft.as_ref().ok_or(ForwardError::NoDrafter)).collect::<Result<_, _>>()?;
        let at: Vec<(u32, usize)> = anchors.iter().zip(states).map(|(&t, s)| (t, s.pos)).collect();
        Ok((d, at, ds))
    }

    fn attention(
        &self,
        normed: &B::Buf,
        aw: &crate::weights::AttnWeights<B>,
        segs: &[Segment],
        kv: &mut [&mut B::Kv],
        out: &mut B::Buf,
    ) -> Result<(), ForwardError> {
        let (b, c) = (&self.backend, &self.cfg);
        let rows = segs.iter().map(|s| s.rows).sum::<usize>();
        let (qd, kd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let rope = RopeParams { theta: c.rope_theta, head_dim: c.head_dim, interleaved: false };
        let (mut q, mut k, mut v) = (b.scratch(rows * qd), b.scratch(rows * kd), b.scratch(rows * kd));
        b.linears(normed, rows, &[&aw.q, &aw.k, &aw.v], &mut [&mut q, &mut k, &mut v]);
        b.qk_norm_rope_pair((&mut q, c.heads, &aw.q_norm), (&mut k, c.kv_heads, &aw.k_norm), c.norm_eps, rope, segs)?;
        let mut a = b.scratch(rows * qd);
        b.attention(&q, &k, &v, c.heads, c.kv_heads, segs, kv, &mut a)?;
        b.linear(&a, rows, &aw.o, None, out);
        Ok(())
    }

    /// Final norm, head and greedy pick of the rows that want logits; under [`LogitRows::Want`], the draws and
    /// the logits rows asked for instead.
    fn head(&self, x: &B::Buf, segs: &[Segment], which: LogitRows) -> ForwardOut {
        let n_rows = segs.iter().map(|s| s.first_row + s.rows).max().unwrap_or(0);
        let (b, c, w) = (&self.backend, &self.cfg, &self.weights);
        let (rows, wants) = match which {
            LogitRows::All => ((0..n_rows).collect(), None),
            LogitRows::Last => (segs.iter().map(|s| s.first_row + s.rows - 1).collect(), None),
            LogitRows::Rows(r) => (r, None),
            LogitRows::Want(w) => (w.iter().map(|w| w.row).collect::<Vec<_>>(), Some(w)),
        };
        if rows.is_empty() {
            return ForwardOut { rows, logits: Vec::new(), picks: Vec::new(), draws: Vec::new() };
        }
        let picked = b.gather_rows(x, c.hidden, &rows);
        let mut normed = b.scratch(rows.len() * c.hidden);
        b.rmsnorm(&picked, &w.final_norm, c.norm_eps, c.hidden, &mut normed);
        let mut logits = b.scratch(rows.len() * c.vocab);
        b.linear(&normed, rows.len(), w.head.as_ref().unwrap_or(&w.embed), None, &mut logits);
        let Some(wants) = wants else {
            let picks = b.greedy(&logits, c.vocab);
            return ForwardOut { rows, logits: b.read(&logits), picks, draws: Vec::new() };
        };
        // A subset of the logits rows, without a copy when it is all of them.
        let subset = |idx: &[usize]| (idx.len() < rows.len()).then(|| b.gather_rows(&logits, c.vocab, idx));
        let (drawn, specs): (Vec<usize>, Vec<DrawSpec>) =
            wants.iter().enumerate().filter_map(|(i, w)| w.draw.map(|d| (i, d))).unzip();
        let mut draws = vec![None; rows.len()];
        if !specs.is_empty() {
            let sub = subset(&drawn);
            for (i, r) in drawn.into_iter().zip(b.draw_rows(sub.as_ref().unwrap_or(&logits), c.vocab, &specs)) {
                draws[i] = Some(r);
            }
        }
        let read: Vec<usize> = (0..rows.len()).filter(|&i| wants[i].logits).collect();
        let host = match read.is_empty() {
            true => Vec::new(),
            false => b.read(subset(&read).as_ref().unwrap_or(&logits)),
        };
        ForwardOut { rows, logits: host, picks: Vec::new(), draws }
    }

    /// Validates a call before it touches any state.
    fn check(
        &self,
        tokens: &[u32],
        segs: &[Segment],
        states: &[&mut StreamState<B>],
        which: &LogitRows,
    ) -> Result<(), ForwardError> {
        if tokens.is_empty() || segs.is_empty() {
            return Err(ForwardError::Batch("no rows".into()));
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(ForwardError::TokenOutOfRange { id, vocab: self.cfg.vocab });
        }
        let mut covered = 0;
        let mut seen = vec![false; states.len()];
        for s in segs {
            let st = states
                .get(s.cache)
                .ok_or_else(|| ForwardError::Batch(format!("segment names stream {} of {}", s.cache, states.len())))?;
            if std::mem::replace(&mut seen[s.cache], true) {
                return Err(ForwardError::Batch(format!("two segments name stream {}", s.cache)));
            }
            if s.rows == 0 || s.first_row != covered {
                return Err(ForwardError::Batch("segments must cover the rows in order, each non-empty".into()));
            }
            if st.pos != s.start_pos {
                return Err(ForwardError::Position { cache: s.cache, start: s.start_pos, pos: st.pos });
            }
            // Every attention layer must hold exactly `pos` key rows, so no layer can refuse mid-forward.
            if let Some(held) = st.layers.iter().find_map(|l| match l {
                LayerState::Kv(k) => Some(self.backend.kv_len(k)).filter(|&n| n != st.pos),
                LayerState::Conv(_) => None,
            }) {
                return Err(ForwardError::Position { cache: s.cache, start: s.start_pos, pos: held });
            }
            if let Some(d) = &self.drafter {
                let held = st.draft.as_ref().and_then(|ds| ds.kv.first()).map(|k| self.backend.kv_len(k));
                if d.cfg.layers > 0 && held != Some(st.pos) {
                    return Err(ForwardError::Position { cache: s.cache, start: s.start_pos, pos: held.unwrap_or(0) });
                }
            }
            if s.start_pos + s.rows > self.cfg.max_positions {
                return Err(ForwardError::ContextFull { pos: s.start_pos + s.rows, max: self.cfg.max_positions });
            }
            covered += s.rows;
        }
        if covered != tokens.len() {
            return Err(ForwardError::Batch(format!("segments cover {covered} of {} rows", tokens.len())));
        }
        let asked: Vec<usize> = match which {
            LogitRows::Rows(r) => r.clone(),
            LogitRows::Want(w) => w.iter().map(|w| w.row).collect(),
            _ => Vec::new(),
        };
        if let Some(bad) = asked.iter().find(|&&i| i >= covered) {
            return Err(ForwardError::Batch(format!("logits asked for row {bad} of {covered}")));
        }
        Ok(())
    }
}

/// [`Backend::embed_held`]'s `(row, pick)` pairs of `runs`, each checked against the call's `rows` and the blocks.
fn held_picks<B: Backend>(
    blocks: &HeldBlocks<B>,
    runs: &[HeldRows],
    rows: usize,
) -> Result<Vec<(usize, usize)>, ForwardError> {
    let mut from = Vec::new();
    for r in runs {
        if r.stream >= blocks.streams() || r.count > blocks.block() || r.row + r.count > rows {
            return Err(ForwardError::Batch(format!(
                "held rows {}..{} of stream {} outside a call of {rows} rows or blocks of {} streams x {}",
                r.row,
                r.row + r.count,
                r.stream,
                blocks.streams(),
                blocks.block()
            )));
        }
        from.extend((0..r.count).map(|k| (r.row + k, blocks.pick(r.stream, k))));
    }
    Ok(from)
}

fn conv_of<B: Backend>(l: &mut LayerState<B>) -> &mut B::Conv {
    match l {
        LayerState::Conv(c) => c,
        LayerState::Kv(_) => unreachable!("layer plan and state agree by construction"),
    }
}

fn kv_of<B: Backend>(l: &mut LayerState<B>) -> &mut B::Kv {
    match l {
        LayerState::Kv(k) => k,
        LayerState::Conv(_) => unreachable!("layer plan and state agree by construction"),
    }
}
