//! The dashboard's pages: each handler gathers its figures from the
//! exchange, the metrics, the alerts or the event log and renders one
//! askama template (`templates/`). Actions are POST forms carrying the
//! session's CSRF token; each ends in a redirect back to a page.

use std::time::SystemTime;

use askama::Template;
use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::ProcessState;
use estafeta_exchange::{ExchangeError, Id, MessageId, Timestamp};
use serde::Deserialize;

use super::auth::AdminSession;
use super::chart::{Bar, bars};
use crate::error::ApiError;
use crate::events::{EventFilter, events_dir, read_events};
use crate::extract::{ApiPath, path_folder, path_id};
use crate::metrics::{OPEN_STATES, Snapshot, state_name};
use crate::state::AppState;

/// The most event-log lines one page shows.
pub const EVENTS_SHOWN: usize = 500;

/// Renders a template, or a 500 page if it fails.
pub fn render<T: Template>(t: &T) -> Response {
    match t.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => PageError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A page that could not be shown or an action that failed: its status
/// and a plain explanation.
#[derive(Debug)]
pub struct PageError(pub StatusCode, pub String);

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let page = ErrorPage {
            status: self.0.as_u16(),
            message: self.1,
        };
        match page.render() {
            Ok(html) => (self.0, Html(html)).into_response(),
            Err(_) => (self.0, page.message).into_response(),
        }
    }
}

impl From<ExchangeError> for PageError {
    fn from(e: ExchangeError) -> Self {
        ApiError::from(e).into()
    }
}

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        PageError(e.status(), e.message().to_owned())
    }
}

impl From<std::io::Error> for PageError {
    fn from(e: std::io::Error) -> Self {
        PageError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

type PageResult = Result<Response, PageError>;

/// What every page's frame needs.
pub struct Layout {
    /// The page title.
    pub title: &'static str,
    /// The CSRF token for the page's forms.
    pub csrf: String,
    /// A one-line result of the last action.
    pub notice: Option<String>,
}

impl Layout {
    fn new(title: &'static str, session: &AdminSession, notice: Option<String>) -> Layout {
        Layout {
            title,
            csrf: session.csrf.clone(),
            notice,
        }
    }
}

/// `?notice=` after an action.
#[derive(Debug, Default, Deserialize)]
pub struct Notice {
    /// The text to show.
    pub notice: Option<String>,
}

/// The login form.
#[derive(Template)]
#[template(path = "login.html")]
pub struct LoginPage {
    /// The double-submit nonce.
    pub nonce: String,
    /// Why the last try failed.
    pub error: Option<String>,
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    status: u16,
    message: String,
}

fn seconds_since(ts: Timestamp, now: SystemTime) -> String {
    let now_ms = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let secs = now_ms.saturating_sub(ts.as_millis()).max(0) / 1000;
    humantime::format_duration(std::time::Duration::from_secs(secs as u64)).to_string()
}

fn seconds_since_system(t: SystemTime, now: SystemTime) -> String {
    let secs = now.duration_since(t).map_or(0, |d| d.as_secs());
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// A row of the alerts tables.
struct AlertRow {
    id: String,
    ts: String,
    level: String,
    text: String,
    db: String,
    process: String,
    acked_at: Option<String>,
}

fn alert_rows(state: &AppState) -> Result<Vec<AlertRow>, PageError> {
    let alerts = state
        .alerts()
        .list()
        .map_err(|e| PageError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok(alerts
        .into_iter()
        .map(|a| AlertRow {
            id: a.event.id,
            ts: a.event.ts,
            level: a.event.level,
            text: a.event.text,
            db: a.event.db.unwrap_or_default(),
            process: a.event.process.unwrap_or_default(),
            acked_at: a.acked_at,
        })
        .collect())
}

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
    let alerts = alert_rows(&state)?
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
        })
        .collect();
    let page = DevicesPage {
        layout: Layout::new("Devices", &session, None),
        folders: Folder::ALL.iter().map(|f| f.as_str()).collect(),
        rows,
    };
    Ok(render(&page))
}

struct DoubtRow {
    pid: String,
    db: String,
    held: usize,
}

struct FileRow {
    mailbox: String,
    id: String,
    from: String,
    to: String,
    created: String,
    size: u64,
    held_by: Option<String>,
}

#[derive(Template)]
#[template(path = "browse.html")]
struct BrowsePage {
    layout: Layout,
    folder: &'static str,
    in_doubt: Vec<DoubtRow>,
    files: Vec<FileRow>,
}

/// Only `Unknown` and `Error` are browsed.
fn browsable(text: &str) -> Result<Folder, PageError> {
    match path_folder(text)? {
        f @ (Folder::Unknown | Folder::Error) => Ok(f),
        _ => Err(PageError(
            StatusCode::NOT_FOUND,
            "only Unknown and Error are browsed here".to_owned(),
        )),
    }
}

/// `GET /admin/browse/{folder}`: every message of that folder in every
/// mailbox, the processes in doubt holding some, and their settle actions.
pub async fn browse(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath(folder): ApiPath<String>,
    Query(q): Query<Notice>,
) -> PageResult {
    let folder = browsable(&folder)?;
    let ex = state.exchange();
    let admin = Principal::Admin;
    let (dbs, devs) = ex.mailbox_ids(&admin)?;
    let mut in_doubt = Vec::new();
    let mut holder = std::collections::HashMap::new();
    for db in &dbs {
        for (pid, held) in ex.in_doubt(&admin, db).await? {
            for m in &held {
                holder.insert(*m, pid.to_string());
            }
            in_doubt.push(DoubtRow {
                pid: pid.to_string(),
                db: db.to_string(),
                held: held.len(),
            });
        }
    }
    let mut files = Vec::new();
    for id in dbs.iter().chain(devs.iter()) {
        for f in ex.folder(&admin, id.clone(), folder).await?.files {
            files.push(FileRow {
                mailbox: id.to_string(),
                id: f.id.to_string(),
                from: f.from.to_string(),
                to: f.to.to_string(),
                created: f.created_at.to_string(),
                size: f.size,
                held_by: holder.get(&f.id).cloned(),
            });
        }
    }
    let page = BrowsePage {
        layout: Layout::new(
            if folder == Folder::Unknown {
                "Unknown"
            } else {
                "Error"
            },
            &session,
            q.notice,
        ),
        folder: folder.as_str(),
        in_doubt,
        files,
    };
    Ok(render(&page))
}

#[derive(Template)]
#[template(path = "message.html")]
struct MessagePage {
    layout: Layout,
    folder: &'static str,
    mailbox: String,
    id: String,
    body: String,
    held_by: Option<String>,
}

fn message_id(text: &str) -> Result<MessageId, PageError> {
    text.parse()
        .map_err(|_| PageError(StatusCode::BAD_REQUEST, format!("bad message id {text:?}")))
}

/// `GET /admin/browse/{folder}/{mailbox}/{id}`: one message and what can
/// be done with it.
pub async fn message(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath((folder, mailbox, id)): ApiPath<(String, String, String)>,
) -> PageResult {
    let folder = browsable(&folder)?;
    let mailbox = path_id("mailbox", &mailbox)?;
    let mid = message_id(&id)?;
    let ex = state.exchange();
    let admin = Principal::Admin;
    let bytes = ex.read_message(&admin, &mailbox, folder, mid).await?;
    let body = serde_json::from_slice::<serde_json::Value>(&bytes)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    let held_by = ex
        .in_doubt(&admin, &mailbox)
        .await?
        .into_iter()
        .find(|(_, held)| held.contains(&mid))
        .map(|(pid, _)| pid.to_string());
    let page = MessagePage {
        layout: Layout::new("Message", &session, None),
        folder: folder.as_str(),
        mailbox: mailbox.to_string(),
        id,
        body,
        held_by,
    };
    Ok(render(&page))
}

fn back_to(folder: &str, notice: &str) -> Response {
    let notice: String = notice
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '+'
            }
        })
        .collect();
    Redirect::to(&format!("/admin/browse/{folder}?notice={notice}")).into_response()
}

/// The requeue and discard forms.
#[derive(Debug, Deserialize)]
pub struct MessageAction {
    /// The session's CSRF token.
    #[serde(default)]
    pub csrf: String,
}

/// `POST /admin/browse/{folder}/{mailbox}/{id}/{action}`: `requeue` puts
/// the message into its recipient's `Messages`; `discard` deletes it.
pub async fn message_action(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath((folder, mailbox, id, action)): ApiPath<(String, String, String, String)>,
    Form(form): Form<MessageAction>,
) -> PageResult {
    if let Err(r) = session.check_csrf(&form.csrf) {
        return Ok(r.into_response());
    }
    let folder = browsable(&folder)?;
    let mailbox = path_id("mailbox", &mailbox)?;
    let mid = message_id(&id)?;
    let ex = state.exchange();
    match action.as_str() {
        "requeue" => ex.requeue(&Principal::Admin, &mailbox, folder, mid).await?,
        "discard" => ex.discard(&Principal::Admin, &mailbox, folder, mid).await?,
        _ => {
            return Err(PageError(
                StatusCode::NOT_FOUND,
                "no such action".to_owned(),
            ));
        }
    }
    Ok(back_to(folder.as_str(), &format!("message {id} {action}d")))
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

#[derive(Template)]
#[template(path = "alerts.html")]
struct AlertsPage {
    layout: Layout,
    alerts: Vec<AlertRow>,
}

/// `GET /admin/alerts`.
pub async fn alerts(
    State(state): State<AppState>,
    session: AdminSession,
    Query(q): Query<Notice>,
) -> PageResult {
    let page = AlertsPage {
        layout: Layout::new("Alerts", &session, q.notice),
        alerts: alert_rows(&state)?,
    };
    Ok(render(&page))
}

/// `POST /admin/alerts/{id}/ack`.
pub async fn acknowledge(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath(id): ApiPath<String>,
    Form(form): Form<MessageAction>,
) -> PageResult {
    if let Err(r) = session.check_csrf(&form.csrf) {
        return Ok(r.into_response());
    }
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let book_id = id.clone();
    let result = tokio::task::spawn_blocking(move || state.alerts().acknowledge(&book_id, &now))
        .await
        .map_err(|e| PageError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    match result {
        Ok(()) => {
            tracing::info!(target: "estafeta::event", alert = id, "alert acknowledged");
            Ok(Redirect::to("/admin/alerts?notice=acknowledged").into_response())
        }
        Err(crate::alerts::AlertError::Unknown(_)) => {
            Err(PageError(StatusCode::NOT_FOUND, format!("no alert {id}")))
        }
        Err(e) => Err(PageError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
    }
}

/// The event log filter, as typed into the form.
#[derive(Debug, Default, Deserialize)]
pub struct EventQuery {
    /// Database id.
    #[serde(default)]
    pub db: String,
    /// Device id.
    #[serde(default)]
    pub device: String,
    /// Least severity: `ERROR`, `WARN`, `INFO`, `DEBUG`.
    #[serde(default)]
    pub level: String,
    /// From (RFC 3339).
    #[serde(default)]
    pub since: String,
    /// Until (RFC 3339).
    #[serde(default)]
    pub until: String,
}

impl EventQuery {
    fn filter(&self) -> Result<EventFilter, String> {
        let text = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_owned());
        let time = |s: &str, what: &str| -> Result<_, String> {
            text(s)
                .map(|t| {
                    chrono::DateTime::parse_from_rfc3339(&t)
                        .map(|d| d.with_timezone(&chrono::Utc))
                        .map_err(|e| format!("{what}: {e} (write it like 2026-11-25T10:00:00Z)"))
                })
                .transpose()
        };
        Ok(EventFilter {
            db: text(&self.db),
            device: text(&self.device),
            level: text(&self.level)
                .map(|l| l.parse().map_err(|_| format!("unknown level {l:?}")))
                .transpose()?,
            since: time(&self.since, "since")?,
            until: time(&self.until, "until")?,
        })
    }
}

struct EventRow {
    ts: String,
    level: String,
    target: String,
    text: String,
    db: String,
    device: String,
    process: String,
    message: String,
    fields: String,
}

#[derive(Template)]
#[template(path = "events.html")]
struct EventsPage {
    layout: Layout,
    q: EventQuery,
    levels: [&'static str; 4],
    error: Option<String>,
    rows: Vec<EventRow>,
}

/// `GET /admin/events`: the event log, newest first, filtered.
pub async fn events(
    State(state): State<AppState>,
    session: AdminSession,
    Query(q): Query<EventQuery>,
) -> PageResult {
    let (rows, error) = match q.filter() {
        Err(e) => (Vec::new(), Some(e)),
        Ok(filter) => {
            let dir = events_dir(state.exchange().data_dir());
            let found =
                tokio::task::spawn_blocking(move || read_events(&dir, &filter, EVENTS_SHOWN))
                    .await
                    .map_err(|e| PageError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
            let rows = found
                .into_iter()
                .map(|e| EventRow {
                    ts: e.ts,
                    level: e.level,
                    target: e.target,
                    text: e.text,
                    db: e.db.unwrap_or_default(),
                    device: e.device.unwrap_or_default(),
                    process: e.process.unwrap_or_default(),
                    message: e.message.unwrap_or_default(),
                    fields: if e.fields.is_empty() {
                        String::new()
                    } else {
                        serde_json::Value::Object(e.fields).to_string()
                    },
                })
                .collect();
            (rows, None)
        }
    };
    let page = EventsPage {
        layout: Layout::new("Event log", &session, None),
        q,
        levels: ["ERROR", "WARN", "INFO", "DEBUG"],
        error,
        rows,
    };
    Ok(render(&page))
}

#[derive(Template)]
#[template(path = "queues.html")]
struct QueuesPage {
    layout: Layout,
}

/// `GET /admin/queues`: send queues and scheduled deliveries (not part of
/// this server yet).
pub async fn queues(session: AdminSession) -> PageResult {
    Ok(render(&QueuesPage {
        layout: Layout::new("Queues", &session, None),
    }))
}
