//! A forward that fails for one stream fails that stream alone: the round is re-run stream by stream, the
//! others' replies equal the serial reference and no lane or memory stays held.

mod common;

use common::{Fault, Poisoned, core, reference, run_scheduled};
use tensorfold_engine::core::EngineConfig;
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::{FinishReason, Request};

#[test]
fn a_stream_whose_forward_fails_finishes_alone_and_the_others_equal_the_serial_reference() {
    for shared_rounds in [true, false] {
        let inner = FakeTarget::new();
        let reqs: Vec<(usize, Request)> = (0..5)
            .map(|i| (0, Request { ignore_eos: true, ..Request::greedy((1 + 12 * i..4 + 13 * i).collect(), 12) }))
            .collect();
        let poison = reqs[2].1.prompt.clone();
        let target = Poisoned { inner: inner.clone(), poison, after: 4, fault: Fault::RefuseCall };
        let mut c = core(target, EngineConfig { shared_rounds, max_draft: 0, ..EngineConfig::default() });
        let seen = run_scheduled(&mut c, &reqs, |_| {});
        for (i, ((_, r), s)) in reqs.iter().zip(&seen).enumerate() {
            let want = reference(&inner, r).0;
            if i == 2 {
                assert_eq!(s.reason, Some(FinishReason::Error), "shared {shared_rounds}");
                assert_eq!(s.tokens, want[..s.tokens.len()], "its tokens before the fault are right");
            } else {
                assert_eq!(s.reason, Some(FinishReason::Length), "shared {shared_rounds}, request {i}");
                assert_eq!(s.tokens, want, "shared {shared_rounds}, request {i}");
            }
        }
        let m = c.metrics();
        assert_eq!((m.running, m.waiting, m.reserved_bytes), (0, 0, 0));
    }
}
