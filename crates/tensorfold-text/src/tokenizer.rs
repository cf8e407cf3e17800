//! The tokenizer: a checkpoint's `tokenizer.json` and `tokenizer_config.json` (special tokens, chat template
//! source), loaded from a directory or from bytes, and encoding / decoding token ids.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use tokenizers::Tokenizer;

use crate::content_tokens::ContentGuard;
use crate::detokenizer::Detokenizer;
use crate::error::TextError;

/// A checkpoint's tokenizer, special tokens and chat template.
pub struct Text {
    tokenizer: Tokenizer,
    pub(crate) chat_template: Option<String>,
    /// The chat template compiled, on first use (`template_render`); a syntax error is kept as its message.
    pub(crate) compiled: std::sync::OnceLock<Result<std::sync::Arc<crate::template_render::Compiled>, String>>,
    /// Names this text's chat template to render workers, which compile a source once and keep it by key
    /// (`render_pool`); unique in the process.
    pub(crate) template_key: u64,
    pub(crate) bos_token: Option<String>,
    pub(crate) eos_token: Option<String>,
    pub(crate) pad_token: Option<String>,
    /// Keeps special-token strings in chat content plain text.
    pub(crate) guard: ContentGuard,
    /// The structured-output token environment, built on first use (`grammar_env.rs`).
    pub(crate) grammar: std::sync::OnceLock<Result<crate::grammar_env::GrammarEnv, String>>,
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
        let guard = ContentGuard::new(&tokenizer)?;
        let mut text = Text {
            tokenizer,
            chat_template: None,
            bos_token: None,
            eos_token: None,
            pad_token: None,
            guard,
            grammar: std::sync::OnceLock::new(),
            compiled: std::sync::OnceLock::new(),
            template_key: crate::render_pool::next_template_key(),
        };
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
        // transformers' `{% generation %}` read once at open (`template_compat`); it never lengthens a source.
        text.chat_template = text.chat_template.map(|s| crate::template_compat::generation_blocks(&s).into_owned());
        text.probe_chat_template()?;
        Ok(text)
    }

    /// The tokenizers library's tokenizer (for `grammar_env.rs`).
    pub(crate) fn hf(&self) -> &Tokenizer {
        &self.tokenizer
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

    pub(crate) fn check_ids(&self, ids: &[u32]) -> Result<(), TextError> {
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

    /// An incremental detokenizer borrowing this text (see [`Detokenizer`]).
    pub fn detokenizer(&self, skip_special_tokens: bool) -> Detokenizer<&Text> {
        Detokenizer::new(self, skip_special_tokens)
    }
}
