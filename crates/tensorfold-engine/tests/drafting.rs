//! Verify windows with context copies are lossless: a drafted reply equals its plain (`draft: false`)
//! reply and the independent serial reference, token for token, greedy and sampled, on the fake target
//! and on the real fixture model (where rejected drafts roll back KV rows and conv states).

mod common;

use std::sync::mpsc::channel;
use std::time::Instant;
use tensorfold_engine::core::{Core, EngineConfig, FixedClock};
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::keyed::{SamplingParams, draw};
use tensorfold_engine::{Event, ModelTarget, Request, Stats, Target};
use tensorfold_kernels::CpuBackend;
use tensorfold_model::Source;

fn run<T: Target>(target: T, cfg: EngineConfig, reqs: &[Request]) -> (Vec<Vec<u32>>, Vec<Stats>) {
    common::run_all(target, cfg, reqs)
}

/// The serial reference on the fake target, without the core.
fn serial(t: &FakeTarget, r: &Request) -> Vec<u32> {
    let mut h = r.prompt.clone();
    let mut out = Vec::new();
    while out.len() < r.max_tokens {
        let tok = draw(&r.params, h.len() as u64, &t.logits(&h)).expect("finite");
        out.push(tok);
        h.push(tok);
        if !r.ignore_eos && t.eos.contains(&tok) {
            break;
        }
    }
    out
}

fn requests(seed0: u64) -> Vec<Request> {
    (0..6)
        .map(|i| {
            let motif: Vec<u32> = (0..5).map(|k| 1 + ((i * 7 + k * 3) % 60) as u32).collect();
            let mut prompt = motif.repeat(3);
            prompt.push(9 + i as u32);
            let temperature = if i % 2 == 0 { 0.0 } else { 0.7 };
            Request {
                params: SamplingParams { temperature, top_k: 20, seed: seed0 + i, ..SamplingParams::greedy() },
                ignore_eos: true,
                ..Request::greedy(prompt, 40 + 3 * i as usize)
            }
        })
        .collect()
}

fn cfg(copy_min: usize) -> EngineConfig {
    // The guard is off: with a fixed clock it cannot measure what drafting buys (its own test scripts time).
    EngineConfig {
        copy_min,
        max_draft: 6,
        round_rows: 40,
        prefill_chunk: 8,
        round_guard: false,
        ..EngineConfig::default()
    }
}

#[test]
fn drafted_replies_equal_plain_replies_and_the_serial_reference_on_the_fake_target() {
    let t = FakeTarget { copy_bias: 6.0, ..FakeTarget::new() };
    let reqs = requests(10);
    let plain: Vec<Request> = reqs.iter().map(|r| Request { draft: false, ..r.clone() }).collect();
    let (drafted, stats) = run(t.clone(), cfg(2), &reqs);
    let (undrafted, plain_stats) = run(t.clone(), cfg(2), &plain);
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(drafted[i], serial(&t, r), "request {i} drafted vs serial");
        assert_eq!(undrafted[i], drafted[i], "request {i} drafted vs plain");
        assert_eq!(plain_stats[i].drafted, 0);
    }
    let (d, a): (usize, usize) = stats.iter().fold((0, 0), |(d, a), s| (d + s.drafted, a + s.accepted));
    assert!(a > 20, "copies were accepted: {a} of {d}");
    assert!(d > a, "some drafts were rejected (rollback exercised): {a} of {d}");
}

#[test]
fn drafted_replies_equal_plain_replies_on_the_fixture_model_through_rejections_and_acceptances() {
    // The float fixture and an MLX 4-bit conversion of it (codes through the same rollback paths).
    for name in ["lfm2-moe-f32", "mlx/lfm2-moe-f32-q4g32"] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name);
        let load = || {
            let l = tensorfold_model::open(&Source::Dir(dir.clone()), CpuBackend).expect("fixture opens");
            ModelTarget { model: std::sync::Arc::new(l.model), eos: l.eos_ids }
        };
        let reqs: Vec<Request> = requests(40)
            .into_iter()
            .map(|r| Request { prompt: r.prompt.iter().map(|t| t + 100).collect(), ..r })
            .collect();
        let plain: Vec<Request> = reqs.iter().map(|r| Request { draft: false, ..r.clone() }).collect();
        let (drafted, stats) = run(load(), cfg(2), &reqs);
        let (undrafted, _) = run(load(), cfg(2), &plain);
        assert_eq!(drafted, undrafted, "{name}");
        let (d, a): (usize, usize) = stats.iter().fold((0, 0), |(d, a), s| (d + s.drafted, a + s.accepted));
        assert!(a > 0 && d > a, "{name}: both accepted and rejected drafts: {a} of {d}");
    }
}

#[test]
fn a_rejected_window_leaves_the_model_state_equal_to_feeding_only_the_kept_rows() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-dense-bf16");
    let l = tensorfold_model::open(&Source::Dir(dir), CpuBackend).expect("fixture opens");
    let t = ModelTarget { model: std::sync::Arc::new(l.model), eos: l.eos_ids };
    let seg = |start, rows| tensorfold_kernels::Segment { first_row: 0, rows, start_pos: start, cache: 0 };
    let mut a = t.new_state();
    let mut b = t.new_state();
    t.logits(&[1, 50, 60], &[seg(0, 3)], &mut [&mut a], &[false]).expect("prefill");
    t.logits(&[1, 50, 60], &[seg(0, 3)], &mut [&mut b], &[false]).expect("prefill");
    t.logits(&[70, 71, 72, 73, 74], &[seg(3, 5)], &mut [&mut a], &[true]).expect("window");
    t.keep(&mut a, 5).expect("keep two rows");
    t.logits(&[70, 71], &[seg(3, 2)], &mut [&mut b], &[false]).expect("kept rows");
    let next_a = t.logits(&[9], &[seg(5, 1)], &mut [&mut a], &[false]).expect("after rollback");
    let next_b = t.logits(&[9], &[seg(5, 1)], &mut [&mut b], &[false]).expect("plain");
    assert_eq!(
        next_a[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        next_b[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert!(t.keep(&mut a, 2).is_err(), "cannot roll back before the last call");
}

#[test]
fn the_guard_stops_drafting_where_copies_keep_failing() {
    let t = FakeTarget::new();
    let reqs = requests(70);
    let (_, stats) = run(t, cfg(1), &reqs);
    let generated: usize = reqs.iter().map(|r| r.max_tokens).sum();
    let drafted: usize = stats.iter().map(|s| s.drafted).sum();
    assert!(drafted < generated, "paused drafting: {drafted} drafts for {generated} tokens");
}

#[test]
fn a_resumed_drafting_stream_equals_a_fresh_plain_one_and_stays_within_its_reserved_memory() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-moe-f32");
    let load = || {
        let l = tensorfold_model::open(&Source::Dir(dir.clone()), CpuBackend).expect("fixture opens");
        ModelTarget { model: std::sync::Arc::new(l.model), eos: l.eos_ids }
    };
    let first = requests(90).remove(0);
    let second = Request { prompt: [first.prompt.clone(), vec![30, 31, 32]].concat(), ..first.clone() };
    let mut core = Core::new(load(), cfg(2), Box::new(FixedClock(Instant::now())));
    for r in [&first, &second] {
        let (tx, rx) = channel();
        core.submit(r.clone(), tx).expect("admitted");
        while core.step() {
            let m = core.metrics();
            assert!(m.state_bytes <= m.reserved_bytes, "{} bytes held, {} reserved", m.state_bytes, m.reserved_bytes);
        }
        let ev: Vec<Event> = rx.try_iter().collect();
        if std::ptr::eq(r, &second) {
            assert!(matches!(ev[0], Event::Prefilled { cached_tokens } if cached_tokens == first.prompt.len()));
            let resumed: Vec<u32> =
                ev.iter().filter_map(|e| if let Event::Token(t) = e { Some(*t) } else { None }).collect();
            let plain = Request { draft: false, ..second.clone() };
            let (fresh, _) = run(load(), EngineConfig { prompt_cache_bytes: 0, ..cfg(2) }, &[plain]);
            assert_eq!(resumed, fresh[0]);
        }
    }
}

#[test]
fn zero_max_tokens_is_refused_by_name() {
    let mut core = Core::new(FakeTarget::new(), cfg(2), Box::new(FixedClock(Instant::now())));
    let r = Request::greedy(vec![1, 2], 0);
    assert_eq!(core.submit(r, channel().0), Err(tensorfold_engine::SubmitError::ZeroMaxTokens));
}
