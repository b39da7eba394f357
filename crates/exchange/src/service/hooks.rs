//! The session hooks of database sessions: a passed deadline (finalize)
//! and start-up processing (first load after a restart) are events of the
//! process lifecycle, carried out by [`Interpreter::drive_hook`].

use super::drive::Interpreter;
use super::lifecycle::{Event, RETRY};
use super::parts::Parts;
use super::records::DbRecord;
use crate::Id;
use estafeta_session::{BoxFuture, Finalize, Hooks, SessionData, Step};
use std::sync::Weak;

pub(crate) struct ExchangeHooks {
    /// Weak: the parts own the engine, which owns the hooks.
    pub(crate) parts: Weak<Parts>,
}

impl ExchangeHooks {
    /// Carry out `event` on the session, in `step` (see
    /// [`Interpreter::drive_hook`]); on failure it is tried again after [`RETRY`].
    async fn handle(
        &self,
        key: &Id,
        s: &mut SessionData<DbRecord>,
        step: Option<&mut dyn Step>,
        event: Event,
    ) -> Finalize {
        let Some(parts) = self.parts.upgrade() else {
            return Finalize::Keep;
        };
        wait_started(&parts.phase).await;
        let what = match event {
            Event::Recover => "start-up processing",
            _ => "process deadline handling",
        };
        if let Err(e) = Interpreter::of(&parts)
            .drive_hook(key, s, step, event)
            .await
        {
            tracing::error!(db = %key, error = %e, "{what} failed; retrying");
            s.set_expires_at(Some(parts.clock.now().after(RETRY)));
        }
        Finalize::Keep
    }
}

/// Waits until start-up processing has begun (`phase` says so): a
/// deadline that passed while the server was down is acted on (a process
/// put in doubt, its alert raised) only once start-up processing has made
/// the mailboxes.
async fn wait_started(phase: &tokio::sync::watch::Sender<super::Phase>) {
    // Err only when the sender is gone, i.e. never while the parts live.
    let _ = phase.subscribe().wait_for(|phase| phase.hooks_run()).await;
}

impl Hooks<Id, DbRecord> for ExchangeHooks {
    fn finalize<'a>(
        &'a self,
        key: &'a Id,
        s: &'a mut SessionData<DbRecord>,
        step: Option<&'a mut dyn Step>,
    ) -> BoxFuture<'a, Finalize> {
        Box::pin(self.handle(key, s, step, Event::Deadline))
    }

    /// A database's session ended: its processes leave the list.
    fn end(&self, key: &Id, _state: &DbRecord) {
        if let Some(parts) = self.parts.upgrade()
            && let Some(tally) = &parts.process_tally
        {
            tally.forget(key);
        }
    }

    fn first_load<'a>(
        &'a self,
        key: &'a Id,
        s: &'a mut SessionData<DbRecord>,
    ) -> BoxFuture<'a, Finalize> {
        Box::pin(self.handle(key, s, None, Event::Recover))
    }
}
