//! `/admin`: the overview: messages waiting, in doubt and failed over
//! every mailbox (from the exchange's folder indexes, so the page costs
//! the same with a million messages waiting), the oldest waiting message's
//! age, processes by state, the uploads chart, health and open alerts.

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
    // The two walks over every mailbox wait on different stores: together.
    let (totals, list) = tokio::join!(ex.totals(&admin), ex.processes(&admin));
    let totals = totals?;
    let mut processes: BTreeMap<String, u64> =
        OPEN_STATES.iter().map(|s| (state_name(*s), 0)).collect();
    let mut oldest_ready = None;
    for p in list?.processes {
        if let Some(n) = processes.get_mut(&state_name(p.state)) {
            *n += 1;
        }
        if p.state == ProcessState::ReadyToCommit {
            let since = p.ready_at.unwrap_or(p.started_at);
            oldest_ready =
                Some(oldest_ready.map_or(since, |o: estafeta_exchange::Timestamp| o.min(since)));
        }
    }
    let count = |s: ProcessState| processes.get(&state_name(s)).copied().unwrap_or(0);
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
        oldest_ready: oldest_ready.map_or_else(|| "none".to_owned(), |t| seconds_since(t, now)),
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
