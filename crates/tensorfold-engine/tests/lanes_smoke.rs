//! Shared rounds on the fake target: concurrent replies equal solo replies.

use std::time::Instant;
use tensorfold_engine::core::{Core, EngineConfig, FixedClock};
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::sampler::SamplingParams;
use tensorfold_engine::{Event, Request};

fn run_all(reqs: &[Request], cfg: EngineConfig) -> Vec<Vec<u32>> {
    let mut core = Core::new(FakeTarget::new(), cfg, Box::new(FixedClock(Instant::now())));
    let rx: Vec<_> = reqs
        .iter()
        .map(|r| {
            let (tx, rx) = std::sync::mpsc::channel();
            core.submit(r.clone(), tx).expect("admitted");
            rx
        })
        .collect();
    while core.step() {}
    rx.iter()
        .map(|rx| rx.try_iter().filter_map(|e| if let Event::Token(t) = e { Some(t) } else { None }).collect())
        .collect()
}

#[test]
fn concurrent_replies_equal_solo_replies_on_the_fake_target() {
    let reqs: Vec<Request> = (0..8)
        .map(|i| Request {
            prompt: (1..(3 + 7 * i as u32)).collect(),
            params: SamplingParams {
                temperature: if i % 2 == 0 { 0.0 } else { 1.0 },
                seed: i,
                ..SamplingParams::greedy()
            },
            max_tokens: 5 + i as usize * 3,
            stop_ids: vec![],
            ignore_eos: true,
            logprobs: None,
        })
        .collect();
    let cfg = EngineConfig { round_rows: 10, prefill_chunk: 4, ..EngineConfig::default() };
    let together = run_all(&reqs, cfg.clone());
    for (r, want) in reqs.iter().zip(&together) {
        let solo = run_all(std::slice::from_ref(r), cfg.clone());
        assert_eq!(&solo[0], want);
        assert_eq!(want.len(), r.max_tokens);
    }
}
