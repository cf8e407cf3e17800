//! The OpenAI wire schema as serde types: requests as sent (`requests`), replies (`replies`) and stream chunks
//! (`chunks`). Names follow OpenAI's API reference and vLLM's `protocol.py`; validation is in `crate::api`.

pub mod chunks;
pub mod replies;
pub mod requests;

pub use chunks::{
    ChatCompletionStreamResponse, ChatStreamChoice, CompletionStreamResponse, DeltaFunction, DeltaMessage,
    DeltaToolCall,
};
pub use replies::{
    ChatChoice, ChatCompletionResponse, ChatLogprobToken, ChatLogprobs, ChatReplyMessage, CompletionChoice,
    CompletionLogprobs, CompletionResponse, DetokenizeResponse, EngineStats, ErrorInfo, ErrorResponse, FunctionCall,
    HealthResponse, ModelCard, ModelList, PromptTokensDetails, TokenizeResponse, ToolCall, TopLogprob, Usage,
};
pub use requests::{
    ChatCompletionRequest, ChatMessageParam, CompletionRequest, DetokenizeRequest, Field, Messages, PromptInput,
    RequestOptions, StopInput, StreamOptions, TokenizeRequest,
};
