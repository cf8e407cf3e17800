//! The CUDA backend's environment settings: tensor cores (linears and attention), the one-row, wide-tile and tiled-attention row thresholds.

use super::super::CudaError;
use super::{ATTN_TILE, Dev, R1_ROWS, UNSET, WIDE_ROWS, WIDE_SLOTS, driver, lock};
use cudarc::driver::{CudaFunction, sys};
use std::sync::atomic::Ordering;

/// The tensor-core mode from `flag` (`--tensor-cores`: on whatever the environment says) or the
/// `TENSORFOLD_CUDA_TENSOR_CORES` setting `v`: `1` on, `0` or unset off; anything else is refused by name, as is
/// either way of asking on a device without bf16 tensor cores (before sm_80).
pub(crate) fn tensor_cores_setting(v: Option<String>, flag: bool, major: i32) -> Result<bool, CudaError> {
    let name = "TENSORFOLD_CUDA_TENSOR_CORES";
    if flag {
        return match major >= 8 {
            true => Ok(true),
            false => Err(CudaError::Setting {
                name: "--tensor-cores",
                value: "on".into(),
                want: "off (this device has no bf16 tensor cores)",
            }),
        };
    }
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

/// The `TENSORFOLD_CUDA_ATTN_MMA` setting: unset or `1` on (with tensor cores on, attention runs on them),
/// `0` off (attention stays on the CUDA cores: a measuring aid; the process's bits move with it); anything else is
/// refused by name.
pub(crate) fn attn_mma_setting(v: Option<String>) -> Result<bool, CudaError> {
    match v.as_deref().map(str::trim) {
        None | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(_) => Err(CudaError::Setting {
            name: "TENSORFOLD_CUDA_ATTN_MMA",
            value: v.unwrap_or_default(),
            want: "1 (on, the default) or 0 (attention on the CUDA cores)",
        }),
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

impl Dev {
    /// Whether attention runs on the tensor cores (attention_mma.cu): the tensor-core mode is on and
    /// `TENSORFOLD_CUDA_ATTN_MMA` did not turn it off.
    pub fn attn_mma(&self) -> bool {
        self.tensor_cores() && self.attn_mma.load(Ordering::Relaxed)
    }

    /// Sets whether attention follows the tensor-core mode and returns the one before: the contract's tensor-core
    /// attention entries check `attn_mma` whatever the environment said.
    #[cfg(feature = "planted-faults")]
    pub fn set_attn_mma(&self, on: bool) -> bool {
        self.attn_mma.swap(on, Ordering::Relaxed)
    }

    /// Whether an attention call whose largest segment holds `rows` rows runs the tiled form, given it needs `smem`
    /// bytes of shared memory a block: at least [`ATTN_TILE`] rows or the override's (0: never), and the device
    /// lets a block have that much.
    pub fn attn_tiled(&self, rows: usize, smem: usize) -> bool {
        let v = self.attn_tile_rows.load(Ordering::Relaxed);
        let min = if v == UNSET { ATTN_TILE } else { v };
        min > 0 && rows >= min && smem <= self.smem_optin
    }

    /// Sets the tiled attention's row threshold (`None`: [`ATTN_TILE`]) and returns the one before: the contract
    /// checks the tiled form at widths under the default.
    #[cfg(feature = "planted-faults")]
    pub fn set_attn_tile_rows(&self, rows: Option<usize>) -> Option<usize> {
        let was = self.attn_tile_rows.swap(rows.unwrap_or(UNSET), Ordering::Relaxed);
        (was != UNSET).then_some(was)
    }

    /// Lets `f` launch with `bytes` of dynamic shared memory (past the 48 KiB every kernel may take), once a
    /// kernel and size.
    pub fn allow_smem(&self, f: &CudaFunction, bytes: usize) -> Result<(), CudaError> {
        let key = f.cu_function() as usize;
        let mut allowed = lock(&self.smem_allowed);
        if allowed.get(&key).is_some_and(|&b| b >= bytes) {
            return Ok(());
        }
        self.bind()?;
        let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        let value = i32::try_from(bytes).map_err(|_| CudaError::Setting {
            name: "dynamic shared memory",
            value: bytes.to_string(),
            want: "at most 2^31 bytes",
        })?;
        f.set_attribute(attr, value).map_err(|e| driver("cuFuncSetAttribute", e))?;
        allowed.insert(key, bytes);
        Ok(())
    }
}
