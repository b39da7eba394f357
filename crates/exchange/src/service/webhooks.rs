//! Webhooks and arrivals: setting a recipient's webhook (admin), telling
//! the [`PushSink`] of messages that landed in a `Messages` with one, and
//! moving webhooks out of session records where an earlier version kept
//! them (see [`super::push`] for why the registry keeps them).

use super::admin::admin;
use super::core::Core;
use super::error::ExchangeError;
use super::push::{PushSink, RecipientKind, check_url};
use crate::Id;
use crate::store::{Folder, Location};
use crate::tenancy::{Kind, Principal, Registry, Role};

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

impl Core {
    /// [`arrived`] with the core's registry and sink.
    pub(crate) fn arrived(&self, recipient: &Id) {
        arrived(&self.registry, self.push.as_ref(), recipient);
    }

    /// The webhook of `recipient`, if it has one.
    pub(crate) fn webhook(&self, recipient: &Id) -> Option<(RecipientKind, String)> {
        self.registry.webhook(recipient)
    }

    /// Sets (or with `None` clears) the webhook of a database or device,
    /// durably, in the registry. 404 if `id` is not one of `kind`; 400 for
    /// a bad URL (nothing changes then).
    pub(crate) async fn set_webhook(
        &self,
        kind: RecipientKind,
        id: &Id,
        url: Option<String>,
    ) -> Result<Option<String>, ExchangeError> {
        let found = self.registry.endpoint(id).map(|e| match e.role {
            Role::Database => RecipientKind::Database,
            Role::Device { .. } => RecipientKind::Device,
        });
        if found != Some(kind) {
            return Err(ExchangeError::not_found(format!(
                "no {} {id}",
                kind.as_str()
            )));
        }
        if let Some(u) = &url {
            check_url(u)?;
        }
        self.registry
            .set_webhook(kind, id.clone(), url.clone())
            .await?;
        tracing::info!(target: "estafeta::event", recipient = %id, kind = kind.as_str(), webhook = url.as_deref().unwrap_or("-"), "webhook set");
        Ok(url)
    }

    /// After a restart, every recipient with a webhook and messages waiting
    /// in its `Messages` is pushed again: an arrival whose push was not yet
    /// scheduled durably when the server stopped is still announced (at
    /// least once; a recipient may get one notification more).
    pub(crate) async fn push_waiting(&self) {
        for id in self.registry.hooked() {
            let messages = Location::new(id.clone(), Folder::Messages);
            match self.store.count(&messages).await {
                Ok(waiting) if waiting > 0 => self.arrived(&id),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(recipient = %id, error = %e, "start-up push: listing Messages failed")
                }
            }
        }
    }

    /// Moves into the registry the webhooks an earlier version kept in its
    /// recipients' session records (start-up processing; run again, it
    /// finds none). A recipient whose webhook the registry already holds
    /// keeps that one: it was set since, through the admin API. The
    /// record's copy is cleared once the registry has the webhook durably,
    /// so a crash midway moves the rest at the next start. How many moved.
    pub(crate) async fn adopt_session_webhooks(&self) -> Result<usize, ExchangeError> {
        let mut moved = 0;
        for e in self.registry.databases() {
            let db = &self.sessions.db;
            moved += usize::from(
                self.adopt_webhook(db, e.id, Kind::Database, |r| &mut r.webhook)
                    .await?,
            );
        }
        for e in self.registry.devices() {
            let device = &self.sessions.device;
            moved += usize::from(
                self.adopt_webhook(device, e.id, Kind::Device, |r| &mut r.webhook)
                    .await?,
            );
        }
        Ok(moved)
    }

    /// [`adopt_session_webhooks`](Self::adopt_session_webhooks) for one
    /// recipient of `engine`, whose record keeps the webhook at `field`
    /// (read without holding the session; held only to clear one found):
    /// whether its record held one.
    async fn adopt_webhook<S: estafeta_session::State + Clone>(
        &self,
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
        if self.registry.webhook(&id).is_none() {
            self.registry
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
}

impl super::Exchange {
    /// Admin: set (or with `None` clear) the webhook of a database or a
    /// device; the stored value. 403 for a non-admin, 404 for an unknown
    /// id, 400 for a bad URL.
    pub async fn set_webhook(
        &self,
        who: &Principal,
        kind: RecipientKind,
        id: Id,
        url: Option<String>,
    ) -> Result<Option<String>, ExchangeError> {
        admin(who)?;
        self.detached(move |core| async move { core.set_webhook(kind, &id, url).await })
            .await
    }

    /// The webhook of a database or device, with its kind, as of the
    /// registry's last refresh: [`current_webhook`](Self::current_webhook)
    /// reads what other servers changed first.
    pub fn webhook(&self, recipient: &Id) -> Option<(RecipientKind, String)> {
        self.core.webhook(recipient)
    }

    /// [`webhook`](Self::webhook) once the registry holds what every
    /// server changed (a shared registry store: one read of its change
    /// counter, and a reload when it moved). A store that cannot be read is
    /// an error (503).
    pub async fn current_webhook(
        &self,
        recipient: &Id,
    ) -> Result<Option<(RecipientKind, String)>, ExchangeError> {
        self.core.registry.refresh().await?;
        Ok(self.core.webhook(recipient))
    }
}
