//! The token environment structured output needs: every token's bytes in a trie (`toktrie`, through
//! `toktrie_hf_tokenizers` from this checkpoint's `tokenizer.json`) and llguidance's `ParserFactory` over it, built
//! once a checkpoint, on the first constrained request.

use crate::error::TextError;
use crate::tokenizer::Text;
use llguidance::ParserFactory;
use std::sync::Arc;

/// A checkpoint's llguidance parser factory (cheap to clone).
#[derive(Clone)]
pub struct GrammarEnv {
    /// Compiles grammars into per-stream parsers.
    pub factory: Arc<ParserFactory>,
}

impl std::fmt::Debug for GrammarEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarEnv").field("vocab", &self.factory.tok_env().tok_trie().vocab_size()).finish()
    }
}

impl Text {
    /// The checkpoint's grammar environment, built on first use and kept: the tokenizer re-read by
    /// `toktrie_hf_tokenizers` (its JSON written back by the tokenizers library), its EOS set to the checkpoint's
    /// `eos_token` when it names one.
    ///
    /// # Errors
    /// [`TextError::Tokenizer`] when toktrie cannot read the tokenizer (e.g. neither byte-level nor byte-fallback).
    pub fn grammar_env(&self) -> Result<GrammarEnv, TextError> {
        self.grammar.get_or_init(|| self.build_grammar_env()).clone().map_err(TextError::Tokenizer)
    }

    fn build_grammar_env(&self) -> Result<GrammarEnv, String> {
        let json = self.hf().to_string(false).map_err(|e| format!("writing tokenizer.json back: {e}"))?;
        let mut bt = toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(json.as_bytes())
            .map_err(|e| format!("structured output cannot read this tokenizer: {e}"))?;
        if let Some(eos) = self.eos_token().and_then(|t| self.token_to_id(t)) {
            bt.set_eos_token(eos);
        }
        let env = bt.into_tok_env(None).map_err(|e| format!("structured output token environment: {e}"))?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| format!("llguidance parser factory: {e}"))?;
        factory.quiet();
        Ok(GrammarEnv { factory: Arc::new(factory) })
    }
}
