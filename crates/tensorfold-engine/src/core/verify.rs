//! Speculative verify: a decode window's draws under the keyed accept rule (a draft is kept iff it equals the draw at
//! the row before it), then the kept drafts and the draw after them committed, the state rolled back to the kept
//! path, and the drafted and accepted counts recorded.

use super::Core;
use super::planted::Planted;
use crate::keyed::{SamplingParams, draw};
use crate::request::FinishReason;
use crate::target::{SegOut, Target};

/// A decode window's forward output: `rows` = the pending token, then drafts, its first row at position `p0`; `out`
/// one draw a row, and the rows' logits (`vocab` wide) when a fault is planted.
pub(super) struct WindowDraws<'a> {
    /// Position of the window's first row.
    pub p0: usize,
    /// The window's rows.
    pub rows: &'a [u32],
    /// What the forward gave back for it.
    pub out: &'a SegOut,
    /// Logits a row.
    pub vocab: usize,
}

impl<T: Target> Core<T> {
    /// Applies a verified decode window (the pending token, then drafts; `draws` from [`window_draws`]): a
    /// draft was kept iff it equals the draw at the row before it; the kept drafts and the draw after the
    /// last kept row are committed, and the state rolls back to the kept path.
    pub(super) fn verify(&mut self, i: usize, rows: &[u32], logits: &[f32], draws: Result<Vec<u32>, String>) {
        let v = self.caps.vocab;
        let n = rows.len() - 1;
        let p0 = self.target.pos(&self.lanes[i].state) - rows.len();
        let toks = match draws {
            Ok(t) => t,
            Err(e) => return self.finish(i, FinishReason::Error, Some(e)),
        };
        let accepted = toks.len() - 1;
        if n > 0 {
            let s = &mut self.lanes[i];
            if let Err(e) = self.target.keep(&mut s.state, p0 + toks.len()) {
                return self.refuse_rollback(i, e);
            }
            s.guard.record(accepted);
            self.record_window(i, n, accepted);
        }
        for (r, &t) in toks.iter().enumerate() {
            self.send_logprobs(i, logits.get(r * v..(r + 1) * v).unwrap_or(&[]), t);
            if !self.commit(i, t, p0 + 1 + r) {
                return;
            }
        }
    }

    /// Records a window of `n` drafts of which `accepted` were kept: the cost model, lane `i`'s stats, the metrics.
    fn record_window(&mut self, i: usize, n: usize, accepted: usize) {
        self.costs.record_window(n, accepted);
        let s = &mut self.lanes[i];
        s.stats.drafted += n;
        s.stats.accepted += accepted;
        s.stats.windows += 1;
        if s.stats.accepted_at.len() < accepted {
            s.stats.accepted_at.resize(accepted, 0);
        }
        s.stats.accepted_at[..accepted].iter_mut().for_each(|c| *c += 1);
        self.counters.draft_windows += 1;
        if self.counters.accepted_at.len() < accepted {
            self.counters.accepted_at.resize(accepted, 0);
        }
        self.counters.accepted_at[..accepted].iter_mut().for_each(|c| *c += 1);
        self.counters.drafted_tokens += n as u64;
        self.counters.accepted_tokens += accepted as u64;
    }
}

/// The draws of a decode window whose first row sits at position `w.p0`: row `r` was drawn for position
/// `p0 + 1 + r`, and the walk stops at the first draw that differs from the next draft (the draw after the last
/// kept draft). A draw's error counts only if the walk reaches it.
pub(super) fn window_draws(params: &SamplingParams, w: &WindowDraws, planted: Planted) -> Result<Vec<u32>, String> {
    let (p0, rows, out, v) = (w.p0, w.rows, w.out, w.vocab);
    let n = rows.len() - 1;
    let mut toks = Vec::with_capacity(rows.len());
    for r in 0..=n {
        let at = p0 + 1 + r;
        let t = match out.draws.get(r) {
            Some(d) => d.clone().map_err(|e| format!("draw at position {at}: {e}"))?,
            None => return Err(format!("no draw at position {at}")),
        };
        toks.push(t);
        if r == n || t != rows[r + 1] {
            break;
        }
    }
    let k = toks.len() - 1;
    if planted.bonus_from_wrong_row() && k > 0 {
        toks[k] = draw(params, (p0 + 1 + k) as u64, &out.logits[(k - 1) * v..k * v]).map_err(|e| e.to_string())?;
    }
    Ok(toks)
}
