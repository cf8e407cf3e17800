//! Rows of a stream with logit controls (`penalties.rs`): the forward copies their logits to the host and the keyed
//! draws are made there, after the controls, from the stream's own tokens. A verify window's row `r` is drawn given
//! the committed tokens and the window's drafts before it, and each draw is recorded as it is made: the walk stops
//! at the first draw that differs from the next draft, so the recorded tokens are exactly the ones the verify
//! commits, and a drafted reply equals its plain reply.

use super::Core;
use crate::keyed::SampleError;
use crate::target::{SegOut, SegWant, Target};

impl<T: Target> Core<T> {
    /// What a controlled lane's segment wants: its logits (every row of a decode window, the last row of the
    /// prompt's last chunk), no device draws; an earlier prompt chunk nothing.
    pub(super) fn controlled_want(decoding: bool, prompt_end: bool, rows: usize) -> SegWant {
        SegWant { all_rows: decoding && rows > 1, draws: Vec::new(), logits: decoding || prompt_end }
    }

    /// Fills `out.draws` of lane `i`'s segment (`rows` as run) on the host when the lane has logit controls: a
    /// decode window's draws up to the first one that differs from the next draft, or the first token's draw at
    /// the prompt's end. Lanes without controls, and earlier prompt chunks, are left as they are.
    pub(super) fn controlled_draws(&mut self, i: usize, rows: &[u32], out: &mut SegOut) {
        let v = self.caps.vocab;
        let pos = self.target.pos(&self.lanes[i].state);
        let s = &mut self.lanes[i];
        let Some(c) = s.controls.as_mut() else { return };
        let params = s.req.params;
        if s.pending.is_none() {
            if pos == s.req.prompt.len() {
                let d = c.draw(&params, pos as u64, out.logits.get(..v).unwrap_or(&[]));
                out.draws = vec![d.map_err(SampleError::Constraint)];
            }
            return;
        }
        let p0 = pos - rows.len();
        out.draws.clear();
        for r in 0..rows.len() {
            let d = c.draw(&params, (p0 + 1 + r) as u64, out.logits.get(r * v..(r + 1) * v).unwrap_or(&[]));
            let next = d.clone().ok();
            out.draws.push(d.map_err(SampleError::Constraint));
            // A grammar that is complete takes no more: the commit of `t` ends the stream.
            let Some(t) = next.filter(|_| !c.done()) else { break };
            if rows.get(r + 1) != Some(&t) {
                break;
            }
        }
    }
}
