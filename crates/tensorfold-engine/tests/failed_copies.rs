//! A state copy the device cannot make (`Target::snapshot` out of memory) is never kept, resumed from or handed on:
//! the prompt cache keeps nothing, a lookup whose copy fails is a miss (not counted as a hit), and a later request
//! prefills from scratch, equal to its solo run; a group's followers, whose states would be such copies, prefill
//! their prompt on their own, each equal to its solo run.

mod common;

use common::{core, reference, run_group, run_scheduled};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tensorfold_engine::core::EngineConfig;
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::{FinishReason, ForwardCall, Request, SegOut, Target};
use tensorfold_kernels::KernelError;
use tensorfold_model::ForwardError;

/// The fake target, except that while `fail` is set every state copy fails as a device out of memory would.
struct FailedCopies {
    inner: FakeTarget,
    fail: Arc<AtomicBool>,
}

impl FailedCopies {
    fn new(inner: FakeTarget, fail: bool) -> Self {
        Self { inner, fail: Arc::new(AtomicBool::new(fail)) }
    }
}

impl Target for FailedCopies {
    delegate_target!(FakeTarget, except_snapshot);

    fn forward(&self, call: &ForwardCall<'_, ()>, states: &mut [&mut Vec<u32>]) -> Result<Vec<SegOut>, ForwardError> {
        self.inner.forward(call, states)
    }
    fn keep(&self, s: &mut Vec<u32>, pos: usize) -> Result<(), ForwardError> {
        self.inner.keep(s, pos)
    }
    fn snapshot(&self, s: &Vec<u32>) -> Result<Vec<u32>, ForwardError> {
        if !self.fail.load(Ordering::SeqCst) {
            return self.inner.snapshot(s);
        }
        let message = "planted: copying a KV cache: out of memory".to_string();
        Err(ForwardError::Kernel(KernelError::DeviceOutOfMemory { kernel: "check", message }))
    }
}

/// The same 12-token prompt twice, the second after the first finished.
fn twice() -> Vec<(usize, Request)> {
    let r = Request { ignore_eos: true, ..Request::greedy((5..17).collect(), 8) };
    vec![(0, r.clone()), (40, r)]
}

#[test]
fn a_copy_the_device_cannot_make_is_not_kept_in_the_prompt_cache() {
    let inner = FakeTarget::new();
    let cfg = EngineConfig { parallel: 2, prefill_chunk: 4, max_draft: 0, ..EngineConfig::default() };
    // The control: with copies that work, the second request resumes from a kept state.
    let seen = run_scheduled(&mut core(inner.clone(), cfg.clone()), &twice(), |_| {});
    assert!(seen[1].cached.is_some_and(|n| n > 0), "the control resumes: {:?}", seen[1]);
    let mut c = core(FailedCopies::new(inner.clone(), true), cfg);
    let seen = run_scheduled(&mut c, &twice(), |_| {});
    for (i, ((_, r), s)) in twice().iter().zip(&seen).enumerate() {
        assert_eq!((s.reason, &s.tokens), (Some(FinishReason::Length), &reference(&inner, r).0), "request {i}");
        assert_eq!(s.cached, Some(0), "request {i} prefilled from scratch");
    }
    assert_eq!(c.metrics().cache_bytes, 0, "nothing kept");
    assert!(c.failure().is_none(), "the engine runs on");
}

#[test]
fn a_lookup_whose_copy_fails_is_a_miss() {
    let inner = FakeTarget::new();
    let cfg = EngineConfig { parallel: 2, prefill_chunk: 4, max_draft: 0, ..EngineConfig::default() };
    let target = FailedCopies::new(inner.clone(), false);
    let fail = target.fail.clone();
    let mut c = core(target, cfg);
    let r = &twice()[..1];
    let first = run_scheduled(&mut c, r, |_| {});
    assert!(c.metrics().cache_bytes > 0, "the first request's states are kept");
    fail.store(true, Ordering::SeqCst);
    let second = run_scheduled(&mut c, r, |_| {});
    for s in [&first[0], &second[0]] {
        assert_eq!((s.reason, &s.tokens), (Some(FinishReason::Length), &reference(&inner, &r[0].1).0));
        assert_eq!(s.cached, Some(0), "{s:?}");
    }
    let m = c.metrics();
    assert_eq!((m.cache.queries, m.cache.hits, m.cache.reused_tokens), (2, 0, 0), "a failed copy is no hit");
}

#[test]
fn a_follower_whose_copy_fails_prefills_on_its_own() {
    let inner = FakeTarget::new();
    let reqs: Vec<Request> =
        [10, 12, 14].iter().map(|&m| Request { ignore_eos: true, ..Request::greedy((5..17).collect(), m) }).collect();
    let mut c = core(FailedCopies::new(inner.clone(), true), EngineConfig { parallel: 4, ..EngineConfig::default() });
    for (i, (r, seen)) in reqs.iter().zip(run_group(&mut c, &reqs)).enumerate() {
        let alone = (Some(FinishReason::Length), &reference(&inner, r).0);
        assert_eq!((seen.reason, &seen.tokens), alone, "member {i}");
        assert_eq!(seen.cached, Some(0), "member {i} prefilled its prompt: {seen:?}");
    }
    let m = c.metrics();
    assert_eq!((m.running, m.waiting, m.reserved_bytes, m.failure), (0, 0, 0, None), "nothing held");
}
