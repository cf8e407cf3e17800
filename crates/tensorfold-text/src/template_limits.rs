//! Bounds on rendering a chat template (templates come with checkpoints from a hub: they are input): minijinja's
//! fuel as a step budget, a cap on the rendered size, and format widths refused before they allocate.

use minijinja::value::Value;
use minijinja::{Error, ErrorKind, State};

use crate::error::TextError;

/// minijinja fuel for one render: about 4M instructions (or 256 MB of data produced, 64 bytes a unit of fuel);
/// the default model's template spends a few thousand.
pub const TEMPLATE_FUEL: u64 = 4_000_000;

/// Largest rendered prompt: 8 MiB of text (twice the 4 MiB request body), checked as it is written.
pub const TEMPLATE_MAX_BYTES: usize = 8 << 20;

/// Largest width or precision a format spec may ask for (`"%9999999999s"|format(x)`, `"{:>9999999999}".format(x)`
/// allocate that much at once, before fuel or the size cap can see it).
pub const MAX_FORMAT_WIDTH: usize = 1 << 16;

/// A writer that refuses to grow past [`TEMPLATE_MAX_BYTES`] (and records that it did).
pub(crate) struct Capped {
    pub(crate) buf: Vec<u8>,
    pub(crate) over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > TEMPLATE_MAX_BYTES {
            self.over = true;
            return Err(std::io::Error::other("the rendered chat template is over its size limit"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The named error for a failed render: out of fuel is [`TextError::TemplateBudget`], past the size cap (or a
/// refused width) [`TextError::TemplateTooLarge`]; anything else is `None` (the caller's own mapping).
pub(crate) fn budget_error(e: &Error, over: bool) -> Option<TextError> {
    if e.kind() == ErrorKind::OutOfFuel {
        return Some(TextError::TemplateBudget { fuel: TEMPLATE_FUEL });
    }
    if over || e.detail().is_some_and(|d| d.contains(WIDTH_REFUSED)) {
        return Some(TextError::TemplateTooLarge { limit: TEMPLATE_MAX_BYTES });
    }
    None
}

const WIDTH_REFUSED: &str = "format width past the limit";

fn width_error() -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{WIDTH_REFUSED} ({MAX_FORMAT_WIDTH})"))
}

/// pycompat's method callback, with `str.format` refused when a spec asks for a huge width.
pub(crate) fn method_callback(state: &mut State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    if method == "format" && value.as_str().is_some_and(|f| !widths_ok(f, args)) {
        return Err(width_error());
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The builtin `format` filter (printf style), with huge widths refused first.
pub(crate) fn format_filter(fmt: String, args: minijinja::value::Rest<Value>) -> Result<String, Error> {
    if !widths_ok(&fmt, &args) {
        return Err(width_error());
    }
    minijinja::formatting::format(minijinja::formatting::FormatStyle::Printf, &fmt, &args)
}

/// False when a digit run in the format string, or an integer argument that a printf `*` width could take, is
/// past [`MAX_FORMAT_WIDTH`]. Conservative: any long digit run counts, inside a spec or not (minijinja's
/// `str.format` has no nested `{}` widths).
pub(crate) fn widths_ok(fmt: &str, args: &[Value]) -> bool {
    let digits_ok = fmt
        .split(|c: char| !c.is_ascii_digit())
        .all(|run| run.len() <= 5 && run.parse::<usize>().map_or(true, |n| n <= MAX_FORMAT_WIDTH));
    let dynamic = fmt.contains('*');
    let args_ok = !dynamic
        || args.iter().all(|a| i64::try_from(a.clone()).map_or(true, |n| n.unsigned_abs() <= MAX_FORMAT_WIDTH as u64));
    digits_ok && args_ok
}
