//! The render worker's wire format: length-prefixed frames between a process and its `render-worker` children
//! (`render_pool`, `render_worker`). A frame is a 4-byte little-endian length, then that many bytes: a tag byte and
//! its payload. Requests carry JSON; a rendered prompt comes back as raw UTF-8 (no escaping, so its frame is at
//! most the prompt's cap); an error comes back as the `TextError` variant by name in JSON.

use std::borrow::Cow;
use std::io::{self, Read, Write};

use minijinja::value::{Serde, Value};
use serde::{Deserialize, Serialize};

use crate::chat_template::ChatMessage;
use crate::error::TextError;
use crate::template_limits::TEMPLATE_MAX_BYTES;
use crate::template_render;

/// Largest request frame: 64 MiB (a 4 MiB request body's messages written back as JSON, escapes included, plus a
/// template source of at most 256 KiB).
pub const MAX_REQUEST_FRAME: usize = 64 << 20;

/// Largest reply frame: the rendered prompt's cap ([`TEMPLATE_MAX_BYTES`]) plus 64 KiB for an error's JSON.
pub const MAX_REPLY_FRAME: usize = TEMPLATE_MAX_BYTES + (64 << 10);

/// Request tag: render (payload: a [`RenderRequest`] in JSON).
pub(crate) const TAG_RENDER: u8 = 1;
/// Reply tag: the rendered prompt (payload: its UTF-8 bytes).
pub(crate) const TAG_OK: u8 = 1;
/// Reply tag: the render's error (payload: a [`WireError`] in JSON).
pub(crate) const TAG_ERR: u8 = 2;
/// Reply tag: the worker does not hold the template the request's key names (payload empty); send its source.
pub(crate) const TAG_UNKNOWN: u8 = 3;
/// Bit set on a reply's tag when the worker must not be used again: a render of it was given up at its backstop
/// and its thread may still run.
pub(crate) const RETIRE: u8 = 0x80;

/// The variables a chat template sees (transformers' `apply_chat_template`), borrowed in the caller, owned in a
/// worker that read them.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RenderCall<'a> {
    pub(crate) messages: Cow<'a, [ChatMessage]>,
    pub(crate) add_generation_prompt: bool,
    pub(crate) bos_token: Option<Cow<'a, str>>,
    pub(crate) eos_token: Option<Cow<'a, str>>,
    pub(crate) pad_token: Option<Cow<'a, str>>,
    pub(crate) tools: Option<Cow<'a, [serde_json::Value]>>,
}

impl RenderCall<'_> {
    /// The template's context: `messages`, `add_generation_prompt`, the special tokens (undefined when the config
    /// has none) and `tools` (none without a list). The same value in a worker as in-process, so the same bytes.
    pub(crate) fn context(&self) -> Value {
        let opt = |t: &Option<Cow<'_, str>>| t.as_deref().map_or(Value::UNDEFINED, Value::from);
        minijinja::context! {
            messages => Value::from(Serde(&*self.messages)),
            add_generation_prompt => self.add_generation_prompt,
            bos_token => opt(&self.bos_token),
            eos_token => opt(&self.eos_token),
            pad_token => opt(&self.pad_token),
            tools => self.tools.as_deref().map_or(Value::from(()), |t| Value::from(Serde(t))),
        }
    }
}

/// One render request: the template by key (its source the first time a worker sees the key) and the call.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RenderRequest<'a> {
    pub(crate) key: u64,
    pub(crate) source: Option<Cow<'a, str>>,
    pub(crate) call: RenderCall<'a>,
}

/// A render's [`TextError`] by variant name, as it crosses the pipe.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "error")]
pub(crate) enum WireError {
    NoChatTemplate,
    Template { message: String },
    TemplateBudget { fuel: u64 },
    TemplateTime { limit_ms: u64 },
    TemplateItems { limit: u64 },
    TemplateTooLarge { limit: usize },
    TemplateSource { bytes: usize, limit: usize },
    TemplateWorker { message: String },
}

impl From<TextError> for WireError {
    /// Messages within `template_render::MAX_ERROR_MESSAGE` (renders bound theirs already; this bounds the
    /// worker's own), so an error's frame is always within [`MAX_REPLY_FRAME`].
    fn from(e: TextError) -> Self {
        match template_render::bounded_error(e) {
            TextError::NoChatTemplate => Self::NoChatTemplate,
            TextError::Template(message) => Self::Template { message },
            TextError::TemplateBudget { fuel } => Self::TemplateBudget { fuel },
            TextError::TemplateTime { limit_ms } => Self::TemplateTime { limit_ms },
            TextError::TemplateItems { limit } => Self::TemplateItems { limit },
            TextError::TemplateTooLarge { limit } => Self::TemplateTooLarge { limit },
            TextError::TemplateSource { bytes, limit } => Self::TemplateSource { bytes, limit },
            TextError::TemplateWorker(message) => {
                Self::TemplateWorker { message: template_render::bounded_message(message) }
            }
            // A render makes none of the others; carried by their message if one ever does.
            other => Self::Template { message: template_render::bounded_message(other.to_string()) },
        }
    }
}

impl From<WireError> for TextError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::NoChatTemplate => Self::NoChatTemplate,
            WireError::Template { message } => Self::Template(message),
            WireError::TemplateBudget { fuel } => Self::TemplateBudget { fuel },
            WireError::TemplateTime { limit_ms } => Self::TemplateTime { limit_ms },
            WireError::TemplateItems { limit } => Self::TemplateItems { limit },
            WireError::TemplateTooLarge { limit } => Self::TemplateTooLarge { limit },
            WireError::TemplateSource { bytes, limit } => Self::TemplateSource { bytes, limit },
            WireError::TemplateWorker { message } => Self::TemplateWorker(message),
        }
    }
}

/// Why no frame was read.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The stream ended cleanly before a frame began.
    Closed,
    /// The stream ended inside a frame, or could not be read.
    Io(io::Error),
    /// The frame's declared length (bytes) is 0 or past the reader's bound.
    Length(u32),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed => write!(f, "the stream ended"),
            Self::Io(e) => write!(f, "reading a frame: {e}"),
            Self::Length(n) => write!(f, "a frame of {n} bytes (empty or over the bound)"),
        }
    }
}

/// A whole frame: length, `tag`, then `payload`, ready for one `write_all`.
///
/// # Errors
/// [`TextError::Template`] when the frame would be over `u32::MAX` bytes.
pub(crate) fn frame(tag: u8, payload: &[u8]) -> Result<Vec<u8>, TextError> {
    let len = u32::try_from(payload.len() + 1)
        .map_err(|_| TextError::Template(format!("a render frame of {} bytes is too large", payload.len())))?;
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.extend_from_slice(&len.to_le_bytes());
    out.push(tag);
    out.extend_from_slice(payload);
    Ok(out)
}

/// A render request's whole frame.
///
/// # Errors
/// [`TextError::Template`] when the request is over [`MAX_REQUEST_FRAME`] (a worker would refuse it) or cannot
/// be written as JSON.
pub(crate) fn request_frame(req: &RenderRequest<'_>) -> Result<Vec<u8>, TextError> {
    // Written after a 5-byte head that is filled in once the length is known: one buffer, no copy.
    let mut out = vec![0u8; 5];
    serde_json::to_writer(&mut out, req).map_err(|e| TextError::Template(format!("the render request: {e}")))?;
    let len = out.len() - 4;
    if len > MAX_REQUEST_FRAME {
        return Err(TextError::Template(format!(
            "the chat's render request is {len} bytes, over the render worker's limit of {MAX_REQUEST_FRAME}"
        )));
    }
    // Within MAX_REQUEST_FRAME, so within u32.
    out[..4].copy_from_slice(&(len as u32).to_le_bytes());
    out[4] = TAG_RENDER;
    Ok(out)
}

/// Writes `bytes` (a whole frame) and flushes.
///
/// # Errors
/// The write's I/O error (a broken pipe when the other side is gone).
pub(crate) fn send(w: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    w.write_all(bytes)?;
    w.flush()
}

/// Reads one frame of at most `max` bytes (tag included): its tag and payload. The payload's buffer is allocated
/// only after the length is checked.
///
/// # Errors
/// [`FrameError::Closed`] at a clean end, [`FrameError::Length`] for an empty or oversized frame,
/// [`FrameError::Io`] for an end inside the frame or a read error.
pub(crate) fn read_frame(r: &mut impl Read, max: usize) -> Result<(u8, Vec<u8>), FrameError> {
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = u32::from_le_bytes(head);
    if len == 0 || len as usize > max {
        return Err(FrameError::Length(len));
    }
    let mut tag = [0u8; 1];
    r.read_exact(&mut tag).map_err(FrameError::Io)?;
    let mut body = vec![0u8; len as usize - 1];
    r.read_exact(&mut body).map_err(FrameError::Io)?;
    Ok((tag[0], body))
}
