//! A device failure (a lost GPU, a failed collective) stops the engine: every running and waiting request ends with
//! the named error, no lane or memory stays held, the engine thread ends (`/health` answers 503) and later submits
//! are refused; a device error that leaves the device usable (out of memory) fails its stream alone.

mod common;

use common::{Fault, Poisoned, core, reference, run_scheduled};
use std::time::{Duration, Instant};
use tensorfold_engine::core::EngineConfig;
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::{Engine, Event, FinishReason, Request, SubmitError};

fn requests() -> Vec<(usize, Request)> {
    (0..5)
        .map(|i| (0, Request { ignore_eos: true, ..Request::greedy((1 + 12 * i..4 + 13 * i).collect(), 12) }))
        .collect()
}

#[test]
fn a_device_failure_ends_every_request_with_its_name_and_frees_everything() {
    let reqs = requests();
    let poison = reqs[1].1.prompt.clone();
    let target = Poisoned { inner: FakeTarget::new(), poison, after: 3, fault: Fault::DeviceLost };
    // Two lanes: three requests are still waiting when the device fails.
    let mut c = core(target, EngineConfig { parallel: 2, max_draft: 0, ..EngineConfig::default() });
    let seen = run_scheduled(&mut c, &reqs, |_| {});
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.reason, Some(FinishReason::Error), "request {i}");
        let e = s.error.as_deref().unwrap_or_default();
        assert!(e.starts_with("DeviceFailure:") && e.contains("GPU 1 stopped answering"), "request {i}: {e}");
    }
    assert!(seen[2..].iter().all(|s| s.tokens.is_empty()), "the waiting requests never ran");
    let m = c.metrics();
    assert_eq!((m.running, m.waiting, m.reserved_bytes), (0, 0, 0));
    assert!(m.failure.as_deref().is_some_and(|f| f.contains("nccl_reduce")), "{:?}", m.failure);
    assert_eq!(c.failure(), m.failure.as_deref());
    let (tx, _rx) = std::sync::mpsc::channel();
    assert!(matches!(c.submit(reqs[0].1.clone(), tx), Err(SubmitError::Stopped)), "a failed core takes nothing new");
    assert!(!c.step(), "and runs nothing");
}

#[test]
fn the_engine_thread_stops_and_refuses_later_requests() {
    let reqs = requests();
    let target =
        Poisoned { inner: FakeTarget::new(), poison: reqs[0].1.prompt.clone(), after: 2, fault: Fault::DeviceLost };
    let engine = Engine::start(target, EngineConfig { max_draft: 0, ..EngineConfig::default() });
    let h = engine.handle();
    let (_, rx) = h.submit(reqs[0].1.clone()).expect("admitted before the failure");
    let finished = rx.iter().find_map(|e| match e {
        Event::Finished { reason, error, .. } => Some((reason, error)),
        _ => None,
    });
    let (reason, error) = finished.expect("the request finishes");
    assert_eq!(reason, FinishReason::Error);
    assert!(error.is_some_and(|e| e.starts_with("DeviceFailure:")));
    let t = Instant::now();
    while h.is_alive() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!h.is_alive(), "the engine thread ended");
    assert!(h.metrics().failure.is_some());
    assert!(matches!(h.submit(reqs[1].1.clone()), Err(SubmitError::Stopped)));
}

#[test]
fn a_device_error_that_leaves_the_device_usable_fails_its_stream_alone() {
    let reqs = requests();
    let inner = FakeTarget::new();
    let target =
        Poisoned { inner: inner.clone(), poison: reqs[1].1.prompt.clone(), after: 3, fault: Fault::DeviceError };
    let mut c = core(target, EngineConfig { parallel: 2, max_draft: 0, ..EngineConfig::default() });
    let seen = run_scheduled(&mut c, &reqs, |_| {});
    for (i, ((_, r), s)) in reqs.iter().zip(&seen).enumerate() {
        if i == 1 {
            assert_eq!(s.reason, Some(FinishReason::Error));
            assert!(s.error.as_deref().is_some_and(|e| e.contains("out of memory")), "{:?}", s.error);
        } else {
            assert_eq!((s.reason, &s.tokens), (Some(FinishReason::Length), &reference(&inner, r).0), "request {i}");
        }
    }
    assert!(c.failure().is_none() && c.metrics().failure.is_none(), "the engine runs on");
}
