//! TensorFold model side: checkpoints, config admission, text files (read with `tensorfold-text`), and the LFM2 /
//! LFM2-MoE forward.
pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod config_bounds;
pub mod drafter;
pub mod exact;
pub mod expert_parallel;
pub mod forward;
mod hooks;
pub mod layers;
pub mod load;
pub mod quant;
pub mod state;
pub mod synthetic;
mod watch;
pub mod weights;

pub use batch::{Batch, HeldIds};
pub use checkpoint::Source;
pub use config::{Family, Mixer, ModelConfig};
pub use drafter::{DraftBatch, DraftOut, Drafts};
pub use expert_parallel::open_expert_parallel;
pub use forward::{ForwardError, ForwardOut, LogitRows, Model, RowWant, StreamState};
pub use load::{Loaded, OpenError, open, summarize};
