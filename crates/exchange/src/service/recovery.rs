//! Start-up processing and retention.

use super::alerts::AlertKind;
use super::arrivals::{adopt_session_webhooks, push_waiting};
use super::core::Core;
use super::device::with_keys;
use super::error::ExchangeError;
use super::{RecoveryReport, Tidied};
use crate::store::{Folder, Op};
use crate::{Id, MessageId, Timestamp};
use estafeta_session::storage::Step;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// Expired idempotency keys removed per write of the key store.
const KEY_SWEEP_BATCH: usize = 10_000;
/// Mailboxes checked (made if missing) per call to the store at start-up.
const TIDY_BATCH: usize = 10_000;
impl Core {
    /// What must be done before serving, in time proportional to the
    /// databases and what they have pending, not to the devices or the
    /// files waiting: every database session is loaded, which runs the
    /// first-load hook on each (timeouts, CLEANUP, in doubt); then messages
    /// in `Prepared` that no process refers to (the store's orphans) are
    /// moved to `Unknown` and reported. What can wait runs after, in
    /// [`tidy`](Self::tidy).
    pub(crate) async fn recover(&self) -> Result<RecoveryReport, ExchangeError> {
        self.phase.send_modify(|phase| *phase = phase.recovering());
        let mut report = RecoveryReport::default();
        for db in self.registry.databases() {
            report.databases += 1;
            report.orphans += self.recover_database(&db.id).await?;
        }
        report.timed_out = self.recovery.timed_out.load(Ordering::Relaxed);
        report.cleanups_finished = self.recovery.cleanups.load(Ordering::Relaxed);
        report.in_doubt = self.recovery.in_doubt.load(Ordering::Relaxed);
        self.phase.send_modify(|phase| *phase = phase.recovered());
        tracing::info!(target: "estafeta::event", ?report, "start-up processing done");
        Ok(report)
    }

    /// Loads the session of database `db` (its first-load hook runs) and,
    /// holding it, clears the orphans of its `Prepared`
    /// ([`clear_orphans`](Self::clear_orphans)); how many there were.
    async fn recover_database(&self, db: &Id) -> Result<usize, ExchangeError> {
        // Held even for a database never used (its session, made for this
        // look, is dropped untouched at the release), so that no prepare of
        // this server or of another runs between the look and the moves.
        let Some(mut g) = self.sessions.db.get(db.clone(), true).await? else {
            return Ok(0);
        };
        let referenced = Core::names_in_prepared(g.state());
        // The harness's point: the record read, its key held, nothing moved.
        fail::fail_point!("recovery::orphans");
        let cleared = self.clear_orphans(db, &referenced, g.step()).await?;
        // With a shared store the moves commit here, with the step that
        // held the key: a server that lost it meanwhile moved nothing.
        g.release().await?;
        if cleared > 0 {
            tracing::error!(
                target: "estafeta::alert", db = %db, files = cleared,
                "orphaned files in Prepared with no process; moved to Unknown"
            );
            self.alerting
                .raise_now(
                AlertKind::Orphans,
                db,
                format!(
                    "{cleared} orphaned files in Prepared of database {db} with no process; moved to Unknown"
                ),
            )
            .await;
        }
        Ok(cleared)
    }

    /// Moves the messages in the `Prepared` of database `db` that are not
    /// in `referenced` (what its record names: see
    /// [`Core::names_in_prepared`]) to `Unknown`, in `step` where the
    /// session store is shared; the caller holds the database's session,
    /// so that no prepare stores replies meanwhile. How many there were.
    ///
    /// A prepare's reply names are saved before its replies appear (or,
    /// with a shared store, in the same transaction), so an orphan comes
    /// from outside the protocol (a failed removal, a hand-made file): it is
    /// left to the operator, with an alert (raised by the caller once the
    /// moves are durable).
    async fn clear_orphans(
        &self,
        db: &Id,
        referenced: &HashSet<MessageId>,
        step: Option<&mut dyn Step>,
    ) -> Result<usize, ExchangeError> {
        let orphans = self.store.orphans(db, referenced).await?;
        if orphans.is_empty() {
            return Ok(0);
        }
        let prepared = self.location(db, Folder::Prepared);
        let unknown = self.location(db, Folder::Unknown);
        let moves: Vec<_> = orphans
            .iter()
            .map(|n| Op::Move {
                name: n.clone(),
                from: prepared.clone(),
                to: unknown.clone(),
            })
            .collect();
        for r in self.store.apply(step, &moves).await.results {
            r?;
        }
        Ok(orphans.len())
    }

    /// Start-up work that can wait until the server is ready, run once
    /// after [`recover`](Self::recover), in time proportional to the
    /// mailboxes: webhooks kept in session records moved into the
    /// registry, then every
    /// recipient with a webhook and messages waiting pushed (arrivals
    /// before that are announced then); every mailbox checked for use and
    /// cleared of the temporary files that writes interrupted by a crash
    /// left (this run's writes are left alone; a mailbox that fails is
    /// logged and counted, and the others go on); then a retention sweep
    /// (expired keys and files).
    pub(crate) async fn tidy(&self) -> Result<Tidied, ExchangeError> {
        let mut tidied = Tidied::default();
        let ids: Vec<Id> = self
            .registry
            .databases()
            .into_iter()
            .chain(self.registry.devices())
            .map(|e| e.id)
            .collect();
        for chunk in ids.chunks(TIDY_BATCH) {
            let made = self.store.create_mailboxes(chunk).await;
            for (id, made) in chunk.iter().zip(made) {
                let checked = match made {
                    Ok(()) => self.store.recover_writes(id).await,
                    Err(e) => Err(e),
                };
                if let Err(error) = checked {
                    tidied.unusable += 1;
                    tracing::error!(mailbox = %id, %error, "a mailbox cannot be used or cleared");
                }
            }
        }
        tidied.webhooks_moved = adopt_session_webhooks(&self.registry, &self.sessions).await?;
        push_waiting(&self.registry, self.push.as_ref(), &self.store).await;
        tidied.expired_keys = self.expire_keys().await?;
        tidied.expired_files = self.remove_expired_files().await?;
        tracing::info!(target: "estafeta::event", ?tidied, "start-up tidying done");
        Ok(tidied)
    }

    /// Forget the idempotency keys past their expiry, in batches of
    /// [`KEY_SWEEP_BATCH`] (one write each, so a sweep never holds the key
    /// store for long); how many went.
    pub(crate) async fn expire_keys(&self) -> Result<usize, ExchangeError> {
        let mut expired = 0;
        loop {
            let now = self.now();
            let n = with_keys(&self.keys, move |keys| keys.expire(now, KEY_SWEEP_BATCH)).await?;
            expired += n;
            if n < KEY_SWEEP_BATCH {
                return Ok(expired);
            }
        }
    }

    /// Forget expired idempotency keys, then remove `Log`, `Prepared`,
    /// `Unknown` and `Error` messages older than the retention period,
    /// except those a live or in-doubt process refers to; how many files
    /// went.
    pub(crate) async fn retention_sweep(&self) -> Result<usize, ExchangeError> {
        self.expire_keys().await?;
        self.remove_expired_files().await
    }

    /// The files part of [`retention_sweep`](Self::retention_sweep).
    async fn remove_expired_files(&self) -> Result<usize, ExchangeError> {
        let cutoff_ms = self
            .now()
            .as_millis()
            .saturating_sub(i64::try_from(self.config.retention.as_millis()).unwrap_or(i64::MAX));
        let cutoff = Timestamp::from_millis(cutoff_ms);
        let mut removed = 0;
        for e in self
            .registry
            .databases()
            .into_iter()
            .chain(self.registry.devices())
        {
            let g = self.sessions.db.get(e.id.clone(), false).await?;
            let keep: HashSet<MessageId> = match &g {
                Some(g) => Core::referenced(g.state()).map(|n| n.id).collect(),
                None => HashSet::new(),
            };
            for folder in [
                Folder::Log,
                Folder::Prepared,
                Folder::Unknown,
                Folder::Error,
            ] {
                removed += self
                    .store
                    .remove_older_than(&self.location(&e.id, folder), cutoff, &keep)
                    .await?;
            }
        }
        Ok(removed)
    }
}
