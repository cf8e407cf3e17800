//! Device-side types of the CUDA backend: f32 activation buffers, weight matrices in their stored dtype, per-stream
//! KV caches that grow by reallocation, and conv states with the kept rollback window.

use super::CudaError;
use super::device::{CT, Dev, Mem, WPB, WTN};
use crate::backend::KEEP_ROWS;
use crate::bytes::Dtype;
use std::sync::Arc;

/// Bytes of `n` f32 values, refusing sizes past the address space.
pub(crate) fn f32_bytes(n: usize) -> Result<usize, CudaError> {
    n.checked_mul(4).ok_or_else(|| CudaError::Shape(format!("{n} values do not fit in memory")))
}

/// An f32 buffer on the device: `len` values. It holds no memory when empty, or when its allocation failed (that
/// failure was recorded, and any launch that reads or writes it is refused as [`CudaError::Unallocated`]).
pub struct CudaBuf {
    pub(crate) mem: Option<Mem>,
    pub(crate) len: usize,
}

impl CudaBuf {
    /// Values held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device address (0 for an empty buffer). Errors when a non-empty buffer has no memory.
    pub(crate) fn ptr(&self) -> Result<u64, CudaError> {
        match &self.mem {
            Some(m) => Ok(m.ptr),
            None if self.len == 0 => Ok(0),
            None => Err(CudaError::Unallocated),
        }
    }
}

/// A weight matrix `[rows, cols]` on the device in its stored dtype: f32 values, bf16 bits, or 8-bit affine codes
/// with their f32 scales and biases (`[rows, cols / group]` each).
pub struct CudaMat {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Stored element type.
    pub dtype: Dtype,
    /// Q8, Q4: elements a group; 1 otherwise.
    pub(crate) group: usize,
    pub(crate) data: Option<Mem>,
    pub(crate) scales: Option<Mem>,
    pub(crate) biases: Option<Mem>,
}

impl CudaMat {
    /// Bytes on the device (codes, scales and biases).
    pub fn bytes(&self) -> usize {
        [&self.data, &self.scales, &self.biases].iter().map(|m| m.as_ref().map_or(0, |m| m.bytes)).sum()
    }

    /// Addresses of the values, the Q8 scales and the Q8 biases (0 where absent).
    pub(crate) fn ptrs(&self) -> Result<(u64, u64, u64), CudaError> {
        let p = |m: &Option<Mem>| m.as_ref().map_or(0, |m| m.ptr);
        if self.data.is_none() && self.rows * self.cols > 0 {
            return Err(CudaError::Unallocated);
        }
        Ok((p(&self.data), p(&self.scales), p(&self.biases)))
    }

    /// Whether the 8-element chunk kernels apply: they need `cols` (and a Q8 group) to be multiples of 8. A
    /// property of the matrix alone, so every call on it reduces in the same order.
    pub(crate) fn v8(&self) -> bool {
        self.cols.is_multiple_of(8) && (!self.dtype.is_affine() || self.group.is_multiple_of(8))
    }

    /// Whether the tensor-core linears (dense_tc.cu) serve this matrix: k a non-zero multiple of 32 (whole chunks of
    /// the tensor-core chain), bf16, or Q8 / Q4 whose group is 32 times a power of two (a chunk then lies in one
    /// group: its value is `s * sum(q x) + b * sum(x)`). Fixed by the matrix, so a matrix has one form at every width.
    pub(crate) fn tc(&self) -> bool {
        let whole = self.cols > 0 && self.cols.is_multiple_of(32);
        let group = self.group >= 32 && self.group.is_power_of_two() && self.cols.is_multiple_of(self.group);
        whole && (self.dtype == Dtype::Bf16 || (self.dtype.is_affine() && group))
    }

    /// The dtype in this matrix's kernel names (dense.cu's entries; dense_tc.cu's `TC_NARROW_ENTRIES` and
    /// dense_tcw.cu's `TCW_ENTRIES` for the tensor-core ones, where f32 has none: its name is refused at lookup).
    pub(crate) fn dtype_name(&self) -> &'static str {
        match self.dtype {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::Q8 => "q8",
            Dtype::Q4 => "q4",
        }
    }

    /// The dense.cu entry point of kernel family `kind` (`linear`, `gateup`, `moe_gateup`, `moe_down`) for this matrix.
    pub(crate) fn kernel(&self, kind: &str) -> String {
        format!("{kind}_{}_{}", self.dtype_name(), if self.v8() { "v8" } else { "v1" })
    }

    /// [`Self::kernel`], and the output columns a block of it covers: the `_r1` form (a row at a time, 8 loads in
    /// flight a lane, a column a warp) when `one_row` ([`super::device::Dev::one_row`]), else the tile form ([`CT`]
    /// columns a warp, half that for the gate-up forms, which read two matrices: dense.cu's `GC`). Both give every
    /// row the same bits.
    pub(crate) fn kernel_for(&self, kind: &str, one_row: bool) -> (String, usize) {
        let name = self.kernel(kind);
        let cols = if kind.ends_with("gateup") { CT.div_ceil(2) } else { CT };
        if one_row { (name + "_r1", WPB) } else { (name, WPB * cols) }
    }

    /// The wide-tile entry point of `kind` (dense.cu's `linear_wide_bf16_v8`, ...) and the output columns a block
    /// covers ([`WTN`], half that for the gate-up forms), for the 8-element chunk matrices; `None` for the others,
    /// which keep the warp kernels at every width. Bit-equal to [`Self::kernel_for`]'s forms.
    pub(crate) fn kernel_wide(&self, kind: &str) -> Option<(String, usize)> {
        let name = self.kernel(kind);
        let cols = if kind.ends_with("gateup") { WTN / 2 } else { WTN };
        self.v8().then(|| (name.replacen(kind, &format!("{kind}_wide"), 1), cols))
    }

    /// The dtype code of common.cuh (`DT_F32`, `DT_BF16`, `DT_Q8`, `DT_Q4`).
    pub(crate) fn dtype_code(&self) -> i32 {
        match self.dtype {
            Dtype::F32 => 0,
            Dtype::Bf16 => 1,
            Dtype::Q8 => 2,
            Dtype::Q4 => 3,
        }
    }
}

/// One attention layer's K and V rows of one stream on the device: `len` rows of `width` f32 each, in buffers of
/// `cap` rows that grow by reallocation (with a copy of the held rows).
pub struct CudaKv {
    pub(crate) dev: Arc<Dev>,
    pub(crate) width: usize,
    pub(crate) len: usize,
    pub(crate) cap: usize,
    pub(crate) k: Option<Mem>,
    pub(crate) v: Option<Mem>,
}

impl CudaKv {
    pub(crate) fn new(dev: Arc<Dev>, width: usize) -> Self {
        Self { dev, width, len: 0, cap: 0, k: None, v: None }
    }

    /// Row width (`kv_heads * head_dim`).
    pub fn width(&self) -> usize {
        self.width
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no rows are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Addresses of the K and V buffers (0 while nothing is allocated).
    pub(crate) fn ptrs(&self) -> (u64, u64) {
        (self.k.as_ref().map_or(0, |m| m.ptr), self.v.as_ref().map_or(0, |m| m.ptr))
    }

    /// Makes room for `rows` rows in all, keeping the held ones. Nothing changes on failure.
    pub(crate) fn grow(&mut self, rows: usize) -> Result<(), CudaError> {
        if rows <= self.cap {
            return Ok(());
        }
        let bytes = f32_bytes(rows.saturating_mul(self.width))?;
        let (k, v) = (self.dev.alloc(bytes)?, self.dev.alloc(bytes)?);
        let held = f32_bytes(self.len * self.width)?;
        if let (Some(new), Some(old)) = (&k, &self.k) {
            self.dev.dtod(new.ptr, old.ptr, held)?;
        }
        if let (Some(new), Some(old)) = (&v, &self.v) {
            self.dev.dtod(new.ptr, old.ptr, held)?;
        }
        (self.k, self.v, self.cap) = (k, v, rows);
        Ok(())
    }

    /// A copy holding exactly the held rows.
    fn copy(&self) -> Result<Self, CudaError> {
        let mut c = Self::new(self.dev.clone(), self.width);
        c.grow(self.len)?;
        let bytes = f32_bytes(self.len * self.width)?;
        if let (Some(d), Some(s)) = (&c.k, &self.k) {
            self.dev.dtod(d.ptr, s.ptr, bytes)?;
        }
        if let (Some(d), Some(s)) = (&c.v, &self.v) {
            self.dev.dtod(d.ptr, s.ptr, bytes)?;
        }
        c.len = self.len;
        Ok(c)
    }
}

impl Clone for CudaKv {
    /// A copy of the held rows (prompt-cache snapshots). On a device failure the copy is empty and the failure
    /// recorded: the model's snapshot takes it (`Diagnostics::flush_check`) and refuses the copy.
    fn clone(&self) -> Self {
        match self.copy() {
            Ok(c) => c,
            Err(e) => {
                self.dev.note("copying a KV cache", Err(e));
                Self::new(self.dev.clone(), self.width)
            }
        }
    }
}

/// One conv layer's state of one stream on the device: the last `taps - 1` rows of `B * x` (oldest first), and the
/// last call's window (the state's rows then the call's rows) when that call had at most `keep_rows` rows, so
/// the state can be rolled back to any of its rows, as the CPU's `CpuConv`.
pub struct CudaConv {
    pub(crate) dev: Arc<Dev>,
    pub(crate) width: usize,
    pub(crate) taps: usize,
    pub(crate) state: Option<Mem>,
    pub(crate) window: Option<Mem>,
    /// Rows of the last call the window holds after the state's rows; `None`: no window is kept.
    pub(crate) window_rows: Option<usize>,
    /// Longest call whose window is kept: [`KEEP_ROWS`], or the engine's longest verify window once reserved.
    pub(crate) keep_rows: usize,
}

impl CudaConv {
    /// A zeroed state. A failed allocation is recorded (and the state refused when used).
    pub(crate) fn new(dev: Arc<Dev>, width: usize, taps: usize) -> Self {
        let bytes = f32_bytes(taps.saturating_sub(1).saturating_mul(width));
        let state = bytes.and_then(|b| {
            let m = dev.alloc(b)?;
            if let Some(m) = &m {
                dev.memset(m.ptr, 0, m.bytes)?;
            }
            Ok(m)
        });
        let state = match state {
            Ok(s) => s,
            Err(e) => {
                dev.note("allocating a conv state", Err(e));
                None
            }
        };
        Self { dev, width, taps, state, window: None, window_rows: None, keep_rows: KEEP_ROWS }
    }

    /// Rows of `B * x` the state holds (`taps - 1`).
    pub(crate) fn hist(&self) -> usize {
        self.taps.saturating_sub(1)
    }

    /// Address of the state (0 when it holds nothing). Errors when its allocation failed.
    pub(crate) fn state_ptr(&self) -> Result<u64, CudaError> {
        match &self.state {
            Some(m) => Ok(m.ptr),
            None if self.hist() * self.width == 0 => Ok(0),
            None => Err(CudaError::Unallocated),
        }
    }

    /// A window able to hold a call of `rows` rows, grown to exactly that when it is smaller: a reserved state
    /// ([`CudaConv::reserve`]) holds its longest verify window's from the start, and a stream of decode rows holds
    /// `taps` rows, not the 64 a verify window may take (16.7 MB a stream of the 24B shape when it did).
    pub(crate) fn ensure_window(&mut self, rows: usize) -> Result<u64, CudaError> {
        let need = f32_bytes(self.hist().saturating_add(rows).saturating_mul(self.width))?;
        if self.window.as_ref().is_none_or(|w| w.bytes < need) {
            // A new block holds none of the kept rows: nothing to roll back into until a call fills it.
            (self.window, self.window_rows) = (None, None);
            self.window = self.dev.alloc(need)?;
        }
        Ok(self.window.as_ref().map_or(0, |w| w.ptr))
    }

    /// Keeps windows for calls of at most `rows` rows (1 to [`KEEP_ROWS`]) and allocates room for one now.
    pub(crate) fn reserve(&mut self, rows: usize) -> Result<(), CudaError> {
        self.keep_rows = rows.clamp(1, KEEP_ROWS);
        self.ensure_window(self.keep_rows).map(drop)
    }

    /// Bytes held (state and window).
    pub(crate) fn bytes(&self) -> usize {
        self.state.as_ref().map_or(0, |m| m.bytes) + self.window.as_ref().map_or(0, |m| m.bytes)
    }

    fn copy(&self) -> Result<Self, CudaError> {
        let dup = |m: &Option<Mem>, bytes: usize| -> Result<Option<Mem>, CudaError> {
            let Some(src) = m else { return Ok(None) };
            let d = self.dev.alloc(bytes)?;
            if let Some(d) = &d {
                self.dev.dtod(d.ptr, src.ptr, bytes)?;
            }
            Ok(d)
        };
        let state = dup(&self.state, self.state.as_ref().map_or(0, |m| m.bytes))?;
        let rows = self.window_rows.unwrap_or(0);
        // A window that keeps no rows (the last call was longer than `keep_rows`) is not copied.
        let kept = if self.window_rows.is_some() { &self.window } else { &None };
        let window = dup(kept, f32_bytes((self.hist() + rows) * self.width)?)?;
        let window_rows = self.window_rows.filter(|_| window.is_some() || (self.hist() + rows) * self.width == 0);
        let (dev, width, taps, keep_rows) = (self.dev.clone(), self.width, self.taps, self.keep_rows);
        Ok(Self { dev, width, taps, state, window, window_rows, keep_rows })
    }
}

impl Clone for CudaConv {
    /// A copy of the state and the kept window. On a device failure the copy is a zeroed state without a window and
    /// the failure recorded: the model's snapshot takes it (`Diagnostics::flush_check`) and refuses the copy.
    fn clone(&self) -> Self {
        match self.copy() {
            Ok(c) => c,
            Err(e) => {
                self.dev.note("copying a conv state", Err(e));
                Self::new(self.dev.clone(), self.width, self.taps)
            }
        }
    }
}
