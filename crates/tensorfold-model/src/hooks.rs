//! The fixed points where the layer loop calls out, as a struct of optional hooks: after each layer (the
//! drafter's taps), around each MoE layer's experts (expert parallelism), after the last layer (the drafter
//! absorbs its taps) and after the head (expert parallelism's collectives are checked). Without a drafter and on
//! one device every hook is `None` and the loop runs the layers alone.

use crate::drafter::Taps;
use crate::expert_parallel::ExpertParallel;
use crate::forward::{ForwardError, Model};
use crate::state::StreamState;
use tensorfold_kernels::{Backend, Segment};

/// One forward's hooks.
pub(crate) struct Hooks<'m, B: Backend> {
    /// After each layer: copies the rows of the layers the drafter taps; absorbed after the last layer.
    pub taps: Option<Taps<'m, B>>,
    /// Around each MoE layer's experts: routes on rank 0 and runs every rank's experts, in place of the fused
    /// one-device routing and experts.
    pub experts: Option<&'m ExpertParallel<B>>,
}

impl<'m, B: Backend> Hooks<'m, B> {
    /// The hooks `model` attaches to a forward of `rows` rows: taps with a drafter, experts with expert parallelism.
    pub(crate) fn of(model: &'m Model<B>, rows: usize) -> Self {
        Self { taps: model.drafter.as_ref().map(|d| Taps::new(d, rows, model.cfg.hidden)), experts: model.ep.as_ref() }
    }

    /// After layer `layer`'s last residual add: `x` is the residual stream `[rows, hidden]`.
    pub(crate) fn after_layer(&mut self, b: &B, layer: usize, x: &B::Buf) {
        if let Some(t) = &mut self.taps {
            t.after_layer(b, layer, x);
        }
    }

    /// After the last layer, before the states advance: the drafter absorbs its taps into each stream's context.
    pub(crate) fn after_layers(
        &mut self,
        b: &B,
        segs: &[Segment],
        states: &mut [&mut StreamState<B>],
    ) -> Result<(), ForwardError> {
        match self.taps.take() {
            Some(t) => Ok(t.absorb(b, segs, states)?),
            None => Ok(()),
        }
    }

    /// After the head (`head_ran`: it had rows to serve), with `x` the final residual stream `[rows, hidden]`.
    pub(crate) fn after_head(&self, b: &B, x: &B::Buf, hidden: usize, head_ran: bool) -> Result<(), ForwardError> {
        match self.experts {
            Some(ep) => ep.after_head(b, x, hidden, head_ran),
            None => Ok(()),
        }
    }
}
