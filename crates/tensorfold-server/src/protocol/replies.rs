//! OpenAI reply bodies: completions and chat completions (with usage, logprobs and TensorFold's engine block), the
//! model list, tokenize and detokenize, health, and the error object. Field order is the wire order (clients and
//! the tests read these bodies as JSON; the order matches what OpenAI and vLLM send).

use serde::Serialize;
use serde_json::{Map, Value};

/// `POST /v1/completions`, not streamed (OpenAI's `Completion`, `object: "text_completion"`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionResponse {
    /// `cmpl-<random>`.
    pub id: String,
    /// `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// One choice.
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    pub usage: Usage,
    /// TensorFold's extension: the token hash, draft counters and seed.
    pub tensorfold: EngineStats,
}

/// A completion choice (also each streamed chunk's choice).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionChoice {
    /// Always 0 (`n` is 1).
    pub index: u32,
    /// The text (of this chunk, when streamed).
    pub text: String,
    /// Logprobs when asked for (`null` otherwise).
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length`; `null` in a chunk before the last.
    pub finish_reason: Option<&'static str>,
}

/// Completions logprobs: four parallel lists, one entry a token.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's logprob.
    pub token_logprobs: Vec<f64>,
    /// Each token's alternatives: text -> logprob (two alternatives with one text keep the first's place and the
    /// later's logprob).
    pub top_logprobs: Vec<Map<String, Value>>,
    /// Each token's byte offset in the reply's text.
    pub text_offset: Vec<usize>,
}

/// `POST /v1/chat/completions`, not streamed (OpenAI's `ChatCompletion`, `object: "chat.completion"`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatCompletionResponse {
    /// `chatcmpl-<random>`.
    pub id: String,
    /// `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// One choice.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
    /// TensorFold's extension: the token hash, draft counters and seed.
    pub tensorfold: EngineStats,
}

/// A chat choice.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatChoice {
    /// Always 0 (`n` is 1).
    pub index: u32,
    /// The assistant's message.
    pub message: ChatReplyMessage,
    /// Logprobs when asked for (`null` otherwise).
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length`.
    pub finish_reason: &'static str,
}

/// The reply message of a chat choice.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatReplyMessage {
    /// `assistant`.
    pub role: &'static str,
    /// The reply's text (`null` when the reply is only tool calls, as OpenAI sends it).
    pub content: Option<String>,
    /// The tool calls parsed from the reply (`crate::tools`); left out when there are none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One parsed tool call (OpenAI's `ChatCompletionMessageToolCall`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolCall {
    /// `call_<24 random alphanumerics>`, unique in practice.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function named and its arguments.
    pub function: FunctionCall,
}

/// The function of a tool call.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionCall {
    /// The offered function's name.
    pub name: String,
    /// The arguments as JSON text (an object).
    pub arguments: String,
}

/// Chat logprobs: one entry a token.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatLogprobs {
    /// The tokens of the reply (of this chunk, when streamed).
    pub content: Vec<ChatLogprobToken>,
}

/// One token's chat logprobs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatLogprobToken {
    /// The token's text.
    pub token: String,
    /// Its logprob.
    pub logprob: f64,
    /// Its text's UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The alternatives, most likely first.
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative token of chat logprobs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its logprob.
    pub logprob: f64,
    /// Its text's UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// `usage`: token counts of a reply.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// What of the prompt was cached.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens reused from the prompt cache.
    pub cached_tokens: usize,
}

/// `tensorfold`: TensorFold's extension block of a reply (the last chunk, when streamed).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EngineStats {
    /// SHA-256 of the committed token ids (hex), the reply's identity across runs.
    pub token_sha256: String,
    /// Draft tokens verified.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Verify windows that carried drafts.
    pub verify_windows: usize,
    /// Windows whose draft k was accepted, by position k.
    pub accepted_by_position: Vec<usize>,
    /// Committed tokens per verify window with drafts (0 without drafts).
    pub mean_accepted_length: f64,
    /// The drafter's error, if it failed for this reply (the reply then finished without drafts).
    pub draft_error: Option<String>,
    /// The seed every draw was keyed by.
    pub seed: u64,
}

/// `GET /v1/models` (OpenAI's list object).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelList {
    /// `list`.
    pub object: &'static str,
    /// The one served model.
    pub data: Vec<ModelCard>,
}

/// One model of `/v1/models` (OpenAI's `Model`, with vLLM's `max_model_len`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelCard {
    /// The served name.
    pub id: String,
    /// `model`.
    pub object: &'static str,
    /// Unix seconds the server started.
    pub created: u64,
    /// `tensorfold`.
    pub owned_by: &'static str,
    /// The context limit in tokens (`null` while loading).
    pub max_model_len: Option<usize>,
}

/// `POST /tokenize` (vLLM's `TokenizeResponse`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenizeResponse {
    /// The token ids.
    pub tokens: Vec<u32>,
    /// How many.
    pub count: usize,
    /// The context limit in tokens.
    pub max_model_len: usize,
}

/// `POST /detokenize` (vLLM's `DetokenizeResponse`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DetokenizeResponse {
    /// The text of the ids.
    pub prompt: String,
}

/// `GET /health`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HealthResponse {
    /// `ok`, `loading` or `engine stopped`.
    pub status: &'static str,
}

/// An error reply (OpenAI's `{"error": {...}}`; also the last event of a stream that failed).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorResponse {
    /// What went wrong.
    pub error: ErrorInfo,
}

/// The error object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorInfo {
    /// Human-readable message.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, `not_found_error`, ...).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, ...), if any.
    pub code: Option<&'static str>,
}
