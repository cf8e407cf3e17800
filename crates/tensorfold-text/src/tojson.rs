//! The `tojson` filter chat templates call, spaced as transformers' (Python's `json.dumps`): `", "` between items,
//! `": "` after keys, non-ASCII kept (`ensure_ascii=False`), no HTML escaping; `indent=n` as Python's pretty form.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind, State};
use serde_json::Value as Json;

use crate::template_limits::{TEMPLATE_MAX_BYTES, over_size, walk_within};

/// Largest `indent` a template may ask for (a huge one would allocate that much a line).
const MAX_INDENT: usize = 64;

/// `value | tojson`, `value | tojson(indent=2)` or `value | tojson(2)`: the JSON text of `value` as
/// transformers' `tojson` writes it (`json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`).
/// `ensure_ascii` and `separators` are read and ignored; `sort_keys` sorts object keys.
///
/// # Errors
/// A value with no JSON form (an undefined inside a strict template), an `indent` past [`MAX_INDENT`], a value
/// nested past [`crate::template_limits::MAX_VALUE_DEPTH`] or holding over
/// [`crate::template_limits::MAX_VALUE_ITEMS`] (checked before serde walks it recursively), a text past
/// [`TEMPLATE_MAX_BYTES`] (stopped as it is written), or a render past its budget.
pub(crate) fn tojson_filter(
    state: &State,
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    crate::render_budget::check(state)?;
    let indent = match indent.or(kwargs.get::<Option<Value>>("indent")?) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v).map_err(|_| bad("`indent` must be a non-negative integer"))?),
    };
    if indent.is_some_and(|n| n > MAX_INDENT) {
        return Err(bad(&format!("`indent` past {MAX_INDENT}")));
    }
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let _ = kwargs.get::<Option<Value>>("ensure_ascii")?;
    let _ = kwargs.get::<Option<Value>>("separators")?;
    kwargs.assert_all_used()?;
    walk_within(value, "tojson")?;
    let mut json = serde_json::to_value(value).map_err(|e| bad(&format!("no JSON form: {e}")))?;
    if sort_keys {
        sort(&mut json);
    }
    let mut out = String::new();
    write(&mut out, &json, indent, 0).ok_or_else(over_size)?;
    Ok(Value::from_safe_string(out))
}

fn bad(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {msg}"))
}

/// Sorts every object's keys, as `sort_keys=True`.
fn sort(v: &mut Json) {
    match v {
        Json::Object(m) => {
            let mut entries: Vec<(String, Json)> = std::mem::take(m).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, mut x) in entries {
                sort(&mut x);
                m.insert(k, x);
            }
        }
        Json::Array(a) => a.iter_mut().for_each(sort),
        _ => {}
    }
}

/// Writes `v` at nesting `depth`: compact Python spacing, or one item a line at `indent` spaces a level. `None`
/// once the text passes [`TEMPLATE_MAX_BYTES`].
fn write(out: &mut String, v: &Json, indent: Option<usize>, depth: usize) -> Option<()> {
    if out.len() > TEMPLATE_MAX_BYTES {
        return None;
    }
    let newline = |out: &mut String, d: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * d));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        Json::Array(a) if !a.is_empty() => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                write(out, x, indent, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        Json::Object(m) if !m.is_empty() => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                out.push_str(&Json::String(k.clone()).to_string());
                out.push_str(": ");
                write(out, x, indent, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        // Scalars and empty containers: serde_json's text is Python's (`[]`, `{}`, `1.5`, `"é"`, `null`).
        other => out.push_str(&other.to_string()),
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::Environment;

    fn render(src: &str, v: serde_json::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", tojson_filter);
        env.render_str(src, minijinja::context! { x => Value::from(minijinja::value::Serde(&v)) }).unwrap()
    }

    #[test]
    fn tojson_spaces_as_python_json_dumps() {
        let v = serde_json::json!({"name": "get_weather", "parameters": {"type": "object", "required": ["city", "unit"]},
                                   "n": 1.0, "e": [], "s": "<é> \"q\"\n"});
        assert_eq!(
            render("{{ x | tojson }}", v.clone()),
            r#"{"name": "get_weather", "parameters": {"type": "object", "required": ["city", "unit"]}, "n": 1.0, "e": [], "s": "<é> \"q\"\n"}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=2) }}", serde_json::json!({"a": [1, 2]})),
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}"
        );
        assert_eq!(
            render("{{ x | tojson(sort_keys=true) }}", serde_json::json!({"b": 1, "a": 2})),
            r#"{"a": 2, "b": 1}"#
        );
        let mut env = Environment::new();
        env.add_filter("tojson", tojson_filter);
        assert!(env.render_str("{{ 1 | tojson(indent=100000) }}", ()).is_err());
        assert!(env.render_str("{{ 1 | tojson(colour=1) }}", ()).is_err());
    }
}
