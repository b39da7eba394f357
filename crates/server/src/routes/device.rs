//! Device calls (device token): upload, inbox, acknowledgement.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use estafeta_exchange::Upload;
use estafeta_exchange::wire::{
    AckRequest, AckResponse, ErrorBody, Inbox, MessageAccepted, SendMessage,
};
use serde::Deserialize;

use super::raw_json;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery, Presenting};
use crate::state::AppState;

/// `POST /v1/messages`: 201 for a new message, 200 for a repeated
/// idempotency key (the earlier id).
#[utoipa::path(post, path = "/v1/messages", tag = "devices",
    request_body = SendMessage,
    responses(
        (status = 201, description = "Durable; the new message's id", body = MessageAccepted),
        (status = 200, description = "The same idempotency key again: the earlier id", body = MessageAccepted),
        (status = 404, description = "No such database", body = ErrorBody)))]
pub async fn send_message(
    State(state): State<AppState>,
    Presenting(who): Presenting,
    ApiJson(req): ApiJson<SendMessage>,
) -> Result<(StatusCode, Json<MessageAccepted>), ApiError> {
    let (accepted, upload) = state.exchange().send(&who, req).await?;
    let status = match upload {
        Upload::Created => StatusCode::CREATED,
        Upload::Repeated => StatusCode::OK,
    };
    Ok((status, Json(accepted)))
}

/// The query of `GET /v1/inbox`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InboxQuery {
    /// At most this many messages.
    pub limit: Option<usize>,
}

/// `GET /v1/inbox?limit=N`: unacknowledged messages, oldest first.
#[utoipa::path(get, path = "/v1/inbox", tag = "devices",
    params(InboxQuery),
    responses((status = 200, description = "Messages addressed to this device", body = Inbox)))]
pub async fn inbox(
    State(state): State<AppState>,
    Presenting(who): Presenting,
    ApiQuery(query): ApiQuery<InboxQuery>,
) -> Result<Response, ApiError> {
    let bytes = state.exchange().inbox(&who, query.limit).await?;
    Ok(raw_json(bytes))
}

/// `POST /v1/inbox/ack`: acknowledged messages move to `Log`.
#[utoipa::path(post, path = "/v1/inbox/ack", tag = "devices",
    request_body = AckRequest,
    responses((status = 200, description = "How many were acknowledged now", body = AckResponse)))]
pub async fn ack(
    State(state): State<AppState>,
    Presenting(who): Presenting,
    ApiJson(req): ApiJson<AckRequest>,
) -> Result<Json<AckResponse>, ApiError> {
    Ok(Json(state.exchange().ack(&who, req).await?))
}
