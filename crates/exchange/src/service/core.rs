//! The shared core of the service: its parts, the clock, and the process
//! transitions that both protocol calls and the session hooks (timeouts,
//! recovery) perform.

use super::ExchangeConfig;
use super::alerts::AlertKind;
use super::error::ExchangeError;
use super::state::{Owner, Process, Record, Step, loc, pid_key};
use crate::error::MailboxError;
use crate::mailbox::{FileName, Folder, Location, Mailboxes};
use crate::tenancy::Registry;
use crate::wire::{ProcessState, ResultStatus};
use crate::{Id, ProcessId, Timestamp, UlidGenerator};
use estafeta_session::{Clock, Engine};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

/// The longest wait between retries of moves that failed.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Counters of start-up processing, filled by the first-load hook.
#[derive(Default)]
pub(crate) struct RecoveryCounters {
    pub(crate) timed_out: AtomicUsize,
    pub(crate) cleanups: AtomicUsize,
    pub(crate) in_doubt: AtomicUsize,
}

pub(crate) struct Core {
    pub(crate) config: ExchangeConfig,
    pub(crate) clock: std::sync::Arc<dyn Clock>,
    pub(crate) registry: Registry,
    pub(crate) mailboxes: Mailboxes,
    pub(crate) ids: UlidGenerator,
    /// Set once at open; the hooks reach the engine through the core.
    pub(crate) sessions: OnceLock<Engine<String, Record>>,
    pub(crate) ready: AtomicBool,
    pub(crate) recovery: RecoveryCounters,
    /// Where alerts go ([`super::Exchange::set_alert_sink`]).
    pub(crate) alerts: std::sync::RwLock<std::sync::Arc<dyn super::alerts::AlertSink>>,
    /// A storage-write alert is open (cleared by the next good write).
    pub(crate) storage_alert: AtomicBool,
    /// Messages kept aside until their `deliver_at`.
    pub(crate) deferred: super::schedule::Deferred,
    /// The store under `deferred`, read to list what is scheduled.
    pub(crate) deferred_store: std::sync::Arc<estafeta_repeat::RedbStore>,
    /// Where arrivals are pushed ([`super::Exchange::set_push_sink`]).
    pub(crate) push: std::sync::RwLock<std::sync::Arc<dyn super::push::PushSink>>,
    /// The recipients' webhooks, loaded by start-up processing.
    pub(crate) webhooks: super::push::Webhooks,
    /// Woken when start-up processing is done.
    pub(crate) became_ready: tokio::sync::Notify,
    /// True once start-up processing has begun: until then the session
    /// hooks wait, so that nothing changes state (and raises an alert)
    /// before the caller had the chance to set its alert sink.
    pub(crate) started: tokio::sync::watch::Sender<bool>,
}

pub(crate) fn count(c: &AtomicUsize) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Core {
    pub(crate) fn now(&self) -> Timestamp {
        Timestamp::from_millis(i64::try_from(self.clock.now().0).unwrap_or(i64::MAX))
    }

    pub(crate) fn now_system(&self) -> SystemTime {
        self.clock.now().to_system_time()
    }

    pub(crate) fn session_now(&self) -> estafeta_session::Timestamp {
        self.clock.now()
    }

    pub(crate) fn sessions(&self) -> Result<&Engine<String, Record>, ExchangeError> {
        self.sessions
            .get()
            .ok_or_else(|| ExchangeError::unavailable("not_ready", "the server is starting"))
    }

    /// Run file steps: moves concurrently (sharing fsyncs), then deletes.
    /// A step whose file is already where it should be, or gone, counts as
    /// done (it was done before a crash, or retention removed the file).
    pub(crate) async fn run_steps(&self, steps: &[Step]) -> Result<(), MailboxError> {
        let mut moves = Vec::new();
        let mut deletes = Vec::new();
        let mut schedules = Vec::new();
        for s in steps {
            match s {
                Step::Move { name, from, to } => moves.push((name.clone(), loc(from), loc(to))),
                Step::Delete { name, at } => deletes.push((name.clone(), loc(at))),
                Step::Schedule { name, from, at } => schedules.push((name, loc(from), *at)),
            }
        }
        let mut first_error = None;
        let mut arrivals = std::collections::BTreeSet::new();
        let mut note = |r: Result<crate::mailbox::Outcome, MailboxError>| match r {
            Ok(_) => {}
            Err(MailboxError::NotFound { .. }) => {
                tracing::warn!("a file step found its file in neither place; counted as done");
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        };
        for (r, (_, _, to)) in self
            .mailboxes
            .move_all(&moves)
            .await
            .into_iter()
            .zip(&moves)
        {
            if r.is_ok() && to.folder == Folder::Messages {
                arrivals.insert(to.mailbox.clone());
            }
            note(r);
        }
        for recipient in &arrivals {
            self.arrived(recipient);
        }
        for (name, from, at) in schedules {
            note(
                self.schedule_file(name, &from, at)
                    .await
                    .map(|()| crate::mailbox::Outcome::Done),
            );
        }
        for (name, at) in deletes {
            note(self.mailboxes.delete(&at, &name).await);
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Record in the process's own session who owns it and how it ended.
    pub(crate) async fn write_owner(
        &self,
        pid: &ProcessId,
        db: &Id,
        ended: Option<ProcessState>,
    ) -> Result<(), ExchangeError> {
        let sessions = self.sessions()?;
        let mut g = sessions.get(pid_key(pid), true).await?.ok_or_else(|| {
            ExchangeError::unavailable("storage_error", "process record unavailable")
        })?;
        g.persistent_mut().owner = Some(Owner {
            db: db.clone(),
            ended,
        });
        let expiry = ended.map(|_| self.session_now().after(self.config.retention));
        g.set_expires_at(expiry);
        g.release().await?;
        Ok(())
    }

    /// The owner record of a process, if it was ever issued.
    pub(crate) async fn owner(&self, pid: &ProcessId) -> Result<Option<Owner>, ExchangeError> {
        let Some(g) = self.sessions()?.get(pid_key(pid), false).await? else {
            return Ok(None);
        };
        let owner = g.state().owner.clone();
        drop(g);
        Ok(owner)
    }

    /// End a process: its owner record says how, and the database
    /// remembers it among the recent ones.
    pub(crate) async fn finish(
        &self,
        rec: &mut Record,
        p: Process,
        state: ProcessState,
    ) -> Result<(), ExchangeError> {
        self.write_owner(&p.id, &p.db, Some(state)).await?;
        rec.end(p, state, self.now());
        Ok(())
    }

    /// Delete the reply files of a prepare that was never answered.
    pub(crate) async fn drop_preparing(&self, p: &mut Process) {
        let names = std::mem::take(&mut p.preparing);
        self.discard_prepared(&p.db, &names).await;
    }

    /// Delete reply files from a database's `Prepared` (a missing one
    /// counts as deleted; other failures are logged).
    pub(crate) async fn discard_prepared(&self, db: &Id, names: &[FileName]) {
        if names.is_empty() {
            return;
        }
        let prepared = self.location(db, Folder::Prepared);
        for r in self.mailboxes.delete_all(&prepared, names).await {
            match r {
                Ok(_) | Err(MailboxError::NotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "deleting the replies of an unanswered prepare")
                }
            }
        }
    }

    /// The steps of a confirmed commit (CLEANUP).
    ///
    /// Progress is kept as an intent record rather than as the seed's save
    /// after every single move: the whole list of moves is saved durably
    /// with the CLEANUP state before the first file moves, then the moves
    /// run together (sharing folder fsyncs), then DONE is saved. Every move
    /// is idempotent (source gone and target present counts as done), so a
    /// crash at any point is finished by running the list again at start-up
    /// — the same outcome as the seed's per-move record, with two session
    /// saves per commit instead of one per file.
    pub(crate) fn commit_steps(&self, p: &Process) -> Vec<Step> {
        let db = &p.db;
        let mut steps: Vec<Step> = p
            .replies
            .iter()
            .map(|r| Step::deliver(p, r, (db, Folder::Prepared)))
            .collect();
        for n in p.verdicts(ResultStatus::Processed) {
            steps.push(Step::mv(&n, (db, Folder::Messages), (db, Folder::Log)));
        }
        for n in p.verdicts(ResultStatus::ProcessedIncorrect) {
            steps.push(Step::mv(&n, (db, Folder::Messages), (db, Folder::Error)));
        }
        steps
    }

    /// Put the READY_TO_COMMIT process of `rec` in doubt: processed
    /// messages and replies to `Unknown`, incorrect ones to `Error`,
    /// deadlocked ones stay. Deterministic from the record, so a crash in
    /// the middle is repaired by doing it again.
    pub(crate) async fn go_in_doubt(&self, rec: &mut Record) -> Result<(), ExchangeError> {
        let Some(p) = rec.process.as_ref() else {
            return Ok(());
        };
        let db = &p.db;
        let mut steps: Vec<Step> = p
            .replies
            .iter()
            .map(|r| Step::mv(r, (db, Folder::Prepared), (db, Folder::Unknown)))
            .collect();
        for n in p.verdicts(ResultStatus::Processed) {
            steps.push(Step::mv(&n, (db, Folder::Messages), (db, Folder::Unknown)));
        }
        for n in p.verdicts(ResultStatus::ProcessedIncorrect) {
            steps.push(Step::mv(&n, (db, Folder::Messages), (db, Folder::Error)));
        }
        self.run_steps(&steps).await?;
        if let Some(mut p) = rec.process.take() {
            p.state = ProcessState::InDoubt;
            rec.counters.went_in_doubt(self.now());
            tracing::error!(
                target: "estafeta::alert",
                process = %p.id, db = %p.db,
                "process in doubt: READY_TO_COMMIT past its timeout; its files are in Unknown until a late commit or rollback"
            );
            self.raise_alert(
                AlertKind::InDoubt,
                &p.id,
                format!("process {} of database {} is in doubt: READY_TO_COMMIT past its timeout; its files are in Unknown until a late commit or rollback", p.id, p.db),
            )
            .await;
            rec.in_doubt.push(p);
        }
        Ok(())
    }

    /// The steps that settle a process in doubt as committed or rolled back.
    pub(crate) fn settle_steps(&self, p: &Process, commit: bool) -> Vec<Step> {
        let db = &p.db;
        let mut steps = Vec::new();
        if commit {
            for r in &p.replies {
                steps.push(Step::deliver(p, r, (db, Folder::Unknown)));
            }
            for n in p.verdicts(ResultStatus::Processed) {
                steps.push(Step::mv(&n, (db, Folder::Unknown), (db, Folder::Log)));
            }
        } else {
            for r in &p.replies {
                steps.push(Step::delete(r, (db, Folder::Unknown)));
            }
            for n in p.verdicts(ResultStatus::Processed) {
                steps.push(Step::mv(&n, (db, Folder::Unknown), (db, Folder::Messages)));
            }
            for n in p.verdicts(ResultStatus::ProcessedIncorrect) {
                steps.push(Step::mv(&n, (db, Folder::Error), (db, Folder::Messages)));
            }
        }
        steps
    }

    /// Run the live process's pending steps: it ends as its target, or is
    /// FAILED and retried with backoff. The new session deadline is
    /// returned (the retry time, or none).
    pub(crate) async fn run_pending(
        &self,
        rec: &mut Record,
    ) -> Result<(ProcessState, Option<estafeta_session::Timestamp>), ExchangeError> {
        let Some(p) = rec.process.as_mut() else {
            return Ok((ProcessState::Done, None));
        };
        let steps = p.pending.clone();
        match self.run_steps(&steps).await {
            Ok(()) => {
                let target = p.target.unwrap_or(ProcessState::Done);
                let failed = p.attempts > 0;
                if let Some(p) = rec.process.take() {
                    if failed {
                        self.clear_alert(AlertKind::Failed, &p.id).await;
                    }
                    self.finish(rec, p, target).await?;
                }
                Ok((target, None))
            }
            Err(e) => {
                p.state = ProcessState::Failed;
                p.attempts = p.attempts.saturating_add(1);
                let backoff = Duration::from_secs(1u64 << p.attempts.min(16)).min(MAX_BACKOFF);
                tracing::error!(
                    target: "estafeta::alert",
                    process = %p.id, db = %p.db, error = %e, attempts = p.attempts,
                    "process FAILED: files could not be moved; retrying with backoff"
                );
                let text = format!(
                    "process {} of database {} is FAILED: its files could not be moved ({e}); retrying with backoff",
                    p.id, p.db
                );
                let pid = p.id;
                self.raise_alert(AlertKind::Failed, pid, text).await;
                Ok((
                    ProcessState::Failed,
                    Some(self.session_now().after(backoff)),
                ))
            }
        }
    }

    /// Settle processes in doubt whose late commit or rollback was decided
    /// but not finished (a crash in between).
    pub(crate) async fn replay_in_doubt(&self, rec: &mut Record) -> Result<(), ExchangeError> {
        let mut i = 0;
        while i < rec.in_doubt.len() {
            if let Some(target) = rec.in_doubt[i].target {
                let steps = rec.in_doubt[i].pending.clone();
                self.run_steps(&steps).await?;
                let p = rec.in_doubt.remove(i);
                self.clear_alert(AlertKind::InDoubt, &p.id).await;
                self.finish(rec, p, target).await?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// The file names a mailbox's live and in-doubt processes refer to.
    pub(crate) fn referenced(rec: &Record) -> impl Iterator<Item = &FileName> {
        rec.process
            .iter()
            .chain(rec.in_doubt.iter())
            .flat_map(|p| p.messages.iter().chain(p.replies.iter()))
    }

    pub(crate) fn location(&self, id: &Id, folder: Folder) -> Location {
        Location::new(id.clone(), folder)
    }
}
