//! OpenAI stream chunks (SSE `data:` payloads) of completions and chat completions: a chunk per released piece, the
//! finish chunk with TensorFold's engine block, and the usage chunk (no choices) when `include_usage` asks for it.

use crate::protocol::replies::{ChatLogprobs, CompletionChoice, EngineStats, Usage};
use serde::Serialize;

/// A streamed completions chunk (OpenAI streams completions as `text_completion` objects; vLLM's
/// `CompletionStreamResponse`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionStreamResponse {
    /// The reply's id (the same in every chunk).
    pub id: String,
    /// `text_completion`.
    pub object: &'static str,
    /// Unix seconds (the same in every chunk).
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// One choice; none in the usage chunk.
    pub choices: Vec<CompletionChoice>,
    /// Token counts: only in the usage chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// TensorFold's engine block: only in the finish chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensorfold: Option<EngineStats>,
}

/// A streamed chat chunk (OpenAI's `ChatCompletionChunk`, `object: "chat.completion.chunk"`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatCompletionStreamResponse {
    /// The reply's id (the same in every chunk).
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds (the same in every chunk).
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// One choice; none in the usage chunk.
    pub choices: Vec<ChatStreamChoice>,
    /// Token counts: only in the usage chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// TensorFold's engine block: only in the finish chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensorfold: Option<EngineStats>,
}

/// The choice of a chat chunk.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatStreamChoice {
    /// Always 0 (`n` is 1).
    pub index: u32,
    /// What this chunk adds to the message.
    pub delta: DeltaMessage,
    /// This chunk's tokens' logprobs when asked for (`null` otherwise, and in the first and last chunks).
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length` in the finish chunk, `null` before.
    pub finish_reason: Option<&'static str>,
}

/// `delta`: the role in the first chunk (with empty content), text in the others, nothing in the finish chunk.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DeltaMessage {
    /// `assistant`, in the first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// The text this chunk adds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool calls this chunk adds (`crate::tools::stream`); left out when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<DeltaToolCall>>,
}

/// A streamed tool call (OpenAI's `ChoiceDeltaToolCall`): the first delta of a call carries its index in the
/// reply's call list, its id, type and name, with empty arguments; later deltas carry the index and a fragment of
/// the arguments' JSON text only (the official client joins the fragments of one index).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeltaToolCall {
    /// The call's place in the reply's list (0, 1, ...).
    pub index: usize,
    /// `call_<random>`, in the call's first delta only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, in the call's first delta only.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The name (first delta) and a fragment of the arguments' JSON text.
    pub function: DeltaFunction,
}

/// The function part of a streamed tool call.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeltaFunction {
    /// The function's name, in the call's first delta only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next fragment of the arguments' JSON text (empty in a first delta that has none yet).
    pub arguments: String,
}
