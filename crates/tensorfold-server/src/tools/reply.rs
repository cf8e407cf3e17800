//! Tool calls in the reply: a whole chat reply's text split into `content` and `tool_calls` (`finish_reason:
//! "tool_calls"` when any call was read), and a stream's pieces turned into content chunks and tool-call delta
//! chunks (OpenAI's `delta.tool_calls[{index, id, type, function: {name, arguments}}]`, each call whole in one
//! delta once its list has closed, as vLLM's lfm2 parser releases them).

use super::spec::ToolPlan;
use super::split::{Out, Splitter};
use crate::completion::LogprobEntry;
use crate::protocol::{DeltaToolCall, ToolCall};
use crate::reply::{Chunk, Reply, Shape};

/// Reads the tool calls out of a whole chat reply (a completions reply, or one without calls, is unchanged).
/// Content is the text outside the call lists, `null` when only whitespace is left.
pub fn apply(reply: &mut Reply, plan: &ToolPlan) {
    let Reply::Chat(chat) = reply else { return };
    let Some(choice) = chat.choices.first_mut() else { return };
    let text = choice.message.content.take().unwrap_or_default();
    let mut s = Splitter::new(plan.names());
    let mut outs = s.push(&text);
    outs.extend(s.finish());
    let (mut content, mut calls) = (String::new(), Vec::<ToolCall>::new());
    for o in outs {
        match o {
            Out::Text(t) => content += &t,
            Out::Calls(c) => calls.extend(c),
        }
    }
    if calls.is_empty() {
        choice.message.content = Some(content);
        return;
    }
    choice.message.content = (!content.trim().is_empty()).then_some(content);
    choice.message.tool_calls = Some(calls);
    choice.finish_reason = "tool_calls";
}

/// A stream's tool-call reading.
pub struct StreamTools {
    splitter: Splitter,
    /// Calls sent so far (the next call's `index`).
    sent: usize,
}

impl StreamTools {
    /// For a request whose tools are read (`None` otherwise: the stream is as without tools).
    pub fn new(plan: Option<&ToolPlan>) -> Option<Self> {
        plan.filter(|p| p.parses()).map(|p| Self { splitter: Splitter::new(p.names()), sent: 0 })
    }

    /// Whether any call was sent (the finish chunk then says `tool_calls`).
    pub fn called(&self) -> bool {
        self.splitter.calls > 0
    }

    /// The chunks of one released piece: its content (with the piece's logprobs, when asked for) and any calls
    /// whose list it closed.
    pub fn chunks(&mut self, shape: &Shape, text: &str, logprobs: Option<(&[LogprobEntry], usize)>) -> Vec<Chunk> {
        let outs = self.splitter.push(text);
        self.emit(shape, outs, logprobs)
    }

    /// The chunks of the held text at the reply's end.
    pub fn finish(&mut self, shape: &Shape) -> Vec<Chunk> {
        let outs = self.splitter.finish();
        self.emit(shape, outs, None)
    }

    /// `outs` as chunks: the text first (one piece chunk, with `logprobs`), then one chunk per closed call list.
    fn emit(&mut self, shape: &Shape, outs: Vec<Out>, logprobs: Option<(&[LogprobEntry], usize)>) -> Vec<Chunk> {
        let mut text = String::new();
        let mut chunks = Vec::new();
        for o in outs {
            match o {
                Out::Text(t) => text += &t,
                Out::Calls(calls) => {
                    let deltas = calls
                        .into_iter()
                        .map(|c| {
                            self.sent += 1;
                            DeltaToolCall { index: self.sent - 1, id: c.id, kind: c.kind, function: c.function }
                        })
                        .collect();
                    chunks.push(shape.tool_calls_chunk(deltas));
                }
            }
        }
        let has_logprobs = logprobs.is_some_and(|(l, _)| !l.is_empty());
        if !text.is_empty() || has_logprobs {
            chunks.insert(0, shape.piece_chunk(text, logprobs));
        }
        chunks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::spec::ToolChoice;
    use serde_json::{Value, json};
    use tensorfold_engine::tool_grammar::ToolSpec;

    fn plan() -> ToolPlan {
        ToolPlan {
            functions: vec![],
            specs: ["get_weather", "now"].map(|n| ToolSpec { name: n.into(), parameters: Value::Null }).to_vec(),
            choice: ToolChoice::Auto,
            parallel: true,
            marker_ids: vec![],
        }
    }

    /// A finished reply's outcome (`stop`, one prompt token, nothing else).
    fn stopped_outcome() -> crate::completion::Outcome {
        crate::completion::Outcome {
            finish_reason: "stop",
            tokens: vec![],
            prompt_tokens: 1,
            cached_tokens: 0,
            seed: 0,
            drafted: 0,
            accepted: 0,
            windows: 0,
            accepted_at: vec![],
            error: None,
            stopped: false,
            draft_error: None,
            first_token_at: None,
            last_token_at: None,
        }
    }

    #[test]
    fn streamed_deltas_assemble_to_the_whole_reply() {
        let shape = Shape::new(true, "m".into());
        let mut st = StreamTools::new(Some(&plan())).unwrap();
        let pieces = [
            "Sure. ",
            "<|tool_call_start|>",
            "[get_weather(city=",
            "\"Paris\"), now()]",
            "<|tool_call_end|>",
            " Done.",
        ];
        let mut chunks: Vec<Value> = Vec::new();
        for p in pieces {
            chunks.extend(st.chunks(&shape, p, None).iter().map(|c| serde_json::from_str(&c.to_json()).unwrap()));
        }
        chunks.extend(st.finish(&shape).iter().map(|c| serde_json::from_str::<Value>(&c.to_json()).unwrap()));
        assert!(st.called());
        let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(content, "Sure.  Done.");
        let calls: Vec<&Value> =
            chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0]["index"].clone(), calls[1]["index"].clone()), (json!(0), json!(1)));
        assert_eq!(calls[0]["function"], json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}));
        assert_eq!(calls[1]["type"], "function");
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        // The whole reply of the same text: the same content and calls.
        let out = stopped_outcome();
        let mut r = shape.reply(pieces.concat(), None, &out);
        apply(&mut r, &plan());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(v["choices"][0]["message"]["content"], "Sure.  Done.");
        assert_eq!(v["choices"][0]["message"]["tool_calls"][1]["function"]["name"], "now");
    }

    #[test]
    fn a_reply_of_only_a_call_has_null_content_and_malformed_calls_stay_text() {
        let shape = Shape::new(true, "m".into());
        let out = stopped_outcome();
        let mut r = shape.reply("<|tool_call_start|>[now()]<|tool_call_end|>".into(), None, &out);
        apply(&mut r, &plan());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], Value::Null);
        let bad = "<|tool_call_start|>[now(]<|tool_call_end|>";
        let mut r = shape.reply(bad.into(), None, &out);
        apply(&mut r, &plan());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            (v["choices"][0]["message"]["content"].as_str(), v["choices"][0]["finish_reason"].as_str()),
            (Some(bad), Some("stop"))
        );
        assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    }
}
