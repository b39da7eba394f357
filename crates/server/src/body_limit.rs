//! [`limit_bodies`]: every request body's limit, sized to its route. The
//! routes that carry messages ([`MESSAGE_ROUTES`]: an upload, a prepare
//! with its replies) take up to the `max_body_mb` setting, and the bodies
//! of those held at once are capped by the `bodies_in_flight_mb` setting
//! ([`crate::body_room::BodyRoom`]); a dashboard form takes [`FORM_LIMIT`]; every other body
//! (ids, settings, a reason) takes [`SMALL_BODY`]. A declared
//! `Content-Length` over the limit is 413 at once, before any of the body
//! is read; a body without one is cut off (413) as soon as it passes it.

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_LENGTH;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use estafeta_exchange::wire::ErrorCode;
use http_body_util::Limited;

use crate::error::ApiError;
use crate::state::AppState;

/// The routes whose bodies carry messages, limited by the `max_body_mb`
/// setting.
pub const MESSAGE_ROUTES: [&str; 2] = ["/v1/messages", "/v1/processes/{pid}/prepare"];

/// The largest body of every other API route, in bytes: room for an
/// acknowledgement of several thousand ids (a thousand take 29 KB).
pub const SMALL_BODY: usize = 256 * 1024;

/// The largest body of a dashboard form, in bytes (the forms carry a token,
/// a nonce or a CSRF token and a word or two; a bulk action on a folder
/// also names each ticked message of its page): the limit of every route
/// under `/admin`.
pub const FORM_LIMIT: usize = 16 * 1024;

/// The limit of the body of the request it is attached to, for the 413
/// answers of the extractors that read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyLimit(pub usize);

/// Middleware: the body limit of the request's route (by its matched
/// path), and for the message routes room among the bodies held at once
/// (503 `too_busy` when none comes within the request timeout).
pub async fn limit_bodies(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let max_body = state.http().max_body_bytes;
    let (limit, message) = match route {
        Some(r) if MESSAGE_ROUTES.contains(&r) => (max_body, true),
        Some(r) if r == "/admin" || r.starts_with("/admin/") => (FORM_LIMIT.min(max_body), false),
        _ => (SMALL_BODY.min(max_body), false),
    };
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(limit).into_response();
    }
    let room = match (message, declared) {
        (false, _) | (true, Some(0)) => None,
        (true, declared) => {
            let bytes = declared.map_or(limit, |n| n as usize);
            let patience = state.http().request_timeout;
            match state.body_room().take(bytes, patience).await {
                Some(room) => Some(room),
                None => {
                    return ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        ErrorCode::TooBusy,
                        "the server holds as many message bodies as it may; retry later",
                    )
                    .into_response();
                }
            }
        }
    };
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(BodyLimit(limit));
    let request = Request::from_parts(parts, Body::new(Limited::new(body, limit)));
    let response = next.run(request).await;
    drop(room);
    response
}

/// The 413 answer of a body over `limit` bytes.
pub fn too_large(limit: usize) -> ApiError {
    ApiError::body_too_large(format!(
        "the request body is larger than {limit} bytes, this route's limit"
    ))
}
