//! `/admin/databases`: a page of databases (search by id, next page after
//! the last shown): files per folder, open processes and the oldest
//! waiting message of each.

use std::time::SystemTime;

use askama::Template;
use axum::Form;
use axum::extract::{Query, State};
use estafeta_exchange::tenancy::{Kind, Principal};

use super::{
    EndpointForm, EndpointList, Layout, ListQuery, PageResult, counts_of, endpoint_action,
    endpoint_page, render, seconds_since,
};
use crate::dashboard::auth::AdminSession;
use crate::extract::ApiPath;
use crate::state::AppState;

struct DbRow {
    id: String,
    enterprise: String,
    counts: Vec<u64>,
    open: usize,
    oldest: String,
    oldest_age: String,
}

#[derive(Template)]
#[template(path = "databases.html")]
struct DatabasesPage {
    layout: Layout,
    list: EndpointList,
    rows: Vec<DbRow>,
}

/// `GET /admin/databases?q=&after=`: a page of databases, their folders
/// and oldest waiting message.
pub async fn databases(
    State(state): State<AppState>,
    session: AdminSession,
    Query(q): Query<ListQuery>,
) -> PageResult {
    let ex = state.exchange();
    let now = SystemTime::now();
    let (found, next) = endpoint_page(ex, Kind::Database, &q).await?;
    let mut rows = Vec::with_capacity(found.len());
    for db in found {
        let oldest = if db.folders.messages > 0 {
            ex.oldest_waiting(&Principal::Admin, &db.id).await?
        } else {
            None
        };
        rows.push(DbRow {
            counts: counts_of(&db.folders),
            open: db.open_processes.len(),
            oldest: oldest
                .as_ref()
                .map(|n| n.created_at.to_string())
                .unwrap_or_default(),
            oldest_age: oldest
                .map(|n| seconds_since(n.created_at, now))
                .unwrap_or_default(),
            id: db.id.to_string(),
            enterprise: db.enterprise.to_string(),
        });
    }
    let page = DatabasesPage {
        list: EndpointList::new(&q, next),
        layout: Layout::new("Databases", &session, q.notice),
        rows,
    };
    Ok(render(&page))
}

/// `POST /admin/databases/{id}/{action}`: `rotate` the database's token or
/// `delete` it, each after a confirmation page.
pub async fn database_action(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath(path): ApiPath<(String, String)>,
    Form(form): Form<EndpointForm>,
) -> PageResult {
    endpoint_action(&state, &session, Kind::Database, "databases", path, form).await
}
