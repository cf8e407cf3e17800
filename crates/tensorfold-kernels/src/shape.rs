//! The shape checks every backend runs before a call touches any state, written once: buffer lengths, the segment
//! table (every row in exactly one segment, distinct caches inside the slice) and each stream's cache state. The CPU
//! and CUDA impls call these, so a refused call is refused by the same check, with the same error, on both.

use crate::backend::{KernelError, Segment};

/// A buffer of `got` elements where the call's shape says `want`: [`KernelError::Shape`] naming `kernel` and `what`.
pub fn check_len(kernel: &'static str, what: &'static str, got: usize, want: usize) -> Result<(), KernelError> {
    if got == want { Ok(()) } else { Err(KernelError::Shape { kernel, what, got, want }) }
}

/// Absolute position of every row of a call, from its segments. Errors on overlapping or missing rows.
pub fn row_positions(segs: &[Segment], rows: usize) -> Result<Vec<usize>, KernelError> {
    let mut pos = vec![usize::MAX; rows];
    for s in segs {
        if s.first_row + s.rows > rows {
            return Err(KernelError::Segments(format!(
                "segment rows {}..{} past {rows}",
                s.first_row,
                s.first_row + s.rows
            )));
        }
        for i in 0..s.rows {
            if pos[s.first_row + i] != usize::MAX {
                return Err(KernelError::Segments(format!("row {} is in two segments", s.first_row + i)));
            }
            pos[s.first_row + i] = s.start_pos + i;
        }
    }
    if pos.contains(&usize::MAX) {
        return Err(KernelError::Segments("a row belongs to no segment".into()));
    }
    Ok(pos)
}

/// Checks that segments name distinct caches inside a slice of `n` caches.
pub fn check_caches(segs: &[Segment], n: usize) -> Result<(), KernelError> {
    let mut seen = vec![false; n];
    for s in segs {
        match seen.get_mut(s.cache) {
            None => return Err(KernelError::Segments(format!("segment names cache {} of {n}", s.cache))),
            Some(true) => return Err(KernelError::Segments(format!("two segments name cache {}", s.cache))),
            Some(b) => *b = true,
        }
    }
    Ok(())
}

/// Every cache a segment names must have the call's row width ([`KernelError::Shape`]) and hold exactly `start_pos`
/// rows ([`KernelError::KeyCount`]); `cache(i)` is cache `i`'s `(width, rows held)`.
pub fn check_cache_state(
    kernel: &'static str,
    segs: &[Segment],
    width: usize,
    cache: impl Fn(usize) -> (usize, usize),
) -> Result<(), KernelError> {
    for s in segs {
        let (w, held) = cache(s.cache);
        if w != width {
            return Err(KernelError::Shape { kernel, what: "KV cache width", got: w, want: width });
        }
        if held != s.start_pos {
            return Err(KernelError::KeyCount { cache: s.cache, start: s.start_pos, held });
        }
    }
    Ok(())
}

/// The buffer lengths of one short-conv call (`Backend::short_conv`), in f32 elements.
#[derive(Clone, Copy, Debug)]
pub struct ConvLens {
    /// `bcx` `[rows, 3 * width]`.
    pub bcx: usize,
    /// `out` `[rows, width]`.
    pub out: usize,
    /// The depthwise kernel `[width, taps]`.
    pub weight: usize,
    /// Its bias `[width]`, when there is one.
    pub bias: Option<usize>,
}

/// A short-conv call over `width` channels: the buffers' lengths, the segment table over the call's rows, distinct
/// states inside a slice of `n` states, and every named state of `width` channels and the weight's taps
/// (`state(i)` is state `i`'s `(channels, taps, values held)`). Returns `(rows, taps)`.
pub fn check_conv(
    lens: ConvLens,
    width: usize,
    segs: &[Segment],
    n: usize,
    state: impl Fn(usize) -> (usize, usize, usize),
) -> Result<(usize, usize), KernelError> {
    let rows = lens.out / width.max(1);
    check_len("short_conv", "bcx", lens.bcx, rows * 3 * width)?;
    check_len("short_conv", "out", lens.out, rows * width)?;
    row_positions(segs, rows)?;
    check_caches(segs, n)?;
    let taps = lens.weight / width.max(1);
    check_len("short_conv", "weight", lens.weight, taps * width)?;
    if let Some(b) = lens.bias {
        check_len("short_conv", "bias", b, width)?;
    }
    for s in segs {
        let (w, t, held) = state(s.cache);
        if w != width || t != taps || taps == 0 {
            let want = taps.saturating_sub(1) * width;
            return Err(KernelError::Shape { kernel: "short_conv", what: "conv state", got: held, want });
        }
    }
    Ok((rows, taps))
}
