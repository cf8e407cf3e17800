//! A stream's logit controls together: the penalties and `logit_bias` (`penalties.rs`) and the grammar mask
//! (`grammar.rs`), applied to a row's logits on the host before the keyed draw, in vLLM v1's order for the penalties
//! and the mask last (a masked token is never drawn, so where the mask sits among the additive controls does not
//! change the draw, and last keeps masked logits from overflowing under a repetition penalty).

use crate::grammar::Grammar;
use crate::keyed::{SamplingParams, draw};
use crate::penalties::{Penalties, PenaltyState};
use crate::request::Request;

/// One stream's controls and their state at its committed tokens.
#[derive(Clone, Debug)]
pub struct Controls {
    penalties: Option<PenaltyState>,
    grammar: Option<Grammar>,
}

impl Controls {
    /// The controls of `req` at the start of its reply; `None` when it has none (its rows keep the device draw).
    pub fn of(req: &Request) -> Option<Self> {
        Self::new(&req.penalties, req.grammar.as_ref(), &req.prompt)
    }

    /// The controls of a reply to `prompt` (`None` when neither is on).
    pub fn new(penalties: &Penalties, grammar: Option<&Grammar>, prompt: &[u32]) -> Option<Self> {
        let penalties = penalties.is_on().then(|| PenaltyState::new(penalties.clone(), prompt));
        let grammar = grammar.cloned();
        (penalties.is_some() || grammar.is_some()).then_some(Self { penalties, grammar })
    }

    /// Draws the token at `position` from a row's raw `logits` under the controls, and records it as committed
    /// (the caller commits every token it draws here, or ends the stream).
    ///
    /// # Errors
    /// The draw's error (a non-finite logit), or the grammar's (a dead end, a refused token).
    pub fn draw(&mut self, params: &SamplingParams, position: u64, logits: &[f32]) -> Result<u32, String> {
        let mut row = logits.to_vec();
        if let Some(p) = &self.penalties {
            p.apply(&mut row);
        }
        if let Some(g) = &mut self.grammar {
            g.mask(&mut row)?;
        }
        let t = draw(params, position, &row).map_err(|e| e.to_string())?;
        if let Some(p) = &mut self.penalties {
            p.push(t);
        }
        if let Some(g) = &mut self.grammar {
            g.accept(t)?;
        }
        Ok(t)
    }

    /// The grammar is complete: the stream stops after its last token.
    pub fn done(&self) -> bool {
        self.grammar.as_ref().is_some_and(Grammar::is_done)
    }
}
