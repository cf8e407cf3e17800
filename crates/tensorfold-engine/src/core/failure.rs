//! Device failures: a forward or a draft that fails with `KernelError::DeviceLost` (a sticky driver error, a failed
//! collective) leaves stream states undefined, so the engine ends every stream with the error and stops, rather than
//! run on and risk wrong output. Other errors (out of memory, a refused shape) fail their streams alone
//! (`drop_failed`, and `refuse_state` for a state the target could not reserve), except that a failure inside a
//! shared round's layers ends every stream whose state it tore (`Target::torn`); out of memory, in a reserve or
//! inside a forward, is flagged in the stream's finish event.

use super::Core;
use super::plan::Entry;
use super::runner::RowsError;
use crate::request::{FinishReason, RequestId};
use crate::target::{SegOut, Target};
use tensorfold_kernels::KernelError;
use tensorfold_model::ForwardError;

impl<T: Target> Core<T> {
    /// Records the first lost device among forward or draft errors (other errors stay per-stream).
    pub(super) fn note_device(&mut self, e: &ForwardError) {
        if let ForwardError::Kernel(k @ KernelError::DeviceLost { .. }) = e
            && self.failure.is_none()
        {
            self.failure = Some(format!("DeviceFailure: {k}"));
        }
    }

    /// Finishes running request `id`, whose state the target could not reserve, with that error (reason `error`):
    /// out of memory is that request's alone (its event says so: a retry may succeed), and every other stream runs
    /// on. A lost device is recorded instead, and the step's check ends every request with it ([`Core::fail_all`]).
    pub(super) fn refuse_state(&mut self, id: RequestId, e: ForwardError) {
        self.note_device(&e);
        if self.failure.is_none()
            && let Some(i) = self.lanes.iter().position(|s| s.id == id)
        {
            self.finish_as(i, FinishReason::Error, Some(e.to_string()), e.is_out_of_memory());
        }
    }

    /// Finishes lane `i`, whose verify window could not be rolled back, with that error (out of memory flagged);
    /// a lost device is recorded, and the step's check stops the engine.
    pub(super) fn refuse_rollback(&mut self, i: usize, e: ForwardError) {
        self.note_device(&e);
        let message = format!("rolling back a verify window: {e}");
        self.finish_as(i, FinishReason::Error, Some(message), e.is_out_of_memory());
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
        while let Some(w) = self.queue.pop_front() {
            self.finish_waiting(w, FinishReason::Error, Some(msg.clone()));
        }
        self.counters.failure = Some(msg);
    }

    /// Finishes the entries whose forward failed (an error for that stream only; out of memory says so in its event)
    /// and returns the others,
    /// pointed at their lanes again (finishing reorders lanes), with their outputs.
    pub(super) fn drop_failed(
        &mut self,
        entries: Vec<Entry>,
        results: Vec<Result<SegOut, RowsError>>,
    ) -> (Vec<Entry>, Vec<SegOut>) {
        let tagged: Vec<_> = entries.into_iter().zip(results).map(|(e, r)| (self.lanes[e.lane].id, e, r)).collect();
        let (mut ran, mut outs) = (Vec::new(), Vec::new());
        for (id, e, r) in tagged {
            match r {
                Ok(out) => {
                    ran.push((id, e));
                    outs.push(out);
                }
                Err(err) => {
                    if let Some(i) = self.lanes.iter().position(|s| s.id == id) {
                        self.finish_as(i, FinishReason::Error, Some(err.message), err.out_of_memory);
                    }
                }
            }
        }
        let entries = ran
            .into_iter()
            .map(|(id, e)| Entry { lane: self.lanes.iter().position(|s| s.id == id).expect("still running"), ..e })
            .collect();
        (entries, outs)
    }
}
