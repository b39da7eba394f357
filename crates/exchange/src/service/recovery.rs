//! Start-up processing and retention.

use super::Exchange;
use super::alerts::AlertKind;
use super::arrivals::{adopt_session_webhooks, push_waiting};
use super::device::{DeviceCalls, with_keys};
use super::error::ExchangeError;
use super::{RecoveryReport, Tidied};
use crate::store::{Folder, Location, Op};
use crate::tenancy::Endpoint;
use crate::{Id, MessageId, Timestamp};
use estafeta_session::storage::Step;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// Expired idempotency keys removed per write of the key store.
const KEY_SWEEP_BATCH: usize = 10_000;
/// Mailboxes checked (made if missing) per call to the store at start-up.
const TIDY_BATCH: usize = 10_000;
impl Exchange {
    /// Start-up processing (`docs/protocol.md`, "Crash and start-up
    /// recovery"): timed-out STARTED removed,
    /// CLEANUP finished, READY_TO_COMMIT put in doubt, orphans in `Prepared`
    /// moved to `Unknown` (removed with a shared store). Protocol calls answer 503
    /// (`not_ready`) until it has run. Its cost grows with the databases
    /// and what they have pending, not with the devices. After a crash,
    /// the messages waiting cost a read of each database's queue folder
    /// (with the file store, for the uploads a crash left unpublished, a
    /// look a clean stop's marker spares: see
    /// [`MessageUpkeep::unconfirmed_written`](crate::store::MessageUpkeep::unconfirmed_written)
    /// and [`publish_written`](crate::store::MessageUpkeep::publish_written)),
    /// and each keyed upload a crash left unpublished, a look at its
    /// sender's record.
    /// What can wait is left to [`Exchange::tidy`].
    pub async fn recover(&self) -> Result<RecoveryReport, ExchangeError> {
        // Before any session hook may run (a first load repeats the moves
        // its processes recorded, by name): every acknowledged upload is
        // under its name, a keyed one if its key was saved.
        let devices = DeviceCalls::of(&self.parts);
        for db in self.parts.registry.databases() {
            let written = self.parts.store.unconfirmed_written(&db.id).await?;
            let saved = devices.saved_uploads(&written).await?;
            self.parts.store.publish_written(&db.id, &saved).await?;
        }
        self.parts
            .phase
            .send_modify(|phase| *phase = phase.recovering());
        let mut report = RecoveryReport::default();
        for db in self.parts.registry.databases() {
            report.databases += 1;
            report.orphans += self.recover_database(&db.id).await?;
        }
        report.timed_out = self.parts.recovery.timed_out.load(Ordering::Relaxed);
        report.cleanups_finished = self.parts.recovery.cleanups.load(Ordering::Relaxed);
        report.in_doubt = self.parts.recovery.in_doubt.load(Ordering::Relaxed);
        self.parts
            .phase
            .send_modify(|phase| *phase = phase.recovered());
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
        let Some(mut g) = self.parts.sessions.db.get(db.clone(), true).await? else {
            return Ok(0);
        };
        let referenced = g.state().names_in_prepared();
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
            let text = format!(
                "{cleared} orphaned files in Prepared of database {db} with no process; moved to Unknown"
            );
            let alerting = &self.parts.alerting;
            alerting.raise_now(AlertKind::Orphans, db, text).await;
        }
        Ok(cleared)
    }

    /// Moves the messages in the `Prepared` of database `db` that are not
    /// in `referenced` (what its record names: see
    /// [`DbRecord::names_in_prepared`]) to `Unknown`, in `step` where the
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
        let orphans = self.parts.store.orphans(db, referenced).await?;
        if orphans.is_empty() {
            return Ok(0);
        }
        let prepared = Location::new(db.clone(), Folder::Prepared);
        let unknown = Location::new(db.clone(), Folder::Unknown);
        let moves: Vec<_> = orphans
            .iter()
            .map(|n| Op::Move {
                name: n.clone(),
                from: prepared.clone(),
                to: unknown.clone(),
            })
            .collect();
        for r in self.parts.store.apply(step, &moves).await.results {
            r?;
        }
        Ok(orphans.len())
    }

    /// The start-up work that can wait until after [`Exchange::recover`]
    /// (run it once, beside serving): webhooks kept in session records
    /// moved into the registry and the recipients with messages waiting
    /// pushed, temporary files of writes a crash
    /// interrupted removed, every mailbox checked, expired keys and files
    /// removed (a first retention sweep).
    pub async fn tidy(&self) -> Result<Tidied, ExchangeError> {
        let parts = &self.parts;
        let mut tidied = Tidied::default();
        let ids: Vec<Id> = self.endpoints().map(|e| e.id).collect();
        for chunk in ids.chunks(TIDY_BATCH) {
            let made = parts.store.create_mailboxes(chunk).await;
            for (id, made) in chunk.iter().zip(made) {
                let checked = match made {
                    Ok(()) => parts.store.recover_writes(id).await,
                    Err(e) => Err(e),
                };
                if let Err(error) = checked {
                    tidied.unusable += 1;
                    tracing::error!(mailbox = %id, %error, "a mailbox cannot be used or cleared");
                }
            }
        }
        tidied.webhooks_moved = adopt_session_webhooks(&parts.registry, &parts.sessions).await?;
        push_waiting(&parts.registry, parts.push.as_ref(), &parts.store).await;
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
            let n = with_keys(&self.parts.keys, move |keys| {
                keys.expire(now, KEY_SWEEP_BATCH)
            })
            .await?;
            expired += n;
            if n < KEY_SWEEP_BATCH {
                return Ok(expired);
            }
        }
    }

    /// Remove files older than the retention period (never one a live
    /// process refers to); the number removed.
    pub async fn retention_sweep(&self) -> Result<usize, ExchangeError> {
        self.expire_keys().await?;
        self.remove_expired_files().await
    }

    /// The files part of [`retention_sweep`](Self::retention_sweep).
    async fn remove_expired_files(&self) -> Result<usize, ExchangeError> {
        let cutoff_ms = self.now().as_millis().saturating_sub(
            i64::try_from(self.parts.config.retention.as_millis()).unwrap_or(i64::MAX),
        );
        let cutoff = Timestamp::from_millis(cutoff_ms);
        let mut removed = 0;
        for e in self.endpoints() {
            let g = self.parts.sessions.db.get(e.id.clone(), false).await?;
            let keep: HashSet<MessageId> = match &g {
                Some(g) => g.state().referenced().map(|n| n.id).collect(),
                None => HashSet::new(),
            };
            for folder in [
                Folder::Log,
                Folder::Prepared,
                Folder::Unknown,
                Folder::Error,
            ] {
                let at = Location::new(e.id.clone(), folder);
                removed += self
                    .parts
                    .store
                    .remove_older_than(&at, cutoff, &keep)
                    .await?;
            }
        }
        Ok(removed)
    }

    /// Every database and device, databases first.
    fn endpoints(&self) -> impl Iterator<Item = Endpoint> {
        let registry = &self.parts.registry;
        registry.databases().into_iter().chain(registry.devices())
    }
}
