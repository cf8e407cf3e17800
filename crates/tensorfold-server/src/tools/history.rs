//! A chat history's tool fields: an assistant message's `tool_calls` and a tool message's `tool_call_id`, checked
//! and put in the form chat templates read (transformers' and vLLM's: each call's `arguments` a JSON object, not
//! OpenAI's JSON text).

use crate::error::ApiError;
use crate::protocol::{ChatMessageParam, Field};
use serde_json::{Value, json};

/// Most calls one history message may carry.
pub const MAX_HISTORY_CALLS: usize = 128;

/// The template's `tool_calls` and `tool_call_id` of `messages[i]` (role `role`).
///
/// # Errors
/// A 400 naming `messages[i].tool_calls[j]...` or `messages[i].tool_call_id`.
pub fn fields(i: usize, m: &ChatMessageParam, role: &str) -> Result<(Option<Vec<Value>>, Option<String>), ApiError> {
    let at = |k: &str| format!("messages[{i}].{k}");
    let calls = match &m.tool_calls {
        Field::Absent => None,
        Field::Given(_) if role != "assistant" => {
            return Err(ApiError::invalid(&at("tool_calls"), "only an assistant message carries `tool_calls`"));
        }
        Field::Given(list) if list.len() > MAX_HISTORY_CALLS => {
            let msg = format!("at most {MAX_HISTORY_CALLS} tool calls a message");
            return Err(ApiError::invalid(&at("tool_calls"), msg));
        }
        Field::Given(list) => Some(
            list.iter()
                .enumerate()
                .map(|(j, c)| call(&at(&format!("tool_calls[{j}]")), c))
                .collect::<Result<_, _>>()?,
        ),
        Field::Wrong(_) => return Err(ApiError::invalid(&at("tool_calls"), "`tool_calls` must be a list")),
    };
    let id = match &m.tool_call_id {
        Field::Absent => None,
        Field::Given(id) => Some(id.clone()),
        Field::Wrong(_) => return Err(ApiError::invalid(&at("tool_call_id"), "`tool_call_id` must be a string")),
    };
    Ok((calls, id))
}

/// One history call `{"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}` as the
/// template's `{"id", "type", "function": {"name", "arguments": {...}}}`.
fn call(at: &str, c: &Value) -> Result<Value, ApiError> {
    let name = c.pointer("/function/name").and_then(Value::as_str);
    let Some(name) = name else {
        return Err(ApiError::invalid(&format!("{at}.function.name"), "`function.name` is required (a string)"));
    };
    let arguments = match c.pointer("/function/arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                let msg = "`function.arguments` must be JSON text of an object";
                return Err(ApiError::invalid(&format!("{at}.function.arguments"), msg));
            }
        },
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            let msg = "`function.arguments` must be JSON text of an object";
            return Err(ApiError::invalid(&format!("{at}.function.arguments"), msg));
        }
    };
    let id = c.get("id").cloned().unwrap_or(Value::Null);
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(v: Value) -> ChatMessageParam {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn history_calls_carry_parsed_arguments_and_bad_ones_are_named() {
        let m = param(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": [1]}"}}]}));
        let (calls, id) = fields(2, &m, "assistant").unwrap();
        assert_eq!(
            calls.unwrap()[0],
            json!({"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": [1]}}})
        );
        assert_eq!(id, None);
        let t = param(json!({"role": "tool", "content": "22C", "tool_call_id": "call_1"}));
        assert_eq!(fields(3, &t, "tool").unwrap(), (None, Some("call_1".into())));
        for (m, role, p) in [
            (
                json!({"tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}),
                "assistant",
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                json!({"tool_calls": [{"function": {"arguments": "{}"}}]}),
                "assistant",
                "messages[0].tool_calls[0].function.name",
            ),
            (json!({"tool_calls": {"a": 1}}), "assistant", "messages[0].tool_calls"),
            (json!({"tool_calls": []}), "user", "messages[0].tool_calls"),
            (json!({"tool_call_id": 5}), "tool", "messages[0].tool_call_id"),
        ] {
            let e = fields(0, &param(m.clone()), role).expect_err(&m.to_string());
            assert_eq!(e.param.as_deref(), Some(p), "{}", e.message);
        }
    }
}
