//! `/admin`: the overview: messages waiting, in doubt and failed over
//! every mailbox and the oldest waiting message's age (the store's running
//! totals), processes by state (the exchange's process list, kept as
//! records are saved), the uploads chart, health and open alerts. Nothing
//! on it is counted per request, so it costs the same with a million
//! messages waiting in a thousand databases as with none.

use std::collections::BTreeMap;
use std::time::SystemTime;

use askama::Template;
use axum::extract::{Query, State};
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::ProcessState;

use super::alerts::{AlertRow, alert_rows};
use super::{Layout, Notice, PageResult, human_bytes, render, seconds_since};
use crate::dashboard::auth::AdminSession;
use crate::dashboard::chart::{Bar, bars};
use crate::metrics::{OPEN_STATES, disk_space, state_name};
use crate::state::AppState;

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    layout: Layout,
    ready: bool,
    requests: u64,
    uploads_hour: u64,
    waiting: u64,
    oldest_waiting: String,
    in_doubt: u64,
    failed: u64,
    unknown: u64,
    error: u64,
    processes: Vec<(String, u64)>,
    oldest_ready: String,
    alerts_open: u64,
    disk_free: String,
    bars: Vec<Bar>,
    peak: u64,
    alerts: Vec<AlertRow>,
}

/// `GET /admin`: the overview.
pub async fn overview(
    State(state): State<AppState>,
    session: AdminSession,
    Query(q): Query<Notice>,
) -> PageResult {
    let now = SystemTime::now();
    let ex = state.exchange();
    let admin = Principal::Admin;
    let totals = ex.totals(&admin).await?;
    let by_state = ex.process_totals(&admin).await?;
    let processes: BTreeMap<String, u64> = OPEN_STATES
        .iter()
        .map(|s| (state_name(*s), by_state.count(*s)))
        .collect();
    let count = |s: ProcessState| by_state.count(s);
    let series = state.metrics().uploads_per_minute(now);
    let (bars, peak) = bars(&series);
    let alerts = alert_rows(&state)
        .await?
        .into_iter()
        .filter(|a| a.acked_at.is_none())
        .take(10)
        .collect();
    let dir = ex.data_dir().to_path_buf();
    let disk = tokio::task::spawn_blocking(move || disk_space(&dir))
        .await
        .ok()
        .flatten();
    let page = OverviewPage {
        layout: Layout::new("Overview", &session, q.notice),
        ready: state.is_ready(),
        requests: state.metrics().requests_total(),
        uploads_hour: series.iter().sum(),
        waiting: totals.waiting,
        oldest_waiting: totals
            .oldest_waiting
            .map_or_else(|| "none".to_owned(), |t| seconds_since(t, now)),
        in_doubt: count(ProcessState::InDoubt),
        failed: count(ProcessState::Failed),
        unknown: totals.unknown,
        error: totals.error,
        oldest_ready: by_state
            .oldest_ready
            .map_or_else(|| "none".to_owned(), |t| seconds_since(t, now)),
        processes: processes.into_iter().collect(),
        alerts_open: state.notifier().unacknowledged().await.unwrap_or(0),
        disk_free: disk.map_or("unknown".to_owned(), |(free, total)| {
            format!("{} of {}", human_bytes(free), human_bytes(total))
        }),
        bars,
        peak,
        alerts,
    };
    Ok(render(&page))
}
