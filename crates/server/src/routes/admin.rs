//! Administration (admin token): tenancy provisioning and inspection, and
//! the webhooks that arrivals are pushed to.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use estafeta_exchange::RecipientKind;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::{
    AlertEntry, AlertList, CreateDatabase, CreateDevice, CreateEnterprise, CreateSubsystem,
    Credentials, ErrorBody, FolderListing, ProcessList, Stats, Version, Webhook,
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

/// Sets or clears a recipient's webhook; the stored value.
async fn webhook(
    state: &AppState,
    who: &estafeta_exchange::tenancy::Principal,
    kind: RecipientKind,
    id: &str,
    url: Option<String>,
) -> Result<Json<Webhook>, ApiError> {
    let id = path_id(kind.as_str(), id)?;
    let url = state.exchange().set_webhook(who, kind, id, url).await?;
    Ok(Json(Webhook {
        version: Version,
        url,
    }))
}

/// `PUT /v1/admin/databases/{db}/webhook`: where arrivals are pushed.
#[utoipa::path(put, path = "/v1/admin/databases/{db}/webhook", tag = "admin",
    params(("db" = String, Path, description = "Database id")),
    request_body(content = Webhook, description = "An http(s) URL, or null to clear it. When a message \
        enters the database's Messages, Estafeta POSTs {\"version\":1,\"event\":\"messages_waiting\",\
        \"recipient\",\"kind\",\"at\"} there (no message body); bursts coalesce, failures are retried."),
    responses(
        (status = 200, description = "The stored value", body = Webhook),
        (status = 400, description = "Not an http(s) URL with a host (bad_webhook_url)", body = ErrorBody),
        (status = 404, description = "No such database", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn set_database_webhook(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(db): ApiPath<String>,
    ApiJson(req): ApiJson<Webhook>,
) -> Result<Json<Webhook>, ApiError> {
    webhook(&state, &who, RecipientKind::Database, &db, req.url).await
}

/// `DELETE /v1/admin/databases/{db}/webhook`: no more pushes.
#[utoipa::path(delete, path = "/v1/admin/databases/{db}/webhook", tag = "admin",
    params(("db" = String, Path, description = "Database id")),
    responses(
        (status = 200, description = "Cleared (url is null)", body = Webhook),
        (status = 404, description = "No such database", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn clear_database_webhook(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(db): ApiPath<String>,
) -> Result<Json<Webhook>, ApiError> {
    webhook(&state, &who, RecipientKind::Database, &db, None).await
}

/// `PUT /v1/admin/devices/{dev}/webhook`: where replies are pushed.
#[utoipa::path(put, path = "/v1/admin/devices/{dev}/webhook", tag = "admin",
    params(("dev" = String, Path, description = "Device id")),
    request_body(content = Webhook, description = "An http(s) URL, or null to clear it. When a reply \
        enters the device's inbox, Estafeta POSTs {\"version\":1,\"event\":\"messages_waiting\",\
        \"recipient\",\"kind\",\"at\"} there (no message body); bursts coalesce, failures are retried."),
    responses(
        (status = 200, description = "The stored value", body = Webhook),
        (status = 400, description = "Not an http(s) URL with a host (bad_webhook_url)", body = ErrorBody),
        (status = 404, description = "No such device", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn set_device_webhook(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(dev): ApiPath<String>,
    ApiJson(req): ApiJson<Webhook>,
) -> Result<Json<Webhook>, ApiError> {
    webhook(&state, &who, RecipientKind::Device, &dev, req.url).await
}

/// `DELETE /v1/admin/devices/{dev}/webhook`: no more pushes.
#[utoipa::path(delete, path = "/v1/admin/devices/{dev}/webhook", tag = "admin",
    params(("dev" = String, Path, description = "Device id")),
    responses(
        (status = 200, description = "Cleared (url is null)", body = Webhook),
        (status = 404, description = "No such device", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn clear_device_webhook(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(dev): ApiPath<String>,
) -> Result<Json<Webhook>, ApiError> {
    webhook(&state, &who, RecipientKind::Device, &dev, None).await
}

/// The most alerts `GET /v1/admin/alerts` lists.
const ALERTS_LISTED: usize = 10_000;

/// `GET /v1/admin/alerts`: the alerts raised (the dashboard's list, for
/// scripts and monitoring), newest first.
#[utoipa::path(get, path = "/v1/admin/alerts", tag = "admin",
    responses(
        (status = 200, description = "The alerts, newest first (at most 10,000)", body = AlertList),
        (status = 503, description = "The alert store is not open (yet) or failed", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn alerts(
    State(state): State<AppState>,
    Caller(who): Caller,
) -> Result<Json<AlertList>, ApiError> {
    if who != Principal::Admin {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this call needs the admin token",
        ));
    }
    let unavailable =
        |m: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "storage_error", m);
    let notifier = state
        .notifier()
        .ok_or_else(|| unavailable("the alert store is not open yet".to_owned()))?;
    let records = notifier
        .alerts(ALERTS_LISTED)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let alerts = records
        .into_iter()
        .map(|r| AlertEntry {
            id: r.id,
            kind: r.alert.kind.to_string(),
            key: r.alert.key,
            text: r.alert.text,
            raised_at: r.alert.raised_at,
            ended_at: r.ended_at,
            acknowledged_at: r.acked_at,
        })
        .collect();
    Ok(Json(AlertList {
        version: Version,
        alerts,
    }))
}
