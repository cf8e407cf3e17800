//! The bounds of a forced tool call's grammar (`tool_grammar`): every string an argument may hold is capped at a
//! length (a schema's own smaller `maxLength` kept), a value of any type (`{}`, `true`, the extra properties and
//! items a schema leaves open) takes a bounded form, and the parameters' `$defs` / `definitions` go to each
//! compiled schema's root so that their `$ref`s resolve; with the cap on calls in a list, a constrained reply
//! cannot run to `max_tokens` inside one string or one list.

use serde_json::{Map, Value, json};

/// The longest string, in characters, that a forced call's argument may hold (a schema may ask for less).
pub const MAX_STRING_CHARS: usize = 4096;

/// The most calls in a forced call list (`parallel_tool_calls`).
pub const MAX_CALLS: usize = 16;

/// The name of the bounded any-value definition in a compiled schema's `$defs`.
const ANY: &str = "tensorfold_any";

/// Keywords that only annotate: a schema of these alone admits any value.
const ANNOTATIONS: [&str; 8] =
    ["title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"];

/// Keywords after which a schema without `type` is not read as admitting a bare string.
const NOT_BARE: [&str; 6] = ["$ref", "anyOf", "oneOf", "allOf", "const", "enum"];

/// `schema` (an argument's, or a whole call object's) bounded, as a root: `params`' definitions (bounded) and the
/// bounded any-value beside it in `$defs` (definitions it already has are kept).
pub fn bounded_root(schema: &Value, params: &Value, cap: usize) -> Value {
    let mut root = bound(schema, cap);
    let Value::Object(o) = &mut root else { return root };
    for key in ["$defs", "definitions"] {
        let Some(Value::Object(defs)) = params.get(key) else { continue };
        let into = o.entry(key).or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(into) = into {
            for (name, d) in defs {
                into.entry(name.clone()).or_insert_with(|| bound(d, cap));
            }
        }
    }
    let defs = o.entry("$defs").or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(defs) = defs {
        defs.insert(ANY.into(), any(cap));
    }
    root
}

/// A `$ref` to the bounded any-value.
fn any_ref() -> Value {
    json!({"$ref": format!("#/$defs/{ANY}")})
}

/// Any JSON value whose strings are at most `cap` characters, at every depth.
fn any(cap: usize) -> Value {
    json!({"anyOf": [
        {"type": "string", "maxLength": cap},
        {"type": ["number", "boolean", "null"]},
        {"type": "array", "items": any_ref()},
        {"type": "object", "additionalProperties": any_ref()},
    ]})
}

/// `s` with its strings bounded at every depth.
fn bound(s: &Value, cap: usize) -> Value {
    let Value::Object(o) = s else {
        return if s == &Value::Bool(true) { any_ref() } else { s.clone() };
    };
    if o.keys().all(|k| ANNOTATIONS.contains(&k.as_str())) {
        return any_ref();
    }
    let mut o = o.clone();
    for (k, v) in o.iter_mut() {
        match k.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" => {
                if let Value::Object(m) = v {
                    m.values_mut().for_each(|x| *x = bound(x, cap));
                }
            }
            "additionalProperties" | "additionalItems" | "items" if v.is_object() || v.is_boolean() => {
                *v = bound(v, cap);
            }
            "items" | "prefixItems" | "anyOf" | "oneOf" | "allOf" => {
                if let Value::Array(a) = v {
                    a.iter_mut().for_each(|x| *x = bound(x, cap));
                }
            }
            _ => {}
        }
    }
    let (string, object, array) = {
        let t = admits(&o);
        (t("string"), t("object"), t("array"))
    };
    if string {
        let own = o.get("maxLength").and_then(Value::as_u64).map_or(cap, |m| m.min(cap as u64) as usize);
        o.insert("maxLength".into(), own.into());
    }
    if object && !o.contains_key("additionalProperties") {
        o.insert("additionalProperties".into(), any_ref());
    }
    if array && !o.contains_key("items") {
        o.insert("items".into(), any_ref());
    }
    Value::Object(o)
}

/// Whether a schema object may take a value of a type by its own keywords: its `type` names it, or it has no
/// `type` and none of [`NOT_BARE`] (whose branches and targets are bounded where they are).
fn admits(o: &Map<String, Value>) -> impl Fn(&str) -> bool + '_ {
    move |t| match o.get("type") {
        Some(Value::String(s)) => s == t,
        Some(Value::Array(a)) => a.iter().any(|x| x == t),
        Some(_) => false,
        None => !NOT_BARE.iter().any(|k| o.contains_key(*k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_open_values_are_bounded_at_every_depth() {
        let params = json!({"$defs": {"Pt": {"type": "object", "properties": {"label": {"type": "string"}}}}});
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 10},
            "note": {"type": ["string", "null"], "maxLength": 99999},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}},
            "any": {"description": "anything"},
            "pt": {"$ref": "#/$defs/Pt"},
            "pick": {"enum": ["a", "b"]},
            "n": {"type": "integer"}},
            "additionalProperties": false});
        let r = bounded_root(&schema, &params, 64);
        let p = &r["properties"];
        assert_eq!((p["name"]["maxLength"].clone(), p["note"]["maxLength"].clone()), (json!(10), json!(64)));
        assert_eq!(p["tags"]["items"]["maxLength"], 64);
        assert_eq!(p["tags"]["items"]["pattern"], "^[a-z]+$");
        assert_eq!((p["any"].clone(), r["additionalProperties"].clone()), (any_ref(), json!(false)));
        assert_eq!(p["pick"], json!({"enum": ["a", "b"]}));
        assert_eq!(p["n"], json!({"type": "integer"}));
        assert_eq!(p["pt"], json!({"$ref": "#/$defs/Pt"}));
        let pt = &r["$defs"]["Pt"];
        assert_eq!(
            (pt["properties"]["label"]["maxLength"].clone(), pt["additionalProperties"].clone()),
            (json!(64), any_ref())
        );
        assert_eq!(r["$defs"][ANY]["anyOf"][0], json!({"type": "string", "maxLength": 64}));
        assert_eq!(bound(&json!(true), 5), any_ref());
        assert_eq!(bound(&json!(false), 5), json!(false));
        assert_eq!(bound(&json!({"type": "array"}), 5), json!({"type": "array", "items": any_ref()}));
    }
}
