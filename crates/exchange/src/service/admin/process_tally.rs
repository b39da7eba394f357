//! The processes of every database as the admin pages show them, kept in
//! memory from the database records as they are saved: the lifecycle's
//! driver hands each saved record's processes over in the same step that
//! makes the record the session's ([`Interpreter::drive`](super::super::drive::Interpreter::drive)
//! after its commit, [`Interpreter::drive_hook`](super::super::drive::Interpreter::drive_hook)
//! when it changes the session), so the counts by state, the oldest
//! READY_TO_COMMIT and a page of the list cost the same with ten databases
//! as with ten thousand. The records of an earlier run are read once, at
//! the first use ([`ProcessTally::loaded`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::super::records::DbRecord;
use crate::wire::{ProcessState, ProcessSummary};
use crate::{Id, ProcessId, Timestamp};

/// A row's place in the list: open processes first, then the recently
/// ended, newest first within each.
type RowKey = (bool, Reverse<Timestamp>, ProcessId);

/// The processes of one database record: the live one and those in doubt
/// (open), and the recently ended; and the verdicts of its committed
/// processes.
struct DbRows(Vec<(RowKey, ProcessSummary)>, Verdicts);

impl DbRows {
    /// The rows of `rec`.
    fn of(rec: &DbRecord) -> Self {
        let row =
            |ended: bool, s: ProcessSummary| ((ended, Reverse(s.started_at), s.process_id), s);
        Self(
            (rec.process.iter().chain(&rec.in_doubt))
                .map(|p| row(false, p.summary()))
                .chain(rec.recent.iter().map(|e| row(true, e.summary())))
                .collect(),
            Verdicts {
                processed: rec.counters.processed,
                deadlocked: rec.counters.deadlocks,
                incorrect: rec.counters.incorrect,
            },
        )
    }
}

/// Messages of committed processes by verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verdicts {
    /// PROCESSED.
    pub processed: u64,
    /// PROCESSED_DEADLOCK.
    pub deadlocked: u64,
    /// PROCESSED_INCORRECT.
    pub incorrect: u64,
}

impl std::ops::AddAssign for Verdicts {
    fn add_assign(&mut self, o: Verdicts) {
        self.processed += o.processed;
        self.deadlocked += o.deadlocked;
        self.incorrect += o.incorrect;
    }
}

impl std::ops::SubAssign for Verdicts {
    fn sub_assign(&mut self, o: Verdicts) {
        self.processed = self.processed.saturating_sub(o.processed);
        self.deadlocked = self.deadlocked.saturating_sub(o.deadlocked);
        self.incorrect = self.incorrect.saturating_sub(o.incorrect);
    }
}

/// Counts of the processes by state, and the oldest READY_TO_COMMIT.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessTotals {
    /// How many processes the list holds in each state (open ones and the
    /// recently ended each database remembers); a state not there has none.
    pub by_state: HashMap<ProcessState, u64>,
    /// Since when the oldest READY_TO_COMMIT process has been ready.
    pub oldest_ready: Option<Timestamp>,
    /// How many processes the list holds.
    pub listed: usize,
    /// The verdicts of every committed process, summed over the databases
    /// (each database's counters, kept in its record).
    pub verdicts: Verdicts,
}

impl ProcessTotals {
    /// How many processes are in `state`.
    pub fn count(&self, state: ProcessState) -> u64 {
        self.by_state.get(&state).copied().unwrap_or(0)
    }
}

#[derive(Default)]
struct Rows {
    /// The keys of each database's rows, and its verdicts.
    by_db: HashMap<Id, (Vec<RowKey>, Verdicts)>,
    /// The verdicts of every database, summed.
    verdicts: Verdicts,
    rows: BTreeMap<RowKey, ProcessSummary>,
    by_state: HashMap<ProcessState, u64>,
    /// READY_TO_COMMIT processes by the time they became ready.
    ready: BTreeSet<(Timestamp, ProcessId)>,
}

impl Rows {
    fn remove(&mut self, key: &RowKey) {
        if let Some(old) = self.rows.remove(key) {
            self.uncount(&old);
        }
    }

    fn insert(&mut self, key: RowKey, row: ProcessSummary) {
        if row.state == ProcessState::ReadyToCommit {
            self.ready.insert((ready_since(&row), row.process_id));
        }
        *self.by_state.entry(row.state).or_default() += 1;
        if let Some(old) = self.rows.insert(key, row) {
            self.uncount(&old);
        }
    }

    fn uncount(&mut self, row: &ProcessSummary) {
        if let Some(n) = self.by_state.get_mut(&row.state) {
            *n -= 1;
            if *n == 0 {
                self.by_state.remove(&row.state);
            }
        }
        if row.state == ProcessState::ReadyToCommit {
            self.ready.remove(&(ready_since(row), row.process_id));
        }
    }

    fn replace(&mut self, db: &Id, rows: DbRows) {
        if let Some((keys, verdicts)) = self.by_db.remove(db) {
            for key in keys {
                self.remove(&key);
            }
            self.verdicts -= verdicts;
        }
        let DbRows(rows, verdicts) = rows;
        let keys = rows.iter().map(|(k, _)| *k).collect();
        for (key, row) in rows {
            self.insert(key, row);
        }
        self.verdicts += verdicts;
        self.by_db.insert(db.clone(), (keys, verdicts));
    }
}

fn ready_since(p: &ProcessSummary) -> Timestamp {
    p.ready_at.unwrap_or(p.started_at)
}

/// The processes of every database, kept as their records are saved.
#[derive(Default)]
pub(crate) struct ProcessTally {
    rows: Mutex<Rows>,
    /// Set once the records of every database have been read.
    pub(crate) loaded: tokio::sync::OnceCell<()>,
}

impl ProcessTally {
    fn rows(&self) -> MutexGuard<'_, Rows> {
        self.rows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The rows of `db` are those of `rec` (its record, just saved).
    pub(crate) fn replace(&self, db: &Id, rec: &DbRecord) {
        self.rows().replace(db, DbRows::of(rec));
    }

    /// The rows of `db` are those of `rec` unless a saved record gave
    /// some already (the first read of a record of an earlier run, made
    /// while holding its session, so no save of it can come between).
    pub(crate) fn first(&self, db: &Id, rec: &DbRecord) {
        let mut all = self.rows();
        if !all.by_db.contains_key(db) {
            all.replace(db, DbRows::of(rec));
        }
    }

    /// `db` is gone: its rows go too.
    pub(crate) fn forget(&self, db: &Id) {
        let mut rows = self.rows();
        rows.replace(db, DbRows(Vec::new(), Verdicts::default()));
        rows.by_db.remove(db);
    }

    /// The counts by state and the oldest READY_TO_COMMIT.
    pub(crate) fn totals(&self) -> ProcessTotals {
        let rows = self.rows();
        ProcessTotals {
            by_state: rows.by_state.clone(),
            oldest_ready: rows.ready.first().map(|(t, _)| *t),
            listed: rows.rows.len(),
            verdicts: rows.verdicts,
        }
    }

    /// How many processes the list holds, and up to `limit` of them after
    /// the `skip` first (open first, then the recently ended, newest first).
    pub(crate) fn page(&self, skip: usize, limit: usize) -> (usize, Vec<ProcessSummary>) {
        let rows = self.rows();
        let page = rows.rows.values().skip(skip).take(limit).cloned().collect();
        (rows.rows.len(), page)
    }
}
