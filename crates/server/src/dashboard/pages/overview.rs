//! `/admin`: the overview (counters, chart, health, open alerts).

use std::time::SystemTime;

use askama::Template;
use axum::extract::{Query, State};

use super::alerts::{AlertRow, alert_rows};
use super::{Layout, Notice, PageResult, human_bytes, render};
use crate::dashboard::auth::AdminSession;
use crate::dashboard::chart::{Bar, bars};
use crate::metrics::Snapshot;
use crate::state::AppState;

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    layout: Layout,
    ready: bool,
    requests: u64,
    uploads_hour: u64,
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
    let snap = Snapshot::gather(&state, now).await;
    let series = state.metrics().uploads_per_minute(now);
    let (bars, peak) = bars(&series);
    let alerts = alert_rows(&state)
        .await?
        .into_iter()
        .filter(|a| a.acked_at.is_none())
        .take(10)
        .collect();
    let page = OverviewPage {
        layout: Layout::new("Overview", &session, q.notice),
        ready: snap.ready,
        requests: state.metrics().requests_total(),
        uploads_hour: series.iter().sum(),
        processes: snap.processes.into_iter().collect(),
        oldest_ready: if snap.oldest_ready_secs > 0.0 {
            format!("{:.0} s", snap.oldest_ready_secs)
        } else {
            "none".to_owned()
        },
        alerts_open: snap.alerts_open,
        disk_free: snap.disk.map_or("unknown".to_owned(), |(free, total)| {
            format!("{} of {}", human_bytes(free), human_bytes(total))
        }),
        bars,
        peak,
        alerts,
    };
    Ok(render(&page))
}
