//! Updating from a round's outputs, its last stage: failed entries finish alone, held drafts are read into their
//! windows, each decode window is verified (`verify.rs`) and each prompt chunk yields its prompt-cache snapshots and,
//! at the prompt's end, the first token; committed tokens meet the stop conditions, and finished streams free their
//! lanes and memory at once.

use super::Core;
use super::plan::RoundPlan;
use super::verify::{WindowDraws, window_draws};
use crate::request::{Event, FinishReason, RequestId, TokenLogprobs};
use crate::target::{SegOut, Target};

impl<T: Target> Core<T> {
    /// Applies the forward's `results` (one an entry of `plan`) in entry order.
    pub(super) fn update(&mut self, plan: RoundPlan<T::Held>, results: Vec<Result<SegOut, super::runner::RowsError>>) {
        let (mut entries, outs) = self.drop_failed(plan.entries, results);
        let refused = self.apply_held(&mut entries, plan.held);
        let ids: Vec<RequestId> = entries.iter().map(|e| self.lanes[e.lane].id).collect();
        for (((id, e), mut out), bad) in ids.into_iter().zip(&mut entries).zip(outs).zip(refused) {
            let Some(i) = self.lanes.iter().position(|s| s.id == id) else { continue };
            let rows = &mut e.rows;
            if let Some(err) = bad
                && !self.refuse_held(i, rows, &mut out, err)
            {
                continue;
            }
            self.controlled_draws(i, rows, &mut out);
            if self.lanes[i].pending.is_some() {
                let p0 = self.target.pos(&self.lanes[i].state) - rows.len();
                let w = WindowDraws { p0, rows, out: &out, vocab: self.caps.vocab };
                let draws = window_draws(&self.lanes[i].req.params, &w, self.planted);
                self.verify(i, rows, &out.logits, draws);
            } else {
                self.after_prompt_rows(i, out);
            }
        }
    }

    /// After a prompt chunk: prompt-cache snapshots, and the first token once the prompt is in.
    fn after_prompt_rows(&mut self, i: usize, out: SegOut) {
        let pos = self.target.pos(&self.lanes[i].state);
        let prompt_len = self.lanes[i].req.prompt.len();
        let s = &self.lanes[i];
        if self.keeps_state_at(pos, prompt_len) && !self.cache.contains(&s.req.prompt[..pos]) {
            // A copy the device could not make is not kept (a lost device is recorded: the step's check stops).
            match self.target.snapshot(&s.state) {
                Ok(snap) => {
                    let bytes = self.target.state_bytes(&snap);
                    self.cache.insert(&s.req.prompt[..pos], snap, bytes);
                }
                Err(e) => self.note_device(&e),
            }
        }
        if pos < prompt_len {
            return;
        }
        let id = self.lanes[i].id;
        self.fan_out(i, &out.logits);
        let Some(i) = self.lanes.iter().position(|s| s.id == id) else { return };
        let s = &mut self.lanes[i];
        let cached_tokens = s.stats.cached_tokens;
        s.sink.send(Event::Prefilled { cached_tokens });
        match out.draws.into_iter().next() {
            Some(Ok(tok)) => {
                self.send_logprobs(i, &out.logits, tok);
                self.commit(i, tok, pos);
            }
            Some(Err(e)) => self.finish(i, FinishReason::Error, Some(format!("draw at position {pos}: {e}"))),
            None => self.finish(i, FinishReason::Error, Some(format!("no draw at position {pos}"))),
        }
    }

    /// Planned prompt-cache points: the prompt's end, the last chunk boundary before it, and boundaries at
    /// power-of-two multiples of the chunk (so copying snapshots costs O(prompt), not O(prompt^2 / chunk)).
    fn keeps_state_at(&self, pos: usize, prompt_len: usize) -> bool {
        if self.cfg.prompt_cache_bytes == 0 {
            return false;
        }
        let chunk = self.cfg.prefill_chunk.max(1);
        pos == prompt_len
            || (pos.is_multiple_of(chunk) && ((pos / chunk).is_power_of_two() || pos + chunk >= prompt_len))
    }

    /// Sends the log-probabilities of `tok` under `logits` (one row) when lane `i`'s request asked for them.
    pub(super) fn send_logprobs(&mut self, i: usize, logits: &[f32], tok: u32) {
        if let Some(n) = self.lanes[i].req.logprobs {
            self.lanes[i].sink.send(Event::Logprobs(TokenLogprobs::from_logits(logits, tok, n)));
        }
    }

    /// Commits the token drawn for position `at` and applies the stop conditions. Returns false when the
    /// stream finished (its lane is gone).
    pub(super) fn commit(&mut self, i: usize, tok: u32, at: usize) -> bool {
        let now = self.clock.now();
        let context = self.caps.context;
        let s = &mut self.lanes[i];
        s.generated += 1;
        s.history.push(tok);
        self.counters.generated_tokens += 1;
        self.round_committed += 1;
        if s.first_token.is_none() {
            s.first_token = Some(now);
            s.stats.ttft = now - s.submitted;
        }
        if !s.sink.send(Event::Token(tok)) {
            self.finish(i, FinishReason::Cancelled, None);
            return false;
        }
        let stop = s.req.stop_ids.contains(&tok)
            || (!s.req.ignore_eos && self.caps.eos.contains(&tok))
            || s.controls.as_ref().is_some_and(|c| c.done());
        if stop {
            self.finish(i, FinishReason::Stop, None);
        } else if s.generated >= s.req.max_tokens || at + 1 >= context {
            self.finish(i, FinishReason::Length, None);
        } else {
            s.pending = Some(tok);
            return true;
        }
        false
    }

    /// Ends lane `i`: its last event, its lane and its memory are released at once.
    pub(super) fn finish(&mut self, i: usize, reason: FinishReason, error: Option<String>) {
        self.finish_as(i, reason, error, false);
    }

    /// [`Core::finish`], the event's `out_of_memory` set as given.
    pub(super) fn finish_as(&mut self, i: usize, reason: FinishReason, error: Option<String>, out_of_memory: bool) {
        let mut s = self.lanes.swap_remove(i);
        self.release_followers(s.id);
        let now = self.clock.now();
        self.reserved -= s.bytes;
        let mut stats = s.stats;
        stats.generated_tokens = s.generated;
        stats.decode = s.first_token.map_or_else(Default::default, |t| now - t);
        s.sink.send(Event::Finished { reason, error, out_of_memory, stats });
    }
}
