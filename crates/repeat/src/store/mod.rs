//! Storage of entries: the [`Store`] trait and its two implementations.
//!
//! A store keeps entries in sources, each ordered by [`Position`] (due second,
//! then id), with an index by id so cancel and reschedule do not scan.
//! Every method is one transaction; [`Store::apply`] is durable when it
//! returns, which is what makes `schedule`, `cancel` and a finished delivery
//! survive a crash.

#[cfg(feature = "test-support")]
pub mod conformance;
mod memory;
mod redb;

use std::ops::Bound;

pub use self::memory::MemoryStore;
pub use self::redb::RedbStore;
use crate::{Entry, Position, StoreError};

/// One change to the stored entries; a batch of them is applied atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Insert the entry, replacing any entry with the same id in any source.
    Put(Entry),
    /// Remove the entry with this id, wherever it is.
    Cancel {
        /// Entry id.
        id: String,
    },
    /// Move the entry with this id to another due second (attempts restart at 0).
    Reschedule {
        /// Entry id.
        id: String,
        /// New due second.
        due: u64,
    },
    /// Remove exactly this entry, as it was read: nothing happens if it was
    /// moved, removed or replaced meanwhile (a delivery finished, but a
    /// caller may have rescheduled or replaced the entry while its handler
    /// ran; the outcome is not theirs).
    Remove(Entry),
    /// Move exactly this entry, as it was read, to `due` with `attempt`;
    /// nothing happens if it was moved, removed or replaced meanwhile.
    Move {
        /// The entry as it was read.
        entry: Entry,
        /// New due second.
        due: u64,
        /// New attempt count.
        attempt: u32,
    },
    /// Insert the entry unless an entry with its id exists (a handed-out
    /// entry that was removed before its handler ran goes back, unless a
    /// caller scheduled its id again meanwhile).
    Restore(Entry),
}

/// What one [`Op`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The op found nothing to change.
    Unchanged,
    /// The entry was removed.
    Removed,
    /// The entry now sits at this place (a put or a move).
    Placed {
        /// Its source.
        source: String,
        /// Its new place.
        at: Position,
    },
}

/// The result of reading one source from a cursor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Due entries, in position order, at most the limit asked for.
    pub entries: Vec<Entry>,
    /// The last position read (returned or skipped); the next scan starts after it.
    pub last: Option<Position>,
    /// The due second of the first entry not returned, if any: the source's
    /// next due time as seen by this read.
    pub next_due: Option<u64>,
}

impl Scan {
    /// Takes the next entry of a source read in position order, or passes
    /// over it if `skip` says so; `false` when the scan ends at it (it is
    /// not due at `now`, or `limit` entries are taken): the stopping rules
    /// of every store's [`Store::scan`].
    pub fn offer(&mut self, entry: Entry, now: u64, limit: usize, skip: Skip<'_>) -> bool {
        if entry.due > now {
            self.next_due = Some(entry.due);
            return false;
        }
        let at = entry.position();
        if skip(&at) {
            self.last = Some(at);
            return true;
        }
        if self.entries.len() >= limit {
            self.next_due = Some(entry.due);
            return false;
        }
        self.last = Some(at);
        self.entries.push(entry);
        true
    }
}

/// What a read of one source asks for: the [`Store::scan`] of it, and its
/// part of a [`Store::scan_sources`].
#[derive(Debug, Clone, Copy)]
pub struct Read<'a> {
    /// The source.
    pub source: &'a str,
    /// Where the read starts.
    pub from: Bound<&'a Position>,
    /// The most due entries to return.
    pub limit: usize,
}

impl<'a> Read<'a> {
    /// A read of every due entry of `source`, from its start.
    pub fn all(source: &'a str) -> Read<'a> {
        Read {
            source,
            from: Bound::Unbounded,
            limit: usize::MAX,
        }
    }

    /// A read of the first `limit` due entries of `source`.
    pub fn first(source: &'a str, limit: usize) -> Read<'a> {
        Read {
            limit,
            ..Read::all(source)
        }
    }
}

/// Which positions a scan passes over (counting them as read, returning
/// none of them): those for which it is true.
pub type Skip<'a> = &'a dyn Fn(&Position) -> bool;

/// Entries a read holds for its caller ([`Store::hold_sources`]): the
/// store keeps them from every other reader, as they were read, until
/// [`Held::settle`] applies their outcomes in the read's own transaction.
/// Dropped unsettled, the hold ends and the entries are due again as they
/// were.
pub trait Held: Send + std::fmt::Debug {
    /// Applies `ops` (the held entries' outcomes) and ends the hold; durable
    /// when it returns `Ok`. On `Err` nothing was applied and the held
    /// entries are due again as they were read.
    fn settle(self: Box<Self>, ops: &[Op]) -> Result<Vec<Applied>, StoreError>;
}

/// What [`Store::hold_sources`] read.
#[derive(Debug)]
pub struct Holding {
    /// One result per read, as [`Store::scan_sources`] gives them.
    pub scans: Vec<Result<Scan, StoreError>>,
    /// The hold on every entry the scans returned; `None`: nothing is held,
    /// and their outcomes are applied with [`Store::apply`].
    pub held: Option<Box<dyn Held>>,
}

impl Holding {
    /// Scans that hold nothing.
    pub fn unheld(scans: Vec<Result<Scan, StoreError>>) -> Holding {
        Holding { scans, held: None }
    }
}

/// Counts for one source, for [`Stats`](crate::Stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceCount {
    /// All entries in the source.
    pub entries: u64,
    /// Entries due at or before the given second (the backlog).
    pub due: u64,
}

/// Durable, time-ordered storage of entries in sources.
///
/// Implementations are blocking; the scheduler calls them from
/// [`tokio::task::spawn_blocking`]. Ids are unique across all sources.
pub trait Store: Send + Sync + 'static {
    /// Applies `ops` in order in one transaction that is durable when this
    /// returns `Ok`; on `Err` nothing was changed.
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError>;

    /// Names of all sources that hold or held entries.
    fn sources(&self) -> Result<Vec<String>, StoreError>;

    /// Reads the read's `source` in position order from its `from`,
    /// returning entries due at or before `now`, at most its `limit` of
    /// them, passing over (but counting as read) the positions `skip`
    /// names.
    ///
    /// The read stops at the first entry due after `now`, or at the first due
    /// entry beyond the limit; that entry's due second is [`Scan::next_due`].
    fn scan(&self, read: Read<'_>, now: u64, skip: Skip<'_>) -> Result<Scan, StoreError>;

    /// Reads several sources as [`scan`](Self::scan) reads each: one result
    /// per read, in order; `skip` is asked with the source's name. The
    /// dispatcher reads all the sources it serves in a pass with one call,
    /// so a store that can read them together (one round trip, one
    /// transaction) overrides this; the default reads them one by one.
    fn scan_sources(
        &self,
        reads: &[Read<'_>],
        now: u64,
        skip: &dyn Fn(&str, &Position) -> bool,
    ) -> Vec<Result<Scan, StoreError>> {
        reads
            .iter()
            .map(|r| self.scan(*r, now, &|at| skip(r.source, at)))
            .collect()
    }

    /// Reads as [`scan_sources`](Self::scan_sources) does, for a dispatcher
    /// that delivers at least once: a store that can keep the entries it
    /// returns from other readers until their outcomes are known (a
    /// database transaction left open) returns that [`Held`] claim, and
    /// the outcomes are applied through it instead of through
    /// [`apply`](Self::apply). The default holds nothing.
    fn hold_sources(
        &self,
        reads: &[Read<'_>],
        now: u64,
        skip: &dyn Fn(&str, &Position) -> bool,
    ) -> Holding {
        Holding::unheld(self.scan_sources(reads, now, skip))
    }

    /// Counts entries in `source`, and those due at or before `now`.
    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError>;

    /// Whether an entry with this id is stored, in any source: one lookup,
    /// however many entries there are.
    fn contains(&self, id: &str) -> Result<bool, StoreError>;
}

/// Collects a scan from an ordered iterator of entries; shared by both stores
/// so they agree on the stopping rules.
pub(crate) fn collect_scan<E>(
    entries: impl Iterator<Item = Result<Entry, E>>,
    now: u64,
    limit: usize,
    skip: Skip<'_>,
) -> Result<Scan, E> {
    let mut scan = Scan::default();
    for entry in entries {
        if !scan.offer(entry?, now, limit, skip) {
            break;
        }
    }
    Ok(scan)
}
