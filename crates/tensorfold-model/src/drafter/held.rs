//! Held drafts (docs/drafter.md): a batch's drafted blocks left on the device for the verify to embed there, read
//! once after it; and the rows of a forward that take them.

use crate::forward::ForwardError;
use tensorfold_kernels::backend::{DRAWN, DRAWN_GREEDY};
use tensorfold_kernels::{Backend, KernelError};

/// A batch's drafted blocks left on the device (held drafts, docs/drafter.md): block row `k`'s `[token, status,
/// index]` words of every stream, `[block, streams, 3]` u32 bits in f32 slots, the layout [`Backend::draw_into`]
/// writes a row.
pub struct HeldBlocks<B: Backend> {
    pub(super) words: B::Buf,
    pub(super) streams: usize,
    pub(super) block: usize,
    pub(super) vocab: usize,
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
    /// device failure recorded before the read or by it ([`Backend::check`]) is every stream's error instead.
    pub fn read(&self, b: &B) -> Vec<Result<Vec<u32>, ForwardError>> {
        let failed = |e: KernelError| (0..self.streams).map(|_| Err(ForwardError::Kernel(e.clone()))).collect();
        if let Err(e) = b.check() {
            return failed(e);
        }
        let w = b.read(&self.words);
        // The read's own failure is this call's, not the next one's (a rollback, a state copy).
        if let Err(e) = b.check() {
            return failed(e);
        }
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
