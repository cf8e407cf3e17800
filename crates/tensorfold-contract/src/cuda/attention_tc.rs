//! CUDA contract entry of causal attention on the tensor cores (attention_mma.cu, the tensor-core mode): the float64 reference under its stated bound, tiles of many rows bit-equal to one-row calls at widths up to 128, and its planted controls.

use super::attention::{CLAIM_TC, attn_shape, causal_gates};
use super::{Planted, TensorCoresOn, limits, with_fault};
use crate::{Claim, Entry, Gate, Kernel, Scale};
use rand::rngs::StdRng;
use tensorfold_kernels::cuda::{CudaBackend, Src};

pub fn kernels(be: &CudaBackend) -> Vec<Box<dyn Entry>> {
    vec![Box::new(AttentionTc(be.clone()))]
}

/// Call widths of the invariance gate: the shared widths and 64 and 128, where every stream's segment spans several
/// tiles (a tile holds 64 (row, head) pairs: 16 rows at the 4 query heads a KV head of both shapes).
const TC_WIDTHS: [usize; 8] = [1, 2, 3, 8, 16, 33, 64, 128];

struct AttentionTc(CudaBackend);

pub(super) const ATTN_TC_PLANTS: &[Planted<AttentionTcFault>] = &[
    (AttentionTcFault::DroppedPieces, Src::Attention, "FAULT_ATTN_MMA_DROP_LO"),
    (AttentionTcFault::SplitByCount, Src::Attention, "FAULT_ATTN_MMA_SPLIT_COUNT"),
    (AttentionTcFault::RowMix, Src::Attention, "FAULT_ATTN_MMA_ROW"),
    (AttentionTcFault::SplitSum, Src::Attention, "FAULT_ATTN_MMA_SPLIT_SUM"),
];

faults! {
    /// The planted controls of `cuda.attention_tc`.
    enum AttentionTcFault {
        DroppedPieces = ("dropped-pieces", "q, k, p and v enter the tensor cores as one bf16 piece (lo and lo2 dropped)"),
        SplitByCount = (
            "split-by-count",
            "a chunk's keys are cut into 4 sub-blocks by the tile's key count, not into 64-key sub-blocks by position",
        ),
        RowMix = ("row-mix", "an M row of the mmas reads the next (row, head) pair's query"),
        SplitSum = (
            "split-sum",
            "a tile of at most 16 (row, head) pairs (decode) sums its probabilities by key group in reverse",
        ),
    }
}

impl Kernel for AttentionTc {
    fn name(&self) -> &'static str {
        "cuda.attention_tc"
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn claim(&self) -> Claim {
        Claim::Bound(CLAIM_TC)
    }
    fn reference(&self) -> &'static str {
        "float64 causal GQA softmax attention of each row over its own stream's keys [0, pos]"
    }
    fn shapes(&self, scale: Scale) -> Vec<String> {
        let (h, kv, hd, keys, long) = attn_shape(scale, true);
        vec![format!(
            "{h} heads, {kv} KV heads of {hd}; 4 streams holding {keys:?} keys, widths {TC_WIDTHS:?}; one stream of {long} keys"
        )]
    }
    type Fault = AttentionTcFault;
    fn gates(&self, scale: Scale, fault: Option<Self::Fault>, rng: &mut StdRng) -> Vec<Gate> {
        let be = with_fault(&self.0, ATTN_TC_PLANTS, fault);
        let _tc = TensorCoresOn::new(&be, true);
        causal_gates(&be, scale, rng, &TC_WIDTHS, true)
    }
    fn limits(&self) -> Vec<String> {
        limits(&self.0, Src::Attention, &["kv_append", "attn_mma", "attn_mma_few", "attn_combine"])
    }
}
