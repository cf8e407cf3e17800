//! OpenAI request bodies as sent: completions, chat completions, tokenize and detokenize, named after OpenAI's API
//! reference and vLLM's `protocol.py`. Every field is a [`Field`], which keeps a value of the wrong JSON type instead
//! of failing the whole body, so validation (`crate::api`) names the field at fault in its own order of checks.
//! Unknown fields are ignored (as vLLM does).

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer};
use serde_json::{Map, Number, Value};
use tensorfold_text::MessageContent;

/// A request field as the client sent it.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Field<T> {
    /// Not sent, or sent as `null` (the same thing, as in OpenAI's API).
    #[default]
    Absent,
    /// A value of the expected JSON type.
    Given(T),
    /// A value of another JSON type, kept as sent so the refusal can name the field (and quote it where it does).
    Wrong(Value),
}

impl<T: DeserializeOwned> Field<T> {
    /// Reads one JSON value: `null` is absent, a value `T` does not take is [`Field::Wrong`].
    pub fn from_value(v: Value) -> Self {
        if v.is_null() {
            return Self::Absent;
        }
        match T::deserialize(&v) {
            Ok(t) => Self::Given(t),
            Err(_) => Self::Wrong(v),
        }
    }

    /// The value given, else `default` (absent and of a wrong type alike: for fields read leniently).
    pub fn given_or(&self, default: T) -> T
    where
        T: Copy,
    {
        match self {
            Self::Given(t) => *t,
            Self::Absent | Self::Wrong(_) => default,
        }
    }

    /// Takes `key` out of a JSON object (absent when the object has no such key).
    fn take(object: &mut Map<String, Value>, key: &str) -> Self {
        object.remove(key).map_or(Self::Absent, Self::from_value)
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(Self::from_value)
    }
}

/// Deserializes a key that is present (even as `null`) to `Some`; with `#[serde(default)]` a missing key is `None`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// `messages`: a list of chat messages (each one an object, or refused by its index).
pub type Messages = Field<Vec<Field<ChatMessageParam>>>;

/// `POST /v1/completions` (OpenAI's `CreateCompletionRequest`, vLLM's `CompletionRequest`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct CompletionRequest {
    /// `prompt` (required): text, token ids, or a one-element list of either.
    pub prompt: Field<PromptInput>,
    /// `logprobs`: the chosen token's logprob and this many alternatives, in [0, 20].
    pub logprobs: Field<i64>,
    /// `suffix`: refused unless empty (`echo.rs`).
    pub suffix: Field<String>,
    /// The fields shared with chat completions.
    #[serde(flatten)]
    pub options: RequestOptions,
}

/// `POST /v1/chat/completions` (OpenAI's `CreateChatCompletionRequest`, vLLM's `ChatCompletionRequest`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct ChatCompletionRequest {
    /// `messages` (required, non-empty).
    pub messages: Messages,
    /// `logprobs`: whether to report the chosen token's logprob.
    pub logprobs: Field<bool>,
    /// `top_logprobs`: alternatives per token, in [0, 20]; needs `logprobs: true`.
    pub top_logprobs: Field<i64>,
    /// `tool_choice`, kept as sent: `"auto"`, `"none"`, `"required"` or `{"type": "function", "function":
    /// {"name": ...}}` (`crate::tools::spec`).
    pub tool_choice: Option<Value>,
    /// `parallel_tool_calls` (default true): more than one call in a reply.
    pub parallel_tool_calls: Field<bool>,
    /// The fields shared with completions.
    #[serde(flatten)]
    pub options: RequestOptions,
}

/// The fields `/v1/completions` and `/v1/chat/completions` share (`echo` and `best_of` are completions-only in
/// OpenAI's reference and `max_completion_tokens` chat-only; both routes read all three alike).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct RequestOptions {
    /// `model`: the served model's name.
    pub model: Field<String>,
    /// `max_tokens`: most tokens to generate, at least 1.
    pub max_tokens: Field<i64>,
    /// `max_completion_tokens`: the same, winning over `max_tokens`.
    pub max_completion_tokens: Field<i64>,
    /// `n`: choices per request, 1 to `api::MAX_N`.
    pub n: Field<i64>,
    /// `presence_penalty` in [-2, 2] (OpenAI's).
    pub presence_penalty: Field<f64>,
    /// `frequency_penalty` in [-2, 2] (OpenAI's).
    pub frequency_penalty: Field<f64>,
    /// `repetition_penalty` > 0 (vLLM's; 1 = off).
    pub repetition_penalty: Field<f64>,
    /// `tools`: OpenAI function tools, validated by `crate::tools::spec` (chat only; completions refuse them).
    pub tools: Field<Vec<Value>>,
    /// `response_format`, kept as sent: `text`, `json_object` or `json_schema` (`structured.rs`), and a refusal
    /// quotes the value.
    pub response_format: Option<Value>,
    /// `structured_outputs` (vLLM's): one of `json`, `regex`, `grammar`, `json_object`.
    pub structured_outputs: Option<Value>,
    /// `guided_json` (vLLM's older form): a JSON schema, or a string holding one.
    pub guided_json: Option<Value>,
    /// `guided_regex` (vLLM's older form).
    pub guided_regex: Field<String>,
    /// `guided_grammar` (vLLM's older form): a Lark grammar in llguidance's dialect.
    pub guided_grammar: Field<String>,
    /// `echo`: the prompt prepended to the reply (completions only; `echo.rs`).
    pub echo: Field<bool>,
    /// `best_of`: at least `n`; above it, the `n` best candidates by cumulative logprob are returned.
    pub best_of: Field<i64>,
    /// `logit_bias`: token id -> bias in [-100, 100].
    pub logit_bias: Field<Map<String, Value>>,
    /// `top_k` (vLLM's): -1 or 0 is off; any JSON integer, signed or past `i64`.
    pub top_k: Field<Number>,
    /// `seed` in [0, 2^64).
    pub seed: Field<u64>,
    /// `stream_options` (read when streaming).
    pub stream_options: Field<StreamOptions>,
    /// `temperature` in [0, 2].
    pub temperature: Field<f64>,
    /// `top_p` in (0, 1].
    pub top_p: Field<f64>,
    /// `min_p` in [0, 1] (vLLM's).
    pub min_p: Field<f64>,
    /// `stop`: a string or a list of strings.
    pub stop: Field<StopInput>,
    /// `stream`: an SSE reply.
    pub stream: Field<bool>,
    /// `ignore_eos` (vLLM's): do not stop on the checkpoint's EOS ids.
    pub ignore_eos: Field<bool>,
    /// `draft` (TensorFold's): false runs the plain serial path.
    pub draft: Field<bool>,
}

/// `stream_options`: an object (a list is refused, not read positionally as a derived struct would).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "Map<String, Value>")]
pub struct StreamOptions {
    /// `include_usage`: one usage chunk before `[DONE]`.
    pub include_usage: Field<bool>,
}

impl From<Map<String, Value>> for StreamOptions {
    fn from(mut o: Map<String, Value>) -> Self {
        Self { include_usage: Field::take(&mut o, "include_usage") }
    }
}

/// One message of `messages`, as sent: an object with `role` and `content`, and an assistant's `tool_calls` or a
/// tool message's `tool_call_id` (other keys, such as `name`, are ignored). Validation turns it into the
/// template's [`tensorfold_text::ChatMessage`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "Map<String, Value>")]
pub struct ChatMessageParam {
    /// `role`: `system`, `user`, `assistant`, `tool` or `developer`.
    pub role: Field<String>,
    /// `content`: a string or a list of text parts (an assistant's may be null).
    pub content: Field<MessageContent>,
    /// `tool_calls` (an assistant's): `[{"id", "type": "function", "function": {"name", "arguments"}}]`.
    pub tool_calls: Field<Vec<Value>>,
    /// `tool_call_id` (a tool message's): the call it answers.
    pub tool_call_id: Field<String>,
}

impl From<Map<String, Value>> for ChatMessageParam {
    fn from(mut o: Map<String, Value>) -> Self {
        Self {
            role: Field::take(&mut o, "role"),
            content: Field::take(&mut o, "content"),
            tool_calls: Field::take(&mut o, "tool_calls"),
            tool_call_id: Field::take(&mut o, "tool_call_id"),
        }
    }
}

/// `prompt` (and detokenize's `tokens`) in OpenAI's forms.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text prompt.
    Text(String),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Any other list: a batch of prompts (only a one-element one is served), or ids that are not all token ids.
    /// Its items are kept as sent: a batch is refused as a batch whatever its later items are.
    Batch(Vec<Value>),
}

/// `stop`: one string or a list of them.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

/// `POST /tokenize`: vLLM's `TokenizeCompletionRequest` (`prompt`) or `TokenizeChatRequest` (`messages`), told apart
/// by whether `messages` is in the body at all.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct TokenizeRequest {
    /// `messages`; `Some` whenever the key is present, even as `null` (then refused as missing).
    #[serde(deserialize_with = "present")]
    pub messages: Option<Messages>,
    /// `add_generation_prompt` (chat form; default true, any non-boolean read as the default).
    pub add_generation_prompt: Field<bool>,
    /// `prompt` (text form): the text to tokenize.
    pub prompt: Field<String>,
    /// `add_special_tokens` (text form; default true, any non-boolean read as the default).
    pub add_special_tokens: Field<bool>,
}

/// `POST /detokenize` (vLLM's `DetokenizeRequest`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct DetokenizeRequest {
    /// `tokens`: token ids (or a one-element list of them, as `prompt` takes).
    pub tokens: Field<PromptInput>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field<T: DeserializeOwned>(v: Value) -> Field<T> {
        Field::from_value(v)
    }

    #[test]
    fn a_field_is_absent_given_or_wrong_as_the_json_types_say() {
        assert_eq!(field::<f64>(json!(null)), Field::Absent);
        assert_eq!(field::<f64>(json!(3)), Field::Given(3.0));
        assert_eq!(field::<f64>(json!("3")), Field::Wrong(json!("3")));
        // Integers: a float (even a whole one) and a u64 past i64 are not an i64.
        assert_eq!(field::<i64>(json!(16.0)), Field::Wrong(json!(16.0)));
        assert_eq!(
            field::<i64>(json!(9_223_372_036_854_775_808u64)),
            Field::Wrong(json!(9_223_372_036_854_775_808u64))
        );
        assert_eq!(field::<u64>(json!(-1)), Field::Wrong(json!(-1)));
        assert_eq!(field::<u64>(json!(18_446_744_073_709_551_615u64)), Field::Given(u64::MAX));
        assert_eq!(field::<bool>(json!(1)), Field::Wrong(json!(1)));
    }

    #[test]
    fn objects_are_objects_and_a_present_null_is_kept_apart_from_a_missing_key() {
        assert_eq!(field::<StreamOptions>(json!([true])), Field::Wrong(json!([true])));
        assert_eq!(field::<ChatMessageParam>(json!(["user", "hi"])), Field::Wrong(json!(["user", "hi"])));
        let m: ChatMessageParam = serde_json::from_value(json!({"role": "user", "content": 5, "name": "n"})).unwrap();
        assert_eq!((m.role, m.content), (Field::Given("user".into()), Field::Wrong(json!(5))));
        let t: TokenizeRequest = serde_json::from_value(json!({"messages": null})).unwrap();
        assert_eq!(t.messages, Some(Field::Absent));
        let t: TokenizeRequest = serde_json::from_value(json!({"prompt": "x"})).unwrap();
        assert_eq!(t.messages, None);
    }

    #[test]
    fn prompts_take_every_openai_form() {
        assert_eq!(field::<PromptInput>(json!("a")), Field::Given(PromptInput::Text("a".into())));
        assert_eq!(field::<PromptInput>(json!([])), Field::Given(PromptInput::Ids(vec![])));
        assert_eq!(field::<PromptInput>(json!([1, 2])), Field::Given(PromptInput::Ids(vec![1, 2])));
        assert_eq!(field::<PromptInput>(json!([1, -2])), Field::Given(PromptInput::Batch(vec![json!(1), json!(-2)])));
        assert_eq!(field::<PromptInput>(json!(5)), Field::Wrong(json!(5)));
    }
}
