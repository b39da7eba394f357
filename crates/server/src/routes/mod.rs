//! The HTTP handlers, one module per group of the HTTP API: operations, the
//! administration calls, the device calls and the processor calls. Each
//! handler authenticates, parses its path and body into domain types, calls
//! one method of the exchange and turns its answer into HTTP.
//!
//! [`api`] registers every handler once, by its `#[utoipa::path]`
//! annotation: the same registration routes requests and describes them in
//! the OpenAPI document.

pub mod admin;
pub mod device;
pub mod ops;
pub mod process;

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::state::AppState;

/// Every route of the API, each with its OpenAPI operation (one
/// `routes!` per path, listing the handlers of its methods).
pub fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(admin::create_enterprise, admin::list_enterprises))
        .routes(routes!(admin::show_enterprise, admin::delete_enterprise))
        .routes(routes!(admin::create_subsystem, admin::list_subsystems))
        .routes(routes!(admin::delete_subsystem))
        .routes(routes!(admin::create_database))
        .routes(routes!(admin::create_device))
        .routes(routes!(admin::list_databases))
        .routes(routes!(admin::show_database, admin::delete_database))
        .routes(routes!(admin::rotate_database_token))
        .routes(routes!(
            admin::set_database_webhook,
            admin::clear_database_webhook
        ))
        .routes(routes!(admin::folder))
        .routes(routes!(admin::show_message))
        .routes(routes!(admin::requeue))
        .routes(routes!(admin::discard))
        .routes(routes!(admin::list_devices))
        .routes(routes!(admin::show_device, admin::delete_device))
        .routes(routes!(admin::rotate_device_token))
        .routes(routes!(
            admin::set_device_webhook,
            admin::clear_device_webhook
        ))
        .routes(routes!(admin::rotate_admin_token))
        .routes(routes!(admin::processes))
        .routes(routes!(admin::settle))
        .routes(routes!(admin::stats))
        .routes(routes!(admin::alerts))
        .routes(routes!(admin::backup))
        .routes(routes!(device::send_message))
        .routes(routes!(device::inbox))
        .routes(routes!(device::ack))
        .routes(routes!(process::start))
        .routes(routes!(process::status))
        .routes(routes!(process::accept))
        .routes(routes!(process::prepare))
        .routes(routes!(process::commit))
        .routes(routes!(process::rollback))
        .routes(routes!(process::abort))
}

/// An answer whose body the exchange assembled as JSON bytes already.
pub(crate) fn raw_json(bytes: Vec<u8>) -> Response {
    ([(CONTENT_TYPE, "application/json")], bytes).into_response()
}
