//! Constrained tool calls (`tool_choice: "required"` or a named function): a Lark grammar (llguidance's dialect)
//! that admits only the model's tool-call syntax for the offered tools, for the server to compile with
//! [`crate::grammar::Grammar::compile`]. Two forms, as LFM2's templates produce them: the Pythonic list
//! `<|tool_call_start|>[name(arg=value, ...)]<|tool_call_end|>` and a JSON list
//! `<|tool_call_start|>[{"name": ..., "arguments": {...}}]<|tool_call_end|>`. The markers are the tokenizer's special
//! tokens when it has them (written `<|...|>` in the grammar, one token each), else plain text. Bounded
//! (`tool_bounds`): strings at most `max_string` characters, lists at most `max_calls` calls.

use crate::grammar::{GrammarSpec, compact};
use crate::tool_bounds::bounded_root;
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
    /// The longest string an argument may hold, in characters ([`crate::tool_bounds::MAX_STRING_CHARS`]).
    pub max_string: usize,
    /// The most calls in the list when `parallel` ([`crate::tool_bounds::MAX_CALLS`]).
    pub max_calls: usize,
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
    /// A required argument whose schema is `false`: no call of the tool can be valid.
    #[error("tool {0:?} requires argument {1:?}, whose schema `false` admits no value")]
    Unsatisfiable(String, String),
}

/// The Lark text of `c` as a [`GrammarSpec::Lark`].
///
/// # Errors
/// [`ToolGrammarError`]: no tools, a name the grammar cannot spell, or a required argument no value satisfies.
pub fn tool_call_spec(c: &ToolConstraint) -> Result<GrammarSpec, ToolGrammarError> {
    if c.tools.is_empty() {
        return Err(ToolGrammarError::NoTools);
    }
    for t in &c.tools {
        if !(1..=64).contains(&t.name.len()) || !spellable(&t.name) {
            return Err(ToolGrammarError::BadName(t.name.clone()));
        }
    }
    let marker = |m: &str| if c.special_markers { m.to_string() } else { lark_string(m) };
    let calls = match c.max_calls {
        n if c.parallel && n > 1 => format!("call (\", \" call){{0,{}}}", n - 1),
        _ => "call".to_string(),
    };
    let mut lark = format!("start: {} \"[\" {calls} \"]\" {}\n", marker(&c.markers.0), marker(&c.markers.1));
    let names: Vec<String> = (0..c.tools.len()).map(|i| format!("call_{i}")).collect();
    lark += &format!("call: {}\n", names.join(" | "));
    for (i, t) in c.tools.iter().enumerate() {
        let params = if t.parameters.is_null() { json!({"type": "object"}) } else { t.parameters.clone() };
        let args = arguments(&t.name, &params)?;
        let bounded = |schema: &Value| compact(bounded_root(schema, &params, c.max_string));
        // The reader takes a keyword of name characters only; a tool with another key is called in the JSON form,
        // which the same call list admits.
        let pythonic = c.form == ToolCallForm::Pythonic && args.iter().all(|a| spellable(&a.key));
        if pythonic {
            lark += &pythonic_call(i, &t.name, &args, bounded);
        } else {
            let schema = json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            });
            lark += &format!("call_{i}: %json {}\n", bounded(&schema));
        }
    }
    Ok(GrammarSpec::Lark(lark))
}

/// Whether `s` is all name characters (`[A-Za-z0-9_.-]`, what the call reader takes for a name or keyword).
fn spellable(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '_' | '.' | '-'))
}

/// One argument a Pythonic call may write.
#[derive(Clone, Debug, PartialEq)]
struct Argument {
    key: String,
    /// Its value's JSON Schema (`true` read as `{}`).
    schema: Value,
    required: bool,
}

/// The arguments of a tool taking `params`, in the schema's order: each of `properties` (a `false` schema, which
/// admits no value, left out), then each name `required` lists that `properties` does not (any JSON value, as JSON
/// Schema reads it).
fn arguments(tool: &str, params: &Value) -> Result<Vec<Argument>, ToolGrammarError> {
    let mut required: Vec<&str> = Vec::new();
    for r in params.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        if !required.contains(&r) {
            required.push(r);
        }
    }
    let props = params.get("properties").and_then(Value::as_object);
    let mut out = Vec::new();
    for (key, schema) in props.into_iter().flatten() {
        let is_required = required.contains(&key.as_str());
        let schema = match schema {
            Value::Bool(false) if is_required => {
                return Err(ToolGrammarError::Unsatisfiable(tool.to_string(), key.clone()));
            }
            Value::Bool(false) => continue,
            Value::Bool(true) => json!({}),
            s => s.clone(),
        };
        out.push(Argument { key: key.clone(), schema, required: is_required });
    }
    for r in required {
        if !props.is_some_and(|p| p.contains_key(r)) {
            out.push(Argument { key: r.to_string(), schema: json!({}), required: true });
        }
    }
    Ok(out)
}

/// `call_i: "name(" args ")"`, each argument `key=<JSON value of its schema>`, in the schema's order: every required
/// argument once, each optional one at most once, `", "` between them (so a call always satisfies `required` and
/// names no property twice; LFM2 writes arguments in the schema's order). Linear in the arguments: `tail_i_k` is
/// what may follow once an argument before `k` is written, and the call's first argument is any optional one
/// before the first required one, or that required one.
/// Each value's schema is compiled as `bounded` gives it.
fn pythonic_call(i: usize, name: &str, args: &[Argument], bounded: impl Fn(&Value) -> Value) -> String {
    if args.is_empty() {
        return format!("call_{i}: {}\n", lark_string(&format!("{name}()")));
    }
    let n = args.len();
    let mut out = String::new();
    for (k, a) in args.iter().enumerate() {
        out += &format!("arg_{i}_{k}: {} value_{i}_{k}\n", lark_string(&format!("{}=", a.key)));
        out += &format!("value_{i}_{k}: %json {}\n", bounded(&a.schema));
    }
    let then = |k: usize| if k < n { format!(" tail_{i}_{k}") } else { String::new() };
    for (k, a) in args.iter().enumerate().skip(1) {
        let this = if a.required { format!("\", \" arg_{i}_{k}") } else { format!("(\", \" arg_{i}_{k})?") };
        out += &format!("tail_{i}_{k}: {this}{}\n", then(k + 1));
    }
    let first_required = args.iter().position(|a| a.required);
    let last_first = first_required.unwrap_or(n - 1);
    let firsts: Vec<String> = (0..=last_first).map(|k| format!("arg_{i}_{k}{}", then(k + 1))).collect();
    let optional = if first_required.is_some() { "" } else { "?" };
    let body = format!("({}){optional}", firsts.join(" | "));
    out + &format!("call_{i}: {} {body} \")\"\n", lark_string(&format!("{name}(")))
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
            max_string: 12,
            max_calls: 3,
        };
        let GrammarSpec::Lark(l) = tool_call_spec(&c).unwrap() else { panic!("lark") };
        assert!(l.starts_with("start: <|tool_call_start|> \"[\" call \"]\" <|tool_call_end|>\n"), "{l}");
        assert!(l.contains("call_0: \"get_weather(\"") && l.contains("call_1: \"now()\""), "{l}");
        assert!(l.contains("value_0_0: %json {\"type\":\"string\",\"maxLength\":12,\"$defs\":"), "{l}");
        let GrammarSpec::Lark(l) = tool_call_spec(&ToolConstraint { parallel: true, ..c.clone() }).unwrap() else {
            panic!("lark")
        };
        assert!(l.starts_with("start: <|tool_call_start|> \"[\" call (\", \" call){0,2} \"]\""), "{l}");
        let bad = ToolConstraint { tools: vec![ToolSpec { name: "a b".into(), parameters: Value::Null }], ..c.clone() };
        assert_eq!(tool_call_spec(&bad), Err(ToolGrammarError::BadName("a b".into())));
        assert_eq!(tool_call_spec(&ToolConstraint { tools: vec![], ..c }), Err(ToolGrammarError::NoTools));
    }

    #[test]
    fn pythonic_arguments_keep_the_required_ones_in_the_schema_order() {
        let params = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                            "c": true, "d": false}, "required": ["b", "e", "b"]});
        let args = arguments("f", &params).unwrap();
        let keys: Vec<(&str, bool)> = args.iter().map(|a| (a.key.as_str(), a.required)).collect();
        assert_eq!(keys, [("a", false), ("b", true), ("c", false), ("e", true)]);
        assert_eq!((&args[2].schema, &args[3].schema), (&json!({}), &json!({})));
        let l = pythonic_call(0, "f", &args, |s: &Value| compact(s.clone()));
        assert!(l.contains("tail_0_1: \", \" arg_0_1 tail_0_2\ntail_0_2: (\", \" arg_0_2)? tail_0_3\n"), "{l}");
        assert!(l.contains("tail_0_3: \", \" arg_0_3\n"), "{l}");
        assert!(l.ends_with("call_0: \"f(\" (arg_0_0 tail_0_1 | arg_0_1 tail_0_2) \")\"\n"), "{l}");
        let none = arguments("g", &json!({"properties": {"a": {}, "b": {}}})).unwrap();
        let l = pythonic_call(1, "g", &none, |s: &Value| compact(s.clone()));
        assert!(l.ends_with("call_1: \"g(\" (arg_1_0 tail_1_1 | arg_1_1)? \")\"\n"), "{l}");
        let bad = json!({"properties": {"x": false}, "required": ["x"]});
        assert_eq!(arguments("h", &bad), Err(ToolGrammarError::Unsatisfiable("h".into(), "x".into())));
    }

    #[test]
    fn a_tool_with_a_key_the_reader_cannot_spell_is_called_in_the_json_form() {
        let c = ToolConstraint {
            tools: vec![ToolSpec { name: "f".into(), parameters: json!({"properties": {"first name": {}}}) }],
            parallel: true,
            form: ToolCallForm::Pythonic,
            markers: ("<a>".into(), "<b>".into()),
            special_markers: false,
            max_string: 8,
            max_calls: 1,
        };
        let GrammarSpec::Lark(l) = tool_call_spec(&c).unwrap() else { panic!("lark") };
        assert!(l.starts_with("start: \"<a>\" \"[\" call \"]\" \"<b>\"\n"), "{l}");
        assert!(l.contains("call_0: %json {\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"f\"}"), "{l}");
    }
}
