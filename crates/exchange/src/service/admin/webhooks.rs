//! Admin: a database's or device's webhook, set in the registry (which
//! every server's copy of it holds; see `push.rs`).

use super::super::Exchange;
use super::super::error::ExchangeError;
use super::super::push::{RecipientKind, check_url};
use super::admin;
use crate::Id;
use crate::tenancy::{Principal, Registry, Role};

/// Sets (or with `None` clears) the webhook of a database or device,
/// durably, in `registry`. 404 if `id` is not one of `kind`; 400 for a bad
/// URL (nothing changes then).
async fn set_webhook(
    registry: &Registry,
    kind: RecipientKind,
    id: &Id,
    url: Option<String>,
) -> Result<Option<String>, ExchangeError> {
    let found = registry.endpoint(id).map(|e| match e.role {
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
    registry.set_webhook(kind, id.clone(), url.clone()).await?;
    tracing::info!(target: "estafeta::event", recipient = %id, kind = kind.as_str(), webhook = url.as_deref().unwrap_or("-"), "webhook set");
    Ok(url)
}

impl Exchange {
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
        self.detached(
            move |ex| async move { set_webhook(&ex.parts.registry, kind, &id, url).await },
        )
        .await
    }

    /// The webhook of a database or device, with its kind, as of the
    /// registry's last refresh: [`current_webhook`](Self::current_webhook)
    /// reads what other servers changed first.
    pub fn webhook(&self, recipient: &Id) -> Option<(RecipientKind, String)> {
        self.parts.registry.webhook(recipient)
    }

    /// [`webhook`](Self::webhook) once the registry holds what every
    /// server changed (a shared registry store: one read of its change
    /// counter, and a reload when it moved). A store that cannot be read is
    /// an error (503).
    pub async fn current_webhook(
        &self,
        recipient: &Id,
    ) -> Result<Option<(RecipientKind, String)>, ExchangeError> {
        self.parts.registry.refresh().await?;
        Ok(self.parts.registry.webhook(recipient))
    }
}
