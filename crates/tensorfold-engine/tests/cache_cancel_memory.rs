//! The prompt cache (resumed replies equal fresh ones bit for bit, exact counters, eviction within budget),
//! cancel (running, queued, dropped receiver), memory admission (never fits, waits, queue full), stop
//! conditions, refusals by name, and a failing stream that costs nobody else; on the fake target and the
//! `lfm2-moe-f32` fixture.

mod common;

use common::{Fault, Poisoned, Seen, Watch, core, ids, reference, run_scheduled, submit};
use std::path::Path;
use std::sync::mpsc::channel;
use tensorfold_engine::core::{Core, EngineConfig};
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::keyed::{SampleError, SamplingParams};
use tensorfold_engine::prompt_cache::CacheCounters;
use tensorfold_engine::single::{GenerateOptions, generate};
use tensorfold_engine::{FinishReason, ModelTarget, Request, SubmitError, Target};
use tensorfold_kernels::CpuBackend;
use tensorfold_model::{Source, open};

fn cfg() -> EngineConfig {
    EngineConfig { round_rows: 64, prefill_chunk: 5, ..EngineConfig::default() }
}

fn fixture() -> ModelTarget<CpuBackend> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-moe-f32");
    let loaded = open(&Source::Dir(dir), CpuBackend).expect("the fixture opens");
    ModelTarget { model: std::sync::Arc::new(loaded.model), eos: loaded.eos_ids }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.02, seed }
}

fn req(prompt: Vec<u32>, max_tokens: usize, params: SamplingParams) -> Request {
    Request { params, ignore_eos: true, ..Request::greedy(prompt, max_tokens) }
}

/// Runs one request to the end on `core`.
fn run_one<T: Target>(core: &mut Core<T>, r: &Request) -> Seen {
    run_scheduled(core, &[(0, r.clone())], |_| {}).remove(0)
}

/// Steps until `done` holds, draining every watch; panics after 10,000 rounds.
fn step_until<T: Target>(c: &mut Core<T>, w: &mut [&mut Watch], mut done: impl FnMut(&[&mut Watch]) -> bool) {
    for round in 0..10_000 {
        if done(w) {
            return;
        }
        assert!(c.step(), "idle before the condition held");
        w.iter_mut().for_each(|w| w.drain(round));
    }
    panic!("the condition never held");
}

/// The multi-turn check on any target: turn 2 = turn 1's prompt + its reply + more tokens hits the cache at
/// turn 1's prompt end, and equals a fresh run with the cache off. Returns turn 2's reply.
fn second_turn_hits<T: Target>(make: impl Fn() -> T, p1: Vec<u32>, more: &[u32], params: SamplingParams) -> Vec<u32> {
    let mut c = core(make(), cfg());
    let turn1 = run_one(&mut c, &req(p1.clone(), 10, params));
    let mut p2 = p1.clone();
    p2.extend(&turn1.tokens);
    p2.extend_from_slice(more);
    let r2 = req(p2, 12, SamplingParams { seed: params.seed + 1, ..params });
    let turn2 = run_one(&mut c, &r2);
    assert_eq!(turn2.cached, Some(p1.len()));
    assert_eq!(turn2.stats.cached_tokens, p1.len());
    let m = c.metrics();
    assert_eq!(m.cache, CacheCounters { queries: 2, hits: 1, reused_tokens: p1.len() as u64 });
    let mut off = core(make(), EngineConfig { prompt_cache_bytes: 0, ..cfg() });
    let fresh = run_one(&mut off, &r2);
    assert_eq!(fresh.cached, Some(0));
    assert_eq!(turn2.tokens, fresh.tokens, "the resumed reply differs from the fresh one");
    assert_eq!(turn2.tokens.len(), 12);
    turn2.tokens
}

#[test]
fn a_second_turn_extending_the_first_hits_the_cache_and_equals_a_fresh_run_on_the_fake_target() {
    for params in [SamplingParams::greedy(), sampled(9)] {
        let p1 = ids(1, 23, 0, 64);
        let tokens = second_turn_hits(FakeTarget::new, p1.clone(), &[3, 1, 4, 1, 5], params);
        let mut p2 = p1.clone();
        p2.extend(&run_one(&mut core(FakeTarget::new(), cfg()), &req(p1, 10, params)).tokens);
        p2.extend_from_slice(&[3, 1, 4, 1, 5]);
        let r2 = req(p2, 12, SamplingParams { seed: params.seed + 1, ..params });
        assert_eq!(tokens, reference(&FakeTarget::new(), &r2).0);
    }
}

#[test]
fn a_second_turn_extending_the_first_hits_the_cache_and_equals_a_fresh_run_on_the_fixture_model() {
    for params in [SamplingParams::greedy(), sampled(77)] {
        let mut p1 = vec![1];
        p1.extend(ids(2, 28, 10, 511));
        let tokens = second_turn_hits(fixture, p1.clone(), &[40, 41, 42, 43, 44, 45], params);
        assert!(tokens.iter().any(|&t| t != tokens[0]), "the fixture collapsed onto one token: {tokens:?}");
    }
}

#[test]
fn the_fixture_models_resumed_reply_equals_the_solo_loop() {
    let target = fixture();
    let p1: Vec<u32> = ids(3, 21, 10, 511);
    let mut c = core(fixture(), cfg());
    run_one(&mut c, &req(p1.clone(), 4, SamplingParams::greedy()));
    let mut p2 = p1.clone();
    p2.extend([10, 20, 30, 40, 50, 60, 70]);
    let seen = run_one(&mut c, &req(p2.clone(), 16, sampled(5)));
    assert_eq!(seen.cached, Some(21));
    let solo_cfg = GenerateOptions {
        penalties: Default::default(),
        grammar: None,
        chunk: 7,
        max_tokens: 16,
        context: 4096,
        stop_ids: Vec::new(),
        params: sampled(5),
        drafts: None,
    };
    let (want, _) = generate(&target.model, &p2, &solo_cfg, |_| true).expect("solo runs");
    assert_eq!(seen.tokens, want);
}

#[test]
fn the_same_prompt_twice_resumes_from_the_last_chunk_boundary_before_its_end() {
    // Chunk 5: a prompt of 23 or 25 resumes at 20 (the state at its own end would leave no row), 6 at 5, 5 at 0.
    for (len, cached) in [(23, 20), (25, 20), (6, 5), (5, 0)] {
        let mut c = core(FakeTarget::new(), cfg());
        let r = req(ids(len as u64, len, 0, 64), 8, sampled(len as u64));
        let first = run_one(&mut c, &r);
        let second = run_one(&mut c, &r);
        assert_eq!((first.cached, second.cached), (Some(0), Some(cached)), "prompt of {len}");
        assert_eq!(second.tokens, first.tokens);
        assert_eq!(first.tokens, reference(c.target(), &r).0);
        let hits = u64::from(cached > 0);
        assert_eq!(c.metrics().cache, CacheCounters { queries: 2, hits, reused_tokens: cached as u64 });
    }
}

#[test]
fn a_prompt_cache_of_zero_bytes_never_hits() {
    let mut c = core(FakeTarget::new(), EngineConfig { prompt_cache_bytes: 0, ..cfg() });
    let r = req(ids(4, 23, 0, 64), 6, SamplingParams::greedy());
    for _ in 0..3 {
        assert_eq!(run_one(&mut c, &r).cached, Some(0));
    }
    let m = c.metrics();
    assert_eq!(m.cache, CacheCounters { queries: 3, hits: 0, reused_tokens: 0 });
    assert_eq!(m.cache_bytes, 0);
}

#[test]
fn eviction_keeps_the_cache_within_its_budget_least_recently_used_first() {
    // 1,024 bytes a position, a budget of 40 positions: after a 23-token prompt only its end (23 KiB) remains.
    let budget = 40 * 1024;
    let mut c = core(FakeTarget::new(), EngineConfig { prompt_cache_bytes: budget, ..cfg() });
    let (a, b) = (ids(10, 23, 1, 64), ids(11, 23, 1, 64));
    let mut most = 0;
    let mut run = |c: &mut Core<FakeTarget>, p: Vec<u32>| {
        run_scheduled(c, &[(0, req(p, 4, SamplingParams::greedy()))], |c| most = most.max(c.metrics().cache_bytes))
            .remove(0)
    };
    assert_eq!(run(&mut c, a.clone()).cached, Some(0));
    assert_eq!(c.metrics().cache_bytes, 23 * 1024);
    assert_eq!(run(&mut c, b.clone()).cached, Some(0));
    assert_eq!(c.metrics().cache_bytes, 23 * 1024, "a's entry was evicted for b's");
    assert_eq!(run(&mut c, [b, vec![9]].concat()).cached, Some(23));
    assert_eq!(run(&mut c, [a, vec![9]].concat()).cached, Some(0), "a was evicted");
    assert_eq!(c.metrics().cache, CacheCounters { queries: 4, hits: 1, reused_tokens: 23 });
    // The most held: b' + [9]'s end (24) beside the second turn of a's first two chunks (5 + 10), within 40.
    assert_eq!(most, 39 * 1024);
}

#[test]
fn cancelling_a_running_stream_finishes_it_and_frees_its_lane_and_memory_at_once() {
    let t = FakeTarget::new();
    let reqs: Vec<Request> = (0..3).map(|i| req(ids(20 + i, 7 + 9 * i as usize, 0, 64), 20, sampled(i))).collect();
    let mut c = core(t.clone(), cfg());
    let mut w: Vec<Watch> = reqs.iter().map(|r| submit(&mut c, r.clone())).collect();
    let mut refs: Vec<&mut Watch> = w.iter_mut().collect();
    step_until(&mut c, &mut refs, |w| w.iter().all(|w| w.seen.tokens.len() >= 3));
    assert_eq!(c.metrics().running, 3);
    assert!(c.cancel(w[1].id));
    let m = c.metrics();
    assert_eq!(m.running, 2);
    assert_eq!(m.reserved_bytes, t.stream_bytes(7 + 20, 1) + t.stream_bytes(25 + 20, 1));
    w[1].drain(0);
    assert_eq!(w[1].seen.reason, Some(FinishReason::Cancelled));
    assert_eq!(w[1].seen.stats.generated_tokens, w[1].seen.tokens.len());
    assert!(!c.cancel(w[1].id), "a finished id is unknown");
    let mut refs: Vec<&mut Watch> = w.iter_mut().collect();
    step_until(&mut c, &mut refs, |w| w.iter().all(|w| w.seen.reason.is_some()));
    let want: Vec<Vec<u32>> = reqs.iter().map(|r| reference(&t, r).0).collect();
    assert_eq!(w[0].seen.tokens, want[0]);
    assert_eq!(w[2].seen.tokens, want[2]);
    assert_eq!(w[1].seen.tokens, want[1][..w[1].seen.tokens.len()], "the cancelled reply is a prefix");
    let m = c.metrics();
    assert_eq!((m.running, m.reserved_bytes), (0, 0));
}

#[test]
fn cancelling_a_queued_request_touches_no_other_request() {
    let t = FakeTarget::new();
    let reqs: Vec<Request> = (0..3).map(|i| req(ids(30 + i, 12, 0, 64), 9, sampled(i))).collect();
    let mut c = core(t.clone(), EngineConfig { parallel: 1, ..cfg() });
    let mut w: Vec<Watch> = reqs.iter().map(|r| submit(&mut c, r.clone())).collect();
    assert!(c.step());
    assert_eq!((c.metrics().running, c.metrics().waiting), (1, 2));
    assert!(c.cancel(w[1].id));
    assert_eq!((c.metrics().running, c.metrics().waiting), (1, 1));
    let mut refs: Vec<&mut Watch> = w.iter_mut().collect();
    step_until(&mut c, &mut refs, |w| w.iter().all(|w| w.seen.reason.is_some()));
    let s = &w[1].seen;
    assert_eq!((s.reason, s.cached, s.tokens.len()), (Some(FinishReason::Cancelled), None, 0));
    assert_eq!((s.stats.prompt_tokens, s.stats.generated_tokens), (12, 0));
    assert_eq!(w[0].seen.tokens, reference(&t, &reqs[0]).0);
    assert_eq!(w[2].seen.tokens, reference(&t, &reqs[2]).0);
    assert_eq!(c.metrics().cache.queries, 2, "the cancelled request never reached the cache");
}

#[test]
fn dropping_the_receiver_of_a_running_stream_cancels_it_at_its_next_token() {
    let t = FakeTarget::new();
    let reqs: Vec<Request> = (0..2).map(|i| req(ids(40 + i, 10, 0, 64), 30, sampled(i))).collect();
    let mut c = core(t.clone(), cfg());
    let mut w: Vec<Watch> = reqs.iter().map(|r| submit(&mut c, r.clone())).collect();
    let mut refs: Vec<&mut Watch> = w.iter_mut().collect();
    step_until(&mut c, &mut refs, |w| w[0].seen.tokens.len() >= 2);
    w[0].rx = None;
    assert_eq!(c.metrics().running, 2);
    assert!(c.step());
    let m = c.metrics();
    assert_eq!((m.running, m.reserved_bytes), (1, t.stream_bytes(10 + 30, 1)));
    assert!(!c.cancel(w[0].id), "the dropped stream already left");
    let mut refs: Vec<&mut Watch> = w.iter_mut().collect();
    step_until(&mut c, &mut refs, |w| w[1].seen.reason.is_some());
    assert_eq!(w[1].seen.tokens, reference(&t, &reqs[1]).0);
}

#[test]
fn a_request_that_can_never_fit_is_refused_with_what_would_fit() {
    let t = FakeTarget::new();
    let mut c = core(t.clone(), EngineConfig { memory_bytes: 10_000, ..cfg() });
    let e = c.submit(Request::greedy(vec![1; 5], 10), channel().0).expect_err("never fits");
    assert_eq!(e, SubmitError::NeverFits { needed: 15 * 1024, tokens: 15, budget: 10_000, fits: 9 });
    assert!(t.stream_bytes(9, 1) <= 10_000 && t.stream_bytes(10, 1) > 10_000);
    assert!(e.to_string().contains("at most 9 positions (prompt plus max_tokens) fit"), "{e}");
    assert!(c.submit(Request::greedy(vec![1; 5], 4), channel().0).is_ok(), "9 positions fit");

    let m = fixture();
    // The engine's verify windows: the pending token and at most `max_draft` drafts.
    let v = cfg().verify_rows(tensorfold_engine::model_target::MAX_DRAFT);
    let budget = m.stream_bytes(100, v) + 1;
    let mut c = core(m, EngineConfig { memory_bytes: budget, ..cfg() });
    match c.submit(Request::greedy(vec![1; 50], 60), channel().0) {
        Err(SubmitError::NeverFits { tokens: 110, fits: 100, budget: b, needed }) => {
            assert_eq!((b, needed), (budget, c.target().stream_bytes(110, v)));
        }
        other => panic!("expected NeverFits with fits 100, got {other:?}"),
    }
    assert_eq!(c.metrics().waiting, 0);
}

#[test]
fn a_request_that_fits_alone_but_not_beside_a_running_one_waits_and_then_runs() {
    let t = FakeTarget::new();
    let (a, b) = (req(ids(50, 10, 0, 64), 10, sampled(1)), req(ids(51, 5, 0, 64), 10, sampled(2)));
    let mut c = core(t.clone(), EngineConfig { memory_bytes: 30 * 1024, ..cfg() });
    let mut w = [submit(&mut c, a.clone()), submit(&mut c, b.clone())];
    assert!(c.step());
    let m = c.metrics();
    assert_eq!((m.running, m.waiting, m.reserved_bytes), (1, 1, 20 * 1024));
    let mut refs: Vec<&mut Watch> = w.iter_mut().collect();
    step_until(&mut c, &mut refs, |w| w.iter().all(|w| w.seen.reason.is_some()));
    assert!(w[1].seen.prefilled_round > w[0].seen.finished_round, "b ran only after a finished");
    assert_eq!(w[0].seen.tokens, reference(&t, &a).0);
    assert_eq!(w[1].seen.tokens, reference(&t, &b).0);
}

#[test]
fn a_full_queue_refuses_the_next_request_and_takes_one_again_once_it_drains() {
    // One free lane takes one request at the next round; two more may wait; a fourth is refused.
    let mut c = core(FakeTarget::new(), EngineConfig { parallel: 1, queue_capacity: 2, ..cfg() });
    let r = Request { ignore_eos: true, ..Request::greedy(vec![1, 2, 3], 4) };
    let mut keep = Vec::new();
    let mut submit = |c: &mut Core<FakeTarget>| {
        let (tx, rx) = channel();
        keep.push(rx);
        c.submit(r.clone(), tx)
    };
    for _ in 0..3 {
        assert!(submit(&mut c).is_ok());
    }
    assert_eq!(submit(&mut c), Err(SubmitError::QueueFull { capacity: 2 }));
    assert_eq!(c.metrics().waiting, 3);
    assert!(c.step());
    assert_eq!((c.metrics().running, c.metrics().waiting), (1, 2));
    assert_eq!(submit(&mut c), Err(SubmitError::QueueFull { capacity: 2 }), "the lane is busy");
    while c.metrics().running == 1 && c.metrics().waiting == 2 {
        assert!(c.step());
    }
    assert!(submit(&mut c).is_ok(), "a finished stream made room");
}

#[test]
fn a_queue_capacity_of_zero_still_serves_requests_that_a_free_lane_takes() {
    let mut c = core(FakeTarget::new(), EngineConfig { parallel: 2, queue_capacity: 0, ..cfg() });
    let r = Request::greedy(vec![1, 2, 3], 4);
    assert!(c.submit(r.clone(), channel().0).is_ok());
    assert!(c.submit(r.clone(), channel().0).is_ok());
    assert_eq!(c.submit(r, channel().0), Err(SubmitError::QueueFull { capacity: 0 }));
}

/// A greedy reply of 20 tokens (no EOS) and the first token at index >= 3 not seen before it.
fn stop_candidate() -> (Request, Vec<u32>, usize) {
    let t = FakeTarget { eos: vec![], ..FakeTarget::new() };
    let r = Request::greedy(ids(60, 9, 0, 64), 20);
    let toks = reference(&t, &r).0;
    let k = (3..toks.len()).find(|&k| !toks[..k].contains(&toks[k])).expect("a fresh token");
    (r, toks, k)
}

#[test]
fn an_eos_id_stops_the_reply_as_its_last_token_and_ignore_eos_runs_to_max_tokens() {
    let (r, toks, k) = stop_candidate();
    let t = FakeTarget { eos: vec![toks[k]], ..FakeTarget::new() };
    let stopped = run_one(&mut core(t.clone(), cfg()), &r);
    assert_eq!((stopped.tokens.as_slice(), stopped.reason), (&toks[..=k], Some(FinishReason::Stop)));
    let ignored = run_one(&mut core(t, cfg()), &Request { ignore_eos: true, ..r });
    assert_eq!((ignored.tokens, ignored.reason), (toks, Some(FinishReason::Length)));
    assert_eq!(ignored.stats.generated_tokens, 20);
}

#[test]
fn a_callers_stop_id_stops_the_reply_even_with_ignore_eos() {
    let (r, toks, k) = stop_candidate();
    let t = FakeTarget { eos: vec![], ..FakeTarget::new() };
    let r = Request { stop_ids: vec![toks[k]], ignore_eos: true, ..r };
    let seen = run_one(&mut core(t, cfg()), &r);
    assert_eq!((seen.tokens.as_slice(), seen.reason), (&toks[..=k], Some(FinishReason::Stop)));
}

#[test]
fn a_reply_that_fills_the_context_exactly_finishes_length_with_max_tokens() {
    let t = FakeTarget { context: 40, ..FakeTarget::new() };
    let r = req(ids(70, 30, 0, 64), 10, sampled(3));
    let seen = run_one(&mut core(t.clone(), cfg()), &r);
    assert_eq!((seen.tokens.len(), seen.reason), (10, Some(FinishReason::Length)));
    assert_eq!(seen.tokens, reference(&t, &r).0);
    let mut c = core(t, cfg());
    let e = c.submit(req(r.prompt.clone(), 11, sampled(3)), channel().0);
    assert_eq!(e, Err(SubmitError::ContextExceeded { prompt: 30, max_tokens: 11, context: 40 }));
}

#[test]
fn bad_requests_are_refused_by_name_and_queue_nothing() {
    let mut c = core(FakeTarget::new(), cfg());
    assert_eq!(c.submit(Request::greedy(vec![], 4), channel().0), Err(SubmitError::EmptyPrompt));
    assert_eq!(
        c.submit(Request::greedy(vec![1, 64, 2], 4), channel().0),
        Err(SubmitError::TokenOutOfRange { id: 64, vocab: 64 })
    );
    assert_eq!(
        c.submit(Request::greedy(vec![1; 4000], 97), channel().0),
        Err(SubmitError::ContextExceeded { prompt: 4000, max_tokens: 97, context: 4096 })
    );
    let hot = Request { params: SamplingParams { temperature: -1.0, ..sampled(1) }, ..Request::greedy(vec![1], 4) };
    match c.submit(hot, channel().0) {
        Err(SubmitError::Sampling(SampleError::InvalidParam { name: "temperature", .. })) => {}
        other => panic!("expected an invalid temperature, got {other:?}"),
    }
    assert_eq!(c.metrics().waiting, 0);
    assert!(!c.step(), "nothing was queued");
    assert_eq!(c.submit(Request::greedy(vec![1], 4), channel().0), Ok(1), "refusals used no id");
}

#[test]
fn a_stream_whose_logits_turn_non_finite_fails_alone_and_frees_its_lane() {
    let inner = FakeTarget::new();
    let reqs: Vec<(usize, Request)> =
        (0..6).map(|i| (i % 2, req(ids(80 + i as u64, 4 + 11 * i, 0, 64), 15, sampled(i as u64)))).collect();
    let poison = reqs[2].1.prompt.clone();
    let mut c =
        core(Poisoned { inner: inner.clone(), poison: poison.clone(), after: 3, fault: Fault::NanLogits }, cfg());
    let seen = run_scheduled(&mut c, &reqs, |_| {});
    for (k, ((_, r), s)) in reqs.iter().zip(&seen).enumerate() {
        let want = reference(&inner, r).0;
        if k == 2 {
            assert_eq!((s.reason, s.tokens.as_slice()), (Some(FinishReason::Error), &want[..3]));
            let msg = format!("draw at position {}: logit at index 0 is not finite", poison.len() + 3);
            assert_eq!(s.error.as_deref(), Some(msg.as_str()));
        } else {
            assert_eq!((s.reason, &s.tokens), (Some(FinishReason::Length), &want), "request {k}");
        }
    }
    let m = c.metrics();
    assert_eq!((m.running, m.waiting, m.reserved_bytes, m.state_bytes), (0, 0, 0, 0));
}
