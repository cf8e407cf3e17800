//! Splitting a reply's text at LFM2's tool-call markers as it arrives: text outside the markers is content,
//! released at once (but for a tail that may be the start of a marker written as plain text); text from
//! `<|tool_call_start|>` is held until `<|tool_call_end|>`, then read as a call list. A list that does not read
//! (or names a function that was not offered) is released as the text it was, markers included, never an error.
//! This is what vLLM's `lfm2` tool parser does in effect; the whole reply and the stream share this one reader.

use super::pyliteral::{RawCall, parse_calls};
use crate::protocol::{FunctionCall, ToolCall};

/// LFM2's opening marker (a special token of its tokenizer).
pub const CALL_START: &str = "<|tool_call_start|>";
/// LFM2's closing marker.
pub const CALL_END: &str = "<|tool_call_end|>";

/// What the splitter releases, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Out {
    /// Content text.
    Text(String),
    /// The calls of one marked list.
    Calls(Vec<ToolCall>),
}

/// The splitter of one reply.
#[derive(Clone, Debug)]
pub struct Splitter {
    /// The names a call may take (the offered tools).
    offered: Vec<String>,
    /// Text not released yet.
    held: String,
    /// Inside a marked list (after its opening marker).
    in_call: bool,
    /// Calls released so far.
    pub calls: usize,
}

impl Splitter {
    /// A splitter for a reply whose calls may name `offered`.
    pub fn new(offered: Vec<String>) -> Self {
        Self { offered, held: String::new(), in_call: false, calls: 0 }
    }

    /// Takes the next piece of text and returns what it releases.
    pub fn push(&mut self, text: &str) -> Vec<Out> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            if !self.in_call {
                if let Some(i) = self.held.find(CALL_START) {
                    push_text(&mut out, self.held[..i].to_string());
                    self.held.drain(..i + CALL_START.len());
                    self.in_call = true;
                    continue;
                }
                let keep = partial_marker(&self.held);
                let text: String = self.held.drain(..self.held.len() - keep).collect();
                push_text(&mut out, text);
                return out;
            }
            let Some(j) = self.held.find(CALL_END) else { return out };
            let body: String = self.held.drain(..j + CALL_END.len()).collect();
            self.in_call = false;
            match self.read(&body[..j]) {
                Some(calls) => out.push(Out::Calls(calls)),
                None => push_text(&mut out, format!("{CALL_START}{body}")),
            }
        }
    }

    /// Ends the reply: held text (an unclosed list, markers included) is content.
    pub fn finish(&mut self) -> Vec<Out> {
        let held = std::mem::take(&mut self.held);
        let text = if std::mem::take(&mut self.in_call) { format!("{CALL_START}{held}") } else { held };
        let mut out = Vec::new();
        push_text(&mut out, text);
        out
    }

    /// The calls of a list's text, or `None` when it does not read or names a function not offered.
    fn read(&mut self, body: &str) -> Option<Vec<ToolCall>> {
        let raw = parse_calls(body).ok()?;
        if raw.iter().any(|c| !self.offered.contains(&c.name)) {
            return None;
        }
        self.calls += raw.len();
        Some(raw.into_iter().map(openai_call).collect())
    }
}

fn push_text(out: &mut Vec<Out>, text: String) {
    if !text.is_empty() {
        out.push(Out::Text(text));
    }
}

/// Bytes at the end of `s` that are a proper prefix of [`CALL_START`] (held: the marker may be arriving as text).
fn partial_marker(s: &str) -> usize {
    (1..CALL_START.len())
        .rev()
        .find(|&n| s.len() >= n && s.is_char_boundary(s.len() - n) && CALL_START.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// An OpenAI tool call of a read call: a fresh id, the arguments as compact JSON text.
fn openai_call(c: RawCall) -> ToolCall {
    let arguments = serde_json::Value::Object(c.arguments).to_string();
    ToolCall { id: call_id(), kind: "function", function: FunctionCall { name: c.name, arguments } }
}

/// `call_` and 24 random alphanumerics (OpenAI's ids are `call_` and 24 characters).
pub fn call_id() -> String {
    use rand::Rng;
    let tail: String = rand::rng().sample_iter(rand::distr::Alphanumeric).take(24).map(char::from).collect();
    format!("call_{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pieces: &[&str]) -> (String, Vec<(String, String)>) {
        let mut s = Splitter::new(vec!["get_weather".into(), "now".into()]);
        let mut outs: Vec<Out> = pieces.iter().flat_map(|p| s.push(p)).collect();
        outs.extend(s.finish());
        let mut text = String::new();
        let mut calls = Vec::new();
        for o in outs {
            match o {
                Out::Text(t) => text += &t,
                Out::Calls(c) => calls.extend(c.into_iter().map(|c| (c.function.name, c.function.arguments))),
            }
        }
        (text, calls)
    }

    #[test]
    fn calls_as_the_released_templates_write_them() {
        // The LFM2 template's own example, a call then text.
        let r = "<|tool_call_start|>[get_weather(city=\"Paris\")]<|tool_call_end|>Checking the weather in Paris.";
        assert_eq!(
            split(&[r]),
            ("Checking the weather in Paris.".into(), vec![("get_weather".into(), r#"{"city":"Paris"}"#.into())])
        );
        // Text first, two calls, strings holding brackets, commas and escaped quotes, split across pieces.
        let pieces = [
            "Let me look. <|tool",
            "_call_start|>[get_weather(city='Saint-Denis, [FR] \\'92\\'', ",
            "days=[1, 2], opts={\"unit\": \"C\"}), now()]<|tool_call_end|>",
        ];
        let (text, calls) = split(&pieces);
        assert_eq!(text, "Let me look. ");
        assert_eq!(calls[0].1, r#"{"city":"Saint-Denis, [FR] '92'","days":[1,2],"opts":{"unit":"C"}}"#);
        assert_eq!(calls[1], ("now".into(), "{}".into()));
        // The JSON list form inside the same markers.
        let (_, calls) = split(&["<|tool_call_start|>[{\"name\": \"now\", \"arguments\": {}}]<|tool_call_end|>"]);
        assert_eq!(calls, vec![("now".into(), "{}".into())]);
    }

    #[test]
    fn what_does_not_read_is_text() {
        for r in [
            "<|tool_call_start|>[get_weather(city=)]<|tool_call_end|>",
            "<|tool_call_start|>[unknown_tool()]<|tool_call_end|>",
            "<|tool_call_start|>[get_weather(city='x')",
            "a <|tool_call_sta",
            "<|tool_call_end|> and < | >",
        ] {
            assert_eq!(split(&[r]), (r.to_string(), vec![]), "{r:?}");
        }
    }

    #[test]
    fn text_is_released_at_once_but_a_partial_marker_is_held() {
        let mut s = Splitter::new(vec!["now".into()]);
        assert_eq!(s.push("hello <|tool"), vec![Out::Text("hello ".into())]);
        assert_eq!(s.push("box|> é"), vec![Out::Text("<|toolbox|> é".into())]);
        assert_eq!(s.push("<|tool_call_start|>[now("), vec![]);
        assert!(matches!(&s.push(")]<|tool_call_end|>")[..], [Out::Calls(c)] if c[0].id.len() == 29));
        assert_eq!(s.calls, 1);
        assert_ne!(call_id(), call_id());
    }
}
