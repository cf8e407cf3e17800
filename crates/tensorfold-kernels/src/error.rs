//! The error of a failed kernel call, shared by every backend.

/// A failed kernel call. These are engine faults or bad shapes caught before any arithmetic, never a
/// silent wrong result.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum KernelError {
    /// A buffer's length disagrees with the shape the call was given.
    #[error("kernel {kernel}: {what} has {got} elements, expected {want}")]
    Shape { kernel: &'static str, what: &'static str, got: usize, want: usize },
    /// A token id past the embedding table.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    /// A segment's first position disagrees with the key rows its KV cache holds.
    #[error("segment of cache {cache} starts at position {start} but its KV cache holds {held} rows")]
    KeyCount { cache: usize, start: usize, held: usize },
    /// A segment names a cache outside the slice it was given, or segments overlap.
    #[error("segment table is invalid: {0}")]
    Segments(String),
    /// The device failed (a driver or compiler error; the CUDA backend only; out of memory is
    /// [`KernelError::DeviceOutOfMemory`]): the call's outputs, and those of the infallible calls since the last
    /// report, are not valid.
    #[error("device error in {kernel}: {message}")]
    Device { kernel: &'static str, message: String },
    /// The device or a collective between devices failed in a way that leaves it unusable (an illegal address, a
    /// failed launch, a lost context, a failed NCCL call): every stream's state on it is undefined, so the engine
    /// stops rather than run on (`tensorfold-engine` `core/failure.rs`).
    #[error("device lost in {kernel}: {message}")]
    DeviceLost { kernel: &'static str, message: String },
    /// A stream state's reserve could not allocate its `bytes` (saturated at `usize::MAX`): that stream's error
    /// alone; nothing is recorded for another call to meet, and the device stays usable.
    #[error("OutOfMemory: {what} could not allocate {bytes} bytes")]
    OutOfMemory { what: &'static str, bytes: usize },
    /// The device ran out of memory inside a call (the CUDA backend, after its pool gave its cached blocks back):
    /// the call's outputs are not valid, but the device stays usable, so a retry with less in flight may succeed.
    #[error("OutOfMemory: device memory ran out in {kernel}: {message}")]
    DeviceOutOfMemory { kernel: &'static str, message: String },
}

impl KernelError {
    /// Whether the error is running out of memory (a stream's reserve, or a call's buffers on the device): the
    /// stream's alone, and a retry may succeed (the server answers 503 with `Retry-After`, not 500).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, KernelError::OutOfMemory { .. } | KernelError::DeviceOutOfMemory { .. })
    }
}
