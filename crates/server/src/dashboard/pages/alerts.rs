//! `/admin/alerts`: the alerts, newest first; and `/admin/alerts/{id}/ack`,
//! acknowledging one.

use askama::Template;
use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect};

use super::{Layout, Notice, PageError, PageResult, render};
use crate::dashboard::auth::{AdminSession, CsrfForm};
use crate::extract::ApiPath;
use crate::notify::RaisedError;
use crate::state::AppState;

/// The most alerts one page lists.
const ALERTS_SHOWN: usize = 500;

/// A row of the alerts tables.
pub(super) struct AlertRow {
    pub(super) id: String,
    pub(super) ts: String,
    pub(super) kind: String,
    pub(super) subject: String,
    pub(super) text: String,
    pub(super) ended_at: String,
    pub(super) acked_at: Option<String>,
}

/// The newest alerts from the notifier's store.
pub(super) async fn alert_rows(state: &AppState) -> Result<Vec<AlertRow>, PageError> {
    let alerts = state
        .notifier()
        .alerts(ALERTS_SHOWN)
        .await
        .map_err(|e| PageError::unavailable("reading the alerts", &e))?;
    Ok(alerts
        .into_iter()
        .map(|r| AlertRow {
            id: r.id.to_string(),
            ts: r.alert.raised_at.to_string(),
            kind: r.alert.kind.to_string(),
            subject: r
                .alert
                .key
                .split_once(':')
                .map_or_else(String::new, |(_, s)| s.to_owned()),
            text: r.alert.text,
            ended_at: r.ended_at.map(|t| t.to_string()).unwrap_or_default(),
            acked_at: r.acked_at.map(|t| t.to_string()),
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
        alerts: alert_rows(&state).await?,
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
    let unknown = || PageError(StatusCode::NOT_FOUND, format!("no alert {id}"));
    let number: u64 = id.parse().map_err(|_| unknown())?;
    let notifier = state.notifier();
    match notifier.acknowledge(number, state.exchange().now()).await {
        Ok(()) => {
            tracing::info!(target: "estafeta::event", alert = id, "alert acknowledged");
            Ok(Redirect::to("/admin/alerts?notice=acknowledged").into_response())
        }
        Err(RaisedError::Unknown(_)) => Err(unknown()),
        Err(e) => Err(PageError::unavailable("acknowledging an alert", &e)),
    }
}
