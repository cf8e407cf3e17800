//! Structured output through llguidance (the library vLLM, SGLang and llama.cpp use): a request's grammar (a JSON
//! object, a JSON schema, a regex or a Lark grammar) compiled once at submission, then a per-stream matcher that
//! masks each row's logits to the tokens the grammar allows and advances with each committed token. The mask
//! depends only on the stream's own tokens, so row invariance holds; the core feeds the matcher only the tokens it
//! commits (a window's draws up to the first rejected draft), so a drafted reply equals its plain reply.

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

/// What a request constrains its reply to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `response_format: {type: json_object}`).
    JsonObject,
    /// JSON valid under a JSON Schema (OpenAI's `json_schema`; llguidance enforces it whether or not `strict`).
    JsonSchema(Value),
    /// Text matching a regular expression (vLLM's `guided_regex` / `structured_outputs.regex`).
    Regex(String),
    /// Text of a Lark grammar, llguidance's dialect (vLLM's `guided_grammar` / `structured_outputs.grammar`).
    Lark(String),
}

impl GrammarSpec {
    /// Its name in errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JsonObject => "the json_object format",
            Self::JsonSchema(_) => "the JSON schema",
            Self::Regex(_) => "the regex",
            Self::Lark(_) => "the grammar",
        }
    }

    fn top_level(&self) -> TopLevelGrammar {
        match self {
            // One fixed spelling of JSON (`compact`): a model cannot loop on whitespace (llama.cpp bounds it too).
            Self::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
            Self::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            Self::Regex(r) => TopLevelGrammar::from_regex(r),
            Self::Lark(l) => TopLevelGrammar::from_lark(l.clone()),
        }
    }
}

/// `schema` with llguidance's JSON options (its `x-guidance` key, unless the schema sets its own) set to one fixed
/// spelling (no free whitespace; `", "` between items and
/// `": "` after keys, as Python's `json.dumps` writes), so a model cannot spend its tokens on whitespace (vLLM's
/// `disable_any_whitespace`). A schema that is not an object is returned as it is.
pub fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut().filter(|o| !o.contains_key("x-guidance")) {
        o.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// A grammar llguidance refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{what} cannot be compiled: {why}")]
pub struct GrammarError {
    /// Which spec (`the JSON schema`, `the regex`, ...).
    pub what: &'static str,
    /// llguidance's reason.
    pub why: String,
}

/// One stream's grammar state: an llguidance matcher at the stream's committed tokens.
pub struct Grammar {
    /// Boxed: a matcher is large, and requests move through channels.
    matcher: Box<Matcher>,
}

impl Clone for Grammar {
    /// An independent copy (its own parser and lexer caches).
    fn clone(&self) -> Self {
        Self { matcher: Box::new(self.matcher.deep_clone()) }
    }
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("stopped", &self.matcher.is_stopped()).finish_non_exhaustive()
    }
}

impl Grammar {
    /// Compiles `spec` for the tokenizer behind `factory` (llguidance's limits bound its time and size).
    ///
    /// # Errors
    /// [`GrammarError`] with llguidance's reason: a schema, regex or grammar it cannot compile.
    pub fn compile(factory: &ParserFactory, spec: &GrammarSpec) -> Result<Self, GrammarError> {
        let err = |why: String| GrammarError { what: spec.kind(), why };
        let parser = factory.create_parser(spec.top_level()).map_err(|e| err(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(e) => Err(err(e)),
            None => Ok(Self { matcher: Box::new(matcher) }),
        }
    }

    /// Masks `logits` (`[vocab]`, vocab possibly past the tokenizer's) to the tokens the grammar allows next: every
    /// other logit becomes `f32::MIN`, which no draw picks while an allowed token is finite (the same tokens as
    /// vLLM's `-inf`, kept finite for the draw's checks).
    ///
    /// # Errors
    /// The matcher's error, or a dead end: no token is allowed.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self.matcher.compute_mask().map_err(|e| format!("the grammar failed: {e}"))?;
        let mut any = false;
        for (id, l) in logits.iter_mut().enumerate() {
            if id < allowed.len() && allowed.is_allowed(id as u32) {
                any = true;
            } else {
                *l = f32::MIN;
            }
        }
        if any { Ok(()) } else { Err("the grammar allows no token here (a dead end)".into()) }
    }

    /// Advances past a committed token.
    ///
    /// # Errors
    /// The matcher's refusal (a token the mask did not allow).
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| format!("the grammar refused token {token}: {e}"))
    }

    /// The grammar is complete: nothing more may follow (the stream stops).
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}
