//! The shared core of the service: its parts, the clock, and the driver
//! that carries out the process lifecycle's steps (batches of message
//! moves handed to the message store, owner records, alerts, saves) for
//! protocol calls and for the session hooks.

use super::ExchangeConfig;
use super::alert_kind::AlertKind;
use super::error::ExchangeError;
use super::lifecycle::{self, Answer, Ctx, Event, Found, Step};
use super::sessions::Sessions;
use super::state::{DbRecord, FileOp, Owner, loc};
use super::tally::DbRows;
use crate::error::MailboxError;
use crate::store::{FileName, Folder, Location, MessageStore, Op};
use crate::tenancy::Registry;
use crate::wire::ErrorCode;
use crate::wire::ProcessState;
use crate::{Id, ProcessId, Timestamp, UlidGenerator};
use estafeta_session::{Clock, SessionData, SessionGuard, SessionKey, State};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::SystemTime;

/// What carrying out a lifecycle's steps left over: the answer, the
/// events that file operations gave, and the ended processes whose owner
/// record this run wrote; and what it knows of the registry.
#[derive(Default)]
struct Carried {
    answer: Option<Answer>,
    next: VecDeque<Event>,
    owners: Vec<(ProcessId, ProcessState)>,
    /// The shared registry's change counter read with the lock of the step
    /// the run holds, if any: what the recipients of moved messages are
    /// looked up as of ([`Core::run_ops`]).
    registry: Option<u64>,
}

impl Carried {
    /// Whether the owner record of `pid` is known to say `ended` durably:
    /// written so by this run. The lifecycle asks for it again once the
    /// moves of a commit or a settlement are done (the same record it asked
    /// for with the save that decided them, whose write may have failed in
    /// an earlier run); the database's session, held all along, is what
    /// every owner record of its processes is written under, so the record
    /// cannot have changed since.
    fn wrote_owner(&self, pid: &ProcessId, ended: Option<ProcessState>) -> bool {
        ended.is_some_and(|ended| self.owners.contains(&(*pid, ended)))
    }

    /// The owner record of `pid` says `ended` durably (written by this run).
    fn owner_written(&mut self, pid: ProcessId, ended: Option<ProcessState>) {
        if let Some(ended) = ended {
            self.owners.push((pid, ended));
        }
    }
}

/// Counters of start-up processing, filled by the first-load hook.
#[derive(Default)]
pub(crate) struct RecoveryCounters {
    pub(crate) timed_out: AtomicUsize,
    pub(crate) cleanups: AtomicUsize,
    pub(crate) in_doubt: AtomicUsize,
}

pub(crate) struct Core {
    pub(crate) config: ExchangeConfig,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) registry: Registry,
    /// Where messages live.
    pub(crate) store: std::sync::Arc<dyn MessageStore>,
    pub(crate) ids: UlidGenerator,
    /// The engines; their hooks reach the core through a `Weak` to it.
    pub(crate) sessions: Sessions,
    /// The server's phase: the exchange moves it, everyone reads it.
    pub(crate) phase: tokio::sync::watch::Sender<super::Phase>,
    pub(crate) recovery: RecoveryCounters,
    /// Where alerts go.
    pub(crate) alerts: Arc<dyn super::alerts::AlertSink>,
    /// A storage-write alert is open (cleared by the next good write).
    pub(crate) storage_alert: AtomicBool,
    /// The devices' idempotency keys.
    pub(crate) keys: std::sync::Arc<dyn crate::keys::UploadKeys>,
    /// Messages kept aside until their `deliver_at`.
    pub(crate) deferred: std::sync::Arc<crate::store::deferred::Deferred>,
    /// The store under `deferred`, read to list what is scheduled.
    pub(crate) deferred_store: Arc<dyn estafeta_repeat::store::Store>,
    /// Where arrivals are pushed.
    pub(crate) push: Arc<dyn super::push::PushSink>,
    /// The recipients' webhooks when the registry's store does not keep
    /// them (the embedded one), loaded by start-up processing.
    pub(crate) webhooks: super::push::Webhooks,
    /// Set once every registered mailbox has been told to the store's
    /// running totals (those registered later are told as they are).
    pub(crate) counting: tokio::sync::OnceCell<()>,
    /// The processes of every database, kept as their records are saved.
    pub(crate) process_tally: super::tally::ProcessTally,
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

    /// Hand a step's batch to the message store. An op whose message is
    /// already where it should be, or gone, counts as done (it was done
    /// before a crash, or retention removed the message); a missing one
    /// raises an alert.
    /// The recipients are told of their arrivals with the registry as of
    /// `registry`, a shared registry's change counter read with the lock of
    /// the step that holds the batch's session (`None`: the counter is read
    /// first).
    pub(crate) async fn run_ops(
        &self,
        steps: &[FileOp],
        registry: Option<u64>,
    ) -> Result<(), MailboxError> {
        let ops: Vec<Op> = steps
            .iter()
            .map(|s| match s {
                FileOp::Move { name, from, to } => Op::Move {
                    name: name.clone(),
                    from: loc(from),
                    to: loc(to),
                },
                FileOp::Delete { name, at } => Op::Delete {
                    name: name.clone(),
                    at: loc(at),
                },
                FileOp::Schedule { name, from, at } => Op::Schedule {
                    name: name.clone(),
                    from: loc(from),
                    until: *at,
                },
            })
            .collect();
        // Named points for the fault-injection harness: a crash after the
        // step that recorded the batch and before the store has any of it,
        // and a crash once the store has all of it (run again after the
        // crash, each op finds itself done).
        fail::fail_point!("messages::apply");
        let applied = self.store.apply(&ops).await;
        fail::fail_point!("messages::applied");
        self.announce(&applied.arrivals, registry).await;
        let mut first_error = None;
        for r in applied.results {
            let Err(e) = r else { continue };
            match &e {
                MailboxError::NotFound { name, .. } => {
                    self.raise_alert(
                        AlertKind::MissingFile,
                        name,
                        format!(
                            "{e}: lost, or removed by hand or by retention; the step is counted as done"
                        ),
                    )
                    .await;
                }
                _ => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// The session `g` a call took for `who` (its device's or database's),
    /// once `who` is confirmed ([`confirm`](Self::confirm)) with the change
    /// counter its step's lock read. A token that is no longer `who`'s is
    /// refused (401) and the session released, nothing written.
    pub(crate) async fn confirmed<K: SessionKey, S: State>(
        &self,
        mut g: SessionGuard<K, S>,
        who: &super::Presented,
    ) -> Result<SessionGuard<K, S>, ExchangeError> {
        if who.hash.is_none() {
            return Ok(g);
        }
        let version = g
            .step()
            .and_then(|step| self.registry.version_in_step(step));
        match self.confirm(who, version).await {
            Ok(()) => Ok(g),
            Err(refused) => {
                g.release().await?;
                Err(refused)
            }
        }
    }

    /// Confirms `who`: a principal vouched for as it is; a presented token
    /// against the registry brought up to date, with a shared registry to
    /// `version`, its change counter as a statement of the call read it (a
    /// step's lock, or the call's read): reloaded only when it moved;
    /// without one, the counter is read first. A token that is no longer
    /// `who`'s is refused (401).
    pub(crate) async fn confirm(
        &self,
        who: &super::Presented,
        version: Option<u64>,
    ) -> Result<(), ExchangeError> {
        let Some(hash) = &who.hash else {
            return Ok(());
        };
        match version {
            Some(version) => self.registry.refresh_to(version).await?,
            None => self.registry.refresh().await?,
        }
        match self.registry.authenticate_hash(hash).as_ref() == Some(&who.who) {
            true => Ok(()),
            false => Err(ExchangeError::unauthorized("unknown token")),
        }
    }

    /// Record in the process's own session who owns it and how it ended,
    /// durably (unless it says so durably already); or that it lives
    /// (`ended: None`), if it has no owner record yet, saved in the
    /// background (see [`Step::Owner`]), or durably with a shared store.
    pub(crate) async fn write_owner(
        &self,
        pid: &ProcessId,
        db: &Id,
        ended: Option<ProcessState>,
    ) -> Result<(), ExchangeError> {
        let sessions = &self.sessions;
        let mut g = sessions.process.get(*pid, true).await?.ok_or_else(|| {
            ExchangeError::unavailable(ErrorCode::StorageError, "process record unavailable")
        })?;
        let wanted = Owner {
            db: db.clone(),
            ended,
        };
        match &g.state().owner {
            Some(_) if ended.is_none() => return Ok(()),
            Some(o) if *o == wanted && !g.is_dirty() => return Ok(()),
            _ => {}
        }
        g.persistent_mut().owner = Some(wanted);
        let expiry = ended.map(|_| self.session_now().after(self.config.retention));
        g.set_expires_at(expiry);
        if let Some(state) = ended {
            g.release().await?;
            // Counted once, by the write that records the end.
            if let Some(o) = self.config.quiesce.observer() {
                o.ended(state);
            }
        } else if self.sessions.shared {
            // A live process's record is written again by start-up
            // processing when a crash lost it, which a shared store does
            // not run: there it is durable before the call answers.
            g.release().await?;
        }
        // Dropped with its change: saved in the background, the process's
        // key held until then.
        Ok(())
    }

    /// The owner record of a process, if it was ever issued.
    pub(crate) async fn owner(&self, pid: &ProcessId) -> Result<Option<Owner>, ExchangeError> {
        let Some(g) = self.sessions.process.get(*pid, false).await? else {
            return Ok(None);
        };
        let owner = g.state().owner.clone();
        drop(g);
        Ok(owner)
    }

    /// Delete reply files from a database's `Prepared` (a missing one
    /// counts as deleted). A store out of reach fails the step: it comes
    /// before the step's save, so the record keeps naming the files and
    /// the step is tried again (a call answered 503, a deadline retried),
    /// where a shared store has no start-up look for files no record
    /// names. Other failures are logged: the file store's start-up moves
    /// leftovers to `Unknown`.
    pub(crate) async fn discard_prepared(
        &self,
        db: &Id,
        names: &[FileName],
    ) -> Result<(), ExchangeError> {
        if names.is_empty() {
            return Ok(());
        }
        let prepared = self.location(db, Folder::Prepared);
        let mut unreachable = None;
        for r in self.store.delete_all(&prepared, names).await {
            match r {
                Ok(_) | Err(MailboxError::NotFound { .. }) => {}
                Err(e) if e.is_unavailable() => unreachable = Some(e),
                Err(e) => {
                    tracing::warn!(error = %e, "deleting the replies of an unanswered prepare")
                }
            }
        }
        match unreachable {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// The lifecycle's view of the time and the timeouts now.
    pub(crate) fn ctx(&self) -> Ctx {
        Ctx {
            now: self.now(),
            started_timeout: self.config.started_timeout,
            ready_timeout: self.config.ready_timeout,
        }
    }

    /// Carry out one step of the lifecycle that does not touch the
    /// database record (the callers save it and set its deadline).
    async fn carry_out(&self, step: Step, out: &mut Carried) -> Result<(), ExchangeError> {
        match step {
            Step::Owner { pid, db, ended } => {
                if !out.wrote_owner(&pid, ended) {
                    self.write_owner(&pid, &db, ended).await?;
                    out.owner_written(pid, ended);
                }
            }
            Step::Discard { db, names } => self.discard_prepared(&db, &names).await?,
            Step::Run { pid, ops } => {
                let result = self
                    .run_ops(&ops, out.registry)
                    .await
                    .map_err(|e| e.to_string());
                out.next.push_back(Event::Ran { pid, result });
            }
            Step::Raise { kind, pid, text } => {
                if let (AlertKind::InDoubt, Some(o)) = (kind, self.config.quiesce.observer()) {
                    o.ended(ProcessState::InDoubt);
                }
                self.raise_alert(kind, pid, text).await
            }
            Step::Clear { kind, pid } => self.clear_alert(kind, pid).await,
            Step::Count(found) => count(match found {
                Found::TimedOut => &self.recovery.timed_out,
                Found::Cleanup => &self.recovery.cleanups,
                Found::InDoubt => &self.recovery.in_doubt,
            }),
            Step::Answer(answer) => out.answer = Some(answer),
            Step::Deadline(_) | Step::Save => {}
        }
        Ok(())
    }

    /// Run `event` through the lifecycle on a held database session (a
    /// protocol call): each event's change is staged and becomes the
    /// session's state at its [`Step::Save`], once durable; an error leaves
    /// the change of the event at hand unsaved (file operations are
    /// idempotent and run again). With `last`, the caller changes the
    /// session no more once this returns: the save after which nothing
    /// needs the key held ([`ends_step`]) is the session's last change
    /// ([`Transaction::commit_last`](estafeta_session::Transaction::commit_last):
    /// with a shared store, its commit lets the key go, and the release
    /// has nothing left to commit).
    pub(crate) async fn drive(
        &self,
        g: &mut SessionGuard<Id, DbRecord>,
        event: Event,
        last: bool,
    ) -> Result<Answer, ExchangeError> {
        let ctx = self.ctx();
        let db = g.key().clone();
        let mut out = Carried {
            registry: g
                .step()
                .and_then(|step| self.registry.version_in_step(step)),
            ..Carried::default()
        };
        out.next.push_back(event);
        while let Some(event) = out.next.pop_front() {
            let mut staged = g.begin();
            let steps = lifecycle::step(staged.state_mut(), event, &ctx);
            let mut staged = Some(staged);
            let final_save = match last {
                true => ends_step(&steps),
                false => None,
            };
            let mut steps = steps.into_iter().enumerate().peekable();
            while let Some((i, step)) = steps.next() {
                match step {
                    Step::Owner { pid, db, ended } => {
                        let write = !out.wrote_owner(&pid, ended);
                        let owner = async {
                            match write {
                                true => self.write_owner(&pid, &db, ended).await,
                                false => Ok(()),
                            }
                        };
                        match steps.next_if(|(_, s)| matches!(s, Step::Run { .. })) {
                            Some((_, run)) => {
                                let (owner, ran) =
                                    tokio::join!(owner, self.carry_out(run, &mut out));
                                owner?;
                                ran?;
                            }
                            None => owner.await?,
                        }
                        if write {
                            out.owner_written(pid, ended);
                        }
                    }
                    Step::Deadline(at) => {
                        if let Some(tx) = staged.as_mut() {
                            tx.set_expires_at(at);
                        }
                    }
                    Step::Save => {
                        if let Some(mut tx) = staged.take() {
                            tx.persistent_mut();
                            let rows = DbRows::of(tx.state());
                            match final_save == Some(i) && out.next.is_empty() {
                                true => tx.commit_last().await?,
                                false => tx.commit().await?,
                            }
                            // No await between: the record is the session's
                            // exactly when its processes are the list's.
                            self.process_tally.replace(&db, rows);
                        }
                    }
                    other => self.carry_out(other, &mut out).await?,
                }
            }
        }
        Ok(out.answer.unwrap_or(Answer::Ok))
    }

    /// Run `event` (a deadline, start-up recovery) through the lifecycle
    /// inside a session hook: the engine saves the session after the hook.
    /// On an error the session keeps its state as it was.
    pub(crate) async fn drive_hook(
        &self,
        db: &Id,
        s: &mut SessionData<DbRecord>,
        event: Event,
    ) -> Result<(), ExchangeError> {
        let ctx = self.ctx();
        let mut rec = s.state().clone();
        let mut deadline = s.expires_at();
        let mut changed = false;
        let mut out = Carried::default();
        out.next.push_back(event);
        while let Some(event) = out.next.pop_front() {
            for step in lifecycle::step(&mut rec, event, &ctx) {
                match step {
                    Step::Deadline(at) => deadline = at,
                    Step::Save => changed = true,
                    other => self.carry_out(other, &mut out).await?,
                }
            }
        }
        if changed {
            self.process_tally.replace(db, DbRows::of(&rec));
            *s.persistent_mut() = rec;
        }
        s.set_expires_at(deadline);
        Ok(())
    }

    /// The file names a mailbox's live and in-doubt processes refer to.
    pub(crate) fn referenced(rec: &DbRecord) -> impl Iterator<Item = &FileName> {
        rec.process
            .iter()
            .chain(rec.in_doubt.iter())
            .flat_map(|p| p.messages.iter().chain(p.replies.iter()))
    }

    pub(crate) fn location(&self, id: &Id, folder: Folder) -> Location {
        Location::new(id.clone(), folder)
    }
}

/// Where in `steps` the save is after which nothing needs the database's
/// key held: the event's save (its first: the staged change is committed
/// there), followed only by steps that write nothing under the key (an
/// answer, alerts, a count, a live process's owner record, which is its
/// process's own). `None` when moves, discards, an ended process's owner
/// record or another save follow it (each must happen while the key is
/// held), or there is no save.
fn ends_step(steps: &[Step]) -> Option<usize> {
    let i = steps.iter().position(|s| matches!(s, Step::Save))?;
    let keyless = |s: &Step| match s {
        Step::Answer(_)
        | Step::Raise { .. }
        | Step::Clear { .. }
        | Step::Count(_)
        | Step::Deadline(_) => true,
        Step::Owner { ended, .. } => ended.is_none(),
        Step::Save | Step::Run { .. } | Step::Discard { .. } => false,
    };
    steps[i + 1..].iter().all(keyless).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_ends_at_the_save_that_nothing_under_the_key_follows() {
        let pid = UlidGenerator::new().process_id(SystemTime::now());
        let db = Id::new("db-a").unwrap();
        let owner = |ended| Step::Owner {
            pid,
            db: db.clone(),
            ended,
        };
        let run = || Step::Run {
            pid,
            ops: Vec::new(),
        };
        let started = [
            Step::Deadline(None),
            Step::Save,
            owner(None),
            Step::Answer(Answer::Ok),
        ];
        assert_eq!(ends_step(&started), Some(1));
        let committing = [
            Step::Deadline(None),
            Step::Save,
            owner(Some(ProcessState::Done)),
            run(),
        ];
        assert_eq!(ends_step(&committing), None);
        let moved = [
            owner(Some(ProcessState::Done)),
            Step::Deadline(None),
            Step::Save,
            Step::Answer(Answer::Ok),
        ];
        assert_eq!(ends_step(&moved), Some(2));
        let settled_at_once = [Step::Deadline(None), Step::Save, Step::Save, run()];
        assert_eq!(ends_step(&settled_at_once), None);
        assert_eq!(ends_step(&[Step::Answer(Answer::Busy)]), None);
    }
}
