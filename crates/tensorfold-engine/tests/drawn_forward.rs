//! `Target::forward` on the real fixture model: the draws its backend makes beside the head equal the host's
//! keyed draws of the same logits, logits come back only where asked, and bad wants are refused by name.

use tensorfold_engine::keyed::{DrawSpec, SamplingParams, draw};
use tensorfold_engine::{ForwardCall, ModelTarget, SegOut, SegWant, Target};
use tensorfold_kernels::{CpuBackend, Segment};
use tensorfold_model::{ForwardError, Source};

fn target() -> ModelTarget<CpuBackend> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-dense-bf16");
    let l = tensorfold_model::open(&Source::Dir(dir), CpuBackend).expect("fixture opens");
    ModelTarget { model: std::sync::Arc::new(l.model), eos: l.eos_ids }
}

/// One forward of `tokens` over `segs` serving `wants`, with no held drafts.
fn drawn(
    t: &ModelTarget<CpuBackend>,
    tokens: &[u32],
    segs: &[Segment],
    states: &mut [&mut tensorfold_model::StreamState<CpuBackend>],
    wants: &[SegWant],
) -> Result<Vec<SegOut>, ForwardError> {
    t.forward(&ForwardCall { tokens, segs, wants, held: None }, states)
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.9, min_p: 0.02, seed }
}

#[test]
fn drawn_rows_equal_the_host_draws_of_the_same_logits_and_logits_come_only_where_asked() {
    let t = target();
    let v = t.caps().vocab;
    let mut st: Vec<_> = (0..4).map(|_| t.new_state()).collect();
    let seg = |k: usize, first_row, rows| Segment { first_row, rows, start_pos: 0, cache: k };
    let segs = [seg(0, 0, 4), seg(1, 4, 3), seg(2, 7, 2), seg(3, 9, 2)];
    let tokens = [1, 50, 60, 70, 1, 80, 81, 1, 90, 1, 95];
    let spec = |params, position| DrawSpec { params, position };
    let wants = [
        SegWant { all_rows: true, draws: (0..4).map(|r| spec(sampled(3), 1 + r)).collect(), logits: false },
        SegWant { all_rows: false, draws: vec![spec(SamplingParams::greedy(), 3)], logits: true },
        SegWant { all_rows: true, draws: Vec::new(), logits: true },
        SegWant::default(),
    ];
    let mut refs: Vec<_> = st.iter_mut().collect();
    let out = drawn(&t, &tokens, &segs, &mut refs, &wants).expect("drawn");
    assert!(out[0].logits.is_empty() && out[3].logits.is_empty() && out[3].draws.is_empty() && out[2].draws.is_empty());
    assert_eq!((out[1].logits.len(), out[2].logits.len()), (v, 2 * v));
    let mut plain: Vec<_> = (0..4).map(|_| t.new_state()).collect();
    let mut refs: Vec<_> = plain.iter_mut().collect();
    let logits = t.logits(&tokens, &segs, &mut refs, &[true, false, true, false]).expect("plain");
    let want: Vec<_> = (0..4).map(|r| draw(&sampled(3), 1 + r as u64, &logits[0][r * v..(r + 1) * v])).collect();
    assert_eq!(out[0].draws, want);
    assert_eq!(out[1].draws, vec![draw(&SamplingParams::greedy(), 3, &logits[1])]);
    assert_eq!((&out[1].logits, &out[2].logits), (&logits[1], &logits[2]));
    let pos: Vec<usize> = st.iter().map(|s| t.pos(s)).collect();
    assert_eq!(pos, [4, 3, 2, 2], "a segment that asks for nothing still runs");
}

#[test]
fn wants_that_do_not_match_the_segments_are_refused_and_leave_states_unchanged() {
    let t = target();
    let mut s = t.new_state();
    let seg = [Segment { first_row: 0, rows: 3, start_pos: 0, cache: 0 }];
    let two = SegWant { all_rows: false, draws: vec![DrawSpec { params: sampled(1), position: 3 }; 2], logits: false };
    let e = drawn(&t, &[1, 2, 3], &seg, &mut [&mut s], &[two]).expect_err("two draws for one row");
    assert!(matches!(&e, ForwardError::Batch(m) if m.contains("2 draws for 1 rows")), "{e}");
    let e = drawn(&t, &[1, 2, 3], &seg, &mut [&mut s], &[]).expect_err("no want");
    assert!(matches!(&e, ForwardError::Batch(m) if m.contains("0 wants for 1 segments")), "{e}");
    let empty = [Segment { first_row: 0, rows: 0, start_pos: 0, cache: 0 }];
    let e = drawn(&t, &[1, 2, 3], &empty, &mut [&mut s], &[SegWant::default()]).expect_err("empty segment");
    assert!(matches!(&e, ForwardError::Batch(m) if m.contains("no rows")), "{e}");
    assert_eq!(t.pos(&s), 0);
    let bad = SegWant {
        all_rows: false,
        draws: vec![DrawSpec { params: SamplingParams { top_p: 2.0, ..sampled(1) }, position: 3 }],
        logits: false,
    };
    let out = drawn(&t, &[1, 2, 3], &seg, &mut [&mut s], &[bad]).expect("runs");
    assert!(format!("{:?}", out[0].draws[0]).contains("top_p"), "a refused parameter is the row's named error");
}

#[test]
fn a_wanted_row_past_the_call_is_refused_before_anything_runs() {
    let t = target();
    let mut s = t.new_state();
    let seg = [Segment { first_row: 0, rows: 2, start_pos: 0, cache: 0 }];
    let want = vec![tensorfold_model::RowWant { row: 5, draw: None, logits: true }];
    let e = t
        .model
        .forward(tensorfold_model::Batch::new(&[1, 2], &seg, &mut [&mut s], tensorfold_model::LogitRows::Want(want)))
        .expect_err("refused");
    assert!(matches!(&e, ForwardError::Batch(m) if m.contains("row 5 of 2")), "{e}");
    assert_eq!(t.pos(&s), 0);
}
