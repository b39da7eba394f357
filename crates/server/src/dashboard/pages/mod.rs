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
use super::page::{PageError, render};
use askama::Template;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::{Id, Timestamp};
use serde::Deserialize;
use std::time::SystemTime;

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

/// The most rows one page of a list shows (devices, databases, messages
/// of a folder, processes): a page's size and time do not grow with the
/// number of mailboxes or messages.
pub const PAGE_ROWS: usize = 50;

/// A list's page and search, as typed into the form or followed from a
/// link: `q` narrows to ids starting with it, `after` is the last id of the
/// page before (the next page starts after it), `page` counts pages of
/// lists that are not in id order (from 0).
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    /// The id, or the start of the ids, searched for.
    #[serde(default)]
    pub q: String,
    /// The last id of the page before.
    #[serde(default)]
    pub after: String,
    /// The page number, from 0.
    #[serde(default)]
    pub page: usize,
    /// A one-line result of the last action.
    pub notice: Option<String>,
}

impl ListQuery {
    /// The search text, trimmed.
    fn search(&self) -> &str {
        self.q.trim()
    }
}

/// One page of the databases or devices whose id starts with the search
/// text, after the cursor, with their folder counts; and the cursor of the
/// next page if there is one.
async fn endpoint_page(
    ex: &estafeta_exchange::Exchange,
    kind: estafeta_exchange::tenancy::Kind,
    q: &ListQuery,
) -> Result<(Vec<estafeta_exchange::wire::EndpointDetail>, Option<String>), PageError> {
    let admin = estafeta_exchange::tenancy::Principal::Admin;
    let bad = |what: &str, text: &str, e: String| {
        PageError(StatusCode::BAD_REQUEST, format!("bad {what} {text:?}: {e}"))
    };
    let search = q.search();
    let prefix = if search.is_empty() {
        None
    } else {
        Some(Id::new(search).map_err(|e| bad("search", search, e.to_string()))?)
    };
    let after = if q.after.is_empty() {
        None
    } else {
        Some(Id::new(q.after.as_str()).map_err(|e| bad("page cursor", &q.after, e.to_string()))?)
    };
    let mut ids = Vec::new();
    if let (Some(p), None) = (&prefix, &after) {
        // The id itself first: the listing below starts after it.
        if ex.endpoint_detail(&admin, kind, p).await.is_ok() {
            ids.push(p.clone());
        }
    }
    let start = after.as_ref().or(prefix.as_ref());
    ids.extend(
        ex.endpoints_page(&admin, kind, None, start, PAGE_ROWS + 1)?
            .into_iter()
            .map(|e| e.id)
            .take_while(|id| {
                prefix
                    .as_ref()
                    .is_none_or(|p| id.as_str().starts_with(p.as_str()))
            }),
    );
    let next = (ids.len() > PAGE_ROWS).then(|| ids[PAGE_ROWS - 1].to_string());
    ids.truncate(PAGE_ROWS);
    let mut rows = Vec::with_capacity(ids.len());
    for id in ids {
        rows.push(ex.endpoint_detail(&admin, kind, &id).await?);
    }
    Ok((rows, next))
}

/// A query string value: everything but letters, digits, `-` and `.`
/// percent-encoded.
fn query_value(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// What the databases and devices pages show besides their rows: the
/// folders' names (the count columns), the search text and the next page.
struct EndpointList {
    /// The folders' names in [`Folder::ALL`] order.
    folders: Vec<&'static str>,
    /// The search text, trimmed.
    q: String,
    /// The next page's query (`?q=…&after=…`), if there is a next page.
    next: Option<String>,
}

impl EndpointList {
    /// The list for the search `q`, whose next page starts after `next`.
    fn new(q: &ListQuery, next: Option<String>) -> EndpointList {
        let search = q.search().to_owned();
        EndpointList {
            folders: Folder::ALL.iter().map(|f| f.as_str()).collect(),
            next: next
                .map(|after| format!("?q={}&after={}", query_value(&search), query_value(&after))),
            q: search,
        }
    }
}

/// The folder counts in [`Folder::ALL`] order.
fn counts_of(c: &estafeta_exchange::wire::FolderCounts) -> Vec<u64> {
    Folder::ALL
        .iter()
        .map(|f| match f {
            Folder::Messages => c.messages,
            Folder::Prepared => c.prepared,
            Folder::Log => c.log,
            Folder::Unknown => c.unknown,
            Folder::Error => c.error,
        })
        .collect()
}

/// The form of a database's or device's action.
#[derive(Debug, Deserialize)]
pub struct EndpointForm {
    /// The session's CSRF token.
    #[serde(default)]
    pub csrf: String,
    /// `yes` once the operator confirmed.
    #[serde(default)]
    pub confirm: String,
    /// `yes` to delete even though messages wait or a process is open.
    #[serde(default)]
    pub force: String,
}

/// The new token of a database or device, shown once.
#[derive(Template)]
#[template(path = "token.html")]
struct TokenPage {
    layout: Layout,
    kind: &'static str,
    id: String,
    token: String,
    back: String,
}

/// `rotate` or `delete` a database or device (`kind`, listed under
/// `/admin/{page}`), each after a confirmation page: a rotation shows the
/// new token once; a delete is refused while messages wait or a process is
/// open, unless forced.
async fn endpoint_action(
    state: &crate::state::AppState,
    session: &AdminSession,
    kind: estafeta_exchange::tenancy::Kind,
    page: &'static str,
    (id, action): (String, String),
    form: EndpointForm,
) -> PageResult {
    use axum::response::Redirect;
    if let Err(r) = session.check_csrf(&form.csrf) {
        return Ok(r.into_response());
    }
    let id = crate::extract::path_id(kind.as_str(), &id)?;
    let admin = estafeta_exchange::tenancy::Principal::Admin;
    let ex = state.exchange();
    // 404 before asking about what does not exist.
    ex.endpoint_detail(&admin, kind, &id).await?;
    let back = format!("/admin/{page}?q={}", query_value(id.as_str()));
    let (question, button) = match action.as_str() {
        "rotate" => (
            format!(
                "Rotate the token of {} {id}? The old token stops working at once.",
                kind.as_str()
            ),
            "Yes, rotate",
        ),
        "delete" => (
            format!(
                "Delete {} {id} and its token? Refused while messages wait or a process is open, unless forced.",
                kind.as_str()
            ),
            "Yes, delete",
        ),
        _ => {
            return Err(PageError(
                StatusCode::NOT_FOUND,
                "no such action".to_owned(),
            ));
        }
    };
    if form.confirm != "yes" {
        return Ok(render(&ConfirmPage {
            layout: Layout::new("Confirm", session, None),
            question,
            button,
            action: format!("/admin/{page}/{id}/{action}"),
            back,
            fields: Vec::new(),
            offer_force: action == "delete",
        }));
    }
    if action == "rotate" {
        let token = ex.rotate_token(&admin, kind, id.clone()).await?;
        return Ok(render(&TokenPage {
            layout: Layout::new("New token", session, None),
            kind: kind.as_str(),
            id: id.to_string(),
            token: token.expose().to_owned(),
            back,
        }));
    }
    let deleted = ex
        .delete_endpoint(&admin, kind, id.clone(), form.force == "yes")
        .await?;
    let notice = format!(
        "{} {id} deleted{}",
        kind.as_str(),
        if deleted.forced {
            format!(" (forced: {} message files discarded)", deleted.discarded)
        } else {
            String::new()
        }
    );
    Ok(Redirect::to(&format!("/admin/{page}?notice={}", query_value(&notice))).into_response())
}

/// The confirmation page of an action that cannot be undone: the
/// question, and the form that does it (the same fields and `confirm=yes`).
#[derive(Template)]
#[template(path = "confirm.html")]
pub(crate) struct ConfirmPage {
    pub(crate) layout: Layout,
    pub(crate) question: String,
    pub(crate) button: &'static str,
    pub(crate) action: String,
    pub(crate) back: String,
    pub(crate) fields: Vec<(String, String)>,
    pub(crate) offer_force: bool,
}
