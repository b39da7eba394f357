//! Administration (admin token): tenancy provisioning and inspection.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use estafeta_exchange::wire::{
    CreateDatabase, CreateDevice, CreateEnterprise, CreateSubsystem, Credentials, ErrorBody,
    FolderListing, ProcessList, Stats, Version,
};

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, Caller, path_folder, path_id};
use crate::state::AppState;

/// `POST /v1/admin/enterprises`.
#[utoipa::path(post, path = "/v1/admin/enterprises", tag = "admin",
    request_body = CreateEnterprise,
    responses(
        (status = 201, description = "Created", body = CreateEnterprise),
        (status = 409, description = "It exists", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_enterprise(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiJson(req): ApiJson<CreateEnterprise>,
) -> Result<(StatusCode, Json<CreateEnterprise>), ApiError> {
    state
        .exchange()
        .create_enterprise(&who, req.id.clone())
        .await?;
    Ok((StatusCode::CREATED, Json(req)))
}

/// `POST /v1/admin/enterprises/{ent}/subsystems`.
#[utoipa::path(post, path = "/v1/admin/enterprises/{ent}/subsystems", tag = "admin",
    params(("ent" = String, Path, description = "Enterprise id")),
    request_body = CreateSubsystem,
    responses(
        (status = 201, description = "Created", body = CreateSubsystem),
        (status = 404, description = "No such enterprise", body = ErrorBody),
        (status = 409, description = "It exists", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_subsystem(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(ent): ApiPath<String>,
    ApiJson(req): ApiJson<CreateSubsystem>,
) -> Result<(StatusCode, Json<CreateSubsystem>), ApiError> {
    let ent = path_id("enterprise", &ent)?;
    state
        .exchange()
        .create_subsystem(&who, ent, req.id.clone())
        .await?;
    Ok((StatusCode::CREATED, Json(req)))
}

/// `POST /v1/admin/enterprises/{ent}/databases`: the token, shown once.
#[utoipa::path(post, path = "/v1/admin/enterprises/{ent}/databases", tag = "admin",
    params(("ent" = String, Path, description = "Enterprise id")),
    request_body = CreateDatabase,
    responses(
        (status = 201, description = "Created; the token is shown only now", body = Credentials),
        (status = 404, description = "No such enterprise", body = ErrorBody),
        (status = 409, description = "The id is taken by a database or device", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_database(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(ent): ApiPath<String>,
    ApiJson(req): ApiJson<CreateDatabase>,
) -> Result<(StatusCode, Json<Credentials>), ApiError> {
    let ent = path_id("enterprise", &ent)?;
    let token = state
        .exchange()
        .create_database(&who, ent, req.id.clone())
        .await?;
    let body = Credentials {
        version: Version,
        id: req.id,
        token: token.expose().to_owned(),
    };
    Ok((StatusCode::CREATED, Json(body)))
}

/// `POST /v1/admin/enterprises/{ent}/devices`: the token, shown once.
#[utoipa::path(post, path = "/v1/admin/enterprises/{ent}/devices", tag = "admin",
    params(("ent" = String, Path, description = "Enterprise id")),
    request_body = CreateDevice,
    responses(
        (status = 201, description = "Created; the token is shown only now", body = Credentials),
        (status = 404, description = "No such enterprise or subsystem", body = ErrorBody),
        (status = 409, description = "The id is taken by a database or device", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_device(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(ent): ApiPath<String>,
    ApiJson(req): ApiJson<CreateDevice>,
) -> Result<(StatusCode, Json<Credentials>), ApiError> {
    let ent = path_id("enterprise", &ent)?;
    let token = state
        .exchange()
        .create_device(&who, ent, req.id.clone(), req.subsystem)
        .await?;
    let body = Credentials {
        version: Version,
        id: req.id,
        token: token.expose().to_owned(),
    };
    Ok((StatusCode::CREATED, Json(body)))
}

/// `GET /v1/admin/processes`.
#[utoipa::path(get, path = "/v1/admin/processes", tag = "admin",
    responses((status = 200, description = "Current and recently ended processes", body = ProcessList)),
    security(("bearer" = [])))]
pub async fn processes(
    State(state): State<AppState>,
    Caller(who): Caller,
) -> Result<Json<ProcessList>, ApiError> {
    Ok(Json(state.exchange().processes(&who).await?))
}

/// `GET /v1/admin/stats`.
#[utoipa::path(get, path = "/v1/admin/stats", tag = "admin",
    responses((status = 200, description = "Counters per database and per device", body = Stats)),
    security(("bearer" = [])))]
pub async fn stats(
    State(state): State<AppState>,
    Caller(who): Caller,
) -> Result<Json<Stats>, ApiError> {
    Ok(Json(state.exchange().stats(&who).await?))
}

/// `GET /v1/admin/databases/{db}/folders/{folder}`.
#[utoipa::path(get, path = "/v1/admin/databases/{db}/folders/{folder}", tag = "admin",
    params(
        ("db" = String, Path, description = "Database (or device) id: the mailbox"),
        ("folder" = String, Path, description = "Messages, Prepared, Log, Unknown or Error")),
    responses(
        (status = 200, description = "The files of the folder, oldest first", body = FolderListing),
        (status = 404, description = "No such mailbox", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn folder(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath((db, folder)): ApiPath<(String, String)>,
) -> Result<Json<FolderListing>, ApiError> {
    let db = path_id("database", &db)?;
    let folder = path_folder(&folder)?;
    Ok(Json(state.exchange().folder(&who, db, folder).await?))
}
