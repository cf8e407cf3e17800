//! The threaded `Engine` on the `lfm2-moe-f32` fixture: 16 greedy and sampled requests submitted at once from
//! several threads, each reply equal to `single::generate` (the solo loop) with the same parameters token for token, with exact
//! stats (prompt, generated and cached tokens) and engine metrics; and cancel through a handle.

mod common;

use common::{Recording, ids, params_mix};
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};
use tensorfold_engine::core::EngineConfig;
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::prompt_cache::CacheCounters;
use tensorfold_engine::single::{GenerateOptions, generate};
use tensorfold_engine::{Engine, EngineHandle, Event, FinishReason, Metrics, ModelTarget, Request, Stats};
use tensorfold_kernels::CpuBackend;
use tensorfold_model::{Source, open};

fn fixture() -> ModelTarget<CpuBackend> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-moe-f32");
    let loaded = open(&Source::Dir(dir), CpuBackend).expect("the fixture opens");
    ModelTarget { model: std::sync::Arc::new(loaded.model), eos: loaded.eos_ids }
}

/// A reply as the engine delivered it.
#[derive(Debug)]
struct Reply {
    tokens: Vec<u32>,
    cached: usize,
    reason: FinishReason,
    stats: Stats,
}

/// Reads a request's events to the end, checking their order.
fn collect(rx: Receiver<Event>) -> Reply {
    let mut tokens = Vec::new();
    let mut cached = None;
    for e in rx.iter() {
        match e {
            Event::Prefilled { cached_tokens } => {
                assert!(cached.replace(cached_tokens).is_none(), "Prefilled twice");
            }
            Event::Logprobs(_) => {}
            Event::Token(t) => {
                assert!(cached.is_some(), "a token before Prefilled");
                tokens.push(t);
            }
            Event::Finished { reason, error, stats, .. } => {
                assert_eq!(error, None);
                return Reply { tokens, cached: cached.expect("prefilled"), reason, stats };
            }
        }
    }
    panic!("the events ended without Finished");
}

/// Metrics once the engine has gone idle (they are published after each round).
fn settled(h: &EngineHandle, generated: u64) -> Metrics {
    let t = Instant::now();
    loop {
        let m = h.metrics();
        if (m.running, m.waiting, m.generated_tokens) == (0, 0, generated) || t.elapsed() > Duration::from_secs(30) {
            return m;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn sixteen_requests_from_four_threads_each_equal_their_solo_run_with_exact_stats() {
    let solo_model = fixture();
    let eos = solo_model.eos.clone();
    let cfg = EngineConfig { parallel: 16, round_rows: 48, prefill_chunk: 8, ..EngineConfig::default() };
    let engine = Engine::start(fixture(), cfg);
    let h = engine.handle();

    // A first turn of 32 tokens, then 16 requests: the even ones extend it (and must resume from it), the
    // odd ones are fresh prompts whose first tokens differ from everything else.
    let mut base = vec![1];
    base.extend(ids(900, 31, 10, 511));
    let first = collect(h.submit(Request { ignore_eos: true, ..Request::greedy(base.clone(), 6) }).expect("ok").1);
    assert_eq!((first.tokens.len(), first.cached, first.reason), (6, 0, FinishReason::Length));
    let reqs: Vec<Request> = (0..16)
        .map(|i| {
            let prompt = if i % 2 == 0 {
                [base.clone(), vec![200 + i as u32], ids(i as u64, 3 + i, 10, 511)].concat()
            } else {
                [vec![300 + i as u32], ids(i as u64, 4 + 4 * i, 10, 511)].concat()
            };
            Request {
                params: params_mix(i, 7_000 + i as u64),
                ignore_eos: i % 3 != 0,
                stop_ids: if i == 5 { vec![17, 99] } else { Vec::new() },
                ..Request::greedy(prompt, 8 + 2 * i)
            }
        })
        .collect();

    let replies: Vec<Reply> = std::thread::scope(|s| {
        let threads: Vec<_> = reqs
            .chunks(4)
            .map(|part| {
                let h = h.clone();
                s.spawn(move || {
                    let rxs: Vec<_> = part.iter().map(|r| h.submit(r.clone()).expect("admitted").1).collect();
                    rxs.into_iter().map(collect).collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().flat_map(|t| t.join().expect("the thread finished")).collect()
    });

    let mut stops = 0;
    for (i, (r, got)) in reqs.iter().zip(&replies).enumerate() {
        let mut stop_ids = r.stop_ids.clone();
        if !r.ignore_eos {
            stop_ids.extend(&eos);
        }
        let cfg = GenerateOptions {
            penalties: Default::default(),
            grammar: None,
            chunk: 8,
            max_tokens: r.max_tokens,
            context: 128_000,
            stop_ids,
            params: r.params,
            drafts: None,
        };
        let (want, solo) = generate(&solo_model.model, &r.prompt, &cfg, |_| true).expect("solo runs");
        assert_eq!(got.tokens, want, "request {i} ({:?}) differs from its solo run", r.params);
        let reason = solo.finish;
        assert_eq!(got.reason, reason, "request {i}");
        stops += usize::from(reason == FinishReason::Stop);
        let cached = if i % 2 == 0 { 32 } else { 0 };
        assert_eq!(got.cached, cached, "request {i}");
        assert_eq!(
            (got.stats.prompt_tokens, got.stats.cached_tokens, got.stats.generated_tokens),
            (r.prompt.len(), cached, want.len()),
            "request {i}"
        );
    }
    assert!(replies.iter().any(|r| r.tokens.iter().any(|&t| t != r.tokens[0])), "every reply is one token repeated");

    let generated: usize = 6 + replies.iter().map(|r| r.tokens.len()).sum::<usize>();
    let m = settled(&h, generated as u64);
    assert_eq!((m.running, m.waiting, m.reserved_bytes, m.state_bytes), (0, 0, 0, 0));
    assert_eq!(m.generated_tokens, generated as u64);
    assert_eq!(m.prompt_tokens, (32 + reqs.iter().map(|r| r.prompt.len()).sum::<usize>()) as u64);
    assert_eq!(m.cache, CacheCounters { queries: 17, hits: 8, reused_tokens: 8 * 32 });
    eprintln!("{stops} of 16 replies stopped on a stop id; {} rounds", m.rounds);
}

#[test]
fn a_cancel_through_a_handle_ends_a_running_stream_and_leaves_another_untouched() {
    // A forward of 1 ms at least: the 4,000-token stream cannot finish before the cancel arrives.
    let slow = Recording { delay: Duration::from_millis(1), ..Recording::new(FakeTarget::new()) };
    let engine = Engine::start(slow, EngineConfig { prefill_chunk: 16, ..EngineConfig::default() });
    let h = engine.handle();
    let long = Request { ignore_eos: true, ..Request::greedy(ids(1, 20, 0, 64), 4000) };
    let short = Request { ignore_eos: true, ..Request::greedy(ids(2, 20, 0, 64), 50) };
    let (id, rx) = h.submit(long.clone()).expect("admitted");
    let (_, other) = h.submit(short.clone()).expect("admitted");
    let mut got = Vec::new();
    let (reason, stats) = loop {
        match rx.recv().expect("an event") {
            Event::Token(t) => {
                got.push(t);
                if got.len() == 5 {
                    h.cancel(id);
                }
            }
            Event::Finished { reason, stats, .. } => break (reason, stats),
            _ => {}
        }
    };
    assert_eq!(reason, FinishReason::Cancelled);
    assert!((5..4000).contains(&got.len()), "{} tokens", got.len());
    assert_eq!(stats.generated_tokens, got.len());
    let want = common::reference(&FakeTarget::new(), &long).0;
    assert_eq!(got, want[..got.len()]);
    let o = collect(other);
    assert_eq!((o.tokens, o.reason), (common::reference(&FakeTarget::new(), &short).0, FinishReason::Length));
}

#[test]
fn submit_all_queues_every_request_before_the_next_round_and_refuses_each_on_its_own() {
    let target = FakeTarget::new();
    let engine = Engine::start(target.clone(), EngineConfig { parallel: 8, ..EngineConfig::default() });
    let h = engine.handle();
    let mut reqs: Vec<Request> =
        (0..8).map(|i| Request { ignore_eos: true, ..Request::greedy(vec![1, 2 + i, 3, 4], 5) }).collect();
    reqs.insert(3, Request::greedy(Vec::new(), 5));
    let mut results = h.submit_all(reqs.clone());
    assert!(matches!(results.remove(3), Err(tensorfold_engine::SubmitError::EmptyPrompt)), "refused by name");
    reqs.remove(3);
    for (r, res) in reqs.iter().zip(results) {
        let (_, rx) = res.expect("queued");
        let got = collect(rx);
        assert_eq!(got.reason, FinishReason::Length);
        let (want, _) = common::reference(&target, r);
        assert_eq!(got.tokens, want, "a reply equals the serial reference");
    }
    // One round prefills all eight and draws their first tokens, then four decode rounds: `submit` in a loop
    // queues one request a round and takes at least 12.
    assert_eq!(settled(&h, 40).rounds, 5);
}

#[test]
fn submit_all_on_a_stopped_engine_refuses_every_request_as_stopped() {
    let engine = Engine::start(FakeTarget::new(), EngineConfig::default());
    let h = engine.handle();
    drop(engine);
    let reqs: Vec<Request> = (0..3).map(|i| Request::greedy(vec![1, 2 + i], 4)).collect();
    let got = h.submit_all(reqs);
    assert_eq!(got.len(), 3, "one result a request");
    assert!(got.iter().all(|r| matches!(r, Err(tensorfold_engine::SubmitError::Stopped))));
}

#[test]
fn the_default_round_budget_holds_every_lane_and_a_prompt_chunk() {
    assert_eq!(EngineConfig::default_round_rows(8, 256), 512);
    assert_eq!(EngineConfig::default_round_rows(1024, 256), 1280);
    assert_eq!(EngineConfig::default_round_rows(usize::MAX, 256), usize::MAX, "saturates");
}
