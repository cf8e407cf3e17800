//! `GET /v1/models/{id}` (OpenAI's "Retrieve model", which the openai client's `models.retrieve` calls): the served
//! model's object, the same card `/v1/models` lists; any other id is OpenAI's 404 with code `model_not_found`.
//! An id may hold slashes (`Org/Name`), raw or percent-encoded.

use crate::error::ApiError;
use crate::protocol::ModelCard;
use crate::state::AppState;
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;

/// The served model's card: its name, `created` (the server's start), `max_model_len` (`null` while loading).
pub fn card(s: &AppState) -> ModelCard {
    ModelCard {
        id: s.model_name.clone(),
        object: "model",
        created: s.created,
        owned_by: "tensorfold",
        max_model_len: s.ready.get().map(|r| r.context),
    }
}

/// The answer to a model id that is not served, as the completion routes give it: 404, `code: model_not_found`,
/// `param: model` (OpenAI's code and param; the type the server's other 404s carry).
pub fn not_found(id: &str, served: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("the model `{id}` does not exist; this server serves `{served}`"),
        kind: "not_found_error",
        param: Some("model".into()),
        code: Some("model_not_found"),
    }
}

/// `GET /v1/models/{id}`. Errors: 404 `model_not_found` for another id, 400 for a path that is not UTF-8.
pub async fn retrieve(
    State(s): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ModelCard>, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::invalid("model", format!("the model id in the path: {e}")))?;
    if id != s.model_name {
        return Err(not_found(&id, &s.model_name));
    }
    Ok(Json(card(&s)))
}
