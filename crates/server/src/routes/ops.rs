//! Operations: liveness, readiness and metrics (the OpenAPI document is
//! served by [`crate::openapi`]). None of them needs a token.

use std::time::SystemTime;

use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use crate::metrics::Snapshot;
use crate::state::AppState;

/// The tag of the operations that need no token (these, and the OpenAPI
/// document); every other operation needs one.
pub const OPERATIONS: &str = "operations";

/// `GET /healthz`: 200 while the process runs.
#[utoipa::path(get, path = "/healthz", tag = OPERATIONS,
    responses((status = 200, description = "The server process runs")))]
pub async fn healthz() -> StatusCode {
    StatusCode::OK
}

/// `GET /readyz`: 200 once start-up recovery is done and storage takes
/// writes (the data folder, and in a cluster the database); 503 before recovery, while stopping, and while storage does
/// not take writes (checked on each call, so it is 200 again as soon as
/// storage recovers).
#[utoipa::path(get, path = "/readyz", tag = OPERATIONS, responses(
    (status = 200, description = "Recovery done; storage writable; serving"),
    (status = 503, description = "Recovering, stopping, or storage not writable or full")))]
pub async fn readyz(State(state): State<AppState>) -> StatusCode {
    if !state.is_ready() {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    match state.readiness().check().await {
        Ok(()) => StatusCode::OK,
        Err(e) => {
            tracing::debug!(error = %e, "readiness: storage does not take writes");
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

/// `GET /metrics`: Prometheus text.
#[utoipa::path(get, path = "/metrics", tag = OPERATIONS, responses(
    (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain; version=0.0.4")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let snapshot = Snapshot::gather(&state.metric_parts(), SystemTime::now()).await;
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        state.metrics().render(&snapshot),
    )
}
