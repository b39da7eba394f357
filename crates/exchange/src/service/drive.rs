//! The interpreter of the process lifecycle: runs an event through
//! [`lifecycle::step`] and carries out the steps it returns (owner
//! records, discards, batches of moves, alerts, saves), for a protocol
//! call on a held database session ([`Interpreter::drive`]) and for a
//! session hook inside the engine ([`Interpreter::drive_hook`]), both
//! through one loop: they differ only in what a save does ([`Driven`]).
//! What each step does to the stores is in `effects.rs`.

use super::ExchangeConfig;
use super::admin::process_tally::ProcessTally;
use super::alert_kind::AlertKind;
use super::alerting::Alerting;
use super::alerts::{Alert, key};
use super::basics::{Held, again};
use super::error::ExchangeError;
use super::lifecycle::{self, Answer, Ctx, Event, Found, Step};
use super::observer::{CommitObserver, Messages};
use super::parts::{Parts, RecoveryCounters};
use super::push::PushSink;
use super::records::DbRecord;
use super::sessions::Sessions;
use crate::error::MailboxError;
use crate::tenancy::Registry;
use crate::wire::{ErrorCode, ProcessState};
use crate::{Id, ProcessId};
use estafeta_session::{Clock, SessionData, SessionGuard, Timestamp};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod effects;

/// What the lifecycle's steps use of the exchange, and nothing more: the
/// one way a process's record changes, for the processor calls, the
/// session hooks and the operator's actions alike.
pub(crate) struct Interpreter<'a> {
    /// The time of each event, and of the deadlines it sets.
    clock: &'a dyn Clock,
    /// How long a process may stay STARTED, and READY_TO_COMMIT.
    started_timeout: Duration,
    ready_timeout: Duration,
    /// How long an ended process's owner record is kept.
    retention: Duration,
    /// Told of each process that ends (the backup pause counts them).
    observer: Option<&'a Arc<dyn CommitObserver>>,
    /// Who receives moved messages, and the shared registry's counter.
    registry: &'a Registry,
    /// Where the steps' batches of moves and deletes go.
    store: &'a Messages,
    /// The process records (who owns a process, how it ended).
    sessions: &'a Sessions,
    /// Where the steps' alerts go.
    alerting: &'a Alerting,
    /// Told of the arrivals a batch of moves made.
    push: &'a dyn PushSink,
    /// What start-up processing found, counted.
    recovery: &'a RecoveryCounters,
    /// The process list kept as records are saved, if this server keeps one.
    process_tally: Option<&'a ProcessTally>,
}

impl<'a> Interpreter<'a> {
    /// The parts the lifecycle's steps use.
    pub(crate) fn of(parts: &'a Parts) -> Interpreter<'a> {
        let config: &ExchangeConfig = &parts.config;
        Interpreter {
            clock: parts.clock.as_ref(),
            started_timeout: config.started_timeout,
            ready_timeout: config.ready_timeout,
            retention: config.retention,
            observer: config.quiesce.observer(),
            registry: &parts.registry,
            store: &parts.store,
            sessions: &parts.sessions,
            alerting: &parts.alerting,
            push: parts.push.as_ref(),
            recovery: &parts.recovery,
            process_tally: parts.process_tally.as_ref(),
        }
    }

    fn now(&self) -> crate::Timestamp {
        super::basics::now(self.clock)
    }

    /// The lifecycle's view of the time and the timeouts now.
    fn ctx(&self) -> Ctx {
        Ctx {
            now: self.now(),
            started_timeout: self.started_timeout,
            ready_timeout: self.ready_timeout,
        }
    }
}

fn count(c: &AtomicUsize) {
    c.fetch_add(1, Ordering::Relaxed);
}

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
    /// looked up as of ([`Interpreter::run_ops`]).
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

impl Interpreter<'_> {
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
                self.alerting
                    .raise_in(held, Alert::new(kind, pid, text, self.now()))
                    .await
            }
            Step::Clear { kind, pid } => self.alerting.clear_in(held, key(kind, pid)).await,
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
    /// [`Step::Save`] are carried out in the session's step, then the
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
        self.run(&mut Driven::Call { g, last }, event).await
    }

    /// Run `event` (a deadline, start-up recovery) through the lifecycle
    /// inside a session hook, in `step`, the step the engine holds the
    /// session in (with a shared store): each event's change is staged as
    /// in [`drive`](Self::drive), and the saved ones become the session's
    /// when the run ends, for the engine to save after the hook with
    /// everything written in the step. On an error the session keeps its
    /// state as it was.
    pub(crate) async fn drive_hook(
        &self,
        db: &Id,
        s: &mut SessionData<DbRecord>,
        mut step: Held<'_>,
        event: Event,
    ) -> Result<(), ExchangeError> {
        let mut kept = Kept {
            rec: s.state().clone(),
            deadline: s.expires_at(),
            changed: false,
        };
        self.run(
            &mut Driven::Hook {
                step: again(&mut step),
                kept: &mut kept,
            },
            event,
        )
        .await?;
        if kept.changed {
            if let Some(tally) = &self.process_tally {
                tally.replace(db, &kept.rec);
            }
            *s.persistent_mut() = kept.rec;
        }
        s.set_expires_at(kept.deadline);
        Ok(())
    }

    /// The one loop of [`drive`](Self::drive) and
    /// [`drive_hook`](Self::drive_hook): what a failed run wrote beside the
    /// record in the session's step is not kept; the step goes, and the
    /// call with it.
    async fn run(&self, d: &mut Driven<'_>, event: Event) -> Result<Answer, ExchangeError> {
        let ran = self.run_events(d, event).await;
        if ran.is_err()
            && let Some(step) = d.step()
        {
            step.abandon();
        }
        ran
    }

    /// [`run`](Self::run), the failures left to it.
    async fn run_events(&self, d: &mut Driven<'_>, event: Event) -> Result<Answer, ExchangeError> {
        let ctx = self.ctx();
        let mut out = Carried {
            registry: d
                .step()
                .and_then(|step| self.registry.version_in_step(step)),
            ..Carried::default()
        };
        out.next.push_back(event);
        while let Some(event) = out.next.pop_front() {
            let mut rec = d.record().clone();
            let steps = lifecycle::step(&mut rec, event, &ctx);
            let save = steps.iter().position(|s| matches!(s, Step::Save));
            let ends = ends_step(&steps);
            let mut deadline = None;
            let mut steps = steps.into_iter();
            for step in steps.by_ref().take(save.unwrap_or(usize::MAX)) {
                match step {
                    Step::Deadline(at) => deadline = Some(at),
                    other => self.carry(d, other, &mut out).await?,
                }
            }
            let Some(i) = save else {
                d.unsaved(Some(rec), deadline);
                continue;
            };
            let ends = ends == Some(i) && out.next.is_empty();
            self.save(d, rec, deadline, ends).await?;
            // A deadline set after the save is saved by the next save, if
            // one follows.
            let mut later = None;
            for step in steps.skip(1) {
                match step {
                    Step::Deadline(at) => later = Some(at),
                    Step::Save => {
                        if let Some(at) = later.take() {
                            let rec = d.record().clone();
                            self.save(d, rec, Some(at), false).await?;
                        }
                    }
                    other => self.carry(d, other, &mut out).await?,
                }
            }
            d.unsaved(None, later);
        }
        Ok(out.answer.unwrap_or(Answer::Ok))
    }

    /// Carry out `step` in the step `d` holds, if it may still write there
    /// ([`held`]).
    async fn carry(
        &self,
        d: &mut Driven<'_>,
        step: Step,
        out: &mut Carried,
    ) -> Result<(), ExchangeError> {
        let holds = d.holds();
        let held = held(&step, holds, d.step())?;
        self.carry_out(held, step, out).await
    }

    /// An event's change `rec` (and its deadline, if it set one) made the
    /// session's at its save: a call's committed now, the last change if
    /// `ends` says nothing after it needs the key; a hook's kept for the
    /// engine's save.
    async fn save(
        &self,
        d: &mut Driven<'_>,
        rec: DbRecord,
        at: Option<Option<Timestamp>>,
        ends: bool,
    ) -> Result<(), ExchangeError> {
        match d {
            Driven::Call { g, last } => {
                let mut staged = g.begin();
                *staged.persistent_mut() = rec;
                if let Some(at) = at {
                    staged.set_expires_at(at);
                }
                match *last && ends {
                    true => staged.commit_last().await?,
                    false => staged.commit().await?,
                }
                // No await between: the record is the session's exactly
                // when its processes are the list's.
                if let Some(tally) = &self.process_tally {
                    tally.replace(g.key(), g.state());
                }
            }
            Driven::Hook { kept, .. } => {
                kept.rec = rec;
                if let Some(at) = at {
                    kept.deadline = at;
                }
                kept.changed = true;
            }
        }
        Ok(())
    }
}

/// The session a run of the lifecycle changes, and how an event's change
/// becomes its state.
enum Driven<'a> {
    /// A protocol call's held session: each event's change is committed
    /// at its save. With `last`, the caller changes the session no more
    /// once the run ends (see [`Interpreter::drive`]).
    Call {
        g: &'a mut SessionGuard<Id, DbRecord>,
        last: bool,
    },
    /// A session hook's: the engine saves the session after the hook, in
    /// `step`, with everything written in it; the saved changes are
    /// `kept` until then.
    Hook { step: Held<'a>, kept: &'a mut Kept },
}

/// A hook's saved changes, made the session's when its run ends.
struct Kept {
    rec: DbRecord,
    deadline: Option<Timestamp>,
    /// An event saved its change.
    changed: bool,
}

impl Driven<'_> {
    /// The record as the events so far left it.
    fn record(&self) -> &DbRecord {
        match self {
            Driven::Call { g, .. } => g.state(),
            Driven::Hook { kept, .. } => &kept.rec,
        }
    }

    /// Whether the run still holds the session's key (a hook always does).
    fn holds(&self) -> bool {
        match self {
            Driven::Call { g, .. } => g.holds(),
            Driven::Hook { .. } => true,
        }
    }

    /// The step the run writes in.
    fn step(&mut self) -> Held<'_> {
        match self {
            Driven::Call { g, .. } => g.step(),
            Driven::Hook { step, .. } => again(step),
        }
    }

    /// A change that no save follows (an event's `rec` and deadline, or a
    /// deadline after the event's last save): a call drops it; a hook keeps
    /// it (the next event starts from it, it is the session's if a later
    /// event saves) and its deadline.
    fn unsaved(&mut self, rec: Option<DbRecord>, at: Option<Option<Timestamp>>) {
        if let Driven::Hook { kept, .. } = self {
            if let Some(rec) = rec {
                kept.rec = rec;
            }
            if let Some(at) = at {
                kept.deadline = at;
            }
        }
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
    use crate::UlidGenerator;
    use std::time::SystemTime;

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
