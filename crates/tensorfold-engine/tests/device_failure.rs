//! A device failure (a lost GPU, a failed collective) stops the engine: every running and waiting request ends with
//! the named error, no lane or memory stays held, the engine thread ends (`/health` answers 503) and later submits
//! are refused; a device error that leaves the device usable (out of memory) before any state is written fails its
//! stream alone, also when it meets the stream's state as it is reserved (admission, a group's fan-out), before any
//! round holds its rows; one inside a layer of a shared round ends every stream whose state it tore.

mod common;

use common::{Fault, Poisoned, core, reference, run_group, run_scheduled};
use std::time::{Duration, Instant};
use tensorfold_engine::core::EngineConfig;
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::fake::RefusedReserve;
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
    for fault in [Fault::DeviceError, Fault::DeviceOutOfMemory] {
        device_error_fails_its_stream_alone(fault);
    }
}

/// A forward that meets `fault` on the second request's rows (a usable device) fails that request alone, flagged out
/// of memory only for `Fault::DeviceOutOfMemory`; the others equal their solo runs and the engine runs on.
fn device_error_fails_its_stream_alone(fault: Fault) {
    let reqs = requests();
    let inner = FakeTarget::new();
    let target = Poisoned { inner: inner.clone(), poison: reqs[1].1.prompt.clone(), after: 3, fault };
    let mut c = core(target, EngineConfig { parallel: 2, max_draft: 0, ..EngineConfig::default() });
    let seen = run_scheduled(&mut c, &reqs, |_| {});
    for (i, ((_, r), s)) in reqs.iter().zip(&seen).enumerate() {
        if i == 1 {
            assert_eq!(s.reason, Some(FinishReason::Error));
            assert!(s.error.as_deref().is_some_and(|e| e.contains("out of memory")), "{:?}", s.error);
            // Only the typed out-of-memory is flagged: a device error is not, whatever its message says.
            assert_eq!(s.out_of_memory, fault == Fault::DeviceOutOfMemory, "{s:?}");
        } else {
            assert_eq!((s.reason, &s.tokens), (Some(FinishReason::Length), &reference(&inner, r).0), "request {i}");
        }
    }
    assert!(c.failure().is_none() && c.metrics().failure.is_none(), "the engine runs on");
}

/// A shared round that runs out of device memory before touching any state is run again a stream at a time: every
/// request finishes as alone, none flagged out of memory, and the engine runs on.
#[test]
fn a_shared_round_out_of_memory_is_run_again_a_stream_at_a_time() {
    let reqs = requests();
    let inner = FakeTarget::new();
    let fault = Fault::SharedOutOfMemory;
    let target = Poisoned { inner: inner.clone(), poison: reqs[1].1.prompt.clone(), after: 3, fault };
    let mut c = core(target, EngineConfig { parallel: 2, max_draft: 0, ..EngineConfig::default() });
    let seen = run_scheduled(&mut c, &reqs, |_| {});
    for (i, ((_, r), s)) in reqs.iter().zip(&seen).enumerate() {
        assert_eq!((s.reason, &s.tokens), (Some(FinishReason::Length), &reference(&inner, r).0), "request {i}");
        assert!(s.error.is_none() && !s.out_of_memory, "request {i}: {s:?}");
    }
    assert!(c.failure().is_none() && c.metrics().failure.is_none(), "the engine runs on");
}

/// A shared round that runs out of device memory inside a layer tears the states it began writing: those streams
/// end with that error, flagged out of memory (a retry may succeed), and are never run again on a torn state; the
/// others equal their solo runs, and the engine runs on.
#[test]
fn a_shared_round_that_tears_its_states_ends_those_streams_out_of_memory() {
    let reqs = requests();
    let inner = FakeTarget::new();
    let fault = Fault::TornOutOfMemory;
    let target = Poisoned { inner: inner.clone(), poison: reqs[1].1.prompt.clone(), after: 3, fault };
    let mut c = core(target, EngineConfig { parallel: 2, max_draft: 0, ..EngineConfig::default() });
    let seen = run_scheduled(&mut c, &reqs, |_| {});
    let mut torn = 0;
    for (i, ((_, r), s)) in reqs.iter().zip(&seen).enumerate() {
        if s.reason == Some(FinishReason::Error) {
            let e = s.error.as_deref().unwrap_or_default();
            assert!(e.contains("out of memory inside a layer") && s.out_of_memory, "request {i}: {s:?}");
            torn += 1;
        } else {
            assert_eq!((s.reason, &s.tokens), (Some(FinishReason::Length), &reference(&inner, r).0), "request {i}");
        }
    }
    // Request 1 and the stream beside it in its round (the fault needs two).
    assert_eq!((seen[1].reason, torn), (Some(FinishReason::Error), 2), "{seen:?}");
    let m = c.metrics();
    assert_eq!((m.running, m.waiting, m.reserved_bytes, m.failure), (0, 0, 0, None), "nothing held");
    assert!(c.failure().is_none(), "the engine runs on");
}

/// Whether `s` finished with the reserve's out-of-memory error, having run no round.
fn refused_by_name(s: &common::Seen) -> bool {
    let named = s.error.as_deref().is_some_and(|e| e.starts_with("OutOfMemory: kv_reserve could not allocate"));
    s.reason == Some(FinishReason::Error) && named && s.out_of_memory && s.tokens.is_empty() && s.cached.is_none()
}

#[test]
fn a_reserve_out_of_memory_fails_its_request_alone_and_the_others_equal_their_solo_runs() {
    let reqs = requests();
    let inner = FakeTarget::new();
    for (cfg, name) in [
        (EngineConfig { parallel: 2, max_draft: 0, ..EngineConfig::default() }, "two lanes, plain rounds"),
        (EngineConfig { parallel: 8, copy_min: 2, ..EngineConfig::default() }, "every lane, copy drafts"),
    ] {
        // Request 1's reserve fails: with two lanes as it is admitted beside request 0 while 2 to 4 wait for its
        // lane; with eight beside all of them.
        let target = RefusedReserve::new(inner.clone(), reqs[1].1.prompt.len() + reqs[1].1.max_tokens);
        let refused = target.refused.clone();
        let mut c = core(target, cfg.clone());
        let seen = run_scheduled(&mut c, &reqs, |c| assert!(c.metrics().running <= cfg.parallel));
        for (i, ((_, r), s)) in reqs.iter().zip(&seen).enumerate() {
            if i == 1 {
                assert!(refused_by_name(s), "{name}: {s:?}");
            } else {
                let alone = (Some(FinishReason::Length), &reference(&inner, r).0);
                assert_eq!((s.reason, &s.tokens), alone, "{name}: request {i}");
            }
        }
        assert_eq!(refused.load(std::sync::atomic::Ordering::SeqCst), 1, "{name}: reserved once, refused once");
        let m = c.metrics();
        assert_eq!((m.running, m.waiting, m.reserved_bytes, m.failure), (0, 0, 0, None), "{name}: nothing held");
        assert!(c.failure().is_none(), "{name}: the engine runs on");
    }
}

/// A group of one 12-token prompt, a member a `max_tokens`.
fn group(max_tokens: [usize; 3]) -> Vec<Request> {
    max_tokens.iter().map(|&m| Request { ignore_eos: true, ..Request::greedy((5..17).collect(), m) }).collect()
}

#[test]
fn a_group_member_whose_reserve_fails_ends_alone_and_the_rest_equal_their_solo_runs() {
    let inner = FakeTarget::new();
    // Streams of 24 positions are refused: the leader (at admission; its followers then prefill on their own), a
    // follower (at the fan-out), or the leader and a follower (at admission, and as the leader lets it go).
    for max_tokens in [[12, 14, 16], [14, 12, 16], [14, 16, 12], [12, 12, 16]] {
        let reqs = group(max_tokens);
        let target = RefusedReserve::new(inner.clone(), 24);
        let refused = target.refused.clone();
        let mut c = core(target, EngineConfig { parallel: 4, ..EngineConfig::default() });
        for (i, (r, seen)) in reqs.iter().zip(run_group(&mut c, &reqs)).enumerate() {
            if r.max_tokens == 12 {
                assert!(refused_by_name(&seen), "{max_tokens:?}: member {i}: {seen:?}");
            } else {
                let alone = (Some(FinishReason::Length), &reference(&inner, r).0);
                assert_eq!((seen.reason, &seen.tokens), alone, "{max_tokens:?}: member {i}");
            }
        }
        let want = max_tokens.iter().filter(|&&m| m == 12).count();
        assert_eq!(refused.load(std::sync::atomic::Ordering::SeqCst), want, "{max_tokens:?}");
        let m = c.metrics();
        assert_eq!((m.running, m.waiting, m.reserved_bytes, m.failure), (0, 0, 0, None), "{max_tokens:?}");
    }
}

#[test]
fn a_reserve_on_a_lost_device_stops_the_engine_with_its_name() {
    let reqs = requests();
    let tokens = reqs[1].1.prompt.len() + reqs[1].1.max_tokens;
    let target = RefusedReserve { lost: true, ..RefusedReserve::new(FakeTarget::new(), tokens) };
    let mut c = core(target, EngineConfig { parallel: 2, max_draft: 0, ..EngineConfig::default() });
    let seen = run_scheduled(&mut c, &reqs, |_| {});
    for (i, s) in seen.iter().enumerate() {
        let e = s.error.as_deref().unwrap_or_default();
        assert!(e.starts_with("DeviceFailure:") && e.contains("GPU 0 stopped answering"), "request {i}: {e}");
    }
    let m = c.metrics();
    assert_eq!((m.running, m.waiting, m.reserved_bytes), (0, 0, 0));
    assert!(m.failure.is_some() && c.failure().is_some(), "the engine stopped");
}
