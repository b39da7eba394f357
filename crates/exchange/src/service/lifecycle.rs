//! The process lifecycle, as one pure function: [`step`] takes a
//! database's record and an [`Event`], changes the record, and answers the
//! [`Step`]s to carry out. Nothing in here reads a clock, touches a file or
//! a session (it only emits tracing events): protocol calls, deadlines, start-up recovery and operator
//! actions are all events, and the callers (`protocol.rs` for calls and the
//! operator, `hooks.rs` for deadlines and recovery) only carry out steps.
//!
//! ```text
//!  start ──▶ STARTED ◀── accept, prepare (first half: reply names saved)
//!             │  │  │
//!             │  │  └── rollback / abort ──▶ ROLLED_BACK / ABORTED
//!             │  │                           (replies deleted)
//!             │  └───── deadline, or crash past its timeout ──▶ TIMED_OUT
//!             │ prepare (second half: replies written)
//!             ▼
//!      READY_TO_COMMIT ── rollback / abort ──▶ ROLLED_BACK / ABORTED
//!        │          │
//! commit │          │ deadline or crash: moves to Unknown (and Error)
//! (moves │          │ saved, then run; retried with backoff until done;
//! saved) │          │ a late verdict meanwhile is saved and settles after)
//!        ▼          ▼
//!    CLEANUP       IN_DOUBT ── late commit / rollback, or the operator
//!        │    │                (verdict and moves saved, moves run, a
//!        │    │                failure retried with backoff, alerted)
//!        │    │                     ──▶ DONE / ROLLED_BACK / ABORTED
//!  moves │    │ moves failed (alert raised)
//!   done ▼    ▼
//!      DONE   FAILED ── deadline (backoff), commit, or crash: moves again
//!                          ──▶ DONE (alert cleared), or FAILED again
//! ```
//!
//! The session's deadline is the earliest time the record needs the
//! server by itself: the live process's timeout or retry, or the retry of
//! a settlement in doubt whose moves failed.
//!
//! Every process's owner record is written ([`Step::Owner`]) before the
//! database record that starts or ends it is saved ([`Step::Save`]) (a
//! live one's without waiting for it); a change
//! that file moves depend on (the intent record: CLEANUP with every move,
//! the moves into doubt, an in-doubt process's late verdict) is saved
//! before the moves run
//! ([`Step::Run`]), whose outcome comes back as [`Event::Ran`]. Every move
//! is idempotent, so after a crash the moves are simply run again.

use super::alert_kind::AlertKind;
use super::records::{DbRecord, Discarding, Process, Verdict};
use crate::mailbox::FileName;
use crate::store::Op;
use crate::wire::{ProcessState, ResultStatus};
use crate::{Id, MessageId, ProcessId, Timestamp};
use std::time::Duration;

/// The longest wait between retries of moves that failed.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// How long before a deadline or recovery action that failed outside the
/// file moves (an owner record, a save) is tried again.
pub(crate) const RETRY: Duration = Duration::from_secs(60);
/// When decided moves (an intent record just saved) are due again if they
/// have not finished: they normally finish within the call that decided
/// them, in milliseconds. Should that call's node die after the save, the
/// record's deadline is what brings a live node to run them (a shared
/// store runs no start-up processing); while the call is alive it holds
/// the database's key, and the deadline waits for it.
const RUN_GRACE: Duration = Duration::from_secs(2);

/// What the lifecycle needs to know besides the record: the time and the
/// timeouts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx {
    pub(crate) now: Timestamp,
    pub(crate) started_timeout: Duration,
    pub(crate) ready_timeout: Duration,
}

impl Ctx {
    /// The time `d` from now.
    fn after(&self, d: Duration) -> Timestamp {
        plus(self.now, d)
    }
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    Timestamp::from_millis(t.as_millis().saturating_add(millis(d)))
}

/// The session's deadline: the earliest time the record needs the server
/// by itself, over the live process and the settlements in doubt whose
/// moves are to be tried again.
fn next_deadline(rec: &DbRecord, ctx: &Ctx) -> Option<estafeta_session::Timestamp> {
    rec.process
        .iter()
        .filter_map(|p| due(p, ctx))
        .chain(rec.in_doubt.iter().filter_map(|p| p.retry_at))
        .min()
        .map(|t| estafeta_session::Timestamp(u64::try_from(t.as_millis()).unwrap_or(0)))
}

/// When the live process `p` needs the server by itself: its timeout, or
/// the retry of moves that failed.
fn due(p: &Process, ctx: &Ctx) -> Option<Timestamp> {
    match p.state {
        ProcessState::Started => Some(plus(p.started_at, ctx.started_timeout)),
        ProcessState::ReadyToCommit if p.target.is_none() => {
            Some(plus(p.ready_at.unwrap_or(p.started_at), ctx.ready_timeout))
        }
        _ => p.retry_at,
    }
}

/// Something that happens to a database's processes.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    /// API_1: a process of these messages, with a new id.
    Start {
        pid: ProcessId,
        db: Id,
        messages: Vec<FileName>,
    },
    /// API_2: the processor narrowed the list (checked against it).
    Accept { pid: ProcessId, ids: Vec<MessageId> },
    /// API_3, first half: these reply files are about to be written.
    Preparing {
        pid: ProcessId,
        names: Vec<FileName>,
    },
    /// API_3, second half: the replies are written.
    Prepared {
        pid: ProcessId,
        results: Vec<Verdict>,
        replies: Vec<FileName>,
        scheduled: Vec<(MessageId, Timestamp)>,
    },
    /// API_4, or the operator settling a process in doubt as committed.
    /// `ended`: how the owner record says the process ended, when the
    /// database holds it no more.
    Commit {
        pid: ProcessId,
        ended: Option<ProcessState>,
    },
    /// API_5 (`as_state` ROLLED_BACK) or API_6 (ABORTED), or the operator
    /// settling a process in doubt as rolled back.
    GiveUp {
        pid: ProcessId,
        as_state: ProcessState,
        ended: Option<ProcessState>,
    },
    /// The database session's deadline passed.
    Deadline,
    /// The record was saved by an earlier run of the server (start-up).
    Recover,
    /// The file operations of a [`Step::Run`] finished (or one failed).
    Ran {
        pid: ProcessId,
        result: Result<(), String>,
    },
}

/// The answer a call gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Ok,
    /// A start while a process lives.
    Busy,
    Cancelled,
    /// Commit only: the moves failed; they are retried.
    Failed,
}

/// What start-up processing found, for its report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    TimedOut,
    Cleanup,
    InDoubt,
}

/// One thing to carry out, in order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Step {
    /// Record in the process's own session how it ended (or, once its
    /// commit is saved, how it will end: the database record is asked
    /// first while it holds the process), before the [`Step::Save`] that
    /// lets the database forget it; a record already durable is not
    /// written again. Or record that it lives (`ended: None`), before the
    /// save that makes it live, only if it has no owner record yet: with a
    /// shared store in the same transaction as that save; otherwise without
    /// waiting for that record to be durable (start-up recovery writes it
    /// again for every process the database holds).
    Owner {
        pid: ProcessId,
        db: Id,
        ended: Option<ProcessState>,
    },
    /// Delete these reply files from the database's `Prepared`; a store out
    /// of reach fails the step before its save, other failures are only
    /// logged (the file store's start-up moves leftovers to `Unknown`).
    Discard { db: Id, names: Vec<FileName> },
    /// Set the session's deadline (`None`: no deadline).
    Deadline(Option<estafeta_session::Timestamp>),
    /// Save the database record durably before going on.
    Save,
    /// Run these file operations (moves concurrently, then deletes); the
    /// outcome comes back as [`Event::Ran`].
    Run { pid: ProcessId, ops: Vec<Op> },
    /// Raise an alert about the process.
    Raise {
        kind: AlertKind,
        pid: ProcessId,
        text: String,
    },
    /// The alert of `kind` about the process ended.
    Clear { kind: AlertKind, pid: ProcessId },
    /// Start-up processing found this (counted in its report).
    Count(Found),
    /// Answer the call.
    Answer(Answer),
}

/// Whether a new process may start: none lives, and no settlement of a
/// process in doubt waits for its moves to be tried again (a rollback's
/// moves put messages back into `Messages`: a new process given one could
/// see it moved away under it).
pub(crate) fn can_start(rec: &DbRecord) -> bool {
    rec.process.is_none() && rec.in_doubt.iter().all(|p| p.target.is_none())
}

/// The live process `pid`, if it is STARTED (what API_2 and API_3 check
/// their request against).
pub(crate) fn started<'r>(rec: &'r DbRecord, pid: &ProcessId) -> Option<&'r Process> {
    rec.process
        .as_ref()
        .filter(|p| p.id == *pid && p.state == ProcessState::Started)
}

/// Whether the record holds `pid` (live or in doubt); if not, the caller
/// looks up how it ended.
pub(crate) fn holds(rec: &DbRecord, pid: &ProcessId) -> bool {
    rec.process
        .iter()
        .chain(&rec.in_doubt)
        .any(|p| p.id == *pid)
}

/// The lifecycle: apply `event` to the record of one database, and say what
/// to carry out.
pub(crate) fn step(rec: &mut DbRecord, event: Event, ctx: &Ctx) -> Vec<Step> {
    match event {
        Event::Start { pid, db, messages } => start(rec, pid, db, messages, ctx),
        Event::Accept { pid, ids } => match live_started(rec, &pid) {
            Some(p) => {
                p.accepted = Some(ids);
                vec![Step::Save, Step::Answer(Answer::Ok)]
            }
            None => cancelled(),
        },
        Event::Preparing { pid, names } => match live_started(rec, &pid) {
            Some(p) => {
                let old = std::mem::replace(&mut p.preparing, names);
                vec![
                    Step::Discard {
                        db: p.db.clone(),
                        names: old,
                    },
                    Step::Save,
                ]
            }
            None => cancelled(),
        },
        Event::Prepared {
            pid,
            results,
            replies,
            scheduled,
        } => match live_started(rec, &pid) {
            Some(p) => {
                p.results = results;
                p.replies = replies;
                p.preparing.clear();
                p.scheduled = scheduled;
                p.state = ProcessState::ReadyToCommit;
                p.ready_at = Some(ctx.now);
                for v in &p.results {
                    if v.status == ResultStatus::ProcessedIncorrect {
                        tracing::warn!(
                            target: "estafeta::event", process = %p.id, db = %p.db, message = %v.name.id,
                            code = ?v.error_code, text = ?v.error_text, "message processed incorrectly"
                        );
                    }
                }
                vec![
                    Step::Deadline(next_deadline(rec, ctx)),
                    Step::Save,
                    Step::Answer(Answer::Ok),
                ]
            }
            None => cancelled(),
        },
        Event::Commit { pid, ended } => commit(rec, pid, ended, ctx),
        Event::GiveUp {
            pid,
            as_state,
            ended,
        } => give_up(rec, pid, as_state, ended, ctx),
        Event::Deadline => deadline(rec, ctx),
        Event::Recover => recover(rec, ctx),
        Event::Ran { pid, result } => ran(rec, pid, result, ctx),
    }
}

fn cancelled() -> Vec<Step> {
    vec![Step::Answer(Answer::Cancelled)]
}

fn live_started<'r>(rec: &'r mut DbRecord, pid: &ProcessId) -> Option<&'r mut Process> {
    rec.process
        .as_mut()
        .filter(|p| p.id == *pid && p.state == ProcessState::Started)
}

fn start(
    rec: &mut DbRecord,
    pid: ProcessId,
    db: Id,
    messages: Vec<FileName>,
    ctx: &Ctx,
) -> Vec<Step> {
    if !can_start(rec) {
        return vec![Step::Answer(Answer::Busy)];
    }
    rec.process = Some(Process::started(pid, db.clone(), messages, ctx.now));
    let mut steps = discard_decided(rec);
    steps.extend([
        Step::Deadline(next_deadline(rec, ctx)),
        Step::Owner {
            pid,
            db,
            ended: None,
        },
        Step::Save,
        Step::Answer(Answer::Ok),
    ]);
    steps
}

/// The deletion of a given-up process's replies, decided and saved
/// ([`DbRecord::discarding`]), run (again) before a save that forgets it.
fn discard_decided(rec: &mut DbRecord) -> Vec<Step> {
    rec.discarding
        .take()
        .map(|d| Step::Discard {
            db: d.db,
            names: d.names,
        })
        .into_iter()
        .collect()
}

fn commit(rec: &mut DbRecord, pid: ProcessId, ended: Option<ProcessState>, ctx: &Ctx) -> Vec<Step> {
    if let Some(p) = rec.process.as_mut().filter(|p| p.id == pid) {
        return match p.state {
            ProcessState::ReadyToCommit if p.target.is_some() => {
                late_verdict(p, ProcessState::Done)
            }
            ProcessState::ReadyToCommit => {
                // The intent record: CLEANUP with every move decided,
                // durable before the first file moves.
                p.pending = p.moves_on_commit();
                p.target = Some(ProcessState::Done);
                p.state = ProcessState::Cleanup;
                decided(p, ctx);
                let (db, ops) = (p.db.clone(), p.pending.clone());
                vec![
                    Step::Deadline(next_deadline(rec, ctx)),
                    Step::Save,
                    // How it will end, recorded while its files move.
                    Step::Owner {
                        pid,
                        db,
                        ended: Some(ProcessState::Done),
                    },
                    Step::Run { pid, ops },
                ]
            }
            ProcessState::Cleanup | ProcessState::Failed => vec![Step::Run {
                pid,
                ops: p.pending.clone(),
            }],
            _ => cancelled(),
        };
    }
    if let Some(p) = rec.in_doubt.iter_mut().find(|p| p.id == pid) {
        let steps = settle(p, ProcessState::Done, ctx);
        return with_deadline(rec, ctx, steps);
    }
    match ended {
        Some(ProcessState::Done) => vec![Step::Answer(Answer::Ok)],
        _ => {
            tracing::info!(target: "estafeta::event", process = %pid, "commit answered CANCELLED");
            cancelled()
        }
    }
}

fn give_up(
    rec: &mut DbRecord,
    pid: ProcessId,
    as_state: ProcessState,
    ended: Option<ProcessState>,
    ctx: &Ctx,
) -> Vec<Step> {
    if let Some(p) = rec.process.as_mut().filter(|p| p.id == pid) {
        if p.state == ProcessState::ReadyToCommit && p.target.is_some() {
            return late_verdict(p, as_state);
        }
        if !matches!(p.state, ProcessState::Started | ProcessState::ReadyToCommit) {
            return cancelled();
        }
        // The end is saved first, with the replies to delete named
        // (`discarding`): a crash before their deletion leaves a record
        // that names them, whose start-up processing deletes them, not a
        // READY_TO_COMMIT process whose replies are gone.
        let names: Vec<FileName> = p.replies.iter().chain(&p.preparing).cloned().collect();
        let db = p.db.clone();
        if let Some(p) = rec.process.take() {
            rec.end(p, as_state, ctx.now);
        }
        let mut steps = discard_decided(rec);
        rec.discarding = Some(Discarding {
            db: db.clone(),
            names: names.clone(),
        });
        steps.extend([
            Step::Owner {
                pid,
                db: db.clone(),
                ended: Some(as_state),
            },
            Step::Deadline(next_deadline(rec, ctx)),
            Step::Save,
            Step::Discard { db, names },
            Step::Answer(Answer::Ok),
        ]);
        return steps;
    }
    if let Some(p) = rec.in_doubt.iter_mut().find(|p| p.id == pid) {
        let steps = settle(p, as_state, ctx);
        return with_deadline(rec, ctx, steps);
    }
    match ended {
        Some(ProcessState::Done) | None => {
            tracing::info!(target: "estafeta::event", process = %pid, state = ?as_state, "rollback or abort answered CANCELLED");
            cancelled()
        }
        // Ended with nothing committed; the deletion of its replies, if a
        // store out of reach failed it, is tried again.
        Some(_) => {
            let mut steps = discard_decided(rec);
            if !steps.is_empty() {
                steps.push(Step::Save);
            }
            steps.push(Step::Answer(Answer::Ok));
            steps
        }
    }
}

/// Whether two verdicts agree on whether the processor committed.
fn agree(a: ProcessState, b: ProcessState) -> bool {
    (a == ProcessState::Done) == (b == ProcessState::Done)
}

/// A late commit, rollback or abort of a process in doubt: its verdict and
/// moves are saved, then the moves run; it ends as `target` (DONE,
/// ROLLED_BACK or ABORTED). Once a verdict is saved it stands: the same
/// one runs its moves again at once, the other is CANCELLED. The caller
/// sets the record's deadline before the save ([`with_deadline`]).
fn settle(p: &mut Process, target: ProcessState, ctx: &Ctx) -> Vec<Step> {
    let commit = target == ProcessState::Done;
    match p.target {
        Some(saved) if !agree(saved, target) => {
            tracing::info!(target: "estafeta::event", process = %p.id, db = %p.db, commit, "settlement answered CANCELLED: the other verdict is saved");
            return cancelled();
        }
        Some(_) => {
            return vec![Step::Run {
                pid: p.id,
                ops: p.pending.clone(),
            }];
        }
        None => {}
    }
    tracing::info!(target: "estafeta::event", process = %p.id, db = %p.db, commit, "settling a process in doubt");
    p.pending = p.moves_settling(commit);
    p.target = Some(target);
    decided(p, ctx);
    vec![
        Step::Save,
        Step::Run {
            pid: p.id,
            ops: p.pending.clone(),
        },
    ]
}

/// A late commit, rollback or abort of a READY_TO_COMMIT process whose
/// moves into doubt are decided but not all done: the verdict is saved,
/// the moves run again, and it settles the process once they are done.
fn late_verdict(p: &mut Process, verdict: ProcessState) -> Vec<Step> {
    if p.verdict.is_some_and(|saved| !agree(saved, verdict)) {
        return cancelled();
    }
    p.verdict.get_or_insert(verdict);
    vec![
        Step::Save,
        Step::Run {
            pid: p.id,
            ops: p.pending.clone(),
        },
    ]
}

/// The live READY_TO_COMMIT process passed its timeout (or was found at
/// start-up): the moves that put it in doubt are its intent record, saved
/// before they run, so that a failure or a crash part-way resumes them and
/// a late verdict finds every file in `Unknown`. This runs in a session
/// hook, whose record is saved when the hook returns, after any moves it
/// ran: so the hook that decides the moves only saves them, due at once,
/// and the next firing runs them. (Run in the same hook, a crash after the
/// moves would leave the record as it was, and a commit through another
/// node would look for the files where they no longer are.)
fn go_to_doubt(p: &mut Process, ctx: &Ctx) -> Vec<Step> {
    if p.target.is_none() {
        p.pending = p.moves_into_doubt();
        p.target = Some(ProcessState::InDoubt);
        p.retry_at = Some(ctx.now);
        return vec![Step::Save];
    }
    vec![
        Step::Save,
        Step::Run {
            pid: p.id,
            ops: p.pending.clone(),
        },
    ]
}

fn deadline(rec: &mut DbRecord, ctx: &Ctx) -> Vec<Step> {
    let mut steps = Vec::new();
    let live = rec
        .process
        .as_ref()
        .filter(|p| due(p, ctx).is_none_or(|t| t <= ctx.now))
        .map(|p| p.state);
    match live {
        Some(ProcessState::Started) => {
            if let Some(p) = &rec.process {
                tracing::warn!(target: "estafeta::event", process = %p.id, db = %p.db, "STARTED process timed out");
            }
            steps.extend(time_out(rec, ctx));
        }
        Some(ProcessState::ReadyToCommit) => {
            if let Some(p) = rec.process.as_mut() {
                steps.extend(go_to_doubt(p, ctx));
            }
        }
        Some(ProcessState::Cleanup | ProcessState::Failed) => {
            if let Some(p) = &rec.process {
                steps.push(Step::Run {
                    pid: p.id,
                    ops: p.pending.clone(),
                });
            }
        }
        _ => {}
    }
    for p in rec
        .in_doubt
        .iter()
        .filter(|p| p.target.is_some() && p.retry_at.is_some_and(|t| t <= ctx.now))
    {
        steps.push(Step::Run {
            pid: p.id,
            ops: p.pending.clone(),
        });
    }
    steps.insert(0, Step::Deadline(next_deadline(rec, ctx)));
    steps
}

/// The live STARTED process timed out: a prepare under way is dropped.
fn time_out(rec: &mut DbRecord, ctx: &Ctx) -> Vec<Step> {
    let Some(p) = rec.process.take() else {
        return Vec::new();
    };
    let steps = vec![
        Step::Discard {
            db: p.db.clone(),
            names: p.preparing.clone(),
        },
        Step::Owner {
            pid: p.id,
            db: p.db.clone(),
            ended: Some(ProcessState::TimedOut),
        },
        Step::Deadline(next_deadline(rec, ctx)),
        Step::Save,
    ];
    rec.end(p, ProcessState::TimedOut, ctx.now);
    steps
}

fn recover(rec: &mut DbRecord, ctx: &Ctx) -> Vec<Step> {
    let mut steps = discard_decided(rec);
    if let Some(p) = rec.process.as_mut() {
        match p.state {
            ProcessState::Started => {
                // A prepare that was under way when the server died was
                // never answered: its reply files go.
                let past = p
                    .started_at
                    .as_millis()
                    .saturating_add(millis(ctx.started_timeout))
                    <= ctx.now.as_millis();
                if past {
                    steps.push(Step::Count(Found::TimedOut));
                    steps.extend(time_out(rec, ctx));
                } else {
                    steps.push(Step::Discard {
                        db: p.db.clone(),
                        names: std::mem::take(&mut p.preparing),
                    });
                }
            }
            ProcessState::ReadyToCommit => {
                steps.push(Step::Count(Found::InDoubt));
                steps.extend(go_to_doubt(p, ctx));
            }
            ProcessState::Cleanup | ProcessState::Failed => {
                steps.push(Step::Count(Found::Cleanup));
                // Found undone at start-up: due now.
                p.retry_at = Some(ctx.now);
                steps.push(Step::Run {
                    pid: p.id,
                    ops: p.pending.clone(),
                });
            }
            _ => {}
        }
    }
    // Late verdicts on processes in doubt, decided but not finished: due
    // now, as the moves of a live process found decided.
    for p in rec.in_doubt.iter_mut().filter(|p| p.target.is_some()) {
        p.retry_at = Some(ctx.now);
        steps.push(Step::Run {
            pid: p.id,
            ops: p.pending.clone(),
        });
    }
    // A start's owner record is not waited for: it may be missing.
    for p in rec.open() {
        steps.push(Step::Owner {
            pid: p.id,
            db: p.db.clone(),
            ended: None,
        });
    }
    steps.push(Step::Deadline(next_deadline(rec, ctx)));
    steps.push(Step::Save);
    steps
}

/// The moves of `p` are decided and about to be saved: they are due again
/// after [`RUN_GRACE`], unless a failed attempt already set their retry.
fn decided(p: &mut Process, ctx: &Ctx) {
    p.retry_at.get_or_insert(ctx.after(RUN_GRACE));
}

/// `steps` (which save the record) with the record's deadline set first.
fn with_deadline(rec: &DbRecord, ctx: &Ctx, mut steps: Vec<Step>) -> Vec<Step> {
    steps.insert(0, Step::Deadline(next_deadline(rec, ctx)));
    steps
}

/// Moves of `p` failed: they are tried again after a backoff that grows
/// with each failed attempt, and an alert says so. The alert is raised
/// after the attempt is saved, so that the success that clears it (the
/// [`moved`] of a process with failed attempts) is never missed.
fn failed(p: &mut Process, e: &str, ctx: &Ctx) -> Step {
    p.attempts = p.attempts.saturating_add(1);
    let backoff = Duration::from_secs(1u64 << p.attempts.min(16)).min(MAX_BACKOFF);
    p.retry_at = Some(ctx.after(backoff));
    let what = match p.state {
        ProcessState::Cleanup | ProcessState::Failed => "process FAILED: its commit",
        ProcessState::ReadyToCommit => "process going in doubt: its files",
        _ => "process in doubt: its late settlement",
    };
    tracing::error!(
        target: "estafeta::alert",
        process = %p.id, db = %p.db, error = %e, attempts = p.attempts,
        "{what} could not move its files; retrying with backoff"
    );
    Step::Raise {
        kind: AlertKind::Failed,
        pid: p.id,
        text: format!(
            "{what} of process {} of database {} could not move its files ({e}); retrying with backoff",
            p.id, p.db
        ),
    }
}

/// The answer to a call whose moves failed and are retried: FAILED for a
/// commit, OK for a rollback or abort (its verdict is saved and carried
/// out by the retries).
fn retried(verdict: Option<ProcessState>) -> Vec<Step> {
    match verdict {
        Some(ProcessState::Done) => vec![Step::Answer(Answer::Failed)],
        Some(_) => vec![Step::Answer(Answer::Ok)],
        None => Vec::new(),
    }
}

/// The alerts that end when the moves of `p` succeed. A failed attempt
/// in a session hook (a deadline, start-up processing) raises its alert
/// before the engine saves the hook's record: a crash in between forgets
/// the attempt but not the alert. Such an attempt was due, so moves that
/// were overdue when they succeed end the alert too.
fn moved(p: &Process, ctx: &Ctx) -> Vec<Step> {
    let overdue = p.retry_at.is_some_and(|t| t <= ctx.now);
    if p.attempts > 0 || overdue {
        vec![Step::Clear {
            kind: AlertKind::Failed,
            pid: p.id,
        }]
    } else {
        Vec::new()
    }
}

fn ran(rec: &mut DbRecord, pid: ProcessId, result: Result<(), String>, ctx: &Ctx) -> Vec<Step> {
    if let Some(p) = rec.process.as_mut().filter(|p| p.id == pid) {
        return match (p.state, result) {
            (ProcessState::ReadyToCommit, Ok(())) => go_in_doubt(rec, ctx),
            (ProcessState::Cleanup | ProcessState::Failed, Ok(())) => {
                let target = p.target.unwrap_or(ProcessState::Done);
                let mut steps = moved(p, ctx);
                steps.push(Step::Owner {
                    pid,
                    db: p.db.clone(),
                    ended: Some(target),
                });
                if let Some(p) = rec.process.take() {
                    rec.end(p, target, ctx.now);
                }
                steps.extend([
                    Step::Deadline(next_deadline(rec, ctx)),
                    Step::Save,
                    Step::Answer(Answer::Ok),
                ]);
                steps
            }
            (
                state
                @ (ProcessState::ReadyToCommit | ProcessState::Cleanup | ProcessState::Failed),
                Err(e),
            ) => {
                if state == ProcessState::Cleanup {
                    p.state = ProcessState::Failed;
                }
                let answer = if state == ProcessState::ReadyToCommit {
                    retried(p.verdict)
                } else {
                    retried(p.target)
                };
                let raise = failed(p, &e, ctx);
                let mut steps = vec![Step::Deadline(next_deadline(rec, ctx)), Step::Save, raise];
                steps.extend(answer);
                steps
            }
            _ => Vec::new(),
        };
    }
    let Some(i) = rec
        .in_doubt
        .iter()
        .position(|p| p.id == pid && p.target.is_some())
    else {
        return Vec::new();
    };
    match result {
        Err(e) => {
            let p = &mut rec.in_doubt[i];
            let answer = retried(p.target);
            let raise = failed(p, &e, ctx);
            let mut steps = vec![Step::Deadline(next_deadline(rec, ctx)), Step::Save, raise];
            steps.extend(answer);
            steps
        }
        Ok(()) => {
            let p = rec.in_doubt.remove(i);
            let target = p.target.unwrap_or(ProcessState::Done);
            let mut steps = moved(&p, ctx);
            steps.extend([
                Step::Clear {
                    kind: AlertKind::InDoubt,
                    pid,
                },
                Step::Owner {
                    pid,
                    db: p.db.clone(),
                    ended: Some(target),
                },
            ]);
            rec.end(p, target, ctx.now);
            steps.extend([
                Step::Deadline(next_deadline(rec, ctx)),
                Step::Save,
                Step::Answer(Answer::Ok),
            ]);
            tracing::info!(target: "estafeta::event", process = %pid, commit = target == ProcessState::Done, "process in doubt settled");
            steps
        }
    }
}

/// The live READY_TO_COMMIT process's files are in `Unknown` (and
/// `Error`): it is in doubt until a late commit or rollback, or settled at
/// once by the late verdict that came while its files moved.
fn go_in_doubt(rec: &mut DbRecord, ctx: &Ctx) -> Vec<Step> {
    let Some(mut p) = rec.process.take() else {
        return Vec::new();
    };
    let mut steps = moved(&p, ctx);
    p.state = ProcessState::InDoubt;
    p.pending.clear();
    p.target = None;
    p.attempts = 0;
    p.retry_at = None;
    let verdict = p.verdict.take();
    rec.counters.went_in_doubt(ctx.now);
    tracing::error!(
        target: "estafeta::alert",
        process = %p.id, db = %p.db,
        "process in doubt: READY_TO_COMMIT past its timeout; its files are in Unknown until a late commit or rollback"
    );
    let text = format!(
        "process {} of database {} is in doubt: READY_TO_COMMIT past its timeout; its files are in Unknown until a late commit or rollback",
        p.id, p.db
    );
    let pid = p.id;
    rec.in_doubt.push(p);
    // Settled first, so that the deadline saved with the record covers
    // the settlement's moves too.
    let settled = match (verdict, rec.in_doubt.last_mut()) {
        (Some(verdict), Some(p)) => settle(p, verdict, ctx),
        _ => Vec::new(),
    };
    steps.extend([
        Step::Raise {
            kind: AlertKind::InDoubt,
            pid,
            text,
        },
        Step::Deadline(next_deadline(rec, ctx)),
        Step::Save,
    ]);
    steps.extend(settled);
    steps
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
