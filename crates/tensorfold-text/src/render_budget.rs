//! The per-render budget beside minijinja's fuel: a wall-clock deadline and a count of the items our `range`
//! makes, kept in a thread-local of the render thread and checked by every function, filter, method, formatter,
//! writer and iterator of ours. Fuel counts instructions, and one instruction may be O(n) (hashing a dict keyed by
//! `range(100000)`, once a loop pass, ran 345.9 s within fuel); these checks stop such a render by time too.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use minijinja::value::Value;
use minijinja::{Error, ErrorKind, State};

/// Wall-clock time one render may take: 2 s (the default model's template renders a 4 MiB chat in about 6 ms).
pub const TEMPLATE_DEADLINE: Duration = Duration::from_secs(2);

/// Largest `range` a template may make: 10,000 items (Jinja2's sandbox allows 100,000; released chat templates
/// range over messages at most). Each item is charged to [`TEMPLATE_MAX_ITEMS`] as it is yielded.
pub const MAX_RANGE: usize = 10_000;

/// Items all `range`s of one render may yield together (iterated, hashed, compared, printed): 4M, the fuel's
/// instruction count (the fuzz-found template's shape, hashing them all, ends in about 0.3 s).
pub const TEMPLATE_MAX_ITEMS: u64 = 4_000_000;

/// Which budget a render went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    /// [`TEMPLATE_DEADLINE`].
    Time,
    /// [`TEMPLATE_MAX_ITEMS`].
    Items,
}

/// One render's budget and what it raised.
struct Budget {
    deadline: Instant,
    items_left: u64,
    over: Option<Over>,
    raised: Option<String>,
}

thread_local! {
    static BUDGET: RefCell<Option<Budget>> = const { RefCell::new(None) };
}

/// What a render left behind: the budget it went past, and the message of its `raise_exception`.
pub(crate) struct Outcome {
    pub(crate) over: Option<Over>,
    pub(crate) raised: Option<String>,
}

/// Runs `f` (one render) under a fresh budget on this thread, and returns what it left with `f`'s result. Only on
/// a render's own thread: a panic in `f` leaves the budget set, and the thread ends with it.
pub(crate) fn within<T>(f: impl FnOnce() -> T) -> (T, Outcome) {
    let fresh = Budget {
        deadline: Instant::now() + TEMPLATE_DEADLINE,
        items_left: TEMPLATE_MAX_ITEMS,
        over: None,
        raised: None,
    };
    BUDGET.with(|b| *b.borrow_mut() = Some(fresh));
    let result = f();
    let left = BUDGET.with(|b| b.borrow_mut().take());
    let outcome = left.map_or(Outcome { over: None, raised: None }, |b| Outcome { over: b.over, raised: b.raised });
    (result, outcome)
}

/// Records the message of a `raise_exception` call (the first one).
pub(crate) fn raise(msg: &str) {
    BUDGET.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut() {
            b.raised.get_or_insert_with(|| msg.to_string());
        }
    });
}

/// Charges `items` and reads the clock (about 20 ns; every item, since one loop pass over an item may take
/// milliseconds). Once past either budget it stays past: every later check fails too. Outside a render (no budget
/// set) it always passes.
fn charge(items: u64) -> Result<(), Over> {
    BUDGET.with(|b| {
        let mut b = b.borrow_mut();
        let Some(b) = b.as_mut() else { return Ok(()) };
        if let Some(over) = b.over {
            return Err(over);
        }
        if items > b.items_left {
            b.over = Some(Over::Items);
        } else if Instant::now() >= b.deadline {
            b.over = Some(Over::Time);
        }
        if b.over.is_none() {
            b.items_left -= items;
        }
        b.over.map_or(Ok(()), Err)
    })
}

/// The refusal of a render past its budget (read back through [`Outcome::over`], not its text).
fn refusal(over: Over) -> Error {
    let what = match over {
        Over::Time => format!("the chat template is over its time budget ({} ms)", TEMPLATE_DEADLINE.as_millis()),
        Over::Items => format!("the chat template's ranges made over {TEMPLATE_MAX_ITEMS} items"),
    };
    Error::new(ErrorKind::InvalidOperation, what)
}

/// The check at each function, filter, method and output of ours: fails once the render is past its deadline
/// or item budget, and then also spends the render's fuel, so minijinja stops at its next instruction even where
/// the error itself would be dropped.
///
/// # Errors
/// The refusal (an `InvalidOperation`) once past a budget.
pub(crate) fn check(state: &State) -> Result<(), Error> {
    charge(0).map_err(|over| {
        let _ = state.consume_fuel(u64::MAX);
        refusal(over)
    })
}

/// [`check`] where no `State` is at hand (the output writer): fails past a budget, without spending the fuel.
pub(crate) fn check_stateless() -> Result<(), Error> {
    charge(0).map_err(refusal)
}

/// `range([start,] stop[, step])` as minijinja's, capped at [`MAX_RANGE`] items, each item charged to the
/// render's budget as it is yielded (so a range iterated, hashed or compared once a loop pass counts every pass).
///
/// # Errors
/// A step of 0, more than [`MAX_RANGE`] items, or a render already past its budget.
pub(crate) fn range(state: &State, lower: i64, upper: Option<i64>, step: Option<i64>) -> Result<Value, Error> {
    check(state)?;
    let (start, stop) = upper.map_or((0, lower), |u| (lower, u));
    let step = step.unwrap_or(1);
    let len = range_len(start, stop, step)?;
    if len > MAX_RANGE as u64 {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("range has over {MAX_RANGE} items ({len})")));
    }
    let items = BudgetedRange { next: start, step, left: len };
    Ok(Value::make_iterable(move || items.clone()))
}

/// Items from `start` to `stop` (excluded) by `step`, as Python counts them.
fn range_len(start: i64, stop: i64, step: i64) -> Result<u64, Error> {
    let (span, by) = match step.signum() {
        1 => (i128::from(stop) - i128::from(start), i128::from(step)),
        -1 => (i128::from(start) - i128::from(stop), -i128::from(step)),
        _ => return Err(Error::new(ErrorKind::InvalidOperation, "cannot create range with step of 0")),
    };
    Ok(if span <= 0 { 0 } else { u64::try_from((span + by - 1) / by).unwrap_or(u64::MAX) })
}

/// The iterator of [`range`]: each item charged; past the budget it yields one invalid value carrying the refusal
/// (a `for` loop fails on it) and ends.
#[derive(Clone)]
struct BudgetedRange {
    next: i64,
    step: i64,
    left: u64,
}

impl Iterator for BudgetedRange {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        if self.left == 0 {
            return None;
        }
        if let Err(over) = charge(1) {
            self.left = 0;
            return Some(Value::from(refusal(over)));
        }
        let item = self.next;
        self.left -= 1;
        // `left` counts what remains, so the add only overflows after the last item, where it is not used.
        self.next = self.next.wrapping_add(self.step);
        Some(Value::from(item))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.left).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}
