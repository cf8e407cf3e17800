//! The CUDA kernel sources: one module a `.cu` file, shipped with its planted-fault blocks stripped or whole.

const COMMON: &str = include_str!("../common.cuh");

/// A kernel source: one `.cu` file of `cuda/`, compiled as its own module after `common.cuh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Src {
    /// `rows.cu`: embed, rmsnorm, add, gather, greedy.
    Rows,
    /// `dense.cu` then `dense_tc.cu` and `dense_tcw.cu`: linear (CUDA cores and tensor cores), SwiGLU gate-up, MoE expert tiles.
    Dense,
    /// `rope.cu`: q/k norm and rotary embedding.
    Rope,
    /// `attention.cu` then `attention_tiled.cu` and `attention_mma.cu`: K/V append, chunked attention (per row, tiled,
    /// on the tensor cores).
    Attention,
    /// `conv.cu`: the short conv.
    Conv,
    /// `moe.cu`: routing, plan, combine.
    Moe,
    /// `sample.cu`: the keyed draw.
    Sample,
}

impl Src {
    /// Every module, in load order.
    pub const ALL: [Src; 7] = [Src::Rows, Src::Dense, Src::Rope, Src::Attention, Src::Conv, Src::Moe, Src::Sample];

    /// Module name (the file stem).
    pub fn name(self) -> &'static str {
        match self {
            Src::Rows => "rows",
            Src::Dense => "dense",
            Src::Rope => "rope",
            Src::Attention => "attention",
            Src::Conv => "conv",
            Src::Moe => "moe",
            Src::Sample => "sample",
        }
    }

    /// The shipped module text: the `.cu` file (Dense: with `dense_tc.cu` and `dense_tcw.cu` after it; Attention:
    /// with `attention_tiled.cu` and `attention_mma.cu`) with its planted-fault blocks stripped at build time (build.rs,
    /// `strip.rs`), so what production compiles carries no fault.
    fn body(self) -> &'static str {
        match self {
            Src::Rows => include_str!(concat!(env!("OUT_DIR"), "/shipped/rows.cu")),
            Src::Dense => include_str!(concat!(env!("OUT_DIR"), "/shipped/dense.cu")),
            Src::Rope => include_str!(concat!(env!("OUT_DIR"), "/shipped/rope.cu")),
            Src::Attention => include_str!(concat!(env!("OUT_DIR"), "/shipped/attention.cu")),
            Src::Conv => include_str!(concat!(env!("OUT_DIR"), "/shipped/conv.cu")),
            Src::Moe => include_str!(concat!(env!("OUT_DIR"), "/shipped/moe.cu")),
            Src::Sample => include_str!(concat!(env!("OUT_DIR"), "/shipped/sample.cu")),
        }
    }

    /// The text NVRTC compiles: `common.cuh` then the module (its planted-fault blocks stripped).
    pub fn source(self) -> String {
        format!("{COMMON}\n{}", self.body())
    }

    /// The whole `.cu` file, its `FAULT_*` blocks included (the contract's planted builds).
    #[cfg(feature = "planted-faults")]
    fn planted_body(self) -> &'static str {
        match self {
            Src::Rows => include_str!("../rows.cu"),
            Src::Dense => concat!(
                include_str!("../dense.cu"),
                "\n",
                include_str!("../dense_tc.cu"),
                "\n",
                include_str!("../dense_tcw.cu")
            ),
            Src::Rope => include_str!("../rope.cu"),
            Src::Attention => concat!(
                include_str!("../attention.cu"),
                "\n",
                include_str!("../attention_tiled.cu"),
                "\n",
                include_str!("../attention_mma.cu")
            ),
            Src::Conv => include_str!("../conv.cu"),
            Src::Moe => include_str!("../moe.cu"),
            Src::Sample => include_str!("../sample.cu"),
        }
    }

    /// The text a planted build compiles (with a `-DFAULT_*` define): `common.cuh` then the whole module.
    #[cfg(feature = "planted-faults")]
    pub fn planted_source(self) -> String {
        format!("{COMMON}\n{}", self.planted_body())
    }

    /// The text compiled for `define`: `source` without one, `planted_source` with one (the contract's builds only).
    pub(super) fn source_for(self, define: Option<&'static str>) -> String {
        match define {
            #[cfg(feature = "planted-faults")]
            Some(_) => self.planted_source(),
            _ => self.source(),
        }
    }
}
