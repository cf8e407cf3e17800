//! Held drafts at the model: a forward whose rows take the drafter's picks on the device gives the bits of the same
//! forward with those picks as host tokens; a held block reads back the synchronous pass's picks; held rows outside
//! the call or the blocks are refused by name before any state moves.

use std::path::{Path, PathBuf};
use tensorfold_kernels::{CpuBackend, Segment};
use tensorfold_model::drafter::{HeldRows, open_drafter};
use tensorfold_model::{ForwardError, LogitRows, Model, Source, StreamState, open};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn model() -> Model<CpuBackend> {
    let mut m = open(&Source::Dir(root().join("lfm2-moe-f32")), CpuBackend).expect("target opens").model;
    let d = open_drafter(&Source::Dir(root().join("dspark-tiny")), &m.cfg, &m.backend).expect("drafter opens");
    m.drafter = Some(d);
    m
}

fn consumed(m: &Model<CpuBackend>, tokens: &[u32]) -> StreamState<CpuBackend> {
    let mut s = m.new_state();
    let seg = [Segment { first_row: 0, rows: tokens.len(), start_pos: 0, cache: 0 }];
    m.forward(tokens, &seg, &mut [&mut s], LogitRows::Last).expect("prompt");
    s
}

#[test]
fn a_held_verify_window_equals_the_window_with_its_drafts_read_first() {
    let m = model();
    let (p0, p1) = ([3u32, 17, 40, 99, 7, 250], [11u32, 12, 13]);
    let (s0, s1) = (consumed(&m, &p0), consumed(&m, &p1));
    let anchors = [5u32, 300];
    let read = m.draft(&[&s0, &s1], &anchors, false).expect("synchronous pass");
    let held = m.draft_held(&[&s0, &s1], &anchors, &[]).expect("held pass");
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
    let want = m.forward(&host, &segs, &mut [&mut a0, &mut a1], LogitRows::All).expect("read-first window");
    let got = m
        .forward_held(&placeholders, Some((&held, &runs)), &segs, &mut [&mut b0, &mut b1], LogitRows::All)
        .expect("held window");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got.logits), bits(&want.logits), "held rows embed the picks exactly");
    // The placeholders alone give other logits: the check can fail.
    let mut c0 = s0.clone();
    let plain = m.forward(&placeholders[..4], &segs[..1], &mut [&mut c0], LogitRows::All).expect("placeholders");
    assert_ne!(bits(&plain.logits), bits(&want.logits[..plain.logits.len()]));
    // The drafter contexts the windows absorbed agree too: the next blocks are equal.
    let (na, nb) = (m.draft(&[&a0], &[1], false).unwrap(), m.draft(&[&b0], &[1], false).unwrap());
    assert_eq!(na, nb);
}

#[test]
fn held_rows_outside_the_call_or_the_blocks_are_refused_before_any_state_moves() {
    let m = model();
    let s0 = consumed(&m, &[3, 17, 40]);
    let held = m.draft_held(&[&s0], &[5], &[]).expect("held pass");
    let seg = [Segment { first_row: 0, rows: 3, start_pos: s0.pos, cache: 0 }];
    for (runs, why) in [
        (HeldRows { row: 1, stream: 1, count: 2 }, "a stream past the batch"),
        (HeldRows { row: 2, stream: 0, count: 2 }, "rows past the call"),
        (HeldRows { row: 1, stream: 0, count: held.block() + 1 }, "more drafts than the block"),
    ] {
        let mut s = s0.clone();
        let r = m.forward_held(&[5, 0, 0], Some((&held, &[runs])), &seg, &mut [&mut s], LogitRows::Last);
        assert!(matches!(r, Err(ForwardError::Batch(_))), "{why}: {r:?}");
        assert_eq!(s.pos, s0.pos, "{why}: the state did not move");
    }
}
