//! How every dashboard answer is made: a template rendered ([`render`]),
//! or an error page ([`PageError`]) that says a failure of the server's
//! own in general terms, its detail in the log only.

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use estafeta_exchange::ExchangeError;

use crate::error::ApiError;

/// Renders a template, or a 500 page if it fails.
pub fn render<T: Template>(t: &T) -> Response {
    match t.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => PageError::failed(StatusCode::INTERNAL_SERVER_ERROR, "rendering a page", &e)
            .into_response(),
    }
}

/// A page that could not be shown or an action that failed: its status
/// and a plain explanation.
#[derive(Debug)]
pub struct PageError(pub StatusCode, pub String);

/// What a page says of a failure of the server's own (its storage, its
/// database): the detail names files, folders and hosts of the server, so
/// it goes to the log only.
pub const SERVER_FAILED: &str = "The server could not do this now (its log says why); try again.";

impl PageError {
    /// The server's own failure at `what`: logged with `e`, shown as
    /// [`SERVER_FAILED`] with `status`.
    pub fn failed(status: StatusCode, what: &str, e: &dyn std::fmt::Display) -> PageError {
        tracing::error!(error = %e, "dashboard: {what} failed");
        PageError(status, SERVER_FAILED.to_owned())
    }

    /// [`PageError::failed`] with 503.
    pub fn unavailable(what: &str, e: &dyn std::fmt::Display) -> PageError {
        PageError::failed(StatusCode::SERVICE_UNAVAILABLE, what, e)
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let page = ErrorPage {
            status: self.0.as_u16(),
            message: self.1,
        };
        match page.render() {
            Ok(html) => (self.0, Html(html)).into_response(),
            Err(_) => (self.0, page.message).into_response(),
        }
    }
}

impl From<ExchangeError> for PageError {
    fn from(e: ExchangeError) -> Self {
        ApiError::from(e).into()
    }
}

/// A refusal keeps its message (it tells the operator what to change); a
/// failure of the server's own (a 5xx: storage, a store out of reach) is
/// [`PageError::failed`], since its message names files and hosts.
impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        if e.status().is_server_error() {
            return PageError::failed(e.status(), "a call to the exchange", &e.message());
        }
        PageError(e.status(), e.message().to_owned())
    }
}

impl From<std::io::Error> for PageError {
    fn from(e: std::io::Error) -> Self {
        PageError::unavailable("reading storage", &e)
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    status: u16,
    message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_storage_failure_shows_no_path_of_the_server() {
        let e = std::io::Error::other("opening /srv/estafeta/.estafeta/alerts.redb: denied");
        let response = PageError::from(e).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let html = String::from_utf8(body.to_vec()).unwrap();
        assert!(!html.contains("/srv/estafeta"), "{html}");
        assert!(html.contains("its log says why"), "{html}");
    }
}
