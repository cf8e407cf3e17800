//! Held drafts in the lane core, on the fixture model with the DSpark drafter: holding the picks on the device until
//! after the verify gives the read-first path's tokens, and while no block fails its drafted and accepted counts too
//! (a failing block's placeholders take rows of the round's budget that the read-first path gives to other streams);
//! a non-finite drafter is refused by the same named error, in a shared round or not, with or without room for drafts;
//! a planted late write turns it red.

mod common;

use tensorfold_engine::core::{EngineConfig, PlantedFault};
use tensorfold_engine::keyed::SamplingParams;
use tensorfold_engine::schedule::VerifyMode;
use tensorfold_engine::{ModelTarget, Request, Stats};
use tensorfold_kernels::CpuBackend;
use tensorfold_model::Source;
use tensorfold_model::drafter::open_drafter;

fn target(drafter: &std::path::Path) -> ModelTarget<CpuBackend> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut l = tensorfold_model::open(&Source::Dir(root.join("lfm2-moe-f32")), CpuBackend).expect("target");
    let d = open_drafter(&Source::Dir(drafter.to_path_buf()), &l.model.cfg, &l.model.backend).expect("drafter");
    l.model.drafter = Some(d);
    ModelTarget { model: std::sync::Arc::new(l.model), eos: l.eos_ids }
}

fn tiny() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/dspark-tiny")
}

/// Five requests, greedy and sampled, of different lengths; 3 lanes, so streams join and leave mid-flight.
fn requests() -> Vec<Request> {
    (0..5u64)
        .map(|i| {
            let prompt: Vec<u32> = (0..4 + i as u32).map(|k| 10 + (k * 11 + i as u32 * 29) % 500).collect();
            let temperature = if i % 2 == 0 { 0.0 } else { 0.9 };
            Request {
                params: SamplingParams { temperature, seed: 90 + i, ..SamplingParams::greedy() },
                ignore_eos: true,
                ..Request::greedy(prompt, 18 + 4 * i as usize)
            }
        })
        .collect()
}

fn cfg(held: bool) -> EngineConfig {
    EngineConfig {
        parallel: 3,
        copy_min: 0,
        max_draft: 6,
        round_rows: 24,
        prefill_chunk: 4,
        round_guard: false,
        held_drafts: held,
        ..EngineConfig::default()
    }
}

/// Tokens and stats of every request, and the core's held windows.
fn run(t: ModelTarget<CpuBackend>, cfg: EngineConfig, reqs: &[Request]) -> (Vec<Vec<u32>>, Vec<Stats>, u64) {
    let (toks, stats, m) = common::run_metrics(t, cfg, reqs);
    (toks, stats, m.held_windows)
}

fn counts(stats: &[Stats]) -> Vec<(usize, usize, usize)> {
    stats.iter().map(|s| (s.drafted, s.accepted, s.windows)).collect()
}

#[test]
fn held_drafts_give_the_read_first_replies_and_acceptance() {
    let reqs = requests();
    let plain: Vec<Request> = reqs.iter().map(|r| Request { draft: false, ..r.clone() }).collect();
    let (undrafted, _, _) = run(target(&tiny()), cfg(true), &plain);
    let (read, rs, rh) = run(target(&tiny()), cfg(false), &reqs);
    let (held, hs, hh) = run(target(&tiny()), cfg(true), &reqs);
    assert_eq!(read, undrafted, "read-first drafts are lossless");
    assert_eq!(held, undrafted, "held drafts are lossless");
    assert_eq!(counts(&hs), counts(&rs), "the same drafts verified and accepted");
    let windows: usize = hs.iter().map(|s| s.windows).sum();
    assert!(windows > 20 && hs.iter().map(|s| s.accepted).sum::<usize>() > 0, "{:?}", counts(&hs));
    assert_eq!((rh, hh), (0, windows as u64), "every window held its drafts, and none when off");
    // Scheduled verify needs the confidences first: it reads its blocks even with held drafts on.
    let sched = EngineConfig { verify: VerifyMode::Scheduled, ..cfg(true) };
    let (st, _, sh) = run(target(&tiny()), sched, &reqs);
    assert_eq!((st, sh), (undrafted, 0));
}

#[test]
fn held_picks_written_one_row_late_turn_the_comparison_red() {
    let reqs = requests();
    let (read, rs, _) = run(target(&tiny()), cfg(false), &reqs);
    let planted = EngineConfig { planted: Some(PlantedFault::HeldPicksShifted), ..cfg(true) };
    let (held, hs, _) = run(target(&tiny()), planted, &reqs);
    assert!(held != read || counts(&hs) != counts(&rs), "the planted late write went unseen");
}

#[test]
fn a_non_finite_held_block_is_refused_as_the_read_first_path_refuses_it() {
    let nan = common::nan_drafter();
    let reqs = requests();
    let plain: Vec<Request> = reqs.iter().map(|r| Request { draft: false, ..r.clone() }).collect();
    let (undrafted, _, _) = run(target(&tiny()), cfg(true), &plain);
    let (read, rs, _) = run(target(nan.path()), cfg(false), &reqs);
    let (held, hs, hh) = run(target(nan.path()), cfg(true), &reqs);
    assert_eq!((&held, &read), (&undrafted, &undrafted), "a failed drafter changes no token");
    assert_eq!(hh, 0, "no window kept a failed block's drafts");
    for (i, (h, r)) in hs.iter().zip(&rs).enumerate() {
        assert_eq!((h.drafted, h.windows), (0, 0), "request {i}: nothing verified");
        assert!(h.draft_error.as_deref().is_some_and(|e| e.contains("DraftNonfinite")), "request {i}");
        assert_eq!(h.draft_error, r.draft_error, "request {i}: the same named refusal");
    }
}

#[test]
fn held_drafts_match_read_first_when_each_stream_runs_its_own_forward() {
    let reqs = requests();
    let solo = |held| EngineConfig { shared_rounds: false, ..cfg(held) };
    let (read, rs, _) = run(target(&tiny()), solo(false), &reqs);
    let (held, hs, hh) = run(target(&tiny()), solo(true), &reqs);
    assert_eq!(held, read);
    assert_eq!(counts(&hs), counts(&rs), "the same drafts verified and accepted");
    assert_eq!(hh, hs.iter().map(|s| s.windows as u64).sum::<u64>(), "every window held its drafts");
}

#[test]
fn failing_and_healthy_blocks_in_one_batch_are_refused_as_the_read_first_path_refuses_them() {
    // Streams whose previous pick is a multiple of 29 fail their block; the rest draft on. A request with no room for
    // drafts (2 tokens) is in the mix. Under a tight round budget (10, 6 rows) only the tokens must agree: a failing
    // block's placeholders take rows the read-first path gives to other streams' drafts, so streams draft at other
    // anchors and may meet a failing pick elsewhere.
    let bad = common::nan_drafter_rows("markov_head.markov_w1.weight", 29);
    let mut reqs = requests();
    reqs.push(Request { max_tokens: 2, ..reqs[0].clone() });
    let plain: Vec<Request> = reqs.iter().map(|r| Request { draft: false, ..r.clone() }).collect();
    let (undrafted, _, _) = run(target(&tiny()), cfg(true), &plain);
    for rows in [24, 10, 6] {
        let c = |held| EngineConfig { round_rows: rows, ..cfg(held) };
        let (read, rs, _) = run(target(bad.path()), c(false), &reqs);
        let (held, hs, _) = run(target(bad.path()), c(true), &reqs);
        assert_eq!((&held, &read), (&undrafted, &undrafted), "round_rows {rows}: no token changed");
        if rows < 24 {
            continue;
        }
        let errs = |s: &[Stats]| s.iter().map(|s| s.draft_error.clone()).collect::<Vec<_>>();
        assert_eq!(errs(&hs), errs(&rs), "the same streams refused, by the same error");
        assert_eq!(counts(&hs), counts(&rs), "the same drafts verified and accepted");
        let failed = hs.iter().filter(|s| s.draft_error.is_some()).count();
        assert!(failed > 0 && failed < hs.len(), "{failed} of {} streams failed", hs.len());
    }
    // The room-0 request alone, its drafter failing at once: refused although its window held no draft.
    let nan = common::nan_drafter();
    let one = [Request { max_tokens: 2, ..reqs[0].clone() }];
    let (_, rs, _) = run(target(nan.path()), cfg(false), &one);
    let (_, hs, _) = run(target(nan.path()), cfg(true), &one);
    assert!(rs[0].draft_error.is_some());
    assert_eq!(hs[0].draft_error, rs[0].draft_error);
}
