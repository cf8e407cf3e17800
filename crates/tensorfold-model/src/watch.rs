//! The deadline on the model's device waits: each forward, block pass and held-draft read is one wait on the
//! model's [`DeviceWatch`] (one lock and a clock read to enter, nothing allocated), so a watchdog (the engine's)
//! finds a device that stops answering on one device as on several; a wait that returns after the watchdog gave the
//! device up has its results refused.
//!
//! Why these: on a GPU the host waits only where it reads results (the head's draws and logits, the drafter's
//! picks, held drafts) or where an allocation finds the pool out of memory and drains the stream first; every such
//! wait of a round happens inside one of these calls or the stream-state calls of `crate::state`, which enter the
//! watch too. One thread drives a model's device (the engine's), so one wait is in flight at a time.

use crate::drafter::HeldBlocks;
use crate::forward::{ForwardError, Model};
use tensorfold_kernels::Backend;
use tensorfold_kernels::deadline::WatchGuard;

impl<B: Backend> Model<B> {
    /// Marks the device wait `what` in flight on the model's watch until the guard drops. Errors: the watchdog
    /// already found a wait past the deadline (`DeviceLost`, as [`Model::answered`]): nothing more runs on the device.
    pub(crate) fn waiting(&self, what: &'static str) -> Result<WatchGuard<'_>, ForwardError> {
        self.answered()?;
        Ok(self.watch.enter(what))
    }

    /// Whether the device still counts as answering. Errors: `ForwardError::Kernel(KernelError::DeviceLost)` naming
    /// the late wait and the deadline, once a watchdog found one past it (kept: every later call gets it too).
    pub fn answered(&self) -> Result<(), ForwardError> {
        match self.watch.expired() {
            Some(e) => Err(ForwardError::Kernel(e)),
            None => Ok(()),
        }
    }

    /// Every stream's drafts of `held` after the verify ([`HeldBlocks::read`]: its one copy to the host), under the
    /// watch. Errors: as [`HeldBlocks::read`], or every stream's `DeviceLost` once the device is given up.
    pub fn read_held(&self, held: &HeldBlocks<B>) -> Vec<Result<Vec<u32>, ForwardError>> {
        let read = match self.waiting("held drafts read") {
            Ok(_waiting) => held.read(&self.backend),
            Err(_) => Vec::new(),
        };
        match self.watch.expired() {
            None => read,
            Some(e) => (0..held.streams()).map(|_| Err(ForwardError::Kernel(e.clone()))).collect(),
        }
    }
}
