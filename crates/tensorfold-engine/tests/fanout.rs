//! Groups (`n` streams of one prompt, `Core::submit_group`): the prompt is prefilled once, every member's reply
//! equals the same request run alone, token for token (greedy, sampled, with logit controls, drafted), a cancelled
//! leader hands its group on, and groups that can never be admitted are refused by name with nothing queued.

mod common;

use common::Recording;
use std::sync::mpsc::{Receiver, channel};
use tensorfold_engine::core::{Core, EngineConfig, FixedClock};
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::keyed::SamplingParams;
use tensorfold_engine::{Event, FinishReason, ModelTarget, Penalties, Request, Sink, SubmitError, Target};
use tensorfold_kernels::CpuBackend;
use tensorfold_model::Source;

fn cfg() -> EngineConfig {
    EngineConfig {
        parallel: 4,
        copy_min: 2,
        max_draft: 4,
        round_rows: 24,
        prefill_chunk: 8,
        round_guard: false,
        ..EngineConfig::default()
    }
}

/// `n` members of one prompt: seeds `seed + i` (as vLLM derives them), every third with a repetition penalty.
fn group(prompt: Vec<u32>, n: usize, temperature: f32, seed: u64) -> Vec<Request> {
    (0..n)
        .map(|i| Request {
            params: SamplingParams {
                temperature,
                top_k: 30,
                seed: seed.wrapping_add(i as u64),
                ..SamplingParams::greedy()
            },
            ignore_eos: true,
            penalties: if i % 3 == 2 {
                Penalties { repetition: 1.2, ..Penalties::default() }
            } else {
                Penalties::default()
            },
            ..Request::greedy(prompt.clone(), 20 + 5 * i)
        })
        .collect()
}

fn sinks(n: usize) -> (Vec<Sink>, Vec<Receiver<Event>>) {
    (0..n).map(|_| channel()).map(|(tx, rx)| (Sink::from(tx), rx)).unzip()
}

/// Each member's tokens, cached prompt tokens and finish reason.
fn collect(rx: Vec<Receiver<Event>>) -> Vec<(Vec<u32>, usize, FinishReason)> {
    rx.into_iter()
        .map(|rx| {
            let ev: Vec<Event> = rx.try_iter().collect();
            let toks = ev.iter().filter_map(|e| if let Event::Token(t) = e { Some(*t) } else { None }).collect();
            let cached = ev
                .iter()
                .find_map(|e| if let Event::Prefilled { cached_tokens } = e { Some(*cached_tokens) } else { None });
            let reason =
                ev.iter().find_map(|e| if let Event::Finished { reason, .. } = e { Some(*reason) } else { None });
            (toks, cached.unwrap_or(usize::MAX), reason.expect("finished"))
        })
        .collect()
}

fn run_group<T: Target>(target: T, reqs: Vec<Request>) -> Vec<(Vec<u32>, usize, FinishReason)> {
    let mut core = Core::new(target, cfg(), Box::new(FixedClock(std::time::Instant::now())));
    let (s, rx) = sinks(reqs.len());
    core.submit_group(reqs, s).expect("admitted");
    while core.step() {}
    collect(rx)
}

#[test]
fn a_group_prefills_once_and_each_member_equals_its_request_alone_on_the_fake_target() {
    let t = FakeTarget { copy_bias: 4.0, ..FakeTarget::new() };
    let prompt = common::ids(3, 37, 1, 60);
    for temperature in [0.0, 0.9] {
        let reqs = group(prompt.clone(), 4, temperature, 500);
        let rec = Recording::new(t.clone());
        let got = run_group(rec.clone(), reqs.clone());
        for (i, r) in reqs.iter().enumerate() {
            let (alone, _) = common::run_all(t.clone(), cfg(), std::slice::from_ref(r));
            assert_eq!(got[i].0, alone[0], "member {i} at temperature {temperature} vs alone");
            assert_eq!(got[i].1, if i == 0 { 0 } else { prompt.len() }, "member {i}'s cached prompt tokens");
        }
        // Prompt rows ran once: every row at a position inside the prompt belongs to one stream's segments.
        let prompt_rows: usize =
            rec.calls.lock().unwrap().iter().flatten().filter(|(p, _)| *p < prompt.len()).map(|(_, r)| r).sum();
        assert_eq!(prompt_rows, prompt.len(), "one prefill for the group");
        if temperature > 0.0 {
            assert!(got.windows(2).any(|w| w[0].0[..20] != w[1].0[..20]), "seeds seed + i give different replies");
        }
    }
}

#[test]
fn a_group_on_the_fixture_model_with_block_drafts_equals_each_request_alone() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut l = tensorfold_model::open(&Source::Dir(root.join("lfm2-moe-f32")), CpuBackend).expect("target");
    let d =
        tensorfold_model::drafter::open_drafter(&Source::Dir(root.join("dspark-tiny")), &l.model.cfg, &l.model.backend)
            .expect("drafter");
    l.model.drafter = Some(d);
    let t = ModelTarget { model: std::sync::Arc::new(l.model), eos: l.eos_ids };
    let reqs = group(common::ids(9, 21, 100, 400), 3, 0.8, 77);
    let got = run_group(t.clone(), reqs.clone());
    for (i, r) in reqs.iter().enumerate() {
        let (alone, _) = common::run_all(t.clone(), EngineConfig { copy_min: 0, ..cfg() }, std::slice::from_ref(r));
        assert_eq!(got[i].0, alone[0], "member {i} vs alone");
    }
}

#[test]
fn a_cancelled_leader_hands_its_group_on_waiting_or_prefilling() {
    let t = FakeTarget::new();
    let prompt = common::ids(5, 30, 1, 60);
    let reqs = group(prompt.clone(), 3, 0.7, 9);
    let alone: Vec<Vec<u32>> =
        reqs.iter().map(|r| common::run_all(t.clone(), cfg(), std::slice::from_ref(r)).0.remove(0)).collect();
    // Cancelled while the group waits (all lanes busy), then while the leader prefills (one chunk in).
    for rounds_before_cancel in [0, 1] {
        let mut core = Core::new(t.clone(), cfg(), Box::new(FixedClock(std::time::Instant::now())));
        let blockers: Vec<_> = (0..4).map(|_| common::submit(&mut core, Request::greedy(vec![1, 2], 1))).collect();
        if rounds_before_cancel > 0 {
            while core.step() {}
        }
        let (s, rx) = sinks(3);
        let ids = core.submit_group(reqs.clone(), s).expect("queued");
        for _ in 0..rounds_before_cancel {
            core.step();
        }
        assert!(core.cancel(ids[0]));
        while core.step() {}
        let got = collect(rx);
        assert_eq!(got[0].2, FinishReason::Cancelled);
        for i in 1..3 {
            assert_eq!(got[i].0, alone[i], "member {i} after the leader's cancel at round {rounds_before_cancel}");
        }
        drop(blockers);
    }
}

#[test]
fn groups_that_can_never_run_are_refused_by_name_and_queue_nothing() {
    let mut core = Core::new(FakeTarget::new(), cfg(), Box::new(FixedClock(std::time::Instant::now())));
    let reqs = group(vec![1, 2, 3], 5, 0.0, 1);
    assert_eq!(core.submit_group(reqs, sinks(5).0).unwrap_err(), SubmitError::GroupTooLarge { n: 5, lanes: 4 });
    let mut mixed = group(vec![1, 2, 3], 2, 0.0, 1);
    mixed[1].prompt = vec![4, 5];
    assert_eq!(core.submit_group(mixed, sinks(2).0).unwrap_err(), SubmitError::GroupPrompts);
    let mut bad = group(vec![1, 2, 3], 2, 0.0, 1);
    bad[1].max_tokens = 0;
    assert_eq!(core.submit_group(bad, sinks(2).0).unwrap_err(), SubmitError::ZeroMaxTokens);
    assert!(core.is_idle());
}
