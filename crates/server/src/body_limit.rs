//! [`limit_bodies`]: the request body limit of a group of routes (the API's
//! configured size, the dashboard's small forms), answered with the error
//! JSON.

use axum::Router;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::middleware::map_response;
use axum::response::{IntoResponse, Response};
use tower_http::limit::RequestBodyLimitLayer;

use crate::error::ApiError;

/// Refuses request bodies over `limit` bytes with 413 and the error JSON:
/// at once, before any of the body is read, when the declared
/// `Content-Length` is over it; otherwise as soon as the body read passes it.
pub fn limit_bodies<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    limit: usize,
) -> Router<S> {
    router
        .layer(RequestBodyLimitLayer::new(limit))
        .layer(map_response(move |response: Response| async move {
            too_large_as_json(response, limit)
        }))
}

/// The limit layer's own 413 (plain text) as the error JSON.
fn too_large_as_json(response: Response, limit: usize) -> Response {
    let json = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE && !json {
        ApiError::body_too_large(format!("the request body is larger than {limit} bytes"))
            .into_response()
    } else {
        response
    }
}
