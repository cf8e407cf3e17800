//! The text side of a checkpoint: tokenizer, chat template, and incremental detokenizing.

use std::borrow::Borrow;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use minijinja::value::{Serde, Value};
use minijinja::{Environment, context};
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

/// Why text could not be loaded, encoded, decoded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A checkpoint file exists but could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The tokenizers library refused the tokenizer file or an encode/decode call.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// `tokenizer_config.json` or `chat_template.jinja` is malformed.
    #[error("{}: {message}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The checkpoint ships no chat template (neither `chat_template.jinja` nor a
    /// `chat_template` in `tokenizer_config.json`).
    #[error("the checkpoint has no chat template; send a raw prompt instead")]
    NoChatTemplate,
    /// The chat template failed to compile or render, or called `raise_exception`.
    #[error("chat template: {0}")]
    Template(String),
    /// The prompt text contributes no tokens.
    #[error("the prompt tokenizes to zero tokens")]
    EmptyPrompt,
    /// A token id past the vocabulary (including added tokens).
    #[error("token id {0} is not in the vocabulary")]
    UnknownToken(u32),
    /// A caller needs text but the checkpoint has no tokenizer.
    #[error("the checkpoint has no tokenizer.json; this command needs text")]
    NoTokenizer,
}

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

/// One chat message (`{"role": ..., "content": ...}`), as the OpenAI API sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ... (passed to the template verbatim).
    pub role: String,
    /// The message content.
    pub content: MessageContent,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<MessageContent>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// A checkpoint's tokenizer, special tokens and chat template.
pub struct Text {
    tokenizer: Tokenizer,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Text")
            .field("vocab_size", &self.vocab_size())
            .field("has_chat_template", &self.has_chat_template())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

/// Reads a file, `Ok(None)` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, TextError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TextError::Io { path: path.to_owned(), source }),
    }
}

/// A special-token field of `tokenizer_config.json`: a string, an AddedToken-like object
/// `{"content": ...}`, or null/absent.
fn token_field(cfg: &serde_json::Value, key: &str, path: &Path) -> Result<Option<String>, TextError> {
    match cfg.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(obj @ serde_json::Value::Object(_)) => match obj.get("content") {
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(config_error(path, format!("{key} object has no string \"content\""))),
        },
        Some(other) => Err(config_error(path, format!("{key} is neither a string nor an object: {other}"))),
    }
}

fn config_error(path: &Path, message: String) -> TextError {
    TextError::Config { path: path.to_owned(), message }
}

/// `chat_template` of `tokenizer_config.json`: a string, or a list of `{name, template}`
/// from which the entry named `"default"` is taken (transformers' multi-template form).
fn template_field(cfg: &serde_json::Value, path: &Path) -> Result<Option<String>, TextError> {
    match cfg.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .map(|t| match t.get("template") {
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                _ => Err(config_error(path, "chat_template \"default\" has no string template".into())),
            })
            .unwrap_or_else(|| Err(config_error(path, "chat_template list has no entry named \"default\"".into()))),
        Some(other) => Err(config_error(path, format!("chat_template is neither a string nor a list: {other}"))),
    }
}

impl Text {
    /// Loads `tokenizer.json`, `tokenizer_config.json` (optional) and `chat_template.jinja`
    /// (optional; it wins over the config's `chat_template`, as in transformers) from a
    /// Hugging Face checkpoint directory.
    ///
    /// Returns `Ok(None)` when the directory has no `tokenizer.json` (the checkpoint still
    /// serves token-id work).
    ///
    /// # Errors
    /// [`TextError::Io`] for an unreadable file, [`TextError::Tokenizer`] for a corrupt
    /// `tokenizer.json`, [`TextError::Config`] for a malformed config or template file; each
    /// names the file.
    pub fn open(dir: &Path) -> Result<Option<Text>, TextError> {
        let tok_path = dir.join("tokenizer.json");
        let Some(tokenizer_json) = read_optional(&tok_path)? else {
            return Ok(None);
        };
        let cfg_path = dir.join("tokenizer_config.json");
        let config = read_optional(&cfg_path)?;
        let jinja_path = dir.join("chat_template.jinja");
        let jinja = match read_optional(&jinja_path)? {
            Some(bytes) => {
                Some(String::from_utf8(bytes).map_err(|_| config_error(&jinja_path, "not valid UTF-8".into()))?)
            }
            None => None,
        };
        Self::build(&tokenizer_json, &tok_path, config.as_deref().map(|c| (c, cfg_path.as_path())), jinja).map(Some)
    }

    /// Builds from file contents (e.g. a default model embedded in the binary); the
    /// arguments mirror [`Text::open`]'s three files.
    ///
    /// # Errors
    /// As [`Text::open`], naming the files by their bare names.
    pub fn from_parts(
        tokenizer_json: &[u8],
        tokenizer_config_json: Option<&[u8]>,
        chat_template_jinja: Option<&str>,
    ) -> Result<Text, TextError> {
        Self::build(
            tokenizer_json,
            Path::new("tokenizer.json"),
            tokenizer_config_json.map(|c| (c, Path::new("tokenizer_config.json"))),
            chat_template_jinja.map(str::to_owned),
        )
    }

    fn build(
        tokenizer_json: &[u8],
        tok_path: &Path,
        config: Option<(&[u8], &Path)>,
        jinja: Option<String>,
    ) -> Result<Text, TextError> {
        let tokenizer = Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| TextError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
        let mut text = Text { tokenizer, chat_template: None, bos_token: None, eos_token: None, pad_token: None };
        if let Some((bytes, path)) = config {
            let cfg: serde_json::Value =
                serde_json::from_slice(bytes).map_err(|e| config_error(path, format!("invalid JSON: {e}")))?;
            if !cfg.is_object() {
                return Err(config_error(path, "not a JSON object".into()));
            }
            text.chat_template = template_field(&cfg, path)?;
            text.bos_token = token_field(&cfg, "bos_token", path)?;
            text.eos_token = token_field(&cfg, "eos_token", path)?;
            text.pad_token = token_field(&cfg, "pad_token", path)?;
        }
        if jinja.is_some() {
            text.chat_template = jinja;
        }
        Ok(text)
    }

    /// Token ids of `text`; `add_special_tokens` runs the tokenizer's post-processor (e.g. a
    /// leading BOS). Special tokens written in the text are matched either way.
    ///
    /// # Errors
    /// [`TextError::Tokenizer`] if the tokenizers library fails.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// A raw (non-chat) prompt: encoded with special tokens, like transformers' default.
    ///
    /// # Errors
    /// [`TextError::EmptyPrompt`] when the text itself contributes no token (a BOS the
    /// post-processor adds does not count); [`TextError::Tokenizer`] on library failure.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TextError> {
        let enc = self.tokenizer.encode(text, true).map_err(|e| TextError::Tokenizer(e.to_string()))?;
        let added = enc.get_special_tokens_mask().iter().filter(|&&m| m == 1).count();
        if enc.get_ids().len() <= added {
            return Err(TextError::EmptyPrompt);
        }
        Ok(enc.get_ids().to_vec())
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), TextError> {
        match ids.iter().find(|&&id| self.tokenizer.id_to_token(id).is_none()) {
            Some(&id) => Err(TextError::UnknownToken(id)),
            None => Ok(()),
        }
    }

    /// Text of `ids`; undecodable byte sequences become U+FFFD (lossy UTF-8).
    ///
    /// # Errors
    /// [`TextError::UnknownToken`] for the first id past the vocabulary (the tokenizers
    /// library would silently drop it); [`TextError::Tokenizer`] on library failure.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        self.check_ids(ids)?;
        self.tokenizer.decode(ids, skip_special_tokens).map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// Number of vocabulary entries, added tokens included (the model's logits row may be
    /// padded longer).
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The id of a token string (model vocabulary or added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// `bos_token` of `tokenizer_config.json`.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// `eos_token` of `tokenizer_config.json`.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// `pad_token` of `tokenizer_config.json`.
    pub fn pad_token(&self) -> Option<&str> {
        self.pad_token.as_deref()
    }

    /// Whether the checkpoint ships a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Renders the checkpoint's chat template the way transformers' `apply_chat_template`
    /// does: minijinja with `trim_blocks` and `lstrip_blocks`, Python string methods
    /// (minijinja-contrib pycompat), `raise_exception(msg)`, `strftime_now(fmt)` (UTC), and
    /// the variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
    /// `pad_token` (undefined when the config has none) and `tools` (none).
    ///
    /// # Errors
    /// [`TextError::NoChatTemplate`] without a template; [`TextError::Template`] for a
    /// compile/render error or a `raise_exception` call (carrying its message).
    pub fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TextError> {
        let source = self.chat_template.as_deref().ok_or(TextError::NoChatTemplate)?;
        let raised: Arc<OnceLock<String>> = Arc::default();
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TextError::Template(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        let sink = Arc::clone(&raised);
        env.add_function("raise_exception", move |msg: String| -> Result<Value, minijinja::Error> {
            let _ = sink.set(msg.clone());
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| {
            let secs =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
            strftime_utc(&fmt, secs)
        });
        let opt = |t: &Option<String>| t.as_deref().map_or(Value::UNDEFINED, Value::from);
        let ctx = context! {
            messages => Value::from(Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => opt(&self.bos_token),
            eos_token => opt(&self.eos_token),
            pad_token => opt(&self.pad_token),
            tools => Value::from(()),
        };
        let rendered = env.template_from_str(source).and_then(|t| t.render(ctx));
        rendered.map_err(|e| match raised.get() {
            Some(msg) => TextError::Template(format!("raise_exception: {msg}")),
            None => TextError::Template(e.to_string()),
        })
    }

    /// Renders the chat then encodes it WITHOUT adding special tokens: the template emits
    /// its own BOS, so the post-processor must not add a second one.
    ///
    /// # Errors
    /// As [`Text::render_chat`] and [`Text::encode`].
    pub fn encode_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>, TextError> {
        let prompt = self.render_chat(messages, add_generation_prompt)?;
        self.encode(&prompt, false)
    }

    /// An incremental detokenizer borrowing this text (see [`Detokenizer`]).
    pub fn detokenizer(&self, skip_special_tokens: bool) -> Detokenizer<&Text> {
        Detokenizer::new(self, skip_special_tokens)
    }
}

/// Formats a Unix time (seconds, UTC) with the common `strftime` fields: `%Y %y %m %d %e
/// %H %I %M %S %p %b %h %B %a %A %j %%`; other `%x` sequences are copied verbatim.
fn strftime_utc(fmt: &str, secs: i64) -> String {
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

/// Incremental detokenizer of one stream (text-generation-inference's prefix-offset scheme).
///
/// Each [`push`](Detokenizer::push) decodes a short window (the tokens since the previous
/// emission plus the tokens of that emission as context) and returns only the new text.
/// Output is held back while the decoded window ends in U+FFFD, so a multibyte character
/// split across tokens is never emitted broken. The concatenation of every push plus
/// [`finish`](Detokenizer::finish) equals [`Text::decode`] of all ids for decoders whose
/// output of a window extends the output of its prefix (byte-level BPE, Metaspace,
/// ByteFallback); for others a best-effort common-prefix difference is emitted.
///
/// `T` is `&Text`, `Arc<Text>` or anything else that borrows a [`Text`].
pub struct Detokenizer<T: Borrow<Text>> {
    text: T,
    skip_special_tokens: bool,
    window: Vec<u32>,
    prefix_tokens: usize,
    prefix_text: String,
}

/// The part of `full` after `prefix`, or after their longest common prefix (at a char
/// boundary) when the decoder rewrote earlier text.
fn text_after(full: &str, prefix: &str) -> String {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest.to_owned();
    }
    let common = full
        .char_indices()
        .zip(prefix.chars())
        .take_while(|((_, a), b)| a == b)
        .last()
        .map_or(0, |((i, a), _)| i + a.len_utf8());
    full[common..].to_owned()
}

impl<T: Borrow<Text>> Detokenizer<T> {
    /// A fresh stream over `text`; `skip_special_tokens` drops special tokens from output.
    pub fn new(text: T, skip_special_tokens: bool) -> Self {
        Self { text, skip_special_tokens, window: Vec::new(), prefix_tokens: 0, prefix_text: String::new() }
    }

    /// Appends a token and returns the newly completed text (possibly empty).
    ///
    /// # Errors
    /// [`TextError::UnknownToken`] for an id past the vocabulary (the stream is unchanged);
    /// [`TextError::Tokenizer`] on library failure.
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        let text = self.text.borrow();
        text.check_ids(&[id])?;
        self.window.push(id);
        let full = text.decode(&self.window, self.skip_special_tokens)?;
        if full.len() <= self.prefix_text.len() || full.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let new = text_after(&full, &self.prefix_text);
        self.window.drain(..self.prefix_tokens);
        self.prefix_tokens = self.window.len();
        self.prefix_text = text.decode(&self.window, self.skip_special_tokens)?;
        Ok(new)
    }

    /// Ends the stream, returning the held-back tail: an incomplete trailing character
    /// comes out as U+FFFD, exactly as [`Text::decode`] renders it.
    pub fn finish(self) -> String {
        let text = self.text.borrow();
        let full = text.decode(&self.window, self.skip_special_tokens).unwrap_or_default();
        if full.len() <= self.prefix_text.len() {
            return String::new();
        }
        text_after(&full, &self.prefix_text)
    }
}

#[cfg(test)]
mod tests;
