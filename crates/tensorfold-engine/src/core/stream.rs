//! A request's own state in the lane core: waiting for a lane ([`Waiting`]), then running in one ([`Stream`]). What
//! a single round decides (drafting, rows) lives in the round's types (`plan.rs`), not here.

use crate::controls::Controls;
use crate::copies::StreamGuard;
use crate::request::{Request, RequestId, Sink, Stats};
use std::time::Instant;

/// A request waiting for a lane.
pub(super) struct Waiting {
    pub id: RequestId,
    pub req: Request,
    pub sink: Sink,
    pub submitted: Instant,
    /// What memory admission reserves for it (its state at prompt plus `max_tokens` positions).
    pub bytes: usize,
    /// The other members of its group (`n` streams of one prompt, `fanout.rs`), admitted with it.
    pub followers: Vec<Waiting>,
}

/// A request in a lane, across rounds.
pub(super) struct Stream<S> {
    pub id: RequestId,
    pub req: Request,
    pub sink: Sink,
    pub state: S,
    /// The token to feed next (the last committed one) once the prompt is in.
    pub pending: Option<u32>,
    /// Prompt and committed tokens (what context copies search).
    pub history: Vec<u32>,
    pub guard: StreamGuard,
    pub generated: usize,
    /// Bytes reserved for it by memory admission.
    pub bytes: usize,
    pub stats: Stats,
    pub submitted: Instant,
    pub first_token: Option<Instant>,
    /// The logit controls' state (penalties, grammar) when the request has any: its rows are drawn on the host
    /// (`controlled.rs`).
    pub controls: Option<Controls>,
    /// A group member waiting for its leader's prefill (`fanout.rs`): it takes a copy of the leader's state at the
    /// prompt's end instead of prefilling, and is planned no rows until then.
    pub leader: Option<RequestId>,
}
