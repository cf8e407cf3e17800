//! Host launches of the tensor-core forms (dense_tc.cu, dense_tcw.cu, `TENSORFOLD_CUDA_TENSOR_CORES=1`): the linear, q/k/v in one launch, the dense gate-up and the MoE expert tiles, few-row, narrow or wide.

use super::device::{Arg, GRID_YZ, Src, TC_SEGS, TCM, TCN};
use super::ops::int;
use super::types::{CudaBuf, CudaMat};
use super::{CudaBackend, CudaError};
use crate::backend::Ffn;

/// Threads of a narrow-form block: a warp a K segment.
const NARROW_BLOCK: u32 = 32 * TC_SEGS as u32;

/// Rows a tile of the few-row form holds (dense_tc.cu's `tc_few`: the mma's n8 side); a dense call of at most
/// this many rows, and every narrow MoE tile (at most [`super::device::RT`] slots), runs it.
const FEW_ROWS: usize = 8;
const _: () = assert!(super::device::RT <= FEW_ROWS, "a narrow MoE tile fits the few-row form");

/// The two forms of a block of [`NARROW_BLOCK`] threads: `Narrow` (activations as the mma's A operand: tiles of
/// 16 rows, column groups of 8) and `Few` (weights as the A operand: tiles of [`FEW_ROWS`], column groups of 16).
/// Both give an output the same bits (one chain fixed by k).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Form {
    Narrow,
    Few,
}

impl Form {
    /// Columns a group of this form covers.
    fn group_cols(self) -> usize {
        match self {
            Form::Narrow => 8,
            Form::Few => 16,
        }
    }
}

/// Column groups a block of `form` computes (1, 2 or 4; at most 2 for the gate-up forms, which read two matrices)
/// for `n` outputs over `tiles` row tiles: the override the contract sets, else the most groups that still give
/// the device two blocks an SM (more groups split an activation once for more columns and keep more weight bytes
/// in flight a lane; fewer give small matrices enough blocks). No bit depends on it.
fn narrow_group(be: &CudaBackend, form: Form, n: usize, tiles: usize, gateup: bool) -> usize {
    let most = if gateup { 2 } else { 4 };
    if let Some(g) = be.dev.tc_group() {
        return g.clamp(1, most);
    }
    let want = 2 * be.dev.sms();
    let blocks = |g: usize| n.div_ceil(form.group_cols() * g).saturating_mul(tiles);
    [4, 2].into_iter().find(|&g| g <= most && blocks(g) >= want).unwrap_or(1)
}

/// The entry of `kind` (linear, gateup, moe_gateup, moe_down) in `form` at `grp` column groups for matrices like
/// `w` (dense_tc.cu's `TC_NARROW_ENTRIES`: one entry each, so a small group count keeps its own, smaller register
/// count). The MoE tiles run the few-row form only.
fn narrow_entry(kind: &str, form: Form, grp: usize, w: &CudaMat) -> Result<String, CudaError> {
    let most = match (kind, form) {
        ("linear", _) | ("moe_down", Form::Few) => 4,
        ("gateup", _) | ("moe_gateup", Form::Few) => 2,
        _ => 0,
    };
    if !matches!(grp, 1 | 2 | 4) || grp > most {
        return Err(CudaError::Shape(format!("no {form:?} tensor-core {kind} at {grp} column groups")));
    }
    let f = if form == Form::Narrow { "tc" } else { "tcf" };
    Ok(format!("{kind}_{f}{grp}_{}", w.dtype_name()))
}

/// A matrix's arguments of the narrow and few-row entries: values, scales, biases (0 for bf16), then the group.
fn mat_args(w: &CudaMat) -> Result<[Arg; 4], CudaError> {
    let (wp, sp, bp) = w.ptrs()?;
    Ok([Arg::P(wp), Arg::P(sp), Arg::P(bp), Arg::I(int(w.group, "group")?)])
}

/// Threads of a wide block (dense_tcw.cu's `TCW_THREADS`): four warps, each 16 rows by every column.
const WIDE_BLOCK: u32 = 128;

/// Dynamic shared memory of a wide block (dense_tcw.cu's `TCW_SMEM`): two buffers of two chunks' B fragments
/// (32 KiB), two buffers of two chunks' scales and biases of a quantized matrix (4 KiB), then 64 segment totals a
/// thread of 128 (32 KiB): 68 KiB; the kernels are compiled for two blocks an SM (`TCW_BLOCKS`), which any part
/// with 136 KiB of shared memory an SM holds.
const WIDE_SMEM: usize = 2 * 2 * (TCN / 8) * 32 * 16 + 2 * 2 * 2 * TCN * 4 + (TCN / 8) * 4 * WIDE_BLOCK as usize * 4;
const _: () = assert!(WIDE_SMEM == 69_632, "dense_tcw.cu's static_assert on TCW_SMEM names the same bytes");

/// The wide entry of `kind` (linear, gateup, moe_gateup, moe_down) for matrices like `w` over `grid` blocks.
fn wide_launch(
    be: &CudaBackend,
    (kind, w): (&str, &CudaMat),
    grid: (u32, u32, u32),
    args: &[Arg],
) -> Result<(), CudaError> {
    if !matches!(kind, "linear" | "gateup" | "moe_gateup" | "moe_down") {
        return Err(CudaError::Shape(format!("no wide tensor-core {kind}")));
    }
    let f = be.func(Src::Dense, &format!("{kind}_tcw_{}", w.dtype_name()))?;
    be.dev.allow_smem(&f, WIDE_SMEM)?;
    be.dev.launch(&f, grid, WIDE_BLOCK, WIDE_SMEM as u32, args)
}

/// Row tiles of `tile` rows for the narrow or few-row form of a `rows`-row call, within the grid's y limit.
fn narrow_tiles(rows: usize, tile: usize) -> Result<u32, CudaError> {
    u32::try_from(rows.div_ceil(tile))
        .ok()
        .filter(|&t| t as usize <= GRID_YZ)
        .ok_or_else(|| CudaError::Shape(format!("{rows} rows for the narrow tensor-core forms")))
}

/// `out = w x (+ bias)` over checked shapes (`x` `[rows, w.cols]`, device addresses; `bias` 0 for none): the wide
/// form (blocks of [`TCM`] rows by [`TCN`] columns) for calls that take the wide tiles
/// ([`super::device::Dev::wide`]), else the few-row form for at most [`FEW_ROWS`] rows (16, 32 or 64 columns a
/// block) or the narrow one (16 rows by 8, 16 or 32 columns: [`narrow_group`]). All give a row the same bits.
pub(crate) fn linear(be: &CudaBackend, xp: u64, rows: usize, w: &CudaMat, bias: u64, op: u64) -> Result<(), CudaError> {
    dense(be, "linear", (xp, rows), w, &[&mat_args(w)?[..], &[Arg::P(bias), Arg::P(op)]].concat())
}

/// Up to three linears of one input `xp` (`[rows, k]`, every matrix a tensor-core one: the caller checked) in one
/// few-row launch, into `outs` (`[rows, m.rows]` each): each output's bits are its own [`linear`]'s (gate `multi`).
/// `Ok(false)` for more than [`FEW_ROWS`] rows: the caller launches each.
pub(crate) fn few_linears(
    be: &CudaBackend,
    (xp, rows): (u64, usize),
    mats: &[&CudaMat],
    outs: &[&mut CudaBuf],
) -> Result<bool, CudaError> {
    if rows > FEW_ROWS {
        return Ok(false);
    }
    let total: usize = mats.iter().map(|m| m.rows).sum();
    let grp = narrow_group(be, Form::Few, total, 1, false);
    let (table, gx) = super::ops::multi_table(mats, outs, Form::Few.group_cols() * grp)?;
    if gx == 0 {
        return Ok(true);
    }
    let f = be.func(Src::Dense, &format!("linear3_tcf{grp}_{}", mats[0].dtype_name()))?;
    let tm = be.dev.stage(&table)?;
    let tp = tm.as_ref().map_or(0, |m| m.ptr);
    let (ri, ki, gi) = (int(rows, "rows")?, int(mats[0].cols, "cols")?, int(mats[0].group, "group")?);
    let args = [Arg::P(xp), Arg::I(ri), Arg::I(ki), Arg::I(gi), Arg::P(tp)];
    be.dev.launch(&f, (gx, 1, 1), NARROW_BLOCK, 0, &args)?;
    Ok(true)
}

/// The dense SwiGLU's `act = silu(g x) * (u x)` (`x` `[rows, g.cols]`, `act` `[rows, g.rows]`, device addresses):
/// wide or narrow as [`linear`].
pub(crate) fn gateup(
    be: &CudaBackend,
    xp: u64,
    rows: usize,
    (g, u): (&CudaMat, &CudaMat),
    act: u64,
) -> Result<(), CudaError> {
    let (ga, ua) = (mat_args(g)?, mat_args(u)?);
    dense(be, "gateup", (xp, rows), g, &[&ga[..3], &ua[..], &[Arg::P(act)]].concat())
}

/// One dense call of `kind` (`linear` or `gateup`) over `rows` rows of `xp` (`[rows, w.cols]`) into `w.rows`
/// outputs, the kernel's matrix and output arguments in `tail`: the wide form for calls that take the wide tiles,
/// else the few-row form for at most [`FEW_ROWS`] rows, else the narrow one, at [`narrow_group`]'s column groups.
fn dense(be: &CudaBackend, kind: &str, (xp, rows): (u64, usize), w: &CudaMat, tail: &[Arg]) -> Result<(), CudaError> {
    let (gateup, k, n) = (kind == "gateup", w.cols, w.rows);
    let head = [Arg::P(xp), Arg::I(int(rows, "rows")?), Arg::I(int(k, "cols")?), Arg::I(int(n, "outputs")?)];
    let args = [&head[..], tail].concat();
    if be.dev.wide(rows) {
        let cols = if gateup { TCN / 2 } else { TCN };
        let grid = (int(rows.div_ceil(TCM), "row tiles")? as u32, int(n.div_ceil(cols), "blocks")? as u32, 1);
        return wide_launch(be, (kind, w), grid, &args);
    }
    let (form, tile) = if rows <= FEW_ROWS { (Form::Few, FEW_ROWS) } else { (Form::Narrow, 16) };
    let tiles = narrow_tiles(rows, tile)?;
    let grp = narrow_group(be, form, n, tiles as usize, gateup);
    let f = be.func(Src::Dense, &narrow_entry(kind, form, grp, w)?)?;
    let grid = (int(n.div_ceil(form.group_cols() * grp), "blocks")? as u32, tiles, 1);
    be.dev.launch(&f, grid, NARROW_BLOCK, 0, &args)
}

/// Whether the tensor-core expert tiles serve these experts: every w1, w3 and w2 a tensor-core matrix.
pub(crate) fn experts_ok(experts: &[Ffn<CudaMat>]) -> bool {
    !experts.is_empty() && experts.iter().all(|f| f.w1.tc() && f.w3.tc() && f.w2.tc())
}

/// A MoE call's plan as the tensor-core expert tiles read it: the expert table, the plan's tiles, their count and
/// slot list (device addresses), the most tiles, top-k, and whether the tiles were planned for the wide form
/// ([`TCM`] slots; else at most [`super::device::RT`], the few-row form's tiles).
pub(crate) struct TcPlan {
    pub tab: u64,
    pub tiles: u64,
    pub ntiles: u64,
    pub list: u64,
    pub bound: usize,
    pub kk: i32,
    pub wide: bool,
}

/// One grouped expert kernel on the tensor cores: `moe_gateup` reads `x` `[rows, k]` and writes `act` `[slots,
/// n]`; `moe_down` reads `act` `[slots, k]` and writes each assignment's row of `y`. Narrow tiles in
/// launches of at most [`GRID_YZ`] tiles. `w` is the kind's matrix of the first expert (the experts share its dtype
/// and group).
pub(crate) fn grouped(
    be: &CudaBackend,
    (kind, w): (&str, &CudaMat),
    (input, output): (u64, u64),
    (k, n): (usize, usize),
    p: &TcPlan,
) -> Result<(), CudaError> {
    let gateup = kind == "moe_gateup";
    let (ki, ni) = (Arg::I(int(k, "cols")?), Arg::I(int(n, "outputs")?));
    let gi = Arg::I(int(w.group, "group")?);
    let mut args = vec![Arg::P(input), ki, ni, Arg::P(p.tab), gi, Arg::P(p.tiles), Arg::P(p.ntiles), Arg::P(p.list)];
    if gateup {
        args.push(Arg::I(p.kk));
    }
    args.push(Arg::P(output));
    if p.wide {
        let cols = if gateup { TCN / 2 } else { TCN };
        let grid = (int(p.bound, "tiles")? as u32, int(n.div_ceil(cols), "blocks")? as u32, 1);
        return wide_launch(be, (kind, w), grid, &args);
    }
    let grp = narrow_group(be, Form::Few, n, p.bound, gateup);
    let f = be.func(Src::Dense, &narrow_entry(kind, Form::Few, grp, w)?)?;
    args.push(Arg::I(0));
    let last = args.len() - 1;
    let gx = int(n.div_ceil(Form::Few.group_cols() * grp), "blocks")? as u32;
    for tile0 in (0..p.bound).step_by(GRID_YZ) {
        args[last] = Arg::I(int(tile0, "tile")?);
        be.dev.launch(&f, (gx, (p.bound - tile0).min(GRID_YZ) as u32, 1), NARROW_BLOCK, 0, &args)?;
    }
    Ok(())
}
