//! A forward that fails for one stream fails that stream alone: the round is re-run stream by stream, the
//! others' replies equal the serial reference and no lane or memory stays held.

use std::sync::mpsc::channel;
use std::time::Instant;
use tensorfold_engine::core::{Core, EngineConfig, FixedClock};
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::sampler::draw;
use tensorfold_engine::{Event, FinishReason, Request, Target};
use tensorfold_kernels::Segment;
use tensorfold_model::ForwardError;

/// The fake target, except that any call holding a stream whose history starts with `poison` and has grown
/// `after` tokens past it fails as a whole (an engine fault), before touching any state.
struct Faulty {
    inner: FakeTarget,
    poison: Vec<u32>,
    after: usize,
}

impl Target for Faulty {
    type State = Vec<u32>;

    fn vocab(&self) -> usize {
        self.inner.vocab
    }
    fn context(&self) -> usize {
        self.inner.context
    }
    fn eos_ids(&self) -> Vec<u32> {
        Vec::new()
    }
    fn new_state(&self) -> Vec<u32> {
        Vec::new()
    }
    fn pos(&self, s: &Vec<u32>) -> usize {
        s.len()
    }
    fn state_bytes(&self, s: &Vec<u32>) -> usize {
        self.inner.state_bytes(s)
    }
    fn stream_bytes(&self, tokens: usize) -> usize {
        self.inner.stream_bytes(tokens)
    }
    fn forward(
        &self,
        tokens: &[u32],
        segs: &[Segment],
        states: &mut [&mut Vec<u32>],
        all_rows: &[bool],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        if segs.iter().any(|s| {
            states[s.cache].starts_with(&self.poison) && states[s.cache].len() >= self.poison.len() + self.after
        }) {
            return Err(ForwardError::Batch("planted fault".into()));
        }
        self.inner.forward(tokens, segs, states, all_rows)
    }
    fn keep(&self, s: &mut Vec<u32>, pos: usize) -> Result<(), ForwardError> {
        self.inner.keep(s, pos)
    }
}

fn serial(t: &FakeTarget, r: &Request) -> Vec<u32> {
    let mut h = r.prompt.clone();
    let mut out = Vec::new();
    while out.len() < r.max_tokens {
        let tok = draw(&r.params, h.len() as u64, &t.logits(&h)).expect("finite");
        out.push(tok);
        h.push(tok);
    }
    out
}

#[test]
fn a_stream_whose_forward_fails_finishes_alone_and_the_others_equal_the_serial_reference() {
    for shared_rounds in [true, false] {
        let inner = FakeTarget::new();
        let reqs: Vec<Request> = (0..5)
            .map(|i| Request { ignore_eos: true, ..Request::greedy((1 + 12 * i..4 + 13 * i).collect(), 12) })
            .collect();
        let target = Faulty { inner: inner.clone(), poison: reqs[2].prompt.clone(), after: 4 };
        let cfg = EngineConfig { shared_rounds, max_draft: 0, ..EngineConfig::default() };
        let mut core = Core::new(target, cfg, Box::new(FixedClock(Instant::now())));
        let rx: Vec<_> = reqs
            .iter()
            .map(|r| {
                let (tx, rx) = channel();
                core.submit(r.clone(), tx).expect("admitted");
                rx
            })
            .collect();
        while core.step() {}
        for (i, (r, rx)) in reqs.iter().zip(rx).enumerate() {
            let ev: Vec<Event> = rx.try_iter().collect();
            let toks: Vec<u32> =
                ev.iter().filter_map(|e| if let Event::Token(t) = e { Some(*t) } else { None }).collect();
            let reason =
                ev.iter().find_map(|e| if let Event::Finished { reason, .. } = e { Some(*reason) } else { None });
            if i == 2 {
                assert_eq!(reason, Some(FinishReason::Error), "shared {shared_rounds}");
                assert_eq!(toks, serial(&inner, r)[..toks.len()], "its tokens before the fault are right");
            } else {
                assert_eq!(reason, Some(FinishReason::Length), "shared {shared_rounds}, request {i}");
                assert_eq!(toks, serial(&inner, r), "shared {shared_rounds}, request {i}");
            }
        }
        let m = core.metrics();
        assert_eq!((m.running, m.waiting, m.reserved_bytes), (0, 0, 0));
    }
}
