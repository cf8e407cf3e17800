//! NCCL collectives between the GPUs of one host (expert parallelism): one communicator a GPU from `ncclCommInitAll`,
//! calls grouped so one host thread drives every rank, each on its device's one stream. NCCL is loaded at run time
//! (cudarc's dynamic loading); NVLink multicast (NVLS) is never asked for.

use super::types::CudaBuf;
use super::{CudaBackend, CudaError};
use crate::backend::KernelError;
use crate::collective::Collective;
use cudarc::nccl::{result, sys};
use std::ffi::{c_int, c_void};

/// One NCCL communicator.
struct Comm(sys::ncclComm_t);

// SAFETY: a communicator is used from one thread at a time (the engine's), every call under `&self` of the owner,
// which orders them; NCCL communicators may move between threads.
unsafe impl Send for Comm {}
// SAFETY: as above; the engine's single forward thread makes every call.
unsafe impl Sync for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: created by ncclCommInitAll and destroyed once, here.
        let _ = unsafe { result::comm_destroy(self.0) };
    }
}

/// NCCL over the devices of `backends`, rank `r` = `backends[r]`.
pub struct NcclCollective {
    ranks: Vec<CudaBackend>,
    comms: Vec<Comm>,
}

fn nccl_error(what: &str, e: result::NcclError) -> CudaError {
    CudaError::Driver { what: what.to_string(), message: format!("{e:?}") }
}

impl NcclCollective {
    /// Communicators over `backends` (one a distinct GPU, rank order as given). Errors: [`CudaError::NoNccl`] when
    /// `libnccl` cannot be loaded, a repeated device, or NCCL's own error. Multicast stays off: `NCCL_NVLS_ENABLE`
    /// is set to 0 unless the environment already sets it.
    pub fn new(backends: &[CudaBackend]) -> Result<Self, CudaError> {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoNccl);
        }
        let ordinals: Vec<c_int> = backends.iter().map(|b| b.dev.ordinal() as c_int).collect();
        let mut seen = ordinals.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != ordinals.len() || ordinals.is_empty() {
            return Err(CudaError::Shape(format!("NCCL ranks need distinct GPUs, got {ordinals:?}")));
        }
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // SAFETY: set once before NCCL reads its environment, while no other thread reads it.
            unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
        }
        // A binding the library lacks makes cudarc panic; it must be a named error.
        let init = std::panic::catch_unwind(|| {
            let mut raw = vec![std::ptr::null_mut(); ordinals.len()];
            // SAFETY: `raw` has room for one communicator per listed device.
            unsafe { result::comm_init_all(raw.as_mut_ptr(), ordinals.len() as c_int, ordinals.as_ptr()) }
                .map(|_| raw.into_iter().map(Comm).collect::<Vec<_>>())
        });
        let comms = match init {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(nccl_error("ncclCommInitAll", e)),
            Err(_) => return Err(CudaError::NoNccl),
        };
        Ok(Self { ranks: backends.to_vec(), comms })
    }

    /// Runs `call(rank, comm, stream)` for every rank inside one NCCL group, after each rank's waiting errors.
    fn grouped(
        &self,
        what: &'static str,
        mut call: impl FnMut(usize, sys::ncclComm_t, sys::cudaStream_t) -> Result<(), CudaError>,
    ) -> Result<(), KernelError> {
        for b in &self.ranks {
            b.dev.take(what)?;
        }
        result::group_start().map_err(|e| nccl_error("ncclGroupStart", e).kernel(what))?;
        let mut first = Ok(());
        for (r, (b, c)) in self.ranks.iter().zip(&self.comms).enumerate() {
            let stream = b.dev.stream().map_err(|e| e.kernel(what))?;
            if let Err(e) = call(r, c.0, stream as sys::cudaStream_t) {
                first = first.and(Err(e.kernel(what)));
            }
        }
        // The group must be closed even after a failed enqueue.
        let end = result::group_end().map_err(|e| nccl_error("ncclGroupEnd", e).kernel(what));
        first.and(end.map(|_| ()))
    }
}

impl Drop for NcclCollective {
    fn drop(&mut self) {
        // Every enqueued collective finishes before its communicator goes.
        for b in &self.ranks {
            let _ = b.dev.sync();
        }
    }
}

fn len_check(what: &'static str, got: usize, want: usize) -> Result<(), KernelError> {
    if got == want { Ok(()) } else { Err(KernelError::Shape { kernel: what, what: "buffer", got, want }) }
}

fn ptr(b: &CudaBuf) -> Result<*mut c_void, CudaError> {
    Ok(b.ptr()? as *mut c_void)
}

impl Collective<CudaBackend> for NcclCollective {
    fn world(&self) -> usize {
        self.ranks.len()
    }

    fn broadcast(&self, root: &CudaBuf, others: &mut [&mut CudaBuf]) -> Result<(), KernelError> {
        len_check("nccl_broadcast", others.len() + 1, self.world())?;
        for o in others.iter() {
            len_check("nccl_broadcast", o.len(), root.len())?;
        }
        if root.is_empty() {
            return Ok(());
        }
        let bufs: Vec<*mut c_void> = std::iter::once(ptr(root))
            .chain(others.iter().map(|o| ptr(o)))
            .collect::<Result<_, _>>()
            .map_err(|e| e.kernel("nccl_broadcast"))?;
        self.grouped("nccl_broadcast", |r, comm, stream| {
            // SAFETY: every rank's buffer holds `root.len()` f32 on that rank's device; the root sends from its own
            // buffer, the others receive into theirs (their send buffer is ignored).
            unsafe {
                result::broadcast(bufs[r], bufs[r], root.len(), sys::ncclDataType_t::ncclFloat32, 0, comm, stream)
            }
            .map(|_| ())
            .map_err(|e| nccl_error("ncclBroadcast", e))
        })
    }

    fn reduce_sum(&self, root: &mut CudaBuf, others: &[&CudaBuf]) -> Result<(), KernelError> {
        len_check("nccl_reduce", others.len() + 1, self.world())?;
        for o in others {
            len_check("nccl_reduce", o.len(), root.len())?;
        }
        if root.is_empty() {
            return Ok(());
        }
        let bufs: Vec<*mut c_void> = std::iter::once(ptr(root))
            .chain(others.iter().map(|o| ptr(o)))
            .collect::<Result<_, _>>()
            .map_err(|e| e.kernel("nccl_reduce"))?;
        self.grouped("nccl_reduce", |r, comm, stream| {
            // SAFETY: as in broadcast; the root reduces in place, the others only send.
            unsafe {
                result::reduce(
                    bufs[r],
                    bufs[r],
                    root.len(),
                    sys::ncclDataType_t::ncclFloat32,
                    sys::ncclRedOp_t::ncclSum,
                    0,
                    comm,
                    stream,
                )
            }
            .map(|_| ())
            .map_err(|e| nccl_error("ncclReduce", e))
        })
    }
}
