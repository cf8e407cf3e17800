//! A stream's state (KV rows per attention layer, conv state per conv layer, the drafter's context) and what the
//! model does with it outside a forward: a fresh state, rollback, snapshots, reservation and sizes.

use crate::config::Mixer;
use crate::drafter::DraftState;
use crate::forward::{ForwardError, Model};
use tensorfold_kernels::{Backend, Segment};

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
    /// A forward failed after it began writing this state (its layers may stand at different positions): every
    /// later forward, rollback or snapshot of it is refused ([`ForwardError::Torn`]).
    pub torn: bool,
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
        let (pos, last_start, torn) = (self.pos, self.last_start, self.torn);
        Self { layers: self.layers.clone(), pos, last_start, draft: self.draft.clone(), torn }
    }
}

/// Layer `i`'s conv state of each stream, in stream order (layer `i` is a conv layer).
pub(crate) fn conv_states<'s, B: Backend>(states: &'s mut [&mut StreamState<B>], i: usize) -> Vec<&'s mut B::Conv> {
    states
        .iter_mut()
        .map(|s| match &mut s.layers[i] {
            LayerState::Conv(c) => c,
            LayerState::Kv(_) => unreachable!("layer plan and state agree by construction"),
        })
        .collect()
}

/// Layer `i`'s KV rows of each stream, in stream order (layer `i` is an attention layer).
pub(crate) fn kv_states<'s, B: Backend>(states: &'s mut [&mut StreamState<B>], i: usize) -> Vec<&'s mut B::Kv> {
    states
        .iter_mut()
        .map(|s| match &mut s.layers[i] {
            LayerState::Kv(k) => k,
            LayerState::Conv(_) => unreachable!("layer plan and state agree by construction"),
        })
        .collect()
}

/// After a failed forward that had begun writing states: every stream of the call is torn (`StreamState::torn`).
pub(crate) fn tear<B: Backend>(states: &mut [&mut StreamState<B>]) {
    states.iter_mut().for_each(|s| s.torn = true);
}

/// After a forward: each segment's stream has consumed its rows, and its rollback window starts at its first row.
pub(crate) fn advance<B: Backend>(states: &mut [&mut StreamState<B>], segs: &[Segment]) {
    for s in segs {
        states[s.cache].last_start = s.start_pos;
        states[s.cache].pos += s.rows;
    }
}

/// The name a stream-state call's wait goes by on the model's watch (`crate::watch`).
const STATE: &str = "stream state";

impl<B: Backend> Model<B> {
    /// A fresh stream state at position 0.
    pub fn new_state(&self) -> StreamState<B> {
        // Stream-state calls allocate on the device, which drains its queue when the pool is out of memory.
        let _waiting = self.watch.enter(STATE);
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
        StreamState { layers, pos: 0, last_start: 0, draft, torn: false }
    }

    /// Rolls a stream back to `pos` positions, anywhere from its last call's first row to its current
    /// position (a verify window whose later rows were rejected): KV rows are truncated and conv states
    /// restored to the row at `pos`, never left at the window's end. Errors: a torn state ([`ForwardError::Torn`]),
    /// a `pos` outside the last call ([`ForwardError::Batch`]), a conv kernel's refusal, or `DeviceLost` once the
    /// device is given up ([`Model::answered`]).
    pub fn keep(&self, s: &mut StreamState<B>, pos: usize) -> Result<(), ForwardError> {
        if s.torn {
            return Err(ForwardError::Torn);
        }
        if pos < s.last_start || pos > s.pos {
            return Err(ForwardError::Batch(format!(
                "cannot keep {pos} positions: the last call covered {}..{}",
                s.last_start, s.pos
            )));
        }
        if pos == s.pos {
            return Ok(());
        }
        let _waiting = self.waiting(STATE)?;
        for l in &mut s.layers {
            match l {
                LayerState::Kv(k) => self.backend.kv_truncate(k, pos),
                LayerState::Conv(c) => {
                    if let Err(e) = self.backend.conv_keep(c, pos - s.last_start) {
                        // Earlier layers are rolled back and later ones not: the state cannot run on.
                        s.torn = true;
                        return Err(e.into());
                    }
                }
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

    /// Reserves KV room for `tokens` positions and conv windows for verify windows of at most `verify_rows` rows
    /// (the engine's most drafts + 1; 1 without drafts), so the stream never reallocates and holds what
    /// [`Model::stream_bytes`] counted (memory admission). A call past `verify_rows` rows then keeps no window.
    /// Errors: the first layer's refusal, `KernelError::OutOfMemory` (that stream's alone: the state keeps its rows,
    /// and no other stream's call meets the failure) or `DeviceLost`; the layers after it are not reserved.
    pub fn reserve(&self, s: &mut StreamState<B>, tokens: usize, verify_rows: usize) -> Result<(), ForwardError> {
        let _waiting = self.watch.enter(STATE);
        for l in &mut s.layers {
            match l {
                LayerState::Kv(k) => self.backend.kv_reserve(k, tokens)?,
                LayerState::Conv(c) => self.backend.conv_reserve(c, verify_rows)?,
            }
        }
        for k in s.draft.iter_mut().flat_map(|d| d.kv.iter_mut()) {
            self.backend.kv_reserve(k, tokens)?;
        }
        Ok(())
    }

    /// A copy to keep (prompt cache, a group's followers): the same position, without the last call's rollback
    /// window. Errors: a torn state ([`ForwardError::Torn`]); a copy the device could not make (out of memory, a
    /// lost device: a device state's `Clone` records it, and the copy would be empty or zeroed), so a broken copy is
    /// never kept or resumed from.
    pub fn snapshot(&self, s: &StreamState<B>) -> Result<StreamState<B>, ForwardError> {
        if s.torn {
            return Err(ForwardError::Torn);
        }
        let _waiting = self.watch.enter(STATE);
        let mut c = s.clone();
        for l in &mut c.layers {
            if let LayerState::Conv(conv) = l {
                self.backend.conv_drop_window(conv);
            }
        }
        c.last_start = c.pos;
        // The copies are queued: sent now, so a failure to make them is this call's.
        self.backend.flush_check()?;
        Ok(c)
    }

    /// Bytes a stream of `tokens` positions needs: f32 K and V rows of every attention layer, the conv
    /// states with a window for verify windows of `verify_rows` rows ([`Model::reserve`]), and the activations of
    /// one decode row (memory admission's per-stream estimate). Saturating arithmetic: an absurd `tokens` gives
    /// `usize::MAX` (never fits), never a wrapped small number; monotone in `tokens`, which admission's bisection
    /// relies on.
    pub fn stream_bytes(&self, tokens: usize, verify_rows: usize) -> usize {
        let c = &self.cfg;
        let attn = c.layers.iter().filter(|m| **m == Mixer::Attention).count();
        let conv = c.layers.len() - attn;
        let per_token = [attn, 2, c.kv_heads, c.head_dim, 4].into_iter().fold(1usize, usize::saturating_mul);
        let kv = per_token.saturating_mul(tokens);
        // Each conv layer keeps its state, and a window of the state's rows and the last call's (a verify window).
        let keep = verify_rows.clamp(1, tensorfold_kernels::KEEP_ROWS);
        let window = c.conv_taps.saturating_sub(1).saturating_mul(2).saturating_add(keep).saturating_mul(c.hidden);
        let draft = self.drafter.as_ref().map_or(0, |d| d.context_bytes(tokens));
        kv.saturating_add(conv.saturating_mul(window).saturating_mul(4))
            .saturating_add(self.round_bytes(1))
            .saturating_add(draft)
    }

    /// Bytes of the activations of a round of `rows` rows (f32: the residual stream and its temporaries, a row's
    /// logits, the feed-forward's widest intermediate three times): the part of device memory that rounds, not
    /// streams, hold, so memory admission's default budget leaves it out. Saturating, as `stream_bytes`.
    pub fn round_bytes(&self, rows: usize) -> usize {
        let c = &self.cfg;
        let ffn = c.moe.as_ref().map_or(c.dense_inter, |m| m.inter.saturating_mul(m.top_k));
        let row = 8usize.saturating_mul(c.hidden).saturating_add(c.vocab).saturating_add(ffn.saturating_mul(3));
        row.saturating_mul(4).saturating_mul(rows)
    }
}
