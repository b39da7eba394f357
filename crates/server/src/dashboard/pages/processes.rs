//! `/admin/processes`: open processes first, then the recently ended, a
//! page at a time (from the exchange's process list, kept as records are
//! saved: a page copies only the rows it shows); and
//! `/admin/processes/{pid}/settle`, settling a process in doubt (its form is
//! on the `Unknown` and `Error` browsers, where the answer returns).

use std::time::SystemTime;

use askama::Template;
use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::ProcessState;
use serde::Deserialize;

use super::browse::back_to;
use super::{Layout, ListQuery, PAGE_ROWS, PageError, PageResult, render, seconds_since};
use crate::dashboard::auth::AdminSession;
use crate::extract::ApiPath;
use crate::metrics::state_name;
use crate::state::AppState;

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
    total: usize,
    first: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// `GET /admin/processes?page=`: open processes first, then the recently
/// ended, [`PAGE_ROWS`] a page.
pub async fn processes(
    State(state): State<AppState>,
    session: AdminSession,
    Query(q): Query<ListQuery>,
) -> PageResult {
    let now = SystemTime::now();
    let first = q.page.saturating_mul(PAGE_ROWS);
    let (total, list) = state
        .exchange()
        .process_page(&Principal::Admin, first, PAGE_ROWS)
        .await?;
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
        total,
        first,
        prev: q.page.checked_sub(1),
        next: (first + PAGE_ROWS < total).then_some(q.page + 1),
    };
    Ok(render(&page))
}

/// The settle form.
#[derive(Debug, Deserialize)]
pub struct SettleForm {
    /// The session's CSRF token.
    #[serde(default)]
    pub csrf: String,
    /// `commit` or `rollback`.
    pub outcome: String,
    /// The folder page to return to.
    #[serde(default)]
    pub back: String,
}

/// `POST /admin/processes/{pid}/settle`: settle a process in doubt.
pub async fn settle(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath(pid): ApiPath<String>,
    Form(form): Form<SettleForm>,
) -> PageResult {
    if let Err(r) = session.check_csrf(&form.csrf) {
        return Ok(r.into_response());
    }
    let commit = match form.outcome.as_str() {
        "commit" => true,
        "rollback" => false,
        _ => {
            return Err(PageError(
                StatusCode::BAD_REQUEST,
                "outcome is commit or rollback".to_owned(),
            ));
        }
    };
    let answer = state
        .exchange()
        .settle(&Principal::Admin, &pid, commit)
        .await?;
    let back = if form.back == "Error" {
        "Error"
    } else {
        "Unknown"
    };
    let outcome = if commit { "committed" } else { "rolled back" };
    Ok(back_to(
        back,
        &format!("process {pid} settled as {outcome}: {:?}", answer.status),
    ))
}
