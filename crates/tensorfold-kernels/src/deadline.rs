//! A deadline on device waits: a collective call or a forward (whose end is the device sync that reads its
//! results) enters a [`DeviceWatch`] for its length, and a watchdog reads [`DeviceWatch::overdue`]; a wait past the
//! deadline is a lost device (`KernelError::DeviceLost`, which the engine reports as `DeviceFailure`), as if the
//! driver had reported it. [`Watched`] puts a collective under a watch.

use crate::backend::{Backend, KernelError};
use crate::collective::Collective;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The default deadline: 300 s. A device sync or collective that has not returned by then has stopped answering
/// (the longest forward of a served model is seconds, a prefill chunk of a 24B model on one GPU well under one).
pub const DEFAULT_DEVICE_DEADLINE: Duration = Duration::from_secs(300);

/// The one device wait in flight (the engine thread makes them one at a time) and its deadline.
#[derive(Debug)]
pub struct DeviceWatch {
    deadline: Duration,
    in_flight: Mutex<Option<(Instant, &'static str)>>,
    /// The first wait found past the deadline, kept: a wait that returns late still fails its forward.
    expired: Mutex<Option<KernelError>>,
}

impl DeviceWatch {
    /// A watch with `deadline` (at least 1 ms).
    pub fn new(deadline: Duration) -> Arc<Self> {
        let deadline = deadline.max(Duration::from_millis(1));
        Arc::new(Self { deadline, in_flight: Mutex::new(None), expired: Mutex::new(None) })
    }

    /// The deadline.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Marks `what` in flight until the guard drops. A wait inside another (a collective inside a forward) keeps
    /// the outer one's start: the deadline is on the whole wait.
    pub fn enter(&self, what: &'static str) -> WatchGuard<'_> {
        let mut g = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let outer = g.is_none();
        if outer {
            *g = Some((Instant::now(), what));
        }
        WatchGuard { watch: self, outer }
    }

    /// The wait past the deadline, as the lost device it is: `DeviceLost` naming the call and the time. Once one
    /// is found it is kept ([`DeviceWatch::expired`]) and returned again.
    pub fn overdue(&self) -> Option<KernelError> {
        if let Some(e) = self.expired() {
            return Some(e);
        }
        let g = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let (since, what) = (*g)?;
        let e = self.late(since.elapsed(), what)?;
        *self.expired.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
        Some(e)
    }

    /// The wait a watchdog found past the deadline, if one was.
    pub fn expired(&self) -> Option<KernelError> {
        self.expired.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn late(&self, waited: Duration, what: &'static str) -> Option<KernelError> {
        (waited > self.deadline).then(|| KernelError::DeviceLost {
            kernel: what,
            message: format!(
                "no answer from the device for {:.1} s, past the {:.1} s deadline on device syncs and collectives",
                waited.as_secs_f64(),
                self.deadline.as_secs_f64()
            ),
        })
    }
}

/// Clears the wait in flight when it ends (however it ends).
pub struct WatchGuard<'a> {
    watch: &'a DeviceWatch,
    outer: bool,
}

impl Drop for WatchGuard<'_> {
    fn drop(&mut self) {
        if self.outer {
            *self.watch.in_flight.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

/// A collective whose calls are watched: each call enters the watch, and [`Collective::check`] refuses a call
/// that ran past the deadline even if it returned.
pub struct Watched<C> {
    inner: C,
    watch: Arc<DeviceWatch>,
}

impl<C> Watched<C> {
    /// `inner` under `watch`.
    pub fn new(inner: C, watch: Arc<DeviceWatch>) -> Self {
        Self { inner, watch }
    }
}

impl<B: Backend, C: Collective<B>> Collective<B> for Watched<C> {
    fn world(&self) -> usize {
        self.inner.world()
    }

    fn broadcast(&self, root: &B::Buf, others: &mut [&mut B::Buf]) -> Result<(), KernelError> {
        let _g = self.watch.enter("broadcast");
        self.inner.broadcast(root, others)
    }

    fn reduce_sum(&self, root: &mut B::Buf, others: &[&B::Buf]) -> Result<(), KernelError> {
        let _g = self.watch.enter("reduce_sum");
        self.inner.reduce_sum(root, others)
    }

    fn check(&self) -> Result<(), KernelError> {
        match self.watch.expired() {
            Some(e) => Err(e),
            None => self.inner.check(),
        }
    }

    fn watch(&self) -> Option<Arc<DeviceWatch>> {
        Some(self.watch.clone())
    }
}

/// The host stand-in with a planted stall (feature `planted-faults` only): once `armed` is set, the next call
/// blocks for `stall`, as a GPU that stops answering without an error does.
#[cfg(feature = "planted-faults")]
pub struct StallingCollective {
    inner: crate::collective::HostCollective,
    armed: Arc<std::sync::atomic::AtomicBool>,
    stall: Duration,
}

#[cfg(feature = "planted-faults")]
impl StallingCollective {
    /// `world` host ranks whose next call after `armed` is set stalls for `stall` (once).
    pub fn new(world: usize, armed: Arc<std::sync::atomic::AtomicBool>, stall: Duration) -> Self {
        Self { inner: crate::collective::HostCollective::new(world), armed, stall }
    }

    fn maybe_stall(&self) {
        if self.armed.swap(false, std::sync::atomic::Ordering::AcqRel) {
            std::thread::sleep(self.stall);
        }
    }
}

#[cfg(feature = "planted-faults")]
impl Collective<crate::cpu::CpuBackend> for StallingCollective {
    fn world(&self) -> usize {
        self.inner.world()
    }

    fn broadcast(&self, root: &Vec<f32>, others: &mut [&mut Vec<f32>]) -> Result<(), KernelError> {
        self.maybe_stall();
        self.inner.broadcast(root, others)
    }

    fn reduce_sum(&self, root: &mut Vec<f32>, others: &[&Vec<f32>]) -> Result<(), KernelError> {
        self.maybe_stall();
        self.inner.reduce_sum(root, others)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_past_the_deadline_is_a_lost_device_naming_the_outer_call_and_stays_one() {
        let w = DeviceWatch::new(Duration::from_millis(20));
        assert!(w.overdue().is_none(), "nothing in flight");
        {
            let _outer = w.enter("forward");
            let _inner = w.enter("reduce_sum");
            assert!(w.overdue().is_none(), "within the deadline");
            std::thread::sleep(Duration::from_millis(40));
            match w.overdue() {
                Some(KernelError::DeviceLost { kernel, message }) => {
                    assert_eq!(kernel, "forward", "the outer wait");
                    assert!(message.contains("deadline"), "{message}");
                }
                other => panic!("expected DeviceLost, got {other:?}"),
            }
        }
        // Found once, the expiry is kept: the late wait's forward is refused by `Watched::check`.
        assert!(matches!(w.expired(), Some(KernelError::DeviceLost { kernel: "forward", .. })));
        assert!(w.overdue().is_some());
    }
}
