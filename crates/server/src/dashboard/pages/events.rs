//! `/admin/events`: the event log, newest first, filtered.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::{Layout, PageError, PageResult, render};
use crate::dashboard::auth::AdminSession;
use crate::events::{EventFilter, events_dir, read_events};
use crate::state::AppState;

/// The most event-log lines one page shows.
pub const EVENTS_SHOWN: usize = 500;

/// The event log filter, as typed into the form.
#[derive(Debug, Default, Deserialize)]
pub struct EventQuery {
    /// Database id.
    #[serde(default)]
    pub db: String,
    /// Device id.
    #[serde(default)]
    pub device: String,
    /// Least severity: `ERROR`, `WARN`, `INFO`, `DEBUG`.
    #[serde(default)]
    pub level: String,
    /// From (RFC 3339).
    #[serde(default)]
    pub since: String,
    /// Until (RFC 3339).
    #[serde(default)]
    pub until: String,
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
            level: text(&self.level)
                .map(|l| l.parse().map_err(|_| format!("unknown level {l:?}")))
                .transpose()?,
            since: time(&self.since, "since")?,
            until: time(&self.until, "until")?,
        })
    }
}

struct EventRow {
    ts: String,
    level: String,
    target: String,
    text: String,
    db: String,
    device: String,
    process: String,
    message: String,
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
}

/// `GET /admin/events`: the event log, newest first, filtered.
pub async fn events(
    State(state): State<AppState>,
    session: AdminSession,
    Query(q): Query<EventQuery>,
) -> PageResult {
    let (rows, error) = match q.filter() {
        Err(e) => (Vec::new(), Some(e)),
        Ok(filter) => {
            let dir = events_dir(state.exchange().data_dir());
            let found =
                tokio::task::spawn_blocking(move || read_events(&dir, &filter, EVENTS_SHOWN))
                    .await
                    .map_err(|e| PageError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
            let rows = found
                .into_iter()
                .map(|e| EventRow {
                    ts: e.ts,
                    level: e.level,
                    target: e.target,
                    text: e.text,
                    db: e.db.unwrap_or_default(),
                    device: e.device.unwrap_or_default(),
                    process: e.process.unwrap_or_default(),
                    message: e.message.unwrap_or_default(),
                    fields: if e.fields.is_empty() {
                        String::new()
                    } else {
                        serde_json::Value::Object(e.fields).to_string()
                    },
                })
                .collect();
            (rows, None)
        }
    };
    let page = EventsPage {
        layout: Layout::new("Event log", &session, None),
        q,
        levels: ["ERROR", "WARN", "INFO", "DEBUG"],
        error,
        rows,
    };
    Ok(render(&page))
}
