//! Expert parallelism on CPU ranks (the host stand-in for NCCL, the same model code path the GPUs take up to the
//! collective): at world sizes 1 to 3, logits equal the one-device model's bit for bit, a stream's rows equal its solo
//! run's, and models or rank counts that cannot be split are refused by name.

use std::path::PathBuf;
use tensorfold_kernels::{Collective, CpuBackend, HostCollective, KernelError, Segment};
use tensorfold_model::{Batch, ForwardError, LogitRows, Model, OpenError, Source, open, open_expert_parallel};

fn source(rel: &str) -> Source {
    Source::Dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel))
}

fn sharded(src: &Source, world: usize) -> Result<Model<CpuBackend>, OpenError> {
    open_expert_parallel(src, vec![CpuBackend; world], Box::new(HostCollective::new(world))).map(|l| l.model)
}

/// Two streams in one call (a 9-row prompt and a 4-row prompt), then one decode row each in a second call: every
/// row's logits, in call order.
fn two_streams(m: &Model<CpuBackend>) -> Vec<f32> {
    let (a, b): (Vec<u32>, Vec<u32>) = ((0..9).map(|i| (i * 37 + 11) % 500).collect(), vec![3, 141, 59, 26]);
    let (mut sa, mut sb) = (m.new_state(), m.new_state());
    let segs = [
        Segment { first_row: 0, rows: 9, start_pos: 0, cache: 0 },
        Segment { first_row: 9, rows: 4, start_pos: 0, cache: 1 },
    ];
    let ids: Vec<u32> = a.iter().chain(&b).copied().collect();
    let mut out = m.forward(Batch::new(&ids, &segs, &mut [&mut sa, &mut sb], LogitRows::All)).expect("prefill").logits;
    let segs = [
        Segment { first_row: 0, rows: 1, start_pos: 9, cache: 0 },
        Segment { first_row: 1, rows: 1, start_pos: 4, cache: 1 },
    ];
    out.extend(m.forward(Batch::new(&[7, 8], &segs, &mut [&mut sa, &mut sb], LogitRows::All)).expect("decode").logits);
    out
}

/// The first stream alone: its 9 prompt rows and its decode row.
fn solo(m: &Model<CpuBackend>) -> Vec<f32> {
    let a: Vec<u32> = (0..9).map(|i| (i * 37 + 11) % 500).collect();
    let mut s = m.new_state();
    let mut out = m
        .forward(Batch::new(
            &a,
            &[Segment { first_row: 0, rows: 9, start_pos: 0, cache: 0 }],
            &mut [&mut s],
            LogitRows::All,
        ))
        .expect("solo prefill")
        .logits;
    let seg = Segment { first_row: 0, rows: 1, start_pos: 9, cache: 0 };
    out.extend(m.forward(Batch::new(&[7], &[seg], &mut [&mut s], LogitRows::All)).expect("solo decode").logits);
    out
}

#[test]
fn every_world_size_gives_the_one_device_bits() {
    for rel in ["tests/fixtures/lfm2-moe-f32", "tests/fixtures/lfm2-moe-24b-plan", "models/lfm2-moe-pycode"] {
        let src = source(rel);
        let one = open(&src, CpuBackend).expect("opens").model;
        let want = two_streams(&one);
        assert!(want.iter().all(|v| v.is_finite()), "{rel}");
        for world in 1..=3 {
            let m = sharded(&src, world).expect("splits");
            assert_eq!(m.world(), world);
            let got = two_streams(&m);
            let diffs = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(diffs, 0, "{rel} at {world} ranks: {diffs} of {} logits differ in bits", want.len());
        }
    }
}

#[test]
fn a_stream_beside_another_equals_its_solo_run_at_two_ranks() {
    let m = sharded(&source("tests/fixtures/lfm2-moe-f32"), 2).expect("splits");
    let vocab = m.cfg.vocab;
    let both = two_streams(&m);
    let alone = solo(&m);
    // Rows 0..9 of the prefill call and row 0 of the decode call are the first stream's.
    let mine: Vec<f32> = both[..9 * vocab].iter().chain(&both[13 * vocab..14 * vocab]).copied().collect();
    assert!(mine.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn ranks_hold_disjoint_experts_and_together_every_byte() {
    let src = source("tests/fixtures/lfm2-moe-f32");
    let one = open(&src, CpuBackend).expect("opens").model;
    let m = sharded(&src, 3).expect("splits");
    let ep = m.ep.as_ref().expect("expert parallel");
    assert_eq!(ep.ranges, vec![0..3, 3..6, 6..8]);
    let by_rank = m.weight_bytes_by_rank();
    assert_eq!(by_rank.len(), 3);
    assert_eq!(by_rank.iter().sum::<usize>(), one.weight_bytes(), "{by_rank:?}");
    assert!(by_rank[1] > 0 && by_rank[2] < by_rank[1], "rank 2 holds 2 experts, rank 1 holds 3: {by_rank:?}");
    assert_eq!(m.memory_high_by_rank(), vec![None; 3]);
}

#[test]
fn what_cannot_be_split_is_refused_by_name() {
    let dense = sharded(&source("tests/fixtures/lfm2-dense-f32"), 2);
    assert!(matches!(&dense, Err(OpenError::ExpertParallel(m)) if m.contains("no MoE layers")));
    let one = sharded(&source("tests/fixtures/lfm2-dense-f32"), 1).expect("a dense model on one rank opens plainly");
    assert!(one.ep.is_none());
    let many = sharded(&source("tests/fixtures/lfm2-moe-f32"), 9);
    assert!(matches!(&many, Err(OpenError::ExpertParallel(m)) if m.contains("8 experts cannot be split over 9")));
    let mismatch = open_expert_parallel(
        &source("tests/fixtures/lfm2-moe-f32"),
        vec![CpuBackend; 2],
        Box::new(HostCollective::new(3)),
    );
    assert!(matches!(&mismatch, Err(OpenError::ExpertParallel(m)) if m.contains("2 devices but a collective over 3")));
    let none = open_expert_parallel(&source("tests/fixtures/lfm2-moe-f32"), vec![], Box::new(HostCollective::new(1)));
    assert!(matches!(none, Err(OpenError::ExpertParallel(_))));
}

/// The host stand-in, except that its collectives report an asynchronous failure once `after` calls have run.
struct FailsAfter {
    inner: HostCollective,
    calls: std::sync::atomic::AtomicUsize,
    after: usize,
}

impl Collective<CpuBackend> for FailsAfter {
    fn world(&self) -> usize {
        self.inner.world()
    }
    fn broadcast(&self, root: &Vec<f32>, others: &mut [&mut Vec<f32>]) -> Result<(), KernelError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.broadcast(root, others)
    }
    fn reduce_sum(&self, root: &mut Vec<f32>, others: &[&Vec<f32>]) -> Result<(), KernelError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.reduce_sum(root, others)
    }
    fn check(&self) -> Result<(), KernelError> {
        if self.calls.load(std::sync::atomic::Ordering::Relaxed) > self.after {
            return Err(KernelError::DeviceLost { kernel: "nccl", message: "planted: a peer was lost".into() });
        }
        Ok(())
    }
}

#[test]
fn a_collective_that_failed_on_the_way_fails_the_forward_as_a_lost_device() {
    let src = source("tests/fixtures/lfm2-moe-f32");
    let comm = FailsAfter { inner: HostCollective::new(2), calls: 0.into(), after: 1_000_000 };
    let m = open_expert_parallel(&src, vec![CpuBackend; 2], Box::new(comm)).expect("splits").model;
    let mut s = m.new_state();
    let seg = [Segment { first_row: 0, rows: 3, start_pos: 0, cache: 0 }];
    assert!(m.forward(Batch::new(&[1, 2, 3], &seg, &mut [&mut s], LogitRows::Last)).is_ok(), "a healthy collective");
    let comm = FailsAfter { inner: HostCollective::new(2), calls: 0.into(), after: 3 };
    let m = open_expert_parallel(&src, vec![CpuBackend; 2], Box::new(comm)).expect("splits").model;
    let mut s = m.new_state();
    let r = m.forward(Batch::new(&[1, 2, 3], &seg, &mut [&mut s], LogitRows::Last));
    assert!(matches!(r, Err(ForwardError::Kernel(KernelError::DeviceLost { .. }))), "{:?}", r.err());
}

/// A collective whose `reduce_sum` call number `at` (from 0) runs out of device memory, the device usable after.
struct OutOfMemoryAt {
    inner: HostCollective,
    calls: std::sync::atomic::AtomicUsize,
    at: usize,
}

impl Collective<CpuBackend> for OutOfMemoryAt {
    fn world(&self) -> usize {
        self.inner.world()
    }
    fn broadcast(&self, root: &Vec<f32>, others: &mut [&mut Vec<f32>]) -> Result<(), KernelError> {
        self.inner.broadcast(root, others)
    }
    fn reduce_sum(&self, root: &mut Vec<f32>, others: &[&Vec<f32>]) -> Result<(), KernelError> {
        if self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == self.at {
            return Err(KernelError::DeviceOutOfMemory { kernel: "nccl_reduce", message: "planted".into() });
        }
        self.inner.reduce_sum(root, others)
    }
    fn check(&self) -> Result<(), KernelError> {
        Ok(())
    }
}

/// A failure inside a layer (the first MoE layer's sum, after the conv layers before it wrote their states) tears
/// every state of the call: the next forward or rollback of either is refused by name before anything runs, and a
/// fresh state on the same model runs on, equal to a one-device model's.
#[test]
fn a_failure_inside_a_layer_tears_the_states_of_its_call() {
    let src = source("tests/fixtures/lfm2-moe-f32");
    let comm = OutOfMemoryAt { inner: HostCollective::new(2), calls: 0.into(), at: 0 };
    let m = open_expert_parallel(&src, vec![CpuBackend; 2], Box::new(comm)).expect("splits").model;
    let (mut a, mut b) = (m.new_state(), m.new_state());
    let segs = [
        Segment { first_row: 0, rows: 3, start_pos: 0, cache: 0 },
        Segment { first_row: 3, rows: 2, start_pos: 0, cache: 1 },
    ];
    let r = m.forward(Batch::new(&[1, 2, 3, 4, 5], &segs, &mut [&mut a, &mut b], LogitRows::Last));
    assert!(r.as_ref().is_err_and(ForwardError::is_out_of_memory), "{:?}", r.err());
    assert!(a.torn && b.torn && (a.pos, b.pos) == (0, 0), "both torn, neither advanced");
    let seg = [Segment { first_row: 0, rows: 1, start_pos: 0, cache: 0 }];
    let again = m.forward(Batch::new(&[1], &seg, &mut [&mut a], LogitRows::Last));
    assert_eq!(again.err(), Some(ForwardError::Torn));
    assert_eq!(m.keep(&mut b, 0), Err(ForwardError::Torn));
    assert!(matches!(m.snapshot(&a), Err(ForwardError::Torn)), "no copy of a torn state");
    let mut fresh = m.new_state();
    let ok = m.forward(Batch::new(&[1, 2, 3], &segs[..1], &mut [&mut fresh], LogitRows::Last)).expect("runs on");
    let one = open(&src, CpuBackend).expect("opens").model;
    let mut s = one.new_state();
    let want = one.forward(Batch::new(&[1, 2, 3], &segs[..1], &mut [&mut s], LogitRows::Last)).expect("runs");
    assert_eq!(ok.logits, want.logits);
}
