//! TensorFold kernels: the `Backend` trait, the CPU backend (and the CUDA backend with the `cuda` feature). The
//! kernel contract that checks them is the `tensorfold-contract` crate (which turns on `planted-faults`).
//!
//! Numerics (docs/architecture.md): weights bf16 or f32, activations and accumulation f32, one reduction
//! order per row fixed by the row's own length (never by the batch), so a row's bits do not depend on
//! what else is in the call.

pub mod backend;
pub mod bytes;
pub mod collective;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod deadline;
pub mod error;
pub mod sample;
pub mod shape;
pub mod simd;
#[cfg(feature = "planted-faults")]
pub mod stalling;

pub use backend::{Backend, KEEP_ROWS, KernelError, MoeParams, Pick, RopeParams, Segment};

/// The backend traits by concern ([`Backend`] and its five parts), to call their methods on a concrete backend:
/// `use tensorfold_kernels::prelude::*;`.
pub mod prelude {
    pub use crate::backend::{Backend, Diagnostics, Memory, Ops, Sampling, StreamState};
}
pub use bytes::{Dtype, HostBytes, MatView};
pub use collective::{Collective, HostCollective, expert_ranges};
pub use cpu::CpuBackend;
#[cfg(feature = "cuda")]
pub use cuda::{CudaBackend, CudaError, CudaOptions};
pub use deadline::{DEFAULT_DEVICE_DEADLINE, DeviceWatch, Watched};
