//! The repeat scheduler's store (`estafeta_repeat::store::Store`) over the
//! `repeat_entries` and `repeat_sources` tables, so that the exchange's
//! deferred deliveries (and any other repeat source) are kept in the
//! cluster store and dispatched by whichever nodes run a scheduler on it.
//!
//! The trait is synchronous and the scheduler calls it from blocking
//! threads; each call runs on the pool through the runtime handle taken at
//! [`PgSchedule::new`]. [`Store::apply`] is one transaction.
//!
//! Several nodes share the table, and a node's scheduler is told only of
//! the entries it writes itself. So that every node sees entries written by
//! others (another node's scheduler, a message batch that kept a message
//! aside), a read ignores the scheduler's read cursor and starts at the
//! source's first entry (passing over the entries this node has in flight),
//! and a read that finds nothing more due reports the next second as the
//! source's next due time: each node looks at the table once a second.
//! Two nodes may hand out the same due entry; its handler must be
//! idempotent (the exchange's delivery is: one message per id), and the
//! entry is removed once, by whichever outcome comes first. A node hands
//! each due entry to one node by reading through [`crate::PgQueue::claiming`].

use std::ops::Bound;

use estafeta_repeat::store::{Applied, Op, Scan, SourceCount, Store};
use estafeta_repeat::{Entry, Position, StoreError};
use tokio_postgres::Transaction;

use crate::Error;

/// Inserts an entry, replacing any entry with its id, and notes its source.
pub(crate) const PUT_ENTRY: &str = "WITH source AS (
        INSERT INTO repeat_sources (name) VALUES ($2) ON CONFLICT DO NOTHING)
    INSERT INTO repeat_entries (id, source, due, attempt, payload) VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (id) DO UPDATE SET source = EXCLUDED.source, due = EXCLUDED.due,
        attempt = EXCLUDED.attempt, payload = EXCLUDED.payload";
const RESTORE: &str = "WITH source AS (
        INSERT INTO repeat_sources (name) VALUES ($2) ON CONFLICT DO NOTHING)
    INSERT INTO repeat_entries (id, source, due, attempt, payload) VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (id) DO NOTHING";
const CANCEL: &str = "DELETE FROM repeat_entries WHERE id = $1";
const RESCHEDULE: &str =
    "UPDATE repeat_entries SET due = $2, attempt = 0 WHERE id = $1 RETURNING source";
/// The entry exactly as read: place, attempt and payload.
const EXACT: &str = "id = $1 AND source = $2 AND due = $3 AND attempt = $4 AND payload = $5";
const FIRST_PAGE: &str = "SELECT due, id, attempt, payload FROM repeat_entries
    WHERE source = $1 ORDER BY due, id LIMIT $2";
const NEXT_PAGE: &str = "SELECT due, id, attempt, payload FROM repeat_entries
    WHERE source = $1 AND (due, id) > ($2, $3) ORDER BY due, id LIMIT $4";

/// A due second as PostgreSQL's `bigint` (saturating: no real second is
/// past the year 292 billion).
pub(crate) fn to_sql(due: u64) -> i64 {
    i64::try_from(due).unwrap_or(i64::MAX)
}

/// An attempt count as PostgreSQL's `integer` (saturating).
pub(crate) fn attempt_to_sql(attempt: u32) -> i32 {
    i32::try_from(attempt).unwrap_or(i32::MAX)
}

/// The repeat scheduler's entries in the cluster store.
pub struct PgSchedule {
    store: crate::Store,
    runtime: tokio::runtime::Handle,
}

impl PgSchedule {
    /// The scheduler store over `store` (migrated). Call it within the Tokio
    /// runtime whose pool connections it will use: it keeps that runtime's
    /// handle, and its methods must then be called off the runtime's own
    /// threads (the scheduler calls them from blocking threads).
    pub fn new(store: crate::Store) -> PgSchedule {
        PgSchedule {
            store,
            runtime: tokio::runtime::Handle::current(),
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
}

fn placed(source: String, due: u64, id: &str) -> Applied {
    Applied::Placed {
        source,
        at: Position {
            due,
            id: id.to_owned(),
        },
    }
}

async fn apply_one(tx: &Transaction<'_>, op: &Op) -> Result<Applied, Error> {
    Ok(match op {
        Op::Put(e) => {
            let (due, attempt) = (to_sql(e.due), attempt_to_sql(e.attempt));
            tx.execute(PUT_ENTRY, &[&e.id, &e.source, &due, &attempt, &e.payload])
                .await?;
            placed(e.source.clone(), e.due, &e.id)
        }
        Op::Cancel { id } => match tx.execute(CANCEL, &[id]).await? {
            0 => Applied::Unchanged,
            _ => Applied::Removed,
        },
        Op::Reschedule { id, due } => match tx.query_opt(RESCHEDULE, &[id, &to_sql(*due)]).await? {
            Some(row) => placed(row.get(0), *due, id),
            None => Applied::Unchanged,
        },
        Op::Remove(e) => {
            let (due, attempt) = (to_sql(e.due), attempt_to_sql(e.attempt));
            let sql = format!("DELETE FROM repeat_entries WHERE {EXACT}");
            match tx
                .execute(&sql, &[&e.id, &e.source, &due, &attempt, &e.payload])
                .await?
            {
                0 => Applied::Unchanged,
                _ => Applied::Removed,
            }
        }
        Op::Move {
            entry: e,
            due: new_due,
            attempt: new_attempt,
        } => {
            let (due, attempt) = (to_sql(e.due), attempt_to_sql(e.attempt));
            let sql = format!("UPDATE repeat_entries SET due = $6, attempt = $7 WHERE {EXACT}");
            let (to_due, to_attempt) = (to_sql(*new_due), attempt_to_sql(*new_attempt));
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
                &e.id,
                &e.source,
                &due,
                &attempt,
                &e.payload,
                &to_due,
                &to_attempt,
            ];
            match tx.execute(&sql, &params).await? {
                0 => Applied::Unchanged,
                _ => placed(e.source.clone(), *new_due, &e.id),
            }
        }
        Op::Restore(e) => {
            let (due, attempt) = (to_sql(e.due), attempt_to_sql(e.attempt));
            match tx
                .execute(RESTORE, &[&e.id, &e.source, &due, &attempt, &e.payload])
                .await?
            {
                0 => Applied::Unchanged,
                _ => placed(e.source.clone(), e.due, &e.id),
            }
        }
    })
}

impl Store for PgSchedule {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        self.run(async {
            let mut client = self.store.client().await?;
            let tx = client.transaction().await?;
            let mut applied = Vec::with_capacity(ops.len());
            for op in ops {
                applied.push(apply_one(&tx, op).await?);
            }
            tx.commit().await?;
            Ok(applied)
        })
    }

    fn sources(&self) -> Result<Vec<String>, StoreError> {
        self.run(async {
            let client = self.store.client().await?;
            let rows = client
                .query("SELECT name FROM repeat_sources ORDER BY name", &[])
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    /// Reads from the source's first entry whatever `from` says (see the
    /// module's doc), a page at a time until the scan's end.
    fn scan(
        &self,
        source: &str,
        _from: Bound<&Position>,
        now: u64,
        limit: usize,
        skip: &dyn Fn(&Position) -> bool,
    ) -> Result<Scan, StoreError> {
        let page = i64::try_from(limit.saturating_add(1).clamp(16, 1024)).unwrap_or(1024);
        let mut scan = self.run(async {
            let client = self.store.client().await?;
            let mut scan = Scan::default();
            let mut after: Option<(i64, String)> = None;
            loop {
                let rows = match &after {
                    None => client.query(FIRST_PAGE, &[&source, &page]).await?,
                    Some((due, id)) => client.query(NEXT_PAGE, &[&source, due, id, &page]).await?,
                };
                let full = rows.len() as i64 == page;
                for row in &rows {
                    let due: i64 = row.get(0);
                    let attempt: i32 = row.get(2);
                    let entry = Entry {
                        source: source.to_owned(),
                        due: u64::try_from(due).unwrap_or(0),
                        id: row.get(1),
                        payload: row.get(3),
                        attempt: u32::try_from(attempt).unwrap_or(0),
                    };
                    if entry.due > now {
                        scan.next_due = Some(entry.due);
                        return Ok(scan);
                    }
                    let at = entry.position();
                    if skip(&at) {
                        scan.last = Some(at);
                        continue;
                    }
                    if scan.entries.len() >= limit {
                        scan.next_due = Some(entry.due);
                        return Ok(scan);
                    }
                    scan.last = Some(at);
                    scan.entries.push(entry);
                }
                match rows.last() {
                    Some(last) if full => after = Some((last.get(0), last.get(1))),
                    _ => return Ok(scan),
                }
            }
        })?;
        // Nothing more due now: look again at the next second, for entries
        // other nodes write.
        let poll = now.saturating_add(1);
        if scan.next_due.is_none_or(|due| due > now) {
            scan.next_due = Some(scan.next_due.map_or(poll, |due| due.min(poll)));
        }
        Ok(scan)
    }

    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        self.run(async {
            let client = self.store.client().await?;
            let row = client
                .query_one(
                    "SELECT count(*), count(*) FILTER (WHERE due <= $2)
                     FROM repeat_entries WHERE source = $1",
                    &[&source, &to_sql(now)],
                )
                .await?;
            let (entries, due): (i64, i64) = (row.get(0), row.get(1));
            Ok(SourceCount {
                entries: u64::try_from(entries).unwrap_or(0),
                due: u64::try_from(due).unwrap_or(0),
            })
        })
    }
}
