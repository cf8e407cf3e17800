//! A fake target for engine and server tests: each row's logits are a hash of the WHOLE token history its stream
//! was fed, up to and including that row, so any position, ordering or rollback bug changes every later token; and
//! the same target with one stream length's state reserve refused (out of memory, or a lost device).

use crate::target::{Caps, ForwardCall, SegOut, Target, host_forward};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tensorfold_kernels::{KernelError, Segment};
use tensorfold_model::ForwardError;

/// The last entry of a fake state that a failed forward tore ([`Target::torn`]): such a state is refused by every
/// later forward ([`ForwardError::Torn`]), as the model's is.
pub const TORN: u32 = u32::MAX;

/// Whether a fake state ends in [`TORN`].
fn is_torn(s: &[u32]) -> bool {
    s.last() == Some(&TORN)
}

/// The fake target: `vocab` logits a row, a context limit, and stop ids.
#[derive(Clone, Debug)]
pub struct FakeTarget {
    /// Logits a row.
    pub vocab: usize,
    /// Context limit.
    pub context: usize,
    /// End-of-sequence ids.
    pub eos: Vec<u32>,
    /// Bytes a position costs in memory admission.
    pub bytes_per_token: usize,
    /// Added to the logit of the token that followed the previous occurrence of the last token (0: none),
    /// so text repeats and context copies get accepted.
    pub copy_bias: f32,
}

impl FakeTarget {
    /// A target with 64 logits a row, a 4,096-token context and EOS id 0.
    pub fn new() -> Self {
        Self { vocab: 64, context: 4096, eos: vec![0], bytes_per_token: 1024, copy_bias: 0.0 }
    }

    /// Logits of the row that ends `history`: pseudo-random in [-4, 4), a function of every token and its position.
    pub fn logits(&self, history: &[u32]) -> Vec<f32> {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for (i, &t) in history.iter().enumerate() {
            h = mix(h ^ ((i as u64) << 32 | t as u64));
        }
        let mut l: Vec<f32> = (0..self.vocab as u64)
            .map(|v| (mix(h ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0)
            .collect();
        if let Some((&last, before)) = history.split_last()
            && let Some(j) = before.iter().rposition(|&t| t == last)
        {
            l[history[j + 1] as usize] += self.copy_bias;
        }
        l
    }

    /// Feeds each segment's rows to its state and returns, in segment order, the logits of its last row
    /// (`[vocab]`), or of every row when `all_rows[i]` (`[rows * vocab]`). Refuses a torn state, a segment off its
    /// stream's position or an id past the vocabulary before touching any state.
    pub fn forward_logits(
        &self,
        tokens: &[u32],
        segs: &[Segment],
        states: &mut [&mut Vec<u32>],
        all_rows: &[bool],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        for s in segs {
            let st = states.get(s.cache).ok_or_else(|| ForwardError::Batch(format!("no stream {}", s.cache)))?;
            if is_torn(st) {
                return Err(ForwardError::Torn);
            }
            if st.len() != s.start_pos {
                return Err(ForwardError::Position { cache: s.cache, start: s.start_pos, pos: st.len() });
            }
            if let Some(&id) = tokens[s.first_row..s.first_row + s.rows].iter().find(|&&t| t as usize >= self.vocab) {
                return Err(ForwardError::TokenOutOfRange { id, vocab: self.vocab });
            }
        }
        Ok(segs
            .iter()
            .zip(all_rows.iter().chain(std::iter::repeat(&false)))
            .map(|(s, &all)| {
                let st = &mut states[s.cache];
                let mut out = Vec::new();
                for (i, &t) in tokens[s.first_row..s.first_row + s.rows].iter().enumerate() {
                    st.push(t);
                    if all || i + 1 == s.rows {
                        out.extend(self.logits(st));
                    }
                }
                out
            })
            .collect())
    }
}

impl Default for FakeTarget {
    fn default() -> Self {
        Self::new()
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Target for FakeTarget {
    type State = Vec<u32>;
    type Held = ();

    fn caps(&self) -> Caps {
        // The model target's window limit, so the engine's tests size windows as it does.
        Caps {
            vocab: self.vocab,
            context: self.context,
            eos: self.eos.clone(),
            max_draft: crate::model_target::MAX_DRAFT,
            holds_drafts: false,
        }
    }

    fn new_state(&self) -> Vec<u32> {
        Vec::new()
    }

    fn pos(&self, s: &Vec<u32>) -> usize {
        s.len()
    }

    fn state_bytes(&self, s: &Vec<u32>) -> usize {
        s.len() * self.bytes_per_token
    }

    fn stream_bytes(&self, tokens: usize, _verify_rows: usize) -> usize {
        tokens.saturating_mul(self.bytes_per_token)
    }

    fn forward(&self, call: &ForwardCall<'_, ()>, states: &mut [&mut Vec<u32>]) -> Result<Vec<SegOut>, ForwardError> {
        host_forward(call, self.vocab, |all| self.forward_logits(call.tokens, call.segs, states, all))
    }

    fn torn(&self, s: &Vec<u32>) -> bool {
        is_torn(s)
    }

    fn snapshot(&self, s: &Vec<u32>) -> Result<Vec<u32>, ForwardError> {
        if is_torn(s) {
            return Err(ForwardError::Torn);
        }
        Ok(s.clone())
    }

    fn keep(&self, s: &mut Vec<u32>, pos: usize) -> Result<(), ForwardError> {
        if is_torn(s) {
            return Err(ForwardError::Torn);
        }
        if pos > s.len() {
            return Err(ForwardError::Batch(format!("cannot keep {pos} of {} positions", s.len())));
        }
        s.truncate(pos);
        Ok(())
    }
}

/// The fake target, except that reserving the state of a stream of `tokens` positions (prompt plus `max_tokens`)
/// fails as a device out of memory would (`KernelError::OutOfMemory` from `kv_reserve`), or with `lost` as a lost
/// one. `refused` counts the reserves it failed.
#[derive(Clone)]
pub struct RefusedReserve {
    /// The target that does the work.
    pub inner: FakeTarget,
    /// The refused stream's positions.
    pub tokens: usize,
    /// Fail as a lost device rather than out of memory.
    pub lost: bool,
    /// Reserves failed so far.
    pub refused: Arc<AtomicUsize>,
}

impl RefusedReserve {
    /// Refuses streams of `tokens` positions, out of memory.
    pub fn new(inner: FakeTarget, tokens: usize) -> Self {
        Self { inner, tokens, lost: false, refused: Arc::default() }
    }
}

impl Target for RefusedReserve {
    type State = Vec<u32>;
    type Held = ();

    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn new_state(&self) -> Vec<u32> {
        self.inner.new_state()
    }
    fn pos(&self, s: &Vec<u32>) -> usize {
        self.inner.pos(s)
    }
    fn state_bytes(&self, s: &Vec<u32>) -> usize {
        self.inner.state_bytes(s)
    }
    fn stream_bytes(&self, tokens: usize, verify_rows: usize) -> usize {
        self.inner.stream_bytes(tokens, verify_rows)
    }
    fn forward(&self, call: &ForwardCall<'_, ()>, states: &mut [&mut Vec<u32>]) -> Result<Vec<SegOut>, ForwardError> {
        self.inner.forward(call, states)
    }
    fn torn(&self, s: &Vec<u32>) -> bool {
        self.inner.torn(s)
    }
    fn keep(&self, s: &mut Vec<u32>, pos: usize) -> Result<(), ForwardError> {
        self.inner.keep(s, pos)
    }
    fn reserve(&self, s: &mut Vec<u32>, tokens: usize, verify_rows: usize) -> Result<(), ForwardError> {
        if tokens != self.tokens {
            return self.inner.reserve(s, tokens, verify_rows);
        }
        self.refused.fetch_add(1, Ordering::SeqCst);
        Err(ForwardError::Kernel(if self.lost {
            KernelError::DeviceLost { kernel: "kv_reserve", message: "planted: GPU 0 stopped answering".into() }
        } else {
            KernelError::OutOfMemory { what: "kv_reserve", bytes: tokens * 1024 }
        }))
    }
}
