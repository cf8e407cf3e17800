//! Device failures: a forward or a draft that fails on the device (a driver error, a lost GPU, a failed collective)
//! leaves stream states undefined, so the engine ends every stream with the error and stops, rather than run on
//! and risk wrong output.

use super::{Core, FinishReason};
use crate::request::{Event, Stats};
use crate::target::Target;
use tensorfold_kernels::KernelError;
use tensorfold_model::ForwardError;

impl<T: Target> Core<T> {
    /// Records the first device failure among forward or draft errors (other errors stay per-stream).
    pub(super) fn note_device(&mut self, e: &ForwardError) {
        if let ForwardError::Kernel(k @ KernelError::Device { .. }) = e
            && self.failure.is_none()
        {
            self.failure = Some(format!("DeviceFailure: {k}"));
        }
    }

    /// The device failure that stopped this engine, if one did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Ends every running and waiting request with the failure (reason `error`), freeing every lane.
    pub(super) fn fail_all(&mut self) {
        let msg = self.failure.clone().unwrap_or_default();
        while !self.lanes.is_empty() {
            self.finish(0, FinishReason::Error, Some(msg.clone()));
        }
        while let Some(mut w) = self.queue.pop_front() {
            let stats =
                Stats { prompt_tokens: w.req.prompt.len(), queued: self.clock.now() - w.submitted, ..Stats::default() };
            w.sink.send(Event::Finished { reason: FinishReason::Error, error: Some(msg.clone()), stats });
        }
        self.counters.failure = Some(msg);
    }
}
