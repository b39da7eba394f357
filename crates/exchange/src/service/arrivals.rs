//! Arrivals told to webhooks: telling the [`PushSink`] of messages that
//! landed in a `Messages` whose recipient has a webhook, again after a
//! restart, and moving webhooks out of session records where an earlier
//! version kept them (see [`super::push`] for why the registry keeps
//! them; setting one is an admin call, `admin/webhooks.rs`).

use super::error::ExchangeError;
use super::observer::Messages;
use super::push::PushSink;
use super::sessions::Sessions;
use crate::Id;
use crate::store::{Folder, Location};
use crate::tenancy::{Kind, Registry};

/// Messages are durably in `recipient`'s `Messages`: tell `push`, if the
/// recipient has a webhook in `registry`.
pub(crate) fn arrived(registry: &Registry, push: &dyn PushSink, recipient: &Id) {
    if let Some((kind, _)) = registry.webhook(recipient) {
        push.arrived(recipient, kind);
    }
}

/// [`arrived`] for each of `recipients`, from work that may run without
/// an authenticated call (which reads the registry's changes first): a
/// step run at a deadline, a scheduled message. What other servers
/// changed is read first, once, so that a webhook set through another
/// server is known (a store that cannot be read leaves the copy as it is,
/// and is logged); with `version`, the store's change counter read with
/// the lock of the step the work holds, the copy is brought up to that
/// instead (no read of its own when it is that recent).
pub(crate) async fn announce(
    registry: &Registry,
    push: &dyn PushSink,
    recipients: impl IntoIterator<Item = &Id>,
    version: Option<u64>,
) {
    let mut recipients = recipients.into_iter().peekable();
    if recipients.peek().is_none() {
        return;
    }
    let current = match version {
        Some(version) => registry.refresh_to(version).await,
        None => registry.refresh().await,
    };
    if let Err(e) = current {
        tracing::warn!(error = %e, "reading the registry's changes before a push failed; pushing as last read");
    }
    for recipient in recipients {
        arrived(registry, push, recipient);
    }
}

/// After a restart, every recipient with a webhook in `registry` and
/// messages waiting in its `Messages` in `store` is pushed again: an
/// arrival whose push was not yet scheduled durably when the server
/// stopped is still announced (at least once; a recipient may get one
/// notification more).
pub(crate) async fn push_waiting(registry: &Registry, push: &dyn PushSink, store: &Messages) {
    for id in registry.hooked() {
        let messages = Location::new(id.clone(), Folder::Messages);
        match store.count(&messages).await {
            Ok(waiting) if waiting > 0 => arrived(registry, push, &id),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(recipient = %id, error = %e, "start-up push: listing Messages failed")
            }
        }
    }
}

/// Moves into `registry` the webhooks an earlier version kept in its
/// recipients' session records of `sessions` (start-up processing; run
/// again, it finds none). A recipient whose webhook the registry already
/// holds keeps that one: it was set since, through the admin API. The
/// record's copy is cleared once the registry has the webhook durably, so
/// a crash midway moves the rest at the next start. How many moved.
pub(crate) async fn adopt_session_webhooks(
    registry: &Registry,
    sessions: &Sessions,
) -> Result<usize, ExchangeError> {
    let mut moved = 0;
    for e in registry.databases() {
        let db = &sessions.db;
        moved += usize::from(
            adopt_webhook(registry, db, e.id, Kind::Database, |r| &mut r.webhook).await?,
        );
    }
    for e in registry.devices() {
        let device = &sessions.device;
        moved += usize::from(
            adopt_webhook(registry, device, e.id, Kind::Device, |r| &mut r.webhook).await?,
        );
    }
    Ok(moved)
}

/// [`adopt_session_webhooks`] for one recipient of `engine`, whose record
/// keeps the webhook at `field` (read without holding the session; held
/// only to clear one found): whether its record held one.
async fn adopt_webhook<S: estafeta_session::State + Clone>(
    registry: &Registry,
    engine: &estafeta_session::Engine<Id, S>,
    id: Id,
    kind: Kind,
    field: impl Fn(&mut S) -> &mut Option<String>,
) -> Result<bool, ExchangeError> {
    let kept = match engine.get(id.clone(), false).await? {
        Some(g) => field(&mut g.state().clone()).take(),
        None => None,
    };
    let Some(url) = kept else {
        return Ok(false);
    };
    if registry.webhook(&id).is_none() {
        registry
            .set_webhook(kind, id.clone(), Some(url.clone()))
            .await?;
    }
    if let Some(mut g) = engine.get(id.clone(), true).await? {
        g.update(|s| {
            *field(s.persistent_mut()) = None;
            Ok::<_, ExchangeError>(())
        })
        .await?;
        g.release().await?;
    }
    tracing::info!(target: "estafeta::event", recipient = %id, kind = kind.as_str(), webhook = %url, "webhook moved from its session record into the registry");
    Ok(true)
}
