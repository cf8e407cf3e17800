//! Bounds on rendering a chat template (templates come with checkpoints from a hub: they are input): minijinja's
//! fuel as a step budget, a cap on the rendered size, format widths refused before they allocate, a cap on the
//! template's source, a render thread whose stack holds the deepest value the fuel lets a template build, and our
//! filters' walks over a value capped in depth and in items (a list shared into itself doubles a pass).

use minijinja::value::{Value, ValueKind};
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

/// Largest template source: 256 KiB (released templates are a few KiB). Parsing nests as the source does (a
/// chain of filters is one level each), so the source bounds the parser's depth.
pub const TEMPLATE_MAX_SOURCE: usize = 256 << 10;

/// Stack of the thread each render runs on: 512 MiB reserved, touched only as deep as a render goes. minijinja
/// drops, prints and compares nested values recursively (about 400 bytes of stack a level), and the fuel lets a
/// template nest a list about 450,000 deep (`{% set ns.x = [ns.x] %}` in a loop), about 180 MiB of stack; the
/// 2 MiB of a worker thread overflow at 10,000 and abort the process.
pub const RENDER_STACK_BYTES: usize = 512 << 20;

/// Deepest value our own filters (`tojson`, `pprint`, `string`) walk: 128 levels, as serde_json parses.
pub const MAX_VALUE_DEPTH: usize = 128;

/// Most items our own filters walk in one value: 1M (a shared list `[x, x]` doubled 40 times in a loop is 2^40
/// items deep for a few hundred fuel; walking it whole would take hours).
pub const MAX_VALUE_ITEMS: u64 = 1 << 20;

/// Runs `f` (compiling a template: parsing recurses as the source nests) on its own thread with
/// [`RENDER_STACK_BYTES`] of stack (scoped: it may borrow). Renders run on such a thread too (`template_render`),
/// one the caller can give up on.
///
/// # Errors
/// [`TextError::Template`] when the thread cannot be started or `f` panicked.
pub(crate) fn on_render_stack<T: Send>(f: impl FnOnce() -> Result<T, TextError> + Send) -> Result<T, TextError> {
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("chat-template".into())
            .stack_size(RENDER_STACK_BYTES)
            .spawn_scoped(scope, f)
            .map_err(|e| TextError::Template(format!("cannot start the render thread: {e}")))?;
        thread.join().unwrap_or_else(|_| Err(TextError::Template("the render panicked".into())))
    })
}

/// `Ok` when `v` nests at most [`MAX_VALUE_DEPTH`] levels of lists and maps, holds at most [`MAX_VALUE_ITEMS`]
/// items and [`TEMPLATE_MAX_BYTES`] of strings, counted as a walk visits them (a shared list once each time it is
/// reached): what `tojson`, `pprint` and `string` would print. The walk stops at the first limit it passes, so its
/// own depth and time are bounded.
///
/// # Errors
/// The refusal naming `filter` and the limit.
pub(crate) fn walk_within(v: &Value, filter: &str) -> Result<(), Error> {
    let mut left = WalkLeft { items: MAX_VALUE_ITEMS, bytes: TEMPLATE_MAX_BYTES };
    let limit = match walk(v, MAX_VALUE_DEPTH, &mut left) {
        Ok(()) => return Ok(()),
        Err(Walk::Deep) => format!("nests past {MAX_VALUE_DEPTH} levels"),
        Err(Walk::Wide) => format!("holds over {MAX_VALUE_ITEMS} items or {TEMPLATE_MAX_BYTES} bytes of text"),
    };
    Err(Error::new(ErrorKind::InvalidOperation, format!("{filter}: the value {limit}")))
}

/// Why [`walk`] stopped.
enum Walk {
    Deep,
    Wide,
}

/// What a [`walk`] may still visit.
struct WalkLeft {
    items: u64,
    bytes: usize,
}

fn walk(v: &Value, depth: usize, left: &mut WalkLeft) -> Result<(), Walk> {
    if let Some(s) = v.as_str() {
        left.bytes = left.bytes.checked_sub(s.len()).ok_or(Walk::Wide)?;
        return Ok(());
    }
    // Iterables too: `[0] * 100000000` is a lazy one of 100M items that `tojson` would collect whole.
    let walked = matches!(v.kind(), ValueKind::Seq | ValueKind::Map | ValueKind::Iterable);
    let Some(obj) = v.as_object().filter(|_| walked) else {
        return Ok(());
    };
    if depth == 0 {
        return Err(Walk::Deep);
    }
    let Some(iter) = obj.try_iter() else { return Ok(()) };
    let is_map = v.kind() == ValueKind::Map;
    for k in iter {
        left.items = left.items.checked_sub(1).ok_or(Walk::Wide)?;
        if is_map {
            walk(&k, depth - 1, left)?;
            walk(&v.get_item(&k).unwrap_or_default(), depth - 1, left)?;
        } else {
            walk(&k, depth - 1, left)?;
        }
    }
    Ok(())
}

/// `pprint`: minijinja's pretty form (`{:#?}`), refused past [`MAX_VALUE_DEPTH`] levels (its indentation makes
/// the text grow with the square of the depth) or [`MAX_VALUE_ITEMS`] items, and stopped at [`TEMPLATE_MAX_BYTES`]
/// as it is written.
pub(crate) fn pprint_filter(state: &State, value: &Value) -> Result<String, Error> {
    crate::render_budget::check(state)?;
    walk_within(value, "pprint")?;
    let mut out = CappedText(String::new());
    std::fmt::Write::write_fmt(&mut out, format_args!("{value:#?}")).map_err(|_| over_size())?;
    Ok(out.0)
}

/// The refusal of a filter's text past [`TEMPLATE_MAX_BYTES`] (read as [`TextError::TemplateTooLarge`]).
pub(crate) fn over_size() -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{OVER_SIZE} ({TEMPLATE_MAX_BYTES} bytes)"))
}

const OVER_SIZE: &str = "a filter's text is over the size limit";

/// A `fmt::Write` that fails once its text would pass [`TEMPLATE_MAX_BYTES`].
struct CappedText(String);

impl std::fmt::Write for CappedText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.0.len() + s.len() > TEMPLATE_MAX_BYTES {
            return Err(std::fmt::Error);
        }
        self.0.push_str(s);
        Ok(())
    }
}

/// A writer that refuses to grow past [`TEMPLATE_MAX_BYTES`] (and records that it did).
pub(crate) struct Capped {
    pub(crate) buf: Vec<u8>,
    pub(crate) over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        // Each write of the render's output is also a check of its deadline.
        crate::render_budget::check_stateless().map_err(std::io::Error::other)?;
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
    if over || e.detail().is_some_and(|d| d.contains(WIDTH_REFUSED) || d.contains(OVER_SIZE)) {
        return Some(TextError::TemplateTooLarge { limit: TEMPLATE_MAX_BYTES });
    }
    None
}

const WIDTH_REFUSED: &str = "format width past the limit";

fn width_error() -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{WIDTH_REFUSED} ({MAX_FORMAT_WIDTH})"))
}

/// pycompat's method callback, with each argument walked within [`walk_within`]'s limits and `str.format`
/// refused when a spec asks for a huge width.
pub(crate) fn method_callback(state: &mut State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    crate::render_budget::check(state)?;
    // Python's string methods print their arguments (`', '.join(x)`, `'{}'.format(x)`): walked first, bounded.
    args.iter().try_for_each(|a| walk_within(a, method))?;
    if method == "format" && value.as_str().is_some_and(|f| !widths_ok(f, args)) {
        return Err(width_error());
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The builtin `format` filter (printf style), with its arguments walked within [`walk_within`]'s limits and huge
/// widths refused first.
pub(crate) fn format_filter(state: &State, fmt: String, args: minijinja::value::Rest<Value>) -> Result<String, Error> {
    crate::render_budget::check(state)?;
    args.iter().try_for_each(|a| walk_within(a, "format"))?;
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
