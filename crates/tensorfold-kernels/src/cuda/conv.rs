//! Launchers of the short conv kernels over a segment table (one launch a step for all streams) and the rollback
//! of a conv state to a row of its kept window; the semantics are the CPU's `cpu::conv` exactly.

use super::device::{Arg, BLOCK, GRID_YZ, Mem, Src};
use super::ops::{blocks, int, mul};
use super::types::{CudaBuf, CudaConv, f32_bytes};
use super::{CudaBackend, CudaError};
use crate::backend::{KernelError, Segment};
use crate::shape::{ConvLens, check_conv};

/// `out[t, c] = C[t, c] * (sum_i w[c, i] * Bx[t - taps + 1 + i, c] + bias[c])` for each segment's rows, rows before
/// the segment from its stream's state; then each state holds its segment's last `taps - 1` rows of `B * x`, and a
/// segment of at most its state's `keep_rows` rows (at most `KEEP_ROWS`) keeps its window for [`conv_keep`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn short_conv(
    be: &CudaBackend,
    bcx: &CudaBuf,
    width: usize,
    weight: &CudaBuf,
    bias: Option<&CudaBuf>,
    segs: &[Segment],
    states: &mut [&mut CudaConv],
    out: &mut CudaBuf,
) -> Result<(), KernelError> {
    let lens = ConvLens { bcx: bcx.len(), out: out.len(), weight: weight.len(), bias: bias.map(CudaBuf::len) };
    let (rows, taps) = check_conv(lens, width, segs, states.len(), |i| {
        let st = &states[i];
        (st.width, st.taps, st.hist() * st.width)
    })?;
    let call = Call { bcx, width, taps, weight, bias, rows };
    launch(be, &call, segs, states, out).map_err(|e| e.kernel("short_conv"))
}

/// One short_conv call's inputs, checked.
struct Call<'a> {
    bcx: &'a CudaBuf,
    width: usize,
    taps: usize,
    weight: &'a CudaBuf,
    bias: Option<&'a CudaBuf>,
    rows: usize,
}

/// Windows, tables and the three launches (outputs, windows, states), in that stream order: the first two read the
/// states before the last one moves them. Short segments only: one `conv_fused` launch instead.
fn launch(
    be: &CudaBackend,
    c: &Call,
    segs: &[Segment],
    states: &mut [&mut CudaConv],
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    let (width, hist) = (c.width, c.taps - 1);
    let mut temps = Vec::new();
    let mut table: Vec<u64> = Vec::with_capacity(4 * segs.len());
    let mut row_seg = vec![0u32; c.rows];
    let mut most = 0;
    for (i, s) in segs.iter().enumerate() {
        let st = &mut states[s.cache];
        let window = if s.rows <= st.keep_rows {
            st.ensure_window(s.rows)?
        } else if s.rows < hist {
            // Too long to keep, yet shorter than the state: the new state still comes from a window.
            let t = be.dev.alloc(f32_bytes(mul(hist + s.rows, width)?)?)?;
            let p = t.as_ref().map_or(0, |m| m.ptr);
            temps.push(t);
            p
        } else {
            0
        };
        table.extend([st.state_ptr()?, window, s.first_row as u64, s.rows as u64]);
        row_seg[s.first_row..s.first_row + s.rows].fill(i as u32);
        most = most.max((hist + s.rows) * width);
    }
    let tm = be.dev.stage(&table)?;
    let tp = tm.as_ref().map_or(0, |m| m.ptr);
    let (wi, ti) = (int(width, "width")?, int(c.taps, "taps")?);
    let bias = match c.bias {
        Some(b) => b.ptr()?,
        None => 0,
    };
    let bcx = c.bcx.ptr()?;
    if be.dev.fused && segs.iter().all(|s| s.rows <= FUSED_ROWS) {
        let f = be.func(Src::Conv, "conv_fused")?;
        let (w, o) = (c.weight.ptr()?, out.ptr()?);
        for (i, chunk) in table.chunks(4 * GRID_YZ).enumerate() {
            let at = tp + (i * 4 * GRID_YZ * 8) as u64;
            let args = [Arg::P(bcx), Arg::I(wi), Arg::I(ti), Arg::P(w), Arg::P(bias), Arg::P(at), Arg::P(o)];
            be.dev.launch(&f, (blocks(width)?, (chunk.len() / 4) as u32, 1), BLOCK, 0, &args)?;
        }
        return finish(segs, states, temps);
    }
    let rs = be.dev.stage(&row_seg)?;
    let f = be.func(Src::Conv, "conv_out")?;
    let args = [
        Arg::P(bcx),
        Arg::I(wi),
        Arg::I(ti),
        Arg::P(c.weight.ptr()?),
        Arg::P(bias),
        Arg::P(tp),
        Arg::P(rs.as_ref().map_or(0, |m| m.ptr)),
        Arg::I(int(c.rows, "rows")?),
        Arg::P(out.ptr()?),
    ];
    be.dev.launch(&f, (blocks(mul(c.rows, width)?)?, 1, 1), BLOCK, 0, &args)?;
    // Both kernels stride over their segment, so the blocks a segment gets change no value: at most
    // SPAN_BLOCKS / segments of them, or a round of a thousand decode rows beside one prompt chunk sized every
    // segment's grid by the chunk's window (400k mostly idle blocks, 0.4 ms a layer on an H100).
    let cap = (SPAN_BLOCKS / segs.len().max(1)).clamp(4, 1024) as u32;
    let spans = [("conv_window", blocks(most)?.clamp(1, cap)), ("conv_state", blocks(hist * width)?.clamp(1, cap))];
    for (name, span) in spans {
        let f = be.func(Src::Conv, name)?;
        for (i, chunk) in table.chunks(4 * GRID_YZ).enumerate() {
            let args = [Arg::P(bcx), Arg::I(wi), Arg::I(ti), Arg::P(tp + (i * 4 * GRID_YZ * 8) as u64)];
            be.dev.launch(&f, (span, (chunk.len() / 4) as u32, 1), BLOCK, 0, &args)?;
        }
    }
    finish(segs, states, temps)
}

/// Blocks the window and state launches spread over a call's segments (each segment gets at least 4).
const SPAN_BLOCKS: usize = 8192;

/// Segments of at most this many rows each (decode and verify rounds) make the call one `conv_fused` launch: a
/// thread loops over its segment's rows, so long prefill segments keep the three wide launches.
const FUSED_ROWS: usize = 16;

/// Records each state's kept window after the launches; temporary windows are freed in stream order, after the
/// launches that use them.
fn finish(segs: &[Segment], states: &mut [&mut CudaConv], temps: Vec<Option<Mem>>) -> Result<(), CudaError> {
    for s in segs {
        let st = &mut states[s.cache];
        // As the CPU: a call too long to roll back keeps no window (its room stays for the next verify window).
        st.window_rows = (s.rows <= st.keep_rows).then_some(s.rows);
    }
    drop(temps);
    Ok(())
}

/// Rolls a state back to just after the first `rows` rows of its last call: the state becomes the window's rows
/// `[rows, rows + taps - 1)`. Errors (the CPU's message) when that call kept no window or had fewer rows.
pub(crate) fn conv_keep(c: &mut CudaConv, rows: usize) -> Result<(), KernelError> {
    let hist = c.hist();
    let have = c.window_rows.unwrap_or(0);
    let empty = c.window_rows.is_none() || (hist + have) * c.width == 0;
    if empty || rows > have {
        return Err(KernelError::Segments(format!(
            "conv state cannot roll back to row {rows} of a kept window of {have} rows"
        )));
    }
    let copy = || -> Result<(), CudaError> {
        let (Some(win), Ok(state)) = (&c.window, c.state_ptr()) else { return Err(CudaError::Unallocated) };
        let bytes = f32_bytes(hist * c.width)?;
        c.dev.dtod(state, win.ptr + f32_bytes(rows * c.width)? as u64, bytes)
    };
    copy().map_err(|e| e.kernel("conv_keep"))?;
    c.window_rows = Some(rows);
    Ok(())
}
