//! CUDA contract entry of the graph machinery (`cuda/graphs.rs`): a queued sequence run again with new data must be
//! replayed from its graph with that data, and a different sequence of the same length must never replay it.

use crate::cases::*;
use crate::{Claim, Entry, Gate, Kernel, Scale};
use rand::rngs::StdRng;
use tensorfold_kernels::cuda::{CudaBackend, GraphFault};
use tensorfold_kernels::prelude::*;

pub fn kernels(be: &CudaBackend) -> Vec<Box<dyn Entry>> {
    vec![Box::new(Graphs(be.clone()))]
}

/// Elements of each buffer (8 KiB: staged through the arena).
const N: usize = 2048;
/// Adds in a sequence: with the two uploads, 22 operations (a graph needs 16; a part holds 64).
const ADDS: usize = 20;

struct Graphs(CudaBackend);

/// Sequence A: `acc = x`, then `acc += y` [`ADDS`] times; B: the same but the last add is `y += acc` (as many
/// operations, one argument pair swapped). Returns `acc` read back.
fn sequence(be: &CudaBackend, x: &[f32], y: &[f32], b: bool) -> Vec<f32> {
    let mut acc = be.upload(x);
    let mut yb = be.upload(y);
    for i in 0..ADDS {
        match b && i == ADDS - 1 {
            true => be.add(&mut yb, &acc),
            false => be.add(&mut acc, &yb),
        }
    }
    be.read(&acc)
}

/// The host's f32 result of [`sequence`].
fn reference(x: &[f32], y: &[f32], b: bool) -> Vec<f32> {
    let adds = if b { ADDS - 1 } else { ADDS };
    x.iter()
        .zip(y)
        .map(|(&a, &d)| {
            let mut v = a;
            for _ in 0..adds {
                v += d;
            }
            v
        })
        .collect()
}

faults! {
    /// The planted controls of `cuda.graphs`.
    enum GraphsFault {
        KernelsOnly = ("kernels-only", "a capture leaves the staged copies out of the graph"),
        ReplayByLength = ("replay-by-length", "any held graph of as many operations replays"),
    }
}

impl Kernel for Graphs {
    fn name(&self) -> &'static str {
        "cuda.graphs"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::BitEqual(
            "a replayed sequence: the same bits as issuing it, with the data staged for this run; a sequence that \
             differs in any operation or argument is never replayed from another's graph",
        )
    }
    fn reference(&self) -> &'static str {
        "exact host f32 adds"
    }
    fn shapes(&self, _: Scale) -> Vec<String> {
        vec![format!("2 uploads of [{N}] + {ADDS} adds, run 4 times with new data, then a sequence of as many ops")]
    }
    type Fault = GraphsFault;
    fn gates(&self, _: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        // A device of its own: its graph cache and block cache start empty, a planted fault stays in it, and graphs
        // run in parts of 64 whatever TENSORFOLD_CUDA_GRAPHS / _GRAPH_OPS say (a part under 22 would split B).
        let be = match CudaBackend::new(self.0.ordinal()) {
            Ok(be) => be,
            Err(e) => return vec![Gate::new("open", false, format!("opening a second device handle: {e}"))],
        };
        if !be.force_graphs(64) {
            let why = "graphs cannot run here (TENSORFOLD_CUDA_PROFILE is set, or no page-locked arena)";
            return vec![Gate::new("replayed", false, why)];
        }
        match fault {
            Some(GraphsFault::KernelsOnly) => be.plant_graph_fault(GraphFault::KernelsOnly),
            Some(GraphsFault::ReplayByLength) => be.plant_graph_fault(GraphFault::ReplayByLength),
            _ => {}
        }
        let mut diffs = Vec::new();
        for b in [false, false, false, false, true] {
            let (x, y) = (uniform(rng, N), uniform(rng, N));
            diffs.push(bit_diffs(&sequence(&be, &x, &y, b), &reference(&x, &y, b)));
        }
        let (replays, captures) = be.graph_counts();
        let exercised = captures >= 1 && replays >= 2;
        vec![
            Gate::new(
                "reference",
                diffs.iter().all(|&d| d == 0),
                format!(
                    "values differing from the host, runs 1 to 4 of A (issued, captured, replayed twice), then B: {diffs:?}"
                ),
            ),
            Gate::new("replayed", exercised, format!("{captures} captured, {replays} replayed (at least 1 and 2)")),
            super::device_gate(&be),
        ]
    }
}
