//! TensorFold lane core: requests into lanes, shared rounds (one forward over every stream's rows), the
//! keyed sampler, the prompt cache, memory admission and cancel; plus the solo loop, the serial reference
//! the shared rounds must equal.
pub mod core;
pub mod drafted;
pub mod drafts;
pub mod engine;
pub mod fake;
pub mod prompt_cache;
pub mod request;
pub mod sampler;
pub mod schedule;
pub mod solo;
pub mod target;

pub use crate::core::{Core, EngineConfig, Metrics};
pub use engine::{Engine, EngineHandle};
pub use request::{Event, FinishReason, Request, RequestId, Sink, Stats, SubmitError, TokenLogprobs};
pub use target::{ModelTarget, SegOut, SegWant, Target};
