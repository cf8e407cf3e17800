//! A checkpoint's chat template compiled once (a minijinja `Environment` holding it, shared by every request) and
//! each render run bounded: fuel and the output cap (`template_limits`), the deadline and item budget
//! (`render_budget`), on a thread of its own with a deep stack, and a backstop for work none of those can see
//! (stopped for good only in a render worker: `render_pool`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use minijinja::value::Value;
use minijinja::{Environment, Error, State};

use crate::error::TextError;
use crate::render_budget::{self, Over, TEMPLATE_DEADLINE, TEMPLATE_MAX_ITEMS};
use crate::template_limits::{self, Capped, RENDER_STACK_BYTES, TEMPLATE_FUEL};

/// How long past [`TEMPLATE_DEADLINE`] a caller waits for a render that has not stopped itself before it gives up
/// on it (the backstop; a render checks its deadline at each of our calls, so it only comes to this inside one of
/// minijinja's own instructions).
pub const BACKSTOP_GRACE: Duration = Duration::from_secs(1);

/// Longest error message of a compile or render, in bytes (16 KiB; longer ones are cut at a char boundary). A
/// `raise_exception` message is the template's own text, of any length: a render worker sends it back as JSON
/// (escapes can make it six times longer) within its reply frame's bound, and in-process renders cut it the same
/// way, so both give the same error.
pub(crate) const MAX_ERROR_MESSAGE: usize = 16 << 10;

/// `message` within [`MAX_ERROR_MESSAGE`] bytes, cut at a char boundary, saying how much was cut (the note
/// within the bound too, so a message bounded twice is the same).
pub(crate) fn bounded_message(mut message: String) -> String {
    if message.len() <= MAX_ERROR_MESSAGE {
        return message;
    }
    // Room for "... (N more bytes)" with N of up to 20 digits.
    let mut cut = MAX_ERROR_MESSAGE - 32;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let dropped = message.len() - cut;
    message.truncate(cut);
    message.push_str(&format!("... ({dropped} more bytes)"));
    message
}

/// A render's or compile's error with its message within [`MAX_ERROR_MESSAGE`].
pub(crate) fn bounded_error(e: TextError) -> TextError {
    match e {
        TextError::Template(m) => TextError::Template(bounded_message(m)),
        other => other,
    }
}

/// The name the template is kept under in its environment.
const NAME: &str = "chat_template";

/// A compiled chat template: `Send + Sync`, shared by every render of one checkpoint.
pub(crate) struct Compiled {
    env: Environment<'static>,
    /// Renders of it that outran the backstop and are still running: while any is, the template is refused
    /// instead of starting another (a render stalled from outside, by swap or a stopped process, clears it when
    /// its thread ends).
    stuck: AtomicUsize,
}

/// Compiles `source` into an environment set up as transformers renders (`trim_blocks`, `lstrip_blocks`, Python
/// string methods) with our bounded functions and filters. Call it on the render stack: parsing recurses as deep
/// as the source nests.
///
/// # Errors
/// [`TextError::Template`] for a syntax error.
pub(crate) fn compile(source: &str) -> Result<Compiled, TextError> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| TextError::Template(e.to_string()))?;
    env.set_syntax(syntax);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_unknown_method_callback(template_limits::method_callback);
    env.set_formatter(|out, state, value| {
        render_budget::check(state)?;
        minijinja::escape_formatter(out, state, value)
    });
    env.add_filter("format", template_limits::format_filter);
    env.add_filter("tojson", crate::tojson::tojson_filter);
    env.add_filter("string", crate::template_compat::bounded_string_filter);
    env.add_filter("pprint", template_limits::pprint_filter);
    env.add_function("range", render_budget::range);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_template_owned(NAME, source.to_owned()).map_err(|e| TextError::Template(e.to_string()))?;
    Ok(Compiled { env, stuck: AtomicUsize::new(0) })
}

/// [`compile`] on a thread with the render stack (parsing recurses as deep as the source nests).
///
/// # Errors
/// The outer error when the thread cannot start (the call's); the inner one is the template's syntax error, kept
/// as its message (within [`MAX_ERROR_MESSAGE`]).
pub(crate) fn compile_on_stack(source: &str) -> Result<Result<Arc<Compiled>, String>, TextError> {
    template_limits::on_render_stack(|| {
        Ok(compile(source).map(Arc::new).map_err(|e| match e {
            TextError::Template(m) => bounded_message(m),
            other => bounded_message(other.to_string()),
        }))
    })
}

impl Compiled {
    /// Whether a render of it was given up at the backstop and its thread may still run (a render worker holding
    /// it is then retired: `render_worker`).
    pub(crate) fn given_up(&self) -> bool {
        self.stuck.load(Ordering::Acquire) > 0
    }
}

/// `raise_exception(msg)`: fails the render with `msg` (recorded, so the error carries it by name).
fn raise_exception(state: &State, msg: String) -> Result<Value, Error> {
    render_budget::check(state)?;
    render_budget::raise(&msg);
    Err(Error::new(minijinja::ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)`: the current UTC time formatted (`chat_template::strftime_utc`).
fn strftime_now(state: &State, fmt: String) -> Result<String, Error> {
    render_budget::check(state)?;
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    Ok(crate::chat_template::strftime_utc(&fmt, secs))
}

/// Renders `compiled` with `ctx` on a thread of its own ([`RENDER_STACK_BYTES`] of stack), waiting at most
/// [`TEMPLATE_DEADLINE`] + [`BACKSTOP_GRACE`].
///
/// Bounded (measured on 2 shared cores, `tests_budget`): a render stops by itself at its deadline whenever it
/// reaches a function, filter, method, `{{ }}` output or `range` item of ours, within microseconds of it. Only a
/// render inside one of minijinja's own steps on a huge value (comparing or hashing strings of up to 100 MB, or
/// hashing or printing lists shared into themselves) can outrun it; then the caller gets
/// [`TextError::TemplateTime`] at the backstop and the template is refused while that thread still runs. In this
/// process that thread cannot be stopped: it runs for as long as minijinja's step takes (without end for some) and
/// may allocate without bound. So `tensorfold serve` calls this only inside render workers (`render_pool`,
/// `render_worker`): a worker whose render was given up here says so in its answer and is killed, one that
/// allocates past its address-space limit ends, and either way the work ends with the process. Library users and
/// `--template-in-process` render here, with the limits above.
///
/// # Errors
/// [`TextError::TemplateTime`] past the deadline (or while a given-up render runs), [`TextError::TemplateBudget`]
/// out of fuel, [`TextError::TemplateItems`] past the item budget, [`TextError::TemplateTooLarge`] past the output
/// cap or a format width, [`TextError::Template`] for any other render error, a `raise_exception` (with its
/// message, within [`MAX_ERROR_MESSAGE`]), a panic, or a thread that cannot be started.
pub(crate) fn render(compiled: &Arc<Compiled>, ctx: Value) -> Result<String, TextError> {
    const RUNNING: u8 = 0;
    const GIVEN_UP: u8 = 1;
    const ENDED: u8 = 2;
    let time_out = TextError::TemplateTime { limit_ms: TEMPLATE_DEADLINE.as_millis() as u64 };
    if compiled.stuck.load(Ordering::Acquire) > 0 {
        return Err(time_out);
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let owned = Arc::clone(compiled);
    let state = Arc::new(AtomicU8::new(RUNNING));
    let ends = Arc::clone(&state);
    let thread = std::thread::Builder::new()
        .name("chat-template".into())
        .stack_size(RENDER_STACK_BYTES)
        .spawn(move || {
            let _ = tx.send(render_here(&owned, ctx));
            // The caller counted this render as stuck: it ended, so uncount it.
            if ends.swap(ENDED, Ordering::AcqRel) == GIVEN_UP {
                owned.stuck.fetch_sub(1, Ordering::AcqRel);
            }
        })
        .map_err(|e| TextError::Template(format!("cannot start the render thread: {e}")))?;
    match rx.recv_timeout(TEMPLATE_DEADLINE + BACKSTOP_GRACE) {
        Ok(result) => {
            // It has sent its result, so it is ending: joining takes no time and reaps it.
            let _ = thread.join();
            result.map_err(bounded_error)
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            // Counted before it is marked, so the thread's uncount never comes first.
            compiled.stuck.fetch_add(1, Ordering::AcqRel);
            if state.compare_exchange(RUNNING, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire).is_err() {
                compiled.stuck.fetch_sub(1, Ordering::AcqRel); // it ended just now
            }
            Err(time_out)
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(TextError::Template("the render panicked".into())),
    }
}

/// One render on this thread, under a fresh [`render_budget`], its error named.
fn render_here(compiled: &Compiled, ctx: Value) -> Result<String, TextError> {
    let mut out = Capped { buf: Vec::new(), over: false };
    let (rendered, outcome) = render_budget::within(|| {
        compiled.env.get_template(NAME).and_then(|t| t.render_captured_to(ctx, &mut out).map(drop))
    });
    // Past a budget, the render is refused whatever minijinja made of it (an item past the budget may have been
    // hashed or compared rather than failed on).
    match outcome.over {
        Some(Over::Time) => return Err(TextError::TemplateTime { limit_ms: TEMPLATE_DEADLINE.as_millis() as u64 }),
        Some(Over::Items) => return Err(TextError::TemplateItems { limit: TEMPLATE_MAX_ITEMS }),
        None => {}
    }
    if let Err(e) = rendered {
        return Err(match (template_limits::budget_error(&e, out.over), outcome.raised) {
            (Some(limit), _) => limit,
            (None, Some(msg)) => TextError::Template(format!("raise_exception: {msg}")),
            (None, None) => TextError::Template(e.to_string()),
        });
    }
    String::from_utf8(out.buf).map_err(|_| TextError::Template("the rendered prompt is not UTF-8".into()))
}
