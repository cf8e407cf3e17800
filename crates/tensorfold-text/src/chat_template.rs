//! The chat template: OpenAI-shaped chat messages and rendering them with the checkpoint's Jinja template the way
//! transformers' `apply_chat_template` does (plus the UTC `strftime_now` templates may call, and transformers'
//! `{% generation %}` block and Python's `str` as the `string` filter: `template_compat`).

use std::sync::Arc;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::error::TextError;
use crate::render_wire::RenderCall;
use crate::template_limits;
use crate::template_render;
use crate::tokenizer::Text;

/// One part of a list-shaped message content (OpenAI `{"type": "text", "text": ...}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// A text part.
    Text {
        /// The part's text.
        text: String,
    },
}

/// A message's content, the OpenAI way: `"hi"` or `[{"type": "text", "text": "hi"}]`.
///
/// Serializes back to the same JSON shape, which is what chat templates see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain string content.
    Text(String),
    /// A list of typed parts.
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// Bytes of all text of the content (what [`MessageContent::as_text`] would hold).
    pub fn byte_len(&self) -> usize {
        match self {
            Self::Text(t) => t.len(),
            Self::Parts(parts) => parts.iter().map(|ContentPart::Text { text }| text.len()).sum(),
        }
    }

    /// All text of the content, parts concatenated in order.
    pub fn as_text(&self) -> String {
        match self {
            Self::Text(t) => t.clone(),
            Self::Parts(parts) => parts.iter().map(|ContentPart::Text { text }| text.as_str()).collect(),
        }
    }
}

impl From<&str> for MessageContent {
    fn from(s: &str) -> Self {
        Self::Text(s.to_owned())
    }
}

impl From<String> for MessageContent {
    fn from(s: String) -> Self {
        Self::Text(s)
    }
}

/// One chat message (`{"role": ..., "content": ...}`), as the OpenAI API sends it. The tool fields are left out
/// of the template's view when absent, so a chat without tools renders as it always did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ... (passed to the template verbatim).
    pub role: String,
    /// The message content.
    pub content: MessageContent,
    /// An assistant's `tool_calls`: `[{"id", "type": "function", "function": {"name", "arguments"}}]`, with
    /// `arguments` a JSON object (the server parses OpenAI's JSON text, as vLLM does for templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message's `tool_call_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<MessageContent>) -> Self {
        Self { role: role.into(), content: content.into(), tool_calls: None, tool_call_id: None }
    }
}

impl Text {
    /// Renders the checkpoint's chat template the way transformers' `apply_chat_template`
    /// does: minijinja with `trim_blocks` and `lstrip_blocks`, Python string methods
    /// (minijinja-contrib pycompat), `raise_exception(msg)`, `strftime_now(fmt)` (UTC), and
    /// the variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
    /// `pad_token` (undefined when the config has none) and `tools` (none: [`Text::render_chat_with_tools`]
    /// passes a list).
    ///
    /// Bounded: [`template_limits::TEMPLATE_FUEL`] steps, [`template_limits::TEMPLATE_MAX_BYTES`] of output,
    /// format widths up to [`template_limits::MAX_FORMAT_WIDTH`], [`crate::render_budget::TEMPLATE_DEADLINE`] of
    /// wall-clock time and [`crate::render_budget::TEMPLATE_MAX_ITEMS`] range items (`template_render::render`
    /// says how). With a render pool installed (`render_pool::install`, as `tensorfold serve` does) the render runs
    /// in a worker process that is killed past the deadline or its memory limit, which bounds the work inside
    /// minijinja's own steps too; without one it runs in this process, compiled once, at the first render.
    ///
    /// # Errors
    /// [`TextError::NoChatTemplate`] without a template; [`TextError::Template`] for a
    /// compile/render error or a `raise_exception` call (carrying its message);
    /// [`TextError::TemplateBudget`] / [`TextError::TemplateItems`] / [`TextError::TemplateTime`] /
    /// [`TextError::TemplateTooLarge`] / [`TextError::TemplateSource`] past the bounds;
    /// [`TextError::TemplateWorker`] when a render process ended (past its memory limit);
    /// [`TextError::TemplateWorkerStart`] when none could be started.
    pub fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TextError> {
        self.render_chat_with_tools(messages, add_generation_prompt, None)
    }

    /// [`Text::render_chat`] with `tools` bound to a list (transformers' `apply_chat_template(tools=...)`): each
    /// item is what the template writes, for LFM2 the OpenAI function object `{"name", "description",
    /// "parameters"}`, which LFM2 templates write with `tojson` into the system prompt. `None` binds `tools` to
    /// none, as without tools.
    ///
    /// # Errors
    /// As [`Text::render_chat`].
    pub fn render_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&[serde_json::Value]>,
    ) -> Result<String, TextError> {
        let source = self.template_source()?;
        let call = self.render_call(messages, add_generation_prompt, tools);
        match crate::render_pool::installed() {
            Some(pool) => pool.render(self.template_key, source, &call),
            None => self.render_in_process(&call),
        }
    }

    /// The variables the template sees, borrowed.
    pub(crate) fn render_call<'a>(
        &'a self,
        messages: &'a [ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&'a [serde_json::Value]>,
    ) -> RenderCall<'a> {
        RenderCall {
            messages: Cow::Borrowed(messages),
            add_generation_prompt,
            bos_token: self.bos_token.as_deref().map(Cow::Borrowed),
            eos_token: self.eos_token.as_deref().map(Cow::Borrowed),
            pad_token: self.pad_token.as_deref().map(Cow::Borrowed),
            tools: tools.map(Cow::Borrowed),
        }
    }

    /// [`Text::render_chat_with_tools`] in this process whatever is installed (`template_render::render`: a thread
    /// of its own with its backstop).
    ///
    /// # Errors
    /// As [`Text::render_chat`].
    pub(crate) fn render_in_process(&self, call: &RenderCall<'_>) -> Result<String, TextError> {
        let compiled = self.compiled_template()?;
        template_render::render(&compiled, call.context())
    }

    /// The chat template's source, within [`template_limits::TEMPLATE_MAX_SOURCE`].
    ///
    /// # Errors
    /// [`TextError::NoChatTemplate`], [`TextError::TemplateSource`] past the source cap.
    pub(crate) fn template_source(&self) -> Result<&str, TextError> {
        let source = self.chat_template.as_deref().ok_or(TextError::NoChatTemplate)?;
        if source.len() > template_limits::TEMPLATE_MAX_SOURCE {
            return Err(TextError::TemplateSource { bytes: source.len(), limit: template_limits::TEMPLATE_MAX_SOURCE });
        }
        Ok(source)
    }

    /// The chat template compiled once (on the render stack: parsing recurses as deep as the source nests).
    ///
    /// # Errors
    /// [`TextError::NoChatTemplate`], [`TextError::TemplateSource`] past the source cap, [`TextError::Template`]
    /// for a syntax error.
    fn compiled_template(&self) -> Result<Arc<template_render::Compiled>, TextError> {
        let source = self.template_source()?;
        if let Some(done) = self.compiled.get() {
            return done.clone().map_err(TextError::Template);
        }
        // A thread that cannot start is this call's error; a syntax error is the template's, kept.
        let fresh = template_render::compile_on_stack(source)?;
        self.compiled.get_or_init(|| fresh).clone().map_err(TextError::Template)
    }

    /// Sets the chat template source, dropping the compiled one (tests swap templates on a built text).
    #[cfg(test)]
    pub(crate) fn set_chat_template(&mut self, source: &str) {
        self.chat_template = Some(source.to_string());
        self.compiled = std::sync::OnceLock::new();
        self.template_key = crate::render_pool::next_template_key();
    }

    /// Renders probe messages once (at open): a template that runs out of its budget or size limit on them
    /// would on every request, so it is refused by name, as is one whose render worker ends on them (past its
    /// memory limit) or cannot start (every chat would fail); other render errors (a template that raises for
    /// these roles) are left to requests.
    ///
    /// # Errors
    /// [`TextError::TemplateBudget`], [`TextError::TemplateItems`], [`TextError::TemplateTime`],
    /// [`TextError::TemplateTooLarge`], [`TextError::TemplateSource`], [`TextError::TemplateWorker`] or
    /// [`TextError::TemplateWorkerStart`].
    pub fn probe_chat_template(&self) -> Result<(), TextError> {
        if self.chat_template.is_none() {
            return Ok(());
        }
        let probe = [
            ChatMessage::new("system", "You are a probe."),
            ChatMessage::new("user", "Hello."),
            ChatMessage::new("assistant", "Hi."),
            ChatMessage::new("user", "Bye."),
        ];
        match self.render_chat(&probe, true) {
            Err(
                e @ (TextError::TemplateBudget { .. }
                | TextError::TemplateItems { .. }
                | TextError::TemplateTime { .. }
                | TextError::TemplateTooLarge { .. }
                | TextError::TemplateSource { .. }
                | TextError::TemplateWorker(_)
                | TextError::TemplateWorkerStart(_)),
            ) => Err(e),
            _ => Ok(()),
        }
    }

    /// Renders the chat then encodes it WITHOUT adding special tokens: the template emits
    /// its own BOS, so the post-processor must not add a second one. Special-token strings inside message
    /// content are tokenized as plain text (`content_tokens`), the template's own as control tokens.
    ///
    /// # Errors
    /// As [`Text::render_chat`] and [`Text::encode`].
    pub fn encode_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>, TextError> {
        self.encode_chat_with_tools(messages, add_generation_prompt, None)
    }

    /// [`Text::encode_chat`] with `tools` as [`Text::render_chat_with_tools`] binds them; special-token strings
    /// inside the tools and the messages' tool calls are plain text too.
    ///
    /// # Errors
    /// As [`Text::render_chat`] and [`Text::encode`].
    pub fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&[serde_json::Value]>,
    ) -> Result<Vec<u32>, TextError> {
        match self.guard.escape(messages, tools) {
            None => {
                let prompt = self.render_chat_with_tools(messages, add_generation_prompt, tools)?;
                self.encode(&prompt, false)
            }
            Some((escaped, tools)) => {
                let prompt = self.render_chat_with_tools(&escaped, add_generation_prompt, tools.as_deref())?;
                self.guard.encode(self, &prompt)
            }
        }
    }
}

/// Formats a Unix time (seconds, UTC) with the common `strftime` fields: `%Y %y %m %d %e
/// %H %I %M %S %p %b %h %B %a %A %j %%`; other `%x` sequences are copied verbatim.
pub(crate) fn strftime_utc(fmt: &str, secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (hour, minute, second) = (tod / 3600, tod / 60 % 60, tod % 60);
    // Civil date from days since 1970-01-01 (H. Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let (era, doe) = (z.div_euclid(146_097), z.rem_euclid(146_097));
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Day of year: March-based doy shifted to January-based.
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let yday = if mp >= 10 { doy - 306 } else { doy + 59 + i64::from(leap) } + 1;
    let weekday = (days + 4).rem_euclid(7) as usize;
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out += &year.to_string(),
            Some('y') => out += &format!("{:02}", year.rem_euclid(100)),
            Some('m') => out += &format!("{month:02}"),
            Some('d') => out += &format!("{day:02}"),
            Some('e') => out += &format!("{day:2}"),
            Some('H') => out += &format!("{hour:02}"),
            Some('I') => out += &format!("{:02}", (hour + 11) % 12 + 1),
            Some('M') => out += &format!("{minute:02}"),
            Some('S') => out += &format!("{second:02}"),
            Some('p') => out += if hour < 12 { "AM" } else { "PM" },
            Some('b') | Some('h') => out += &month_name[..3],
            Some('B') => out += month_name,
            Some('a') => out += &DAYS[weekday][..3],
            Some('A') => out += DAYS[weekday],
            Some('j') => out += &format!("{yday:03}"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}
