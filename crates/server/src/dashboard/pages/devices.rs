//! `/admin/devices`: each device's inbox, folders and when it last called.

use std::time::SystemTime;

use askama::Template;
use axum::extract::State;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::tenancy::Principal;

use super::{Layout, PageResult, counts_of, render, seconds_since_system};
use crate::dashboard::auth::AdminSession;
use crate::state::AppState;

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
