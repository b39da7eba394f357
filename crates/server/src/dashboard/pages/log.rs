//! Alerts (list, acknowledge) and the event log (filtered).

use askama::Template;
use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect};
use serde::Deserialize;

use super::{EVENTS_SHOWN, Layout, Notice, PageError, PageResult, render};
use crate::dashboard::auth::{AdminSession, CsrfForm};
use crate::events::{EventFilter, events_dir, read_events};
use crate::extract::ApiPath;
use crate::state::AppState;

/// A row of the alerts tables.
pub(super) struct AlertRow {
    pub(super) id: String,
    pub(super) ts: String,
    pub(super) level: String,
    pub(super) text: String,
    pub(super) db: String,
    pub(super) process: String,
    pub(super) acked_at: Option<String>,
}

pub(super) fn alert_rows(state: &AppState) -> Result<Vec<AlertRow>, PageError> {
    let alerts = state
        .alerts()
        .list()
        .map_err(|e| PageError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok(alerts
        .into_iter()
        .map(|a| AlertRow {
            id: a.event.id,
            ts: a.event.ts,
            level: a.event.level,
            text: a.event.text,
            db: a.event.db.unwrap_or_default(),
            process: a.event.process.unwrap_or_default(),
            acked_at: a.acked_at,
        })
        .collect())
}

#[derive(Template)]
#[template(path = "alerts.html")]
struct AlertsPage {
    layout: Layout,
    alerts: Vec<AlertRow>,
}

/// `GET /admin/alerts`.
pub async fn alerts(
    State(state): State<AppState>,
    session: AdminSession,
    Query(q): Query<Notice>,
) -> PageResult {
    let page = AlertsPage {
        layout: Layout::new("Alerts", &session, q.notice),
        alerts: alert_rows(&state)?,
    };
    Ok(render(&page))
}

/// `POST /admin/alerts/{id}/ack`.
pub async fn acknowledge(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath(id): ApiPath<String>,
    Form(form): Form<CsrfForm>,
) -> PageResult {
    if let Err(r) = session.check_csrf(&form.csrf) {
        return Ok(r.into_response());
    }
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let book_id = id.clone();
    let result = tokio::task::spawn_blocking(move || state.alerts().acknowledge(&book_id, &now))
        .await
        .map_err(|e| PageError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    match result {
        Ok(()) => {
            tracing::info!(target: "estafeta::event", alert = id, "alert acknowledged");
            Ok(Redirect::to("/admin/alerts?notice=acknowledged").into_response())
        }
        Err(crate::alerts::AlertError::Unknown(_)) => {
            Err(PageError(StatusCode::NOT_FOUND, format!("no alert {id}")))
        }
        Err(e) => Err(PageError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
    }
}

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
