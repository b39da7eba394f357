//! Operations: liveness, readiness, metrics and the OpenAPI document. None
//! of them needs a token.

use std::sync::LazyLock;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use crate::metrics::Snapshot;
use crate::openapi::document;
use crate::state::AppState;

/// `GET /healthz`: 200 while the process runs.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The server process runs")))]
pub async fn healthz() -> StatusCode {
    StatusCode::OK
}

/// `GET /readyz`: 200 once start-up recovery is done and storage takes
/// writes (the data folder, and in a cluster the database); 503 before recovery, while stopping, and while storage does
/// not take writes (checked on each call, so it is 200 again as soon as
/// storage recovers).
#[utoipa::path(get, path = "/readyz", tag = "operations", responses(
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
#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain; version=0.0.4")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let snapshot = Snapshot::gather(&state, SystemTime::now()).await;
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        state.metrics().render(&snapshot),
    )
}

/// The document never changes while the server runs: built once.
static OPENAPI_JSON: LazyLock<Vec<u8>> =
    LazyLock::new(|| serde_json::to_vec(&document()).unwrap_or_default());

/// `GET /v1/openapi.json`: this API's OpenAPI document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "operations", responses(
    (status = 200, description = "The OpenAPI document", body = Object)))]
pub async fn openapi() -> Response {
    super::raw_json(OPENAPI_JSON.clone())
}
