//! The admin dashboard at `/admin`: server-rendered pages (askama
//! templates in `templates/`), one small script for live figures, no build
//! step. Everything but the login form and the static files needs a
//! logged-in session ([`auth`]); every state-changing form carries the
//! session's CSRF token.
//!
//! - [`auth`]: login, logout, sessions, CSRF.
//! - [`pages`]: the pages and the operator actions.
//! - [`chart`]: the messages-per-minute chart.

pub mod auth;
pub mod chart;
pub mod pages;

use axum::Router;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::map_response;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::state::AppState;

/// The dashboard's routes (merged into the server's router).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin", get(pages::figures::overview))
        .route("/admin/login", get(auth::login_form).post(auth::login))
        .route("/admin/logout", post(auth::logout))
        .route("/admin/processes", get(pages::figures::processes))
        .route("/admin/processes/{pid}/settle", post(pages::browse::settle))
        .route("/admin/databases", get(pages::figures::databases))
        .route("/admin/devices", get(pages::figures::devices))
        .route("/admin/browse/{folder}", get(pages::browse::browse))
        .route(
            "/admin/browse/{folder}/{mailbox}/{id}",
            get(pages::browse::message),
        )
        .route(
            "/admin/browse/{folder}/{mailbox}/{id}/{action}",
            post(pages::browse::message_action),
        )
        .route("/admin/alerts", get(pages::log::alerts))
        .route("/admin/alerts/{id}/ack", post(pages::log::acknowledge))
        .route("/admin/events", get(pages::log::events))
        .route("/admin/queues", get(pages::outbound::queues))
        .route("/admin/deliveries", get(pages::outbound::deliveries))
        .route("/admin/static/app.js", get(script))
        .route("/admin/static/style.css", get(style))
        .layer(map_response(protect))
}

async fn script() -> Response {
    (
        [(CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../../static/app.js"),
    )
        .into_response()
}

async fn style() -> Response {
    (
        [(CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../../static/style.css"),
    )
        .into_response()
}

/// Headers on every dashboard answer: only our own script and style, no
/// framing, no caching of pages that show operational data.
async fn protect(mut response: Response) -> Response {
    let h = response.headers_mut();
    let set = |h: &mut axum::http::HeaderMap, name: &'static str, value: &'static str| {
        h.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    };
    set(
        h,
        "content-security-policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    set(h, "x-frame-options", "DENY");
    set(h, "x-content-type-options", "nosniff");
    set(h, "referrer-policy", "same-origin");
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
