//! `/admin/deliveries`: the repeat schedulers' entries (alert deliveries,
//! push notifications and their retries, messages scheduled for their
//! `deliver_at`), soonest first.

use askama::Template;
use axum::extract::State;
use estafeta_exchange::Timestamp;

use super::{Layout, PageResult, render};
use crate::dashboard::auth::AdminSession;
use crate::metrics::backlogs;
use crate::notify::{LastErrors, Row};
use crate::state::AppState;
use estafeta_exchange::store::SCHEDULED_SOURCE;

/// The most entries per source the page lists.
const ROWS_SHOWN: usize = 200;

/// One line of the deliveries page.
struct DeliveryRow {
    source: String,
    id: String,
    due: String,
    state: &'static str,
    attempts: u32,
    last_error: String,
}

/// A source's summary line.
struct SourceRow {
    source: &'static str,
    entries: u64,
    due: u64,
    lag: String,
}

#[derive(Template)]
#[template(path = "deliveries.html")]
struct DeliveriesPage {
    layout: Layout,
    sources: Vec<SourceRow>,
    rows: Vec<DeliveryRow>,
}

/// `GET /admin/deliveries`: every scheduled or retrying delivery, soonest
/// first, with its due time, attempts and last error.
pub async fn deliveries(State(state): State<AppState>, session: AdminSession) -> PageResult {
    let ex = state.exchange();
    let mut entries: Vec<Row> = Vec::new();
    entries.extend(
        state
            .notifier()
            .pending(ROWS_SHOWN)
            .await
            .unwrap_or_default(),
    );
    entries.extend(state.pusher().pending(ROWS_SHOWN).await.unwrap_or_default());
    let none = LastErrors::default();
    entries.extend(
        ex.scheduled(ROWS_SHOWN)
            .await?
            .iter()
            .map(|e| Row::of(e, &none)),
    );
    entries.sort_by(|a, b| (a.due_secs, &a.id).cmp(&(b.due_secs, &b.id)));
    let now = u64::try_from(ex.now().as_millis() / 1000).unwrap_or(0);
    let rows = entries
        .into_iter()
        .map(|r| DeliveryRow {
            due: Timestamp::from_millis(
                i64::try_from(r.due_secs.saturating_mul(1000)).unwrap_or(i64::MAX),
            )
            .to_string(),
            state: match (
                r.due_secs <= now,
                r.attempts > 0,
                r.source == SCHEDULED_SOURCE,
            ) {
                (false, _, true) => "scheduled",
                (false, true, _) => "retrying",
                (false, false, _) => "waiting",
                (true, _, _) => "due",
            },
            attempts: r.attempts,
            last_error: r.last_error.unwrap_or_default(),
            source: r.source,
            id: r.id,
        })
        .collect();
    let sources = backlogs(&state.metric_parts())
        .await
        .into_iter()
        .map(|(source, b)| SourceRow {
            source,
            entries: b.entries,
            due: b.due,
            lag: humantime::format_duration(std::time::Duration::from_secs(b.lag_secs)).to_string(),
        })
        .collect();
    Ok(render(&DeliveriesPage {
        layout: Layout::new("Deliveries", &session, None),
        sources,
        rows,
    }))
}
