//! Contract entries of the CUDA kernels (`tensorfold contract --backend cuda`): float64 references, row invariance
//! over call widths and multi-stream segment tables, edge gates, planted faults compiled into the kernels with
//! `-DFAULT_...` defines (or, for a host-side check, skipped by the entry's wrapper), and each kernel's launch
//! limits as the driver reports them; and the graph machinery's replays (`cuda.graphs`, faults planted on the host).

mod attention;
mod attention_tc;
mod dense;
mod dense_tc;
mod draw;
mod graphs;
mod mixers;
mod moe;
mod rows;

use crate::{Entry, FaultKind, Gate};
use tensorfold_kernels::cuda::{CudaBackend, CudaBuf, Plant, Src};
use tensorfold_kernels::prelude::*;

/// Every CUDA kernel under contract, on `be`'s device.
pub fn registry(be: &CudaBackend) -> Vec<Box<dyn Entry>> {
    let mut v: Vec<Box<dyn Entry>> = Vec::new();
    v.extend(dense::kernels(be));
    v.extend(dense_tc::kernels(be));
    v.extend(rows::kernels(be));
    v.extend(mixers::kernels(be));
    v.extend(attention::kernels(be));
    v.extend(attention_tc::kernels(be));
    v.extend(moe::kernels(be));
    v.extend(draw::kernels(be));
    v.extend(graphs::kernels(be));
    v
}

/// A fault planted by compiling module `.1` with `-D.2`, for the control `.0`.
pub(super) type Planted<F> = (F, Src, &'static str);

/// The backend a gate run uses: `base`, or `base` with `fault`'s define compiled into its module (a fault with no
/// define is planted on the host by the entry's gates).
pub(super) fn with_fault<F: FaultKind>(base: &CudaBackend, plants: &[Planted<F>], fault: Option<F>) -> CudaBackend {
    match fault.and_then(|f| plants.iter().find(|p| p.0 == f)) {
        Some(&(_, src, define)) => base.planted(Plant { src, define }),
        None => base.clone(),
    }
}

/// Sets the device's tensor-core mode for an entry's gates (`on`, attention on the tensor cores with it whatever
/// `TENSORFOLD_CUDA_ATTN_MMA` said) and puts the ones before back when dropped.
pub(super) struct TensorCoresOn<'a>(&'a CudaBackend, bool, bool);

impl<'a> TensorCoresOn<'a> {
    pub(super) fn new(be: &'a CudaBackend, on: bool) -> Self {
        let was = be.set_tensor_cores(on);
        let mma = be.set_attn_mma(true);
        TensorCoresOn(be, was, mma)
    }
}

impl Drop for TensorCoresOn<'_> {
    fn drop(&mut self) {
        self.0.set_tensor_cores(self.1);
        self.0.set_attn_mma(self.2);
    }
}

/// Gate `device`: no device failure was left unreported by the gates' calls (reporting clears it, so the next
/// entry starts clean).
pub(super) fn device_gate(be: &CudaBackend) -> Gate {
    match be.take_error("contract") {
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
    let forms = ["f32_v8", "f32_v1", "bf16_v8", "bf16_v1", "q8_v8", "q8_v1", "q4_v8", "q4_v1"];
    forms.iter().flat_map(|s| [format!("{kind}_{s}"), format!("{kind}_{s}_r1")]).collect()
}

/// The dense.cu wide-tile entry points of `kind` (8-element chunk forms only).
pub(super) fn wide_names(kind: &str) -> Vec<String> {
    ["f32_v8", "bf16_v8", "q8_v8", "q4_v8"].iter().map(|s| format!("{kind}_wide_{s}")).collect()
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
        let was = be.set_wide_rows(Some(WIDE_AT));
        WideAt(be, was)
    }
}

impl Drop for WideAt<'_> {
    fn drop(&mut self) {
        self.0.set_wide_rows(self.1);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_planted_define_is_tested_by_its_module_source() {
        fn named<F: FaultKind>(p: &[Planted<F>]) -> Vec<(&'static str, Src, &'static str)> {
            p.iter().map(|&(f, src, define)| (f.name(), src, define)).collect()
        }
        let all = [
            named(attention::ATTN_PLANTS),
            named(attention::BLOCK_PLANTS),
            named(dense::LINEAR_PLANTS),
            named(dense::SWIGLU_PLANTS),
            named(dense_tc::TC_PLANTS),
            named(mixers::ROPE_PLANTS),
            named(mixers::CONV_PLANTS),
            named(moe::MOE_PLANTS),
            named(rows::EMBED_PLANTS),
            named(rows::RMS_PLANTS),
            named(rows::ROWS_PLANTS),
            named(rows::GREEDY_PLANTS),
            named(draw::DRAW_PLANTS),
        ];
        for &(name, src, define) in all.iter().flatten() {
            assert!(
                src.planted_source().contains(&format!("#ifdef {define}\n")),
                "{name}: {define} is not in {}.cu",
                src.name()
            );
        }
    }
}
