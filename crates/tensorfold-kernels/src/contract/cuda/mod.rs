//! Contract entries of the CUDA kernels (`tensorfold contract --backend cuda`): float64 references, row invariance
//! over call widths and multi-stream segment tables, edge gates, planted faults compiled into the kernels with
//! `-DFAULT_...` defines (or, for a host-side check, skipped by the entry's wrapper), and each kernel's launch
//! limits as the driver reports them; and the graph machinery's replays (`cuda.graphs`, faults planted on the host).

mod attention;
mod dense;
mod draw;
mod graphs;
mod mixers;
mod moe;
mod rows;

use super::{Gate, Kernel};
use crate::backend::Backend;
use crate::cuda::{CudaBackend, CudaBuf, Plant, Src};

/// Every CUDA kernel under contract, on `be`'s device.
pub fn registry(be: &CudaBackend) -> Vec<Box<dyn Kernel>> {
    let mut v: Vec<Box<dyn Kernel>> = Vec::new();
    v.extend(dense::kernels(be));
    v.extend(rows::kernels(be));
    v.extend(mixers::kernels(be));
    v.extend(attention::kernels(be));
    v.extend(moe::kernels(be));
    v.extend(draw::kernels(be));
    v.extend(graphs::kernels(be));
    v
}

/// A fault planted by compiling module `.1` with `-D.2`, under the control name `.0`.
pub(super) type Planted = (&'static str, Src, &'static str);

/// The backend a gate run uses: `base`, or `base` with the named fault's define compiled into its module.
pub(super) fn with_fault(base: &CudaBackend, plants: &[Planted], fault: Option<&str>) -> CudaBackend {
    match fault.and_then(|f| plants.iter().find(|p| p.0 == f)) {
        Some(&(_, src, define)) => base.planted(Plant { src, define }),
        None => base.clone(),
    }
}

/// Gate `device`: no device failure was left unreported by the gates' calls (reporting clears it, so the next
/// entry starts clean).
pub(super) fn device_gate(be: &CudaBackend) -> Gate {
    match be.dev.take("contract") {
        Ok(()) => Gate::new("device", true, "no device error"),
        Err(e) => Gate::new("device", false, e.to_string()),
    }
}

/// Bound of the warp dot of length `k`: `(ceil(k/32) + 6) * 2^-24 * sum|x*w|` (one lane's fmaf chain of
/// `ceil(k/32)` roundings, the butterfly's 5, and one for second-order terms).
pub(super) fn warp_dot_bound(k: usize, abs_sum: f64) -> f64 {
    (k.div_ceil(32) as f64 + 6.0) * f64::powi(2.0, -24) * abs_sum
}

/// Host values on the device.
pub(super) fn up(be: &CudaBackend, x: &[f32]) -> CudaBuf {
    be.upload(x)
}

/// An output buffer filled with NaN: an element a kernel fails to write reads back NaN and fails its check
/// (production outputs are uninitialized `scratch`).
pub(super) fn poisoned(be: &CudaBackend, n: usize) -> CudaBuf {
    be.upload(&vec![f32::NAN; n])
}

/// A device buffer on the host.
pub(super) fn rd(be: &CudaBackend, b: &CudaBuf) -> Vec<f32> {
    be.read(b)
}

/// Launch-limit lines of `names` in `src`.
pub(super) fn limits(be: &CudaBackend, src: Src, names: &[&str]) -> Vec<String> {
    be.limits(src, names)
}

/// The dense.cu entry points of `kind` for every dtype, chunk form and row form (tiles, one row).
pub(super) fn dense_names(kind: &str) -> Vec<String> {
    let forms = ["f32_v8", "f32_v1", "bf16_v8", "bf16_v1", "q8_v8", "q8_v1"];
    forms.iter().flat_map(|s| [format!("{kind}_{s}"), format!("{kind}_{s}_r1")]).collect()
}

/// The dense.cu wide-tile entry points of `kind` (8-element chunk forms only).
pub(super) fn wide_names(kind: &str) -> Vec<String> {
    ["f32_v8", "bf16_v8", "q8_v8"].iter().map(|s| format!("{kind}_wide_{s}")).collect()
}

/// Call widths of the CUDA invariance gates of the linears and experts: the CPU contract's [`super::WIDTHS`] and 70
/// rows, which take the wide tiles under [`WideAt`] (two full tiles of 32 and 6 rows).
pub(super) const CUDA_WIDTHS: [usize; 7] = [1, 2, 3, 8, 16, 33, 70];
/// The wide-tile threshold the linear, SwiGLU and MoE entries run under: the defaults (256 rows, and 32 assignments
/// an expert) would need far wider calls than a contract can afford on the emulator.
pub(super) const WIDE_AT: usize = 64;

/// Sets the device's wide-tile threshold to [`WIDE_AT`] for an entry's gates (whatever `TENSORFOLD_CUDA_WIDE_ROWS`
/// says), and puts the one before back when dropped.
pub(super) struct WideAt<'a>(&'a CudaBackend, Option<usize>);

impl<'a> WideAt<'a> {
    pub(super) fn new(be: &'a CudaBackend) -> Self {
        let was = be.dev.set_wide_rows(Some(WIDE_AT));
        WideAt(be, was)
    }
}

impl Drop for WideAt<'_> {
    fn drop(&mut self) {
        self.0.dev.set_wide_rows(self.1);
    }
}
/// The widest of [`CUDA_WIDTHS`]: the gates make this many input rows.
pub(super) const MAX_WIDTH: usize = 70;
/// Distinct input rows of those gates: row r is row r % DISTINCT, so one-row calls are made for these only and the
/// wide call holds the same rows at other tile positions (which must not change a bit).
pub(super) const DISTINCT: usize = 33;

/// [`MAX_WIDTH`] rows of `k` values cycling over the [`DISTINCT`] rows of `x`.
pub(super) fn cyclic(x: &[f32], k: usize) -> Vec<f32> {
    (0..MAX_WIDTH).flat_map(|r| x[(r % DISTINCT) * k..(r % DISTINCT + 1) * k].iter().copied()).collect()
}
// The widest call must take the wide tiles and end in a partial tile; the one-row calls' widths must not.
const _: () = assert!(MAX_WIDTH >= WIDE_AT && DISTINCT < WIDE_AT && !MAX_WIDTH.is_multiple_of(32));

/// Splits `rows` rows over `streams` streams as contiguous segments at positions `starts` (stream i gets a share;
/// some may get none), as the CPU contract's multi-stream tables.
pub(super) fn split(rows: usize, streams: usize, starts: &[usize]) -> Vec<crate::backend::Segment> {
    let mut segs = Vec::new();
    let mut first = 0;
    for (s, &start_pos) in starts.iter().enumerate().take(streams) {
        let n = if s + 1 == streams { rows - first } else { (rows - first).min(rows.div_ceil(streams) + s % 2) };
        if n > 0 {
            segs.push(crate::backend::Segment { first_row: first, rows: n, start_pos, cache: s });
        }
        first += n;
    }
    segs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_planted_define_is_tested_by_its_module_source() {
        let all = [
            attention::ATTN_PLANTS,
            attention::BLOCK_PLANTS,
            dense::LINEAR_PLANTS,
            dense::SWIGLU_PLANTS,
            mixers::ROPE_PLANTS,
            mixers::CONV_PLANTS,
            moe::MOE_PLANTS,
            rows::EMBED_PLANTS,
            rows::RMS_PLANTS,
            rows::ROWS_PLANTS,
            rows::GREEDY_PLANTS,
            draw::DRAW_PLANTS,
        ];
        for &(name, src, define) in all.iter().flat_map(|p| p.iter()) {
            assert!(
                src.source().contains(&format!("#ifdef {define}\n")),
                "{name}: {define} is not in {}.cu",
                src.name()
            );
        }
    }

    #[test]
    fn split_covers_every_row_once_in_order() {
        for rows in [1, 2, 3, 8, 16, 33] {
            let segs = split(rows, 4, &[5, 0, 700, 3]);
            let mut next = 0;
            for s in &segs {
                assert_eq!(s.first_row, next);
                assert!(s.rows > 0);
                next += s.rows;
            }
            assert_eq!(next, rows);
        }
    }
}
