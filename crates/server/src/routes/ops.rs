//! Operations: liveness, readiness, metrics and the OpenAPI document. None
//! of them needs a token.

use std::sync::LazyLock;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use utoipa::OpenApi;

use crate::metrics::Snapshot;
use crate::openapi::ApiDoc;
use crate::state::AppState;

/// `GET /healthz`: 200 while the process runs.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The server process runs")))]
pub async fn healthz() -> StatusCode {
    StatusCode::OK
}

/// `GET /readyz`: 200 once start-up recovery is done, 503 before it and
/// while stopping.
#[utoipa::path(get, path = "/readyz", tag = "operations", responses(
    (status = 200, description = "Recovery done; serving"),
    (status = 503, description = "Recovering or stopping")))]
pub async fn readyz(State(state): State<AppState>) -> StatusCode {
    if state.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
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
    LazyLock::new(|| serde_json::to_vec(&ApiDoc::openapi()).unwrap_or_default());

/// `GET /v1/openapi.json`: this API's OpenAPI document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "operations", responses(
    (status = 200, description = "The OpenAPI document", body = Object)))]
pub async fn openapi() -> Response {
    super::raw_json(OPENAPI_JSON.clone())
}
