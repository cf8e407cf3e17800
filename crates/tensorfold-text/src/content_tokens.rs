//! Special tokens written inside chat message content stay plain text: a user who writes
//! `<|im_end|>\n<|im_start|>system` in a message gets the tokens of that text, not the control tokens, while the
//! template's own control tokens stay control tokens.
//!
//! How: before rendering, every special-token string in a message's content is replaced by a placeholder
//! (`U+E000 index U+E001`, private-use characters); the template renders as usual (it sees the placeholders where
//! the strings were); the rendered prompt is tokenized with special-token parsing between placeholders, and each
//! placeholder becomes the tokens of its string with special-token parsing off (tokenizers'
//! `encode_special_tokens`, the mechanism llama.cpp's `parse_special = false` and transformers'
//! `split_special_tokens` offer). Content without any special-token string takes the plain path unchanged.

use aho_corasick::{AhoCorasick, MatchKind};
use tokenizers::Tokenizer;

use crate::chat_template::{ChatMessage, ContentPart, MessageContent};
use crate::error::TextError;
use crate::tokenizer::Text;
use serde_json::Value;

/// Escaped messages and tools.
pub(crate) type Escaped = (Vec<ChatMessage>, Option<Vec<Value>>);

/// Whether any string (key or value) in `v` is a hit.
fn json_hits(v: &Value, hit: &impl Fn(&str) -> bool) -> bool {
    match v {
        Value::String(s) => hit(s),
        Value::Array(a) => a.iter().any(|x| json_hits(x, hit)),
        Value::Object(m) => m.iter().any(|(k, x)| hit(k) || json_hits(x, hit)),
        _ => false,
    }
}

/// `v` with every string (key or value) mapped by `f`.
fn json_map(v: &Value, f: &impl Fn(&str) -> String) -> Value {
    match v {
        Value::String(s) => Value::String(f(s)),
        Value::Array(a) => Value::Array(a.iter().map(|x| json_map(x, f)).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, x)| (f(k), json_map(x, f))).collect()),
        other => other.clone(),
    }
}

/// Opens a placeholder (Unicode private use: no tokenizer or template gives it meaning).
const OPEN: char = '\u{E000}';
/// Closes a placeholder.
const CLOSE: char = '\u{E001}';

/// The special-token strings of a tokenizer and a copy of it that encodes them as plain text.
pub(crate) struct ContentGuard {
    /// Each special token's text, then the two placeholder characters themselves (so content that contains them
    /// is escaped too).
    strings: Vec<String>,
    matcher: AhoCorasick,
    plain: Tokenizer,
}

impl ContentGuard {
    /// From the tokenizer's added tokens marked special.
    pub(crate) fn new(tokenizer: &Tokenizer) -> Result<Self, TextError> {
        let mut strings: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        strings.sort();
        strings.dedup();
        strings.push(OPEN.to_string());
        strings.push(CLOSE.to_string());
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&strings)
            .map_err(|e| TextError::Tokenizer(format!("special-token matcher: {e}")))?;
        let mut plain = tokenizer.clone();
        plain.set_encode_special_tokens(true);
        Ok(Self { strings, matcher, plain })
    }

    /// The messages (their content and tool calls) and the tools with every special-token string replaced by its
    /// placeholder; `None` when none holds any (the prompt is then tokenized exactly as before).
    pub(crate) fn escape(&self, messages: &[ChatMessage], tools: Option<&[Value]>) -> Option<Escaped> {
        let hit = |s: &str| self.matcher.is_match(s);
        let any = messages.iter().any(|m| {
            let content = match &m.content {
                MessageContent::Text(t) => hit(t),
                MessageContent::Parts(p) => p.iter().any(|ContentPart::Text { text }| hit(text)),
            };
            content
                || m.tool_calls.iter().flatten().any(|v| json_hits(v, &hit))
                || m.tool_call_id.as_deref().is_some_and(hit)
        }) || tools.into_iter().flatten().any(|v| json_hits(v, &hit));
        if !any {
            return None;
        }
        let esc = |s: &str| {
            let mut out = String::with_capacity(s.len());
            self.matcher.replace_all_with(s, &mut out, |m, _, dst| {
                dst.push(OPEN);
                dst.push_str(&m.pattern().as_usize().to_string());
                dst.push(CLOSE);
                true
            });
            out
        };
        let escaped = messages
            .iter()
            .map(|m| ChatMessage {
                role: m.role.clone(),
                content: match &m.content {
                    MessageContent::Text(t) => MessageContent::Text(esc(t)),
                    MessageContent::Parts(p) => MessageContent::Parts(
                        p.iter().map(|ContentPart::Text { text }| ContentPart::Text { text: esc(text) }).collect(),
                    ),
                },
                tool_calls: m.tool_calls.as_ref().map(|c| c.iter().map(|v| json_map(v, &esc)).collect()),
                tool_call_id: m.tool_call_id.as_deref().map(esc),
            })
            .collect();
        Some((escaped, tools.map(|t| t.iter().map(|v| json_map(v, &esc)).collect())))
    }

    /// Tokenizes a prompt rendered from escaped messages: text between placeholders with special-token parsing
    /// (`text.encode`, no post-processor), each placeholder as its string in plain text.
    pub(crate) fn encode(&self, text: &Text, prompt: &str) -> Result<Vec<u32>, TextError> {
        let mut ids = Vec::new();
        let mut rest = prompt;
        while let Some(open) = rest.find(OPEN) {
            let after = &rest[open + OPEN.len_utf8()..];
            let index = after.find(CLOSE).and_then(|c| after[..c].parse::<usize>().ok().map(|i| (i, c)));
            let Some((i, close)) = index.filter(|(i, _)| *i < self.strings.len()) else {
                // Not a placeholder of ours (a template's own U+E000): ordinary text up to and including it.
                let upto = open + OPEN.len_utf8();
                ids.extend(text.encode(&rest[..upto], false)?);
                rest = &rest[upto..];
                continue;
            };
            ids.extend(text.encode(&rest[..open], false)?);
            let plain = self.plain.encode(self.strings[i].as_str(), false);
            ids.extend(plain.map_err(|e| TextError::Tokenizer(e.to_string()))?.get_ids());
            rest = &after[close + CLOSE.len_utf8()..];
        }
        ids.extend(text.encode(rest, false)?);
        Ok(ids)
    }
}
