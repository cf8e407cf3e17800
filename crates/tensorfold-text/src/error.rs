//! Why text could not be loaded, encoded, decoded or rendered: one error type for the whole crate.

use std::path::PathBuf;

/// Why text could not be loaded, encoded, decoded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A checkpoint file exists but could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The tokenizers library refused the tokenizer file or an encode/decode call.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// `tokenizer_config.json` or `chat_template.jinja` is malformed.
    #[error("{}: {message}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The checkpoint ships no chat template (neither `chat_template.jinja` nor a
    /// `chat_template` in `tokenizer_config.json`).
    #[error("the checkpoint has no chat template; send a raw prompt instead")]
    NoChatTemplate,
    /// The chat template failed to compile or render, or called `raise_exception`.
    #[error("chat template: {0}")]
    Template(String),
    /// The chat template ran out of its step budget (minijinja fuel): a loop too long for any prompt.
    #[error("chat template: over its step budget ({fuel} fuel); the template loops too long")]
    TemplateBudget {
        /// The budget it ran out of.
        fuel: u64,
    },
    /// The chat template ran past its wall-clock budget (`render_budget::TEMPLATE_DEADLINE`): steps each doing
    /// much work (hashing, comparing or printing large values), which fuel counts as one each.
    #[error("chat template: over its time budget ({limit_ms} ms); the template does too much work")]
    TemplateTime {
        /// The budget in milliseconds.
        limit_ms: u64,
    },
    /// The chat template's `range`s yielded more items than its budget (`render_budget::TEMPLATE_MAX_ITEMS`):
    /// ranges iterated, hashed or compared in a loop.
    #[error("chat template: its ranges yielded over {limit} items; the template loops too long")]
    TemplateItems {
        /// The budget in items.
        limit: u64,
    },
    /// The rendered chat template is over its size limit, or a format spec asked for a width past the limit.
    #[error("chat template: the rendered prompt is over its limit of {limit} bytes (or asks for a huge format width)")]
    TemplateTooLarge {
        /// The size limit in bytes.
        limit: usize,
    },
    /// The chat template's source is over its size limit (refused at open, before it is parsed).
    #[error("chat template: its source is {bytes} bytes, over the limit of {limit}")]
    TemplateSource {
        /// The source's length in bytes.
        bytes: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The chat template's render process (`render_pool`) ended or misbehaved: killed for memory (past its
    /// address-space limit, `render_worker::WORKER_ADDRESS_SPACE`), crashed, or wrote a malformed reply. The message
    /// says which. The template's doing (a server answers 400).
    #[error("chat template: {0}")]
    TemplateWorker(String),
    /// No render process (`render_pool`) could be started (the binary is gone, no processes or memory left): the
    /// host's fault, not the request's (a server answers 503).
    #[error("cannot start a chat-template render worker: {0}")]
    TemplateWorkerStart(String),
    /// The prompt text contributes no tokens.
    #[error("the prompt tokenizes to zero tokens")]
    EmptyPrompt,
    /// A token id past the vocabulary (including added tokens).
    #[error("token id {0} is not in the vocabulary")]
    UnknownToken(u32),
    /// A caller needs text but the checkpoint has no tokenizer.
    #[error("the checkpoint has no tokenizer.json; this command needs text")]
    NoTokenizer,
}
