//! [`app`]: the router of every route of the HTTP API ([`routes::api`]) and
//! of the dashboard, with the body limits, the request counters, and the
//! request ids and spans.

use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;

use crate::body_limit::limit_bodies;
use crate::dashboard;
use crate::error::ApiError;
use crate::metrics;
use crate::routes;
use crate::state::AppState;
use crate::trace::traced;

/// The server's router.
pub fn app(state: AppState) -> axum::Router {
    let max_body = state.http().max_body_bytes;
    let (api, _) = routes::api().split_for_parts();
    let router = api
        .merge(dashboard::routes(&state))
        .fallback(|| async { ApiError::no_route() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(max_body));
    let router = router
        .layer(from_fn_with_state(state.clone(), limit_bodies))
        .layer(from_fn_with_state(state.clone(), metrics::count));
    traced(router).with_state(state)
}
