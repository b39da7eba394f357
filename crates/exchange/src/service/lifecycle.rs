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
//! commit │          │ deadline or crash: files to Unknown (and Error)
//! (moves ▼          ▼
//! saved) CLEANUP   IN_DOUBT ── late commit / rollback, or the operator
//!        │    │                (verdict and moves saved, moves run)
//!        │    │                     ──▶ DONE / ROLLED_BACK
//!  moves │    │ moves failed (alert raised)
//!   done ▼    ▼
//!      DONE   FAILED ── deadline (backoff), commit, or crash: moves again
//!                          ──▶ DONE (alert cleared), or FAILED again
//! ```
//!
//! Every ended process's owner record is written ([`Step::Owner`]) before
//! the database record that ends it is saved ([`Step::Save`]); a change
//! that file moves depend on (the intent record: CLEANUP with every move,
//! an in-doubt process's late verdict) is saved before the moves run
//! ([`Step::Run`]), whose outcome comes back as [`Event::Ran`]. Every move
//! is idempotent, so after a crash the moves are simply run again.

use super::alert_kind::AlertKind;
use super::state::{DbRecord, FileOp, Process, Verdict};
use crate::mailbox::{FileName, Folder};
use crate::wire::{ProcessState, ResultStatus};
use crate::{Id, MessageId, ProcessId, Timestamp};
use std::time::Duration;

/// How many ended processes a database session remembers in full (for the
/// admin list); older ones are only in their process sessions.
const RECENT: usize = 32;
/// The longest wait between retries of moves that failed.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// How long before a failed deadline or recovery action is tried again.
pub(crate) const RETRY: Duration = Duration::from_secs(60);

/// What the lifecycle needs to know besides the record: the time and the
/// timeouts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx {
    pub(crate) now: Timestamp,
    pub(crate) started_timeout: Duration,
    pub(crate) ready_timeout: Duration,
}

impl Ctx {
    /// The session deadline `d` from now.
    fn after(&self, d: Duration) -> Option<estafeta_session::Timestamp> {
        let now = u64::try_from(self.now.as_millis()).unwrap_or(0);
        Some(estafeta_session::Timestamp(now).after(d))
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
        deferred: Vec<(MessageId, Timestamp)>,
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
    /// Record in the process's own session that it lives (`ended: None`)
    /// or how it ended. Before the [`Step::Save`] that follows.
    Owner {
        pid: ProcessId,
        db: Id,
        ended: Option<ProcessState>,
    },
    /// Delete these reply files from the database's `Prepared`; a failure
    /// is only logged (start-up moves leftovers to `Unknown`).
    Discard { db: Id, names: Vec<FileName> },
    /// Set the session's deadline (`None`: no deadline).
    Deadline(Option<estafeta_session::Timestamp>),
    /// Save the database record durably before going on.
    Save,
    /// Run these file operations (moves concurrently, then deletes); the
    /// outcome comes back as [`Event::Ran`].
    Run { pid: ProcessId, ops: Vec<FileOp> },
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
    /// The call fails with the error of the last [`Step::Run`]; a deadline
    /// or recovery is tried again after [`RETRY`]. Nothing changed.
    Fail(String),
}

/// Whether a new process may start: none lives.
pub(crate) fn can_start(rec: &DbRecord) -> bool {
    rec.process.is_none()
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
            deferred,
        } => match live_started(rec, &pid) {
            Some(p) => {
                p.results = results;
                p.replies = replies;
                p.preparing.clear();
                p.deferred = deferred;
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
                    Step::Deadline(ctx.after(ctx.ready_timeout)),
                    Step::Save,
                    Step::Answer(Answer::Ok),
                ]
            }
            None => cancelled(),
        },
        Event::Commit { pid, ended } => commit(rec, pid, ended),
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
    vec![
        Step::Owner {
            pid,
            db,
            ended: None,
        },
        Step::Deadline(ctx.after(ctx.started_timeout)),
        Step::Save,
        Step::Answer(Answer::Ok),
    ]
}

fn commit(rec: &mut DbRecord, pid: ProcessId, ended: Option<ProcessState>) -> Vec<Step> {
    if let Some(p) = rec.process.as_mut().filter(|p| p.id == pid) {
        return match p.state {
            ProcessState::ReadyToCommit => {
                // The intent record: CLEANUP with every move decided,
                // durable before the first file moves.
                p.pending = commit_ops(p);
                p.target = Some(ProcessState::Done);
                p.state = ProcessState::Cleanup;
                vec![
                    Step::Deadline(None),
                    Step::Save,
                    Step::Run {
                        pid,
                        ops: p.pending.clone(),
                    },
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
        return settle(p, ProcessState::Done);
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
    if let Some(p) = rec.process.as_ref().filter(|p| p.id == pid) {
        if !matches!(p.state, ProcessState::Started | ProcessState::ReadyToCommit) {
            return cancelled();
        }
        let names = p.replies.iter().chain(&p.preparing).cloned().collect();
        let db = p.db.clone();
        if let Some(p) = rec.process.take() {
            end(rec, p, as_state, ctx.now);
        }
        return vec![
            Step::Discard {
                db: db.clone(),
                names,
            },
            Step::Owner {
                pid,
                db,
                ended: Some(as_state),
            },
            Step::Deadline(None),
            Step::Save,
            Step::Answer(Answer::Ok),
        ];
    }
    if let Some(p) = rec.in_doubt.iter_mut().find(|p| p.id == pid) {
        return settle(p, as_state);
    }
    match ended {
        Some(ProcessState::Done) | None => {
            tracing::info!(target: "estafeta::event", process = %pid, state = ?as_state, "rollback or abort answered CANCELLED");
            cancelled()
        }
        Some(_) => vec![Step::Answer(Answer::Ok)],
    }
}

/// A late commit, rollback or abort of a process in doubt: its verdict and
/// moves are saved, then the moves run; it ends as `target` (DONE,
/// ROLLED_BACK or ABORTED).
fn settle(p: &mut Process, target: ProcessState) -> Vec<Step> {
    let commit = target == ProcessState::Done;
    tracing::info!(target: "estafeta::event", process = %p.id, db = %p.db, commit, "settling a process in doubt");
    p.pending = settle_ops(p, commit);
    p.target = Some(target);
    vec![
        Step::Save,
        Step::Run {
            pid: p.id,
            ops: p.pending.clone(),
        },
    ]
}

fn deadline(rec: &mut DbRecord, ctx: &Ctx) -> Vec<Step> {
    let Some(p) = rec.process.as_ref() else {
        return vec![Step::Deadline(None)];
    };
    match p.state {
        ProcessState::Started => {
            tracing::warn!(target: "estafeta::event", process = %p.id, db = %p.db, "STARTED process timed out");
            time_out(rec, ctx)
        }
        ProcessState::ReadyToCommit => vec![Step::Run {
            pid: p.id,
            ops: in_doubt_ops(p),
        }],
        ProcessState::Cleanup | ProcessState::Failed => vec![Step::Run {
            pid: p.id,
            ops: p.pending.clone(),
        }],
        _ => vec![Step::Deadline(None)],
    }
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
        Step::Deadline(None),
        Step::Save,
    ];
    end(rec, p, ProcessState::TimedOut, ctx.now);
    steps
}

fn recover(rec: &mut DbRecord, ctx: &Ctx) -> Vec<Step> {
    let mut steps = Vec::new();
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
                steps.push(Step::Run {
                    pid: p.id,
                    ops: in_doubt_ops(p),
                });
            }
            ProcessState::Cleanup | ProcessState::Failed => {
                steps.push(Step::Count(Found::Cleanup));
                steps.push(Step::Run {
                    pid: p.id,
                    ops: p.pending.clone(),
                });
            }
            _ => {}
        }
    }
    // Late verdicts on processes in doubt, decided but not finished.
    for p in rec.in_doubt.iter().filter(|p| p.target.is_some()) {
        steps.push(Step::Run {
            pid: p.id,
            ops: p.pending.clone(),
        });
    }
    steps.push(Step::Save);
    steps
}

fn ran(rec: &mut DbRecord, pid: ProcessId, result: Result<(), String>, ctx: &Ctx) -> Vec<Step> {
    if let Some(p) = rec.process.as_mut().filter(|p| p.id == pid) {
        return match (p.state, result) {
            (ProcessState::ReadyToCommit, Ok(())) => go_in_doubt(rec, ctx),
            (ProcessState::ReadyToCommit, Err(e)) => vec![Step::Fail(e)],
            (ProcessState::Cleanup | ProcessState::Failed, Ok(())) => {
                let failed = p.attempts > 0;
                let target = p.target.unwrap_or(ProcessState::Done);
                let mut steps = Vec::new();
                if failed {
                    steps.push(Step::Clear {
                        kind: AlertKind::Failed,
                        pid,
                    });
                }
                steps.push(Step::Owner {
                    pid,
                    db: p.db.clone(),
                    ended: Some(target),
                });
                if let Some(p) = rec.process.take() {
                    end(rec, p, target, ctx.now);
                }
                steps.extend([Step::Deadline(None), Step::Save, Step::Answer(Answer::Ok)]);
                steps
            }
            (ProcessState::Cleanup | ProcessState::Failed, Err(e)) => {
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
                vec![
                    Step::Raise {
                        kind: AlertKind::Failed,
                        pid,
                        text,
                    },
                    Step::Deadline(ctx.after(backoff)),
                    Step::Save,
                    Step::Answer(Answer::Failed),
                ]
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
        Err(e) => vec![Step::Fail(e)],
        Ok(()) => {
            let p = rec.in_doubt.remove(i);
            let target = p.target.unwrap_or(ProcessState::Done);
            let steps = vec![
                Step::Clear {
                    kind: AlertKind::InDoubt,
                    pid,
                },
                Step::Owner {
                    pid,
                    db: p.db.clone(),
                    ended: Some(target),
                },
                Step::Save,
                Step::Answer(Answer::Ok),
            ];
            end(rec, p, target, ctx.now);
            tracing::info!(target: "estafeta::event", process = %pid, commit = target == ProcessState::Done, "process in doubt settled");
            steps
        }
    }
}

/// The live READY_TO_COMMIT process's files are in `Unknown` (and
/// `Error`): it is in doubt until a late commit or rollback.
fn go_in_doubt(rec: &mut DbRecord, ctx: &Ctx) -> Vec<Step> {
    let Some(mut p) = rec.process.take() else {
        return Vec::new();
    };
    p.state = ProcessState::InDoubt;
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
    vec![
        Step::Raise {
            kind: AlertKind::InDoubt,
            pid,
            text,
        },
        Step::Deadline(None),
        Step::Save,
    ]
}

/// The moves of a confirmed commit: replies to their recipients (or kept
/// aside until their `deliver_at`), processed messages to `Log`, incorrect
/// ones to `Error`; deadlocked ones stay in `Messages`.
fn commit_ops(p: &Process) -> Vec<FileOp> {
    let db = &p.db;
    let mut ops: Vec<FileOp> = p
        .replies
        .iter()
        .map(|r| FileOp::deliver(p, r, (db, Folder::Prepared)))
        .collect();
    for n in p.verdicts(ResultStatus::Processed) {
        ops.push(FileOp::mv(&n, (db, Folder::Messages), (db, Folder::Log)));
    }
    for n in p.verdicts(ResultStatus::ProcessedIncorrect) {
        ops.push(FileOp::mv(&n, (db, Folder::Messages), (db, Folder::Error)));
    }
    ops
}

/// The moves that put a READY_TO_COMMIT process in doubt: processed
/// messages and replies to `Unknown`, incorrect ones to `Error`,
/// deadlocked ones stay.
fn in_doubt_ops(p: &Process) -> Vec<FileOp> {
    let db = &p.db;
    let mut ops: Vec<FileOp> = p
        .replies
        .iter()
        .map(|r| FileOp::mv(r, (db, Folder::Prepared), (db, Folder::Unknown)))
        .collect();
    for n in p.verdicts(ResultStatus::Processed) {
        ops.push(FileOp::mv(
            &n,
            (db, Folder::Messages),
            (db, Folder::Unknown),
        ));
    }
    for n in p.verdicts(ResultStatus::ProcessedIncorrect) {
        ops.push(FileOp::mv(&n, (db, Folder::Messages), (db, Folder::Error)));
    }
    ops
}

/// The moves that settle a process in doubt as committed or rolled back.
fn settle_ops(p: &Process, commit: bool) -> Vec<FileOp> {
    let db = &p.db;
    let mut ops = Vec::new();
    if commit {
        for r in &p.replies {
            ops.push(FileOp::deliver(p, r, (db, Folder::Unknown)));
        }
        for n in p.verdicts(ResultStatus::Processed) {
            ops.push(FileOp::mv(&n, (db, Folder::Unknown), (db, Folder::Log)));
        }
    } else {
        for r in &p.replies {
            ops.push(FileOp::delete(r, (db, Folder::Unknown)));
        }
        for n in p.verdicts(ResultStatus::Processed) {
            ops.push(FileOp::mv(
                &n,
                (db, Folder::Unknown),
                (db, Folder::Messages),
            ));
        }
        for n in p.verdicts(ResultStatus::ProcessedIncorrect) {
            ops.push(FileOp::mv(&n, (db, Folder::Error), (db, Folder::Messages)));
        }
    }
    ops
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A process ended as `state` at `now`: it is counted and kept among the
/// database's recent ones.
fn end(rec: &mut DbRecord, mut p: Process, state: ProcessState, now: Timestamp) {
    p.state = state;
    p.ended_at = Some(now);
    rec.counters.ended(&p, state, now);
    p.pending.clear();
    p.target = None;
    tracing::info!(target: "estafeta::event", process = %p.id, db = %p.db, state = ?state, "process ended");
    rec.recent.push_back(p);
    while rec.recent.len() > RECENT {
        rec.recent.pop_front();
    }
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
