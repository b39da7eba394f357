//! The session hooks: process deadlines (finalize) and start-up processing
//! (first load after a restart) for database sessions.

use super::core::{Core, count};
use super::error::ExchangeError;
use super::state::Record;
use crate::wire::ProcessState;
use estafeta_session::{BoxFuture, Finalize, Hooks, SessionData};
use std::sync::Weak;
use std::time::Duration;

/// How long before a failed deadline action is tried again.
const RETRY: Duration = Duration::from_secs(60);

pub(crate) struct ExchangeHooks {
    /// Weak: the core owns the engine, which owns the hooks.
    pub(crate) core: Weak<Core>,
}

impl ExchangeHooks {
    /// A database session's deadline passed: the live process timed out
    /// (STARTED), is in doubt (READY_TO_COMMIT), or has moves to retry
    /// (CLEANUP, FAILED).
    async fn deadline(core: &Core, s: &mut SessionData<Record>) -> Result<(), ExchangeError> {
        let state = s.state().process.as_ref().map(|p| p.state);
        let mut next = None;
        match state {
            Some(ProcessState::Started) => {
                let rec = s.persistent_mut();
                if let Some(mut p) = rec.process.take() {
                    core.drop_preparing(&mut p).await;
                    tracing::warn!(target: "estafeta::event", process = %p.id, db = %p.db, "STARTED process timed out");
                    core.finish(rec, p, ProcessState::TimedOut).await?;
                }
            }
            Some(ProcessState::ReadyToCommit) => core.go_in_doubt(s.persistent_mut()).await?,
            Some(ProcessState::Cleanup | ProcessState::Failed) => {
                next = core.run_pending(s.persistent_mut()).await?.1;
            }
            _ => {}
        }
        s.set_expires_at(next);
        Ok(())
    }

    /// Start-up processing of one database session saved by an earlier run.
    async fn recover(core: &Core, s: &mut SessionData<Record>) -> Result<(), ExchangeError> {
        let state = s.state().process.as_ref().map(|p| (p.state, p.started_at));
        let mut next = s.expires_at();
        match state {
            Some((ProcessState::Started, started)) => {
                // A prepare that was under way when the server died was
                // never answered: its reply files go.
                if let Some(p) = s.persistent_mut().process.as_mut() {
                    core.drop_preparing(p).await;
                }
                let deadline = started
                    .as_millis()
                    .saturating_add(millis(core.config.started_timeout));
                if deadline <= core.now().as_millis() {
                    count(&core.recovery.timed_out);
                    let rec = s.persistent_mut();
                    if let Some(p) = rec.process.take() {
                        core.finish(rec, p, ProcessState::TimedOut).await?;
                    }
                    next = None;
                }
            }
            Some((ProcessState::ReadyToCommit, _)) => {
                count(&core.recovery.in_doubt);
                core.go_in_doubt(s.persistent_mut()).await?;
                next = None;
            }
            Some((ProcessState::Cleanup | ProcessState::Failed, _)) => {
                count(&core.recovery.cleanups);
                next = core.run_pending(s.persistent_mut()).await?.1;
            }
            _ => {}
        }
        if s.state().in_doubt.iter().any(|p| p.target.is_some()) {
            core.replay_in_doubt(s.persistent_mut()).await?;
        }
        s.set_expires_at(next);
        Ok(())
    }
}

impl Core {
    /// Waits until start-up processing has begun: a deadline that passed
    /// while the server was down is acted on (a process put in doubt, its
    /// alert raised) only once the alert sink is in place.
    async fn wait_started(&self) {
        // Err only when the sender is gone, i.e. never while `self` lives.
        let _ = self.started.subscribe().wait_for(|started| *started).await;
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Hooks<String, Record> for ExchangeHooks {
    fn finalize<'a>(
        &'a self,
        key: &'a String,
        s: &'a mut SessionData<Record>,
    ) -> BoxFuture<'a, Finalize> {
        Box::pin(async move {
            if !key.starts_with("db/") {
                return Finalize::End; // process records past retention
            }
            let Some(core) = self.core.upgrade() else {
                return Finalize::Keep;
            };
            core.wait_started().await;
            if let Err(e) = Self::deadline(&core, s).await {
                tracing::error!(key, error = %e, "process deadline handling failed; retrying");
                s.set_expires_at(Some(core.session_now().after(RETRY)));
            }
            Finalize::Keep
        })
    }

    fn first_load<'a>(
        &'a self,
        key: &'a String,
        s: &'a mut SessionData<Record>,
    ) -> BoxFuture<'a, Finalize> {
        Box::pin(async move {
            if !key.starts_with("db/") {
                return Finalize::Keep;
            }
            let Some(core) = self.core.upgrade() else {
                return Finalize::Keep;
            };
            core.wait_started().await;
            if let Err(e) = Self::recover(&core, s).await {
                tracing::error!(key, error = %e, "start-up processing failed; retrying");
                s.set_expires_at(Some(core.session_now().after(RETRY)));
            }
            Finalize::Keep
        })
    }
}
