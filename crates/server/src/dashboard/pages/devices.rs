//! `/admin/devices`: a page of devices (search by id, next page after the
//! last shown): each one's folders and when it last called.

use std::time::SystemTime;

use askama::Template;
use axum::Form;
use axum::extract::{Query, State};
use estafeta_exchange::tenancy::Kind;

use super::{
    EndpointForm, EndpointList, Layout, ListQuery, PageResult, counts_of, endpoint_action,
    endpoint_page, render, seconds_since_system,
};
use crate::dashboard::auth::AdminSession;
use crate::extract::ApiPath;
use crate::state::AppState;

struct DevRow {
    id: String,
    last_seen: String,
    enterprise: String,
    subsystem: String,
    counts: Vec<u64>,
}

#[derive(Template)]
#[template(path = "devices.html")]
struct DevicesPage {
    layout: Layout,
    list: EndpointList,
    rows: Vec<DevRow>,
}

/// `GET /admin/devices?q=&after=`: a page of devices and their folders.
pub async fn devices(
    State(state): State<AppState>,
    session: AdminSession,
    Query(q): Query<ListQuery>,
) -> PageResult {
    let now = SystemTime::now();
    let (found, next) = endpoint_page(state.exchange(), Kind::Device, &q).await?;
    let rows = found
        .into_iter()
        .map(|d| DevRow {
            last_seen: state.last_seen().get(&d.id).map_or_else(
                || "not since the server started".to_owned(),
                |t| format!("{} ago", seconds_since_system(t, now)),
            ),
            counts: counts_of(&d.folders),
            id: d.id.to_string(),
            enterprise: d.enterprise.to_string(),
            subsystem: d.subsystem.map(|s| s.to_string()).unwrap_or_default(),
        })
        .collect();
    let page = DevicesPage {
        list: EndpointList::new(&q, next),
        layout: Layout::new("Devices", &session, q.notice),
        rows,
    };
    Ok(render(&page))
}

/// `POST /admin/devices/{id}/{action}`: `rotate` the device's token or
/// `delete` it, each after a confirmation page.
pub async fn device_action(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath(path): ApiPath<(String, String)>,
    Form(form): Form<EndpointForm>,
) -> PageResult {
    endpoint_action(&state, &session, Kind::Device, "devices", path, form).await
}
