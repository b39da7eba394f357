//! [`app`]: the router of every route of the HTTP API ([`openapi::router`]) and
//! of the dashboard, with the body limits, the request counters, and the
//! request ids and spans.

use std::time::{Instant, SystemTime};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::Response;
use tower::ServiceBuilder;

use crate::body_limit::limit_bodies;
use crate::dashboard;
use crate::error::ApiError;
use crate::metrics;
use crate::openapi;
use crate::state::AppState;
use crate::trace::traced;

/// The server's router.
pub fn app(state: AppState) -> axum::Router {
    let max_body = state.http().max_body_bytes;
    let (api, _) = openapi::router().split_for_parts();
    let router = api
        .merge(dashboard::routes(&state))
        .fallback(|| async { ApiError::no_route() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() });
    let within = ServiceBuilder::new()
        .layer(from_fn_with_state(state.clone(), count))
        .layer(from_fn_with_state(state.clone(), limit_bodies))
        .layer(DefaultBodyLimit::max(max_body));
    traced(router, within).with_state(state)
}

/// Middleware: counts every answer and its latency by method and route.
/// Both labels come from closed sets, so no request can add series without
/// bound: the method is one of HTTP's own (else `other`), the route is the
/// matched template, never the raw path (`unmatched` when none matched).
/// Refused and failed requests are counted here and not written to the
/// event log one by one: a burst of bad requests must neither grow what
/// the server keeps nor push the log's history out.
pub async fn count(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = metrics::method_label(request.method());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_owned();
    let response = next.run(request).await;
    if response
        .extensions()
        .get::<crate::error::StoreUnavailable>()
        .is_some()
    {
        state.metrics().record_store_unavailable();
    }
    state.metrics().record(
        method,
        &route,
        response.status().as_u16(),
        started.elapsed(),
        SystemTime::now(),
    );
    response
}
