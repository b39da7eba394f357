//! [`PgQueue`]: the repeat scheduler's store over `repeat_entries`, limited
//! to named sources, and optionally claiming what it hands out.
//!
//! Every scheduler of every node reads the one table; a scheduler reads
//! only its own sources (the exchange's `deliver_at`, the notifier's
//! `alerts`, the pusher's `push`), whatever other sources the table holds.
//!
//! A claiming queue hands each due entry to one node: its read takes the
//! due rows with `FOR UPDATE SKIP LOCKED` and moves them a lease ahead in
//! the same transaction, so another node's read finds them not yet due.
//! The entries are handed out at their new due second; the handler's
//! outcome (removal, a retry) applies to that version only. A node that
//! dies holding an entry leaves it due again when the lease ends, and any
//! live node takes it then; a handler that outlives its lease may see its
//! entry taken by another node (delivery is at least once at the transport,
//! once per event in the store). A claim's commit does not wait for the
//! database's log to reach its disk: a claim the database loses in a crash
//! leaves its entries due at once, as if their claimer had died. Listing a
//! claiming queue would claim what it lists: list through a plain one
//! ([`PgQueue::new`]).

use std::time::Duration;

use estafeta_repeat::store::{Applied, Op, Read, Scan, Skip, SourceCount, Store};
use estafeta_repeat::{Entry, Position, StoreError};

use tokio_postgres::types::ToSql;

use crate::Store as Db;
use crate::schedule::{PgSchedule, to_sql};

/// Up to `$2` due entries of each source `$1` (with its place `ord` in
/// the arrays), locked, passing over those other transactions hold.
const DUE: &str = "SELECT s.ord, e.due, e.id, e.attempt, e.payload
    FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS s(source, n, ord)
    CROSS JOIN LATERAL (SELECT due, id, attempt, payload FROM repeat_entries
        WHERE source = s.source AND due <= $3 ORDER BY due, id LIMIT s.n
        FOR UPDATE SKIP LOCKED) AS e
    ORDER BY s.ord, e.due, e.id";
const CLAIM: &str = "UPDATE repeat_entries SET due = $2 WHERE id = ANY($1)";
/// A claim's transaction commits without waiting for its log's flush.
const ASYNC_COMMIT: &str = "SET LOCAL synchronous_commit = off";
/// The first due second of each source `$1` after its second `$2`.
const HEAD: &str = "SELECT s.ord, h.due
    FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS s(source, after, ord)
    CROSS JOIN LATERAL (SELECT due FROM repeat_entries
        WHERE source = s.source AND due > s.after ORDER BY due, id LIMIT 1) AS h";

/// Some sources of the repeat scheduler's entries in the cluster store.
pub struct PgQueue {
    /// The whole table, read as every node may read it; its database and
    /// runtime are the queue's.
    plain: PgSchedule,
    sources: Vec<String>,
    /// How far ahead a claimed entry is moved; `None`: reads do not claim.
    lease: Option<Duration>,
}

impl PgQueue {
    /// The entries of `sources`, read as [`PgSchedule`] reads them (every
    /// node may hand out a due entry). Call it within the Tokio runtime
    /// whose pool it uses; its methods run off that runtime's threads.
    pub fn new(db: Db, sources: &[&str]) -> PgQueue {
        PgQueue {
            plain: PgSchedule::new(db),
            sources: sources.iter().map(|s| (*s).to_owned()).collect(),
            lease: None,
        }
    }

    /// The entries of `sources`, each due entry handed to one node: a read
    /// claims what it returns for `lease` (whole seconds, at least one).
    pub fn claiming(db: Db, sources: &[&str], lease: Duration) -> PgQueue {
        PgQueue {
            lease: Some(lease.max(Duration::from_secs(1))),
            ..PgQueue::new(db, sources)
        }
    }

    /// Takes up to its limit of due entries of each read's source for
    /// `lease`, all in one transaction; one scan per read, in order.
    fn claim(
        &self,
        reads: &[Read<'_>],
        now: u64,
        lease: Duration,
        skip: &dyn Fn(&str, &Position) -> bool,
    ) -> Result<Vec<Scan>, StoreError> {
        let until = now.saturating_add(lease.as_secs());
        let sources: Vec<&str> = reads.iter().map(|r| r.source).collect();
        // One more than asked: the first one left says when to read again.
        let asks: Vec<i64> = reads
            .iter()
            .map(|r| match r.limit {
                0 => 0,
                n => i64::try_from(n.saturating_add(1)).unwrap_or(i64::MAX),
            })
            .collect();
        self.plain
            .run(async {
                let mut client = self.plain.db().client().await?;
                let tx = client.transaction().await?;
                let (due, claim, head) = tokio::try_join!(
                    tx.prepare_cached(DUE),
                    tx.prepare_cached(CLAIM),
                    tx.prepare_cached(HEAD),
                )?;
                let mut scans = vec![Scan::default(); reads.len()];
                let mut ids = Vec::new();
                // A claim is not waited for on disk: one lost in a crash of the
                // database leaves its entries due again, handed out again as
                // when a claimer dies (see the module's doc); the outcomes'
                // commits are durable, and with them what the log holds before
                // them.
                let at = to_sql(now);
                let params: [&(dyn ToSql + Sync); 3] = [&sources, &asks, &at];
                let (_, rows) =
                    tokio::try_join!(tx.batch_execute(ASYNC_COMMIT), tx.query(&due, &params))?;
                for row in rows {
                    let Some(i) = ordinal(row.get(0), reads.len()) else {
                        continue;
                    };
                    let (read, scan) = (&reads[i], &mut scans[i]);
                    let (due, attempt): (i64, i32) = (row.get(1), row.get(3));
                    let entry = Entry {
                        source: read.source.to_owned(),
                        due: u64::try_from(due).unwrap_or(0),
                        id: row.get(2),
                        payload: row.get(4),
                        attempt: u32::try_from(attempt).unwrap_or(0),
                    };
                    if scan.next_due.is_some() || skip(read.source, &entry.position()) {
                        continue;
                    }
                    if scan.entries.len() >= read.limit {
                        // More is due: read again at once.
                        scan.next_due = Some(entry.due);
                        continue;
                    }
                    ids.push(entry.id.clone());
                    scan.entries.push(Entry {
                        due: until,
                        ..entry
                    });
                }
                // The next due second after what was read, for the reads that
                // did not find one: due entries left unread (in flight here, or
                // being claimed by another node) are not waited for. Asked with
                // the claim, in one round trip.
                let (mut heads, mut afters, mut of) = (Vec::new(), Vec::new(), Vec::new());
                for (i, (read, scan)) in reads.iter().zip(&scans).enumerate() {
                    if scan.next_due.is_none() {
                        heads.push(read.source);
                        afters.push(if read.limit == 0 { -1 } else { at });
                        of.push(i);
                    }
                }
                let claimed = async {
                    match ids.is_empty() {
                        true => Ok(0),
                        false => tx.execute(&claim, &[&ids, &to_sql(until)]).await,
                    }
                };
                let next = async {
                    match heads.is_empty() {
                        true => Ok(Vec::new()),
                        false => tx.query(&head, &[&heads, &afters]).await,
                    }
                };
                let (_, next) = tokio::try_join!(claimed, next)?;
                for row in next {
                    let Some(i) = ordinal(row.get(0), heads.len()) else {
                        continue;
                    };
                    let due: i64 = row.get(1);
                    scans[of[i]].next_due = Some(u64::try_from(due).unwrap_or(0));
                }
                tx.commit().await?;
                Ok(scans)
            })
            .map(|scans| {
                // Entries of other nodes (and lapsed leases) are found by
                // looking again at the next second.
                let poll = now.saturating_add(1);
                scans
                    .into_iter()
                    .map(|mut scan| {
                        scan.next_due = Some(scan.next_due.map_or(poll, |d| d.min(poll)));
                        scan
                    })
                    .collect()
            })
    }
}

/// The index an `ord` column (from 1, `WITH ORDINALITY`) names among `len`.
fn ordinal(ord: i64, len: usize) -> Option<usize> {
    usize::try_from(ord)
        .ok()?
        .checked_sub(1)
        .filter(|i| *i < len)
}

impl Store for PgQueue {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        self.plain.apply(ops)
    }

    fn sources(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.sources.clone())
    }

    fn scan(&self, read: Read<'_>, now: u64, skip: Skip<'_>) -> Result<Scan, StoreError> {
        if !self.sources.iter().any(|s| s == read.source) {
            return Ok(Scan::default());
        }
        match self.lease {
            Some(lease) => self
                .claim(&[read], now, lease, &|_, at| skip(at))
                .map(|mut scans| scans.pop().unwrap_or_default()),
            None => self.plain.scan(read, now, skip),
        }
    }

    /// A claiming queue takes every read's share in one transaction.
    fn scan_sources(
        &self,
        reads: &[Read<'_>],
        now: u64,
        skip: &dyn Fn(&str, &Position) -> bool,
    ) -> Vec<Result<Scan, StoreError>> {
        let (Some(lease), false) = (self.lease, reads.is_empty()) else {
            return reads
                .iter()
                .map(|r| self.scan(*r, now, &|at| skip(r.source, at)))
                .collect();
        };
        // Sources not this queue's are read as empty.
        let ours: Vec<Read<'_>> = reads
            .iter()
            .filter(|r| self.sources.iter().any(|s| s == r.source))
            .copied()
            .collect();
        match self.claim(&ours, now, lease, skip) {
            Ok(scans) => {
                let mut scans = ours.iter().map(|r| r.source).zip(scans);
                let mut next = scans.next();
                reads
                    .iter()
                    .map(|r| match &next {
                        Some((source, _)) if *source == r.source => {
                            let scan = next.take().map(|(_, scan)| scan).unwrap_or_default();
                            next = scans.next();
                            Ok(scan)
                        }
                        _ => Ok(Scan::default()),
                    })
                    .collect()
            }
            Err(e) => {
                let text = e.to_string();
                reads
                    .iter()
                    .map(|_| Err(StoreError::Backend(text.clone().into())))
                    .collect()
            }
        }
    }

    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        self.plain.count(source, now)
    }
}
