//! TensorFold lane core: requests into lanes, shared rounds (one forward over every stream's rows), keyed draws,
//! the prompt cache, memory admission and cancel; plus one request start to finish outside the engine thread
//! (`single`: the solo loop, the serial reference the shared rounds must equal, or the drafted request).
pub mod controls;
pub mod copies;
pub mod core;
mod drafted_request;
pub mod engine;
pub mod fake;
pub mod grammar;
pub mod keyed;
pub mod model_target;
pub mod penalties;
pub mod prompt_cache;
pub mod request;
pub mod schedule;
pub mod single;
pub mod solo;
pub mod target;
pub mod tool_bounds;
pub mod tool_grammar;

pub use crate::core::{Core, EngineConfig, Metrics};
pub use engine::{Engine, EngineHandle};
pub use grammar::{Grammar, GrammarError, GrammarSpec};
pub use model_target::ModelTarget;
pub use penalties::{Penalties, PenaltyError};
pub use request::{Event, FinishReason, Limits, Request, RequestId, Sink, Stats, SubmitError, TokenLogprobs};
pub use target::{Caps, DraftCall, Drafts, ForwardCall, SegOut, SegWant, Target};
