//! Block drafts are lossless: with the DSpark drafter on the fixture model, and with scripted drafters on
//! the fake target (an oracle that proposes the plain reply, one right for the first half of each block,
//! one that proposes nothing on some rounds), a drafted reply equals its plain reply token for token,
//! greedy and sampled, with streams joining and leaving mid-flight. Planted verify faults turn them red.

mod common;

use std::sync::mpsc::channel;
use std::time::Instant;
use tensorfold_engine::core::{Core, EngineConfig, FixedClock, PlantedFault};
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::keyed::{SamplingParams, draw};
use tensorfold_engine::schedule::VerifyMode;
use tensorfold_engine::{DraftCall, Drafts, Event, ForwardCall, ModelTarget, Request, SegOut, Stats, Target};
use tensorfold_kernels::CpuBackend;
use tensorfold_model::drafter::{DraftBlock, DrafterBits, open_drafter_with};
use tensorfold_model::{ForwardError, Source};

fn run<T: Target>(target: T, cfg: EngineConfig, reqs: &[Request]) -> (Vec<Vec<u32>>, Vec<Stats>) {
    common::run_all(target, cfg, reqs)
}

/// Six requests, greedy and sampled, of different lengths (so streams leave at different rounds).
fn requests(vocab: u32, seed0: u64) -> Vec<Request> {
    (0..6u64)
        .map(|i| {
            let prompt: Vec<u32> = (0..5 + i as u32).map(|k| 10 + (k * 7 + i as u32 * 13) % (vocab - 10)).collect();
            let temperature = if i % 2 == 0 { 0.0 } else { 0.8 };
            Request {
                params: SamplingParams { temperature, seed: seed0 + i, ..SamplingParams::greedy() },
                ignore_eos: true,
                ..Request::greedy(prompt, 20 + 3 * i as usize)
            }
        })
        .collect()
}

/// Copies off (so every draft is a block draft); 3 lanes for 6 requests, so streams join mid-flight.
fn cfg() -> EngineConfig {
    EngineConfig {
        parallel: 3,
        copy_min: 0,
        max_draft: 8,
        round_rows: 24,
        prefill_chunk: 4,
        round_guard: false,
        ..EngineConfig::default()
    }
}

fn plain(reqs: &[Request]) -> Vec<Request> {
    reqs.iter().map(|r| Request { draft: false, ..r.clone() }).collect()
}

fn fixture_target() -> ModelTarget<CpuBackend> {
    fixture_target_with(DrafterBits::Stored)
}

fn fixture_target_with(bits: DrafterBits) -> ModelTarget<CpuBackend> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut l = tensorfold_model::open(&Source::Dir(root.join("lfm2-moe-f32")), CpuBackend).expect("target");
    let src = Source::Dir(root.join("dspark-tiny"));
    let d = open_drafter_with(&src, &l.model.cfg, &l.model.backend, bits).expect("drafter");
    l.model.drafter = Some(d);
    ModelTarget { model: std::sync::Arc::new(l.model), eos: l.eos_ids }
}

#[test]
fn dspark_drafted_replies_equal_plain_replies_on_the_fixture_model() {
    let reqs = requests(512, 7);
    let (undrafted, _) = run(fixture_target(), cfg(), &plain(&reqs));
    for bits in [DrafterBits::Stored, DrafterBits::Eight] {
        let (drafted, stats) = run(fixture_target_with(bits), cfg(), &reqs);
        assert_eq!(drafted, undrafted, "{bits:?}");
        let d: usize = stats.iter().map(|s| s.drafted).sum();
        assert!(d > 50, "the drafter proposed blocks: {d} drafts");
    }
}

/// How a scripted drafter proposes, knowing each request's plain reply.
#[derive(Clone, Copy, PartialEq)]
enum Script {
    /// The plain reply's next 8 tokens: every draft accepted.
    Oracle,
    /// Right for the first 4 drafts of 8, then wrong.
    HalfRight,
    /// The oracle, but nothing at every third position.
    Sometimes,
    /// Every draft wrong.
    Wrong,
}

#[derive(Clone)]
struct Scripted {
    inner: FakeTarget,
    /// (prompt, plain reply) of every request.
    replies: Vec<(Vec<u32>, Vec<u32>)>,
    script: Script,
    /// A request (by prompt) whose drafter call fails as a non-finite score, alone or in a batch.
    poison: Option<Vec<u32>>,
}

impl Target for Scripted {
    delegate_target!(FakeTarget);
    fn forward(&self, call: &ForwardCall<'_, ()>, states: &mut [&mut Vec<u32>]) -> Result<Vec<SegOut>, ForwardError> {
        self.inner.forward(call, states)
    }
    fn keep(&self, s: &mut Vec<u32>, pos: usize) -> Result<(), ForwardError> {
        self.inner.keep(s, pos)
    }
    fn draft(&self, states: &[&Vec<u32>], call: &DraftCall<'_>) -> Option<Result<Drafts<()>, ForwardError>> {
        let anchors = call.anchors;
        if let Some(stream) = states.iter().position(|s| self.poison.as_ref().is_some_and(|p| s.starts_with(p))) {
            return Some(Err(ForwardError::DraftNonfinite { stream, row: 0 }));
        }
        let blocks = states
            .iter()
            .zip(anchors)
            .map(|(s, &a)| {
                let (p, reply) = self.replies.iter().find(|(p, _)| s.starts_with(p)).expect("a known request");
                let done = s.len() + 1 - p.len(); // reply tokens committed, the anchor included
                // Off the script (only under a planted fault): propose nothing.
                if reply.get(done - 1) != Some(&a) || (self.script == Script::Sometimes && s.len() % 3 == 0) {
                    return Vec::new();
                }
                let mut b: Vec<u32> = reply.iter().skip(done).take(8).copied().collect();
                let skip = match self.script {
                    Script::HalfRight => 4,
                    Script::Wrong => 0,
                    _ => b.len(),
                };
                b.iter_mut().skip(skip).for_each(|t| *t = (*t + 1) % self.inner.vocab as u32);
                b
            })
            .map(|tokens| DraftBlock { confidence: vec![0.9; tokens.len()], tokens, scores: Vec::new() })
            .collect();
        Some(Ok(Drafts::Read(blocks)))
    }
}

/// The serial reference on the fake target.
fn serial(t: &FakeTarget, r: &Request) -> Vec<u32> {
    let mut h = r.prompt.clone();
    let mut out = Vec::new();
    while out.len() < r.max_tokens {
        let tok = draw(&r.params, h.len() as u64, &t.logits(&h)).expect("finite");
        out.push(tok);
        h.push(tok);
    }
    out
}

fn scripted(script: Script, reqs: &[Request]) -> Scripted {
    let inner = FakeTarget::new();
    let replies = reqs.iter().map(|r| (r.prompt.clone(), serial(&inner, r))).collect();
    Scripted { inner, replies, script, poison: None }
}

#[test]
fn scripted_drafters_are_lossless_and_the_oracle_is_always_accepted() {
    let reqs = requests(64, 100);
    for script in [Script::Oracle, Script::HalfRight, Script::Sometimes] {
        let t = scripted(script, &reqs);
        let (drafted, stats) = run(t.clone(), cfg(), &reqs);
        let (undrafted, _) = run(t.clone(), cfg(), &plain(&reqs));
        for i in 0..reqs.len() {
            assert_eq!(drafted[i], t.replies[i].1, "request {i}: drafted vs serial");
            assert_eq!(undrafted[i], drafted[i], "request {i}: drafted vs plain");
            let s = &stats[i];
            match script {
                Script::Oracle => assert_eq!(s.accepted, s.drafted, "request {i}: every oracle draft kept"),
                Script::HalfRight => {
                    assert!(s.accepted_at.iter().skip(4).all(|&n| n == 0), "request {i}: nothing past draft 4 kept")
                }
                Script::Sometimes => {
                    assert!(s.windows > 0 && s.accepted == s.drafted, "request {i}: drafted, all kept")
                }
                Script::Wrong => unreachable!("not in this list"),
            }
        }
        if script == Script::Oracle {
            let mean: f64 = stats.iter().map(Stats::mean_accepted_length).sum::<f64>() / stats.len() as f64;
            assert!(mean > 4.0, "the oracle commits several tokens a window: {mean}");
        }
    }
}

#[test]
fn planted_verify_faults_turn_the_oracle_check_red() {
    let reqs = requests(64, 200);
    let t = scripted(Script::HalfRight, &reqs);
    for fault in [PlantedFault::BonusFromWrongRow, PlantedFault::DrawAtWrongPosition] {
        let (drafted, _) = run(t.clone(), EngineConfig { planted: Some(fault), ..cfg() }, &reqs);
        let wrong = (0..reqs.len()).filter(|&i| drafted[i] != t.replies[i].1).count();
        assert!(wrong > 0, "{fault:?} must change some reply");
    }
}

/// The fixture model with its drafter, whose `keep` leaves every conv state at the window's end.
struct NoConvRollback {
    inner: ModelTarget<CpuBackend>,
}

impl Target for NoConvRollback {
    delegate_target!(ModelTarget<CpuBackend>);
    fn forward(
        &self,
        call: &ForwardCall<'_, ()>,
        states: &mut [&mut Self::State],
    ) -> Result<Vec<SegOut>, ForwardError> {
        let call = ForwardCall { tokens: call.tokens, segs: call.segs, wants: call.wants, held: None };
        self.inner.forward(&call, states)
    }
    fn keep(&self, s: &mut Self::State, pos: usize) -> Result<(), ForwardError> {
        let at_end = s.layers.clone();
        self.inner.keep(s, pos)?;
        for (l, end) in s.layers.iter_mut().zip(at_end) {
            if matches!(end, tensorfold_model::forward::LayerState::Conv(_)) {
                *l = end;
            }
        }
        Ok(())
    }
    /// Greedy drafts, read (it holds none).
    fn draft(&self, states: &[&Self::State], call: &DraftCall<'_>) -> Option<Result<Drafts<()>, ForwardError>> {
        if call.hold {
            return None;
        }
        let greedy = DraftCall { pickers: &[], ..*call };
        Some(match self.inner.draft(states, &greedy)? {
            Ok(Drafts::Read(blocks)) => Ok(Drafts::Read(blocks)),
            Ok(Drafts::Held { .. }) => Err(ForwardError::Batch("held drafts from a read pass".into())),
            Err(e) => Err(e),
        })
    }
}

#[test]
fn a_planted_missing_conv_rollback_turns_drafted_versus_plain_red() {
    // Context copies on a repetitive prompt give accepted and rejected windows on the fixture model.
    let reqs: Vec<Request> =
        requests(512, 9).into_iter().map(|r| Request { prompt: r.prompt.repeat(3), ..r }).collect();
    let copies = EngineConfig { copy_min: 2, ..cfg() };
    let (undrafted, _) = run(fixture_target(), copies.clone(), &plain(&reqs));
    let (drafted, _) = run(fixture_target(), copies.clone(), &reqs);
    assert_eq!(drafted, undrafted, "the real rollback is lossless");
    let (faulty, _) = run(NoConvRollback { inner: fixture_target() }, copies, &reqs);
    assert_ne!(faulty, undrafted, "a conv state left at the window's end must change some reply");
}

#[test]
fn a_resumed_prompt_keeps_the_drafters_context_and_equals_a_fresh_plain_reply() {
    let first = requests(512, 300).remove(1);
    let second = Request { prompt: [first.prompt.clone(), vec![40, 41, 42]].concat(), ..first.clone() };
    let mut core = Core::new(fixture_target(), cfg(), Box::new(FixedClock(Instant::now())));
    let (mut resumed, mut resumed_drafts) = (Vec::new(), (0, 0));
    for r in [&first, &second] {
        let (tx, rx) = channel();
        core.submit(r.clone(), tx).expect("admitted");
        while core.step() {}
        let ev: Vec<Event> = rx.try_iter().collect();
        if std::ptr::eq(r, &second) {
            assert!(
                matches!(ev[0], Event::Prefilled { cached_tokens } if cached_tokens == first.prompt.len()),
                "{:?}",
                ev[0]
            );
            resumed = ev.iter().filter_map(|e| if let Event::Token(t) = e { Some(*t) } else { None }).collect();
            resumed_drafts = ev
                .iter()
                .find_map(|e| {
                    if let Event::Finished { stats, .. } = e { Some((stats.drafted, stats.accepted)) } else { None }
                })
                .expect("finished");
        }
    }
    let fresh_cfg = EngineConfig { prompt_cache_bytes: 0, ..cfg() };
    let (fresh, stats) = run(fixture_target(), fresh_cfg.clone(), std::slice::from_ref(&second));
    let (plain_fresh, _) = run(fixture_target(), fresh_cfg, &plain(&[second]));
    assert_eq!(resumed, plain_fresh[0]);
    assert_eq!(fresh[0], plain_fresh[0]);
    assert!(stats[0].drafted > 0);
    // The same drafter context: the resumed stream proposes and keeps exactly what the fresh one does.
    assert_eq!(resumed_drafts, (stats[0].drafted, stats[0].accepted));
}

#[test]
fn a_non_finite_drafter_score_turns_drafting_off_for_its_stream_only() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut l = tensorfold_model::open(&Source::Dir(root.join("lfm2-moe-f32")), CpuBackend).expect("target");
    let nan = common::nan_drafter();
    let d =
        open_drafter_with(&Source::Dir(nan.path().to_path_buf()), &l.model.cfg, &l.model.backend, DrafterBits::Stored)
            .expect("a NaN weight loads; it fails when it drafts");
    l.model.drafter = Some(d);
    let s = l.model.new_state();
    let err = l
        .model
        .draft(tensorfold_model::DraftBatch::read(&[&s], &[11], false))
        .map(|_| ())
        .expect_err("NaN scores are refused");
    assert!(matches!(err, ForwardError::DraftNonfinite { stream: 0, row: 0 }), "{err:?}");
    // In the lane core: the drafting stream records the error by name and decodes on without drafts, to the same
    // tokens as its `draft: false` twin; a `draft: false` stream beside it finishes.
    let target = ModelTarget { model: std::sync::Arc::new(l.model), eos: l.eos_ids };
    let reqs = requests(512, 400);
    let mixed =
        [reqs[0].clone(), Request { draft: false, ..reqs[1].clone() }, Request { draft: false, ..reqs[0].clone() }];
    let mut core = Core::new(target, cfg(), Box::new(FixedClock(Instant::now())));
    let rx: Vec<_> = mixed
        .iter()
        .map(|r| {
            let (tx, rx) = channel();
            core.submit(r.clone(), tx).expect("admitted");
            rx
        })
        .collect();
    while core.step() {}
    let fin = |rx: &std::sync::mpsc::Receiver<Event>| {
        let ev: Vec<Event> = rx.try_iter().collect();
        let toks: Vec<u32> = ev.iter().filter_map(|e| if let Event::Token(t) = e { Some(*t) } else { None }).collect();
        ev.into_iter()
            .find_map(|e| match e {
                Event::Finished { reason, error, stats, .. } => Some((reason, error, stats, toks.clone())),
                _ => None,
            })
            .expect("finished")
    };
    let (r0, e0, s0, t0) = fin(&rx[0]);
    assert_eq!((r0, e0), (tensorfold_engine::FinishReason::Length, None));
    assert!(s0.draft_error.unwrap_or_default().contains("DraftNonfinite"));
    assert_eq!(s0.drafted, 0, "no draft is verified after the drafter failed");
    let (r1, _, s1, _) = fin(&rx[1]);
    assert_eq!((r1, s1.draft_error), (tensorfold_engine::FinishReason::Length, None));
    let (_, _, _, plain) = fin(&rx[2]);
    assert_eq!(t0, plain, "the failed drafter changed no token");
}

#[test]
fn a_stream_paused_by_its_guard_drafts_again_after_the_pause() {
    let reqs = requests(64, 500);
    let t = scripted(Script::Wrong, &reqs);
    let (drafted, stats) = run(t.clone(), cfg(), &reqs);
    for (i, s) in stats.iter().enumerate() {
        assert_eq!(drafted[i], t.replies[i].1);
        // Two empty windows, a pause of 4 rounds, two more, a pause of 8, ...: more than two windows in 20+.
        assert!(s.windows > 2 && s.accepted == 0, "request {i}: {} windows", s.windows);
        assert!(s.windows < drafted[i].len(), "request {i}: the pauses skip rounds");
    }
}

#[test]
fn scheduled_and_fixed_verify_stay_within_max_draft_and_stay_lossless() {
    let reqs = requests(64, 600);
    let t = scripted(Script::Oracle, &reqs);
    for verify in [VerifyMode::Scheduled, VerifyMode::Fixed] {
        let c = EngineConfig { verify, max_draft: 2, ..cfg() };
        let (drafted, stats) = run(t.clone(), c, &reqs);
        for (i, s) in stats.iter().enumerate() {
            assert_eq!(drafted[i], t.replies[i].1, "{verify:?} request {i}");
            assert!(s.windows > 0 && s.accepted_at.len() <= 2, "{verify:?} request {i}: {:?}", s.accepted_at);
        }
    }
}

#[test]
fn a_drafter_failure_in_a_batched_block_pass_costs_no_stream_a_token() {
    let reqs = requests(64, 700);
    let t = Scripted { poison: Some(reqs[2].prompt.clone()), ..scripted(Script::Oracle, &reqs) };
    let mut core = Core::new(t.clone(), cfg(), Box::new(FixedClock(Instant::now())));
    let rx: Vec<_> = reqs
        .iter()
        .map(|r| {
            let (tx, rx) = channel();
            core.submit(r.clone(), tx).expect("admitted");
            rx
        })
        .collect();
    while core.step() {}
    for (i, rx) in rx.iter().enumerate() {
        let ev: Vec<Event> = rx.try_iter().collect();
        let toks: Vec<u32> = ev.iter().filter_map(|e| if let Event::Token(t) = e { Some(*t) } else { None }).collect();
        let (reason, error, stats) = ev
            .iter()
            .find_map(|e| match e {
                Event::Finished { reason, error, stats, .. } => Some((*reason, error.clone(), stats.clone())),
                _ => None,
            })
            .expect("finished");
        assert_eq!((reason, error), (tensorfold_engine::FinishReason::Length, None), "request {i}");
        assert_eq!(stats.draft_error.is_some(), i == 2, "request {i}: {:?}", stats.draft_error);
        assert!(i != 2 || stats.draft_error.unwrap_or_default().contains("DraftNonfinite"));
        // Request 2 decodes on without drafts; every reply (its own too) is the plain one.
        assert_eq!(toks, t.replies[i].1, "request {i} is untouched by request 2's drafter failure");
    }
}

#[test]
fn full_verify_windows_roll_back_within_the_conv_windows_admission_reserved() {
    // Fixed depth: windows carry `max_draft` drafts, `max_draft + 1` rows, the most a lane's conv windows were
    // reserved for (`Target::reserve`'s `verify_rows`); a rejected draft in one rolls the conv states back inside them.
    let reqs = requests(512, 11);
    let c = EngineConfig { verify: VerifyMode::Fixed, max_draft: 3, ..cfg() };
    let (undrafted, _) = run(fixture_target(), c.clone(), &plain(&reqs));
    let (drafted, stats) = run(fixture_target(), c, &reqs);
    assert_eq!(drafted, undrafted);
    let (d, a, w) = stats.iter().fold((0, 0, 0), |(d, a, w), s| (d + s.drafted, a + s.accepted, w + s.windows));
    assert!(d > a && a > 0, "drafts were both accepted and rejected: {a} of {d}");
    assert!(stats.iter().all(|s| s.accepted_at.len() <= 3) && d > 2 * w, "windows were full: {d} drafts in {w}");
}
