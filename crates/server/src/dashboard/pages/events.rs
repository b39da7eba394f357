//! `/admin/events`: the event log, newest first, filtered, a page at a
//! time (from the event store's indexes: a page reads only what it shows,
//! or at most [`SCAN_MOST`](crate::events::store::SCAN_MOST) records when
//! it filters by level alone).

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::{Layout, PageError, PageResult, query_value, render};
use crate::dashboard::auth::AdminSession;
use crate::events::EventFilter;
use crate::events::store::parse_key;
use crate::state::AppState;

/// The most events one page shows.
pub const EVENTS_SHOWN: usize = 100;

/// The event log filter, as typed into the form, and the page.
#[derive(Debug, Default, Deserialize)]
pub struct EventQuery {
    /// Database id.
    #[serde(default)]
    pub db: String,
    /// Device id.
    #[serde(default)]
    pub device: String,
    /// Message id.
    #[serde(default)]
    pub message: String,
    /// Request id.
    #[serde(default)]
    pub request: String,
    /// Least severity: `ERROR`, `WARN`, `INFO`, `DEBUG`.
    #[serde(default)]
    pub level: String,
    /// From (RFC 3339).
    #[serde(default)]
    pub since: String,
    /// Until (RFC 3339).
    #[serde(default)]
    pub until: String,
    /// The id of the last event of the page before (this page is older).
    #[serde(default)]
    pub before: String,
}

impl EventQuery {
    fn filter(&self) -> Result<EventFilter, String> {
        let text = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_owned());
        let time = |s: &str, what: &str| -> Result<_, String> {
            text(s)
                .map(|t| {
                    chrono::DateTime::parse_from_rfc3339(&t)
                        .map(|d| d.with_timezone(&chrono::Utc))
                        .map_err(|e| format!("{what}: {e} (write it like 2026-11-25T10:00:00Z)"))
                })
                .transpose()
        };
        Ok(EventFilter {
            db: text(&self.db),
            device: text(&self.device),
            message: text(&self.message),
            request: text(&self.request),
            level: text(&self.level)
                .map(|l| l.parse().map_err(|_| format!("unknown level {l:?}")))
                .transpose()?,
            since: time(&self.since, "since")?,
            until: time(&self.until, "until")?,
        })
    }

    /// The query string of the next page, starting before `id`.
    fn older(&self, id: &str) -> String {
        let pairs = [
            ("db", &self.db),
            ("device", &self.device),
            ("message", &self.message),
            ("request", &self.request),
            ("level", &self.level),
            ("since", &self.since),
            ("until", &self.until),
        ];
        let mut out = String::from("?");
        for (k, v) in pairs {
            if !v.is_empty() {
                out.push_str(&format!("{k}={}&", query_value(v)));
            }
        }
        out.push_str(&format!("before={}", query_value(id)));
        out
    }
}

struct EventRow {
    ts: String,
    level: String,
    /// What kind of record it is, in words ([`kind`]).
    kind: &'static str,
    /// The tracing target that wrote it (shown on hover).
    target: String,
    text: String,
    db: String,
    device: String,
    process: String,
    message: String,
    request: String,
    fields: String,
}

#[derive(Template)]
#[template(path = "events.html")]
struct EventsPage {
    layout: Layout,
    q: EventQuery,
    levels: [&'static str; 4],
    error: Option<String>,
    rows: Vec<EventRow>,
    next: Option<String>,
}

/// A record's kind as a person reads it: a protocol step or admin change,
/// an alert, or a problem the server logged.
fn kind(target: &str, level: &str) -> &'static str {
    match (target, level) {
        (crate::events::EVENT_TARGET, _) => "step",
        (crate::events::ALERT_TARGET, _) => "alert",
        (_, "ERROR") => "error",
        _ => "warning",
    }
}

/// `GET /admin/events`: a page of the event log, newest first, filtered.
pub async fn events(
    State(state): State<AppState>,
    session: AdminSession,
    Query(q): Query<EventQuery>,
) -> PageResult {
    let before = if q.before.is_empty() {
        Ok(None)
    } else {
        parse_key(&q.before)
            .map(Some)
            .ok_or_else(|| format!("bad page cursor {:?}", q.before))
    };
    let (rows, next, error) = match q.filter().and_then(|f| before.map(|b| (f, b))) {
        Err(e) => (Vec::new(), None, Some(e)),
        Ok((filter, before)) => {
            let log = state.events().clone();
            let found =
                tokio::task::spawn_blocking(move || log.query(&filter, before, EVENTS_SHOWN))
                    .await
                    .map_err(|e| {
                        PageError::failed(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "reading the event log",
                            &e,
                        )
                    })?
                    .map_err(|e| PageError::unavailable("reading the event log", &e))?;
            let rows = found
                .records
                .into_iter()
                .map(|e| EventRow {
                    kind: kind(&e.target, &e.level),
                    ts: e.ts,
                    level: e.level,
                    target: e.target,
                    text: e.text,
                    db: e.db.unwrap_or_default(),
                    device: e.device.unwrap_or_default(),
                    process: e.process.unwrap_or_default(),
                    message: e.message.unwrap_or_default(),
                    request: e.request.unwrap_or_default(),
                    fields: if e.fields.is_empty() {
                        String::new()
                    } else {
                        serde_json::Value::Object(e.fields).to_string()
                    },
                })
                .collect();
            (rows, found.next.map(|id| q.older(&id)), None)
        }
    };
    let page = EventsPage {
        layout: Layout::new("Event log", &session, None),
        q,
        levels: ["ERROR", "WARN", "INFO", "DEBUG"],
        error,
        rows,
        next,
    };
    Ok(render(&page))
}
