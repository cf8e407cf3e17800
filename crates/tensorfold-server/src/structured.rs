//! Structured output requests read into the engine's `GrammarSpec`: OpenAI's `response_format` (`text`,
//! `json_object`, `json_schema`) and vLLM's extensions, `structured_outputs` (`json`, `regex`, `grammar`,
//! `json_object`) and the older `guided_json` / `guided_regex` / `guided_grammar`. At most one constraint a request;
//! each refusal is a 400 naming the field. Compiling (a schema llguidance refuses is a 400 saying why) happens at
//! submission, against the checkpoint's tokenizer.

use crate::error::ApiError;
use crate::protocol::requests::{Field, RequestOptions};
use serde_json::Value;
use tensorfold_engine::GrammarSpec;

/// The request's one constraint and the field that sent it, or `None` for free text.
pub fn grammar_spec(o: &RequestOptions) -> Result<Option<(&'static str, GrammarSpec)>, ApiError> {
    let mut found: Vec<(&'static str, GrammarSpec)> = Vec::new();
    if let Some(rf) = &o.response_format
        && let Some(spec) = response_format(rf)?
    {
        found.push(("response_format", spec));
    }
    if let Some(so) = &o.structured_outputs {
        found.extend(structured_outputs(so)?.map(|s| ("structured_outputs", s)));
    }
    for (k, f, make) in [
        ("guided_regex", &o.guided_regex, GrammarSpec::Regex as fn(String) -> GrammarSpec),
        ("guided_grammar", &o.guided_grammar, GrammarSpec::Lark),
    ] {
        match f {
            Field::Absent => {}
            Field::Given(s) => found.push((k, make(s.clone()))),
            Field::Wrong(_) => return Err(ApiError::invalid(k, format!("`{k}` must be a string"))),
        }
    }
    if let Some(schema) = &o.guided_json {
        found.push(("guided_json", json_schema(schema, "guided_json")?));
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => {
            let names: Vec<&str> = found.iter().map(|(k, _)| *k).collect();
            Err(ApiError::invalid(found[1].0, format!("one constraint a request; this one sends {}", names.join(", "))))
        }
    }
}

/// `response_format`: `{type: text}` (no constraint), `{type: json_object}`, `{type: json_schema, json_schema:
/// {name, schema, strict}}` (OpenAI's shapes; `strict` or not, llguidance enforces the schema).
fn response_format(rf: &Value) -> Result<Option<GrammarSpec>, ApiError> {
    let bad = |m: String| ApiError::invalid("response_format", m);
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("json_schema") => {
            let schema = rf
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| bad("`response_format.json_schema.schema` is required for type json_schema".into()))?;
            json_schema(schema, "response_format").map(Some)
        }
        _ => {
            Err(bad(format!("`response_format` {rf} is not supported: type must be text, json_object or json_schema")))
        }
    }
}

/// vLLM's `structured_outputs` object: exactly one of `json`, `regex`, `grammar`, `json_object: true`.
fn structured_outputs(so: &Value) -> Result<Option<GrammarSpec>, ApiError> {
    let k = "structured_outputs";
    let obj = so.as_object().ok_or_else(|| ApiError::invalid(k, "`structured_outputs` must be an object"))?;
    let mut specs = Vec::new();
    for (key, v) in obj {
        let text = || {
            v.as_str().map(str::to_owned).ok_or_else(|| ApiError::invalid(k, format!("`{k}.{key}` must be a string")))
        };
        match key.as_str() {
            "json" => specs.push(json_schema(v, k)?),
            "regex" => specs.push(GrammarSpec::Regex(text()?)),
            "grammar" => specs.push(GrammarSpec::Lark(text()?)),
            "json_object" if v.as_bool() == Some(true) => specs.push(GrammarSpec::JsonObject),
            "json_object" | "disable_fallback" | "disable_any_whitespace" | "disable_additional_properties" => {}
            other => {
                return Err(ApiError::invalid(
                    k,
                    format!("`{k}.{other}` is not supported (json, regex, grammar, json_object)"),
                ));
            }
        }
    }
    if specs.len() > 1 {
        return Err(ApiError::invalid(k, "`structured_outputs` takes one of json, regex, grammar, json_object"));
    }
    Ok(specs.pop())
}

/// A JSON schema: an object (or `true`), or a string holding one (vLLM accepts `guided_json` as text).
fn json_schema(v: &Value, k: &'static str) -> Result<GrammarSpec, ApiError> {
    let parsed;
    let v = match v {
        Value::String(s) => {
            parsed = serde_json::from_str::<Value>(s)
                .map_err(|e| ApiError::invalid(k, format!("the JSON schema in `{k}` is not JSON: {e}")))?;
            &parsed
        }
        v => v,
    };
    match v {
        Value::Object(_) | Value::Bool(true) => Ok(GrammarSpec::JsonSchema(v.clone())),
        _ => Err(ApiError::invalid(k, format!("the JSON schema in `{k}` must be an object"))),
    }
}
