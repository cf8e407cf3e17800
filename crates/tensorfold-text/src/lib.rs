//! TensorFold text: a checkpoint's tokenizer (`tokenizer`), chat messages and template (`chat_template`), and the
//! incremental detokenizer (`detokenizer`), with their one error type (`error`). Used by the model crate when it
//! opens a checkpoint, and by the server and the CLI without the model.

pub mod chat_template;
mod content_tokens;
pub mod detokenizer;
pub mod error;
pub mod grammar_env;
pub mod render_budget;
pub mod render_pool;
mod render_wire;
pub mod render_worker;
pub mod template_compat;
pub mod template_limits;
mod template_render;
mod tojson;
pub mod tokenizer;

pub use chat_template::{ChatMessage, ContentPart, MessageContent};
pub use detokenizer::Detokenizer;
pub use error::TextError;
pub use grammar_env::GrammarEnv;
pub use tokenizer::Text;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bounds;
#[cfg(test)]
mod tests_budget;
#[cfg(test)]
mod tests_fuzz;
#[cfg(test)]
mod tests_tools;
#[cfg(test)]
mod tests_worker;
