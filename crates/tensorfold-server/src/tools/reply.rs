//! Tool calls in the reply: a whole chat reply's text split into `content` and `tool_calls` (`finish_reason:
//! "tool_calls"` when any call was read), and a stream's pieces turned into content chunks and tool-call delta
//! chunks as OpenAI streams them: a call's first delta `{index, id, type, function: {name, arguments: ""}}` once
//! its name is read, then `{index, function: {arguments}}` fragments of its arguments' JSON text as they are read
//! (`super::live`), in order with the content around them.

use super::spec::ToolPlan;
use super::split::call_id;
use super::split::{Out, Splitter};
use crate::completion::LogprobEntry;
use crate::protocol::{DeltaFunction, DeltaToolCall, ToolCall};
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
            // A whole reply's splitter holds each list whole: it releases no stream deltas.
            Out::Start(_) | Out::Args(_) => {}
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
    /// Calls announced so far (the next call's `index`).
    sent: usize,
}

/// A piece's releases grouped in order: a run of content, or a run of call deltas.
enum Run {
    Text(String),
    Calls(Vec<DeltaToolCall>),
}

impl StreamTools {
    /// For a request whose tools are read (`None` otherwise: the stream is as without tools).
    pub fn new(plan: Option<&ToolPlan>) -> Option<Self> {
        plan.filter(|p| p.parses()).map(|p| Self { splitter: Splitter::live(p.names()), sent: 0 })
    }

    /// Whether any call was sent whole (its arguments closed; the finish chunk then says `tool_calls`).
    pub fn called(&self) -> bool {
        self.splitter.calls > 0
    }

    /// The chunks of one released piece: its content (with the piece's logprobs, when asked for) and the call
    /// deltas it released, in order.
    pub fn chunks(&mut self, shape: &Shape, text: &str, logprobs: Option<(&[LogprobEntry], usize)>) -> Vec<Chunk> {
        let outs = self.splitter.push(text);
        self.emit(shape, outs, logprobs)
    }

    /// The chunks of the held text at the reply's end.
    pub fn finish(&mut self, shape: &Shape) -> Vec<Chunk> {
        let outs = self.splitter.finish();
        self.emit(shape, outs, None)
    }

    /// `outs` as chunks, one a run; the piece's `logprobs` ride on its first chunk when that is content, else on
    /// an empty content chunk before it.
    fn emit(&mut self, shape: &Shape, outs: Vec<Out>, logprobs: Option<(&[LogprobEntry], usize)>) -> Vec<Chunk> {
        let mut runs: Vec<Run> = Vec::new();
        for o in outs {
            self.add(&mut runs, o);
        }
        let has_logprobs = logprobs.is_some_and(|(l, _)| !l.is_empty());
        if has_logprobs && !matches!(runs.first(), Some(Run::Text(_))) {
            runs.insert(0, Run::Text(String::new()));
        }
        let mut logprobs = logprobs.filter(|_| has_logprobs);
        runs.into_iter()
            .map(|r| match r {
                Run::Text(t) => shape.piece_chunk(t, logprobs.take()),
                Run::Calls(d) => shape.tool_calls_chunk(d),
            })
            .collect()
    }

    /// Adds one release to the runs: text joins a text run; a new call opens a delta; an argument fragment joins
    /// its call's last delta in the run, or opens one.
    fn add(&mut self, runs: &mut Vec<Run>, o: Out) {
        let fragment = |index, arguments| DeltaToolCall {
            index,
            id: None,
            kind: None,
            function: DeltaFunction { name: None, arguments },
        };
        let delta = match o {
            Out::Text(t) => {
                match runs.last_mut() {
                    Some(Run::Text(s)) => s.push_str(&t),
                    _ => runs.push(Run::Text(t)),
                }
                return;
            }
            Out::Start(name) => {
                self.sent += 1;
                let function = DeltaFunction { name: Some(name), arguments: String::new() };
                DeltaToolCall { index: self.sent - 1, id: Some(call_id()), kind: Some("function"), function }
            }
            Out::Args(a) => {
                if let Some(Run::Calls(d)) = runs.last_mut()
                    && let Some(last) = d.last_mut().filter(|l| l.index + 1 == self.sent)
                {
                    last.function.arguments.push_str(&a);
                    return;
                }
                fragment(self.sent.saturating_sub(1), a)
            }
            // A stream reads lists live; a whole list (not sent by the live splitter) is its calls in turn.
            Out::Calls(calls) => {
                for c in calls {
                    self.add(runs, Out::Start(c.function.name));
                    self.add(runs, Out::Args(c.function.arguments));
                }
                return;
            }
        };
        match runs.last_mut() {
            Some(Run::Calls(d)) => d.push(delta),
            _ => runs.push(Run::Calls(vec![delta])),
        }
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
            out_of_memory: false,
            draft_error: None,
            first_token_at: None,
            last_token_at: None,
        }
    }

    /// The calls of a stream's chunks as the official client accumulates them: by `index`, `id` and `name` from
    /// the first delta, argument fragments joined; deltas that would repeat an id or name are refused.
    fn accumulate(chunks: &[Value]) -> Vec<(String, Value)> {
        let mut calls: Vec<(String, Value)> = Vec::new();
        for d in chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten() {
            let i = d["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                let f = &d["function"];
                calls.push((d["id"].as_str().unwrap().into(), json!({"name": f["name"], "arguments": f["arguments"]})));
                continue;
            }
            assert!(d.get("id").is_none() && d["function"].get("name").is_none(), "{d}");
            let args =
                calls[i].1["arguments"].as_str().unwrap().to_string() + d["function"]["arguments"].as_str().unwrap();
            calls[i].1["arguments"] = json!(args);
        }
        calls
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
        let calls = accumulate(&chunks);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].1, json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}));
        assert_eq!(calls[1].1, json!({"name": "now", "arguments": "{}"}));
        assert!(calls.iter().all(|(id, _)| id.starts_with("call_") && id.len() == 29));
        // The call went out before its list closed: name first, then the arguments in fragments.
        let deltas: Vec<&Value> =
            chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
        assert_eq!(deltas[0]["function"], json!({"name": "get_weather", "arguments": "{\"city\":"}));
        assert_eq!((deltas[0]["type"].as_str(), deltas[1].get("id")), (Some("function"), None));
        assert_eq!(deltas[1]["function"], json!({"arguments": "\"Paris\"}"}));
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
