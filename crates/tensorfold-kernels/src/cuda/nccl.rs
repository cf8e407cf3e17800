//! NCCL collectives between the GPUs of one host (expert parallelism): one communicator a GPU from `ncclCommInitAll`,
//! calls grouped so one host thread drives every rank, each on its device's one stream. NCCL is loaded at run time
//! (cudarc's dynamic loading). NVLink multicast stays off: the binary sets `NCCL_NVLS_ENABLE=0` at start unless the
//! environment sets it (`tensorfold` `main`).

use super::types::CudaBuf;
use super::{CudaBackend, CudaError};
use crate::backend::KernelError;
use crate::collective::Collective;
use cudarc::nccl::{result, sys};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The communicators and their health, shared with the watchdog thread. Handles are kept as integers: NCCL allows
/// `ncclCommGetAsyncError` and `ncclCommAbort` from another thread than the one issuing collectives.
struct Watch {
    comms: Vec<usize>,
    /// A collective failed (synchronously, or asynchronously as the watchdog or `check` saw it).
    failed: AtomicBool,
    /// The communicators were aborted (never destroyed after that).
    aborted: Mutex<bool>,
    stop: AtomicBool,
}

impl Watch {
    /// Polls every communicator's asynchronous error; on one, marks the collective failed and aborts it, so that
    /// operations waiting on a peer end instead of hanging.
    fn poll(&self) -> bool {
        for &c in &self.comms {
            let mut r = sys::ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator (destroyed only after the watchdog has stopped) and a valid out pointer.
            let call = unsafe { sys::ncclCommGetAsyncError(c as sys::ncclComm_t, &mut r) };
            let bad =
                |x: sys::ncclResult_t| !matches!(x, sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress);
            if bad(call) || bad(r) {
                self.failed.store(true, Ordering::Release);
            }
        }
        if self.failed.load(Ordering::Acquire) {
            self.abort();
        }
        !self.failed.load(Ordering::Acquire)
    }

    /// Aborts every communicator once.
    fn abort(&self) {
        let mut aborted = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        if !*aborted {
            for &c in &self.comms {
                // SAFETY: a live communicator, aborted once (the flag is held).
                let _ = unsafe { result::comm_abort(c as sys::ncclComm_t) };
            }
            *aborted = true;
        }
    }
}

/// NCCL over the devices of `backends`, rank `r` = `backends[r]`, with a watchdog thread that polls NCCL's
/// asynchronous errors every [`WATCH_PERIOD`] and aborts the communicators on one.
pub struct NcclCollective {
    watch: Arc<Watch>,
    watchdog: Option<std::thread::JoinHandle<()>>,
    ranks: Vec<CudaBackend>,
}

/// How often the watchdog polls.
const WATCH_PERIOD: std::time::Duration = std::time::Duration::from_millis(500);

/// An NCCL failure leaves the communicator unusable.
fn nccl_error(what: &str, e: result::NcclError) -> CudaError {
    CudaError::Lost { what: what.to_string(), message: format!("{e:?}") }
}

impl NcclCollective {
    /// Communicators over `backends` (one a distinct GPU, rank order as given). Errors: [`CudaError::NoNccl`] when
    /// `libnccl` cannot be loaded, a repeated device, or NCCL's own error.
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
        // A binding the library lacks makes cudarc panic; it must be a named error.
        let init = std::panic::catch_unwind(|| {
            let mut raw = vec![std::ptr::null_mut(); ordinals.len()];
            // SAFETY: `raw` has room for one communicator per listed device.
            unsafe { result::comm_init_all(raw.as_mut_ptr(), ordinals.len() as c_int, ordinals.as_ptr()) }
                .map(|_| raw.into_iter().map(|c| c as usize).collect::<Vec<_>>())
        });
        let comms = match init {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(nccl_error("ncclCommInitAll", e)),
            Err(_) => return Err(CudaError::NoNccl),
        };
        let watch = Arc::new(Watch {
            comms,
            failed: AtomicBool::new(false),
            aborted: Mutex::new(false),
            stop: AtomicBool::new(false),
        });
        let w = watch.clone();
        let watchdog = std::thread::Builder::new()
            .name("tensorfold-nccl-watch".into())
            .spawn(move || {
                while !w.stop.load(Ordering::Acquire) && w.poll() {
                    std::thread::park_timeout(WATCH_PERIOD);
                }
            })
            .map_err(|e| CudaError::Driver { what: "starting the NCCL watchdog".into(), message: e.to_string() })?;
        Ok(Self { watch, watchdog: Some(watchdog), ranks: backends.to_vec() })
    }

    /// Runs `call(rank, comm, stream)` for every rank inside one NCCL group, after each rank's waiting errors.
    fn grouped(
        &self,
        what: &'static str,
        mut call: impl FnMut(usize, sys::ncclComm_t, sys::cudaStream_t) -> Result<(), CudaError>,
    ) -> Result<(), KernelError> {
        if self.watch.failed.load(Ordering::Acquire) {
            return Err(KernelError::DeviceLost {
                kernel: what,
                message: "an NCCL communicator failed earlier".into(),
            });
        }
        for b in &self.ranks {
            b.dev.take(what)?;
        }
        // Every stream first: a rank that cannot enqueue must fail the call before any rank has.
        let streams =
            self.ranks.iter().map(|b| b.dev.stream()).collect::<Result<Vec<_>, _>>().map_err(|e| e.kernel(what))?;
        result::group_start().map_err(|e| nccl_error("ncclGroupStart", e).kernel(what))?;
        let mut first = Ok(());
        for (r, (&c, stream)) in self.watch.comms.iter().zip(streams).enumerate() {
            if let Err(e) = call(r, c as sys::ncclComm_t, stream as sys::cudaStream_t) {
                first = first.and(Err(e.kernel(what)));
            }
        }
        // The group must be closed even after a failed enqueue.
        let end = result::group_end().map_err(|e| nccl_error("ncclGroupEnd", e).kernel(what));
        let r = first.and(end.map(|_| ()));
        if r.is_err() {
            self.watch.failed.store(true, Ordering::Release);
        }
        r
    }
}

impl Drop for NcclCollective {
    fn drop(&mut self) {
        self.watch.stop.store(true, Ordering::Release);
        if let Some(t) = self.watchdog.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        if self.watch.failed.load(Ordering::Acquire) {
            // A failed collective may never finish: abort instead of waiting for it.
            return self.watch.abort();
        }
        // Every enqueued collective finishes before its communicator goes.
        for b in &self.ranks {
            let _ = b.dev.sync();
        }
        if !*self.watch.aborted.lock().unwrap_or_else(|p| p.into_inner()) {
            for &c in &self.watch.comms {
                // SAFETY: created by ncclCommInitAll, not aborted, destroyed once, after the watchdog stopped.
                let _ = unsafe { result::comm_destroy(c as sys::ncclComm_t) };
            }
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

    fn check(&self) -> Result<(), KernelError> {
        if self.watch.poll() {
            Ok(())
        } else {
            Err(KernelError::DeviceLost { kernel: "nccl", message: "an NCCL communicator reported an error".into() })
        }
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
