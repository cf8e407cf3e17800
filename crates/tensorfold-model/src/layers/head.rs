//! The embedding (token ids, or held drafts where a verify takes them on the device) and the head (final norm,
//! tied or untied output projection, greedy picks or keyed draws of the rows that want them).

use super::Cx;
use crate::batch::{ForwardOut, LogitRows};
use crate::weights::Weights;
use tensorfold_kernels::sample::DrawSpec;
use tensorfold_kernels::{Backend, KernelError};

/// Held-draft ids for the embedding: the blocks' words on the device (`[block, streams, 3]`) and the `(row, pick)`
/// pairs of [`crate::batch::HeldIds::picks`].
pub(crate) type HeldWords<'a, B> = (&'a <B as tensorfold_kernels::backend::Memory>::Buf, &'a [(usize, usize)]);

impl<B: Backend> Weights<B> {
    /// The output projection `[vocab, h]`: `lm_head`, or the embedding when tied.
    pub fn head_mat(&self) -> &B::Mat {
        self.head.as_ref().unwrap_or(&self.embed)
    }

    /// Embeds `tokens` into `x` `[rows, h]` f32; with `held`, its rows take the held drafts' ids on the device
    /// instead of their placeholders.
    pub(crate) fn embed_rows(
        &self,
        b: &B,
        tokens: &[u32],
        held: Option<HeldWords<'_, B>>,
        x: &mut B::Buf,
    ) -> Result<(), KernelError> {
        match held {
            Some((words, from)) => b.embed_held(&self.embed, tokens, words, from, x),
            None => b.embed(&self.embed, tokens, x),
        }
    }

    /// Final norm, head and greedy pick of the rows of `x` that want logits; under [`LogitRows::Want`], the draws
    /// and the logits rows asked for instead. No rows wanted: nothing runs.
    pub(crate) fn head_rows(&self, cx: &Cx<'_, B>, x: &B::Buf, which: LogitRows) -> ForwardOut {
        let (b, c, segs) = (cx.b, cx.cfg, cx.segs);
        let n_rows = segs.iter().map(|s| s.first_row + s.rows).max().unwrap_or(0);
        let (rows, wants) = match which {
            LogitRows::All => ((0..n_rows).collect(), None),
            LogitRows::Last => (segs.iter().map(|s| s.first_row + s.rows - 1).collect(), None),
            LogitRows::Rows(r) => (r, None),
            LogitRows::Want(w) => (w.iter().map(|w| w.row).collect::<Vec<_>>(), Some(w)),
        };
        if rows.is_empty() {
            return ForwardOut { rows, logits: Vec::new(), picks: Vec::new(), draws: Vec::new() };
        }
        let picked = b.gather_rows(x, c.hidden, &rows);
        let mut normed = b.scratch(rows.len() * c.hidden);
        b.rmsnorm(&picked, &self.final_norm, c.norm_eps, c.hidden, &mut normed);
        let mut logits = b.scratch(rows.len() * c.vocab);
        b.linear(&normed, rows.len(), self.head_mat(), None, &mut logits);
        let Some(wants) = wants else {
            let picks = b.greedy(&logits, c.vocab);
            return ForwardOut { rows, logits: b.read(&logits), picks, draws: Vec::new() };
        };
        // A subset of the logits rows, without a copy when it is all of them.
        let subset = |idx: &[usize]| (idx.len() < rows.len()).then(|| b.gather_rows(&logits, c.vocab, idx));
        let (drawn, specs): (Vec<usize>, Vec<DrawSpec>) =
            wants.iter().enumerate().filter_map(|(i, w)| w.draw.map(|d| (i, d))).unzip();
        let mut draws = vec![None; rows.len()];
        if !specs.is_empty() {
            let sub = subset(&drawn);
            for (i, r) in drawn.into_iter().zip(b.draw_rows(sub.as_ref().unwrap_or(&logits), c.vocab, &specs)) {
                draws[i] = Some(r);
            }
        }
        let read: Vec<usize> = (0..rows.len()).filter(|&i| wants[i].logits).collect();
        let host = match read.is_empty() {
            true => Vec::new(),
            false => b.read(subset(&read).as_ref().unwrap_or(&logits)),
        };
        ForwardOut { rows, logits: host, picks: Vec::new(), draws }
    }

    /// Bytes of the embedding and, untied, the head on the device.
    pub(crate) fn table_bytes(&self, b: &B) -> usize {
        b.mat_bytes(&self.embed) + self.head.as_ref().map_or(0, |m| b.mat_bytes(m))
    }
}
