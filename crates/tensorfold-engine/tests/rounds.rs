//! Shared rounds on the fake target, driven by `Core::step` with a fixed clock: every reply equals an
//! independent serial reference (a plain loop over `FakeTarget::logits` and `keyed::draw`, no core), token for
//! token, at 1, 2, 3, 8 and 16 streams, greedy and sampled, with prompts of 1 to 300 tokens split across rounds,
//! streams joining and leaving at different rounds, shared rounds on or off, and fewer lanes than requests.

mod common;

use common::{Recording, Seen, core, mix, params_mix, reference, run_scheduled};
use std::time::Duration;
use tensorfold_engine::core::EngineConfig;
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::keyed::SamplingParams;
use tensorfold_engine::{FinishReason, Request};

/// Small rounds: a 300-token prompt takes 60 chunks, and prefill shares rounds with decode rows.
fn small_rounds() -> EngineConfig {
    EngineConfig { parallel: 16, round_rows: 7, prefill_chunk: 5, ..EngineConfig::default() }
}

/// Requests joining at turns 0, 4 and 9 (a third each).
fn staggered(reqs: Vec<Request>) -> Vec<(usize, Request)> {
    reqs.into_iter().enumerate().map(|(i, r)| ([0, 4, 9][i % 3], r)).collect()
}

/// Asserts each reply equals the serial reference (tokens and finish reason) and the fixed clock's zero times.
fn assert_equal_reference(target: &FakeTarget, reqs: &[(usize, Request)], seen: &[Seen]) {
    for (k, ((_, r), s)) in reqs.iter().zip(seen).enumerate() {
        let (want, why) = reference(target, r);
        assert_eq!(s.tokens, want, "request {k} (prompt {} tokens, {:?})", r.prompt.len(), r.params);
        assert_eq!(s.reason, Some(why), "request {k}");
        assert_eq!(s.error, None);
        assert_eq!(s.cached, Some(s.stats.cached_tokens), "request {k}: Prefilled and stats agree");
        assert_eq!((s.stats.queued, s.stats.ttft, s.stats.decode), (Duration::ZERO, Duration::ZERO, Duration::ZERO));
    }
}

/// Runs `n` requests with parameters from `params` staggered over small rounds; checks them against the
/// reference, the row budget of every call, and that rounds were shared (fewer rounds than run one by one).
fn check_streams(n: usize, params: impl Fn(usize, u64) -> SamplingParams) {
    let target = FakeTarget::new();
    let reqs: Vec<Request> = mix(n, 0xabc0 + n as u64)
        .into_iter()
        .enumerate()
        .map(|(i, r)| Request { params: params(i, 1000 + i as u64), ..r })
        .collect();
    let reqs = staggered(reqs);
    let rec = Recording::new(target.clone());
    let calls = rec.calls.clone();
    let mut c = core(rec, small_rounds());
    let mut most_running = 0;
    let seen = run_scheduled(&mut c, &reqs, |c| most_running = most_running.max(c.metrics().running));
    assert_equal_reference(&target, &reqs, &seen);
    let m = c.metrics();
    assert_eq!((m.running, m.waiting, m.reserved_bytes, m.state_bytes), (0, 0, 0, 0));
    assert_eq!(m.generated_tokens, seen.iter().map(|s| s.tokens.len() as u64).sum::<u64>());
    assert_eq!(m.prompt_tokens, reqs.iter().map(|(_, r)| r.prompt.len() as u64).sum::<u64>());
    let calls = calls.lock().expect("not poisoned");
    assert_eq!(calls.len() as u64, m.rounds, "one forward a round");
    for call in calls.iter() {
        let rows: usize = call.iter().map(|s| s.1).sum();
        assert!(rows <= 7.max(call.len()), "a round of {rows} rows over {} segments exceeds the budget", call.len());
    }
    let alone: u64 = reqs
        .iter()
        .map(|(_, r)| {
            let mut one = core(target.clone(), small_rounds());
            run_scheduled(&mut one, &[(0, r.clone())], |_| {});
            one.metrics().rounds
        })
        .sum();
    if n == 1 {
        assert_eq!(m.rounds, alone);
    } else {
        assert!(most_running > 1, "{n} streams never ran together");
        assert!(m.rounds < alone, "{n} streams took {} rounds, as many as one by one ({alone})", m.rounds);
        assert!(calls.iter().any(|c| c.len() > 1 && c.iter().any(|s| s.1 > 1)), "no prefill chunk shared a round");
    }
}

#[test]
fn greedy_replies_among_1_2_3_8_and_16_streams_equal_the_serial_reference() {
    for n in [1, 2, 3, 8, 16] {
        check_streams(n, |_, _| SamplingParams::greedy());
    }
}

#[test]
fn sampled_replies_among_1_2_3_8_and_16_streams_equal_the_serial_reference() {
    for n in [1, 2, 3, 8, 16] {
        check_streams(n, |i, seed| params_mix(1 + i % 5, seed));
    }
}

#[test]
fn mixed_greedy_and_sampled_replies_among_1_2_3_8_and_16_streams_equal_the_serial_reference() {
    for n in [1, 2, 3, 8, 16] {
        check_streams(n, params_mix);
    }
}

#[test]
fn the_same_request_gives_the_same_reply_with_other_seeds_beside_it_and_differs_with_its_own_seed() {
    let target = FakeTarget::new();
    let base = Request {
        prompt: common::ids(7, 40, 0, 64),
        params: SamplingParams { temperature: 0.8, seed: 42, ..SamplingParams::greedy() },
        max_tokens: 30,
        ignore_eos: true,
        ..Request::greedy(Vec::new(), 0)
    };
    let other = |seed| Request { params: SamplingParams { seed, ..base.params }, ..base.clone() };
    let reqs = vec![(0, base.clone()), (0, other(43)), (2, other(44)), (0, base.clone())];
    let seen = run_scheduled(&mut core(target.clone(), small_rounds()), &reqs, |_| {});
    assert_equal_reference(&target, &reqs, &seen);
    assert_eq!(seen[0].tokens, seen[3].tokens);
    assert_ne!(seen[0].tokens, seen[1].tokens, "seeds 42 and 43 drew the same 30 tokens");
}

#[test]
fn a_prompt_is_prefilled_in_chunks_within_the_row_budget_beside_a_decode_row() {
    // Round budget 4, chunk 5: B's 12-token prompt runs as 3+2, 3+2, 2 rows, never crossing a chunk boundary,
    // each round beside A's decode row.
    let target = FakeTarget::new();
    let a = Request { prompt: vec![5, 6, 7], max_tokens: 12, ignore_eos: true, ..Request::greedy(vec![], 0) };
    let b =
        Request { prompt: common::ids(3, 12, 1, 64), max_tokens: 3, ignore_eos: true, ..Request::greedy(vec![], 0) };
    let reqs = vec![(0, a), (2, b)];
    let rec = Recording::new(target.clone());
    let calls = rec.calls.clone();
    let cfg = EngineConfig { round_rows: 4, prefill_chunk: 5, ..small_rounds() };
    let seen = run_scheduled(&mut core(rec, cfg), &reqs, |_| {});
    assert_equal_reference(&target, &reqs, &seen);
    let want: Vec<Vec<(usize, usize)>> = vec![
        vec![(0, 3)],
        vec![(3, 1)],
        vec![(4, 1), (0, 3)],
        vec![(5, 1), (3, 2)],
        vec![(6, 1), (5, 3)],
        vec![(7, 1), (8, 2)],
        vec![(8, 1), (10, 2)],
        vec![(9, 1), (12, 1)],
        vec![(10, 1), (13, 1)],
        vec![(11, 1)],
        vec![(12, 1)],
        vec![(13, 1)],
    ];
    assert_eq!(*calls.lock().expect("not poisoned"), want);
    assert_eq!((seen[1].prefilled_round, seen[1].finished_round), (Some(7), Some(9)));
    assert_eq!(seen[0].finished_round, Some(12));
}

#[test]
fn shared_rounds_off_gives_the_same_tokens_with_one_stream_a_forward() {
    let target = FakeTarget::new();
    let reqs = staggered(mix(8, 0x5eed));
    let rec = Recording::new(target.clone());
    let calls = rec.calls.clone();
    let cfg = EngineConfig { shared_rounds: false, ..small_rounds() };
    let mut off = core(rec, cfg);
    let seen_off = run_scheduled(&mut off, &reqs, |_| {});
    let seen_on = run_scheduled(&mut core(target.clone(), small_rounds()), &reqs, |_| {});
    assert_equal_reference(&target, &reqs, &seen_off);
    for (a, b) in seen_off.iter().zip(&seen_on) {
        assert_eq!(a.tokens, b.tokens);
    }
    let calls = calls.lock().expect("not poisoned");
    assert!(calls.iter().all(|c| c.len() == 1), "a forward over more than one stream with shared rounds off");
    assert!(calls.len() as u64 > off.metrics().rounds, "rounds held more than one stream");
}

#[test]
fn with_one_lane_requests_run_one_at_a_time_first_come_first_served() {
    let target = FakeTarget::new();
    let reqs: Vec<(usize, Request)> = mix(6, 0xf1f0).into_iter().map(|r| (0, r)).collect();
    let cfg = EngineConfig { parallel: 1, ..small_rounds() };
    let mut c = core(target.clone(), cfg);
    let mut waiting = Vec::new();
    let seen = run_scheduled(&mut c, &reqs, |c| {
        let m = c.metrics();
        assert!(m.running <= 1);
        waiting.push(m.waiting);
    });
    assert_equal_reference(&target, &reqs, &seen);
    assert_eq!(waiting[0], 5, "one admitted, five waiting after the first round");
    assert!(waiting.windows(2).all(|w| w[1] <= w[0]));
    for k in 1..seen.len() {
        let (prev, next) = (&seen[k - 1], &seen[k]);
        assert!(
            next.prefilled_round > prev.finished_round,
            "request {k} prefilled at turn {:?}, before request {} finished at {:?}",
            next.prefilled_round,
            k - 1,
            prev.finished_round
        );
    }
}

#[test]
fn with_three_lanes_eight_requests_never_run_more_than_three_at_once_and_equal_the_reference() {
    let target = FakeTarget::new();
    let reqs: Vec<(usize, Request)> = mix(8, 0x3333).into_iter().map(|r| (0, r)).collect();
    let mut c = core(target.clone(), EngineConfig { parallel: 3, ..small_rounds() });
    let mut counts = Vec::new();
    let seen = run_scheduled(&mut c, &reqs, |c| {
        let m = c.metrics();
        counts.push((m.running, m.waiting));
    });
    assert_equal_reference(&target, &reqs, &seen);
    assert_eq!(counts[0], (3, 5));
    assert!(counts.iter().all(|&(r, _)| r <= 3));
    // The first three are admitted first: each of the rest is prefilled only after one of them finished.
    let first_finish = seen[..3].iter().filter_map(|s| s.finished_round).min().expect("finished");
    assert!(seen[3..].iter().all(|s| s.prefilled_round > Some(first_finish)));
    assert_eq!(c.metrics().reserved_bytes, 0);
}

#[test]
fn streams_that_stop_on_eos_leave_early_and_the_others_stay_equal_to_the_reference() {
    // Honour EOS with a small vocabulary so stops come early and lanes turn over mid-run.
    let target = FakeTarget { vocab: 6, ..FakeTarget::new() };
    let reqs: Vec<(usize, Request)> = (0..12)
        .map(|i| {
            let r = Request {
                prompt: common::ids(i, 3 + 17 * i as usize, 1, 6),
                params: params_mix(i as usize, i),
                max_tokens: 25,
                ..Request::greedy(Vec::new(), 0)
            };
            (i as usize % 4, r)
        })
        .collect();
    let seen = run_scheduled(&mut core(target.clone(), small_rounds()), &reqs, |_| {});
    assert_equal_reference(&target, &reqs, &seen);
    let stops = seen.iter().filter(|s| s.reason == Some(FinishReason::Stop)).count();
    assert!(stops >= 3, "only {stops} of 12 streams stopped on EOS");
    assert!(seen.iter().filter(|s| s.reason == Some(FinishReason::Stop)).all(|s| s.tokens.last() == Some(&0)));
}
