//! The dashboard's pages: each handler gathers its figures from the
//! exchange, the metrics, the alerts or the event log and renders one
//! askama template (`templates/`). Actions are POST forms carrying the
//! session's CSRF token; each ends in a redirect back to a page.
//!
//!
//! Each module is named after the page's path under `/admin` and holds the
//! page and the actions posted under that path: [`overview`] (`/admin`
//! itself), [`processes`], [`databases`], [`devices`], [`browse`],
//! [`alerts`], [`events`], [`queues`], [`deliveries`]. The login form is
//! [`auth`](super::auth)'s.

pub mod alerts;
pub mod browse;
pub mod databases;
pub mod deliveries;
pub mod devices;
pub mod events;
pub mod overview;
pub mod processes;
pub mod queues;

use super::auth::AdminSession;
use crate::error::ApiError;
use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::{ExchangeError, Id, Timestamp};
use serde::Deserialize;
use std::time::SystemTime;

/// Renders a template, or a 500 page if it fails.
pub fn render<T: Template>(t: &T) -> Response {
    match t.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => PageError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A page that could not be shown or an action that failed: its status
/// and a plain explanation.
#[derive(Debug)]
pub struct PageError(pub StatusCode, pub String);

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

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        PageError(e.status(), e.message().to_owned())
    }
}

impl From<std::io::Error> for PageError {
    fn from(e: std::io::Error) -> Self {
        PageError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

type PageResult = Result<Response, PageError>;

/// What every page's frame needs.
pub struct Layout {
    /// The page title.
    pub title: &'static str,
    /// The CSRF token for the page's forms.
    pub csrf: String,
    /// A one-line result of the last action.
    pub notice: Option<String>,
}

impl Layout {
    fn new(title: &'static str, session: &AdminSession, notice: Option<String>) -> Layout {
        Layout {
            title,
            csrf: session.csrf.clone(),
            notice,
        }
    }
}

/// `?notice=` after an action.
#[derive(Debug, Default, Deserialize)]
pub struct Notice {
    /// The text to show.
    pub notice: Option<String>,
}

/// The login form.
#[derive(Template)]
#[template(path = "login.html")]
pub struct LoginPage {
    /// The double-submit nonce.
    pub nonce: String,
    /// Why the last try failed.
    pub error: Option<String>,
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    status: u16,
    message: String,
}

fn seconds_since(ts: Timestamp, now: SystemTime) -> String {
    let now_ms = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let secs = now_ms.saturating_sub(ts.as_millis()).max(0) / 1000;
    humantime::format_duration(std::time::Duration::from_secs(secs as u64)).to_string()
}

fn seconds_since_system(t: SystemTime, now: SystemTime) -> String {
    let secs = now.duration_since(t).map_or(0, |d| d.as_secs());
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Files per folder of one mailbox, in [`Folder::ALL`] order.
fn counts_of(all: &[(Id, Folder, u64)], id: &Id) -> Vec<u64> {
    Folder::ALL
        .iter()
        .map(|f| {
            all.iter()
                .find(|(i, g, _)| i == id && g == f)
                .map_or(0, |(_, _, n)| *n)
        })
        .collect()
}
