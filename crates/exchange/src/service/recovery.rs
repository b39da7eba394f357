//! Start-up processing and retention.

use super::RecoveryReport;
use super::alerts::AlertKind;
use super::core::Core;
use super::error::ExchangeError;
use crate::store::{Folder, Op};
use crate::{MessageId, Timestamp};
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// Expired idempotency keys removed per write of the key store.
const KEY_SWEEP_BATCH: usize = 10_000;
impl Core {
    /// Every mailbox is readied (what writes interrupted by a crash left is
    /// cleared); every database session is loaded, which runs the
    /// first-load hook on each (timeouts, CLEANUP, in doubt); then messages
    /// in `Prepared` that no process refers to (the store's orphans) are
    /// moved to `Unknown` and reported; then retention runs.
    pub(crate) async fn recover(&self) -> Result<RecoveryReport, ExchangeError> {
        self.phase.send_modify(|phase| *phase = phase.recovering());
        let mut report = RecoveryReport::default();
        for e in self
            .registry
            .databases()
            .into_iter()
            .chain(self.registry.devices())
        {
            self.store.create_mailbox(&e.id).await?;
            self.store.recover_writes(&e.id).await?;
        }
        for db in self.registry.databases() {
            report.databases += 1;
            let g = self.sessions.db.get(db.id.clone(), true).await?;
            let referenced: HashSet<MessageId> = match &g {
                Some(g) => Core::referenced(g.state()).map(|n| n.id).collect(),
                None => HashSet::new(),
            };
            let orphans = self.store.orphans(&db.id, &referenced).await?;
            if !orphans.is_empty() {
                tracing::error!(
                    target: "estafeta::alert", db = %db.id, files = orphans.len(),
                    "orphaned files in Prepared with no process; moved to Unknown"
                );
                self.raise_alert(
                    AlertKind::Orphans,
                    &db.id,
                    format!("{} orphaned files in Prepared of database {} with no process; moved to Unknown", orphans.len(), db.id),
                )
                .await;
                let (prepared, unknown) = (
                    self.location(&db.id, Folder::Prepared),
                    self.location(&db.id, Folder::Unknown),
                );
                let moves: Vec<_> = orphans
                    .iter()
                    .map(|n| Op::Move {
                        name: n.clone(),
                        from: prepared.clone(),
                        to: unknown.clone(),
                    })
                    .collect();
                for r in self.store.apply(&moves).await.results {
                    r?;
                }
                report.orphans += orphans.len();
            }
            drop(g);
        }
        report.timed_out = self.recovery.timed_out.load(Ordering::Relaxed);
        report.cleanups_finished = self.recovery.cleanups.load(Ordering::Relaxed);
        report.in_doubt = self.recovery.in_doubt.load(Ordering::Relaxed);
        report.expired_files = self.retention_sweep().await?;
        self.load_webhooks().await?;
        self.push_waiting().await;
        self.phase.send_modify(|phase| *phase = phase.recovered());
        tracing::info!(target: "estafeta::event", ?report, "start-up processing done");
        Ok(report)
    }

    /// Forget the idempotency keys past their expiry, in batches of
    /// [`KEY_SWEEP_BATCH`] (one write each, so a sweep never holds the key
    /// store for long); how many went.
    pub(crate) async fn expire_keys(&self) -> Result<usize, ExchangeError> {
        let mut expired = 0;
        loop {
            let now = self.now();
            let n = self
                .with_keys(move |keys| keys.expire(now, KEY_SWEEP_BATCH))
                .await?;
            expired += n;
            if n < KEY_SWEEP_BATCH {
                return Ok(expired);
            }
        }
    }

    /// Remove `Log`, `Prepared`, `Unknown` and `Error` messages older than the
    /// retention period, except those a live or in-doubt process refers to.
    pub(crate) async fn retention_sweep(&self) -> Result<usize, ExchangeError> {
        let cutoff_ms = self
            .now()
            .as_millis()
            .saturating_sub(i64::try_from(self.config.retention.as_millis()).unwrap_or(i64::MAX));
        let cutoff = Timestamp::from_millis(cutoff_ms);
        self.expire_keys().await?;
        let mut removed = 0;
        for e in self
            .registry
            .databases()
            .into_iter()
            .chain(self.registry.devices())
        {
            let keep: HashSet<MessageId> = match self.sessions.db.get(e.id.clone(), false).await? {
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
