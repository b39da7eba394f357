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
//! leaves its entries due at once, as if their claimer had died. Listing a claiming queue would claim what
//! it lists: list through a plain one ([`PgQueue::new`]).

use std::ops::Bound;
use std::time::Duration;

use estafeta_repeat::store::{Applied, Op, Scan, SourceCount, Store};
use estafeta_repeat::{Entry, Position, StoreError};

use tokio_postgres::types::ToSql;

use crate::schedule::{PgSchedule, to_sql};
use crate::{Error, Store as Db};

const DUE: &str = "SELECT due, id, attempt, payload FROM repeat_entries
    WHERE source = $1 AND due <= $2 ORDER BY due, id LIMIT $3 FOR UPDATE SKIP LOCKED";
const CLAIM: &str = "UPDATE repeat_entries SET due = $2 WHERE id = ANY($1)";
/// A claim's transaction commits without waiting for its log's flush.
const ASYNC_COMMIT: &str = "SET LOCAL synchronous_commit = off";
const HEAD: &str = "SELECT due FROM repeat_entries WHERE source = $1 AND due > $2
    ORDER BY due, id LIMIT 1";

/// Some sources of the repeat scheduler's entries in the cluster store.
pub struct PgQueue {
    plain: PgSchedule,
    db: Db,
    runtime: tokio::runtime::Handle,
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
            plain: PgSchedule::new(db.clone()),
            db,
            runtime: tokio::runtime::Handle::current(),
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

    fn run<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, StoreError> {
        self.runtime
            .block_on(f)
            .map_err(|e| StoreError::Backend(Box::new(e)))
    }

    /// Takes up to `limit` due entries of `source` for `lease`.
    fn claim(
        &self,
        source: &str,
        now: u64,
        limit: usize,
        lease: Duration,
        skip: &dyn Fn(&Position) -> bool,
    ) -> Result<Scan, StoreError> {
        let until = now.saturating_add(lease.as_secs());
        let ask = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
        self.run(async {
            let mut client = self.db.client().await?;
            let tx = client.transaction().await?;
            let (due, claim, head) = tokio::try_join!(
                tx.prepare_cached(DUE),
                tx.prepare_cached(CLAIM),
                tx.prepare_cached(HEAD),
            )?;
            let mut scan = Scan::default();
            let mut ids = Vec::new();
            if limit > 0 {
                // A claim is not waited for on disk: one lost in a crash
                // of the database leaves its entries due again, handed out
                // again as when a claimer dies (see the module's doc); the
                // outcomes' commits are durable, and with them what the
                // log holds before them.
                let now = to_sql(now);
                let params: [&(dyn ToSql + Sync); 3] = [&source, &now, &ask];
                let (_, rows) =
                    tokio::try_join!(tx.batch_execute(ASYNC_COMMIT), tx.query(&due, &params),)?;
                for row in rows {
                    let (due, attempt): (i64, i32) = (row.get(0), row.get(2));
                    let entry = Entry {
                        source: source.to_owned(),
                        due: u64::try_from(due).unwrap_or(0),
                        id: row.get(1),
                        payload: row.get(3),
                        attempt: u32::try_from(attempt).unwrap_or(0),
                    };
                    if skip(&entry.position()) {
                        continue;
                    }
                    if scan.entries.len() >= limit {
                        // More is due: read again at once.
                        scan.next_due = Some(entry.due);
                        break;
                    }
                    ids.push(entry.id.clone());
                    scan.entries.push(Entry {
                        due: until,
                        ..entry
                    });
                }
            }
            // The next due second after what was read: due entries left
            // unread (in flight here, or being claimed by another node) are
            // not waited for. Asked with the claim, in one round trip.
            let after = if limit == 0 { -1 } else { to_sql(now) };
            let claimed = async {
                match ids.is_empty() {
                    true => Ok(0),
                    false => tx.execute(&claim, &[&ids, &to_sql(until)]).await,
                }
            };
            let next = async {
                match scan.next_due {
                    Some(_) => Ok(None),
                    None => tx.query_opt(&head, &[&source, &after]).await,
                }
            };
            let (_, next) = tokio::try_join!(claimed, next)?;
            if let Some(row) = next {
                let due: i64 = row.get(0);
                scan.next_due = Some(u64::try_from(due).unwrap_or(0));
            }
            tx.commit().await?;
            Ok(scan)
        })
        .map(|mut scan| {
            // Entries of other nodes (and lapsed leases) are found by
            // looking again at the next second.
            let poll = now.saturating_add(1);
            scan.next_due = Some(scan.next_due.map_or(poll, |d| d.min(poll)));
            scan
        })
    }
}

impl Store for PgQueue {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        self.plain.apply(ops)
    }

    fn sources(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.sources.clone())
    }

    fn scan(
        &self,
        source: &str,
        from: Bound<&Position>,
        now: u64,
        limit: usize,
        skip: &dyn Fn(&Position) -> bool,
    ) -> Result<Scan, StoreError> {
        if !self.sources.iter().any(|s| s == source) {
            return Ok(Scan::default());
        }
        match self.lease {
            Some(lease) => self.claim(source, now, limit, lease, skip),
            None => self.plain.scan(source, from, now, limit, skip),
        }
    }

    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        self.plain.count(source, now)
    }
}
