//! The DSpark drafter against its PyTorch reference (`tools/drafter/dspark.py`, fixture `dspark-tiny` on
//! the `lfm2-moe-f32` target): picks token for token, scores and confidences within bounds; batched,
//! chunked and rolled-back contexts bit-equal to fresh ones; config refusals by name; held drafts (a verify window
//! whose rows take the picks on the device) bit-equal to the window with the picks read first, bad held rows refused.

use safetensors::SafeTensors;
use std::path::{Path, PathBuf};
use tensorfold_kernels::{CpuBackend, KernelError, Segment};
use tensorfold_model::drafter::{DraftBlock, DrafterError, Drafts, HeldBlocks, HeldRows, open_drafter};
use tensorfold_model::{Batch, DraftBatch, ForwardError, LogitRows, Model, Source, StreamState, open};

/// A read pass's blocks (what `DraftBatch::read` asks for).
fn blocks(d: Drafts<CpuBackend>) -> Vec<DraftBlock> {
    d.blocks().expect("a read pass returns read blocks")
}

/// A held pass's picks (what `DraftBatch::held` asks for).
fn held(d: Drafts<CpuBackend>) -> HeldBlocks<CpuBackend> {
    d.held().expect("a held pass returns held blocks")
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn model() -> Model<CpuBackend> {
    let mut m = open(&Source::Dir(root().join("lfm2-moe-f32")), CpuBackend).expect("target opens").model;
    let d = open_drafter(&Source::Dir(root().join("dspark-tiny")), &m.cfg, &m.backend).expect("drafter opens");
    m.drafter = Some(d);
    m
}

struct Reference {
    tokens: Vec<u32>,
    anchors: Vec<usize>,
    scores: Vec<f32>,
    picks: Vec<u32>,
    confidence: Vec<f32>,
}

fn reference() -> Reference {
    let bytes = std::fs::read(root().join("dspark-tiny/reference.safetensors")).expect("reference readable");
    let st = SafeTensors::deserialize(&bytes).expect("safetensors");
    let i64s = |n: &str| -> Vec<i64> {
        st.tensor(n).expect(n).data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8"))).collect()
    };
    let f32s = |n: &str| -> Vec<f32> {
        st.tensor(n).expect(n).data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect()
    };
    Reference {
        tokens: i64s("tokens").iter().map(|&t| t as u32).collect(),
        anchors: i64s("anchors").iter().map(|&a| a as usize).collect(),
        scores: f32s("scores"),
        picks: i64s("picks").iter().map(|&t| t as u32).collect(),
        confidence: f32s("confidence"),
    }
}

/// A state that consumed `tokens`, fed in chunks of `chunk` rows.
fn consumed(m: &Model<CpuBackend>, tokens: &[u32], chunk: usize) -> StreamState<CpuBackend> {
    let mut s = m.new_state();
    for c in tokens.chunks(chunk.max(1)) {
        let seg = [Segment { first_row: 0, rows: c.len(), start_pos: s.pos, cache: 0 }];
        m.forward(Batch::new(c, &seg, &mut [&mut s], LogitRows::Last)).expect("forward");
    }
    s
}

fn draft_one(m: &Model<CpuBackend>, s: &StreamState<CpuBackend>, anchor: u32) -> DraftBlock {
    m.draft(DraftBatch::read(&[s], &[anchor], true)).map(blocks).expect("draft").remove(0)
}

#[test]
fn the_block_pass_matches_the_pytorch_reference() {
    let (m, r) = (model(), reference());
    let (bs, v) = (4, 512);
    for (k, &a) in r.anchors.iter().enumerate() {
        let s = consumed(&m, &r.tokens[..a], 64);
        let blk = draft_one(&m, &s, r.tokens[a]);
        assert_eq!((blk.scores.len(), blk.confidence.len()), (bs * v, bs), "a whole block at anchor {a}");
        assert_eq!(blk.tokens, r.picks[k * bs..(k + 1) * bs], "picks at anchor {a}");
        let want = &r.scores[k * bs * v..(k + 1) * bs * v];
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = blk.scores.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs())) / scale;
        assert!(err < 1e-4, "scores at anchor {a}: max err {err:e} of the largest score");
        let cerr =
            blk.confidence.iter().zip(&r.confidence[k * bs..(k + 1) * bs]).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        assert!(cerr < 1e-5, "confidence at anchor {a}: max abs err {cerr:e}");
    }
}

#[test]
fn batched_chunked_and_rolled_back_contexts_draft_the_same_bits() {
    let (m, r) = (model(), reference());
    let states: Vec<StreamState<CpuBackend>> = r.anchors.iter().map(|&a| consumed(&m, &r.tokens[..a], 64)).collect();
    let refs: Vec<&StreamState<CpuBackend>> = states.iter().collect();
    let anchors: Vec<u32> = r.anchors.iter().map(|&a| r.tokens[a]).collect();
    let batched = m.draft(DraftBatch::read(&refs, &anchors, true)).map(blocks).expect("batched draft");
    for (k, &a) in r.anchors.iter().enumerate() {
        let solo = draft_one(&m, &states[k], anchors[k]);
        assert_eq!(batched[k], solo, "batched equals solo at anchor {a}");
        let chunked = draft_one(&m, &consumed(&m, &r.tokens[..a], 3), anchors[k]);
        assert_eq!(chunked, solo, "chunks of 3 equal one prefill at anchor {a}");
    }
    // A verify window of 5 rows past anchor 7, rolled back to keep 2 of them, equals a fresh context of 9.
    let mut s = consumed(&m, &r.tokens[..7], 64);
    let seg = [Segment { first_row: 0, rows: 5, start_pos: 7, cache: 0 }];
    m.forward(Batch::new(&r.tokens[7..12], &seg, &mut [&mut s], LogitRows::All)).expect("window");
    m.keep(&mut s, 9).expect("keep");
    assert_eq!(draft_one(&m, &s, r.tokens[9]), draft_one(&m, &consumed(&m, &r.tokens[..9], 64), r.tokens[9]));
}

#[test]
fn a_drafter_context_left_at_the_window_end_is_refused_and_a_wrong_one_drafts_differently() {
    let (m, r) = (model(), reference());
    let mut s = consumed(&m, &r.tokens[..7], 64);
    let seg = [Segment { first_row: 0, rows: 5, start_pos: 7, cache: 0 }];
    m.forward(Batch::new(&r.tokens[7..12], &seg, &mut [&mut s], LogitRows::All)).expect("window");
    let stale = s.draft.clone().expect("drafter state");
    m.keep(&mut s, 9).expect("keep");
    let good = draft_one(&m, &s, r.tokens[9]);
    // Planted fault 1: the drafter's rollback skipped: 12 context rows at position 9 are refused by name.
    let mut unrolled = s.clone();
    unrolled.draft = Some(stale);
    let err = m
        .draft(DraftBatch::read(&[&unrolled], &[r.tokens[9]], true))
        .map(blocks)
        .expect_err("a context longer than the position");
    assert!(matches!(err, ForwardError::Kernel(KernelError::KeyCount { .. })), "{err:?}");
    // Planted fault 2: a context of the right length from other tokens changes the block.
    let mut other = s.clone();
    other.draft = consumed(&m, &r.tokens[10..19], 64).draft;
    assert_ne!(draft_one(&m, &other, r.tokens[9]), good);
}

#[test]
fn bad_anchors_and_missing_drafters_are_refused() {
    let m = model();
    let s = m.new_state();
    assert!(matches!(
        m.draft(DraftBatch::read(&[&s], &[512], false)).map(blocks),
        Err(tensorfold_model::ForwardError::TokenOutOfRange { .. })
    ));
    let plain = open(&Source::Dir(root().join("lfm2-moe-f32")), CpuBackend).expect("target").model;
    let ps = plain.new_state();
    assert_eq!(
        plain.draft(DraftBatch::read(&[&ps], &[1], false)).map(blocks).unwrap_err(),
        tensorfold_model::ForwardError::NoDrafter
    );
}

/// A change to the drafter's config.json.
type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;

/// Opens the fixture drafter with one config field replaced.
fn with_config(edit: impl FnOnce(&mut serde_json::Value)) -> Result<(), DrafterError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = root().join("dspark-tiny");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config")).expect("json");
    edit(&mut cfg);
    std::fs::write(dir.path().join("config.json"), serde_json::to_vec(&cfg).expect("json")).expect("write");
    std::fs::copy(src.join("model.safetensors"), dir.path().join("model.safetensors")).expect("copy");
    let m = open(&Source::Dir(root().join("lfm2-moe-f32")), CpuBackend).expect("target").model;
    open_drafter(&Source::Dir(dir.path().to_path_buf()), &m.cfg, &m.backend).map(|_| ())
}

#[test]
fn drafter_configs_we_do_not_run_are_refused_by_name() {
    let cases: Vec<(&str, Edit)> = vec![
        ("hidden_act", Box::new(|c| c["hidden_act"] = "gelu".into())),
        ("markov_head_type", Box::new(|c| c["markov_head_type"] = "gated".into())),
        ("vocab_size", Box::new(|c| c["vocab_size"] = 1024.into())),
        ("hidden_size", Box::new(|c| c["hidden_size"] = 128.into())),
        ("target_layer_ids", Box::new(|c| c["dflash_config"]["target_layer_ids"] = serde_json::json!([1, 5]))),
        ("num_target_layers", Box::new(|c| c["dflash_config"]["num_target_layers"] = 30.into())),
        ("block_size", Box::new(|c| c["block_size"] = 0.into())),
        ("block_size", Box::new(|c| c["block_size"] = 33.into())),
        ("anchor_first", Box::new(|c| c["anchor_first"] = false.into())),
        ("mask_token_id", Box::new(|c| c["dflash_config"]["mask_token_id"] = 512.into())),
        // A drafter in mlx-lm's format (issue 23): refused at admission, before any code tensor is read.
        ("quantization", Box::new(|c| c["quantization"] = serde_json::json!({"group_size": 64, "bits": 4}))),
        ("quantization_config", Box::new(|c| c["quantization_config"] = serde_json::json!({"bits": 8}))),
        (
            "markov_rank",
            Box::new(|c| c.as_object_mut().expect("object").remove("markov_rank").map(|_| ()).unwrap_or(())),
        ),
    ];
    for (field, edit) in cases {
        let err = with_config(edit).expect_err(field).to_string();
        assert!(err.contains(field), "refusal names {field}: {err}");
    }
    // A weight the config does not use is refused by name.
    let err = with_config(|c| c["enable_confidence_head"] = false.into()).expect_err("extra tensor").to_string();
    assert!(err.contains("confidence_head.proj"), "{err}");
}

#[test]
fn eight_bit_drafter_linears_are_a_quarter_of_f32_and_stay_close_to_the_reference() {
    use tensorfold_model::drafter::{DrafterBits, open_drafter_with};
    let mut m = model();
    let full = m.drafter.as_ref().expect("drafter").weight_bytes(&m.backend);
    let src = Source::Dir(root().join("dspark-tiny"));
    let q = open_drafter_with(&src, &m.cfg, &m.backend, DrafterBits::Eight).expect("8-bit drafter opens");
    let small = q.weight_bytes(&m.backend);
    // f32 codes become bytes plus two f32 a group of 64 (16 or 8 for the narrow Markov projection).
    assert!(small * 10 < full * 4, "8-bit linears: {small} bytes against {full}");
    m.drafter = Some(q);
    let r = reference();
    let (bs, v) = (4, 512);
    let mut same = 0;
    for (k, &a) in r.anchors.iter().enumerate() {
        let blk = draft_one(&m, &consumed(&m, &r.tokens[..a], 64), r.tokens[a]);
        assert_eq!(blk.scores.len(), bs * v);
        let want = &r.scores[k * bs * v..(k + 1) * bs * v];
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = blk.scores.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs())) / scale;
        assert!(err < 0.05, "8-bit scores at anchor {a}: {err:e} of the largest score");
        same += blk.tokens.iter().zip(&r.picks[k * bs..(k + 1) * bs]).filter(|(a, b)| a == b).count();
    }
    assert!(same >= 12, "most 8-bit picks equal the bf16 reference's: {same} of 16");
}

#[test]
fn a_keyed_picker_draws_each_draft_from_its_row_and_feeds_the_markov_chain() {
    use tensorfold_kernels::sample::{SamplingParams, draw};
    use tensorfold_model::drafter::Picker;
    let m = model();
    let r = reference();
    let s = consumed(&m, &r.tokens[..9], 4);
    let greedy = draft_one(&m, &s, r.tokens[9]);
    let v = m.cfg.vocab;
    // A hot sampled picker: each draft is the keyed draw of its own row's scores at its own position.
    let hot = Picker { params: SamplingParams { temperature: 5.0, seed: 11, ..SamplingParams::greedy() }, first: 10 };
    let picked = m
        .draft(DraftBatch::read(&[&s], &[r.tokens[9]], true).with_pickers(&[Some(hot)]))
        .map(blocks)
        .expect("draft")
        .remove(0);
    for (k, &t) in picked.tokens.iter().enumerate() {
        assert_eq!(Ok(t), draw(&hot.params, 10 + k as u64, &picked.scores[k * v..(k + 1) * v]), "row {k}");
    }
    assert_eq!(picked.scores[..v], greedy.scores[..v], "row 0 comes before any pick");
    let at = picked.tokens.iter().zip(&greedy.tokens).position(|(a, b)| a != b).expect("a hot draw leaves the chain");
    assert!(at + 1 < picked.tokens.len(), "the fixture's first differing pick has a row after it");
    let next = (at + 1) * v..(at + 2) * v;
    assert_ne!(picked.scores[next.clone()], greedy.scores[next], "the row after a drawn pick follows that pick");
    // A greedy picker, or one whose params are refused, is the greedy chain.
    let cold = Picker { params: SamplingParams::greedy(), first: 10 };
    let refused = Picker { params: SamplingParams { top_p: 0.0, ..hot.params }, first: 10 };
    for p in [cold, refused] {
        let b = m
            .draft(DraftBatch::read(&[&s], &[r.tokens[9]], true).with_pickers(&[Some(p)]))
            .map(blocks)
            .expect("draft")
            .remove(0);
        assert_eq!((b.tokens, b.scores), (greedy.tokens.clone(), greedy.scores.clone()), "{p:?}");
    }
    // In a batch, a picker applies to its own stream only.
    let two = m
        .draft(DraftBatch::read(&[&s, &s], &[r.tokens[9], r.tokens[9]], false).with_pickers(&[None, Some(hot)]))
        .map(blocks)
        .expect("batch");
    assert_eq!(two[0].tokens, greedy.tokens);
    assert_eq!(two[1].tokens, picked.tokens);
}

#[test]
fn a_held_verify_window_equals_the_window_with_its_drafts_read_first() {
    let m = model();
    let (p0, p1) = ([3u32, 17, 40, 99, 7, 250], [11u32, 12, 13]);
    let (s0, s1) = (consumed(&m, &p0, 64), consumed(&m, &p1, 64));
    let anchors = [5u32, 300];
    let read = m.draft(DraftBatch::read(&[&s0, &s1], &anchors, false)).map(blocks).expect("synchronous pass");
    let held = m.draft(DraftBatch::held(&[&s0, &s1], &anchors)).map(held).expect("held pass");
    let picks: Vec<Vec<u32>> = held.read(&m.backend).into_iter().map(|r| r.expect("finite picks")).collect();
    assert_eq!(picks, read.iter().map(|b| b.tokens.clone()).collect::<Vec<_>>(), "held picks = read picks");
    // Stream 0 verifies 3 drafts, stream 1 all of its block; rows: [a0, d0..d2, a1, d'0..].
    let n1 = held.block();
    let host: Vec<u32> = [anchors[0]]
        .into_iter()
        .chain(picks[0][..3].iter().copied())
        .chain([anchors[1]])
        .chain(picks[1].iter().copied())
        .collect();
    let mut placeholders = host.clone();
    placeholders[1..4].fill(0);
    placeholders[5..].fill(0);
    let segs = [
        Segment { first_row: 0, rows: 4, start_pos: s0.pos, cache: 0 },
        Segment { first_row: 4, rows: 1 + n1, start_pos: s1.pos, cache: 1 },
    ];
    let runs = [HeldRows { row: 1, stream: 0, count: 3 }, HeldRows { row: 5, stream: 1, count: n1 }];
    let (mut a0, mut a1, mut b0, mut b1) = (s0.clone(), s1.clone(), s0.clone(), s1.clone());
    let want = m.forward(Batch::new(&host, &segs, &mut [&mut a0, &mut a1], LogitRows::All)).expect("read-first window");
    let got = m
        .forward(Batch::new(&placeholders, &segs, &mut [&mut b0, &mut b1], LogitRows::All).with_held(&held, &runs))
        .expect("held window");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got.logits), bits(&want.logits), "held rows embed the picks exactly");
    // The placeholders alone give other logits: the check can fail.
    let mut c0 = s0.clone();
    let plain =
        m.forward(Batch::new(&placeholders[..4], &segs[..1], &mut [&mut c0], LogitRows::All)).expect("placeholders");
    assert_ne!(bits(&plain.logits), bits(&want.logits[..plain.logits.len()]));
    // The drafter contexts the windows absorbed agree too: the next blocks are equal.
    let (na, nb) = (
        m.draft(DraftBatch::read(&[&a0], &[1], false)).map(blocks).unwrap(),
        m.draft(DraftBatch::read(&[&b0], &[1], false)).map(blocks).unwrap(),
    );
    assert_eq!(na, nb);
}

#[test]
fn held_rows_outside_the_call_or_the_blocks_are_refused_before_any_state_moves() {
    let m = model();
    let s0 = consumed(&m, &[3, 17, 40], 64);
    let held = m.draft(DraftBatch::held(&[&s0], &[5])).map(held).expect("held pass");
    let seg = [Segment { first_row: 0, rows: 3, start_pos: s0.pos, cache: 0 }];
    for (runs, why) in [
        (HeldRows { row: 1, stream: 1, count: 2 }, "a stream past the batch"),
        (HeldRows { row: 2, stream: 0, count: 2 }, "rows past the call"),
        (HeldRows { row: 1, stream: 0, count: held.block() + 1 }, "more drafts than the block"),
    ] {
        let mut s = s0.clone();
        let r = m.forward(Batch::new(&[5, 0, 0], &seg, &mut [&mut s], LogitRows::Last).with_held(&held, &[runs]));
        assert!(matches!(r, Err(ForwardError::Batch(_))), "{why}: {r:?}");
        assert_eq!(s.pos, s0.pos, "{why}: the state did not move");
    }
}
