//! [`app`]: the router of every route of API.md and of the dashboard,
//! with the body limits, the request counters, and the request ids and
//! spans.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::{delete, get, post, put};

use crate::body_limit::limit_bodies;
use crate::dashboard;
use crate::error::ApiError;
use crate::metrics;
use crate::routes::{admin, device, ops, process};
use crate::state::AppState;
use crate::trace::traced;

/// The server's router.
pub fn app(state: AppState) -> Router {
    let max_body = state.http().max_body_bytes;
    let router = Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/v1/openapi.json", get(ops::openapi))
        .route(
            "/v1/admin/enterprises",
            post(admin::create_enterprise).get(admin::list_enterprises),
        )
        .route(
            "/v1/admin/enterprises/{ent}",
            get(admin::show_enterprise).delete(admin::delete_enterprise),
        )
        .route(
            "/v1/admin/enterprises/{ent}/subsystems/{sub}",
            delete(admin::delete_subsystem),
        )
        .route("/v1/admin/databases", get(admin::list_databases))
        .route(
            "/v1/admin/databases/{db}",
            get(admin::show_database).delete(admin::delete_database),
        )
        .route(
            "/v1/admin/databases/{db}/token",
            post(admin::rotate_database_token),
        )
        .route("/v1/admin/devices", get(admin::list_devices))
        .route(
            "/v1/admin/devices/{dev}",
            get(admin::show_device).delete(admin::delete_device),
        )
        .route(
            "/v1/admin/devices/{dev}/token",
            post(admin::rotate_device_token),
        )
        .route("/v1/admin/token", post(admin::rotate_admin_token))
        .route("/v1/admin/processes/{pid}/settle", post(admin::settle))
        .route(
            "/v1/admin/databases/{db}/folders/{folder}/{id}",
            get(admin::show_message),
        )
        .route(
            "/v1/admin/databases/{db}/folders/{folder}/{id}/requeue",
            post(admin::requeue),
        )
        .route(
            "/v1/admin/databases/{db}/folders/{folder}/{id}/discard",
            post(admin::discard),
        )
        .route(
            "/v1/admin/enterprises/{ent}/subsystems",
            post(admin::create_subsystem).get(admin::list_subsystems),
        )
        .route(
            "/v1/admin/enterprises/{ent}/databases",
            post(admin::create_database),
        )
        .route(
            "/v1/admin/enterprises/{ent}/devices",
            post(admin::create_device),
        )
        .route("/v1/admin/processes", get(admin::processes))
        .route("/v1/admin/stats", get(admin::stats))
        .route("/v1/admin/alerts", get(admin::alerts))
        .route(
            "/v1/admin/databases/{db}/folders/{folder}",
            get(admin::folder),
        )
        .route(
            "/v1/admin/databases/{db}/webhook",
            put(admin::set_database_webhook).delete(admin::clear_database_webhook),
        )
        .route(
            "/v1/admin/devices/{dev}/webhook",
            put(admin::set_device_webhook).delete(admin::clear_device_webhook),
        )
        .route("/v1/messages", post(device::send_message))
        .route("/v1/inbox", get(device::inbox))
        .route("/v1/inbox/ack", post(device::ack))
        .route("/v1/processes", post(process::start))
        .route("/v1/processes/{pid}", get(process::status))
        .route("/v1/processes/{pid}/accept", post(process::accept))
        .route("/v1/processes/{pid}/prepare", post(process::prepare))
        .route("/v1/processes/{pid}/commit", post(process::commit))
        .route("/v1/processes/{pid}/rollback", post(process::rollback))
        .route("/v1/processes/{pid}/abort", post(process::abort))
        .merge(dashboard::routes(&state))
        .fallback(|| async { ApiError::no_route() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(max_body));
    let router =
        limit_bodies(router, max_body).layer(from_fn_with_state(state.clone(), metrics::count));
    traced(router).with_state(state)
}
