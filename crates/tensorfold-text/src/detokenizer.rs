//! Incremental detokenizing of one stream: UTF-8 safe text pieces as tokens arrive.

use std::borrow::Borrow;

use crate::error::TextError;
use crate::tokenizer::Text;

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
