//! Collectives between the devices of one host (expert parallelism): the `Collective` trait, the contiguous expert
//! split, and the host stand-in that runs the same calls over CPU "ranks" (CI has no GPU).

use crate::backend::{Backend, KernelError};
use crate::cpu::CpuBackend;
use std::ops::Range;

/// Collectives over `world()` ranks, rank 0 first; rank `r`'s buffers live on rank `r`'s backend (the CUDA backend's
/// implementation is NCCL, `cuda::nccl`). Calls are stream-ordered on a device: a buffer may be used by the next
/// kernel of its rank at once.
pub trait Collective<B: Backend>: Send + Sync {
    /// Number of ranks (devices).
    fn world(&self) -> usize;
    /// Copies rank 0's `root` into `others[r - 1]` of every other rank (`ncclBroadcast`); all of `root.len()`
    /// elements. Errors: a length mismatch, or the device's.
    fn broadcast(&self, root: &B::Buf, others: &mut [&mut B::Buf]) -> Result<(), KernelError>;
    /// Rank 0's `root` becomes the elementwise sum of `root` and every `others[r - 1]` (`ncclReduce`, sum, to rank 0).
    /// The order of a sum over ranks is the library's; the MoE's use is exact in any order, since each element has
    /// at most one nonzero contributor. Errors: a length mismatch, or the device's.
    fn reduce_sum(&self, root: &mut B::Buf, others: &[&B::Buf]) -> Result<(), KernelError>;
    /// Whether every collective so far completed: called after a forward has read its results, so a collective that
    /// failed asynchronously (a peer lost mid-call) fails the forward instead of handing on what it left.
    /// Errors: [`KernelError::DeviceLost`].
    fn check(&self) -> Result<(), KernelError> {
        Ok(())
    }
    /// The watch its calls enter, when they are under a deadline (`crate::deadline::Watched`); the forward enters
    /// it too, so a device sync that never returns is caught as well.
    fn watch(&self) -> Option<std::sync::Arc<crate::deadline::DeviceWatch>> {
        None
    }
}

/// The experts each of `world` ranks owns: contiguous ranges, rank 0 first, the first `experts % world` ranks one
/// expert more. Errors when `world` is 0 or larger than `experts` (a rank would own none).
pub fn expert_ranges(experts: usize, world: usize) -> Result<Vec<Range<usize>>, String> {
    if world == 0 || world > experts {
        return Err(format!("{experts} experts cannot be split over {world} ranks (each rank owns at least one)"));
    }
    let (base, extra) = (experts / world, experts % world);
    let mut start = 0;
    Ok((0..world)
        .map(|r| {
            let n = base + usize::from(r < extra);
            start += n;
            start - n..start
        })
        .collect())
}

/// The host stand-in for CPU ranks: plain copies and sums in rank order, through the same calls the GPUs make to
/// NCCL (tests run the expert-parallel path at world sizes 1 to 3 with it).
#[derive(Clone, Copy, Debug)]
pub struct HostCollective {
    world: usize,
}

impl HostCollective {
    /// `world` CPU ranks (at least 1).
    pub fn new(world: usize) -> Self {
        Self { world: world.max(1) }
    }

    fn ranks(&self, others: usize) -> Result<(), KernelError> {
        if others + 1 == self.world {
            Ok(())
        } else {
            Err(KernelError::Shape { kernel: "collective", what: "ranks", got: others + 1, want: self.world })
        }
    }
}

impl Collective<CpuBackend> for HostCollective {
    fn world(&self) -> usize {
        self.world
    }

    fn broadcast(&self, root: &Vec<f32>, others: &mut [&mut Vec<f32>]) -> Result<(), KernelError> {
        self.ranks(others.len())?;
        for o in others.iter_mut() {
            same_len("broadcast", o.len(), root.len())?;
            o.copy_from_slice(root);
        }
        Ok(())
    }

    fn reduce_sum(&self, root: &mut Vec<f32>, others: &[&Vec<f32>]) -> Result<(), KernelError> {
        self.ranks(others.len())?;
        for o in others {
            same_len("reduce_sum", o.len(), root.len())?;
            root.iter_mut().zip(o.iter()).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }
}

fn same_len(kernel: &'static str, got: usize, want: usize) -> Result<(), KernelError> {
    if got == want { Ok(()) } else { Err(KernelError::Shape { kernel, what: "buffer", got, want }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_ranges_cover_every_expert_once_in_rank_order() {
        assert_eq!(expert_ranges(64, 2).unwrap(), vec![0..32, 32..64]);
        assert_eq!(expert_ranges(8, 3).unwrap(), vec![0..3, 3..6, 6..8]);
        assert_eq!(expert_ranges(5, 1).unwrap(), vec![0..5]);
        assert!(expert_ranges(4, 5).unwrap_err().contains("4 experts cannot be split over 5 ranks"));
        assert!(expert_ranges(4, 0).is_err());
    }

    #[test]
    fn the_host_stand_in_copies_sums_and_refuses_wrong_ranks_by_name() {
        let c = HostCollective::new(3);
        let root = vec![1.0, -2.0];
        let (mut a, mut b) = (vec![0.0; 2], vec![9.0; 2]);
        c.broadcast(&root, &mut [&mut a, &mut b]).unwrap();
        assert_eq!((a.clone(), b.clone()), (root.clone(), root.clone()));
        let mut r = vec![0.5, 0.0];
        c.reduce_sum(&mut r, &[&a, &vec![0.0, 1.0]]).unwrap();
        assert_eq!(r, vec![1.5, -1.0]);
        assert!(matches!(c.reduce_sum(&mut r, &[&a]), Err(KernelError::Shape { what: "ranks", .. })));
        assert!(matches!(c.broadcast(&root, &mut [&mut vec![0.0; 3], &mut b]), Err(KernelError::Shape { .. })));
    }
}
