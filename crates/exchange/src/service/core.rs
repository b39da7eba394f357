//! The shared core of the service: its parts, the clock, and the driver
//! that carries out the process lifecycle's steps (batches of message
//! moves handed to the message store, owner records, alerts, saves) for
//! protocol calls and for the session hooks.

use super::ExchangeConfig;
use super::admin::tally::DbRows;
use super::alert_kind::AlertKind;
use super::alerts::{Alert, key};
use super::error::ExchangeError;
use super::lifecycle::{self, Answer, Ctx, Event, Found, Step};
use super::records::{DbRecord, FileOp, Owner, ProcessRecord, loc};
use super::sessions::Sessions;
use crate::error::MailboxError;
use crate::store::{FileName, Folder, Location, MessageStore, Op};
use crate::tenancy::Registry;
use crate::wire::ErrorCode;
use crate::wire::ProcessState;
use crate::{Id, MessageId, ProcessId, Timestamp, UlidGenerator};
use estafeta_session::{Clock, SessionData, SessionGuard, SessionKey, State};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Whether the storage-write alert is open (closed by the next good
    /// write).
    pub(crate) storage_alert: super::alerts::Condition,
    /// The devices' idempotency keys.
    pub(crate) keys: std::sync::Arc<dyn crate::keys::UploadKeys>,
    /// Messages scheduled for their `deliver_at`.
    pub(crate) scheduled: std::sync::Arc<crate::store::scheduled::DeliveryScheduler>,
    /// The store under `scheduled`, read to list what is scheduled.
    pub(crate) scheduled_store: Arc<dyn estafeta_repeat::store::Store>,
    /// Where arrivals are pushed.
    pub(crate) push: Arc<dyn super::push::PushSink>,
    /// Set once every registered mailbox has been told to the store's
    /// running totals (those registered later are told as they are).
    pub(crate) counting: tokio::sync::OnceCell<()>,
    /// The processes of every database, kept as their records are saved:
    /// only where this server sees every save (a store of its own; with a
    /// shared store the list is read from the records when asked).
    pub(crate) process_tally: Option<super::admin::tally::ProcessTally>,
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

    /// Hand a step's batch to the message store, in `held`, the step the
    /// batch's session holds (see [`Held`]). An op whose message is already
    /// where it should be, or gone, counts as done (it was done before a
    /// crash, or retention removed the message); a missing one raises an
    /// alert. The recipients are told of their arrivals with the registry
    /// as of `registry`, a shared registry's change counter read with the
    /// lock of the step that holds the batch's session (`None`: the
    /// counter is read first).
    pub(crate) async fn run_ops(
        &self,
        mut held: Held<'_>,
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
        // Named points for the fault-injection harness: a crash (or a
        // pause) after the step that recorded the batch and before the
        // store has any of it, and a crash once the store has all of it
        // (run again after the crash, each op finds itself done).
        fail::fail_point!("messages::apply");
        let applied = self.store.apply(again(&mut held), &ops).await;
        fail::fail_point!("messages::applied");
        self.announce(&applied.arrivals, registry).await;
        let mut first_error = None;
        for (op, r) in ops.iter().zip(applied.results) {
            let Err(e) = r else { continue };
            match &e {
                // A reply delivered by an earlier attempt and acknowledged
                // since (in its recipient's `Log`): done, not missing.
                MailboxError::NotFound { .. } if self.delivered_before(op).await => {}
                MailboxError::NotFound { name, .. } => {
                    let alert = Alert::new(
                        AlertKind::MissingFile,
                        name,
                        format!(
                            "{e}: lost, or removed by hand or by retention; the step is counted as done"
                        ),
                        self.now(),
                    );
                    self.raise_in(again(&mut held), alert).await;
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

    /// Whether `op` delivers a message into another mailbox that holds it
    /// already (in `Messages`, `Log`, `Unknown` or `Error`): a move redone
    /// after its recipient took the message on.
    async fn delivered_before(&self, op: &Op) -> bool {
        match op {
            Op::Move { name, from, to } if from.mailbox != to.mailbox => {
                self.store.delivered(name).await.unwrap_or(false)
            }
            _ => false,
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

    /// Record in the process's own session who owns it and how it ended
    /// (unless it says so already); or that it lives (`ended: None`), if it
    /// has no owner record yet. In `held` when the session store writes
    /// other keys' records in a step (a shared store): then durable with
    /// the step's save, fenced by its lock. Else through the process's own
    /// session: durably for an end; a live process's record in the
    /// background (see [`Step::Owner`]: start-up processing writes it again
    /// when a crash lost it).
    pub(crate) async fn write_owner(
        &self,
        held: Held<'_>,
        pid: &ProcessId,
        db: &Id,
        ended: Option<ProcessState>,
    ) -> Result<(), ExchangeError> {
        let wanted = Owner {
            db: db.clone(),
            ended,
        };
        let expiry = ended.map(|_| self.session_now().after(self.config.retention));
        if let Some(step) = held {
            let record = ProcessRecord {
                owner: Some(wanted.clone()),
            };
            let write = self.sessions.process_write(pid, record, expiry)?;
            if step.put_beside(write, ended.is_none()) {
                self.count_end(ended);
                return Ok(());
            }
        }
        let mut g = self
            .sessions
            .process
            .get(*pid, true)
            .await?
            .ok_or_else(|| {
                ExchangeError::unavailable(ErrorCode::StorageError, "process record unavailable")
            })?;
        match &g.state().owner {
            Some(_) if ended.is_none() => return Ok(()),
            Some(o) if *o == wanted && !g.is_dirty() => return Ok(()),
            _ => {}
        }
        g.persistent_mut().owner = Some(wanted);
        g.set_expires_at(expiry);
        if ended.is_some() {
            g.release().await?;
            self.count_end(ended);
        }
        // Dropped with its change: saved in the background, the process's
        // key held until then.
        Ok(())
    }

    /// Tells the commit observer that a process ended (counted once, by the
    /// write that records the end).
    fn count_end(&self, ended: Option<ProcessState>) {
        if let (Some(state), Some(o)) = (ended, self.config.quiesce.observer()) {
            o.ended(state);
        }
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
    /// counts as deleted), in `held`. A store out of reach fails the step:
    /// it comes before the step's save, so the record keeps naming the
    /// files and the step is tried again (a call answered 503, a deadline
    /// retried). Other failures are logged: start-up processing moves
    /// leftovers to `Unknown`.
    pub(crate) async fn discard_prepared(
        &self,
        held: Held<'_>,
        db: &Id,
        names: &[FileName],
    ) -> Result<(), ExchangeError> {
        if names.is_empty() {
            return Ok(());
        }
        let prepared = self.location(db, Folder::Prepared);
        let deletes: Vec<Op> = names
            .iter()
            .map(|name| Op::Delete {
                name: name.clone(),
                at: prepared.clone(),
            })
            .collect();
        let mut unreachable = None;
        for r in self.store.apply(held, &deletes).await.results {
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
    /// database record (the callers save it and set its deadline), in
    /// `held`, the step the database's session holds.
    async fn carry_out(
        &self,
        mut held: Held<'_>,
        step: Step,
        out: &mut Carried,
    ) -> Result<(), ExchangeError> {
        match step {
            Step::Owner { pid, db, ended } => {
                if !out.wrote_owner(&pid, ended) {
                    self.write_owner(held, &pid, &db, ended).await?;
                    out.owner_written(pid, ended);
                }
            }
            Step::Discard { db, names } => self.discard_prepared(held, &db, &names).await?,
            Step::Run { pid, ops } => {
                let result = self.run_ops(again(&mut held), &ops, out.registry).await;
                // A step that lost its session's key wrote nothing and can
                // write nothing more: the call ends here, and whichever
                // server holds the key now carries on.
                if let Err(e) = &result
                    && !held.as_deref().is_none_or(|step| step.held())
                {
                    return Err(lost(e));
                }
                let result = result.map_err(|e| e.to_string());
                out.next.push_back(Event::Ran { pid, result });
            }
            Step::Raise { kind, pid, text } => {
                if kind == AlertKind::InDoubt {
                    self.count_end(Some(ProcessState::InDoubt));
                }
                self.raise_in(held, Alert::new(kind, pid, text, self.now()))
                    .await
            }
            Step::Clear { kind, pid } => self.clear_in(held, key(kind, pid)).await,
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
    /// protocol call). Each event's change is staged; the steps before its
    /// [`Step::Save`] are carried out in the staged change's step, then the
    /// change becomes the session's state at the save, once durable (with
    /// a shared store, with everything the steps wrote beside it, in one
    /// transaction), then the steps after it run in the session's step. An
    /// error leaves the change of the event at hand unsaved (file
    /// operations are idempotent and run again). With `last`, the caller
    /// changes the session no more once this returns: the save after which
    /// nothing needs the key held ([`ends_step`]) is the session's last
    /// change ([`Transaction::commit_last`](estafeta_session::Transaction::commit_last):
    /// with a shared store, its commit lets the key go, and the release has
    /// nothing left to commit). A session whose step lost its key (another
    /// server took it over) gets nothing more written.
    pub(crate) async fn drive(
        &self,
        g: &mut SessionGuard<Id, DbRecord>,
        event: Event,
        last: bool,
    ) -> Result<Answer, ExchangeError> {
        let driven = self.drive_steps(g, event, last).await;
        // What a failed run wrote beside the record in the session's step
        // is not kept: the step goes, and the call with it.
        if driven.is_err()
            && let Some(step) = g.step()
        {
            step.abandon();
        }
        driven
    }

    /// [`drive`](Self::drive), the failures left to it.
    async fn drive_steps(
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
            let save = steps.iter().position(|s| matches!(s, Step::Save));
            let final_save = match last {
                true => ends_step(&steps),
                false => None,
            };
            let mut steps = steps.into_iter();
            for step in steps.by_ref().take(save.unwrap_or(usize::MAX)) {
                match step {
                    Step::Deadline(at) => staged.set_expires_at(at),
                    other => {
                        let held = held(&other, staged.holds(), staged.step())?;
                        self.carry_out(held, other, &mut out).await?;
                    }
                }
            }
            let Some(i) = save else {
                continue;
            };
            staged.persistent_mut();
            let rows = self
                .process_tally
                .as_ref()
                .map(|_| DbRows::of(staged.state()));
            match final_save == Some(i) && out.next.is_empty() {
                true => staged.commit_last().await?,
                false => staged.commit().await?,
            }
            // No await between: the record is the session's exactly when
            // its processes are the list's.
            if let (Some(tally), Some(rows)) = (&self.process_tally, rows) {
                tally.replace(&db, rows);
            }
            for step in steps.skip(1) {
                match step {
                    Step::Deadline(_) | Step::Save => {}
                    other => {
                        let held = held(&other, g.holds(), g.step())?;
                        self.carry_out(held, other, &mut out).await?;
                    }
                }
            }
        }
        Ok(out.answer.unwrap_or(Answer::Ok))
    }

    /// Run `event` (a deadline, start-up recovery) through the lifecycle
    /// inside a session hook, in `step`, the step the engine holds the
    /// session in (with a shared store): the engine saves the session after
    /// the hook, with everything written in the step. On an error the
    /// session keeps its state as it was.
    pub(crate) async fn drive_hook(
        &self,
        db: &Id,
        s: &mut SessionData<DbRecord>,
        mut step: Held<'_>,
        event: Event,
    ) -> Result<(), ExchangeError> {
        let ctx = self.ctx();
        let mut rec = s.state().clone();
        let mut deadline = s.expires_at();
        let mut changed = false;
        let mut out = Carried {
            registry: again(&mut step).and_then(|step| self.registry.version_in_step(step)),
            ..Carried::default()
        };
        out.next.push_back(event);
        while let Some(event) = out.next.pop_front() {
            for each in lifecycle::step(&mut rec, event, &ctx) {
                let done = match each {
                    Step::Deadline(at) => {
                        deadline = at;
                        Ok(())
                    }
                    Step::Save => {
                        changed = true;
                        Ok(())
                    }
                    other => self.carry_out(again(&mut step), other, &mut out).await,
                };
                // What the hook wrote in the step is not kept (see `drive`).
                if let (Err(_), Some(step)) = (&done, again(&mut step)) {
                    step.abandon();
                }
                done?;
            }
        }
        if changed {
            if let Some(tally) = &self.process_tally {
                tally.replace(db, DbRows::of(&rec));
            }
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

    /// Every message of `rec`'s `Prepared` that its record names: its
    /// processes' messages and replies, and the reply names of a prepare
    /// under way (whose files may be landing).
    pub(crate) fn names_in_prepared(rec: &DbRecord) -> HashSet<MessageId> {
        Core::referenced(rec)
            .chain(rec.process.iter().flat_map(|p| p.preparing.iter()))
            .chain(rec.discarding.iter().flat_map(|d| d.names.iter()))
            .map(|n| n.id)
            .collect()
    }

    pub(crate) fn location(&self, id: &Id, folder: Folder) -> Location {
        Location::new(id.clone(), folder)
    }
}

/// The step a session's command holds in a shared session store, which
/// writes beside the record join (see
/// [`Step::joint`](estafeta_session::storage::Step::joint)); `None` with a
/// session store of this server alone.
pub(crate) type Held<'a> = Option<&'a mut dyn estafeta_session::storage::Step>;

/// `held` lent for one call, to be used again after it.
pub(crate) fn again<'b>(held: &'b mut Held<'_>) -> Held<'b> {
    match held {
        Some(step) => Some(&mut **step),
        None => None,
    }
}

/// The step to carry `step` out in, `session_step` of a command whose
/// session `holds` its key. A step that writes under the key (an owner
/// record, a discard, moves) gets an error once the session does not hold
/// it (with a shared store, another server took the key over after a
/// save: nothing more may be written from this command's view); an alert
/// after the command's last save goes on its own.
fn held<'a>(step: &Step, holds: bool, session_step: Held<'a>) -> Result<Held<'a>, ExchangeError> {
    let under_key = matches!(
        step,
        Step::Owner { .. } | Step::Discard { .. } | Step::Run { .. }
    );
    match (holds, under_key) {
        (true, _) => Ok(session_step),
        (false, false) => Ok(None),
        (false, true) => Err(ExchangeError::unavailable(
            ErrorCode::StorageError,
            "another server took the session over; nothing more was written (retry)",
        )),
    }
}

/// A step's writes failed and its step no longer holds the key.
fn lost(e: &MailboxError) -> ExchangeError {
    ExchangeError::unavailable(
        ErrorCode::StorageError,
        format!("the session's step lost its key while writing ({e}); nothing of it was kept"),
    )
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
