//! The figures pages: overview (counters, chart, health, open alerts),
//! processes, databases, devices.

use super::log::{AlertRow, alert_rows};
use std::time::SystemTime;

use askama::Template;
use axum::extract::{Query, State};
use estafeta_exchange::Id;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::ProcessState;

use super::{Layout, Notice, PageResult, human_bytes, render, seconds_since, seconds_since_system};
use crate::dashboard::auth::AdminSession;
use crate::dashboard::chart::{Bar, bars};
use crate::metrics::{OPEN_STATES, Snapshot, state_name};
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

struct ProcRow {
    id: String,
    db: String,
    state: String,
    class: &'static str,
    started: String,
    age: String,
    ready_at: String,
    messages: u64,
    replies: u64,
}

#[derive(Template)]
#[template(path = "processes.html")]
struct ProcessesPage {
    layout: Layout,
    rows: Vec<ProcRow>,
}

/// `GET /admin/processes`: open processes first, then the recently ended.
pub async fn processes(
    State(state): State<AppState>,
    session: AdminSession,
    Query(q): Query<Notice>,
) -> PageResult {
    let now = SystemTime::now();
    let mut list = state
        .exchange()
        .processes(&Principal::Admin)
        .await?
        .processes;
    list.sort_by_key(|p| {
        (
            !OPEN_STATES.contains(&p.state),
            std::cmp::Reverse(p.started_at),
        )
    });
    let rows = list
        .into_iter()
        .map(|p| ProcRow {
            id: p.process_id.to_string(),
            db: p.db_id.to_string(),
            state: state_name(p.state),
            class: match p.state {
                ProcessState::ReadyToCommit => "warn",
                ProcessState::InDoubt | ProcessState::Failed => "bad",
                s if s.is_live() => "live",
                _ => "ended",
            },
            started: p.started_at.to_string(),
            age: seconds_since(p.started_at, now),
            ready_at: p.ready_at.map(|t| t.to_string()).unwrap_or_default(),
            messages: p.messages,
            replies: p.replies,
        })
        .collect();
    let page = ProcessesPage {
        layout: Layout::new("Processes", &session, q.notice),
        rows,
    };
    Ok(render(&page))
}

struct DbRow {
    id: String,
    counts: Vec<u64>,
    oldest: String,
    oldest_age: String,
}

#[derive(Template)]
#[template(path = "databases.html")]
struct DatabasesPage {
    layout: Layout,
    folders: Vec<&'static str>,
    rows: Vec<DbRow>,
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

/// `GET /admin/databases`: files per folder and the oldest waiting message.
pub async fn databases(State(state): State<AppState>, session: AdminSession) -> PageResult {
    let ex = state.exchange();
    let admin = Principal::Admin;
    let now = SystemTime::now();
    let counts = ex.folder_counts(&admin).await?;
    let (dbs, _) = ex.mailbox_ids(&admin)?;
    let mut rows = Vec::new();
    for db in dbs {
        let oldest = ex.oldest_waiting(&admin, &db).await?;
        rows.push(DbRow {
            counts: counts_of(&counts, &db),
            oldest: oldest
                .as_ref()
                .map(|n| n.created_at.to_string())
                .unwrap_or_default(),
            oldest_age: oldest
                .map(|n| seconds_since(n.created_at, now))
                .unwrap_or_default(),
            id: db.to_string(),
        });
    }
    let page = DatabasesPage {
        layout: Layout::new("Databases", &session, None),
        folders: Folder::ALL.iter().map(|f| f.as_str()).collect(),
        rows,
    };
    Ok(render(&page))
}

struct DevRow {
    id: String,
    last_seen: String,
    enterprise: String,
    subsystem: String,
    inbox: u64,
    acked: u64,
    processed: u64,
    deadlocks: u64,
    incorrect: u64,
    counts: Vec<u64>,
}

#[derive(Template)]
#[template(path = "devices.html")]
struct DevicesPage {
    layout: Layout,
    folders: Vec<&'static str>,
    rows: Vec<DevRow>,
}

/// `GET /admin/devices`: each device's inbox and folders.
pub async fn devices(State(state): State<AppState>, session: AdminSession) -> PageResult {
    let ex = state.exchange();
    let admin = Principal::Admin;
    let now = SystemTime::now();
    let counts = ex.folder_counts(&admin).await?;
    let stats = ex.stats(&admin).await?;
    let rows = stats
        .devices
        .into_iter()
        .map(|d| DevRow {
            last_seen: state.last_seen().get(&d.id).map_or_else(
                || "not since the server started".to_owned(),
                |t| format!("{} ago", seconds_since_system(t, now)),
            ),
            counts: counts_of(&counts, &d.id),
            id: d.id.to_string(),
            enterprise: d.enterprise.to_string(),
            subsystem: d.subsystem.to_string(),
            inbox: d.received.saturating_sub(d.acked),
            acked: d.acked,
            processed: d.processed,
            deadlocks: d.deadlocks,
            incorrect: d.incorrect,
        })
        .collect();
    let page = DevicesPage {
        layout: Layout::new("Devices", &session, None),
        folders: Folder::ALL.iter().map(|f| f.as_str()).collect(),
        rows,
    };
    Ok(render(&page))
}
