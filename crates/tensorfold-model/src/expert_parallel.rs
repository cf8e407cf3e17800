//! Expert parallelism: a MoE model's experts split over the devices of one host, the MoE layer run as routing on
//! rank 0, each rank's own experts, and a rank-order combine on rank 0, with a broadcast and a sum between them.
//!
//! Rank 0 holds every other layer, the KV caches and conv states; ranks past 0 hold only their experts. A MoE layer:
//! rank 0 routes (`sel`, `wts`), broadcasts the normed rows and `sel`, every rank writes its experts' outputs of
//! every assignment into `y` (+0 where it owns none), the ranks' `y` are summed into rank 0's, which combines. Each
//! element of the sum has exactly one nonzero contributor, so the sum is exact in any order, and the combine
//! starts from +0 in rank order as on one device: N-device output equals one-device output bit for bit, and a row's
//! bits still depend only on the row (docs/architecture.md).

use crate::checkpoint::{Source, TensorTable};
use crate::forward::{ForwardError, Model};
use crate::layers::Cx;
use crate::layers::moe::{Moe, Routed};
use crate::load::{Loaded, OpenError};
use crate::weights::{LayerExperts, bind_experts_only};
use std::ops::Range;
use tensorfold_kernels::backend::Ffn;
use tensorfold_kernels::{Backend, Collective, MoeParams, expert_ranges};

/// A rank past 0: its device and its experts.
pub struct Rank<B: Backend> {
    /// The rank's device.
    pub backend: B,
    /// Its experts of each layer, in layer order (`None` for a dense layer).
    pub experts: LayerExperts<B>,
}

/// The ranks past 0 and the collectives between all ranks.
pub struct ExpertParallel<B: Backend> {
    /// Experts each rank owns, rank 0 first (contiguous, [`expert_ranges`]); the same in every MoE layer.
    pub ranges: Vec<Range<usize>>,
    /// Ranks 1.. (rank 0 is the model's own backend).
    pub ranks: Vec<Rank<B>>,
    /// Broadcast and sum over all ranks (NCCL on GPUs, the host stand-in on CPU ranks).
    pub comm: Box<dyn Collective<B>>,
}

impl<B: Backend> Model<B> {
    /// Devices this model runs on (1 without expert parallelism).
    pub fn world(&self) -> usize {
        self.ep.as_ref().map_or(1, |e| e.ranges.len())
    }

    /// Bytes of weights on each device, rank 0 first.
    pub fn weight_bytes_by_rank(&self) -> Vec<usize> {
        let mut v = vec![self.weight_bytes()];
        for r in self.ep.iter().flat_map(|e| &e.ranks) {
            let b = &r.backend;
            v.push(
                r.experts
                    .iter()
                    .flatten()
                    .flatten()
                    .map(|f| b.mat_bytes(&f.w1) + b.mat_bytes(&f.w3) + b.mat_bytes(&f.w2))
                    .sum(),
            );
        }
        v
    }

    /// Device memory high-water marks (allocated, reserved) of each device, rank 0 first (`None` on the host).
    pub fn memory_high_by_rank(&self) -> Vec<Option<(usize, usize)>> {
        std::iter::once(self.backend.memory_high())
            .chain(self.ep.iter().flat_map(|e| &e.ranks).map(|r| r.backend.memory_high()))
            .collect()
    }
}

impl<B: Backend> ExpertParallel<B> {
    /// The forward's experts hook ([`crate::hooks::Hooks::experts`]): MoE layer `moe.layer` over `x`
    /// `[rows, hidden]` up to its combine, as one device's fused routing and experts would run it: route on rank 0
    /// into `r.sel` and `r.wts`, then every rank's experts into `r.y`. Errors: a kernel's or a collective's.
    pub(crate) fn route_experts(
        &self,
        cx: &Cx<'_, B>,
        x: &B::Buf,
        moe: &Moe<'_, B>,
        p: MoeParams,
        r: &mut Routed<B>,
    ) -> Result<(), ForwardError> {
        let (b, rows) = (cx.b, cx.rows);
        let total = cx.cfg.moe.as_ref().map_or(0, |c| c.experts);
        b.moe_route(x, rows, moe.gate, moe.bias, p, &mut r.sel, &mut r.wts)?;
        self.experts(b, (x, &r.sel), (rows, r.k, total, cx.cfg.hidden), moe.layer, moe.experts, &mut r.y)
    }

    /// The forward's after-head hook: the collectives of the call are checked before its logits count (a collective
    /// that failed on the way fails the call: its results may be garbage). Where no head ran (`head_ran` false:
    /// prompt chunks before their last), one value of `x` `[rows, hidden]` is read first to wait for them.
    pub(crate) fn after_head(&self, b0: &B, x: &B::Buf, hidden: usize, head_ran: bool) -> Result<(), ForwardError> {
        if !head_ran {
            b0.read(&b0.gather_rows(x, hidden, &[0]));
        }
        self.comm.check()?;
        Ok(())
    }

    /// Every rank's experts of `layer` over the assignments `sel` of rows `x` into rank 0's `y` (`rank0` are rank 0's
    /// experts): broadcast `x` and `sel`, each rank's `moe_experts`, then the sum into `y`.
    fn experts(
        &self,
        b0: &B,
        (x, sel): (&B::Buf, &B::Buf),
        (rows, k, total, h): (usize, usize, usize, usize),
        layer: usize,
        rank0: &[Ffn<B::Mat>],
        y: &mut B::Buf,
    ) -> Result<(), ForwardError> {
        let mut xs: Vec<B::Buf> = self.ranks.iter().map(|r| r.backend.scratch(rows * h)).collect();
        let mut sels: Vec<B::Buf> = self.ranks.iter().map(|r| r.backend.scratch(rows * k)).collect();
        self.comm.broadcast(x, &mut xs.iter_mut().collect::<Vec<_>>())?;
        self.comm.broadcast(sel, &mut sels.iter_mut().collect::<Vec<_>>())?;
        b0.moe_experts(x, rows, sel, k, rank0, self.ranges[0].start, total, y)?;
        let mut ys = Vec::with_capacity(self.ranks.len());
        for (i, r) in self.ranks.iter().enumerate() {
            let owned = r.experts.get(layer).and_then(|e| e.as_deref()).unwrap_or(&[]);
            let mut yr = r.backend.scratch(rows * k * h);
            r.backend.moe_experts(&xs[i], rows, &sels[i], k, owned, self.ranges[i + 1].start, total, &mut yr)?;
            ys.push(yr);
        }
        self.comm.reduce_sum(y, &ys.iter().collect::<Vec<_>>())?;
        Ok(())
    }
}

/// Opens a MoE checkpoint with its experts split over `backends` (rank 0 first; [`expert_ranges`]): rank 0 binds
/// every other tensor and its experts, each other rank only its experts. `comm` spans the same devices in the same
/// order. A dense model on one rank opens plainly. Errors: [`OpenError::ExpertParallel`] for a dense model on several
/// ranks, more ranks than experts, or a `comm` of another size; otherwise as [`crate::open`].
pub fn open_expert_parallel<B: Backend>(
    src: &Source,
    mut backends: Vec<B>,
    comm: Box<dyn Collective<B>>,
) -> Result<Loaded<B>, OpenError> {
    let cfg = crate::load::read_config(src)?;
    if cfg.moe.is_none() && backends.len() == 1 && comm.world() == 1 {
        // One rank of a dense model: nothing to split, the plain model.
        let table = TensorTable::open(src)?;
        return crate::load::open_table(src, cfg, &table, backends.remove(0), 0..usize::MAX);
    }
    let experts = cfg.moe.as_ref().map(|m| m.experts).ok_or_else(|| {
        OpenError::ExpertParallel("the model has no MoE layers, so there are no experts to split".into())
    })?;
    if comm.world() != backends.len() {
        return Err(OpenError::ExpertParallel(format!(
            "{} devices but a collective over {}",
            backends.len(),
            comm.world()
        )));
    }
    let ranges = expert_ranges(experts, backends.len()).map_err(OpenError::ExpertParallel)?;
    let table = TensorTable::open(src)?;
    // Before any rank binds its experts (open_table checks rank 0 again, which costs nothing).
    if cfg.layers.contains(&crate::config::Mixer::Attention) {
        let b = backends.first().expect("one backend at least: expert_ranges refused 0");
        b.check_attention(cfg.heads, cfg.kv_heads, cfg.head_dim).map_err(OpenError::Unserved)?;
    }
    let rest = backends.split_off(1);
    let ranks = rest
        .into_iter()
        .zip(&ranges[1..])
        .map(|(backend, r)| {
            let experts = bind_experts_only(&cfg, &table, &backend, r.clone())?;
            Ok(Rank { backend, experts })
        })
        .collect::<Result<Vec<_>, OpenError>>()?;
    let rank0 = backends.pop().expect("one backend at least: expert_ranges refused 0");
    let mut loaded = crate::load::open_table(src, cfg, &table, rank0, ranges[0].clone())?;
    // One watch for the collective's calls and the forwards around them: the deadline is on the whole wait.
    if let Some(w) = comm.watch() {
        loaded.model.watch = w;
    }
    loaded.model.ep = Some(ExpertParallel { ranges, ranks, comm });
    Ok(loaded)
}
