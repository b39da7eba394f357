//! The admin dashboard at `/admin`: server-rendered pages (askama
//! templates in `templates/`), one small script for live figures, no build
//! step. Everything but the login form and the static files needs a
//! logged-in session ([`auth`]); every state-changing form carries the
//! session's CSRF token. A form's body is read whole before its handler
//! runs: at most [`FORM_LIMIT`] bytes, within the request timeout, so that
//! anonymous clients can pin neither memory nor connections with forms.
//!
//! - [`auth`]: login, logout, CSRF; [`logins`]: the login sessions.
//! - [`pages`]: the pages and the operator actions; [`page`]: how each is
//!   rendered, or its error page.
//! - [`chart`]: the messages-per-minute chart.

pub mod auth;
pub mod chart;
pub mod logins;
pub mod page;
pub mod pages;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::{Next, from_fn_with_state, map_response};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use estafeta_exchange::wire::ErrorCode;

use crate::body_limit::FORM_LIMIT;
use crate::error::ApiError;
use crate::state::AppState;

/// The dashboard's routes (merged into the server's router).
pub fn routes(state: &AppState) -> Router<AppState> {
    let router = Router::new()
        .route("/admin", get(pages::overview::overview))
        .route("/admin/login", get(auth::login_form).post(auth::login))
        .route("/admin/logout", post(auth::logout))
        .route("/admin/processes", get(pages::processes::processes))
        .route(
            "/admin/processes/{pid}/settle",
            post(pages::processes::settle),
        )
        .route("/admin/databases", get(pages::databases::databases))
        .route(
            "/admin/databases/{id}/{action}",
            post(pages::databases::database_action),
        )
        .route("/admin/devices", get(pages::devices::devices))
        .route(
            "/admin/devices/{id}/{action}",
            post(pages::devices::device_action),
        )
        .route("/admin/browse/{folder}", get(pages::browse::browse))
        .route(
            "/admin/browse/{folder}/bulk",
            post(pages::browse::bulk_action),
        )
        .route(
            "/admin/browse/{folder}/{mailbox}/{id}",
            get(pages::browse::message),
        )
        .route(
            "/admin/browse/{folder}/{mailbox}/{id}/{action}",
            post(pages::browse::message_action),
        )
        .route("/admin/alerts", get(pages::alerts::alerts))
        .route("/admin/alerts/{id}/ack", post(pages::alerts::acknowledge))
        .route("/admin/events", get(pages::events::events))
        .route("/admin/queues", get(pages::queues::queues))
        .route("/admin/deliveries", get(pages::deliveries::deliveries))
        .route("/admin/static/app.js", get(script))
        .route("/admin/static/style.css", get(style))
        .layer(from_fn_with_state(state.clone(), read_form));
    router.layer(map_response(protect))
}

/// Middleware: reads the request body whole within the request timeout
/// (408 if it does not arrive in time; the whole body, not each piece of
/// it, so a client trickling bytes cannot hold on), then runs the handler.
async fn read_form(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let read = Bytes::from_request(Request::new(body), &());
    match tokio::time::timeout(state.http().request_timeout, read).await {
        Err(_) => ApiError::request_timeout().into_response(),
        Ok(Err(rejection)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::body_too_large(format!("a form is at most {FORM_LIMIT} bytes"))
                .into_response()
        }
        Ok(Err(rejection)) => {
            ApiError::bad_request(ErrorCode::BadRequest, rejection.body_text()).into_response()
        }
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
    }
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
