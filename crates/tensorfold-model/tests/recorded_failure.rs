//! A failure an infallible device call recorded (as CUDA leaves an allocation's or a queued launch's error for the
//! next fallible call) is taken by the forward and the state copy it belongs to: pending before a forward, the
//! forward is refused with it and no state is written; recorded inside a forward (its head), the forward fails and
//! tears its states, never returning its logits; pending at a copy, the copy is refused.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tensorfold_kernels::stalling::StallingBackend;
use tensorfold_kernels::{CpuBackend, KernelError, Segment};
use tensorfold_model::{Batch, ForwardError, LogitRows, Model, Source, open};

fn model() -> Model<StallingBackend<CpuBackend>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2-dense-f32");
    let backend = StallingBackend::new(CpuBackend, Arc::new(AtomicBool::new(false)), Duration::ZERO);
    open(&Source::Dir(dir), backend).expect("opens").model
}

fn oom() -> KernelError {
    KernelError::DeviceOutOfMemory { kernel: "scratch", message: "planted".into() }
}

const SEG: [Segment; 1] = [Segment { first_row: 0, rows: 3, start_pos: 0, cache: 0 }];

#[test]
fn a_failure_pending_before_a_forward_refuses_it_and_writes_nothing() {
    let m = model();
    let mut s = m.new_state();
    m.backend.record(oom());
    let r = m.forward(Batch::new(&[1, 2, 3], &SEG, &mut [&mut s], LogitRows::Last));
    assert_eq!(r.err(), Some(ForwardError::Kernel(oom())));
    assert!(!s.torn && s.pos == 0, "whole, at its start");
    let again = m.forward(Batch::new(&[1, 2, 3], &SEG, &mut [&mut s], LogitRows::Last)).expect("runs again");
    let mut fresh = m.new_state();
    let want = m.forward(Batch::new(&[1, 2, 3], &SEG, &mut [&mut fresh], LogitRows::Last)).expect("runs");
    assert_eq!(again.logits, want.logits, "the state was left as it was");
}

#[test]
fn a_failure_recorded_inside_a_forward_fails_it_and_tears_its_states() {
    let m = model();
    let mut s = m.new_state();
    m.backend.record_at_read(oom());
    let r = m.forward(Batch::new(&[1, 2, 3], &SEG, &mut [&mut s], LogitRows::Last));
    assert_eq!(r.err(), Some(ForwardError::Kernel(oom())), "no logits from a failed forward");
    assert!(s.torn, "torn");
    let seg = [Segment { first_row: 0, rows: 1, start_pos: s.pos, cache: 0 }];
    assert_eq!(m.forward(Batch::new(&[4], &seg, &mut [&mut s], LogitRows::Last)).err(), Some(ForwardError::Torn));
}

#[test]
fn a_failure_pending_at_a_copy_refuses_the_copy() {
    let m = model();
    let mut s = m.new_state();
    m.forward(Batch::new(&[1, 2, 3], &SEG, &mut [&mut s], LogitRows::Last)).expect("runs");
    m.backend.record(oom());
    assert!(matches!(m.snapshot(&s), Err(ForwardError::Kernel(e)) if e == oom()));
    let copy = m.snapshot(&s).expect("the next copy is made");
    assert_eq!(copy.pos, 3);
}
