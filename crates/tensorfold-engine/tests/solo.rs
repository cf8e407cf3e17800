//! The solo loop (`single::generate` without drafts) and the forward's call checks on the `lfm2-moe-f32` fixture: refusals by name,
//! seeded sampling reproducible across prefill chunk sizes, stop ids, and refused forwards leaving state alone.

use std::path::Path;
use std::sync::Arc;
use tensorfold_engine::keyed::{SampleError, SamplingParams};
use tensorfold_engine::single::{GenerateError, GenerateOptions, generate};
use tensorfold_engine::{FinishReason, SubmitError};
use tensorfold_kernels::{CpuBackend, Segment};
use tensorfold_model::exact::Reference;
use tensorfold_model::{Batch, ForwardError, LogitRows, Model, Source, open};

fn model() -> Arc<Model<CpuBackend>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-moe-f32");
    Arc::new(open(&Source::Dir(dir), CpuBackend).expect("the fixture opens").model)
}

/// The fixture's 32-token reference input (bos, then ids uniform in 10..511), on which the model is not
/// collapsed onto one token.
fn prompt() -> Vec<u32> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-moe-f32/reference.safetensors");
    let ids = Reference::parse(&std::fs::read(path).expect("the reference is readable")).expect("parses").ids;
    assert_eq!(ids.len(), 32);
    ids
}

fn config(max_tokens: usize, params: SamplingParams) -> GenerateOptions {
    GenerateOptions {
        chunk: 16,
        max_tokens,
        context: 4096,
        stop_ids: Vec::new(),
        params,
        penalties: Default::default(),
        grammar: None,
        drafts: None,
    }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 1.0, seed, ..SamplingParams::greedy() }
}

fn run(
    m: &Arc<Model<CpuBackend>>,
    prompt: &[u32],
    cfg: &GenerateOptions,
) -> Result<(Vec<u32>, FinishReason), GenerateError> {
    generate(m, prompt, cfg, |_| true).map(|(ids, stats)| {
        assert_eq!(stats.generated, ids.len());
        assert_eq!(stats.prompt_tokens, prompt.len());
        (ids, stats.finish)
    })
}

#[test]
fn a_prompt_of_zero_tokens_is_refused_as_empty() {
    let m = model();
    assert_eq!(
        run(&m, &[], &config(4, SamplingParams::greedy())),
        Err(GenerateError::Refused(SubmitError::EmptyPrompt))
    );
}

#[test]
fn a_prompt_plus_max_tokens_past_the_context_is_refused_with_the_counts() {
    let m = model();
    let cfg = GenerateOptions { context: 16, ..config(20, SamplingParams::greedy()) };
    let e = run(&m, &[1, 2, 3], &cfg).expect_err("refused");
    assert_eq!(e, GenerateError::Refused(SubmitError::ContextExceeded { prompt: 3, max_tokens: 20, context: 16 }));
    assert_eq!(e.to_string(), "prompt of 3 tokens plus max_tokens 20 exceeds the context of 16 tokens");
    let exact_fit = GenerateOptions { context: 23, ..config(20, SamplingParams::greedy()) };
    assert_eq!(run(&m, &[1, 2, 3], &exact_fit).expect("fits exactly").0.len(), 20);
}

#[test]
fn a_max_tokens_so_large_that_the_sum_overflows_is_refused_not_wrapped() {
    let m = model();
    let cfg = GenerateOptions { context: 64, ..config(usize::MAX, SamplingParams::greedy()) };
    assert_eq!(
        run(&m, &[1, 2, 3], &cfg),
        Err(GenerateError::Refused(SubmitError::ContextExceeded { prompt: 3, max_tokens: usize::MAX, context: 64 }))
    );
}

#[test]
fn a_prefill_chunk_of_zero_is_refused() {
    let m = model();
    let cfg = GenerateOptions { chunk: 0, ..config(4, SamplingParams::greedy()) };
    assert_eq!(run(&m, &prompt(), &cfg), Err(GenerateError::ZeroChunk));
}

#[test]
fn invalid_sampling_parameters_are_refused_by_the_sampler_by_name() {
    let m = model();
    let negative = SamplingParams { temperature: -1.0, ..sampled(1) };
    match run(&m, &prompt(), &config(4, negative)) {
        Err(GenerateError::Refused(SubmitError::Sampling(SampleError::InvalidParam {
            name: "temperature",
            value,
            ..
        }))) => {
            assert_eq!(value, -1.0)
        }
        other => panic!("expected an invalid temperature, got {other:?}"),
    }
    let zero_p = SamplingParams { top_p: 0.0, ..sampled(1) };
    match run(&m, &prompt(), &config(4, zero_p)) {
        Err(GenerateError::Refused(SubmitError::Sampling(SampleError::InvalidParam {
            name: "top_p", value, ..
        }))) => assert_eq!(value, 0.0),
        other => panic!("expected an invalid top_p, got {other:?}"),
    }
}

#[test]
fn a_seeded_sampled_run_is_reproducible_and_the_same_for_chunk_sizes_1_5_and_64() {
    let m = model();
    let p = prompt();
    let params = SamplingParams { temperature: 0.9, top_k: 50, top_p: 0.95, min_p: 0.01, seed: 1234 };
    let reference = run(&m, &p, &config(16, params)).expect("runs");
    assert_eq!(reference.0.len(), 16);
    assert_eq!(reference.1, FinishReason::Length);
    let greedy = run(&m, &p, &config(16, SamplingParams::greedy())).expect("runs");
    assert_ne!(reference.0, greedy.0, "the sampled reply is not the greedy one");
    assert_eq!(run(&m, &p, &config(16, params)).expect("runs"), reference, "same seed, same run");
    for chunk in [1, 5, 64] {
        let cfg = GenerateOptions { chunk, ..config(16, params) };
        assert_eq!(run(&m, &p, &cfg).expect("runs"), reference, "chunk {chunk}");
    }
}

#[test]
fn two_seeds_at_temperature_1_give_different_16_token_replies() {
    let m = model();
    let a = run(&m, &prompt(), &config(16, sampled(1))).expect("runs").0;
    let b = run(&m, &prompt(), &config(16, sampled(2))).expect("runs").0;
    assert_eq!((a.len(), b.len()), (16, 16));
    assert_ne!(a, b);
}

#[test]
fn a_stop_id_ends_the_reply_with_stop_and_includes_the_stop_token() {
    let m = model();
    let p = prompt();
    let (free, finish) = run(&m, &p, &config(12, SamplingParams::greedy())).expect("runs");
    assert_eq!(finish, FinishReason::Length);
    // The first position whose token has not appeared before it: stopping on it ends the reply right there.
    let k = (1..free.len()).find(|&k| !free[..k].contains(&free[k])).expect("the reply has two distinct tokens");
    let cfg = GenerateOptions { stop_ids: vec![free[k]], ..config(12, SamplingParams::greedy()) };
    let (stopped, finish) = run(&m, &p, &cfg).expect("runs");
    assert_eq!(finish, FinishReason::Stop);
    assert_eq!(stopped, free[..=k]);
}

#[test]
fn a_callback_returning_false_cancels_after_that_token() {
    let m = model();
    let mut seen = Vec::new();
    let (ids, stats) = generate(&m, &prompt(), &config(12, SamplingParams::greedy()), |t| {
        seen.push(t);
        seen.len() < 3
    })
    .expect("runs");
    assert_eq!(stats.finish, FinishReason::Cancelled);
    assert_eq!(ids, seen);
    assert_eq!(ids.len(), 3);
}

#[test]
fn a_token_id_past_the_vocabulary_is_refused_and_leaves_the_stream_unchanged() {
    let m = model();
    let mut state = m.new_state();
    let seg = |rows: usize, start_pos: usize| Segment { first_row: 0, rows, start_pos, cache: 0 };
    let e = m.forward(Batch::new(&[1, 512, 3], &[seg(3, 0)], &mut [&mut state], LogitRows::Last)).expect_err("refused");
    assert_eq!(e, ForwardError::TokenOutOfRange { id: 512, vocab: 512 });
    assert_eq!(state.pos, 0);
    let after = m.forward(Batch::new(&[1, 511, 3], &[seg(3, 0)], &mut [&mut state], LogitRows::Last)).expect("runs");
    assert_eq!(state.pos, 3);
    let mut fresh = m.new_state();
    let clean = m.forward(Batch::new(&[1, 511, 3], &[seg(3, 0)], &mut [&mut fresh], LogitRows::Last)).expect("runs");
    assert_eq!(after.rows, [2]);
    assert_eq!(after.logits.len(), 512);
    assert!(after.logits.iter().zip(&clean.logits).all(|(a, b)| a.to_bits() == b.to_bits()), "same as a fresh stream");
}

#[test]
fn a_segment_starting_off_the_stream_position_is_refused_as_a_position_error() {
    let m = model();
    let mut state = m.new_state();
    let seg = Segment { first_row: 0, rows: 2, start_pos: 3, cache: 0 };
    let e = m.forward(Batch::new(&[1, 2], &[seg], &mut [&mut state], LogitRows::Last)).expect_err("refused");
    assert_eq!(e, ForwardError::Position { cache: 0, start: 3, pos: 0 });
    assert_eq!(state.pos, 0);
    let good = Segment { start_pos: 0, ..seg };
    m.forward(Batch::new(&[1, 2], &[good], &mut [&mut state], LogitRows::Last)).expect("runs");
    assert_eq!(state.pos, 2);
    let stale = m.forward(Batch::new(&[3], &[Segment { rows: 1, ..good }], &mut [&mut state], LogitRows::Last));
    assert_eq!(stale.expect_err("refused"), ForwardError::Position { cache: 0, start: 0, pos: 2 });
    assert_eq!(state.pos, 2);
}

/// Target fixture directories (drafter fixtures, `dspark-*`, aside), sorted.
fn fixture_names() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let mut names: Vec<String> = std::fs::read_dir(root)
        .expect("tests/fixtures is readable")
        .map(|e| e.expect("a directory entry"))
        .filter(|e| e.file_type().expect("a file type").is_dir())
        .map(|e| e.file_name().into_string().expect("a UTF-8 name"))
        .filter(|n| !n.starts_with("dspark-") && n != "mlx" && n != "chat_templates")
        .collect();
    names.sort();
    names
}

fn id_list(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("a list of ids").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

#[test]
fn greedy_generation_reproduces_the_reference_continuation_of_every_fixture() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let bytes = std::fs::read(root.join("expected.json")).expect("expected.json is readable");
    let exp: serde_json::Value = serde_json::from_slice(&bytes).expect("expected.json is JSON");
    for name in fixture_names() {
        let loaded = open(&Source::Dir(root.join(&name)), CpuBackend).unwrap_or_else(|e| panic!("{name}: {e}"));
        let prompt = id_list(&exp["fixtures"][&name]["input_ids"]);
        let want = id_list(&exp["fixtures"][&name]["greedy_new_tokens"]);
        assert_eq!(want.len(), 8, "{name}: expected.json holds 8 greedy tokens");
        let cfg = GenerateOptions {
            penalties: Default::default(),
            grammar: None,
            chunk: 16,
            max_tokens: 8,
            context: loaded.model.cfg.max_positions,
            stop_ids: Vec::new(),
            params: SamplingParams::greedy(),
            drafts: None,
        };
        let mut streamed = Vec::new();
        let (got, stats) = generate(&Arc::new(loaded.model), &prompt, &cfg, |t| {
            streamed.push(t);
            true
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, want, "{name}: greedy continuation");
        assert_eq!(streamed, want, "{name}: streamed tokens");
        assert_eq!((stats.prompt_tokens, stats.generated, stats.finish), (32, 8, FinishReason::Length), "{name}");
    }
}
