//! Draft scheduling decisions from scripted measurements: the shared-round guard's plain/drafted stretches,
//! the depth rule, and confidence-scheduled verify; and the guard inside the lane core under a clock the
//! target advances (drafts that do not pay are turned off, drafts that pay are kept, tokens unchanged).

use std::sync::Arc;
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};
use tensorfold_engine::core::{Clock, Core, EngineConfig, Metrics};
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::schedule::*;
use tensorfold_engine::{DraftCall, Drafts, Event, ForwardCall, Request, SegOut, Target};
use tensorfold_model::ForwardError;
use tensorfold_model::drafter::DraftBlock;

/// Runs `n` rounds of `mode` at `streams` streams, each committing `tokens` in `secs`; returns the modes seen.
fn feed(g: &mut RoundGuard, streams: usize, rounds: usize, mut rate: impl FnMut(Mode) -> (u64, f64)) -> Vec<Mode> {
    (0..rounds)
        .map(|_| {
            let m = g.mode(streams);
            let (t, s) = rate(m);
            g.record(streams, m, t, s);
            m
        })
        .collect()
}

#[test]
fn the_guard_measures_16_plain_and_4_drafted_rounds_then_runs_the_faster_for_512() {
    let mut g = RoundGuard::default();
    // Drafted rounds commit 3 tokens in the time plain rounds commit 1.
    let modes = feed(&mut g, 4, 17 + 5 + 512 + 17, |m| if m == Mode::Drafted { (12, 1.0) } else { (4, 1.0) });
    assert!(modes[..17].iter().all(|&m| m == Mode::Plain), "starts plain: 16 measured plus the unmeasured first");
    assert!(modes[17..22].iter().all(|&m| m == Mode::Drafted), "then 4 drafted plus the first");
    assert!(modes[22..22 + 512].iter().all(|&m| m == Mode::Drafted), "drafted wins: a stretch of 512");
    assert!(modes[22 + 512..].iter().all(|&m| m == Mode::Plain), "then plain is measured again");
    // Drafted wins again: the next stretch doubles.
    let next = feed(&mut g, 4, 1024 + 1, |m| if m == Mode::Drafted { (12, 1.0) } else { (4, 1.0) });
    assert!(next[..1024].iter().all(|&m| m == Mode::Drafted) && next[1024] == Mode::Plain, "1024 drafted rounds");
    // Another stream count has its own state: it starts plain.
    assert_eq!(g.mode(5), Mode::Plain);
}

#[test]
fn drafted_must_beat_plain_by_five_percent() {
    let mut g = RoundGuard::default();
    // 4% faster: not enough.
    let modes = feed(&mut g, 2, 22 + 512, |m| if m == Mode::Drafted { (104, 1.0) } else { (100, 1.0) });
    assert!(modes[22..].iter().all(|&m| m == Mode::Plain), "plain kept for the stretch");
    let mut g = RoundGuard::default();
    let modes = feed(&mut g, 2, 22 + 512, |m| if m == Mode::Drafted { (106, 1.0) } else { (100, 1.0) });
    assert!(modes[22..].iter().all(|&m| m == Mode::Drafted), "6% faster: drafted");
}

#[test]
fn a_modes_first_round_is_not_measured() {
    let mut g = RoundGuard::default();
    // The first plain round is absurdly fast; if it were measured plain would win.
    let mut first = true;
    let modes = feed(&mut g, 3, 22 + 1, |m| {
        if m == Mode::Plain && std::mem::take(&mut first) {
            (1_000_000, 1.0)
        } else if m == Mode::Drafted {
            (3, 1.0)
        } else {
            (2, 1.0)
        }
    });
    assert_eq!(modes[22], Mode::Drafted);
}

#[test]
fn the_depth_rule_follows_measured_acceptance_and_cost() {
    let mut c = CostModel::default();
    // Without cost measurements every depth costs the same: the deepest wins.
    assert_eq!(c.depth(1, 0, 8), 8);
    // Draft 0 is nearly always accepted, draft 1 nearly never.
    for _ in 0..200 {
        c.record_window(8, 1);
    }
    assert!(c.acceptance(0) > 0.95 && c.acceptance(1) < 0.05);
    // Cost grows by 50% a row: one draft (2 rows) is worth it, more are not.
    for r in 1..=9 {
        for _ in 0..50 {
            c.record_round(r, 1.0 + 0.5 * (r as f64 - 1.0));
        }
    }
    let depths: Vec<usize> = (0..PROBE_EVERY)
        .map(|_| {
            let d = c.depth(1, 0, 8);
            c.record_round(2, 1.5);
            d
        })
        .collect();
    assert_eq!(depths.iter().filter(|&&d| d == 1).count() as u64, PROBE_EVERY - 1, "{depths:?}");
    assert!(depths.contains(&2), "one probe one deeper: {depths:?}");
    assert!((c.expected_tokens(0) - 1.0).abs() < 1e-12);
}

#[test]
fn scheduled_verify_admits_drafts_by_survival_while_the_rate_improves() {
    let mut c = CostModel::default();
    // Each extra row costs 10% more.
    for r in 1..=16 {
        for _ in 0..50 {
            c.record_round(r, 1.0 + 0.1 * (r as f64 - 1.0));
        }
    }
    let conf = vec![vec![0.9, 0.9, 0.1, 0.9], vec![0.05, 0.9], vec![0.8, 0.8, 0.8]];
    let take = c.scheduled(&conf, 0);
    assert_eq!(take[1], 0, "a 5% draft never pays 10% a row: {take:?}");
    assert_eq!(take[0], 2, "stops at the 0.1 draft: {take:?}");
    assert!(take[2] >= 1, "{take:?}");
    // No cost data: every row costs the same, so every draft with any chance is admitted in survival order.
    let free = CostModel::default().scheduled(&conf, 0);
    assert_eq!(free, vec![4, 2, 3]);
}

/// A clock the target advances: each forward costs `base + per_row * rows`, each block pass `draft`.
#[derive(Clone)]
struct Ticks(Arc<AtomicU64>, Instant);

impl Clock for Ticks {
    fn now(&self) -> Instant {
        self.1 + Duration::from_nanos(self.0.load(Ordering::SeqCst))
    }
}

/// The fake target behind a scripted cost, with a drafter that proposes `good` right tokens then wrong ones.
struct Timed {
    inner: FakeTarget,
    clock: Ticks,
    base_us: u64,
    row_us: u64,
    draft_us: u64,
    good: usize,
}

impl Target for Timed {
    delegate_target!(FakeTarget);
    fn forward(&self, call: &ForwardCall<'_, ()>, st: &mut [&mut Vec<u32>]) -> Result<Vec<SegOut>, ForwardError> {
        self.clock.0.fetch_add(1000 * (self.base_us + self.row_us * call.tokens.len() as u64), Ordering::SeqCst);
        self.inner.forward(call, st)
    }
    fn keep(&self, s: &mut Vec<u32>, pos: usize) -> Result<(), ForwardError> {
        self.inner.keep(s, pos)
    }
    fn draft(&self, states: &[&Vec<u32>], call: &DraftCall<'_>) -> Option<Result<Drafts<()>, ForwardError>> {
        let anchors = call.anchors;
        self.clock.0.fetch_add(1000 * self.draft_us, Ordering::SeqCst);
        let p = tensorfold_engine::keyed::SamplingParams::greedy();
        let blocks = states
            .iter()
            .zip(anchors)
            .map(|(s, &a)| {
                let mut h: Vec<u32> = s.to_vec();
                h.push(a);
                let mut tokens = Vec::new();
                for k in 0..8 {
                    let t = tensorfold_engine::keyed::draw(&p, h.len() as u64, &self.inner.logits(&h)).expect("finite");
                    let t = if k < self.good { t } else { (t + 1) % self.inner.vocab as u32 };
                    tokens.push(t);
                    h.push(t);
                }
                DraftBlock { tokens, confidence: Vec::new(), scores: Vec::new() }
            })
            .collect();
        Some(Ok(Drafts::Read(blocks)))
    }
}

/// Four requests of 600 tokens through the core over [`Timed`]: their tokens, the core's metrics, and the seconds
/// the clock moved in all.
fn run_timed(good: usize, draft_us: u64, guard: bool, draft: bool) -> (Vec<Vec<u32>>, Metrics, f64) {
    let clock = Ticks(Arc::new(AtomicU64::new(0)), Instant::now());
    let t = Timed { inner: FakeTarget::new(), clock: clock.clone(), base_us: 1000, row_us: 100, draft_us, good };
    let cfg = EngineConfig { parallel: 4, copy_min: 0, round_guard: guard, ..EngineConfig::default() };
    let mut core = Core::new(t, cfg, Box::new(clock.clone()));
    let rx: Vec<_> = (0..4u32)
        .map(|i| {
            let (tx, rx) = channel();
            let r = Request { ignore_eos: true, draft, ..Request::greedy(vec![1 + i, 2, 3], 600) };
            core.submit(r, tx).expect("admitted");
            rx
        })
        .collect();
    while core.step() {}
    let toks = rx
        .iter()
        .map(|r| r.try_iter().filter_map(|e| if let Event::Token(t) = e { Some(t) } else { None }).collect())
        .collect();
    (toks, core.metrics(), clock.0.load(Ordering::SeqCst) as f64 * 1e-9)
}

#[test]
fn inside_the_core_the_guard_turns_off_drafts_that_do_not_pay_and_keeps_those_that_do() {
    let drafted = |m: Metrics| m.drafted_tokens as usize;
    let (plain, _, _) = run_timed(0, 0, false, false);
    // Only the first draft right and a drafter pass that costs twice a plain round: drafting loses.
    let (bad, m, _) = run_timed(1, 3000, true, true);
    let bad_drafted = drafted(m);
    let (bad_unguarded, m, _) = run_timed(1, 3000, false, true);
    let bad_all = drafted(m);
    // Every draft right and a cheap drafter pass: drafting wins.
    let (good, m, _) = run_timed(8, 300, true, true);
    let good_drafted = drafted(m);
    assert_eq!(bad, plain);
    assert_eq!(bad_unguarded, plain);
    assert_eq!(good, plain);
    assert!(bad_drafted * 5 < bad_all, "the guard cut useless drafts: {bad_drafted} of {bad_all}");
    assert!(good_drafted > 1500, "drafts that pay are kept: {good_drafted}");
}

#[test]
fn round_and_forward_seconds_split_a_round_into_the_forward_and_the_rest() {
    // The clock moves only inside forwards (1 ms + 0.1 ms a row) and block passes (0.5 ms): the rest of a round is
    // free, so plain rounds are all forward and drafted ones differ by the block passes alone.
    for draft in [false, true] {
        let (_, m, total) = run_timed(3, 500, false, draft);
        assert!((m.round_seconds - total).abs() < 1e-9, "every tick falls in a round: {} vs {total}", m.round_seconds);
        let host = m.round_seconds - m.forward_seconds;
        if draft {
            assert!(m.drafted_tokens > 0);
            assert!(host > 0.0 && (host / 500e-6 - (host / 500e-6).round()).abs() < 1e-6, "block passes: {host}");
        } else {
            assert!(host.abs() < 1e-9, "plain rounds are all forward: {host}");
        }
    }
}
