//! Processor calls (database token): the six calls of the protocol and the
//! process status. Status words travel with HTTP 200.

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use estafeta_exchange::wire::{
    AbortRequest, AcceptRequest, CallResponse, CommitRequest, ErrorBody, PrepareRequest,
    ProcessStatus, RollbackRequest, StartRequest, StartResponse,
};

use super::raw_json;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, Caller, Presenting};
use crate::state::AppState;

/// API_1, `POST /v1/processes`: IDLE, BUSY, or OK with a process id and messages.
#[utoipa::path(post, path = "/v1/processes", tag = "processes",
    request_body = StartRequest,
    responses((status = 200, description = "IDLE, BUSY, or OK with the messages", body = StartResponse)))]
pub async fn start(
    State(state): State<AppState>,
    Presenting(who): Presenting,
    ApiJson(req): ApiJson<StartRequest>,
) -> Result<Response, ApiError> {
    Ok(raw_json(state.exchange().start(&who, req).await?))
}

/// API_2, `POST /v1/processes/{pid}/accept`.
#[utoipa::path(post, path = "/v1/processes/{pid}/accept", tag = "processes",
    params(("pid" = String, Path, description = "Process id")),
    request_body = AcceptRequest,
    responses((status = 200, description = "OK or CANCELLED", body = CallResponse)))]
pub async fn accept(
    State(state): State<AppState>,
    Presenting(who): Presenting,
    ApiPath(pid): ApiPath<String>,
    ApiJson(req): ApiJson<AcceptRequest>,
) -> Result<Json<CallResponse>, ApiError> {
    Ok(Json(state.exchange().accept(&who, &pid, req).await?))
}

/// API_3, `POST /v1/processes/{pid}/prepare`.
#[utoipa::path(post, path = "/v1/processes/{pid}/prepare", tag = "processes",
    params(("pid" = String, Path, description = "Process id")),
    request_body = PrepareRequest,
    responses(
        (status = 200, description = "OK (replies durable, READY_TO_COMMIT) or CANCELLED", body = CallResponse),
        (status = 422, description = "The results do not name every accepted message exactly once", body = ErrorBody)))]
pub async fn prepare(
    State(state): State<AppState>,
    Presenting(who): Presenting,
    ApiPath(pid): ApiPath<String>,
    ApiJson(req): ApiJson<PrepareRequest>,
) -> Result<Json<CallResponse>, ApiError> {
    Ok(Json(state.exchange().prepare(&who, &pid, req).await?))
}

/// API_4, `POST /v1/processes/{pid}/commit`.
#[utoipa::path(post, path = "/v1/processes/{pid}/commit", tag = "processes",
    params(("pid" = String, Path, description = "Process id")),
    request_body = CommitRequest,
    responses((status = 200, description = "OK, FAILED (moves retried by the server) or CANCELLED", body = CallResponse)))]
pub async fn commit(
    State(state): State<AppState>,
    Presenting(who): Presenting,
    ApiPath(pid): ApiPath<String>,
    ApiJson(req): ApiJson<CommitRequest>,
) -> Result<Json<CallResponse>, ApiError> {
    Ok(Json(state.exchange().commit(&who, &pid, req).await?))
}

/// API_5, `POST /v1/processes/{pid}/rollback`.
#[utoipa::path(post, path = "/v1/processes/{pid}/rollback", tag = "processes",
    params(("pid" = String, Path, description = "Process id")),
    request_body = RollbackRequest,
    responses((status = 200, description = "OK or CANCELLED", body = CallResponse)))]
pub async fn rollback(
    State(state): State<AppState>,
    Presenting(who): Presenting,
    ApiPath(pid): ApiPath<String>,
    ApiJson(req): ApiJson<RollbackRequest>,
) -> Result<Json<CallResponse>, ApiError> {
    Ok(Json(state.exchange().rollback(&who, &pid, req).await?))
}

/// API_6, `POST /v1/processes/{pid}/abort`.
#[utoipa::path(post, path = "/v1/processes/{pid}/abort", tag = "processes",
    params(("pid" = String, Path, description = "Process id")),
    request_body = AbortRequest,
    responses((status = 200, description = "OK or CANCELLED", body = CallResponse)))]
pub async fn abort(
    State(state): State<AppState>,
    Presenting(who): Presenting,
    ApiPath(pid): ApiPath<String>,
    ApiJson(req): ApiJson<AbortRequest>,
) -> Result<Json<CallResponse>, ApiError> {
    Ok(Json(state.exchange().abort(&who, &pid, req).await?))
}

/// `GET /v1/processes/{pid}`: the process's state.
#[utoipa::path(get, path = "/v1/processes/{pid}", tag = "processes",
    params(("pid" = String, Path, description = "Process id")),
    responses(
        (status = 200, description = "The process's state", body = ProcessStatus),
        (status = 404, description = "A process id the server never issued", body = ErrorBody)))]
pub async fn status(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(pid): ApiPath<String>,
) -> Result<Json<ProcessStatus>, ApiError> {
    Ok(Json(state.exchange().process_status(&who, &pid).await?))
}
