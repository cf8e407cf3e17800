//! Groups: `n` streams of one prompt (OpenAI's `n`) that share ONE prefill. The group waits and is admitted whole;
//! its leader prefills, and at the prompt's end every follower takes a copy of the leader's state and draws its
//! first token from the leader's last-row logits with its own parameters (its own seed), so each member's reply
//! equals that request run alone. Should the leader finish before its prompt is in, the followers prefill on their
//! own.

use super::Core;
use super::stream::Waiting;
use crate::keyed::draw;
use crate::request::{Event, FinishReason, Limits, Request, RequestId, Sink, Stats, SubmitError};
use crate::target::Target;

impl<T: Target> Core<T> {
    /// Checks and queues a group (`reqs[0]` leads; every request has the same prompt); `sinks[i]` gets request
    /// `i`'s events. All or nothing: a refusal queues none of them.
    ///
    /// # Errors
    /// Any member's [`SubmitError`] from the one check, [`SubmitError::GroupPrompts`] for differing prompts or a
    /// sink count that is not the request count, [`SubmitError::GroupTooLarge`] past the lanes,
    /// [`SubmitError::NeverFits`] when the group's memory together exceeds the budget, and the queue's refusals.
    pub fn submit_group(&mut self, reqs: Vec<Request>, sinks: Vec<Sink>) -> Result<Vec<RequestId>, SubmitError> {
        if self.failure.is_some() {
            return Err(SubmitError::Stopped);
        }
        let n = reqs.len();
        if n == 0 || sinks.len() != n || reqs.iter().any(|r| r.prompt != reqs[0].prompt) {
            return Err(SubmitError::GroupPrompts);
        }
        if n > self.cfg.parallel {
            return Err(SubmitError::GroupTooLarge { n, lanes: self.cfg.parallel });
        }
        let limits = Limits { vocab: self.caps.vocab, context: self.caps.context };
        reqs.iter().try_for_each(|r| r.validate(limits))?;
        let v = self.verify_rows();
        let bytes: Vec<usize> =
            reqs.iter().map(|r| self.target.stream_bytes(r.prompt.len() + r.max_tokens, v)).collect();
        let (needed, budget) = (bytes.iter().sum::<usize>(), self.cfg.memory_bytes);
        if needed > budget {
            let tokens = reqs.iter().map(|r| r.prompt.len() + r.max_tokens).sum();
            let fits = (0..=tokens).rev().find(|&t| self.target.stream_bytes(t, v) * n <= budget).unwrap_or(0);
            return Err(SubmitError::NeverFits { needed, tokens, budget, fits });
        }
        let free_lanes = self.cfg.parallel.saturating_sub(self.lanes.len());
        if self.queue.len() + 1 > free_lanes + self.cfg.queue_capacity {
            return Err(SubmitError::QueueFull { capacity: self.cfg.queue_capacity });
        }
        let now = self.clock.now();
        let mut members: Vec<Waiting> = reqs
            .into_iter()
            .zip(sinks)
            .zip(bytes)
            .map(|((req, sink), bytes)| {
                let id = self.next_id;
                self.next_id += 1;
                Waiting { id, req, sink, submitted: now, bytes, followers: Vec::new() }
            })
            .collect();
        let ids = members.iter().map(|w| w.id).collect();
        let mut leader = members.remove(0);
        leader.followers = members;
        self.queue.push_back(leader);
        Ok(ids)
    }

    /// Whether lane `i` leads followers still waiting for its prefill.
    pub(super) fn leads(&self, i: usize) -> bool {
        let id = self.lanes[i].id;
        self.lanes.iter().any(|s| s.leader == Some(id))
    }

    /// At lane `i`'s prompt end (`logits`: its last row): each follower takes a copy of its state and commits its
    /// first token, drawn from those logits with its own parameters (and logit controls). A follower whose copy the
    /// device has no memory for prefills its prompt on its own (the same bits: rows are invariant).
    pub(super) fn fan_out(&mut self, i: usize, logits: &[f32]) {
        let (id, pos, v) = (self.lanes[i].id, self.target.pos(&self.lanes[i].state), self.verify_rows());
        let followers: Vec<RequestId> = self.lanes.iter().filter(|s| s.leader == Some(id)).map(|s| s.id).collect();
        for f in followers {
            let Some(l) = self.lanes.iter().position(|s| s.id == id) else { return };
            let Some(j) = self.lanes.iter().position(|s| s.id == f) else { continue };
            let tokens = self.lanes[j].req.prompt.len() + self.lanes[j].req.max_tokens;
            let mut state = match self.target.snapshot(&self.lanes[l].state) {
                Ok(s) => s,
                Err(e) if e.is_out_of_memory() => {
                    self.on_its_own(f);
                    continue;
                }
                Err(e) => {
                    self.refuse_state(f, e);
                    continue;
                }
            };
            if let Err(e) = self.target.reserve(&mut state, tokens, v) {
                self.refuse_state(f, e);
                continue;
            }
            let s = &mut self.lanes[j];
            s.state = state;
            s.leader = None;
            s.stats.cached_tokens = pos;
            s.sink.send(Event::Prefilled { cached_tokens: pos });
            let d = match s.controls.as_mut() {
                Some(c) => c.draw(&s.req.params, pos as u64, logits),
                None => draw(&s.req.params, pos as u64, logits).map_err(|e| e.to_string()),
            };
            match d {
                Ok(tok) => {
                    self.send_logprobs(j, logits, tok);
                    self.commit(j, tok, pos);
                }
                Err(e) => self.finish(j, FinishReason::Error, Some(format!("draw at position {pos}: {e}"))),
            }
        }
    }

    /// A lane that finished before its prompt was in leaves its followers to prefill on their own; one whose state
    /// the target could not reserve finishes with that error ([`Core::refuse_state`]).
    pub(super) fn release_followers(&mut self, id: RequestId) {
        let followers: Vec<RequestId> = self.lanes.iter().filter(|s| s.leader == Some(id)).map(|s| s.id).collect();
        for f in followers {
            self.on_its_own(f);
        }
    }

    /// Follower `f` prefills its prompt on its own: its placeholder state is reserved now; one the target could not
    /// reserve finishes it with that error ([`Core::refuse_state`]).
    fn on_its_own(&mut self, f: RequestId) {
        let v = self.verify_rows();
        let Some(s) = self.lanes.iter_mut().find(|s| s.id == f) else { return };
        s.leader = None;
        if let Err(e) = self.target.reserve(&mut s.state, s.req.prompt.len() + s.req.max_tokens, v) {
            self.refuse_state(f, e);
        }
    }

    /// Ends a waiting request (its followers too) with `reason`.
    pub(super) fn finish_waiting(&mut self, mut w: Waiting, reason: FinishReason, error: Option<String>) {
        let now = self.clock.now();
        let followers = std::mem::take(&mut w.followers);
        for mut m in std::iter::once(w).chain(followers) {
            let stats = Stats { prompt_tokens: m.req.prompt.len(), queued: now - m.submitted, ..Stats::default() };
            m.sink.send(Event::Finished { reason, error: error.clone(), out_of_memory: false, stats });
        }
    }

    /// Cancels the waiting request `id` alone (a group's leader or follower; a cancelled leader's first follower
    /// leads the rest). False when no waiting request has that id.
    pub(super) fn cancel_waiting(&mut self, id: RequestId) -> bool {
        if let Some(i) = self.queue.iter().position(|w| w.id == id) {
            let mut w = self.queue.remove(i).expect("index from position");
            let mut followers = std::mem::take(&mut w.followers);
            if !followers.is_empty() {
                let mut next = followers.remove(0);
                next.followers = followers;
                self.queue.insert(i, next);
            }
            self.finish_waiting(w, FinishReason::Cancelled, None);
            return true;
        }
        let found = self.queue.iter_mut().find_map(|w| {
            let k = w.followers.iter().position(|f| f.id == id)?;
            Some(w.followers.remove(k))
        });
        match found {
            Some(f) => {
                self.finish_waiting(f, FinishReason::Cancelled, None);
                true
            }
            None => false,
        }
    }
}
