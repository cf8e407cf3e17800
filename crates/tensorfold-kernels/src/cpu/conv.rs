//! CPU LFM2 short conv core over each stream's conv state, walking the call's segment table.

use crate::backend::{KernelError, Segment};
use crate::shape::{ConvLens, check_conv};

pub use crate::backend::KEEP_ROWS;

/// One conv layer's state of one stream: the last `taps - 1` values of `B * x`, oldest first,
/// `[taps - 1, width]`. Zeros before the first row (the reference's causal zero padding).
#[derive(Clone, Debug)]
pub struct CpuConv {
    /// Channels.
    pub width: usize,
    /// Kernel taps (`conv_L_cache`).
    pub taps: usize,
    /// `[taps - 1, width]`, oldest row first.
    pub state: Vec<f32>,
    /// The last call's window (`taps - 1` state rows then its rows of `B * x`), kept for calls of at most
    /// `keep_rows` rows so [`CpuConv::keep`] can restore the state at any of its rows; empty otherwise.
    pub window: Vec<f32>,
    /// Longest call whose window is kept (1 to [`KEEP_ROWS`]; the engine's longest verify window once reserved).
    pub keep_rows: usize,
}

impl CpuConv {
    /// A zeroed state.
    pub fn new(width: usize, taps: usize) -> Self {
        let state = vec![0.0; taps.saturating_sub(1) * width];
        Self { width, taps, state, window: Vec::new(), keep_rows: KEEP_ROWS }
    }

    /// Rolls the state back to just after the first `rows` rows of the last call (a verify window whose
    /// later rows were rejected). Errors when that call kept no window or had fewer rows.
    pub fn keep(&mut self, rows: usize) -> Result<(), KernelError> {
        let hist = self.taps - 1;
        let have = (self.window.len() / self.width.max(1)).saturating_sub(hist);
        if self.window.is_empty() || rows > have {
            return Err(KernelError::Segments(format!(
                "conv state cannot roll back to row {rows} of a kept window of {have} rows"
            )));
        }
        self.state.copy_from_slice(&self.window[rows * self.width..(rows + hist) * self.width]);
        self.window.truncate((hist + rows) * self.width);
        Ok(())
    }
}

/// `out[t, c] = C[t, c] * (sum_i w[c, i] * Bx[t - taps + 1 + i, c] + bias[c])` for each segment's rows,
/// where rows before the segment come from its stream's state; then the state holds the segment's last
/// `taps - 1` rows of `B * x`. `bcx` is `[rows, 3 * width]` (B, C, x), `weight` `[width, taps]`.
/// The sum runs over taps in order (multiply, then add), bias last.
#[allow(clippy::too_many_arguments)]
pub fn short_conv(
    bcx: &[f32],
    width: usize,
    weight: &[f32],
    bias: Option<&[f32]>,
    segs: &[Segment],
    states: &mut [&mut CpuConv],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let lens = ConvLens { bcx: bcx.len(), out: out.len(), weight: weight.len(), bias: bias.map(<[f32]>::len) };
    let (_, taps) = check_conv(lens, width, segs, states.len(), |i| {
        let st = &states[i];
        (st.width, st.taps, st.state.len())
    })?;
    for s in segs {
        let st = &mut states[s.cache];
        let hist = taps - 1;
        // Window of B*x: the state's rows then this segment's rows, built in the kept window's room when the call
        // is short enough to keep it (reserved once), else in a scratch one.
        let keep = s.rows <= st.keep_rows;
        let mut bx = if keep { std::mem::take(&mut st.window) } else { Vec::with_capacity((hist + s.rows) * width) };
        bx.clear();
        bx.extend_from_slice(&st.state);
        for t in 0..s.rows {
            let r = &bcx[(s.first_row + t) * 3 * width..(s.first_row + t + 1) * 3 * width];
            bx.extend(r[..width].iter().zip(&r[2 * width..]).map(|(b, x)| b * x));
        }
        for t in 0..s.rows {
            let c_gate = &bcx[(s.first_row + t) * 3 * width + width..(s.first_row + t) * 3 * width + 2 * width];
            let o = &mut out[(s.first_row + t) * width..(s.first_row + t + 1) * width];
            for c in 0..width {
                let mut acc = 0f32;
                for i in 0..taps {
                    acc += weight[c * taps + i] * bx[(t + i) * width + c];
                }
                if let Some(b) = bias {
                    acc += b[c];
                }
                o[c] = c_gate[c] * acc;
            }
        }
        let n = bx.len();
        st.state.copy_from_slice(&bx[n - hist * width..]);
        if keep {
            st.window = bx;
        } else {
            // Empty: no window to roll back in (its room stays for the next verify window).
            st.window.clear();
        }
    }
    Ok(())
}
