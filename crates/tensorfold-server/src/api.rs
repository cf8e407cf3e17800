//! Validation of the typed OpenAI requests (`crate::protocol::requests`) into what the server runs: every field
//! checked in a fixed order, with a named 400 on a wrong JSON type or an out-of-range value. Unknown fields are
//! ignored (as vLLM does), and listed in docs/api.md.

use crate::error::ApiError;
use crate::protocol::requests::{
    ChatCompletionRequest, ChatMessageParam, CompletionRequest, Field, Messages, PromptInput, RequestOptions, StopInput,
};
use serde::de::DeserializeOwned;
use serde_json::{Number, Value};
use tensorfold_text::{ChatMessage, MessageContent};

/// Fields shared by `/v1/completions` and `/v1/chat/completions`, validated.
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
    /// `presence_penalty`, `frequency_penalty`, `repetition_penalty`, `logit_bias` (`penalties.rs`).
    pub penalties: tensorfold_engine::Penalties,
    /// `n`: choices, each its own stream with seed `seed + i`, sharing one prefill (`fanout.rs`).
    pub n: usize,
    /// `best_of` (at least `n`): candidates run, the `n` of the highest cumulative logprob returned (`best_of.rs`).
    pub best_of: usize,
    /// The reply's constraint (`structured.rs`, or a required tool call: `tools::prepare`), compiled at submission.
    pub grammar: Option<(&'static str, tensorfold_engine::GrammarSpec)>,
    /// `echo` (completions): the prompt text prepended to the reply (`echo.rs`).
    pub echo: bool,
    /// The chat request's tools (`tools::spec`); `None` without tools and on completions.
    pub tools: Option<crate::tools::ToolPlan>,
}

/// Most choices a request may ask for (`n`); the engine's lanes (`--parallel`) may bound it lower.
pub const MAX_N: i64 = 16;

/// `n` in [1, MAX_N], and `best_of` (default `n`) in [`n`, MAX_N]: above `n`, `best_of` candidates are run and the
/// `n` of the highest cumulative logprob returned (`best_of.rs`, OpenAI's and vLLM's meaning); below `n` it is
/// refused as OpenAI does.
fn choices(o: &RequestOptions) -> Result<(usize, usize), ApiError> {
    let n = int(&o.n, "n")?.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::invalid("n", format!("`n` = {n} is out of range [1, {MAX_N}]")));
    }
    match int(&o.best_of, "best_of")? {
        Some(b) if b < n => Err(ApiError::invalid("best_of", format!("`best_of` = {b} must be at least `n` = {n}"))),
        Some(b) if b > MAX_N => {
            Err(ApiError::invalid("best_of", format!("`best_of` = {b} is out of range [`n`, {MAX_N}]")))
        }
        Some(b) => Ok((n as usize, b as usize)),
        None => Ok((n as usize, n as usize)),
    }
}

/// Parses a JSON body into a request: a named 400 for invalid JSON or a body that is not an object. Every field of
/// a request type is a [`Field`], so an object always reads; the fields are checked afterwards.
pub fn request<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let object = match serde_json::from_slice::<Value>(body) {
        Ok(o @ Value::Object(_)) => o,
        Ok(_) => return Err(ApiError::bad_request("the request body must be a JSON object")),
        Err(e) => return Err(ApiError::bad_request(format!("invalid JSON: {e}"))),
    };
    serde_json::from_value(object).map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))
}

fn num(f: &Field<f64>, k: &str, default: f64, lo: f64, hi: f64) -> Result<f64, ApiError> {
    match f {
        Field::Absent => Ok(default),
        Field::Given(x) if (lo..=hi).contains(x) => Ok(*x),
        Field::Given(x) => Err(ApiError::invalid(k, format!("`{k}` = {x} is out of range [{lo}, {hi}]"))),
        Field::Wrong(_) => Err(ApiError::invalid(k, format!("`{k}` must be a number"))),
    }
}

fn int(f: &Field<i64>, k: &str) -> Result<Option<i64>, ApiError> {
    match f {
        Field::Absent => Ok(None),
        Field::Given(x) => Ok(Some(*x)),
        Field::Wrong(_) => Err(ApiError::invalid(k, format!("`{k}` must be an integer"))),
    }
}

fn boolean(f: &Field<bool>, k: &str, default: bool) -> Result<bool, ApiError> {
    match f {
        Field::Absent => Ok(default),
        Field::Given(b) => Ok(*b),
        Field::Wrong(_) => Err(ApiError::invalid(k, format!("`{k}` must be true or false"))),
    }
}

/// Validates a completions request's shared fields (`logprobs` an integer in [0, 20]), then `suffix` and `echo`.
pub fn completion_params(r: &CompletionRequest) -> Result<Params, ApiError> {
    if matches!(&r.options.tools, Field::Given(t) if !t.is_empty()) {
        return Err(ApiError::invalid("tools", "`tools` is a chat completions field (POST /v1/chat/completions)"));
    }
    let mut p = params(&r.options, || match int(&r.logprobs, "logprobs")? {
        None => Ok(None),
        Some(n) if (0..=20).contains(&n) => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::invalid("logprobs", format!("`logprobs` = {n} must be in [0, 20]"))),
    })?;
    p.echo = crate::echo::completion_echo(r, &p)?;
    Ok(p)
}

/// Validates a chat request's shared fields (`logprobs` a boolean, `top_logprobs` in [0, 20] beside it), then its
/// tools (`tools::spec`; with `n` above 1 each choice reads its own calls).
pub fn chat_params(r: &ChatCompletionRequest) -> Result<Params, ApiError> {
    crate::echo::refuse_chat_echo(&r.options)?;
    let mut p = chat_shared(r)?;
    p.tools = crate::tools::spec::plan(&r.options.tools, r.tool_choice.as_ref(), &r.parallel_tool_calls)?;
    Ok(p)
}

fn chat_shared(r: &ChatCompletionRequest) -> Result<Params, ApiError> {
    params(&r.options, || {
        let top = int(&r.top_logprobs, "top_logprobs")?;
        if let Some(t) = top.filter(|t| !(0..=20).contains(t)) {
            return Err(ApiError::invalid("top_logprobs", format!("`top_logprobs` = {t} must be in [0, 20]")));
        }
        let on = boolean(&r.logprobs, "logprobs", false)?;
        if top.is_some() && !on {
            return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
        }
        Ok(on.then_some(top.unwrap_or(0) as usize))
    })
}

/// Checks the shared fields in a fixed order (the first fault is the one answered); `logprobs` reads the route's
/// form of logprobs, in its place in that order.
fn params(o: &RequestOptions, logprobs: impl FnOnce() -> Result<Option<usize>, ApiError>) -> Result<Params, ApiError> {
    let model = match &o.model {
        Field::Absent => None,
        Field::Given(s) => Some(s.clone()),
        Field::Wrong(_) => return Err(ApiError::invalid("model", "`model` must be a string")),
    };
    let max_tokens = max_tokens(o)?;
    let penalties = crate::penalties::penalties(o)?;
    let (n, best_of) = choices(o)?;
    let grammar = crate::structured::grammar_spec(o)?;
    let top_k = top_k(&o.top_k)?;
    let seed = match &o.seed {
        Field::Absent => None,
        Field::Given(s) => Some(*s),
        Field::Wrong(_) => return Err(ApiError::invalid("seed", "`seed` must be a non-negative integer")),
    };
    let logprobs = logprobs()?;
    let stream = boolean(&o.stream, "stream", false)?;
    if stream && best_of > n {
        return Err(ApiError::invalid(
            "best_of",
            "`best_of` above `n` cannot be streamed (its choices are ranked at the end)",
        ));
    }
    let include_usage = match &o.stream_options {
        Field::Absent => false,
        Field::Given(so) => boolean(&so.include_usage, "include_usage", false)
            .map_err(|_| ApiError::invalid("stream_options", "`stream_options.include_usage` must be true or false"))?,
        Field::Wrong(_) => return Err(ApiError::invalid("stream_options", "`stream_options` must be an object")),
    };
    Ok(Params {
        model,
        max_tokens,
        temperature: num(&o.temperature, "temperature", 1.0, 0.0, 2.0)? as f32,
        top_p: top_p(&o.top_p)?,
        top_k,
        min_p: num(&o.min_p, "min_p", 0.0, 0.0, 1.0)? as f32,
        seed,
        stop: stops(&o.stop)?,
        stream,
        include_usage,
        ignore_eos: boolean(&o.ignore_eos, "ignore_eos", false)?,
        logprobs,
        draft: boolean(&o.draft, "draft", true)?,
        penalties,
        n,
        best_of,
        grammar,
        echo: false,
        tools: None,
    })
}

/// `max_completion_tokens`, else `max_tokens` (the other is not read), at least 1.
fn max_tokens(o: &RequestOptions) -> Result<Option<usize>, ApiError> {
    let mt = match int(&o.max_completion_tokens, "max_completion_tokens")? {
        Some(v) => Some(("max_completion_tokens", v)),
        None => int(&o.max_tokens, "max_tokens")?.map(|v| ("max_tokens", v)),
    };
    match mt {
        Some((k, v)) if v < 1 => Err(ApiError::invalid(k, format!("`{k}` must be at least 1"))),
        Some((_, v)) => Ok(Some(v as usize)),
        None => Ok(None),
    }
}

/// `top_p` in (0, 1], as the f32 the sampler takes (a value that rounds to 0 there is refused, not made greedy).
fn top_p(f: &Field<f64>) -> Result<f32, ApiError> {
    let x = match f {
        Field::Absent => return Ok(1.0),
        Field::Given(x) => *x,
        Field::Wrong(_) => return Err(ApiError::invalid("top_p", "`top_p` must be a number")),
    };
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
fn top_k(f: &Field<Number>) -> Result<usize, ApiError> {
    let n = match f {
        Field::Absent => return Ok(0),
        Field::Given(n) => n,
        Field::Wrong(_) => return Err(ApiError::invalid("top_k", "`top_k` must be an integer")),
    };
    match (n.as_i64(), n.as_u64()) {
        (Some(-1 | 0), _) => Ok(0),
        (_, Some(k)) => Ok(usize::try_from(k).unwrap_or(usize::MAX)),
        (Some(k), None) => Err(ApiError::invalid("top_k", format!("`top_k` = {k} must be -1, 0 (off) or positive"))),
        (None, None) => Err(ApiError::invalid("top_k", "`top_k` must be an integer")),
    }
}

fn stops(f: &Field<StopInput>) -> Result<Vec<String>, ApiError> {
    let list = match f {
        Field::Absent => return Ok(Vec::new()),
        Field::Given(StopInput::One(s)) => vec![s.clone()],
        Field::Given(StopInput::Many(list)) => list.clone(),
        Field::Wrong(_) => return Err(ApiError::invalid("stop", "`stop` must be a string or a list of strings")),
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
pub fn prompt(f: &Field<PromptInput>) -> Result<Prompt, ApiError> {
    let bad = || ApiError::invalid("prompt", "`prompt` must be a string or a list of token ids");
    let ids = |a: &Vec<Value>| {
        a.iter().map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(bad)).collect::<Result<Vec<_>, _>>()
    };
    match f {
        Field::Absent => Err(ApiError::invalid("prompt", "`prompt` is required")),
        Field::Given(PromptInput::Text(s)) => Ok(Prompt::Text(s.clone())),
        Field::Given(PromptInput::Ids(ids)) => Ok(Prompt::Ids(ids.clone())),
        Field::Given(PromptInput::Batch(a)) => match a.first() {
            Some(Value::String(s)) if a.len() == 1 => Ok(Prompt::Text(s.clone())),
            Some(Value::Array(inner)) if a.len() == 1 => Ok(Prompt::Ids(ids(inner)?)),
            Some(Value::String(_)) | Some(Value::Array(_)) => {
                Err(ApiError::invalid("prompt", "one prompt a request (batched prompts are not supported)"))
            }
            // Not a batch: a list of ids with one that is not a token id.
            _ => Err(bad()),
        },
        Field::Wrong(_) => Err(bad()),
    }
}

/// `messages`: a non-empty list of {role, content}; roles system, user, assistant, tool (developer is read as
/// system); content text or a list of text parts (an assistant's content may be null).
pub fn messages(f: &Messages) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match f {
        Field::Given(a) if !a.is_empty() => a,
        Field::Given(_) => return Err(ApiError::invalid("messages", "`messages` must not be empty")),
        Field::Absent => return Err(ApiError::invalid("messages", "`messages` is required")),
        Field::Wrong(_) => return Err(ApiError::invalid("messages", "`messages` must be a list")),
    };
    list.iter().enumerate().map(|(i, m)| message(i, m)).collect()
}

/// `messages[i]`.
fn message(i: usize, m: &Field<ChatMessageParam>) -> Result<ChatMessage, ApiError> {
    let param = format!("messages[{i}]");
    let Field::Given(m) = m else { return Err(ApiError::invalid(&param, "each message must be an object")) };
    let role = match &m.role {
        Field::Given(r) => match r.as_str() {
            r @ ("system" | "user" | "assistant" | "tool" | "developer") => {
                if r == "developer" { "system" } else { r }.to_string()
            }
            r => return Err(ApiError::invalid(&format!("{param}.role"), format!("unknown role {r:?}"))),
        },
        Field::Absent | Field::Wrong(_) => {
            return Err(ApiError::invalid(&format!("{param}.role"), "`role` is required"));
        }
    };
    let (tool_calls, tool_call_id) = crate::tools::history::fields(i, m, &role)?;
    let content = match &m.content {
        Field::Absent if role == "assistant" => MessageContent::Text(String::new()),
        Field::Given(c) => c.clone(),
        Field::Wrong(Value::Array(_)) => {
            return Err(ApiError::invalid(
                &format!("{param}.content"),
                "content parts must be {\"type\": \"text\", \"text\": ...}",
            ));
        }
        Field::Absent | Field::Wrong(_) => {
            return Err(ApiError::invalid(
                &format!("{param}.content"),
                "`content` must be a string or a list of text parts",
            ));
        }
    };
    Ok(ChatMessage { role, content, tool_calls, tool_call_id })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(v: Value, chat: bool) -> Result<Params, ApiError> {
        let body = v.to_string().into_bytes();
        match chat {
            true => chat_params(&request(&body)?),
            false => completion_params(&request(&body)?),
        }
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
