//! Chat-template renders in supervised child processes: a pool of render workers (`render_worker`, started from
//! a program such as `tensorfold render-worker`), each used by one render at a time. A worker past the deadline,
//! one that dies (killed for memory, crashed), does not read its request or writes a malformed reply is killed
//! with SIGKILL and reaped, and a fresh one is started at the next render of its slot; so a template's work inside
//! one of minijinja's own steps, which no check of ours can reach, costs a worker, never this process's cores or
//! memory. A worker found dead when a request is written to it (it died idle) is reaped and the request goes to a
//! fresh one, once.
//! Installed once a process (`install`, as `tensorfold serve` does); without it `Text` renders in-process.

use std::borrow::Cow;
use std::collections::HashSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::chat_template::ChatMessage;
use crate::error::TextError;
use crate::render_budget::TEMPLATE_DEADLINE;
use crate::render_wire::{self, FrameError, RenderCall, RenderRequest, TAG_ERR, TAG_OK, TAG_UNKNOWN, WireError};
use crate::template_render::BACKSTOP_GRACE;
use crate::tokenizer::Text;

/// How long one exchange with a worker may take, writing the request and waiting for its answer, before the
/// worker is killed: the deadline, the backstop's grace and 500 ms for the pipe and a loaded machine (3.5 s). A
/// worker answers by its own backstop at 3 s, so this only fires for a worker that cannot answer at all, or does
/// not read its requests.
pub const WORKER_DEADLINE: Duration =
    Duration::from_millis(TEMPLATE_DEADLINE.as_millis() as u64 + BACKSTOP_GRACE.as_millis() as u64 + 500);

/// The process's pool, once installed.
static INSTALLED: OnceLock<RenderPool> = OnceLock::new();

/// Keys of chat templates (`Text::template_key`), unique in the process.
static KEYS: AtomicU64 = AtomicU64::new(1);

/// A fresh template key.
pub(crate) fn next_template_key() -> u64 {
    KEYS.fetch_add(1, Ordering::Relaxed)
}

/// Makes `pool` the one every `Text` of this process renders chat templates with (the probe at open included).
///
/// # Errors
/// The pool given back when one is installed already.
pub fn install(pool: RenderPool) -> Result<(), RenderPool> {
    INSTALLED.set(pool)
}

/// The installed pool.
pub(crate) fn installed() -> Option<&'static RenderPool> {
    INSTALLED.get()
}

/// How to start a pool's workers.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// The program a worker runs (`/proc/self/exe` for `tensorfold serve`: this very binary, even after an
    /// upgrade renamed or replaced its file).
    pub program: PathBuf,
    /// Its arguments (`["render-worker"]`).
    pub args: Vec<OsString>,
    /// Workers, so renders at once (at least 1; the rest wait for one).
    pub workers: usize,
}

/// Render workers, started lazily, each used by one render at a time.
pub struct RenderPool {
    config: PoolConfig,
    /// The slots not in use: each holds a running worker or none yet (started at its next render).
    free: Mutex<Vec<Option<Worker>>>,
    /// Signalled when a slot is put back.
    freed: Condvar,
}

impl std::fmt::Debug for RenderPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderPool").field("config", &self.config).finish_non_exhaustive()
    }
}

impl RenderPool {
    /// A pool of `config.workers` slots (at least 1); no process starts until a render needs one.
    pub fn new(mut config: PoolConfig) -> Self {
        config.workers = config.workers.max(1);
        let free = (0..config.workers).map(|_| None).collect();
        Self { config, free: Mutex::new(free), freed: Condvar::new() }
    }

    /// `text`'s chat template rendered by a worker of this pool, whatever pool is installed (tests compare it
    /// with the in-process render).
    ///
    /// # Errors
    /// As `Text::render_chat`.
    pub fn render_chat(
        &self,
        text: &Text,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&[serde_json::Value]>,
    ) -> Result<String, TextError> {
        let call = text.render_call(messages, add_generation_prompt, tools);
        self.render(text.template_key, text.template_source()?, &call)
    }

    /// Process ids of the workers running now and not in use (tests watch them end).
    pub fn idle_worker_pids(&self) -> Vec<u32> {
        let free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.iter().flatten().map(|w| w.child.id()).collect()
    }

    /// Renders `call` with the template `source` (named `key`) on a free worker, waiting for one.
    ///
    /// # Errors
    /// The render's error as the worker names it; [`TextError::TemplateTime`] past [`WORKER_DEADLINE`] (the worker
    /// is killed); [`TextError::TemplateWorker`] when the worker dies or answers malformed (killed too);
    /// [`TextError::TemplateWorkerStart`] when no worker can be started (this process's fault, not the request's);
    /// [`TextError::Template`] for a request over [`render_wire::MAX_REQUEST_FRAME`].
    pub(crate) fn render(&self, key: u64, source: &str, call: &RenderCall<'_>) -> Result<String, TextError> {
        let req = RenderRequest { key, source: None, call: borrowed(call) };
        let bare = render_wire::request_frame(&req)?;
        let mut slot = self.take();
        let result = self.render_on(&mut slot, &Job { key, source, bare: &bare, req });
        self.give_back(slot);
        result
    }

    /// One render on `slot`'s worker (started first if none), which is killed unless it answered well. A worker
    /// that could not be written to had died before it read the request (idle: the OOM killer, a signal), which is
    /// no fault of this request: it is reaped and the request goes to a fresh worker, once.
    fn render_on(&self, slot: &mut Option<Worker>, job: &Job<'_>) -> Result<String, TextError> {
        match self.attempt(slot, job) {
            Attempt::Done(result) => result,
            Attempt::Unsent(_) => match self.attempt(slot, job) {
                Attempt::Done(result) | Attempt::Unsent(result) => result,
            },
        }
    }

    /// One exchange on `slot`'s worker (started first if none); a worker not kept is killed and reaped here: by
    /// `end` on an error, by its drop on a prompt.
    fn attempt(&self, slot: &mut Option<Worker>, job: &Job<'_>) -> Attempt {
        let worker = match slot {
            Some(w) => w,
            None => match Worker::start(&self.config) {
                Ok(w) => slot.insert(w),
                Err(e) => return Attempt::Done(Err(e)),
            },
        };
        let outcome = worker.exchange(job);
        let result = match slot.take() {
            Some(w) if !outcome.keep => outcome.result.map_err(|e| w.end(e)),
            kept => {
                *slot = kept;
                outcome.result
            }
        };
        if outcome.unsent { Attempt::Unsent(result) } else { Attempt::Done(result) }
    }

    /// A free slot, waiting for one.
    fn take(&self) -> Option<Worker> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(slot) = free.pop() {
                return slot;
            }
            free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn give_back(&self, slot: Option<Worker>) {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).push(slot);
        self.freed.notify_one();
    }
}

/// `call` borrowed again (the request is written from it without copying the messages).
fn borrowed<'a>(call: &'a RenderCall<'_>) -> RenderCall<'a> {
    use Cow::Borrowed;
    RenderCall {
        messages: Borrowed(&call.messages),
        add_generation_prompt: call.add_generation_prompt,
        bos_token: call.bos_token.as_deref().map(Borrowed),
        eos_token: call.eos_token.as_deref().map(Borrowed),
        pad_token: call.pad_token.as_deref().map(Borrowed),
        tools: call.tools.as_deref().map(Borrowed),
    }
}

/// One render's request: its frame without the source, and what makes the frame with it.
struct Job<'a> {
    key: u64,
    source: &'a str,
    bare: &'a [u8],
    req: RenderRequest<'a>,
}

impl Job<'_> {
    /// The request's frame with the template's source (for a worker that does not hold it).
    fn with_source(&self) -> Result<Vec<u8>, TextError> {
        let req =
            RenderRequest { key: self.key, source: Some(Cow::Borrowed(self.source)), call: borrowed(&self.req.call) };
        render_wire::request_frame(&req)
    }
}

/// What one exchange with a worker came to, whether the worker may be used again, and whether the request could
/// not be written to it (so it never began; another worker may take it).
struct Outcome {
    result: Result<String, TextError>,
    keep: bool,
    unsent: bool,
}

impl Outcome {
    fn kill(error: TextError) -> Self {
        Self { result: Err(error), keep: false, unsent: false }
    }

    fn answered(result: Result<String, TextError>, keep: bool) -> Self {
        Self { result, keep, unsent: false }
    }
}

/// One attempt of a render: its result, or the error of a request that no worker read (retried once).
enum Attempt {
    Done(Result<String, TextError>),
    Unsent(Result<String, TextError>),
}

/// A reply frame as the reader thread passed it on.
type Reply = Result<(u8, Vec<u8>), FrameError>;

/// One running worker: its process, its stdin, and a thread reading its replies off its stdout (so a reply can be
/// waited for with a deadline).
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    replies: mpsc::Receiver<Reply>,
    reader: Option<JoinHandle<()>>,
    /// Template keys this worker was sent the source of.
    known: HashSet<u64>,
}

impl Worker {
    /// Starts `config.program` with piped stdin and stdout (stderr shared with this process, for its logs), in a
    /// process group of its own: a Ctrl-C at a terminal signals the server's group, and the server drains its
    /// renders under way before it exits, so the workers must not get it (they ignore SIGINT and SIGTERM too, and
    /// leave when this process does).
    ///
    /// # Errors
    /// [`TextError::TemplateWorkerStart`] when the process, its reader thread or its non-blocking stdin cannot be
    /// set up.
    fn start(config: &PoolConfig) -> Result<Self, TextError> {
        let mut command = Command::new(&config.program);
        command.args(&config.args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .spawn()
            .map_err(|e| TextError::TemplateWorkerStart(format!("{}: {e}", config.program.display())))?;
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        let (tx, replies) = mpsc::channel();
        let read = move || {
            let Some(mut out) = stdout else { return };
            loop {
                let frame = render_wire::read_frame(&mut out, render_wire::MAX_REPLY_FRAME);
                let last = frame.is_err();
                if tx.send(frame).is_err() || last {
                    return;
                }
            }
        };
        let reader = std::thread::Builder::new().name("render-reply".into()).stack_size(256 << 10).spawn(read);
        let mut worker = Self { child, stdin, replies, reader: None, known: HashSet::new() };
        match reader {
            Ok(r) => worker.reader = Some(r),
            Err(e) => {
                return Err(worker.end(TextError::TemplateWorkerStart(format!("its reply reader thread: {e}"))));
            }
        }
        if let Some(Err(e)) = worker.stdin.as_ref().map(pipe_write::non_blocking) {
            return Err(worker.end(TextError::TemplateWorkerStart(format!("its request pipe: {e}"))));
        }
        Ok(worker)
    }

    /// Sends `job` and waits for its answer, sending the source first where the worker does not hold it; the
    /// writes and the wait together within [`WORKER_DEADLINE`] (a worker that does not read would otherwise block
    /// a write of a frame past the pipe's buffer for ever).
    fn exchange(&mut self, job: &Job<'_>) -> Outcome {
        let deadline = Instant::now() + WORKER_DEADLINE;
        // Twice at most: a worker that dropped the template (it keeps a few) answers "unknown" once.
        for _ in 0..2 {
            let with_source = !self.known.contains(&job.key);
            let frame = if with_source { job.with_source().map(Cow::Owned) } else { Ok(Cow::Borrowed(job.bare)) };
            let frame = match frame {
                Ok(f) => f,
                Err(e) => return Outcome::answered(Err(e), true),
            };
            match self.send(&frame, deadline) {
                Ok(()) => {}
                Err(pipe_write::WriteError::Late) => return Outcome::kill(time_out()),
                Err(pipe_write::WriteError::Io(e)) => {
                    // A pipe broken by a process that ended by itself before it read this request: named with its
                    // status by `Worker::end`, and the request may go to a fresh worker.
                    let error = TextError::TemplateWorker(format!("{ENDED} (writing to it: {e})"));
                    return Outcome { unsent: true, ..Outcome::kill(error) };
                }
            }
            self.known.insert(job.key);
            match self.replies.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Ok((TAG_UNKNOWN, _))) => {
                    self.known.remove(&job.key);
                }
                Ok(Ok((tag, payload))) => return decode(tag, payload),
                Ok(Err(e)) => return Outcome::kill(ended_or_malformed(e)),
                Err(mpsc::RecvTimeoutError::Timeout) => return Outcome::kill(time_out()),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Outcome::kill(ended()),
            }
        }
        Outcome::kill(TextError::TemplateWorker("the render process lost the template twice".into()))
    }

    fn send(&mut self, frame: &[u8], deadline: Instant) -> Result<(), pipe_write::WriteError> {
        match self.stdin.as_mut() {
            Some(stdin) => pipe_write::write_by(stdin, frame, deadline),
            None => Err(pipe_write::WriteError::Io(std::io::ErrorKind::BrokenPipe.into())),
        }
    }

    /// Kills and reaps the worker and joins its reader (the pipe closes with the process), then gives `error`
    /// back, naming how the process ended where it ended by itself.
    fn end(mut self, error: TextError) -> TextError {
        let status = self.stop();
        match (error, status) {
            (TextError::TemplateWorker(m), Ok(status)) if m.starts_with(ENDED) => {
                TextError::TemplateWorker(format!("{m} ({status}){MEMORY_HINT}"))
            }
            (error, _) => error,
        }
    }

    /// SIGKILL (harmless when it ended already), the process reaped, its pipes closed, its reader joined (the
    /// worker starts no process of its own, so its stdout closes when it dies).
    ///
    /// # Errors
    /// [`TextError::TemplateWorker`] when `wait` fails (the reader is still joined).
    fn stop(&mut self) -> Result<std::process::ExitStatus, TextError> {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let status = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        status.map_err(|e| TextError::TemplateWorker(format!("cannot reap the render process: {e}")))
    }
}

impl Drop for Worker {
    /// A pool dropped with running workers kills and reaps them (no zombie is left).
    fn drop(&mut self) {
        if self.reader.is_some() || self.stdin.is_some() {
            let _ = self.stop();
        }
    }
}

/// The start of the message of a worker that ended by itself (completed with its exit status by `Worker::end`).
const ENDED: &str = "the render process ended";

/// What a worker that ended by itself most likely met.
const MEMORY_HINT: &str = "; the template used more memory than a render may, or crashed it";

/// A worker that did not answer in time (the render's time budget, as in-process).
fn time_out() -> TextError {
    TextError::TemplateTime { limit_ms: TEMPLATE_DEADLINE.as_millis() as u64 }
}

fn ended() -> TextError {
    TextError::TemplateWorker(ENDED.into())
}

/// The error of a reply that could not be read: the worker's end, or a malformed frame.
fn ended_or_malformed(e: FrameError) -> TextError {
    match e {
        FrameError::Closed | FrameError::Io(_) => ended(),
        FrameError::Length(_) => TextError::TemplateWorker(format!("the render process wrote a malformed reply: {e}")),
    }
}

/// A reply frame's meaning: the prompt or the named error, the worker kept unless it asked to be retired. A tag
/// or payload that means nothing is a malformed reply (the worker is killed).
fn decode(tag: u8, payload: Vec<u8>) -> Outcome {
    let keep = tag & render_wire::RETIRE == 0;
    let malformed = |what: &str| Outcome::kill(TextError::TemplateWorker(format!("the render process wrote {what}")));
    match tag & !render_wire::RETIRE {
        TAG_OK => match String::from_utf8(payload) {
            Ok(prompt) => Outcome::answered(Ok(prompt), keep),
            Err(_) => malformed("a prompt that is not UTF-8"),
        },
        TAG_ERR => match serde_json::from_slice::<WireError>(&payload) {
            Ok(e) => Outcome::answered(Err(e.into()), keep),
            Err(_) => malformed("an error that is not one of the named ones"),
        },
        other => malformed(&format!("a reply tagged {other}")),
    }
}

/// Writing a request to a worker's stdin by a deadline.
mod pipe_write {
    use std::io::{self, Write};
    use std::process::ChildStdin;
    use std::time::Instant;

    /// Why a frame was not written whole.
    pub(super) enum WriteError {
        /// The deadline came first (the worker does not read).
        Late,
        /// The pipe broke (the worker is gone) or could not be written.
        Io(io::Error),
    }

    /// Makes writes to `stdin` return at once when its pipe is full, so [`write_by`] can wait on it with a
    /// deadline (the worker's end of the pipe is a file description of its own and stays blocking).
    #[cfg(target_os = "linux")]
    pub(super) fn non_blocking(stdin: &ChildStdin) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = stdin.as_raw_fd();
        // SAFETY: fcntl on a descriptor this process owns (the child's stdin pipe), with no pointers.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Elsewhere no pool is installed (`tensorfold serve` renders in-process off Linux): writes stay blocking.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn non_blocking(_stdin: &ChildStdin) -> io::Result<()> {
        Ok(())
    }

    /// Writes all of `bytes` to the non-blocking `stdin`, waiting for room in the pipe until `deadline`.
    ///
    /// # Errors
    /// [`WriteError::Late`] at the deadline, [`WriteError::Io`] for a broken pipe or another write error.
    pub(super) fn write_by(stdin: &mut ChildStdin, mut bytes: &[u8], deadline: Instant) -> Result<(), WriteError> {
        while !bytes.is_empty() {
            match stdin.write(bytes) {
                Ok(0) => return Err(WriteError::Io(io::ErrorKind::WriteZero.into())),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stdin, deadline)?,
                Err(e) => return Err(WriteError::Io(e)),
            }
        }
        Ok(())
    }

    /// Waits until `stdin`'s pipe has room (or its reader is gone: the next write says so) or `deadline` passes.
    #[cfg(target_os = "linux")]
    fn wait_writable(stdin: &ChildStdin, deadline: Instant) -> Result<(), WriteError> {
        use std::os::fd::AsRawFd;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(WriteError::Late);
        }
        // Rounded up, so a wait never ends just before the deadline and spins.
        let ms = i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX);
        let mut fd = libc::pollfd { fd: stdin.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
        // SAFETY: one valid pollfd for the length of the call.
        match unsafe { libc::poll(&mut fd, 1, ms) } {
            n if n >= 0 => Ok(()),
            _ => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::Interrupted => Ok(()),
                e => Err(WriteError::Io(e)),
            },
        }
    }

    /// Elsewhere writes block (see [`non_blocking`]), so this is never reached; a wait is a failed write.
    #[cfg(not(target_os = "linux"))]
    fn wait_writable(_stdin: &ChildStdin, _deadline: Instant) -> Result<(), WriteError> {
        Err(WriteError::Io(io::ErrorKind::WouldBlock.into()))
    }
}
