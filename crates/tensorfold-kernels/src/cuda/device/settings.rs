//! The CUDA backend's environment settings: tensor cores, the one-row and wide-tile row thresholds.

use super::super::CudaError;
use super::{R1_ROWS, WIDE_ROWS, WIDE_SLOTS};

/// The `TENSORFOLD_CUDA_TENSOR_CORES` setting: `1` on, `0` or unset off; anything else is refused by name, as is
/// `1` on a device without bf16 tensor cores (before sm_80).
pub(crate) fn tensor_cores_setting(v: Option<String>, major: i32) -> Result<bool, CudaError> {
    let name = "TENSORFOLD_CUDA_TENSOR_CORES";
    match v.as_deref().map(str::trim) {
        None | Some("0") => Ok(false),
        Some("1") if major >= 8 => Ok(true),
        Some("1") => {
            Err(CudaError::Setting { name, value: "1".into(), want: "0 (this device has no bf16 tensor cores)" })
        }
        Some(_) => {
            Err(CudaError::Setting { name, value: v.unwrap_or_default(), want: "0 (off, the default) or 1 (on)" })
        }
    }
}

/// [`Dev::one_row`] with the override `r1_rows` given.
pub(crate) fn one_row(r1_rows: Option<usize>, rows: usize) -> bool {
    rows <= r1_rows.unwrap_or(R1_ROWS)
}

/// [`Dev::wide`] (`moe` None) and [`Dev::wide_moe`] (`moe` = (assignments, experts)) under the override `over`.
pub(crate) fn wide(over: Option<usize>, rows: usize, moe: Option<(usize, usize)>) -> bool {
    match over {
        Some(n) => n > 0 && rows >= n,
        None => rows >= WIDE_ROWS && moe.is_none_or(|(a, e)| a >= WIDE_SLOTS.saturating_mul(e)),
    }
}

/// A row-count setting from the environment: unset is `None`, a whole number `Some`, anything else refused by name.
pub(super) fn rows_setting(name: &'static str) -> Result<Option<usize>, CudaError> {
    match std::env::var(name) {
        Ok(v) => match v.trim().parse() {
            Ok(n) => Ok(Some(n)),
            Err(_) => Err(CudaError::Setting { name, value: v, want: "a count (a whole number of rows)" }),
        },
        Err(_) => Ok(None),
    }
}
