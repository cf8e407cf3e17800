//! Two pieces of transformers' template dialect that minijinja lacks: the `{% generation %}` block (transformers'
//! `AssistantTracker`, which renders its body as it is and only marks the span; LFM2.5's released templates use
//! it), read as an always-true `if` with the same whitespace control; and the `string` filter as Python's `str()`
//! (`True`, `None`, `[1, 'x']`, `{'k': 'v'}`), which LFM2.5 templates apply to call arguments.

use minijinja::value::{Value, ValueKind};
use std::borrow::Cow;

/// `source` with each `{% generation %}` / `{% endgeneration %}` tag (any `-` / `+` whitespace control kept) read
/// as `{% if true %}` / `{% endif %}`; unchanged (borrowed) when it has none.
pub fn generation_blocks(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tag = &rest[i..];
        // The close is searched past the open, so `{%}` is not a tag of its own.
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            return Cow::Owned(out);
        };
        out.push_str(&rewrite_tag(&tag[..end + 2]));
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// One `{%...%}` tag, rewritten when it is `generation` or `endgeneration`.
fn rewrite_tag(tag: &str) -> Cow<'_, str> {
    let inner = &tag[2..tag.len() - 2];
    // The open's control first, then the close's from what is left (`{%-%}`: one `-`, the open's).
    let open_len = usize::from(inner.starts_with(['-', '+']));
    let body = &inner[open_len..];
    let close_len = usize::from(body.ends_with(['-', '+']));
    let (open, close) = (&inner[..open_len], &body[body.len() - close_len..]);
    let word = body[..body.len() - close_len].trim();
    let with = match word {
        "generation" => "if true",
        "endgeneration" => "endif",
        _ => return Cow::Borrowed(tag),
    };
    Cow::Owned(format!("{{%{open} {with} {close}%}}"))
}

/// The `string` filter as templates call it: [`string_filter`] of a value within the walk limits
/// (`template_limits::walk_within`: a list shared into itself would otherwise print for hours).
///
/// # Errors
/// A value past the walk limits, or a render past its budget.
pub(crate) fn bounded_string_filter(state: &minijinja::State, v: &Value) -> Result<String, minijinja::Error> {
    crate::render_budget::check(state)?;
    crate::template_limits::walk_within(v, "string")?;
    Ok(string_filter(v))
}

/// The `string` filter: Python's `str()` of the value (strings as they are).
pub fn string_filter(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        _ => py_repr(v),
    }
}

/// Python's `repr()` of a value as a template sees it (`str()` for every kind but strings).
fn py_repr(v: &Value) -> String {
    match v.kind() {
        ValueKind::None | ValueKind::Undefined => "None".into(),
        ValueKind::Bool => if v.is_true() { "True" } else { "False" }.into(),
        ValueKind::String => quote(v.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            let items: Vec<String> = v.try_iter().into_iter().flatten().map(|x| py_repr(&x)).collect();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = v
                .try_iter()
                .into_iter()
                .flatten()
                .map(|k| format!("{}: {}", py_repr(&k), py_repr(&v.get_item(&k).unwrap_or_default())))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        _ => v.to_string(),
    }
}

/// A Python string literal of `s` as `repr` writes it: single quotes unless `s` holds one and no double quote.
fn quote(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for ch in s.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_an_always_true_if_with_their_whitespace_control() {
        let s = "a{%- generation -%} b {% endgeneration %}{%+generation%}{% if x %}{%endgeneration-%}";
        assert_eq!(generation_blocks(s), "a{%- if true -%} b {% endif %}{%+ if true %}{% if x %}{% endif -%}");
        assert!(matches!(generation_blocks("{% if x %}y{% endif %}"), Cow::Borrowed(_)));
        assert_eq!(generation_blocks("{% set generations = 1 %}{% gen"), "{% set generations = 1 %}{% gen");
    }

    #[test]
    fn degenerate_tags_are_left_to_the_parser_never_a_panic() {
        // A template is input: `{%}` (its `%}` overlaps the open) and a control alone were once slicing panics.
        for s in
            ["add_generation_prompt {%}", "generation {%-%}", "generation {%+%}{%}", "generation {%%}", "generation {%"]
        {
            assert_eq!(generation_blocks(s), s, "{s}");
        }
        // `{%}` opens a tag that runs to the next `%}`: left as it is, for the parser to refuse by name.
        assert_eq!(generation_blocks("{%}{% generation %}"), "{%}{% generation %}");
        assert_eq!(generation_blocks("{%-generation+%}"), "{%- if true +%}");
    }

    #[test]
    fn the_string_filter_is_pythons_str() {
        let v = |j: serde_json::Value| Value::from(minijinja::value::Serde(j));
        assert_eq!(string_filter(&v(serde_json::json!(true))), "True");
        assert_eq!(string_filter(&v(serde_json::json!(null))), "None");
        assert_eq!(string_filter(&v(serde_json::json!("it's"))), "it's");
        assert_eq!(string_filter(&v(serde_json::json!(2))), "2");
        assert_eq!(string_filter(&v(serde_json::json!(0.5))), "0.5");
        assert_eq!(
            string_filter(&v(serde_json::json!([1, "x", null, false, "it's", "a\"b'c\n"]))),
            r#"[1, 'x', None, False, "it's", 'a"b\'c\n']"#
        );
        assert_eq!(string_filter(&v(serde_json::json!({"k": ["v"], "n": {}}))), "{'k': ['v'], 'n': {}}");
    }
}
