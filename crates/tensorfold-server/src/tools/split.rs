//! Splitting a reply's text at LFM2's tool-call markers as it arrives: text outside the markers is content,
//! released at once (but for a tail that may be the start of a marker written as plain text). The whole reply
//! holds a list from `<|tool_call_start|>` until `<|tool_call_end|>`, then reads it; a list that does not read (or
//! names a function that was not offered) is released as the text it was, markers included, never an error (what
//! vLLM's `lfm2` tool parser does in effect). A stream reads the list as it arrives (`live`): a call goes out once
//! its name is read, its arguments in fragments; a list that fails before any call went out is text as in the
//! whole reply, one that fails later keeps the calls sent and releases the rest of its text as content.

use super::live::{Failed, Frag, ListReader};
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
    /// The calls of one marked list (the whole reply).
    Calls(Vec<ToolCall>),
    /// A stream's next call, of this function.
    Start(String),
    /// More of the stream's latest call's arguments.
    Args(String),
}

/// Where the splitter is.
#[derive(Clone, Debug)]
enum Inside {
    /// Outside a list.
    Text,
    /// In a list held whole.
    Held,
    /// In a list read as it arrives.
    Live(Box<ListReader>),
    /// In a list that failed: its text runs to the closing marker.
    Failed,
}

/// The splitter of one reply.
#[derive(Clone, Debug)]
pub struct Splitter {
    /// The names a call may take (the offered tools).
    offered: Vec<String>,
    /// Read lists as they arrive (a stream).
    live: bool,
    /// Text not released yet.
    held: String,
    inside: Inside,
    /// Calls whose arguments closed: read in whole lists, or closed in a stream.
    pub calls: usize,
}

impl Splitter {
    /// A splitter for a whole reply whose calls may name `offered`.
    pub fn new(offered: Vec<String>) -> Self {
        Self { offered, live: false, held: String::new(), inside: Inside::Text, calls: 0 }
    }

    /// A splitter for a stream: lists read as they arrive.
    pub fn live(offered: Vec<String>) -> Self {
        Self { live: true, ..Self::new(offered) }
    }

    /// Takes the next piece of text and returns what it releases.
    pub fn push(&mut self, text: &str) -> Vec<Out> {
        self.held.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// One step over the held text: `false` when it needs more.
    fn step(&mut self, out: &mut Vec<Out>) -> bool {
        let end = self.held.find(CALL_END);
        match std::mem::replace(&mut self.inside, Inside::Text) {
            Inside::Text => self.outside(out),
            Inside::Held => self.held_list(end, out),
            Inside::Live(r) => self.live_list(r, end, out),
            Inside::Failed => self.failed_list(end, out),
        }
    }

    /// Outside a list: text up to an opening marker (held back when it may be one arriving).
    fn outside(&mut self, out: &mut Vec<Out>) -> bool {
        if let Some(i) = self.held.find(CALL_START) {
            push_text(out, self.held[..i].to_string());
            self.held.drain(..i + CALL_START.len());
            self.inside =
                if self.live { Inside::Live(Box::new(ListReader::new(self.offered.clone()))) } else { Inside::Held };
            return true;
        }
        let keep = partial_marker(&self.held, CALL_START);
        let text: String = self.held.drain(..self.held.len() - keep).collect();
        push_text(out, text);
        false
    }

    /// A list held whole: read once its closing marker is in.
    fn held_list(&mut self, end: Option<usize>, out: &mut Vec<Out>) -> bool {
        let Some(j) = end else {
            self.inside = Inside::Held;
            return false;
        };
        let body: String = self.held.drain(..j + CALL_END.len()).collect();
        match self.read(&body[..j]) {
            Some(calls) => out.push(Out::Calls(calls)),
            None => push_text(out, format!("{CALL_START}{body}")),
        }
        true
    }

    /// A list read as it arrives, up to its closing marker or a tail that may be one.
    fn live_list(&mut self, mut r: Box<ListReader>, end: Option<usize>, out: &mut Vec<Out>) -> bool {
        let upto = end.unwrap_or(self.held.len() - partial_marker(&self.held, CALL_END));
        let text: String = self.held.drain(..upto).collect();
        let read = feed(&mut r, &text, out).and_then(|()| if end.is_some() { r.end() } else { Ok(()) });
        self.calls += std::mem::take(&mut r.closed);
        if read.is_err() {
            let rest = r.unreleased();
            push_text(out, if r.started > 0 { rest.to_string() } else { format!("{CALL_START}{rest}") });
            self.inside = Inside::Failed;
            return true;
        }
        match end {
            Some(_) => {
                self.held.drain(..CALL_END.len());
                true
            }
            None => {
                self.inside = Inside::Live(r);
                false
            }
        }
    }

    /// A failed list: its text is content up to and with its closing marker.
    fn failed_list(&mut self, end: Option<usize>, out: &mut Vec<Out>) -> bool {
        let upto = end.map_or(self.held.len() - partial_marker(&self.held, CALL_END), |j| j + CALL_END.len());
        let text: String = self.held.drain(..upto).collect();
        push_text(out, text);
        if end.is_none() {
            self.inside = Inside::Failed;
        }
        end.is_some()
    }

    /// Ends the reply: held text (an unclosed list, markers included, or a stream's unsent rest of one) is content.
    pub fn finish(&mut self) -> Vec<Out> {
        let held = std::mem::take(&mut self.held);
        let text = match std::mem::replace(&mut self.inside, Inside::Text) {
            Inside::Text | Inside::Failed => held,
            Inside::Held => format!("{CALL_START}{held}"),
            Inside::Live(r) if r.started > 0 => format!("{}{held}", r.unreleased()),
            Inside::Live(r) => format!("{CALL_START}{}{held}", r.unreleased()),
        };
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

/// Feeds `text` to the live reader, its releases into `out`.
fn feed(r: &mut ListReader, text: &str, out: &mut Vec<Out>) -> Result<(), Failed> {
    let mut frags = Vec::new();
    let read = r.push(text, &mut frags);
    out.extend(frags.into_iter().map(|f| match f {
        Frag::Start(name) => Out::Start(name),
        Frag::Args(a) => Out::Args(a),
    }));
    read
}

fn push_text(out: &mut Vec<Out>, text: String) {
    if !text.is_empty() {
        out.push(Out::Text(text));
    }
}

/// Bytes at the end of `s` that are a proper prefix of `marker` (held: the marker may be arriving as text).
fn partial_marker(s: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| s.len() >= n && s.is_char_boundary(s.len() - n) && marker.starts_with(&s[s.len() - n..]))
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

    /// The content and calls (name, arguments) of `pieces`, read whole or live; checks that a well-formed reply
    /// (one whose calls all closed and whose text has no marker left) reads the same both ways.
    fn split_as(live: bool, pieces: &[&str]) -> (String, Vec<(String, String)>) {
        let offered = vec!["get_weather".into(), "now".into()];
        let mut s = if live { Splitter::live(offered) } else { Splitter::new(offered) };
        let mut outs: Vec<Out> = pieces.iter().flat_map(|p| s.push(p)).collect();
        outs.extend(s.finish());
        let mut text = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        for o in outs {
            match o {
                Out::Text(t) => text += &t,
                Out::Calls(c) => calls.extend(c.into_iter().map(|c| (c.function.name, c.function.arguments))),
                Out::Start(n) => calls.push((n, String::new())),
                Out::Args(a) => calls.last_mut().expect("a started call").1 += &a,
            }
        }
        if !live {
            assert_eq!(s.calls, if text.contains(CALL_START) { 0 } else { calls.len() }, "{pieces:?}");
        }
        (text, calls)
    }

    fn split(pieces: &[&str]) -> (String, Vec<(String, String)>) {
        let whole = split_as(false, pieces);
        if !whole.0.contains(CALL_START) && !whole.0.contains(CALL_END) {
            assert_eq!(split_as(true, pieces), whole, "live and whole differ on {pieces:?}");
        }
        whole
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
        // Live, a list that fails before a call went out is text as in the whole reply; one that fails after keeps
        // the call sent and releases the rest as text (an unclosed one too, at the end).
        let live = |pieces: &[&str]| split_as(true, pieces);
        let bad = "<|tool_call_start|>[unknown_tool()]<|tool_call_end|> ok";
        assert_eq!(live(&[bad]), (bad.to_string(), vec![]));
        let late = ["<|tool_call_start|>[now(), get_weather(city=", ")]<|tool_call_end|> ok"];
        let calls = vec![("now".to_string(), "{}".to_string()), ("get_weather".into(), "{\"city\":".into())];
        assert_eq!(live(&late), (")]<|tool_call_end|> ok".to_string(), calls.clone()));
        let cut = ["<|tool_call_start|>[now(), get_weather(city='Par"];
        let calls = vec![calls[0].clone(), ("get_weather".into(), "{\"city\":\"Par".into())];
        assert_eq!(live(&cut), (String::new(), calls));
        assert_eq!(live(&["<|tool_call_start|>[now(), get_weather(city=12"]).0, "12");
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
