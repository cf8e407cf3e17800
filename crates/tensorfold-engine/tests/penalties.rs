//! Logit controls (`logit_bias`, presence, frequency and repetition penalties) in the lane core: a drafted reply
//! equals its `draft: false` reply and an independent serial reference token for token, greedy and sampled, with
//! context copies on the fake target and with context copies and held block drafts on the fixture model; replies
//! with controls differ from those without (they are applied); concurrent replies equal solo ones; bad values are
//! refused at submission.

mod common;

use tensorfold_engine::core::EngineConfig;
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::keyed::{SamplingParams, draw};
use tensorfold_engine::single::{GenerateOptions, generate};
use tensorfold_engine::{ModelTarget, Penalties, PenaltyError, Request, SubmitError};
use tensorfold_kernels::CpuBackend;
use tensorfold_model::Source;
use tensorfold_model::drafter::open_drafter;

/// vLLM's penalties written out on their own: bias, repetition over prompt and output, frequency, presence.
fn penalized(p: &Penalties, prompt: &[u32], out: &[u32], logits: &[f32]) -> Vec<f32> {
    let mut l = logits.to_vec();
    for &(id, b) in &p.logit_bias {
        l[id as usize] += b;
    }
    for (id, x) in l.iter_mut().enumerate() {
        let id = id as u32;
        if prompt.contains(&id) || out.contains(&id) {
            *x = if *x > 0.0 { *x / p.repetition } else { *x * p.repetition };
        }
        let count = out.iter().filter(|&&t| t == id).count();
        *x -= p.frequency * count as f32;
        if count > 0 {
            *x -= p.presence;
        }
    }
    l
}

/// The serial reference on the fake target, without the core.
fn serial(t: &FakeTarget, r: &Request) -> Vec<u32> {
    let mut out = Vec::new();
    while out.len() < r.max_tokens {
        let h: Vec<u32> = r.prompt.iter().chain(&out).copied().collect();
        let l = penalized(&r.penalties, &r.prompt, &out, &t.logits(&h));
        out.push(draw(&r.params, h.len() as u64, &l).expect("finite"));
    }
    out
}

fn controls(i: usize) -> Penalties {
    match i % 4 {
        0 => Penalties { repetition: 1.3, ..Penalties::default() },
        1 => Penalties { presence: 0.8, frequency: 0.4, ..Penalties::default() },
        2 => Penalties { frequency: -0.5, logit_bias: vec![(7, 2.5), (11, -100.0)], ..Penalties::default() },
        _ => Penalties { presence: 0.3, frequency: 0.3, repetition: 0.9, logit_bias: vec![(3, 1.0)] },
    }
}

/// Six requests with repeating prompts (so context copies draft), greedy and sampled, each with controls on.
fn requests(seed0: u64, shift: u32) -> Vec<Request> {
    (0..6)
        .map(|i| {
            let motif: Vec<u32> = (0..5).map(|k| shift + 1 + ((i * 7 + k * 3) % 60) as u32).collect();
            let mut prompt = motif.repeat(3);
            prompt.push(shift + 9 + i as u32);
            let temperature = if i % 2 == 0 { 0.0 } else { 0.7 };
            Request {
                params: SamplingParams { temperature, top_k: 20, seed: seed0 + i, ..SamplingParams::greedy() },
                ignore_eos: true,
                penalties: controls(i as usize),
                ..Request::greedy(prompt, 30 + 3 * i as usize)
            }
        })
        .collect()
}

fn cfg(copy_min: usize) -> EngineConfig {
    EngineConfig {
        copy_min,
        max_draft: 6,
        round_rows: 40,
        prefill_chunk: 8,
        round_guard: false,
        ..EngineConfig::default()
    }
}

fn plain(reqs: &[Request]) -> Vec<Request> {
    reqs.iter().map(|r| Request { draft: false, ..r.clone() }).collect()
}

#[test]
fn penalized_drafted_replies_equal_plain_replies_and_the_serial_reference_on_the_fake_target() {
    let t = FakeTarget { copy_bias: 6.0, ..FakeTarget::new() };
    let reqs = requests(10, 0);
    let (drafted, stats) = common::run_all(t.clone(), cfg(2), &reqs);
    let (undrafted, _) = common::run_all(t.clone(), cfg(2), &plain(&reqs));
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(drafted[i], serial(&t, r), "request {i} drafted vs serial");
        assert_eq!(undrafted[i], drafted[i], "request {i} drafted vs plain");
    }
    let (d, a): (usize, usize) = stats.iter().fold((0, 0), |(d, a), s| (d + s.drafted, a + s.accepted));
    assert!(a > 10 && d > a, "copies both accepted and rejected: {a} of {d}");
    // The controls are applied: without them the replies differ.
    let off: Vec<Request> = reqs.iter().map(|r| Request { penalties: Penalties::default(), ..r.clone() }).collect();
    let (unpenalized, _) = common::run_all(t.clone(), cfg(2), &off);
    for (i, r) in off.iter().enumerate() {
        assert_eq!(unpenalized[i], serial(&t, r), "request {i} without controls");
        assert_ne!(unpenalized[i], drafted[i], "request {i}: the controls change the reply");
    }
}

#[test]
fn concurrent_penalized_replies_equal_solo_ones() {
    let t = FakeTarget { copy_bias: 6.0, ..FakeTarget::new() };
    let reqs = requests(30, 5);
    let (together, _) = common::run_all(t.clone(), EngineConfig { parallel: 6, ..cfg(2) }, &reqs);
    for (i, r) in reqs.iter().enumerate() {
        let (alone, _) = common::run_all(t.clone(), cfg(2), std::slice::from_ref(r));
        assert_eq!(alone[0], together[i], "request {i} alone vs beside five others");
    }
}

fn fixture() -> ModelTarget<CpuBackend> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut l = tensorfold_model::open(&Source::Dir(root.join("lfm2-moe-f32")), CpuBackend).expect("target");
    let d = open_drafter(&Source::Dir(root.join("dspark-tiny")), &l.model.cfg, &l.model.backend).expect("drafter");
    l.model.drafter = Some(d);
    ModelTarget { model: std::sync::Arc::new(l.model), eos: l.eos_ids }
}

#[test]
fn penalized_drafted_replies_equal_plain_replies_and_the_solo_loop_on_the_fixture_model() {
    let t = fixture();
    let reqs = requests(40, 100);
    let solo: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| {
            let opts = GenerateOptions {
                chunk: 8,
                max_tokens: r.max_tokens,
                context: 4096,
                stop_ids: Vec::new(),
                params: r.params,
                penalties: r.penalties.clone(),
                grammar: None,
                drafts: None,
            };
            generate(&t.model, &r.prompt, &opts, |_| true).expect("solo runs").0
        })
        .collect();
    // Context copies (copy_min 2) and, where none matches, held block drafts from the drafter.
    let (copies, copy_stats) = common::run_all(t.clone(), cfg(2), &reqs);
    let (blocks, block_stats) = common::run_all(t.clone(), cfg(0), &reqs);
    let (undrafted, _) = common::run_all(t.clone(), cfg(2), &plain(&reqs));
    for i in 0..reqs.len() {
        assert_eq!(undrafted[i], solo[i], "request {i} plain vs solo loop");
        assert_eq!(copies[i], solo[i], "request {i} copy drafts vs solo loop");
        assert_eq!(blocks[i], solo[i], "request {i} block drafts vs solo loop");
    }
    for stats in [copy_stats, block_stats] {
        let (d, a): (usize, usize) = stats.iter().fold((0, 0), |(d, a), s| (d + s.drafted, a + s.accepted));
        assert!(a > 0 && d > a, "both accepted and rejected drafts: {a} of {d}");
    }
    let off: Vec<Request> = reqs.iter().map(|r| Request { penalties: Penalties::default(), ..r.clone() }).collect();
    let (unpenalized, _) = common::run_all(t, cfg(2), &off);
    assert!(unpenalized.iter().zip(&solo).all(|(a, b)| a != b), "the controls change every reply");
}

#[test]
fn bad_controls_are_refused_at_submission_by_name() {
    let t = FakeTarget::new();
    let vocab = t.vocab;
    let mut core = common::core(t, cfg(2));
    let req = |p: Penalties| Request { penalties: p, ..Request::greedy(vec![1, 2, 3], 4) };
    let (tx, _rx) = std::sync::mpsc::channel();
    let bias = Penalties { logit_bias: vec![(vocab as u32, 1.0)], ..Penalties::default() };
    assert_eq!(
        core.submit(req(bias), tx.clone()).unwrap_err(),
        SubmitError::Penalty(PenaltyError::BiasTokenOutOfRange { id: vocab as u32, vocab })
    );
    let rep = Penalties { repetition: -1.0, ..Penalties::default() };
    let e = core.submit(req(rep), tx.clone()).unwrap_err();
    assert!(matches!(e, SubmitError::Penalty(PenaltyError::OutOfRange { name: "repetition_penalty", .. })), "{e}");
    assert!(core.is_idle(), "nothing was queued");
}
