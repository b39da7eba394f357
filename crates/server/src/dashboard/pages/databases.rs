//! `/admin/databases`: files per folder and the oldest waiting message of
//! each database.

use std::time::SystemTime;

use askama::Template;
use axum::extract::State;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::tenancy::Principal;

use super::{Layout, PageResult, counts_of, render, seconds_since};
use crate::dashboard::auth::AdminSession;
use crate::state::AppState;

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
