//! Constrained tool calls (`tool_choice: "required"` or a named function): a Lark grammar (llguidance's dialect)
//! that admits only the model's tool-call syntax for the offered tools, for the server to compile with
//! [`crate::grammar::Grammar::compile`]. Two forms, as LFM2's templates produce them: the Pythonic list
//! `<|tool_call_start|>[name(arg=value, ...)]<|tool_call_end|>` and a JSON list
//! `<|tool_call_start|>[{"name": ..., "arguments": {...}}]<|tool_call_end|>`. The markers are the tokenizer's special
//! tokens when it has them (written `<|...|>` in the grammar, one token each), else plain text.

use crate::grammar::{GrammarSpec, compact};
use serde_json::{Value, json};

/// One offered function: its name and its parameters' JSON Schema (OpenAI's `function.parameters`).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// `function.name`.
    pub name: String,
    /// `function.parameters` (absent: `{"type": "object"}`).
    pub parameters: Value,
}

/// How a call is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallForm {
    /// `name(arg=value, ...)`, LFM2's default: each value a JSON value of the property's schema (Python reads
    /// strings, numbers, lists and dicts alike; `true`/`false`/`null` are JSON's spelling).
    Pythonic,
    /// `{"name": "...", "arguments": {...}}`, the arguments valid under the tool's schema.
    Json,
}

/// What the grammar admits.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolConstraint {
    /// The tools a call may name (one for a named `tool_choice`, every offered tool for `required`).
    pub tools: Vec<ToolSpec>,
    /// More than one call in the list (`parallel_tool_calls`, default true in OpenAI's API).
    pub parallel: bool,
    /// The call syntax.
    pub form: ToolCallForm,
    /// The call list's opening and closing markers (LFM2: `<|tool_call_start|>`, `<|tool_call_end|>`).
    pub markers: (String, String),
    /// Whether the markers are special tokens of the tokenizer (then each is one token).
    pub special_markers: bool,
}

/// Why no grammar could be built.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ToolGrammarError {
    /// No tools to call.
    #[error("a constrained tool call needs at least one tool")]
    NoTools,
    /// A name outside `[A-Za-z0-9_.-]` (OpenAI's function-name characters), which the grammar could not spell.
    #[error("tool name {0:?} must be 1 to 64 characters of A-Z, a-z, 0-9, _ . -")]
    BadName(String),
}

/// The Lark text of `c` as a [`GrammarSpec::Lark`].
///
/// # Errors
/// [`ToolGrammarError`]: no tools, or a name the grammar cannot spell.
pub fn tool_call_spec(c: &ToolConstraint) -> Result<GrammarSpec, ToolGrammarError> {
    if c.tools.is_empty() {
        return Err(ToolGrammarError::NoTools);
    }
    for t in &c.tools {
        let ok = (1..=64).contains(&t.name.len())
            && t.name.chars().all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '_' | '.' | '-'));
        if !ok {
            return Err(ToolGrammarError::BadName(t.name.clone()));
        }
    }
    let marker = |m: &str| if c.special_markers { m.to_string() } else { lark_string(m) };
    let calls = if c.parallel { "call (\", \" call)*" } else { "call" };
    let mut lark = format!("start: {} \"[\" {calls} \"]\" {}\n", marker(&c.markers.0), marker(&c.markers.1));
    let names: Vec<String> = (0..c.tools.len()).map(|i| format!("call_{i}")).collect();
    lark += &format!("call: {}\n", names.join(" | "));
    for (i, t) in c.tools.iter().enumerate() {
        let params = if t.parameters.is_null() { json!({"type": "object"}) } else { t.parameters.clone() };
        match c.form {
            ToolCallForm::Json => {
                let schema = json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": params},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                });
                lark += &format!("call_{i}: %json {}\n", compact(schema));
            }
            ToolCallForm::Pythonic => lark += &pythonic_call(i, &t.name, &params),
        }
    }
    Ok(GrammarSpec::Lark(lark))
}

/// `call_i: "name(" args ")"`, each argument `key=<JSON value of its schema>`, written in the schema's order: the
/// `required` properties each once, then each optional one at most once (so a call always satisfies `required`
/// and names no property twice; LFM2 writes arguments in the schema's order).
fn pythonic_call(i: usize, name: &str, params: &Value) -> String {
    let props: Vec<(&String, &Value)> =
        params.get("properties").and_then(Value::as_object).map(|m| m.iter().collect()).unwrap_or_default();
    if props.is_empty() {
        return format!("call_{i}: {}\n", lark_string(&format!("{name}()")));
    }
    let required: Vec<&str> = params
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let is_required = |key: &str| required.contains(&key);
    let mut out = String::new();
    let (mut must, mut may) = (Vec::new(), Vec::new());
    for (k, (key, schema)) in props.iter().enumerate() {
        out += &format!("arg_{i}_{k}: {} value_{i}_{k}\n", lark_string(&format!("{key}=")));
        out += &format!("value_{i}_{k}: %json {}\n", compact((*schema).clone()));
        if is_required(key) { must.push(format!("arg_{i}_{k}")) } else { may.push(format!("arg_{i}_{k}")) }
    }
    let args = if must.is_empty() {
        // No argument is required: any in-order subset, the first without a leading separator.
        let firsts: Vec<String> = (0..may.len())
            .map(|f| {
                may[f..]
                    .iter()
                    .enumerate()
                    .map(|(n, a)| if n == 0 { a.clone() } else { format!("(\", \" {a})?") })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        format!("({})?", firsts.join(" | "))
    } else {
        let tail: String = may.iter().map(|a| format!(" (\", \" {a})?")).collect();
        format!("{}{tail}", must.join(" \", \" "))
    };
    out + &format!("call_{i}: {} {args} \")\"\n", lark_string(&format!("{name}(")))
}

/// A Lark string literal of `s` (JSON's escaping is Lark's).
fn lark_string(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            },
            ToolSpec { name: "now".into(), parameters: Value::Null },
        ]
    }

    #[test]
    fn the_lark_text_names_every_tool_and_refuses_bad_names() {
        let c = ToolConstraint {
            tools: tools(),
            parallel: false,
            form: ToolCallForm::Pythonic,
            markers: ("<|tool_call_start|>".into(), "<|tool_call_end|>".into()),
            special_markers: true,
        };
        let GrammarSpec::Lark(l) = tool_call_spec(&c).unwrap() else { panic!("lark") };
        assert!(l.starts_with("start: <|tool_call_start|> \"[\" call \"]\" <|tool_call_end|>\n"), "{l}");
        assert!(l.contains("call_0: \"get_weather(\"") && l.contains("call_1: \"now()\""), "{l}");
        assert!(l.contains("value_0_0: %json {\"type\":\"string\",\"x-guidance\""), "{l}");
        let bad = ToolConstraint { tools: vec![ToolSpec { name: "a b".into(), parameters: Value::Null }], ..c.clone() };
        assert_eq!(tool_call_spec(&bad), Err(ToolGrammarError::BadName("a b".into())));
        assert_eq!(tool_call_spec(&ToolConstraint { tools: vec![], ..c }), Err(ToolGrammarError::NoTools));
    }
}
