//! Request parsing and validation for the OpenAI routes: every field read by name with a named 400 on a
//! wrong type or an out-of-range value. Unknown fields are ignored (as vLLM does), and listed in docs/api.md.

use crate::error::ApiError;
use serde_json::{Map, Value};
use tensorfold_text::{ChatMessage, MessageContent};

/// Fields shared by `/v1/completions` and `/v1/chat/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// `model` (absent: the served model).
    pub model: Option<String>,
    /// `max_tokens` / `max_completion_tokens` (absent: the server default, clipped to the context).
    pub max_tokens: Option<usize>,
    /// `temperature` in [0, 2] (default 1, as OpenAI).
    pub temperature: f32,
    /// `top_p` in (0, 1].
    pub top_p: f32,
    /// `top_k` (0 or -1 = off).
    pub top_k: usize,
    /// `min_p` in [0, 1].
    pub min_p: f32,
    /// `seed` (absent: a fresh one, reported back).
    pub seed: Option<u64>,
    /// `stop`: strings.
    pub stop: Vec<String>,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `ignore_eos`.
    pub ignore_eos: bool,
    /// Logprobs: `None` off, `Some(n)` the token's logprob and `n` top alternatives.
    pub logprobs: Option<usize>,
    /// `draft` (default true; false asks for the plain serial reference).
    pub draft: bool,
}

/// Parses a JSON body into an object, or a named 400.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad_request("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("invalid JSON: {e}"))),
    }
}

fn get<'a>(o: &'a Map<String, Value>, k: &str) -> Option<&'a Value> {
    o.get(k).filter(|v| !v.is_null())
}

fn num(o: &Map<String, Value>, k: &str, default: f64, lo: f64, hi: f64) -> Result<f64, ApiError> {
    match get(o, k) {
        None => Ok(default),
        Some(v) => match v.as_f64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(x),
            Some(x) => Err(ApiError::invalid(k, format!("`{k}` = {x} is out of range [{lo}, {hi}]"))),
            None => Err(ApiError::invalid(k, format!("`{k}` must be a number"))),
        },
    }
}

fn int(o: &Map<String, Value>, k: &str) -> Result<Option<i64>, ApiError> {
    match get(o, k) {
        None => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be an integer"))),
    }
}

fn boolean(o: &Map<String, Value>, k: &str, default: bool) -> Result<bool, ApiError> {
    match get(o, k) {
        None => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be true or false"))),
    }
}

/// Reads the shared fields. `chat` selects the chat form of `logprobs` (bool + `top_logprobs`).
pub fn params(o: &Map<String, Value>, chat: bool) -> Result<Params, ApiError> {
    let model = match get(o, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::invalid("model", "`model` must be a string")),
    };
    let mt = match int(o, "max_completion_tokens")? {
        Some(v) => Some(("max_completion_tokens", v)),
        None => int(o, "max_tokens")?.map(|v| ("max_tokens", v)),
    };
    let max_tokens = match mt {
        Some((k, v)) if v < 1 => return Err(ApiError::invalid(k, format!("`{k}` must be at least 1"))),
        Some((_, v)) => Some(v as usize),
        None => None,
    };
    if let Some(n) = int(o, "n")?.filter(|&n| n != 1) {
        return Err(ApiError::invalid("n", format!("`n` = {n} is not supported; only n = 1")));
    }
    for k in ["presence_penalty", "frequency_penalty"] {
        if num(o, k, 0.0, -2.0, 2.0)? != 0.0 {
            return Err(ApiError::invalid(k, format!("`{k}` is not supported; send 0 or omit it")));
        }
    }
    if num(o, "repetition_penalty", 1.0, 0.0, 10.0)? != 1.0 {
        return Err(ApiError::invalid(
            "repetition_penalty",
            "`repetition_penalty` is not supported; send 1 or omit it",
        ));
    }
    if get(o, "tools").and_then(Value::as_array).is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::invalid("tools", "`tools` (function calling) is not supported yet"));
    }
    if let Some(rf) = get(o, "response_format").filter(|v| v.get("type").and_then(Value::as_str) != Some("text")) {
        return Err(ApiError::invalid(
            "response_format",
            format!("`response_format` {rf} is not supported; only text"),
        ));
    }
    if boolean(o, "echo", false)? {
        return Err(ApiError::invalid("echo", "`echo` is not supported"));
    }
    if int(o, "best_of")?.is_some_and(|b| b != 1) {
        return Err(ApiError::invalid("best_of", "`best_of` is not supported; only 1"));
    }
    if get(o, "logit_bias").and_then(Value::as_object).is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::invalid("logit_bias", "`logit_bias` is not supported"));
    }
    let top_k = top_k(o)?;
    let seed = match get(o, "seed") {
        None => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| ApiError::invalid("seed", "`seed` must be a non-negative integer"))?),
    };
    let logprobs = if chat {
        let top = int(o, "top_logprobs")?;
        if let Some(t) = top.filter(|t| !(0..=20).contains(t)) {
            return Err(ApiError::invalid("top_logprobs", format!("`top_logprobs` = {t} must be in [0, 20]")));
        }
        let on = boolean(o, "logprobs", false)?;
        if top.is_some() && !on {
            return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
        }
        on.then_some(top.unwrap_or(0) as usize)
    } else {
        match int(o, "logprobs")? {
            None => None,
            Some(n) if (0..=20).contains(&n) => Some(n as usize),
            Some(n) => return Err(ApiError::invalid("logprobs", format!("`logprobs` = {n} must be in [0, 20]"))),
        }
    };
    let include_usage = match get(o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => boolean(so, "include_usage", false)
            .map_err(|_| ApiError::invalid("stream_options", "`stream_options.include_usage` must be true or false"))?,
        Some(_) => return Err(ApiError::invalid("stream_options", "`stream_options` must be an object")),
    };
    Ok(Params {
        model,
        max_tokens,
        temperature: num(o, "temperature", 1.0, 0.0, 2.0)? as f32,
        top_p: top_p(o)?,
        top_k,
        min_p: num(o, "min_p", 0.0, 0.0, 1.0)? as f32,
        seed,
        stop: stops(o)?,
        stream: boolean(o, "stream", false)?,
        include_usage,
        ignore_eos: boolean(o, "ignore_eos", false)?,
        logprobs,
        draft: boolean(o, "draft", true)?,
    })
}

/// `top_p` in (0, 1], as the f32 the sampler takes (a value that rounds to 0 there is refused, not made greedy).
fn top_p(o: &Map<String, Value>) -> Result<f32, ApiError> {
    let Some(v) = get(o, "top_p") else { return Ok(1.0) };
    let x = v.as_f64().ok_or_else(|| ApiError::invalid("top_p", "`top_p` must be a number"))?;
    if !(x > 0.0 && x <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("`top_p` = {x} is out of range (0, 1]: it must be greater than 0"),
        ));
    }
    match x as f32 {
        f if f > 0.0 => Ok(f),
        _ => {
            Err(ApiError::invalid("top_p", format!("`top_p` = {x} rounds to 0 as a 32-bit float; send at least 1e-45")))
        }
    }
}

/// `top_k`: -1 or 0 is off, a positive integer keeps that many (at or past the vocabulary: off, as any size is).
fn top_k(o: &Map<String, Value>) -> Result<usize, ApiError> {
    let Some(v) = get(o, "top_k") else { return Ok(0) };
    match (v.as_i64(), v.as_u64()) {
        (Some(-1 | 0), _) => Ok(0),
        (_, Some(k)) => Ok(usize::try_from(k).unwrap_or(usize::MAX)),
        (Some(k), None) => Err(ApiError::invalid("top_k", format!("`top_k` = {k} must be -1, 0 (off) or positive"))),
        (None, None) => Err(ApiError::invalid("top_k", "`top_k` must be an integer")),
    }
}

fn stops(o: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let list = match get(o, "stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::invalid("stop", "`stop` must be a string or a list of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::invalid("stop", "`stop` must be a string or a list of strings")),
    };
    if list.len() > 16 {
        return Err(ApiError::invalid("stop", "at most 16 stop strings"));
    }
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    if list.iter().any(|s| s.len() > 1024) {
        return Err(ApiError::invalid("stop", "stop strings must be at most 1,024 bytes"));
    }
    Ok(list)
}

/// A completion prompt: text, or token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text to tokenize.
    Text(String),
    /// Token ids as given.
    Ids(Vec<u32>),
}

/// `prompt`: a string, a list of token ids, or a one-element list of either.
pub fn prompt(o: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let bad = || ApiError::invalid("prompt", "`prompt` must be a string or a list of token ids");
    let ids = |a: &Vec<Value>| {
        a.iter().map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(bad)).collect::<Result<Vec<_>, _>>()
    };
    match get(o, "prompt") {
        None => Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) => match a.first() {
            Some(Value::String(s)) if a.len() == 1 => Ok(Prompt::Text(s.clone())),
            Some(Value::Array(inner)) if a.len() == 1 => Ok(Prompt::Ids(ids(inner)?)),
            Some(Value::String(_)) | Some(Value::Array(_)) => {
                Err(ApiError::invalid("prompt", "one prompt a request (batched prompts are not supported)"))
            }
            _ => Ok(Prompt::Ids(ids(a)?)),
        },
        Some(_) => Err(bad()),
    }
}

/// `messages`: a non-empty list of {role, content}; roles system, user, assistant, tool; content text or
/// a list of text parts (an assistant's content may be null).
pub fn messages(o: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match get(o, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::invalid("messages", "`messages` must not be empty")),
        None => return Err(ApiError::invalid("messages", "`messages` is required")),
        Some(_) => return Err(ApiError::invalid("messages", "`messages` must be a list")),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let param = format!("messages[{i}]");
            let m = m.as_object().ok_or_else(|| ApiError::invalid(&param, "each message must be an object"))?;
            let role = match m.get("role").and_then(Value::as_str) {
                Some(r @ ("system" | "user" | "assistant" | "tool" | "developer")) => {
                    if r == "developer" { "system" } else { r }.to_string()
                }
                Some(r) => return Err(ApiError::invalid(&format!("{param}.role"), format!("unknown role {r:?}"))),
                None => return Err(ApiError::invalid(&format!("{param}.role"), "`role` is required")),
            };
            let content = match m.get("content") {
                None | Some(Value::Null) if role == "assistant" => MessageContent::Text(String::new()),
                Some(Value::String(s)) => MessageContent::Text(s.clone()),
                Some(v @ Value::Array(_)) => serde_json::from_value(v.clone()).map_err(|_| {
                    ApiError::invalid(
                        &format!("{param}.content"),
                        "content parts must be {\"type\": \"text\", \"text\": ...}",
                    )
                })?,
                _ => {
                    return Err(ApiError::invalid(
                        &format!("{param}.content"),
                        "`content` must be a string or a list of text parts",
                    ));
                }
            };
            Ok(ChatMessage { role, content })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(v: Value, chat: bool) -> Result<Params, ApiError> {
        params(v.as_object().expect("an object"), chat)
    }

    #[test]
    fn top_k_past_any_vocabulary_is_off_and_malformed_ones_are_named() {
        let k = |v: Value| parsed(json!({ "top_k": v }), false).map(|p| p.top_k).map_err(|e| e.message);
        assert_eq!(k(json!(-1)), Ok(0));
        assert_eq!(k(json!(40)), Ok(40));
        // Past i64: still a count, past every vocabulary, so off as any top_k at or past the vocabulary is.
        assert_eq!(k(json!(9_223_372_036_854_775_808u64)), Ok(9_223_372_036_854_775_808));
        assert!(k(json!(-5)).is_err_and(|m| m.contains("must be -1, 0 (off) or positive")));
        assert!(k(json!(2.5)).is_err_and(|m| m.contains("must be an integer")));
    }

    #[test]
    fn top_p_is_in_the_open_closed_unit_interval_as_an_f32() {
        let p = |v: Value| parsed(json!({ "top_p": v }), false).map(|p| p.top_p).map_err(|e| e.message);
        assert_eq!(p(json!(0.9)), Ok(0.9));
        assert_eq!(p(json!(1e-30)), Ok(1e-30));
        assert!(p(json!(0)).is_err_and(|m| m.contains("out of range (0, 1]")));
        assert!(p(json!(1.5)).is_err_and(|m| m.contains("out of range (0, 1]")));
        assert!(p(json!(1e-300)).is_err_and(|m| m.contains("rounds to 0")));
    }

    #[test]
    fn chat_top_logprobs_needs_logprobs() {
        let lp = |v: Value| parsed(v, true).map(|p| p.logprobs).map_err(|e| e.message);
        assert_eq!(lp(json!({"logprobs": true, "top_logprobs": 3})), Ok(Some(3)));
        assert_eq!(lp(json!({"logprobs": true})), Ok(Some(0)));
        assert!(lp(json!({"top_logprobs": 3})).is_err_and(|m| m.contains("needs `logprobs: true`")));
        assert!(lp(json!({"logprobs": false, "top_logprobs": 0})).is_err());
    }
}
