//! Memory admission under absurd sizes: a 10^9-token context and a huge `max_tokens` are answered with a named
//! refusal after O(log n) estimates (counted, not timed), and a saturating estimate never wraps into a fit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use tensorfold_engine::core::{Core, EngineConfig, FixedClock, largest_fitting};
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::{ForwardCall, Request, SegOut, SubmitError, Target};
use tensorfold_model::ForwardError;

/// The fake target, counting its `stream_bytes` estimates.
struct Counting {
    inner: FakeTarget,
    estimates: Arc<AtomicUsize>,
}

impl Target for Counting {
    type State = Vec<u32>;
    type Held = ();
    fn caps(&self) -> tensorfold_engine::Caps {
        self.inner.caps()
    }
    fn new_state(&self) -> Vec<u32> {
        self.inner.new_state()
    }
    fn pos(&self, s: &Vec<u32>) -> usize {
        self.inner.pos(s)
    }
    fn state_bytes(&self, s: &Vec<u32>) -> usize {
        self.inner.state_bytes(s)
    }
    fn stream_bytes(&self, tokens: usize, verify_rows: usize) -> usize {
        self.estimates.fetch_add(1, Ordering::Relaxed);
        self.inner.stream_bytes(tokens, verify_rows)
    }
    fn forward(&self, call: &ForwardCall<'_, ()>, states: &mut [&mut Vec<u32>]) -> Result<Vec<SegOut>, ForwardError> {
        self.inner.forward(call, states)
    }
    fn keep(&self, s: &mut Vec<u32>, pos: usize) -> Result<(), ForwardError> {
        self.inner.keep(s, pos)
    }
}

fn core_over(inner: FakeTarget, memory_bytes: usize) -> (Core<Counting>, Arc<AtomicUsize>) {
    let estimates = Arc::new(AtomicUsize::new(0));
    let t = Counting { inner, estimates: estimates.clone() };
    let cfg = EngineConfig { memory_bytes, ..EngineConfig::default() };
    (Core::new(t, cfg, Box::new(FixedClock(std::time::Instant::now()))), estimates)
}

#[test]
fn a_billion_token_request_is_refused_with_what_fits_after_a_logarithmic_search() {
    let context = 1_000_000_000;
    let (mut c, estimates) = core_over(FakeTarget { context, ..FakeTarget::new() }, 1 << 30);
    let e = c.submit(Request::greedy(vec![1], context - 1), channel().0).expect_err("never fits");
    // 1024 bytes a position in a 1 GiB budget: exactly 2^20 positions fit.
    assert_eq!(e, SubmitError::NeverFits { needed: context * 1024, tokens: context, budget: 1 << 30, fits: 1 << 20 });
    let n = estimates.load(Ordering::Relaxed);
    assert!(n <= 2 + 31, "{n} estimates for a 10^9 range: not a bisection");
    assert_eq!(c.metrics().waiting, 0);
}

#[test]
fn a_max_tokens_of_usize_max_is_refused_as_past_the_context_without_overflow() {
    let (mut c, _) = core_over(FakeTarget::new(), 1 << 30);
    let e = c.submit(Request::greedy(vec![1, 2], usize::MAX), channel().0).expect_err("past the context");
    assert_eq!(e, SubmitError::ContextExceeded { prompt: 2, max_tokens: usize::MAX, context: 4096 });
}

#[test]
fn a_saturating_estimate_never_wraps_into_a_fit() {
    // 2^62 bytes a position: 4 positions are 2^64 bytes, which wraps to 0 in unchecked arithmetic.
    let t = FakeTarget { bytes_per_token: 1 << 62, ..FakeTarget::new() };
    assert_eq!(t.stream_bytes(4, 1), usize::MAX);
    let (mut c, _) = core_over(t, 1 << 63);
    let e = c.submit(Request::greedy(vec![1], 3), channel().0).expect_err("never fits");
    assert_eq!(e, SubmitError::NeverFits { needed: usize::MAX, tokens: 4, budget: 1 << 63, fits: 2 });
    assert!(c.submit(Request::greedy(vec![1], 1), channel().0).is_ok(), "2 positions are exactly the budget");
}

#[test]
fn the_bisection_equals_a_linear_scan_on_every_small_case() {
    let steps = |t: usize| [0usize, 0, 3, 3, 3, 7, 9, 9, 20, 21, 21, 40][t.min(11)] + t / 12;
    for max in 0..30 {
        for budget in 0..45 {
            let scan = (0..=max).rev().find(|&t| steps(t) <= budget).unwrap_or(0);
            assert_eq!(largest_fitting(max, budget, steps), scan, "max {max} budget {budget}");
        }
    }
    assert_eq!(largest_fitting(usize::MAX, usize::MAX - 1, |t| t), usize::MAX - 1);
    assert_eq!(largest_fitting(10, 5, |_| 6), 0, "nothing fits: 0");
}
