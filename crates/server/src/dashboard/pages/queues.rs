//! `/admin/queues`: the send queues: each host up or down, and per request
//! type its depth, entries in flight and window.

use askama::Template;
use axum::extract::State;

use super::{Layout, PageResult, render};
use crate::dashboard::auth::AdminSession;
use crate::notify::outbound::HostFigures;
use crate::state::AppState;

#[derive(Template)]
#[template(path = "queues.html")]
struct QueuesPage {
    layout: Layout,
    hosts: Vec<HostFigures>,
}

/// `GET /admin/queues`: the send queues' hosts and types.
pub async fn queues(State(state): State<AppState>, session: AdminSession) -> PageResult {
    Ok(render(&QueuesPage {
        layout: Layout::new("Queues", &session, None),
        hosts: state.notifier().outbound().figures(),
    }))
}
