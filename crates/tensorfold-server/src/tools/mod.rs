//! Tool calling (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`) for LFM2 checkpoints: the request's tools
//! checked (`spec`) and history tool fields (`history`), the chat template given `tools`, `required` or a named
//! function constrained to a call through the engine's tool grammar (Pythonic form, LFM2's default), and the
//! reply's `<|tool_call_start|>[...]<|tool_call_end|>` lists read (`pyliteral`, `split`; as they arrive: `live`)
//! into OpenAI `tool_calls`, whole or streamed in argument fragments (`reply`). `tool_choice: "none"` renders the tools and reads nothing (vLLM's meaning).

pub mod history;
pub mod live;
pub mod pyliteral;
pub mod reply;
pub mod spec;
pub mod split;

pub use reply::{StreamTools, apply};
pub use spec::{ToolChoice, ToolPlan};

use crate::api::Params;
use crate::error::ApiError;
use split::{CALL_END, CALL_START};
use tensorfold_engine::tool_bounds;
use tensorfold_engine::tool_grammar::{ToolCallForm, ToolConstraint, tool_call_spec};
use tensorfold_text::Text;

/// Readies `params`' tools for the checkpoint's tokenizer: the markers' ids (when they are special tokens) and,
/// for `required` or a named function, the call grammar as the request's constraint (`params.grammar`, compiled
/// at submission as every constraint is).
///
/// # Errors
/// A 400 naming `tool_choice` when the request also sends another constraint, or the grammar cannot be built.
pub fn prepare(params: &mut Params, text: &Text) -> Result<(), ApiError> {
    let Some(plan) = params.tools.as_mut() else { return Ok(()) };
    plan.marker_ids = [CALL_START, CALL_END]
        .into_iter()
        .filter_map(|m| {
            text.token_to_id(m).filter(|&id| text.decode(&[id], true).is_ok_and(|s| s.is_empty())).map(|id| (id, m))
        })
        .collect();
    let tools = match &plan.choice {
        ToolChoice::Required => plan.specs.clone(),
        ToolChoice::Named(n) => plan.specs.iter().filter(|s| &s.name == n).cloned().collect(),
        ToolChoice::Auto | ToolChoice::None => return Ok(()),
    };
    if let Some((field, _)) = &params.grammar {
        let msg = format!("one constraint a request; this one sends `{field}` and a required `tool_choice`");
        return Err(ApiError::invalid("tool_choice", msg));
    }
    let constraint = ToolConstraint {
        tools,
        parallel: plan.parallel,
        form: ToolCallForm::Pythonic,
        markers: (CALL_START.into(), CALL_END.into()),
        special_markers: plan.marker_ids.len() == 2,
        max_string: tool_bounds::MAX_STRING_CHARS,
        max_calls: tool_bounds::MAX_CALLS,
    };
    let spec = tool_call_spec(&constraint).map_err(|e| ApiError::invalid("tool_choice", e.to_string()))?;
    params.grammar = Some(("tool_choice", spec));
    Ok(())
}

/// The text of committed token `id` as the reply shows it: the detokenizer's `piece`, and a call marker's text
/// after it when `id` is that special token and calls are read (the detokenizer drops special tokens).
pub fn visible(params: &Params, id: u32, piece: String) -> String {
    let marker = params.tools.as_ref().filter(|p| p.parses()).and_then(|p| p.marker_ids.iter().find(|(m, _)| *m == id));
    match marker {
        Some((_, text)) => piece + text,
        None => piece,
    }
}
