//! `echo` and `suffix` of `/v1/completions` (OpenAI's legacy completions fields). `echo: true` prepends the prompt
//! text to each choice's text (a streamed reply sends it as its first chunk), as OpenAI and vLLM do; token-id prompts
//! echo their decoded text. `echo` with `logprobs` is refused by name: it would need the prompt tokens' logprobs
//! (vLLM's `prompt_logprobs`), which the engine does not compute. `suffix` (text after an insertion point) is refused
//! by name, as vLLM refuses it. Chat has no `echo` (vLLM's chat `echo` is an extension not served here).

use crate::api::{Params, Prompt};
use crate::error::ApiError;
use crate::protocol::{CompletionRequest, Field, RequestOptions};
use crate::state::{AppState, Ready};
use tensorfold_text::TextError;

/// Reads `echo` and `suffix` of a completions request whose other fields are valid (`p`). Errors: a non-boolean
/// `echo`, `echo` with `logprobs`, a non-empty `suffix` (an empty one inserts nothing and is accepted).
pub fn completion_echo(r: &CompletionRequest, p: &Params) -> Result<bool, ApiError> {
    match &r.suffix {
        Field::Absent => {}
        Field::Given(s) if s.is_empty() => {}
        Field::Given(_) => {
            return Err(ApiError::invalid("suffix", "`suffix` (text after an insertion point) is not supported"));
        }
        Field::Wrong(_) => return Err(ApiError::invalid("suffix", "`suffix` must be a string")),
    }
    let echo = echo_field(&r.options)?;
    if echo && p.logprobs.is_some() {
        return Err(ApiError::invalid(
            "echo",
            "`echo` with `logprobs` needs the prompt tokens' logprobs, which this server does not compute; \
             send one or the other",
        ));
    }
    Ok(echo)
}

/// Refuses `echo: true` on chat completions by name (a completions field).
pub fn refuse_chat_echo(o: &RequestOptions) -> Result<(), ApiError> {
    match echo_field(o)? {
        true => Err(ApiError::invalid("echo", "`echo` is a /v1/completions field; chat completions do not echo")),
        false => Ok(()),
    }
}

fn echo_field(o: &RequestOptions) -> Result<bool, ApiError> {
    match &o.echo {
        Field::Absent => Ok(false),
        Field::Given(b) => Ok(*b),
        Field::Wrong(_) => Err(ApiError::invalid("echo", "`echo` must be true or false")),
    }
}

/// The text to echo for `prompt` (`None` without `echo`): a text prompt as sent, token ids decoded with their special
/// tokens (vLLM echoes the prompt as the tokenizer decodes it). Errors: ids without a tokenizer, ids it cannot
/// decode.
pub async fn echo_text(s: &AppState, r: &Ready, prompt: &Prompt, echo: bool) -> Result<Option<String>, ApiError> {
    if !echo {
        return Ok(None);
    }
    let ids = match prompt {
        Prompt::Text(t) => return Ok(Some(t.clone())),
        Prompt::Ids(ids) => ids.clone(),
    };
    let text = r.text.clone().ok_or_else(|| {
        ApiError::invalid("echo", "`echo` of a token-id prompt needs the model's tokenizer, and this model has none")
    })?;
    let decoded = s.text_pool.run(ids.len() * 4, move || text.decode(&ids, false)).await?;
    decoded.map(Some).map_err(|e: TextError| ApiError::invalid("prompt", e.to_string()))
}
