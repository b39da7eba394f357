//! `/admin/browse/{folder}`: the `Unknown` and `Error` browsers: list,
//! show one message (`…/{mailbox}/{id}`), requeue or discard it
//! (`…/{mailbox}/{id}/{action}`).

use askama::Template;
use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use estafeta_exchange::MessageId;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::tenancy::Principal;

use super::{Layout, Notice, PageError, PageResult, render};
use crate::dashboard::auth::{AdminSession, CsrfForm};
use crate::extract::{ApiPath, path_folder, path_id};
use crate::state::AppState;

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

/// `POST /admin/browse/{folder}/{mailbox}/{id}/{action}`: `requeue` puts
/// the message into its recipient's `Messages`; `discard` deletes it.
pub async fn message_action(
    State(state): State<AppState>,
    session: AdminSession,
    ApiPath((folder, mailbox, id, action)): ApiPath<(String, String, String, String)>,
    Form(form): Form<CsrfForm>,
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
