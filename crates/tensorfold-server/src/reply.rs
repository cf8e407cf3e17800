//! Building one completion's OpenAI reply and stream chunks (`crate::protocol`) from what its life produced
//! (`crate::completion`): text pieces, logprobs, usage and the engine block, in the route's shape (chat or not).

use crate::completion::{LogprobEntry, Outcome, Piece};
use crate::protocol::{
    ChatChoice, ChatCompletionResponse, ChatCompletionStreamResponse, ChatLogprobToken, ChatLogprobs, ChatReplyMessage,
    ChatStreamChoice, CompletionChoice, CompletionLogprobs, CompletionResponse, CompletionStreamResponse, DeltaMessage,
    EngineStats, PromptTokensDetails, TopLogprob, Usage,
};
use serde::Serialize;
use serde_json::{Map, Value};
use tensorfold_engine::keyed::token_sha256;

/// A whole (not streamed) reply of either route.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Reply {
    /// `/v1/completions`.
    Completion(CompletionResponse),
    /// `/v1/chat/completions`.
    Chat(ChatCompletionResponse),
}

impl Reply {
    /// The first choice's finish reason (`tool_calls` once `tools::apply` read a call).
    pub fn finish_reason(&self) -> Option<&'static str> {
        match self {
            Reply::Completion(r) => r.choices.first().and_then(|c| c.finish_reason),
            Reply::Chat(r) => r.choices.first().map(|c| c.finish_reason),
        }
    }
}

/// A stream chunk of either route.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Chunk {
    /// `/v1/completions`.
    Completion(CompletionStreamResponse),
    /// `/v1/chat/completions`.
    Chat(ChatCompletionStreamResponse),
}

impl Chunk {
    /// The SSE `data:` payload.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a chunk has string keys only, so it always serializes")
    }
}

/// What identifies a reply in every chunk: the route's shape, the model, the id and the time.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// The chat route (else completions).
    pub chat: bool,
    /// The served model's name.
    pub model: String,
    /// `chatcmpl-<random>` or `cmpl-<random>`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Text prepended to every choice (`echo`; a stream sends it as its first chunk).
    pub echo: Option<String>,
}

impl Shape {
    /// A fresh reply's shape: a random id, created now.
    pub fn new(chat: bool, model: String) -> Self {
        let id = format!("{}-{}", if chat { "chatcmpl" } else { "cmpl" }, rand::random::<u64>());
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Self { chat, model, id, created, echo: None }
    }

    /// The same shape echoing `echo` before each choice's text.
    pub fn with_echo(self, echo: Option<String>) -> Self {
        Self { echo, ..self }
    }

    /// The whole reply: its text, the logprobs of its tokens (`None`: not asked for), and how it ended.
    pub fn reply(&self, text: String, logprobs: Option<&[LogprobEntry]>, out: &Outcome) -> Reply {
        let (id, created, model) = (self.id.clone(), self.created, self.model.clone());
        let (usage, tensorfold) = (usage(out), engine_stats(out));
        let text = match &self.echo {
            Some(e) => format!("{e}{text}"),
            None => text,
        };
        if self.chat {
            let choice = ChatChoice {
                index: 0,
                message: ChatReplyMessage { role: "assistant", content: Some(text), tool_calls: None },
                logprobs: logprobs.map(chat_logprobs),
                finish_reason: out.finish_reason,
            };
            let object = "chat.completion";
            return Reply::Chat(ChatCompletionResponse {
                id,
                object,
                created,
                model,
                choices: vec![choice],
                usage,
                tensorfold,
            });
        }
        let choice = CompletionChoice {
            index: 0,
            text,
            logprobs: logprobs.map(|l| completion_logprobs(l, 0)),
            finish_reason: Some(out.finish_reason),
        };
        let object = "text_completion";
        Reply::Completion(CompletionResponse { id, object, created, model, choices: vec![choice], usage, tensorfold })
    }

    /// The chat stream's first chunk (the assistant role, empty content); completions have one only to echo.
    pub fn first_chunk(&self) -> Option<Chunk> {
        if let (false, Some(e)) = (self.chat, &self.echo) {
            return Some(self.piece_chunk(e.clone(), None));
        }
        let delta = DeltaMessage { role: Some("assistant"), content: Some(String::new()), tool_calls: None };
        self.chat
            .then(|| self.chat_chunk(vec![ChatStreamChoice { index: 0, delta, logprobs: None, finish_reason: None }]))
    }

    /// A chunk of released text; `logprobs` (when asked for) are its tokens' and `offset` the text offset of the
    /// first (completions count offsets from the reply's start).
    pub fn piece_chunk(&self, text: String, logprobs: Option<(&[LogprobEntry], usize)>) -> Chunk {
        if self.chat {
            let delta = DeltaMessage { role: None, content: Some(text), tool_calls: None };
            let logprobs = logprobs.map(|(l, _)| chat_logprobs(l));
            return self.chat_chunk(vec![ChatStreamChoice { index: 0, delta, logprobs, finish_reason: None }]);
        }
        let logprobs = logprobs.map(|(l, offset)| completion_logprobs(l, offset));
        self.completion_chunk(vec![CompletionChoice { index: 0, text, logprobs, finish_reason: None }])
    }

    /// A chat chunk of whole tool calls (`crate::tools::stream`).
    pub fn tool_calls_chunk(&self, calls: Vec<crate::protocol::DeltaToolCall>) -> Chunk {
        let delta = DeltaMessage { role: None, content: None, tool_calls: Some(calls) };
        self.chat_chunk(vec![ChatStreamChoice { index: 0, delta, logprobs: None, finish_reason: None }])
    }

    /// The chunk that carries `finish_reason` and the engine block.
    pub fn finish_chunk(&self, out: &Outcome) -> Chunk {
        let finish_reason = Some(out.finish_reason);
        let mut chunk = if self.chat {
            let delta = DeltaMessage::default();
            self.chat_chunk(vec![ChatStreamChoice { index: 0, delta, logprobs: None, finish_reason }])
        } else {
            self.completion_chunk(vec![CompletionChoice {
                index: 0,
                text: String::new(),
                logprobs: None,
                finish_reason,
            }])
        };
        match &mut chunk {
            Chunk::Chat(c) => c.tensorfold = Some(engine_stats(out)),
            Chunk::Completion(c) => c.tensorfold = Some(engine_stats(out)),
        }
        chunk
    }

    /// The usage chunk (no choices), sent last when `stream_options.include_usage` asks for it.
    pub fn usage_chunk(&self, out: &Outcome) -> Chunk {
        let mut chunk = if self.chat { self.chat_chunk(Vec::new()) } else { self.completion_chunk(Vec::new()) };
        match &mut chunk {
            Chunk::Chat(c) => c.usage = Some(usage(out)),
            Chunk::Completion(c) => c.usage = Some(usage(out)),
        }
        chunk
    }

    fn chat_chunk(&self, choices: Vec<ChatStreamChoice>) -> Chunk {
        Chunk::Chat(ChatCompletionStreamResponse {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: None,
            tensorfold: None,
        })
    }

    fn completion_chunk(&self, choices: Vec<CompletionChoice>) -> Chunk {
        Chunk::Completion(CompletionStreamResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: None,
            tensorfold: None,
        })
    }
}

/// Chat logprobs of `lps`. Logprobs go out as f64 (the f32 widened), the JSON numbers replies always carried.
fn chat_logprobs(lps: &[LogprobEntry]) -> ChatLogprobs {
    let content = lps
        .iter()
        .map(|e| ChatLogprobToken {
            token: e.token.clone(),
            logprob: f64::from(e.logprob),
            bytes: e.bytes.clone(),
            top_logprobs: e
                .top
                .iter()
                .map(|(t, b, p)| TopLogprob { token: t.clone(), logprob: f64::from(*p), bytes: b.clone() })
                .collect(),
        })
        .collect();
    ChatLogprobs { content }
}

/// Completions logprobs of `lps`, whose first token starts at text offset `offset`.
fn completion_logprobs(lps: &[LogprobEntry], offset: usize) -> CompletionLogprobs {
    let mut at = offset;
    let text_offset = lps
        .iter()
        .map(|e| {
            let o = at;
            at += e.token.len();
            o
        })
        .collect();
    let top = |e: &LogprobEntry| -> Map<String, Value> {
        e.top.iter().map(|(t, _, p)| (t.clone(), Value::from(f64::from(*p)))).collect()
    };
    CompletionLogprobs {
        tokens: lps.iter().map(|e| e.token.clone()).collect(),
        token_logprobs: lps.iter().map(|e| f64::from(e.logprob)).collect(),
        top_logprobs: lps.iter().map(top).collect(),
        text_offset,
    }
}

pub(crate) fn usage(o: &Outcome) -> Usage {
    Usage {
        prompt_tokens: o.prompt_tokens,
        completion_tokens: o.tokens.len(),
        total_tokens: o.prompt_tokens + o.tokens.len(),
        prompt_tokens_details: PromptTokensDetails { cached_tokens: o.cached_tokens },
    }
}

pub(crate) fn engine_stats(o: &Outcome) -> EngineStats {
    EngineStats {
        token_sha256: token_sha256(&o.tokens),
        drafted: o.drafted,
        accepted: o.accepted,
        verify_windows: o.windows,
        accepted_by_position: o.accepted_at.clone(),
        mean_accepted_length: o.mean_accepted_length(),
        draft_error: o.draft_error.clone(),
        seed: o.seed,
    }
}

/// A stream's chunks of its released pieces, in order: content chunks, or the tool-call deltas of the stream's
/// [`crate::tools::StreamTools`], each with the logprobs of the tokens behind it (if asked) at their text offset in
/// the whole reply.
pub struct PieceChunks {
    logprobs: bool,
    offset: usize,
}

impl PieceChunks {
    /// For a stream that asked for logprobs (`logprobs`) or not.
    pub fn new(logprobs: bool) -> Self {
        Self { logprobs, offset: 0 }
    }

    /// The chunks of piece `p`.
    pub fn of(&mut self, shape: &Shape, tools: Option<&mut crate::tools::StreamTools>, p: Piece) -> Vec<Chunk> {
        let lp = self.logprobs.then_some((p.logprobs.as_slice(), self.offset));
        let chunks = match tools {
            Some(t) => t.chunks(shape, &p.text, lp),
            None => vec![shape.piece_chunk(p.text, lp)],
        };
        self.offset += p.logprobs.iter().map(|e| e.token.len()).sum::<usize>();
        chunks
    }
}
