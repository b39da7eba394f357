//! Administration (admin token): tenancy provisioning, listing, showing
//! and deleting, token rotation, inspection, the operator's actions on
//! processes in doubt and on `Unknown` and `Error`, and the webhooks that
//! arrivals are pushed to.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use estafeta_exchange::tenancy::{Endpoint, Kind, Principal};
use estafeta_exchange::token::Token;
use estafeta_exchange::wire::{
    AdminCredentials, AlertEntry, AlertList, CallResponse, CreateDatabase, CreateDevice,
    CreateEnterprise, CreateSubsystem, Credentials, DatabaseList, Deleted, DeviceList,
    EndpointDetail, EndpointInfo, EnterpriseDetail, EnterpriseInfo, EnterpriseList, ErrorBody,
    ErrorCode, FolderListing, HandAction, HandSettled, ProcessList, SettleRequest, Settlement,
    Stats, SubsystemList, Version, Webhook,
};
use estafeta_exchange::{Id, MessageId, RecipientKind};
use serde::Deserialize;

use crate::backup::{BackupReport, BackupRequest};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery, Caller, path_folder, path_id};
use crate::state::AppState;

/// `POST /v1/admin/enterprises`.
#[utoipa::path(post, path = "/v1/admin/enterprises", tag = "admin",
    request_body = CreateEnterprise,
    responses(
        (status = 201, description = "Created", body = CreateEnterprise),
        (status = 409, description = "It exists", body = ErrorBody)))]
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
        (status = 409, description = "It exists", body = ErrorBody)))]
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

/// The body that shows a database's or device's new token, the only time
/// it is shown: on creation and on rotation.
fn credentials(id: Id, token: &Token) -> Json<Credentials> {
    Json(Credentials {
        version: Version,
        id,
        token: token.expose().to_owned(),
    })
}

/// `POST /v1/admin/enterprises/{ent}/databases`: the token, shown once.
#[utoipa::path(post, path = "/v1/admin/enterprises/{ent}/databases", tag = "admin",
    params(("ent" = String, Path, description = "Enterprise id")),
    request_body = CreateDatabase,
    responses(
        (status = 201, description = "Created; the token is shown only now", body = Credentials),
        (status = 404, description = "No such enterprise", body = ErrorBody),
        (status = 409, description = "The id is taken by a database or device", body = ErrorBody)))]
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
    Ok((StatusCode::CREATED, credentials(req.id, &token)))
}

/// `POST /v1/admin/enterprises/{ent}/devices`: the token, shown once.
#[utoipa::path(post, path = "/v1/admin/enterprises/{ent}/devices", tag = "admin",
    params(("ent" = String, Path, description = "Enterprise id")),
    request_body = CreateDevice,
    responses(
        (status = 201, description = "Created; the token is shown only now", body = Credentials),
        (status = 404, description = "No such enterprise or subsystem", body = ErrorBody),
        (status = 409, description = "The id is taken by a database or device", body = ErrorBody)))]
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
    Ok((StatusCode::CREATED, credentials(req.id, &token)))
}

/// `GET /v1/admin/processes`.
#[utoipa::path(get, path = "/v1/admin/processes", tag = "admin",
    responses((status = 200, description = "Current and recently ended processes", body = ProcessList)))]
pub async fn processes(
    State(state): State<AppState>,
    Caller(who): Caller,
) -> Result<Json<ProcessList>, ApiError> {
    Ok(Json(state.exchange().processes(&who).await?))
}

/// `GET /v1/admin/stats`.
#[utoipa::path(get, path = "/v1/admin/stats", tag = "admin",
    responses((status = 200, description = "Counters per database and per device", body = Stats)))]
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
        (status = 404, description = "No such mailbox", body = ErrorBody)))]
pub async fn folder(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath((db, folder)): ApiPath<(String, String)>,
) -> Result<Json<FolderListing>, ApiError> {
    let db = path_id("database", &db)?;
    let folder = path_folder(&folder)?;
    let mut listing = state.exchange().folder(&who, db.clone(), folder).await?;
    if folder == estafeta_exchange::mailbox::Folder::Error {
        let reasons = state.exchange().error_reasons(&who, &db).await?;
        for file in &mut listing.files {
            if let Some((code, text)) = reasons.get(&file.id) {
                file.error_code = *code;
                file.error_text.clone_from(text);
            }
        }
    }
    Ok(Json(listing))
}

/// The most entries one page of a list holds, and the default.
const PAGE_MAX: usize = 1000;
const PAGE_DEFAULT: usize = 100;

/// `?limit=&after=` (and, for databases and devices, `&enterprise=`).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct Page {
    /// How many entries at most (1–1000, default 100).
    limit: Option<usize>,
    /// Start after this id (the previous page's `next_after`).
    #[param(value_type = Option<String>)]
    after: Option<Id>,
    /// Only those of this enterprise (databases and devices).
    #[param(value_type = Option<String>)]
    enterprise: Option<Id>,
}

impl Page {
    fn limit(&self) -> Result<usize, ApiError> {
        match self.limit {
            None => Ok(PAGE_DEFAULT),
            Some(n @ 1..=PAGE_MAX) => Ok(n),
            Some(n) => Err(ApiError::bad_request(
                ErrorCode::BadLimit,
                format!("limit must be 1 to {PAGE_MAX}, got {n}"),
            )),
        }
    }
}

/// Splits one entry past the page off: the page and the cursor of the next.
fn paged<T>(mut items: Vec<T>, limit: usize, id: impl Fn(&T) -> &Id) -> (Vec<T>, Option<Id>) {
    if items.len() > limit {
        items.truncate(limit);
        let next = items.last().map(|t| id(t).clone());
        (items, next)
    } else {
        (items, None)
    }
}

/// `GET /v1/admin/enterprises`: one page, sorted by id.
#[utoipa::path(get, path = "/v1/admin/enterprises", tag = "admin",
    params(Page),
    responses(
        (status = 200, description = "One page of enterprises; next_after is absent on the last", body = EnterpriseList),
        (status = 400, description = "Bad limit (bad_limit) or after (bad_request)", body = ErrorBody)))]
pub async fn list_enterprises(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<EnterpriseList>, ApiError> {
    let limit = page.limit()?;
    let items = state
        .exchange()
        .enterprises_page(&who, page.after.as_ref(), limit + 1)?;
    let (items, next_after) = paged(items, limit, |(id, _)| id);
    Ok(Json(EnterpriseList {
        version: Version,
        enterprises: items
            .into_iter()
            .map(|(id, subsystems)| EnterpriseInfo { id, subsystems })
            .collect(),
        next_after,
    }))
}

/// `GET /v1/admin/enterprises/{ent}`.
#[utoipa::path(get, path = "/v1/admin/enterprises/{ent}", tag = "admin",
    params(("ent" = String, Path, description = "Enterprise id")),
    responses(
        (status = 200, description = "The enterprise, its subsystems, and how many databases and devices it has", body = EnterpriseDetail),
        (status = 404, description = "No such enterprise", body = ErrorBody)))]
pub async fn show_enterprise(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(ent): ApiPath<String>,
) -> Result<Json<EnterpriseDetail>, ApiError> {
    let ent = path_id("enterprise", &ent)?;
    Ok(Json(state.exchange().enterprise(&who, &ent)?))
}

/// `DELETE /v1/admin/enterprises/{ent}`.
#[utoipa::path(delete, path = "/v1/admin/enterprises/{ent}", tag = "admin",
    params(("ent" = String, Path, description = "Enterprise id")),
    responses(
        (status = 200, description = "Deleted", body = CreateEnterprise),
        (status = 404, description = "No such enterprise", body = ErrorBody),
        (status = 409, description = "It still has subsystems, databases or devices (in_use)", body = ErrorBody)))]
pub async fn delete_enterprise(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(ent): ApiPath<String>,
) -> Result<Json<CreateEnterprise>, ApiError> {
    let id = path_id("enterprise", &ent)?;
    state.exchange().delete_enterprise(&who, id.clone()).await?;
    Ok(Json(CreateEnterprise {
        version: Version,
        id,
    }))
}

/// `GET /v1/admin/enterprises/{ent}/subsystems`: all of them (an
/// enterprise has few).
#[utoipa::path(get, path = "/v1/admin/enterprises/{ent}/subsystems", tag = "admin",
    params(("ent" = String, Path, description = "Enterprise id")),
    responses(
        (status = 200, description = "The subsystems, sorted", body = SubsystemList),
        (status = 404, description = "No such enterprise", body = ErrorBody)))]
pub async fn list_subsystems(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(ent): ApiPath<String>,
) -> Result<Json<SubsystemList>, ApiError> {
    let ent = path_id("enterprise", &ent)?;
    let detail = state.exchange().enterprise(&who, &ent)?;
    Ok(Json(SubsystemList {
        version: Version,
        enterprise: detail.id,
        subsystems: detail.subsystems,
    }))
}

/// `DELETE /v1/admin/enterprises/{ent}/subsystems/{sub}`.
#[utoipa::path(delete, path = "/v1/admin/enterprises/{ent}/subsystems/{sub}", tag = "admin",
    params(
        ("ent" = String, Path, description = "Enterprise id"),
        ("sub" = String, Path, description = "Subsystem id")),
    responses(
        (status = 200, description = "Deleted", body = CreateSubsystem),
        (status = 404, description = "No such enterprise or subsystem", body = ErrorBody),
        (status = 409, description = "Devices run it (in_use)", body = ErrorBody)))]
pub async fn delete_subsystem(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath((ent, sub)): ApiPath<(String, String)>,
) -> Result<Json<CreateSubsystem>, ApiError> {
    let ent = path_id("enterprise", &ent)?;
    let id = path_id("subsystem", &sub)?;
    state
        .exchange()
        .delete_subsystem(&who, ent, id.clone())
        .await?;
    Ok(Json(CreateSubsystem {
        version: Version,
        id,
    }))
}

fn endpoint_info(e: Endpoint) -> EndpointInfo {
    EndpointInfo {
        subsystem: e.role.subsystem().cloned(),
        id: e.id,
        enterprise: e.enterprise,
    }
}

/// One page of databases or devices, and the next page's cursor.
fn endpoints(
    state: &AppState,
    who: &Principal,
    kind: Kind,
    page: &Page,
) -> Result<(Vec<EndpointInfo>, Option<Id>), ApiError> {
    let limit = page.limit()?;
    let items = state.exchange().endpoints_page(
        who,
        kind,
        page.enterprise.as_ref(),
        page.after.as_ref(),
        limit + 1,
    )?;
    let (items, next) = paged(items, limit, |e| &e.id);
    Ok((items.into_iter().map(endpoint_info).collect(), next))
}

/// `GET /v1/admin/databases`: one page, sorted by id.
#[utoipa::path(get, path = "/v1/admin/databases", tag = "admin",
    params(Page),
    responses(
        (status = 200, description = "One page of databases; next_after is absent on the last", body = DatabaseList),
        (status = 400, description = "Bad limit (bad_limit), after or enterprise (bad_request)", body = ErrorBody)))]
pub async fn list_databases(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<DatabaseList>, ApiError> {
    let (databases, next_after) = endpoints(&state, &who, Kind::Database, &page)?;
    Ok(Json(DatabaseList {
        version: Version,
        databases,
        next_after,
    }))
}

/// `GET /v1/admin/devices`: one page, sorted by id.
#[utoipa::path(get, path = "/v1/admin/devices", tag = "admin",
    params(Page),
    responses(
        (status = 200, description = "One page of devices; next_after is absent on the last", body = DeviceList),
        (status = 400, description = "Bad limit (bad_limit), after or enterprise (bad_request)", body = ErrorBody)))]
pub async fn list_devices(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<DeviceList>, ApiError> {
    let (devices, next_after) = endpoints(&state, &who, Kind::Device, &page)?;
    Ok(Json(DeviceList {
        version: Version,
        devices,
        next_after,
    }))
}

/// `GET /v1/admin/databases/{db}`.
#[utoipa::path(get, path = "/v1/admin/databases/{db}", tag = "admin",
    params(("db" = String, Path, description = "Database id")),
    responses(
        (status = 200, description = "The database, its folders' file counts and open processes", body = EndpointDetail),
        (status = 404, description = "No such database", body = ErrorBody)))]
pub async fn show_database(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(db): ApiPath<String>,
) -> Result<Json<EndpointDetail>, ApiError> {
    let id = path_id("database", &db)?;
    let detail = state.exchange().endpoint_detail(&who, Kind::Database, &id);
    Ok(Json(detail.await?))
}

/// `GET /v1/admin/devices/{dev}`.
#[utoipa::path(get, path = "/v1/admin/devices/{dev}", tag = "admin",
    params(("dev" = String, Path, description = "Device id")),
    responses(
        (status = 200, description = "The device and its inbox's folders' file counts", body = EndpointDetail),
        (status = 404, description = "No such device", body = ErrorBody)))]
pub async fn show_device(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(dev): ApiPath<String>,
) -> Result<Json<EndpointDetail>, ApiError> {
    let id = path_id("device", &dev)?;
    let detail = state.exchange().endpoint_detail(&who, Kind::Device, &id);
    Ok(Json(detail.await?))
}

/// `?force=true`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct Force {
    /// Delete even while messages wait or a process is open: the live
    /// process is aborted, those in doubt are rolled back, every message
    /// of the mailbox is discarded.
    #[serde(default)]
    force: bool,
}

/// `DELETE /v1/admin/databases/{db}`.
#[utoipa::path(delete, path = "/v1/admin/databases/{db}", tag = "admin",
    params(("db" = String, Path, description = "Database id"), Force),
    responses(
        (status = 200, description = "Deleted: its token no longer works, its mailbox is gone", body = Deleted),
        (status = 404, description = "No such database", body = ErrorBody),
        (status = 409, description = "Messages wait (besides Log) or a process is open, and force was not given (not_empty)", body = ErrorBody)))]
pub async fn delete_database(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(db): ApiPath<String>,
    ApiQuery(force): ApiQuery<Force>,
) -> Result<Json<Deleted>, ApiError> {
    let id = path_id("database", &db)?;
    let deleted = state
        .exchange()
        .delete_endpoint(&who, Kind::Database, id, force.force);
    Ok(Json(deleted.await?))
}

/// `DELETE /v1/admin/devices/{dev}`.
#[utoipa::path(delete, path = "/v1/admin/devices/{dev}", tag = "admin",
    params(("dev" = String, Path, description = "Device id"), Force),
    responses(
        (status = 200, description = "Deleted: its token no longer works, its inbox is gone", body = Deleted),
        (status = 404, description = "No such device", body = ErrorBody),
        (status = 409, description = "Replies wait in its inbox, and force was not given (not_empty)", body = ErrorBody)))]
pub async fn delete_device(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(dev): ApiPath<String>,
    ApiQuery(force): ApiQuery<Force>,
) -> Result<Json<Deleted>, ApiError> {
    let id = path_id("device", &dev)?;
    let deleted = state
        .exchange()
        .delete_endpoint(&who, Kind::Device, id, force.force);
    Ok(Json(deleted.await?))
}

/// A new token for a database or device, shown once.
async fn rotate(
    state: &AppState,
    who: &Principal,
    kind: Kind,
    id: &str,
) -> Result<Json<Credentials>, ApiError> {
    let id = path_id(kind.as_str(), id)?;
    let token = state.exchange().rotate_token(who, kind, id.clone()).await?;
    Ok(credentials(id, &token))
}

/// `POST /v1/admin/databases/{db}/token`: a new token; the old one stops
/// working at once.
#[utoipa::path(post, path = "/v1/admin/databases/{db}/token", tag = "admin",
    params(("db" = String, Path, description = "Database id")),
    responses(
        (status = 200, description = "The new token, shown only now", body = Credentials),
        (status = 404, description = "No such database", body = ErrorBody)))]
pub async fn rotate_database_token(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(db): ApiPath<String>,
) -> Result<Json<Credentials>, ApiError> {
    rotate(&state, &who, Kind::Database, &db).await
}

/// `POST /v1/admin/devices/{dev}/token`: a new token; the old one stops
/// working at once.
#[utoipa::path(post, path = "/v1/admin/devices/{dev}/token", tag = "admin",
    params(("dev" = String, Path, description = "Device id")),
    responses(
        (status = 200, description = "The new token, shown only now", body = Credentials),
        (status = 404, description = "No such device", body = ErrorBody)))]
pub async fn rotate_device_token(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(dev): ApiPath<String>,
) -> Result<Json<Credentials>, ApiError> {
    rotate(&state, &who, Kind::Device, &dev).await
}

/// `POST /v1/admin/token`: a new admin token, without a restart.
#[utoipa::path(post, path = "/v1/admin/token", tag = "admin",
    responses(
        (status = 200, description = "The new admin token, shown only now; it replaces the saved one and the old one stops working at once", body = AdminCredentials),
        (status = 409, description = "ESTAFETA_ADMIN_TOKEN pins the admin token: change it there and restart (admin_token_pinned)", body = ErrorBody)))]
pub async fn rotate_admin_token(
    State(state): State<AppState>,
    Caller(who): Caller,
) -> Result<Json<AdminCredentials>, ApiError> {
    let token = state.exchange().rotate_admin_token(&who).await?;
    Ok(Json(AdminCredentials {
        version: Version,
        token: token.expose().to_owned(),
    }))
}

/// `POST /v1/admin/processes/{pid}/settle`: settle a process in doubt.
#[utoipa::path(post, path = "/v1/admin/processes/{pid}/settle", tag = "admin",
    params(("pid" = String, Path, description = "Process id")),
    request_body = SettleRequest,
    responses(
        (status = 200, description = "Settled as a late commit or rollback of its processor would (status OK, or FAILED when files could not be moved yet)", body = CallResponse),
        (status = 422, description = "The process is not in doubt (not_in_doubt)", body = ErrorBody)))]
pub async fn settle(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(pid): ApiPath<String>,
    ApiJson(req): ApiJson<SettleRequest>,
) -> Result<Json<CallResponse>, ApiError> {
    let commit = req.outcome == Settlement::Commit;
    Ok(Json(state.exchange().settle(&who, &pid, commit).await?))
}

/// A message of `Unknown` or `Error` from path segments.
fn message_path(
    db: &str,
    folder: &str,
    id: &str,
) -> Result<(Id, estafeta_exchange::mailbox::Folder, MessageId), ApiError> {
    let db = path_id("database", db)?;
    let folder = path_folder(folder)?;
    let id = id.parse().map_err(|e| {
        ApiError::bad_request(ErrorCode::BadId, format!("bad message id {id:?}: {e}"))
    })?;
    Ok((db, folder, id))
}

/// `GET /v1/admin/databases/{db}/folders/{folder}/{id}`: one message of
/// `Unknown` or `Error`.
#[utoipa::path(get, path = "/v1/admin/databases/{db}/folders/{folder}/{id}", tag = "admin",
    params(
        ("db" = String, Path, description = "Database (or device) id: the mailbox"),
        ("folder" = String, Path, description = "Unknown or Error"),
        ("id" = String, Path, description = "Message id")),
    responses(
        (status = 200, description = "The message as stored", body = estafeta_exchange::wire::Message),
        (status = 404, description = "No such message there", body = ErrorBody)))]
pub async fn show_message(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath((db, folder, id)): ApiPath<(String, String, String)>,
) -> Result<axum::response::Response, ApiError> {
    let (db, folder, id) = message_path(&db, &folder, &id)?;
    let bytes = state.exchange().read_message(&who, &db, folder, id).await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        bytes,
    )
        .into_response())
}

/// Requeue or discard a message of `Unknown` or `Error`.
async fn hand_settle(
    state: &AppState,
    who: &Principal,
    (db, folder, id): (String, String, String),
    action: HandAction,
) -> Result<Json<HandSettled>, ApiError> {
    let (db, folder, id) = message_path(&db, &folder, &id)?;
    match action {
        HandAction::Requeued => state.exchange().requeue(who, &db, folder, id).await?,
        HandAction::Discarded => state.exchange().discard(who, &db, folder, id).await?,
    }
    Ok(Json(HandSettled {
        version: Version,
        id,
        folder,
        action,
    }))
}

/// `POST /v1/admin/databases/{db}/folders/{folder}/{id}/requeue`: move a
/// message of `Unknown` or `Error` into its recipient's `Messages`.
#[utoipa::path(post, path = "/v1/admin/databases/{db}/folders/{folder}/{id}/requeue", tag = "admin",
    params(
        ("db" = String, Path, description = "Database (or device) id: the mailbox"),
        ("folder" = String, Path, description = "Unknown or Error"),
        ("id" = String, Path, description = "Message id")),
    responses(
        (status = 200, description = "Requeued", body = HandSettled),
        (status = 400, description = "Not Unknown or Error (bad_folder)", body = ErrorBody),
        (status = 404, description = "No such message there", body = ErrorBody),
        (status = 422, description = "A process in doubt holds it: settle the process (held_by_process)", body = ErrorBody)))]
pub async fn requeue(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(path): ApiPath<(String, String, String)>,
) -> Result<Json<HandSettled>, ApiError> {
    hand_settle(&state, &who, path, HandAction::Requeued).await
}

/// `POST /v1/admin/databases/{db}/folders/{folder}/{id}/discard`: delete a
/// message of `Unknown` or `Error` for good.
#[utoipa::path(post, path = "/v1/admin/databases/{db}/folders/{folder}/{id}/discard", tag = "admin",
    params(
        ("db" = String, Path, description = "Database (or device) id: the mailbox"),
        ("folder" = String, Path, description = "Unknown or Error"),
        ("id" = String, Path, description = "Message id")),
    responses(
        (status = 200, description = "Discarded", body = HandSettled),
        (status = 400, description = "Not Unknown or Error (bad_folder)", body = ErrorBody),
        (status = 404, description = "No such message there", body = ErrorBody),
        (status = 422, description = "A process in doubt holds it: settle the process (held_by_process)", body = ErrorBody)))]
pub async fn discard(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiPath(path): ApiPath<(String, String, String)>,
) -> Result<Json<HandSettled>, ApiError> {
    hand_settle(&state, &who, path, HandAction::Discarded).await
}

/// Sets or clears a recipient's webhook; the stored value.
async fn webhook(
    state: &AppState,
    who: &Principal,
    kind: RecipientKind,
    id: &str,
    url: Option<String>,
) -> Result<Json<Webhook>, ApiError> {
    let id = path_id(kind.as_str(), id)?;
    // A target the pushes would refuse is not stored (nor ever probed).
    let private = state.notifier().settings().webhook_private;
    if *who == Principal::Admin
        && let Some(url) = &url
        && let Some(why) = crate::notify::targets::refused(url, private).await
    {
        return Err(ApiError::bad_request(ErrorCode::BadWebhookUrl, why));
    }
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
        (status = 400, description = "Not an http(s) URL with a host, or a host refused by webhook_private (bad_webhook_url)", body = ErrorBody),
        (status = 404, description = "No such database", body = ErrorBody)))]
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
        (status = 404, description = "No such database", body = ErrorBody)))]
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
        (status = 400, description = "Not an http(s) URL with a host, or a host refused by webhook_private (bad_webhook_url)", body = ErrorBody),
        (status = 404, description = "No such device", body = ErrorBody)))]
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
        (status = 404, description = "No such device", body = ErrorBody)))]
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
        (status = 503, description = "The alert store is not open (yet) or failed", body = ErrorBody)))]
pub async fn alerts(
    State(state): State<AppState>,
    Caller(who): Caller,
) -> Result<Json<AlertList>, ApiError> {
    if who != Principal::Admin {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            "this call needs the admin token",
        ));
    }
    let unavailable =
        |m: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::StorageError, m);
    let records = state
        .notifier()
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

/// `POST /v1/admin/backup`: a consistent copy of the data folder, made
/// while serving (`estafeta backup DIR`).
#[utoipa::path(post, path = "/v1/admin/backup", tag = "admin",
    request_body = BackupRequest,
    responses(
        (status = 200, description = "The copy is made and durable", body = BackupReport),
        (status = 400, description = "The folder is relative, inside the data folder, or cannot be written", body = ErrorBody),
        (status = 409, description = "The folder exists and is not empty", body = ErrorBody)))]
pub async fn backup(
    State(state): State<AppState>,
    Caller(who): Caller,
    ApiJson(req): ApiJson<BackupRequest>,
) -> Result<Json<BackupReport>, ApiError> {
    Ok(Json(
        crate::backup::backup(state.exchange(), state.events(), &who, &req.dir).await?,
    ))
}
