//! CPU row kernels on plain slices: embedding, RMSNorm, linear, q/k norm + RoPE, SwiGLU, greedy pick.
//!
//! Each output element is reduced by `simd::dot_grid` in the canonical order, and work is split across
//! threads by output column or row only, so a row's bits never depend on the batch or the thread count.

pub use crate::backend::rope_inv_freq;
use crate::backend::{KernelError, Pick, RopeParams};
use crate::bytes::{Dtype, MatView};
use crate::shape::check_len;
use crate::simd::{self, Level, WRow};
use rayon::prelude::*;

/// Rows of `x` a linear task keeps hot in cache while it walks its weight rows.
const ROW_BLOCK: usize = 64;
/// Weight rows (output columns) a register block of the linear spans: 16 for one row (decode), 4 by 4 rows.
const COL_BLOCK: usize = 16;
/// Rows of `x` from which an affine column block is widened once into f32 rows, shared by every row of the row
/// block, instead of in registers by each register block (which widens a chunk once for 1 or 4 rows).
const WIDEN_ROWS: usize = 8;

/// Multiply-adds below which a kernel runs on the calling thread: handing a decode step's small matrices to the
/// pool costs more (waking threads, then waiting for them) than it saves. Where the split falls never changes bits.
/// Since the forward runs on a pool worker (`Ops::on_workers`), a split is a fork, cheap enough that the default
/// pair's 256 x 256 projections gain from it: one-stream decode at 2 threads ~1,180 against ~1,010 tok/s at 1 << 17
/// (docs/receipts/2026-12-06-cpu-decode.md).
const PAR_MIN_MACS: usize = 1 << 16;

/// Whether `macs` multiply-adds are worth splitting across the pool's threads.
pub(crate) fn worth_threads(macs: usize) -> bool {
    macs >= PAR_MIN_MACS && rayon::current_num_threads() > 1
}

/// A raw pointer that threads writing disjoint elements may share.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub *mut f32);

impl SendPtr {
    /// Element `i` (a method, so closures capture the whole `Send` wrapper, not the raw field).
    ///
    /// # Safety
    /// `i` must be inside the buffer the pointer came from.
    pub(crate) unsafe fn at(self, i: usize) -> *mut f32 {
        // SAFETY: forwarded to the caller.
        unsafe { self.0.add(i) }
    }
}
// SAFETY: every user writes only elements no other task touches (disjoint output columns or rows).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// Weight row `j` of `w`.
pub fn wrow(w: &MatView, j: usize) -> WRow<'_> {
    MatRows::of(w).row(j)
}

/// A matrix's element, scale and bias slices, cast once, so a kernel that reads many rows by index does not
/// redo the casts a row.
#[derive(Clone, Copy)]
enum MatRows<'a> {
    F32(&'a [f32], usize),
    Bf16(&'a [u16], usize),
    Affine { codes: &'a [u8], scales: &'a [f32], biases: &'a [f32], cols: usize, group: usize, q4: bool },
}

impl<'a> MatRows<'a> {
    fn of(w: &'a MatView) -> Self {
        let b = w.bytes.as_slice();
        match w.dtype {
            Dtype::F32 => MatRows::F32(bytemuck::cast_slice(b), w.cols),
            Dtype::Bf16 => MatRows::Bf16(bytemuck::cast_slice(b), w.cols),
            Dtype::Q8 | Dtype::Q4 => {
                let a = w.affine.as_ref().expect("an affine matrix has scales and biases");
                MatRows::Affine {
                    codes: b,
                    scales: bytemuck::cast_slice(a.scales.as_slice()),
                    biases: bytemuck::cast_slice(a.biases.as_slice()),
                    cols: w.cols,
                    group: a.group,
                    q4: w.dtype == Dtype::Q4,
                }
            }
        }
    }

    /// The chunk form of an affine matrix (see [`simd::affine::ChunkedMat::of`]); `None` for other matrices.
    fn chunked(&self) -> Option<simd::affine::ChunkedMat<'a>> {
        match *self {
            MatRows::Affine { codes, scales, biases, cols, group, q4 } => {
                simd::affine::ChunkedMat::of(codes, scales, biases, cols, group, q4)
            }
            _ => None,
        }
    }

    /// Row `j` (panics past the last row).
    #[inline(always)]
    fn row(&self, j: usize) -> WRow<'a> {
        match *self {
            MatRows::F32(v, k) => WRow::F32(&v[j * k..(j + 1) * k]),
            MatRows::Bf16(v, k) => WRow::Bf16(&v[j * k..(j + 1) * k]),
            MatRows::Affine { codes, scales, biases, cols, group, q4 } => {
                let g = cols / group;
                let (scales, biases) = (&scales[j * g..(j + 1) * g], &biases[j * g..(j + 1) * g]);
                if q4 {
                    WRow::Q4 { codes: &codes[j * cols / 2..(j + 1) * cols / 2], scales, biases, group }
                } else {
                    WRow::Q8 { codes: &codes[j * cols..(j + 1) * cols], scales, biases, group }
                }
            }
        }
    }
}

/// `out[r, j] = dot(x[r], w[j]) (+ bias[j])` for `x` `[rows, w.cols]`, `out` `[rows, w.rows]`, on `level`,
/// split across threads by output column.
pub fn linear_on(level: Level, x: &[f32], rows: usize, w: &MatView, bias: Option<&[f32]>, out: &mut [f32]) {
    let (n, k) = (w.rows, w.cols);
    assert_eq!(x.len(), rows * k, "linear: x is not [rows, cols]");
    assert_eq!(out.len(), rows * n, "linear: out is not [rows, n]");
    if rows == 0 || n == 0 {
        return;
    }
    let xs: Vec<&[f32]> = x.chunks_exact(k).collect();
    if !worth_threads(rows * n * k) {
        // SAFETY: this caller writes every column of `out` alone.
        return unsafe { linear_cols(level, &xs, w, bias, 0..n, SendPtr(out.as_mut_ptr())) };
    }
    let threads = rayon::current_num_threads().max(1);
    // Whole register blocks a task, where the matrix has enough of them.
    let cols_per_task = (n / (threads * 8)).clamp(8, 256).next_multiple_of(COL_BLOCK).min(n);
    let ptr = SendPtr(out.as_mut_ptr());
    (0..n.div_ceil(cols_per_task)).into_par_iter().for_each(|task| {
        let j0 = task * cols_per_task;
        // SAFETY: tasks own disjoint column ranges of `out`.
        unsafe { linear_cols(level, &xs, w, bias, j0..(j0 + cols_per_task).min(n), ptr) };
    });
}

/// [`linear_on`] on the calling thread only (for callers that parallelize over something else, such as
/// the experts of a MoE layer). Same bits: a column's result does not depend on the split.
pub fn linear_serial(x: &[f32], rows: usize, w: &MatView, bias: Option<&[f32]>, out: &mut [f32]) {
    assert_eq!(x.len(), rows * w.cols, "linear: x is not [rows, cols]");
    assert_eq!(out.len(), rows * w.rows, "linear: out is not [rows, n]");
    let xs: Vec<&[f32]> = x.chunks_exact(w.cols.max(1)).collect();
    // SAFETY: one caller writes every column of its own `out`.
    unsafe { linear_cols(simd::level(), &xs, w, bias, 0..w.rows, SendPtr(out.as_mut_ptr())) };
}

/// Columns `cols` of the linear, row blocks of [`ROW_BLOCK`] kept hot while the weight rows stream by, each
/// block of [`COL_BLOCK`] columns by [`simd::dot_grid`] (several rows by several columns a register block, each
/// output still its own canonical dot).
///
/// # Safety
/// `out` must point at `[xs.len(), w.rows]` f32, and no other thread may write columns `cols`.
unsafe fn linear_cols(
    level: Level,
    xs: &[&[f32]],
    w: &MatView,
    bias: Option<&[f32]>,
    cols: std::ops::Range<usize>,
    out: SendPtr,
) {
    let (rows, n) = (xs.len(), w.rows);
    // SAFETY: forwarded (this caller's `out` and columns).
    if rows == 1 && unsafe { one_row(level, xs[0], w, cols.clone(), bias, out) } {
        return;
    }
    let mut tmp = vec![0f32; ROW_BLOCK.min(rows) * COL_BLOCK];
    let mut wide = Vec::new();
    let m = MatRows::of(w);
    for r0 in (0..rows).step_by(ROW_BLOCK) {
        let r1 = (r0 + ROW_BLOCK).min(rows);
        for j0 in cols.clone().step_by(COL_BLOCK) {
            let j1 = (j0 + COL_BLOCK).min(cols.end);
            block_grid(level, &m, &xs[r0..r1], j0..j1, &mut wide, &mut tmp);
            for i in 0..r1 - r0 {
                for (j, v) in (j0..j1).zip(&tmp[i * COL_BLOCK..]) {
                    let v = match bias {
                        Some(b) => v + b[j],
                        None => *v,
                    };
                    // SAFETY: (r0 + i, j) is inside out, and column j belongs to this caller only.
                    unsafe { *out.at((r0 + i) * n + j) = v };
                }
            }
        }
    }
}

/// A one-row call (a decode step's) over f32 or bf16 weights on AVX-512: columns `cols` by [`simd::dot_rows`], the
/// same dots as the column blocks without their per-block work. `false` (nothing written) for other calls.
///
/// # Safety
/// As [`linear_cols`].
unsafe fn one_row(
    level: Level,
    x: &[f32],
    w: &MatView,
    cols: std::ops::Range<usize>,
    bias: Option<&[f32]>,
    out: SendPtr,
) -> bool {
    let b = w.bytes.as_slice();
    let rows = match w.dtype {
        Dtype::F32 => simd::Rows::F32(bytemuck::cast_slice(b), w.cols),
        Dtype::Bf16 => simd::Rows::Bf16(bytemuck::cast_slice(b), w.cols),
        Dtype::Q8 | Dtype::Q4 => return false,
    };
    // SAFETY: row 0 of `out` holds `w.rows` columns, and columns `cols` belong to this caller only.
    let o = unsafe { std::slice::from_raw_parts_mut(out.at(cols.start), cols.len()) };
    if !simd::dot_rows(level, x, rows, cols.clone(), o) {
        return false;
    }
    if let Some(bias) = bias {
        o.iter_mut().zip(&bias[cols]).for_each(|(v, b)| *v += b);
    }
    true
}

/// `tmp[i * COL_BLOCK + c] = dot(xs[i], w[cols.start + c])` for the column block `cols` (at most [`COL_BLOCK`]).
/// Affine rows in chunk form widen in registers, or, when at least [`WIDEN_ROWS`] x rows share them, once
/// into `buf` (each weight `fma(q, scale, bias)`, the value the registers would hold) for the f32 grid.
fn block_grid(
    level: Level,
    m: &MatRows,
    xs: &[&[f32]],
    cols: std::ops::Range<usize>,
    buf: &mut Vec<f32>,
    tmp: &mut [f32],
) {
    let (j0, n) = (cols.start, cols.len());
    debug_assert!(n > 0 && n <= COL_BLOCK);
    let at = |i: usize| j0 + i.min(n - 1);
    match m.chunked() {
        Some(cm) if xs.len() >= WIDEN_ROWS => {
            let k = cm.row(j0).len;
            buf.resize(n * k, 0.0);
            for (i, o) in buf.chunks_exact_mut(k).enumerate() {
                simd::affine::widen_into(level, &cm.row(j0 + i), o);
            }
            let ws: [WRow; COL_BLOCK] =
                std::array::from_fn(|i| WRow::F32(&buf[i.min(n - 1) * k..(i.min(n - 1) + 1) * k]));
            simd::dot_grid(level, xs, &ws[..n], tmp, COL_BLOCK);
        }
        Some(cm) => {
            let mut ws = [simd::affine::Chunked::default(); COL_BLOCK];
            for (i, w) in ws[..n].iter_mut().enumerate() {
                *w = cm.row(j0 + i);
            }
            simd::dot_grid_chunked(level, xs, &ws[..n], tmp, COL_BLOCK);
        }
        None => {
            let ws: [WRow; COL_BLOCK] = std::array::from_fn(|i| m.row(at(i)));
            simd::dot_grid(level, xs, &ws[..n], tmp, COL_BLOCK);
        }
    }
}

/// [`linear_on`] at the detected SIMD level.
pub fn linear(x: &[f32], rows: usize, w: &MatView, bias: Option<&[f32]>, out: &mut [f32]) {
    linear_on(simd::level(), x, rows, w, bias, out)
}

/// Gathers embedding rows, widened to f32 exactly. `out` is `[ids.len(), table.cols]`.
pub fn embed(table: &MatView, ids: &[u32], out: &mut [f32]) -> Result<(), KernelError> {
    let h = table.cols;
    check_len("embed", "out", out.len(), ids.len() * h)?;
    for (row, &id) in out.chunks_exact_mut(h).zip(ids) {
        if id as usize >= table.rows {
            return Err(KernelError::TokenOutOfRange { id, vocab: table.rows });
        }
        match wrow(table, id as usize) {
            WRow::F32(w) => row.copy_from_slice(w),
            WRow::Bf16(w) => row.iter_mut().zip(w).for_each(|(o, &b)| *o = f32::from_bits((b as u32) << 16)),
            q @ (WRow::Q8 { .. } | WRow::Q4 { .. }) => row.iter_mut().enumerate().for_each(|(i, o)| *o = q.get(i)),
        }
    }
    Ok(())
}

/// RMSNorm of one row: `x * (1 / sqrt(dot(x, x) / n + eps)) * weight`.
pub fn rmsnorm_row(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ss = simd::dot(x, WRow::F32(x));
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// Row-wise RMSNorm of `x` `[rows, width]`.
pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, width: usize, out: &mut [f32]) {
    assert_eq!(weight.len(), width, "rmsnorm: weight width");
    out.par_chunks_mut(width).zip(x.par_chunks(width)).for_each(|(o, r)| rmsnorm_row(r, weight, eps, o));
}

/// Per-head RMSNorm then RoPE (half-split or interleaved pairs) of one row `x` `[heads * head_dim]` at
/// `pos`.
pub fn qk_norm_rope_row(x: &mut [f32], norm: &[f32], eps: f32, rope: RopeParams, pos: usize) {
    let hd = rope.head_dim;
    let half = hd / 2;
    let mut cs = vec![(0f32, 0f32); half];
    for (i, c) in cs.iter_mut().enumerate() {
        let angle = rope_inv_freq(rope.theta, hd, i) * pos as f32;
        *c = ((angle as f64).cos() as f32, (angle as f64).sin() as f32);
    }
    let mut normed = vec![0f32; hd];
    for head in x.chunks_exact_mut(hd) {
        rmsnorm_row(head, norm, eps, &mut normed);
        for (i, &(c, s)) in cs.iter().enumerate() {
            let (ia, ib) = if rope.interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
            let (a, b) = (normed[ia], normed[ib]);
            head[ia] = a * c - b * s;
            head[ib] = b * c + a * s;
        }
    }
}

/// `silu(g) * u` elementwise into `g`, split across threads; silu(v) = v / (1 + exp(-v)).
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    g.par_chunks_mut(4096).zip(u.par_chunks(4096)).for_each(|(g, u)| silu_mul_serial(g, u));
}

/// [`silu_mul`] on the calling thread (same arithmetic per element; `exp` is [`simd::exp::expf`]).
pub fn silu_mul_serial(g: &mut [f32], u: &[f32]) {
    let level = simd::level();
    let mut e = [0f32; 256];
    for (g, u) in g.chunks_mut(256).zip(u.chunks(256)) {
        let e = &mut e[..g.len()];
        for (e, &a) in e.iter_mut().zip(g.iter()) {
            *e = -a;
        }
        simd::exp::exp_in_place(level, e);
        for ((a, &b), &e) in g.iter_mut().zip(u).zip(e.iter()) {
            *a = *a / (1.0 + e) * b;
        }
    }
}

/// Greedy pick of one row: the first largest logit; a NaN or infinite logit flags the row.
pub fn greedy_row(row: &[f32]) -> Pick {
    let mut best = 0usize;
    let mut nonfinite = row.is_empty();
    for (i, &v) in row.iter().enumerate() {
        if !v.is_finite() {
            nonfinite = true;
        } else if v > row[best] || !row[best].is_finite() {
            best = i;
        }
    }
    Pick { token: best as u32, nonfinite }
}
