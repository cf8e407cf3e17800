//! Launchers of the row and dense kernels: weight upload, embedding, RMSNorm, linear, SwiGLU, add, row gather, q/k
//! norm + RoPE and the greedy pick. Each checks its shapes on the host before anything is launched.

use super::device::{Arg, BLOCK, GRID_YZ, RT, Src, WPB, WTM};
use super::types::{CudaBuf, CudaMat, f32_bytes};
use super::{CudaBackend, CudaError};
use crate::backend::rope_inv_freq;
use crate::backend::{Ffn, KernelError, Pick, RopeParams, Segment};
use crate::bytes::{Dtype, MatView};
use crate::shape::{check_len, row_positions};

/// Threads of the greedy kernel's block (rows.cu's `GREEDY_THREADS`).
const GREEDY_THREADS: u32 = 1024;

/// A shape the CPU would have asserted on, as an error.
pub(crate) fn expect(ok: bool, what: impl FnOnce() -> String) -> Result<(), CudaError> {
    if ok { Ok(()) } else { Err(CudaError::Shape(what())) }
}

/// `n` as a kernel's 32-bit int.
pub(crate) fn int(n: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Shape(format!("{what} = {n} is past the kernels' 32-bit range")))
}

/// Blocks of [`BLOCK`] threads covering `n` items.
pub(crate) fn blocks(n: usize) -> Result<u32, CudaError> {
    u32::try_from(n.div_ceil(BLOCK as usize))
        .map_err(|_| CudaError::Shape(format!("{n} items are too many for one launch")))
}

/// `a * b`, refusing an overflow.
pub(crate) fn mul(a: usize, b: usize) -> Result<usize, CudaError> {
    a.checked_mul(b).ok_or_else(|| CudaError::Shape(format!("{a} x {b} overflows")))
}

/// Copies a host matrix to the device in its stored dtype (Q8 and Q4 with their scales and biases).
pub(crate) fn upload_mat(be: &CudaBackend, m: &MatView) -> Result<CudaMat, CudaError> {
    // MLX 8-bit affine is Q8 exactly (u8 codes, f32 scales and biases); 4-bit is Q4 (two codes a byte).
    let elems = mul(m.rows, m.cols)?;
    let want = m.dtype.bytes(elems).ok_or_else(|| CudaError::Shape(format!("{elems} elements of {:?}", m.dtype)))?;
    expect(m.bytes.len() == want, || {
        format!("matrix [{}, {}] has {} bytes, expected {want}", m.rows, m.cols, m.bytes.len())
    })?;
    let (group, scales, biases) = match (m.dtype, &m.affine) {
        (Dtype::Q8 | Dtype::Q4, Some(a)) => {
            let gb = mul(m.rows, m.cols / a.group.max(1))? * 4;
            let ok = a.group > 0 && m.cols.is_multiple_of(a.group) && a.scales.len() == gb && a.biases.len() == gb;
            expect(ok, || {
                format!("affine matrix [{}, {}]: groups of {} do not fit its scales", m.rows, m.cols, a.group)
            })?;
            (a.group, be.dev.upload(a.scales.as_slice())?, be.dev.upload(a.biases.as_slice())?)
        }
        (Dtype::Q8 | Dtype::Q4, None) => {
            return Err(CudaError::Shape("an affine matrix without scales and biases".into()));
        }
        _ => (1, None, None),
    };
    let data = be.dev.upload(m.bytes.as_slice())?;
    Ok(CudaMat { rows: m.rows, cols: m.cols, dtype: m.dtype, group, data, scales, biases })
}

/// `out[r] = table[ids[r]]` after checking every id on the host (ids past the table are refused by name).
pub(crate) fn embed(be: &CudaBackend, table: &CudaMat, ids: &[u32], out: &mut CudaBuf) -> Result<(), KernelError> {
    check_len("embed", "out", out.len(), ids.len() * table.cols)?;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= table.rows) {
        return Err(KernelError::TokenOutOfRange { id, vocab: table.rows });
    }
    embed_unchecked(be, table, ids, out).map_err(|e| e.kernel("embed"))
}

/// The embedding launch alone (the contract plants "clamps out-of-range ids" by skipping [`embed`]'s check).
pub(crate) fn embed_unchecked(
    be: &CudaBackend,
    table: &CudaMat,
    ids: &[u32],
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    let (rows, h) = (ids.len(), table.cols);
    if rows * h == 0 || table.rows == 0 {
        return Ok(());
    }
    let idm = be.dev.stage(ids)?;
    embed_launch(be, table, (idm.as_ref().map_or(0, |m| m.ptr), 1), (0, 0), rows, out)
}

/// `out[r] = table[ids[r]]`, except rows named by `from` (`(row, pick)`), which take `table[held[3 * pick]]` (a NaN
/// row past the table): held drafts embedded without a host read. Ids of `ids` are checked on the host.
pub(crate) fn embed_held(
    be: &CudaBackend,
    table: &CudaMat,
    ids: &[u32],
    held: &CudaBuf,
    from: &[(usize, usize)],
    out: &mut CudaBuf,
) -> Result<(), KernelError> {
    check_len("embed_held", "out", out.len(), ids.len() * table.cols)?;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= table.rows) {
        return Err(KernelError::TokenOutOfRange { id, vocab: table.rows });
    }
    crate::backend::check_held(ids.len(), held.len(), from)?;
    if ids.len() * table.cols == 0 {
        return Ok(());
    }
    let mut pick = vec![-1i32; ids.len()];
    for &(row, p) in from {
        pick[row] = i32::try_from(p).map_err(|_| KernelError::Shape {
            kernel: "embed_held",
            what: "held pick",
            got: p,
            want: i32::MAX as usize,
        })?;
    }
    let mut launch = || -> Result<(), CudaError> {
        let (idm, pm) = (be.dev.stage(ids)?, be.dev.stage(&pick)?);
        let ptr = |m: &Option<crate::cuda::device::Mem>| m.as_ref().map_or(0, |m| m.ptr);
        embed_launch(be, table, (ptr(&idm), 1), (held.ptr()?, ptr(&pm)), ids.len(), out)
    };
    launch().map_err(|e| e.kernel("embed_held"))
}

/// `out[r] = table[words[3r]]` for `rows` ids a draw left on the device (`draw_into`'s words); an id past the table
/// gives a NaN row (the device cannot refuse it without a host read).
pub(crate) fn embed_words(
    be: &CudaBackend,
    table: &CudaMat,
    words: &CudaBuf,
    rows: usize,
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    let h = table.cols;
    expect(words.len() == mul(rows, 3)? && out.len() == mul(rows, h)?, || {
        format!("embed_words: {} words and {} outputs for {rows} rows of {h}", words.len(), out.len())
    })?;
    if rows * h == 0 || table.rows == 0 {
        return Ok(());
    }
    embed_launch(be, table, (words.ptr()?, 3), (0, 0), rows, out)
}

/// The `embed` kernel over `rows` ids read at `ids.0` every `ids.1` words; `held` = (draw words, per-row pick index
/// or -1), both 0 when no row is held.
fn embed_launch(
    be: &CudaBackend,
    table: &CudaMat,
    ids: (u64, i32),
    held: (u64, u64),
    rows: usize,
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    let h = table.cols;
    let (w, s, b) = table.ptrs()?;
    let f = be.func(Src::Rows, "embed")?;
    let args = [
        Arg::P(w),
        Arg::P(s),
        Arg::P(b),
        Arg::I(int(table.group, "group")?),
        Arg::I(table.dtype_code()),
        Arg::I(int(table.rows, "vocab")?),
        Arg::P(ids.0),
        Arg::I(ids.1),
        Arg::P(held.0),
        Arg::P(held.1),
        Arg::I(int(rows, "rows")?),
        Arg::I(int(h, "width")?),
        Arg::P(out.ptr()?),
    ];
    be.dev.launch(&f, (blocks(mul(rows, h)?)?, 1, 1), BLOCK, 0, &args)
}

/// Row-wise RMSNorm over `width`.
pub(crate) fn rmsnorm(
    be: &CudaBackend,
    x: &CudaBuf,
    w: &CudaBuf,
    eps: f32,
    width: usize,
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    expect(w.len() == width, || format!("rmsnorm: weight has {} values for width {width}", w.len()))?;
    expect(x.len() == out.len() && width > 0 && x.len().is_multiple_of(width), || {
        format!("rmsnorm: x has {} values, out {}, width {width}", x.len(), out.len())
    })?;
    let rows = x.len() / width;
    let f = be.func(Src::Rows, "rmsnorm")?;
    let args = [
        Arg::P(x.ptr()?),
        Arg::P(w.ptr()?),
        Arg::F(eps),
        Arg::I(int(width, "width")?),
        Arg::I(int(rows, "rows")?),
        Arg::P(out.ptr()?),
    ];
    be.dev.launch(&f, (int(rows, "rows")? as u32, 1, 1), BLOCK, 0, &args)
}

/// `x += y`, then `out = rmsnorm(x) * w` row-wise, in one launch with add_inplace's and rmsnorm's bits.
pub(crate) fn add_rmsnorm(
    be: &CudaBackend,
    x: &mut CudaBuf,
    y: &CudaBuf,
    (w, eps, width): (&CudaBuf, f32, usize),
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    expect(w.len() == width, || format!("add_rmsnorm: weight has {} values for width {width}", w.len()))?;
    expect(x.len() == out.len() && x.len() == y.len() && width > 0 && x.len().is_multiple_of(width), || {
        format!("add_rmsnorm: x has {} values, y {}, out {}, width {width}", x.len(), y.len(), out.len())
    })?;
    let rows = x.len() / width;
    let f = be.func(Src::Rows, "add_rmsnorm")?;
    let args = [
        Arg::P(x.ptr()?),
        Arg::P(y.ptr()?),
        Arg::P(w.ptr()?),
        Arg::F(eps),
        Arg::I(int(width, "width")?),
        Arg::I(int(rows, "rows")?),
        Arg::P(out.ptr()?),
    ];
    be.dev.launch(&f, (int(rows, "rows")? as u32, 1, 1), BLOCK, 0, &args)
}

/// `out[r] = w x[r] (+ bias)`: one warp an output column, tiles of [`RT`] rows, the row tiles split over launches of
/// at most [`GRID_YZ`] tiles (which changes no row's arithmetic); calls of many rows take the wide tiles
/// ([`super::device::Dev::wide`]), which give the same bits.
pub(crate) fn linear(
    be: &CudaBackend,
    x: &CudaBuf,
    rows: usize,
    w: &CudaMat,
    bias: Option<&CudaBuf>,
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    let (n, k) = (w.rows, w.cols);
    expect(x.len() == mul(rows, k)?, || format!("linear: x has {} values, expected [{rows}, {k}]", x.len()))?;
    expect(out.len() == mul(rows, n)?, || format!("linear: out has {} values, expected [{rows}, {n}]", out.len()))?;
    expect(bias.is_none_or(|b| b.len() == n), || format!("linear: bias is not [{n}]"))?;
    if rows == 0 || n == 0 {
        return Ok(());
    }
    let bias = match bias {
        Some(b) => b.ptr()?,
        None => 0,
    };
    linear_launch(be, x.ptr()?, rows, w, bias, out.ptr()?)
}

/// [`linear`]'s launches over checked shapes: `x` `[rows, w.cols]`, `bias` `[w.rows]` or 0, `out` `[rows, w.rows]`
/// (device addresses). Wide calls take one launch of the wide tiles.
fn linear_launch(be: &CudaBackend, xp: u64, rows: usize, w: &CudaMat, bias: u64, op: u64) -> Result<(), CudaError> {
    let (n, k) = (w.rows, w.cols);
    if rows == 0 || n == 0 {
        return Ok(()); // no block to launch (a grid dimension of 0 is refused)
    }
    if be.dev.tensor_cores() && w.tc() {
        return super::tc::linear(be, xp, rows, w, bias, op);
    }
    let (wp, sp, bp) = w.ptrs()?;
    let (ri, ki, ni, gi) = (int(rows, "rows")?, int(k, "cols")?, int(n, "outputs")?, int(w.group, "group")?);
    let args = vec![
        Arg::P(xp),
        Arg::I(ri),
        Arg::I(ki),
        Arg::I(ni),
        Arg::P(wp),
        Arg::P(sp),
        Arg::P(bp),
        Arg::I(gi),
        Arg::P(bias),
        Arg::P(op),
    ];
    dense_launch(be, w, "linear", (rows, n), args)
}

/// A dense kernel of family `kind` (`linear`, `gateup`) for `w` over `rows` rows and `n` outputs, with the entry's
/// arguments but its last (`row0`): one launch of the wide tiles, or the one-row or tile form over row spans of at
/// most [`GRID_YZ`] tiles (which changes no row's arithmetic).
fn dense_launch(
    be: &CudaBackend,
    w: &CudaMat,
    kind: &str,
    (rows, n): (usize, usize),
    mut args: Vec<Arg>,
) -> Result<(), CudaError> {
    if let Some((name, cols)) = wide_kernel(be, w, kind, rows, n) {
        let f = be.func(Src::Dense, &name)?;
        let grid = (int(rows.div_ceil(WTM), "row tiles")? as u32, n.div_ceil(cols) as u32, 1);
        return be.dev.launch(&f, grid, BLOCK, 0, &args);
    }
    let (name, cols) = w.kernel_for(kind, be.dev.one_row(rows));
    let f = be.func(Src::Dense, &name)?;
    let gx = int(n.div_ceil(cols), "blocks")? as u32;
    args.push(Arg::I(0));
    let last = args.len() - 1;
    for row0 in (0..rows).step_by(RT * GRID_YZ) {
        let tiles = (rows - row0).div_ceil(RT).min(GRID_YZ) as u32;
        args[last] = Arg::I(row0 as i32);
        be.dev.launch(&f, (gx, tiles, 1), BLOCK, 0, &args)?;
    }
    Ok(())
}

/// The wide-tile entry point of `kind` for `w` and the columns a block covers, when a dense call of `rows` rows
/// takes it ([`super::device::Dev::wide`]) and [`wide_form`] has one.
pub(crate) fn wide_kernel(be: &CudaBackend, w: &CudaMat, kind: &str, rows: usize, n: usize) -> Option<(String, usize)> {
    if be.dev.wide(rows) { wide_form(w, kind, n) } else { None }
}

/// The wide-tile entry point of `kind` for `w` and its columns a block: 8-element chunk matrices with `n` outputs
/// within the grid's y limit.
pub(crate) fn wide_form(w: &CudaMat, kind: &str, n: usize) -> Option<(String, usize)> {
    w.kernel_wide(kind).filter(|(_, cols)| n.div_ceil(*cols) <= GRID_YZ)
}

/// Up to 3 linears of one input `x` `[rows, k]` in one launch per row span (`linear3_*`; calls that take the wide
/// tiles run a [`linear`] each): `outs[i] = mats[i] x`, no bias. The matrices must share cols, dtype and group (so one chunk form serves all); each output's bits equal its
/// own [`linear`]'s.
pub(crate) fn linears(
    be: &CudaBackend,
    x: &CudaBuf,
    rows: usize,
    mats: &[&CudaMat],
    outs: &[&mut CudaBuf],
) -> Result<(), CudaError> {
    expect((1..=3).contains(&mats.len()) && mats.len() == outs.len(), || {
        format!("linears: {} matrices and {} outputs (1 to 3)", mats.len(), outs.len())
    })?;
    let m0 = mats[0];
    for (m, o) in mats.iter().zip(outs) {
        expect(m.cols == m0.cols && m.dtype == m0.dtype && m.group == m0.group, || {
            format!("linears: [{}, {}] {:?} beside [{}, {}] {:?}", m.rows, m.cols, m.dtype, m0.rows, m0.cols, m0.dtype)
        })?;
        expect(o.len() == mul(rows, m.rows)?, || {
            format!("linears: out has {} values, expected [{rows}, {}]", o.len(), m.rows)
        })?;
    }
    let k = m0.cols;
    expect(x.len() == mul(rows, k)?, || format!("linears: x has {} values, expected [{rows}, {k}]", x.len()))?;
    if rows == 0 {
        return Ok(());
    }
    let tc = be.dev.tensor_cores() && mats.iter().all(|m| m.tc());
    if tc && !be.dev.wide(rows) && super::tc::few_linears(be, (x.ptr()?, rows), mats, outs)? {
        return Ok(());
    }
    if tc || mats.iter().all(|m| wide_kernel(be, m, "linear", rows, m.rows).is_some()) {
        // Wide and tensor-core calls: a linear each (the same bits, gate `multi`).
        for (m, o) in mats.iter().zip(outs) {
            linear_launch(be, x.ptr()?, rows, m, 0, o.ptr()?)?;
        }
        return Ok(());
    }
    let (name, cols) = m0.kernel_for("linear", be.dev.one_row(rows));
    let f = be.func(Src::Dense, &name.replacen("linear", "linear3", 1))?;
    let (table, gx) = multi_table(mats, outs, cols)?;
    if gx == 0 {
        return Ok(());
    }
    let tm = be.dev.stage(&table)?;
    let tp = tm.as_ref().map_or(0, |m| m.ptr);
    let (ri, ki, gi) = (int(rows, "rows")?, int(k, "cols")?, int(m0.group, "group")?);
    for row0 in (0..rows).step_by(RT * GRID_YZ) {
        let tiles = (rows - row0).div_ceil(RT).min(GRID_YZ) as u32;
        let args = [Arg::P(x.ptr()?), Arg::I(ri), Arg::I(ki), Arg::I(gi), Arg::P(tp), Arg::I(row0 as i32)];
        be.dev.launch(&f, (gx, tiles, 1), BLOCK, 0, &args)?;
    }
    Ok(())
}

/// The table of a launch over up to three matrices of one input (dense.cu's `multi_block`: 6 words a matrix:
/// values, scales, biases, outputs, out, first block; unused slots start past the grid) for blocks of `cols`
/// outputs, and the grid's block count. Errors: more blocks than a grid holds.
pub(crate) fn multi_table(
    mats: &[&CudaMat],
    outs: &[&mut CudaBuf],
    cols: usize,
) -> Result<([u64; 18], u32), CudaError> {
    let mut table = [0u64; 18];
    let mut first = 0u64;
    for (i, (m, o)) in mats.iter().zip(outs).enumerate() {
        let (w, sc, bi) = m.ptrs()?;
        table[6 * i..6 * i + 6].copy_from_slice(&[w, sc, bi, m.rows as u64, o.ptr()?, first]);
        first += m.rows.div_ceil(cols) as u64;
    }
    for slot in mats.len()..3 {
        table[6 * slot + 5] = u64::MAX;
    }
    let gx = u32::try_from(first).map_err(|_| CudaError::Shape(format!("linears: {first} blocks")))?;
    Ok((table, gx))
}

/// Dense SwiGLU: the fused gate-up kernel writes `silu(w1 x) * (w3 x)`, then the down projection.
pub(crate) fn swiglu(
    be: &CudaBackend,
    x: &CudaBuf,
    rows: usize,
    f: &Ffn<CudaMat>,
    out: &mut CudaBuf,
) -> Result<(), CudaError> {
    let (inter, h) = (f.w1.rows, f.w1.cols);
    same_kind(&f.w1, &f.w3)?;
    expect(f.w2.cols == inter, || format!("swiglu: w2 is [{}, {}] for width {inter}", f.w2.rows, f.w2.cols))?;
    expect(x.len() == mul(rows, h)?, || format!("swiglu: x has {} values, expected [{rows}, {h}]", x.len()))?;
    let act = be.buf(mul(rows, inter)?)?;
    if rows > 0 && inter > 0 && be.dev.tensor_cores() && f.w1.tc() {
        super::tc::gateup(be, x.ptr()?, rows, (&f.w1, &f.w3), act.ptr()?)?;
    } else if rows > 0 && inter > 0 {
        let ((g, gs, gb), (u, us, ub)) = (f.w1.ptrs()?, f.w3.ptrs()?);
        let (ri, hi, ii, gi) = (int(rows, "rows")?, int(h, "hidden")?, int(inter, "width")?, int(f.w1.group, "group")?);
        let mut args = vec![Arg::P(x.ptr()?), Arg::I(ri), Arg::I(hi), Arg::I(ii)];
        args.extend([g, gs, gb, u, us, ub].map(Arg::P));
        args.extend([Arg::I(gi), Arg::P(act.ptr()?)]);
        dense_launch(be, &f.w1, "gateup", (rows, inter), args)?;
    }
    linear(be, &act, rows, &f.w2, None, out)
}

/// Two matrices one fused kernel reads together must agree in shape, dtype and Q8 group.
pub(crate) fn same_kind(a: &CudaMat, b: &CudaMat) -> Result<(), CudaError> {
    expect(a.rows == b.rows && a.cols == b.cols && a.dtype == b.dtype && a.group == b.group, || {
        format!("matrices [{}, {}] {:?} and [{}, {}] {:?} differ", a.rows, a.cols, a.dtype, b.rows, b.cols, b.dtype)
    })
}

/// `acc += y` over the shorter length (as the CPU's zip).
pub(crate) fn add(be: &CudaBackend, acc: &mut CudaBuf, y: &CudaBuf) -> Result<(), CudaError> {
    let n = acc.len().min(y.len());
    if n == 0 {
        return Ok(());
    }
    let f = be.func(Src::Rows, "add_inplace")?;
    be.dev.launch(&f, (blocks(n)?, 1, 1), BLOCK, 0, &[Arg::P(acc.ptr()?), Arg::P(y.ptr()?), Arg::U(n as u64)])
}

/// Rows `rows` of `x` `[*, width]` as a new buffer; every index is checked on the host.
pub(crate) fn gather(be: &CudaBackend, x: &CudaBuf, width: usize, rows: &[usize]) -> Result<CudaBuf, CudaError> {
    let src_rows = x.len().checked_div(width).unwrap_or(0);
    if let Some(&bad) = rows.iter().find(|&&r| r >= src_rows) {
        return Err(CudaError::Shape(format!("gather_rows: row {bad} of a buffer of {src_rows} rows")));
    }
    let out = be.buf(mul(rows.len(), width)?)?;
    if out.is_empty() {
        return Ok(out);
    }
    let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
    let idm = be.dev.stage(&idx)?;
    let f = be.func(Src::Rows, "gather_rows")?;
    let args = [
        Arg::P(x.ptr()?),
        Arg::I(int(width, "width")?),
        Arg::P(idm.as_ref().map_or(0, |m| m.ptr)),
        Arg::I(int(rows.len(), "rows")?),
        Arg::I(int(src_rows, "source rows")?),
        Arg::P(out.ptr()?),
    ];
    be.dev.launch(&f, (blocks(out.len())?, 1, 1), BLOCK, 0, &args)?;
    Ok(out)
}

/// Per-head RMSNorm then RoPE of `x` `[rows, heads * head_dim]` in place, positions from the segment table; with
/// `second`, also of its tensor `[rows, heads2 * head_dim]` with its own weight, in the same launch.
pub(crate) fn qk_norm_rope(
    be: &CudaBackend,
    (x, heads, norm): (&mut CudaBuf, usize, &CudaBuf),
    second: Option<(&mut CudaBuf, usize, &CudaBuf)>,
    eps: f32,
    rope: RopeParams,
    segs: &[Segment],
) -> Result<(), KernelError> {
    let hd = rope.head_dim;
    let width = heads * hd;
    if width == 0 || hd > 1024 {
        // Each warp keeps its normed head in shared memory: 8 heads of at most 1024 values a block.
        return Err(KernelError::Shape {
            kernel: "qk_norm_rope",
            what: "head_dim (1 to 1024) x heads",
            got: width,
            want: hd.clamp(1, 1024),
        });
    }
    let rows = x.len() / width;
    check_len("qk_norm_rope", "x", x.len(), rows * width)?;
    check_len("qk_norm_rope", "norm", norm.len(), hd)?;
    if let Some((x2, heads2, norm2)) = &second {
        check_len("qk_norm_rope", "second x", x2.len(), rows * heads2 * hd)?;
        check_len("qk_norm_rope", "second norm", norm2.len(), hd)?;
    }
    let pos = row_positions(segs, rows)?;
    let mut words: Vec<u32> = Vec::with_capacity(rows + hd / 2);
    for &p in &pos {
        words.push(u32::try_from(p).map_err(|_| KernelError::Segments(format!("position {p} is past 2^32")))?);
    }
    words.extend((0..hd / 2).map(|i| rope_inv_freq(rope.theta, hd, i).to_bits()));
    let launch = || -> Result<(), CudaError> {
        let (x2, heads2, norm2) = match &second {
            Some((x2, h2, n2)) => (x2.ptr()?, *h2, n2.ptr()?),
            None => (0, 0, 0),
        };
        if rows == 0 {
            return Ok(());
        }
        let m = be.dev.stage(&words)?;
        let base = m.as_ref().map_or(0, |m| m.ptr);
        let f = be.func(Src::Rope, "qk_norm_rope")?;
        let args = [
            Arg::P(x.ptr()?),
            Arg::I(int(rows, "rows")?),
            Arg::I(int(heads, "heads")?),
            Arg::I(hd as i32),
            Arg::P(norm.ptr()?),
            Arg::F(eps),
            Arg::P(base),
            Arg::P(base + 4 * rows as u64),
            Arg::I(rope.interleaved as i32),
            Arg::P(x2),
            Arg::I(int(heads2, "heads")?),
            Arg::P(norm2),
        ];
        let grid = int(mul(rows, heads + heads2)?.div_ceil(WPB), "blocks")? as u32;
        be.dev.launch(&f, (grid, 1, 1), BLOCK, (WPB * hd * 4) as u32, &args)
    };
    launch().map_err(|e| e.kernel("qk_norm_rope"))
}

/// Greedy pick of each row of `logits` (`ceil(len / vocab)` rows; the last may be short, as the CPU's chunks).
pub(crate) fn greedy(be: &CudaBackend, logits: &CudaBuf, vocab: usize) -> Result<Vec<Pick>, CudaError> {
    if vocab == 0 || logits.is_empty() {
        return Ok(Vec::new());
    }
    let rows = logits.len().div_ceil(vocab);
    let picks = be.dev.alloc(f32_bytes(mul(rows, 2)?)?)?;
    let pp = picks.as_ref().map_or(0, |m| m.ptr);
    let f = be.func(Src::Rows, "greedy")?;
    let args = [Arg::P(logits.ptr()?), Arg::U(logits.len() as u64), Arg::I(int(vocab, "vocab")?), Arg::P(pp)];
    be.dev.launch(&f, (int(rows, "rows")? as u32, 1, 1), GREEDY_THREADS, 0, &args)?;
    let mut host = vec![0u32; rows * 2];
    be.dev.dtoh(&mut host, pp)?;
    Ok(host.chunks_exact(2).map(|p| Pick { token: p[0], nonfinite: p[1] != 0 }).collect())
}
