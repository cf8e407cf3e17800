//! The render worker: a child process (`tensorfold render-worker`) that renders chat templates for its parent
//! (`render_pool`) over stdin and stdout in `render_wire` frames, one request at a time, with the same bounded path
//! as in-process renders (`template_render::render`). It limits its own address space and core dumps at start, so
//! a template that allocates without bound ends this process only; its parent kills it past the deadline.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::error::TextError;
use crate::render_wire::{self, RenderRequest, TAG_ERR, TAG_OK, TAG_RENDER, TAG_UNKNOWN, WireError};
use crate::template_limits::TEMPLATE_MAX_SOURCE;
use crate::template_render::{self, Compiled};

/// Address space a worker may map by default: 2 GiB. It holds the binary (about 140 MiB mapped), the 512 MiB
/// reserved stacks of a render thread and of a compile (one after the other), the compiled templates and a
/// render's values (a rendered prompt is at most 8 MiB, a 4 MiB chat's values a few tens of MiB); a template that
/// allocates past it ends the worker (an allocation failure aborts it), never its parent. Printing a shared list
/// with `~` grows about 500 MB/s on 2 cores, so it meets this limit near the 2 s deadline.
pub const WORKER_ADDRESS_SPACE: u64 = 2 << 30;

/// Templates a worker keeps compiled at once: past it they are all dropped, and the parent resends a source the
/// worker answers it does not hold ([`render_wire::TAG_UNKNOWN`]).
const MAX_TEMPLATES: usize = 16;

/// How often the worker checks that its parent still lives: 200 ms.
const PARENT_CHECK: Duration = Duration::from_millis(200);

/// Runs a worker on this process's stdin and stdout until stdin ends: sets its limits (`address_space` bytes,
/// [`WORKER_ADDRESS_SPACE`] by default: [`limit_this_process`]), ignores SIGINT and SIGTERM (its parent's shutdown
/// signals: the parent drains the renders under way, this one's included, and the worker leaves when the parent
/// does or closes its stdin), leaves when its parent does, then serves requests.
///
/// # Errors
/// A limit that cannot be set (the worker would be unbounded: it refuses to serve), or an I/O error on stdin or
/// stdout (a frame cut short, a closed stdout).
pub fn run_stdio(address_space: u64) -> io::Result<()> {
    limit_this_process(address_space)?;
    ignore_shutdown_signals()?;
    leave_with_parent();
    serve(&mut io::stdin().lock(), &mut io::stdout().lock())
}

/// Serves render requests from `input`, answering each on `output`, until `input` ends cleanly.
///
/// # Errors
/// A frame that cannot be read (cut short, empty or past [`render_wire::MAX_REQUEST_FRAME`]) or an answer that
/// cannot be written: the parent is gone or broken, so the worker ends.
pub fn serve(input: &mut impl Read, output: &mut impl Write) -> io::Result<()> {
    let mut held: HashMap<u64, Result<Arc<Compiled>, String>> = HashMap::new();
    loop {
        let (tag, payload) = match render_wire::read_frame(input, render_wire::MAX_REQUEST_FRAME) {
            Ok(frame) => frame,
            Err(render_wire::FrameError::Closed) => return Ok(()),
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
        };
        let answer = answer(&mut held, tag, &payload);
        render_wire::send(output, &answer)?;
    }
}

/// The answer frame to one request frame: the prompt, the render's error, or "unknown key".
fn answer(held: &mut HashMap<u64, Result<Arc<Compiled>, String>>, tag: u8, payload: &[u8]) -> Vec<u8> {
    let outcome = match parse(tag, payload) {
        Ok(req) => render(held, &req),
        Err(e) => Rendered::Done(Err(e), false),
    };
    match outcome {
        Rendered::Unknown => reply(TAG_UNKNOWN, &[]),
        Rendered::Done(Ok(prompt), retire) => reply(TAG_OK | retire_bit(retire), prompt.as_bytes()),
        Rendered::Done(Err(e), retire) => match serde_json::to_vec(&WireError::from(e)) {
            Ok(json) => reply(TAG_ERR | retire_bit(retire), &json),
            Err(_) => unframed(),
        },
    }
}

/// The reply frame of `tag` and `payload`, or [`unframed`] where it would be past
/// [`render_wire::MAX_REPLY_FRAME`] (the parent would take it for malformed and kill this worker). A prompt is
/// within its 8 MiB cap and an error's message within 16 KiB, so neither should come to it.
pub(crate) fn reply(tag: u8, payload: &[u8]) -> Vec<u8> {
    if payload.len() >= render_wire::MAX_REPLY_FRAME {
        return unframed();
    }
    render_wire::frame(tag, payload).unwrap_or_else(|_| unframed())
}

/// A valid error frame for an answer that could not be framed: a named error the parent reports, where zero
/// bytes or a bad frame would make it kill this worker as malformed.
fn unframed() -> Vec<u8> {
    let payload = br#"{"error":"Template","message":"the render worker could not frame its answer"}"#;
    let mut out = Vec::with_capacity(payload.len() + 5);
    // A constant of a few dozen bytes: its length fits a u32.
    out.extend_from_slice(&(payload.len() as u32 + 1).to_le_bytes());
    out.push(TAG_ERR);
    out.extend_from_slice(payload);
    out
}

fn retire_bit(retire: bool) -> u8 {
    if retire { render_wire::RETIRE } else { 0 }
}

/// What one request came to: a render's result (and whether this worker must be retired), or a key not held.
enum Rendered {
    Done(Result<String, TextError>, bool),
    Unknown,
}

/// The request in a frame.
fn parse(tag: u8, payload: &[u8]) -> Result<RenderRequest<'static>, TextError> {
    if tag != TAG_RENDER {
        return Err(TextError::Template(format!("the render worker got a frame tagged {tag}")));
    }
    // The frame nests a request's values about 8 levels deeper than the request the server took (whose depth
    // serde_json bounded at 128), so serde_json's 128-level limit would refuse here what renders in-process. The
    // input comes from the parent, which bounded it, so the limit is off for this reader only.
    let mut de = serde_json::Deserializer::from_slice(payload);
    de.disable_recursion_limit();
    // Without `#[serde(borrow)]` every `Cow` is read owned, so the request outlives the frame.
    let req = RenderRequest::<'static>::deserialize(&mut de).and_then(|req| de.end().map(|()| req));
    req.map_err(|e| TextError::Template(format!("the render worker got a malformed request: {e}")))
}

/// Renders `req` with the template it names, compiling a source it carries first.
fn render(held: &mut HashMap<u64, Result<Arc<Compiled>, String>>, req: &RenderRequest<'_>) -> Rendered {
    if let Some(source) = &req.source
        && let Err(e) = hold(held, req.key, source)
    {
        return Rendered::Done(Err(e), false);
    }
    let compiled = match held.get(&req.key) {
        None => return Rendered::Unknown,
        Some(Err(syntax)) => return Rendered::Done(Err(TextError::Template(syntax.clone())), false),
        Some(Ok(c)) => Arc::clone(c),
    };
    let result = template_render::render(&compiled, req.call.context());
    Rendered::Done(result, compiled.given_up())
}

/// Compiles `source` under `key` unless it is held (a syntax error is held too, as its message).
fn hold(held: &mut HashMap<u64, Result<Arc<Compiled>, String>>, key: u64, source: &str) -> Result<(), TextError> {
    if held.contains_key(&key) {
        return Ok(());
    }
    if source.len() > TEMPLATE_MAX_SOURCE {
        return Err(TextError::TemplateSource { bytes: source.len(), limit: TEMPLATE_MAX_SOURCE });
    }
    if held.len() >= MAX_TEMPLATES {
        held.clear();
    }
    let compiled = template_render::compile_on_stack(source)?;
    held.insert(key, compiled);
    Ok(())
}

/// Sets this process's address space to `address_space` bytes (or lower, where the hard limit is lower) and its
/// core dumps to none (a worker ended for memory would otherwise write gigabytes).
///
/// # Errors
/// `setrlimit`'s error.
#[cfg(target_os = "linux")]
pub fn limit_this_process(address_space: u64) -> io::Result<()> {
    set_limit(libc::RLIMIT_CORE, 0)?;
    set_limit(libc::RLIMIT_AS, address_space)
}

/// Elsewhere a worker is never started (`render_pool` is Linux-only); nothing to set.
///
/// # Errors
/// None.
#[cfg(not(target_os = "linux"))]
pub fn limit_this_process(_address_space: u64) -> io::Result<()> {
    Ok(())
}

/// Lowers `resource`'s soft and hard limits to at most `bytes` (never raises a lower hard limit).
#[cfg(target_os = "linux")]
fn set_limit(resource: libc::__rlimit_resource_t, bytes: u64) -> io::Result<()> {
    let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `now` is a valid rlimit for getrlimit to write.
    if unsafe { libc::getrlimit(resource, &mut now) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let cap = bytes.min(now.rlim_max);
    let new = libc::rlimit { rlim_cur: cap, rlim_max: cap };
    // SAFETY: `new` is a valid rlimit for setrlimit to read.
    if unsafe { libc::setrlimit(resource, &new) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Ignores SIGINT and SIGTERM: a Ctrl-C or a supervisor's stop meant for the server (its process group, or each
/// process) must not end a render the server is still draining.
///
/// # Errors
/// `signal`'s error.
#[cfg(target_os = "linux")]
fn ignore_shutdown_signals() -> io::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: SIG_IGN installs no handler of ours; nothing runs on the signal.
        if unsafe { libc::signal(signal, libc::SIG_IGN) } == libc::SIG_ERR {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Elsewhere no worker is started (`render_pool` is Linux-only).
#[cfg(not(target_os = "linux"))]
fn ignore_shutdown_signals() -> io::Result<()> {
    Ok(())
}

/// Ends this process when its parent has gone (it is then reparented): a worker stuck in a render would never
/// read the end of its stdin. Checked every [`PARENT_CHECK`] on a thread of its own.
#[cfg(target_os = "linux")]
fn leave_with_parent() {
    let parent = std::os::unix::process::parent_id();
    let watch = move || {
        loop {
            std::thread::sleep(PARENT_CHECK);
            if std::os::unix::process::parent_id() != parent {
                // `exit` would run destructors beside a render thread that may hold locks; leave at once.
                // SAFETY: _exit ends the process without touching any state of ours.
                unsafe { libc::_exit(0) };
            }
        }
    };
    // A worker that cannot start the watch still serves: its parent's kill and its stdin's end still end it.
    let _ = std::thread::Builder::new().name("render-parent".into()).stack_size(64 << 10).spawn(watch);
}

/// Elsewhere no worker is started (`render_pool` is Linux-only).
#[cfg(not(target_os = "linux"))]
fn leave_with_parent() {}
