//! `best_of` above `n`, as OpenAI and vLLM meant it: `best_of` candidates of one prompt sharing one prefill
//! (`submit_n`, candidate `i` keyed by seed `seed + i`), each with its tokens' logprobs computed whatever the
//! request asks for; the `n` of the highest cumulative logprob (the sum of the reported token logprobs, the raw
//! log-softmax before temperature, as vLLM reports them) are the reply's choices in that order, ties to the earlier
//! candidate. A whole reply only (a stream is refused at validation); `usage` counts the returned choices' tokens,
//! as vLLM counts them; `tensorfold.choices[i].seed` names each returned candidate.

use crate::answer::Answer;
use crate::api::Params;
use crate::completion::{Outcome, Piece, submit_n};
use crate::error::ApiError;
use crate::fanout::{collect, merge};
use crate::state::{AppState, Ready};
use axum::Json;
use axum::response::{IntoResponse, Response};

/// Runs the `params.best_of` candidates and answers with the best `params.n`.
pub async fn respond(s: AppState, r: Ready, ids: Vec<u32>, params: Params, a: Answer) -> Result<Response, ApiError> {
    let prompt_tokens = ids.len() as u64;
    let ranked = Params { logprobs: Some(params.logprobs.unwrap_or(0)), ..params.clone() };
    let runs = submit_n(&r, ids, ranked, params.best_of).await?;
    metrics::counter!("tensorfold_prompt_tokens_total").increment(prompt_tokens);
    let shape = a.shape(s.model_name.clone());
    let candidates = collect(&r, runs, &a.log).await?;
    Ok(Json(merge(&shape, &params, best(candidates, params.n), &a.log)).into_response())
}

/// A candidate's cumulative logprob.
pub fn cumulative_logprob(pieces: &[Piece]) -> f64 {
    pieces.iter().flat_map(|p| &p.logprobs).map(|e| f64::from(e.logprob)).sum()
}

/// The `n` candidates of the highest cumulative logprob, best first (ties: the earlier candidate first).
pub fn best(candidates: Vec<(Vec<Piece>, Outcome)>, n: usize) -> Vec<(Vec<Piece>, Outcome)> {
    let mut scored: Vec<(f64, (Vec<Piece>, Outcome))> =
        candidates.into_iter().map(|c| (cumulative_logprob(&c.0), c)).collect();
    // A stable sort keeps the earlier of equal scores first.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().take(n).map(|(_, c)| c).collect()
}
