//! The engine thread: owns the target and the lane core, takes submissions and cancels between rounds,
//! and runs rounds while any stream is active. Handles are cheap to clone and usable from any thread.

use crate::core::{Clock, Core, EngineConfig, Metrics, SystemClock};
use crate::request::{Event, Request, RequestId, Sink, SubmitError};
use crate::target::Target;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tensorfold_kernels::DeviceWatch;

enum Command {
    Submit(Request, Sink, Sender<Result<RequestId, SubmitError>>),
    SubmitGroup(Vec<Request>, Vec<Sink>, Sender<Result<Vec<RequestId>, SubmitError>>),
    SubmitAll(Vec<(Request, Sink)>, Sender<Vec<Result<RequestId, SubmitError>>>),
    Cancel(RequestId),
    Shutdown,
}

/// A handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    metrics: Arc<Mutex<Metrics>>,
    alive: Arc<AtomicBool>,
}

impl EngineHandle {
    /// Submits a request; its events arrive on the returned receiver (dropping it cancels the stream at
    /// the next token). Refusals are immediate and queue nothing.
    pub fn submit(&self, req: Request) -> Result<(RequestId, Receiver<Event>), SubmitError> {
        let (etx, erx) = mpsc::channel();
        Ok((self.submit_to(req, etx.into())?, erx))
    }

    /// Submits a request whose events go to `sink` (e.g. an async channel); returns its id.
    pub fn submit_to(&self, req: Request, sink: Sink) -> Result<RequestId, SubmitError> {
        let (rtx, rrx) = mpsc::channel();
        self.tx.send(Command::Submit(req, sink, rtx)).map_err(|_| SubmitError::Stopped)?;
        rrx.recv().map_err(|_| SubmitError::Stopped)?
    }

    /// Submits independent requests in one command, so every one is queued at the same round boundary: the engine
    /// answers submissions between rounds, so `submit` called in a loop admits one request a round. Results come in
    /// order; each request is queued or refused on its own, as by `submit`.
    pub fn submit_all(&self, reqs: Vec<Request>) -> Vec<Result<(RequestId, Receiver<Event>), SubmitError>> {
        let n = reqs.len();
        let (pairs, rxs): (Vec<(Request, Sink)>, Vec<Receiver<Event>>) = reqs
            .into_iter()
            .map(|r| {
                let (etx, erx) = mpsc::channel();
                ((r, etx.into()), erx)
            })
            .unzip();
        let (rtx, rrx) = mpsc::channel();
        let ids = match self.tx.send(Command::SubmitAll(pairs, rtx)).ok().and_then(|_| rrx.recv().ok()) {
            Some(ids) => ids,
            None => (0..n).map(|_| Err(SubmitError::Stopped)).collect(),
        };
        ids.into_iter().zip(rxs).map(|(id, rx)| id.map(|id| (id, rx))).collect()
    }

    /// Submits a group sharing one prefill (`n` streams of one prompt; `Core::submit_group`): request `i`'s events
    /// go to `sinks[i]`; returns their ids. All or nothing.
    pub fn submit_group(&self, reqs: Vec<Request>, sinks: Vec<Sink>) -> Result<Vec<RequestId>, SubmitError> {
        let (rtx, rrx) = mpsc::channel();
        self.tx.send(Command::SubmitGroup(reqs, sinks, rtx)).map_err(|_| SubmitError::Stopped)?;
        rrx.recv().map_err(|_| SubmitError::Stopped)?
    }

    /// Cancels a request (waiting or running) at the next round; unknown ids are ignored.
    pub fn cancel(&self, id: RequestId) {
        let _ = self.tx.send(Command::Cancel(id));
    }

    /// False once the engine thread has ended (shut down, or a panic): `/health` then answers 503.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Metrics as of the last round.
    pub fn metrics(&self) -> Metrics {
        self.metrics.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// An engine thread and its handle.
pub struct Engine {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts the engine thread over `target`.
    pub fn start<T: Target>(target: T, cfg: EngineConfig) -> Self {
        Self::start_with_clock(target, cfg, Box::new(SystemClock))
    }

    /// Starts the engine thread with a given clock (tests use a fixed one).
    pub fn start_with_clock<T: Target>(target: T, cfg: EngineConfig, clock: Box<dyn Clock>) -> Self {
        let (tx, rx) = mpsc::channel();
        let metrics = Arc::new(Mutex::new(Metrics::default()));
        let m = metrics.clone();
        let alive = Arc::new(AtomicBool::new(true));
        if let Some(watch) = target.device_watch() {
            watchdog(watch, alive.clone(), metrics.clone());
        }
        let flag = AliveFlag(alive.clone());
        let thread = std::thread::Builder::new()
            .name("tensorfold-engine".into())
            .spawn(move || {
                let _flag = flag;
                run(Core::new(target, cfg, clock), rx, m)
            })
            .expect("spawning the engine thread");
        Self { handle: EngineHandle { tx, metrics, alive }, thread: Some(thread) }
    }

    /// A handle for submitting and cancelling.
    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.handle.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Clears the alive flag when the engine thread ends, however it ends (a panic unwinds through it).
struct AliveFlag(Arc<AtomicBool>);

impl Drop for AliveFlag {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
        if std::thread::panicking() {
            eprintln!("error: the engine thread panicked; the server can no longer generate");
        }
    }
}

/// Watches the target's device waits from a thread of its own: one past its deadline is a lost device. The
/// engine thread may never come back from it, so the watchdog records `DeviceFailure: ...` in the metrics and clears
/// the alive flag itself (the server then exits non-zero, as for a reported failure); should the wait return, its
/// forward is refused with the same error (`Watched::check`) and the core ends every stream with it. The watchdog
/// ends with the engine.
fn watchdog(watch: Arc<DeviceWatch>, alive: Arc<AtomicBool>, metrics: Arc<Mutex<Metrics>>) {
    let period = (watch.deadline() / 10).clamp(Duration::from_millis(1), Duration::from_millis(500));
    let spawned = std::thread::Builder::new().name("tensorfold-device-watchdog".into()).spawn(move || {
        while alive.load(Ordering::Acquire) {
            if let Some(e) = watch.overdue() {
                let failure = format!("DeviceFailure: {e}");
                eprintln!("error: engine stopped: {failure}");
                if let Ok(mut m) = metrics.lock() {
                    m.failure = Some(failure);
                }
                alive.store(false, Ordering::Release);
                return;
            }
            std::thread::sleep(period);
        }
    });
    if let Err(e) = spawned {
        eprintln!("warning: no device watchdog ({e}): device waits have no deadline");
    }
}

fn run<T: Target>(mut core: Core<T>, rx: Receiver<Command>, metrics: Arc<Mutex<Metrics>>) {
    loop {
        // Block only when idle; otherwise take what has arrived and run a round.
        let first = if core.is_idle() {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        } else {
            None
        };
        for cmd in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match cmd {
                Command::Submit(req, sink, reply) => {
                    let _ = reply.send(core.submit(req, sink));
                }
                Command::SubmitGroup(reqs, sinks, reply) => {
                    let _ = reply.send(core.submit_group(reqs, sinks));
                }
                Command::SubmitAll(pairs, reply) => {
                    let _ = reply.send(pairs.into_iter().map(|(req, sink)| core.submit(req, sink)).collect());
                }
                Command::Cancel(id) => {
                    core.cancel(id);
                }
                Command::Shutdown => return,
            }
        }
        core.step();
        if let Ok(mut m) = metrics.lock() {
            *m = core.metrics();
        }
        // A device failure ended every stream; the thread ends, so `/health` answers 503 and submits are refused.
        if let Some(f) = core.failure() {
            eprintln!("error: engine stopped: {f}");
            return;
        }
    }
}
