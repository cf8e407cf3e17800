//! A lost device stops the server: the engine ends every stream with `DeviceFailure: ...`, and `serve` returns the
//! named error (the binary then exits non-zero) instead of staying up.

use std::time::Duration;
use tensorfold_engine::fake::FakeTarget;
use tensorfold_engine::{Caps, Engine, EngineConfig, Event, FinishReason, ForwardCall, Request, SegOut, Target};
use tensorfold_kernels::KernelError;
use tensorfold_model::ForwardError;
use tensorfold_server::state::Ready;
use tensorfold_server::{ServeOptions, serve};

/// The fake target, whose every forward finds its device lost.
struct Lost(FakeTarget);

impl Target for Lost {
    type State = Vec<u32>;
    type Held = ();
    fn caps(&self) -> Caps {
        self.0.caps()
    }
    fn new_state(&self) -> Vec<u32> {
        self.0.new_state()
    }
    fn pos(&self, s: &Vec<u32>) -> usize {
        self.0.pos(s)
    }
    fn state_bytes(&self, s: &Vec<u32>) -> usize {
        self.0.state_bytes(s)
    }
    fn stream_bytes(&self, tokens: usize, verify_rows: usize) -> usize {
        self.0.stream_bytes(tokens, verify_rows)
    }
    fn forward(&self, _: &ForwardCall<'_, ()>, _: &mut [&mut Vec<u32>]) -> Result<Vec<SegOut>, ForwardError> {
        let message = "planted: GPU 1 stopped answering".to_string();
        Err(ForwardError::Kernel(KernelError::DeviceLost { kernel: "nccl_reduce", message }))
    }
    fn keep(&self, s: &mut Vec<u32>, pos: usize) -> Result<(), ForwardError> {
        self.0.keep(s, pos)
    }
}

#[tokio::test]
async fn a_lost_device_stops_the_server_with_the_failure_named() {
    let engine = Engine::start(Lost(FakeTarget::new()), EngineConfig { max_draft: 0, ..EngineConfig::default() });
    let handle = engine.handle();
    let ready = Ready { engine: engine.handle(), text: None, context: 64, default_max_tokens: 8, devices: None };
    let opts = ServeOptions {
        addr: "127.0.0.1:0".parse().expect("an address"),
        model_name: "lost".into(),
        api_key: None,
        grace: Duration::from_secs(1),
        conn: Default::default(),
        http: Default::default(),
    };
    let (_, rx) = handle.submit(Request::greedy(vec![1, 2, 3], 4)).expect("admitted before the failure");
    let served = tokio::time::timeout(Duration::from_secs(20), serve(opts, move || Ok((ready, engine))))
        .await
        .expect("serve returns on its own");
    let err = served.expect_err("a lost device is an error exit");
    assert!(err.starts_with("engine stopped: DeviceFailure:") && err.contains("GPU 1 stopped answering"), "{err}");
    let finished = rx.iter().find_map(|e| match e {
        Event::Finished { reason, error, .. } => Some((reason, error)),
        _ => None,
    });
    let (reason, error) = finished.expect("the request finished");
    assert_eq!(reason, FinishReason::Error);
    assert!(error.is_some_and(|e| e.contains("DeviceFailure")));
}
