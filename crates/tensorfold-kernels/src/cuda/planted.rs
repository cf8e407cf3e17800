//! The kernel contract's access to the CUDA backend (feature `planted-faults`, which only `tensorfold-contract`
//! turns on): planted faults compiled into a module or set in the graph machinery, and the device's test knobs
//! the CUDA suite sets. Release builds of the server carry none of it.

use super::device::Src;
use super::graphs::GraphFault;
use super::types::{CudaBuf, CudaMat};
use super::{CudaBackend, CudaError, draw, ops};
use crate::backend::KernelError;
use crate::sample::{DrawSpec, SampleError};

/// A planted fault: module `src` compiled with `-D<define>` from its whole source (`Src::planted_source`, the
/// `FAULT_*` blocks included), under a kernel-cache key of its own (the source and the define differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plant {
    /// The module the fault lives in.
    pub src: Src,
    /// The preprocessor symbol that switches it on (e.g. `FAULT_LINEAR_DROP_LAST`).
    pub define: &'static str,
}

impl CudaBackend {
    /// The same device with `plant` compiled into its module (the contract's controls).
    pub fn planted(&self, plant: Plant) -> Self {
        Self { dev: self.dev.clone(), plant: Some(plant) }
    }

    /// Plants a fault in this device's graph machinery (the contract's `cuda.graphs` controls; open a device of its
    /// own for it).
    pub fn plant_graph_fault(&self, f: GraphFault) {
        self.dev.plant_graph_fault(f)
    }

    /// Runs the embedding without its host check of the ids (the contract's "clamps out-of-range ids" control).
    pub fn embed_unchecked(&self, table: &CudaMat, ids: &[u32], out: &mut CudaBuf) -> Result<(), CudaError> {
        ops::embed_unchecked(self, table, ids, out)
    }

    /// The keyed draw of each row as [`crate::backend::Sampling::draw_rows`], and how many rows the host drew (a nucleus past
    /// the device's window): the contract's `window` gate counts them.
    pub fn draw_rows_counted(
        &self,
        logits: &CudaBuf,
        vocab: usize,
        specs: &[DrawSpec],
    ) -> Result<(Vec<Result<u32, SampleError>>, usize), CudaError> {
        draw::draw_rows(self, logits, vocab, specs)
    }

    /// The device's ordinal (as [`CudaBackend::new`] took it).
    pub fn ordinal(&self) -> usize {
        self.dev.ordinal()
    }

    /// Sets the wide-tile override (`None`: the defaults, `TENSORFOLD_CUDA_WIDE_ROWS`) and returns the one before:
    /// the contract checks the wide tiles at widths under the defaults.
    pub fn set_wide_rows(&self, rows: Option<usize>) -> Option<usize> {
        self.dev.set_wide_rows(rows)
    }

    /// Sets the tiled attention's row threshold (`None`: the default, `TENSORFOLD_CUDA_ATTN_TILE_ROWS`) and returns
    /// the one before: the contract checks the tiled form at widths under the default.
    pub fn set_attn_tile_rows(&self, rows: Option<usize>) -> Option<usize> {
        self.dev.set_attn_tile_rows(rows)
    }

    /// Sets the tensor-core mode (`TENSORFOLD_CUDA_TENSOR_CORES`) and returns the one before: the contract checks
    /// the tensor-core linears whatever the environment said.
    pub fn set_tensor_cores(&self, on: bool) -> bool {
        self.dev.set_tensor_cores(on)
    }

    /// Sets whether attention runs on the tensor cores in the tensor-core mode (`TENSORFOLD_CUDA_ATTN_MMA`) and returns
    /// the one before.
    pub fn set_attn_mma(&self, on: bool) -> bool {
        self.dev.set_attn_mma(on)
    }

    /// Sets the narrow tensor-core forms' column groups a block (1, 2 or 4; `None`: the host's choice by the
    /// column count) and returns the one before: the contract checks that each gives the same bits.
    pub fn set_tc_group(&self, groups: Option<usize>) -> Option<usize> {
        self.dev.set_tc_group(groups)
    }

    /// Turns deferral on with graph parts of `part` operations, whatever the environment said (the contract's
    /// `cuda.graphs` entry, on a device of its own, before it allocates anything). False where graphs cannot run:
    /// under a profile or without a page-locked arena.
    pub fn force_graphs(&self, part: usize) -> bool {
        self.dev.force_graphs(part)
    }

    /// `(replays, captures)`: flushes replayed and captured since the device opened.
    pub fn graph_counts(&self) -> (u64, u64) {
        self.dev.graph_counts()
    }

    /// Reports (and clears) a failure an infallible call left, as `kernel`'s error (the contract's `device` gate).
    pub fn take_error(&self, kernel: &'static str) -> Result<(), KernelError> {
        self.dev.take(kernel)
    }
}
