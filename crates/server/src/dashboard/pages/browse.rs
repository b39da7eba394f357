//! `/admin/browse/{folder}`: the `Unknown` and `Error` browsers: a page of
//! the folder's messages over every mailbox (or one mailbox, searched by
//! id), show one message (`…/{mailbox}/{id}`), requeue or discard it
//! (`…/{mailbox}/{id}/{action}`), or several or all at once (`…/bulk`).
//! A discard deletes for good, so it is first shown on a confirmation page
//! and done only when that page's form is sent (`confirm=yes`).

use askama::Template;
use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use estafeta_exchange::mailbox::{Folder, MailboxKind};
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::{Exchange, Id, MessageId};
use serde::Deserialize;

use super::{
    ConfirmPage, Layout, ListQuery, PAGE_ROWS, PageError, PageResult, query_value, render,
};
use crate::dashboard::auth::AdminSession;
use crate::extract::{ApiPath, path_folder, path_id};
use crate::state::AppState;

/// The most messages one "all of the folder" action goes through; the
/// rest waits for the next click, so that one request stays short.
pub const BULK_MOST: usize = 1000;

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
    held_by: Option<String>,
}

#[derive(Template)]
#[template(path = "browse.html")]
struct BrowsePage {
    layout: Layout,
    folder: &'static str,
    q: String,
    total: u64,
    first: usize,
    in_doubt: Vec<DoubtRow>,
    files: Vec<FileRow>,
    prev: Option<String>,
    next: Option<String>,
    bulk_most: usize,
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

/// The mailboxes a browser page looks into, with whether each is a
/// database: the searched one, or those whose `folder` holds files (from
/// the store's running totals; every mailbox when it keeps none),
/// databases first.
async fn mailboxes(
    ex: &Exchange,
    search: &str,
    folder: Folder,
) -> Result<Vec<(bool, Id)>, PageError> {
    let admin = Principal::Admin;
    if search.is_empty()
        && let Some(holding) = ex.holding(&admin, folder).await?
    {
        return Ok(holding
            .into_iter()
            .map(|(kind, id)| (kind == MailboxKind::Database, id))
            .collect());
    }
    let (dbs, devs) = ex.mailbox_ids(&admin)?;
    if search.is_empty() {
        let dbs = dbs.into_iter().map(|id| (true, id));
        return Ok(dbs.chain(devs.into_iter().map(|id| (false, id))).collect());
    }
    let id = path_id("mailbox", search)?;
    if dbs.contains(&id) {
        return Ok(vec![(true, id)]);
    }
    if devs.contains(&id) {
        return Ok(vec![(false, id)]);
    }
    Err(PageError(
        StatusCode::NOT_FOUND,
        format!("no database or device {id}"),
    ))
}

/// `GET /admin/browse/{folder}?q=&page=`: a page of the folder's messages
/// over every mailbox (or the one searched), the processes in doubt
/// holding some, and their settle actions.
pub async fn browse(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath(folder): ApiPath<String>,
    Query(q): Query<ListQuery>,
) -> PageResult {
    let folder = browsable(&folder)?;
    let ex = state.exchange();
    let admin = Principal::Admin;
    let search = q.search().to_owned();
    let boxes = mailboxes(ex, &search, folder).await?;
    // A process in doubt holds its database's messages in `Unknown`: only
    // a database with files there can have one.
    let doubtful = if folder == Folder::Unknown {
        boxes.clone()
    } else {
        mailboxes(ex, &search, Folder::Unknown).await?
    };
    let mut in_doubt = Vec::new();
    let mut holder = std::collections::HashMap::new();
    for (_, db) in doubtful.iter().filter(|(is_db, _)| *is_db) {
        let (held_here, _) = ex.folder_page(&admin, db, Folder::Unknown, 0, 0).await?;
        if held_here == 0 {
            continue;
        }
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
    let first = q.page.saturating_mul(PAGE_ROWS);
    let mut skip = first;
    let mut total = 0u64;
    let mut files = Vec::new();
    for (_, id) in &boxes {
        let (n, _) = ex.folder_page(&admin, id, folder, 0, 0).await?;
        total += n;
        if n == 0 || files.len() == PAGE_ROWS {
            continue;
        }
        if (skip as u64) >= n {
            skip -= n as usize;
            continue;
        }
        let (_, names) = ex
            .folder_page(&admin, id, folder, skip, PAGE_ROWS - files.len())
            .await?;
        skip = 0;
        files.extend(names.into_iter().map(|f| FileRow {
            mailbox: id.to_string(),
            id: f.id.to_string(),
            from: f.from.to_string(),
            to: f.to.to_string(),
            created: f.created_at.to_string(),
            held_by: holder.get(&f.id).cloned(),
        }));
    }
    let link = |page: usize| format!("?q={}&page={page}", query_value(&search));
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
        q: search.clone(),
        total,
        first,
        in_doubt,
        prev: (q.page > 0).then(|| link(q.page - 1)),
        next: ((first + PAGE_ROWS) as u64 <= total.saturating_sub(1)).then(|| link(q.page + 1)),
        files,
        bulk_most: BULK_MOST,
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

/// A redirect to the browser of `folder` showing `notice`.
pub(super) fn back_to(folder: &str, notice: &str) -> Response {
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

/// The form of one message's action.
#[derive(Debug, Deserialize)]
pub struct ActionForm {
    /// The session's CSRF token.
    #[serde(default)]
    pub csrf: String,
    /// `yes` once the operator confirmed a discard.
    #[serde(default)]
    pub confirm: String,
}

/// `POST /admin/browse/{folder}/{mailbox}/{id}/{action}`: `requeue` puts
/// the message into its recipient's `Messages`; `discard` deletes it, once
/// confirmed.
pub async fn message_action(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath((folder, mailbox, id, action)): ApiPath<(String, String, String, String)>,
    Form(form): Form<ActionForm>,
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
        "discard" if form.confirm != "yes" => {
            return Ok(render(&ConfirmPage {
                layout: Layout::new("Confirm the discard", &session, None),
                question: format!(
                    "Discard message {id} of {mailbox}/{}? The file is deleted for good.",
                    folder.as_str()
                ),
                button: "Yes, discard",
                action: format!("/admin/browse/{}/{mailbox}/{id}/discard", folder.as_str()),
                back: format!("/admin/browse/{}", folder.as_str()),
                fields: Vec::new(),
                offer_force: false,
            }));
        }
        "discard" => ex.discard(&Principal::Admin, &mailbox, folder, mid).await?,
        _ => {
            return Err(PageError(
                StatusCode::NOT_FOUND,
                "no such action".to_owned(),
            ));
        }
    }
    Ok(back_to(
        folder.as_str(),
        &format!("message {id} {}", past(&action)),
    ))
}

/// What the notice after `action` says was done.
fn past(action: &str) -> &'static str {
    if action == "requeue" {
        "requeued"
    } else {
        "discarded"
    }
}

/// What a bulk form names: `m` fields (`<mailbox>/<message id>`, one per
/// ticked message), or `all=yes` for every message of the folder (of the
/// mailbox in `q` when given).
enum Chosen {
    Some(Vec<(Id, MessageId)>),
    All(String),
}

/// `POST /admin/browse/{folder}/bulk`: `action=requeue` or
/// `action=discard` on the ticked messages or on all of the folder (at
/// most [`BULK_MOST`] per request). A discard shows a confirmation page
/// first. Messages held by a process in doubt are left alone and counted.
pub async fn bulk_action(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath(folder): ApiPath<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> PageResult {
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    };
    if let Err(r) = session.check_csrf(get("csrf")) {
        return Ok(r.into_response());
    }
    let folder = browsable(&folder)?;
    let action = get("action");
    if action != "requeue" && action != "discard" {
        return Err(PageError(
            StatusCode::BAD_REQUEST,
            "action is requeue or discard".to_owned(),
        ));
    }
    let chosen = if get("all") == "yes" {
        Chosen::All(get("q").trim().to_owned())
    } else {
        let mut picked = Vec::new();
        for (_, v) in fields.iter().filter(|(k, _)| k == "m") {
            let (mailbox, id) = v
                .split_once('/')
                .ok_or_else(|| PageError(StatusCode::BAD_REQUEST, format!("bad message {v:?}")))?;
            picked.push((path_id("mailbox", mailbox)?, message_id(id)?));
        }
        if picked.is_empty() {
            return Ok(back_to(folder.as_str(), "no message was ticked"));
        }
        Chosen::Some(picked)
    };
    let what = match &chosen {
        Chosen::Some(p) => format!("{} ticked messages of {}", p.len(), folder.as_str()),
        Chosen::All(q) if q.is_empty() => format!("every message of {}", folder.as_str()),
        Chosen::All(q) => format!("every message of {q}/{}", folder.as_str()),
    };
    if action == "discard" && get("confirm") != "yes" {
        let fields = fields
            .iter()
            .filter(|(k, _)| k != "csrf" && k != "confirm")
            .cloned()
            .collect();
        return Ok(render(&ConfirmPage {
            layout: Layout::new("Confirm the discard", &session, None),
            question: format!("Discard {what}? The files are deleted for good."),
            button: "Yes, discard",
            action: format!("/admin/browse/{}/bulk", folder.as_str()),
            back: format!("/admin/browse/{}", folder.as_str()),
            fields,
            offer_force: false,
        }));
    }
    let ex = state.exchange();
    let admin = Principal::Admin;
    let targets = match chosen {
        Chosen::Some(p) => p,
        Chosen::All(q) => {
            let mut all = Vec::new();
            for (_, id) in mailboxes(ex, &q, folder).await? {
                let room = BULK_MOST - all.len();
                if room == 0 {
                    break;
                }
                let (_, names) = ex.folder_page(&admin, &id, folder, 0, room).await?;
                all.extend(names.into_iter().map(|n| (id.clone(), n.id)));
            }
            all
        }
    };
    let (mut done, mut refused) = (0usize, 0usize);
    for (mailbox, id) in &targets {
        let r = if action == "requeue" {
            ex.requeue(&admin, mailbox, folder, *id).await
        } else {
            ex.discard(&admin, mailbox, folder, *id).await
        };
        match r {
            Ok(()) => done += 1,
            Err(e) => {
                tracing::info!(target: "estafeta::event", mailbox = %mailbox, message = %id, error = %e, "bulk {action} left a message alone");
                refused += 1;
            }
        }
    }
    tracing::warn!(target: "estafeta::event", folder = folder.as_str(), done, refused, "the operator's bulk {action} on {what}");
    Ok(back_to(
        folder.as_str(),
        &format!("{} {done} of {what}, {refused} refused", past(action)),
    ))
}
