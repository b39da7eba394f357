//! [`PgEvents`]: the event log of every node in the `events` table, read a
//! page at a time, newest first, whole or by one indexed name (database,
//! device, process, message, request) within a time range.
//!
//! The records are opaque here (their JSON); the caller names a record's
//! key and indexed values. Keys are unsigned pairs (nanoseconds, sequence)
//! stored order-preserving in `bigint`s. Two nodes writing a record with
//! the same key (the same nanosecond and sequence number) keep the first.
//!
//! The methods are synchronous, for the log's writer thread and blocking
//! readers; each runs on the pool through the runtime handle taken at
//! [`PgEvents::new`].

use std::ops::Bound;

use crate::{Error, Store};

/// The indexed names a record may carry, as the columns that hold them.
pub const INDEXED: [&str; 5] = ["db", "device", "process", "message", "request"];

/// One record to write.
#[derive(Clone, Debug)]
pub struct EventRow {
    /// Its key: nanoseconds, sequence.
    pub key: (u64, u64),
    /// Its names, in the order of [`INDEXED`].
    pub names: [Option<String>; 5],
    /// The record (JSON).
    pub record: Vec<u8>,
}

/// A record read back: its key and its JSON.
pub type StoredEvent = ((u64, u64), Vec<u8>);

/// The event log in the cluster store.
pub struct PgEvents {
    store: Store,
    runtime: tokio::runtime::Handle,
}

/// `u64` to `bigint` keeping the order.
fn key_to_sql(x: u64) -> i64 {
    (x ^ (1 << 63)) as i64
}

/// `bigint` back to `u64`.
fn key_from_sql(x: i64) -> u64 {
    (x as u64) ^ (1 << 63)
}

impl PgEvents {
    /// The event log of `store` (migrated). Call it within the Tokio
    /// runtime whose pool it uses; its methods run off that runtime's
    /// threads.
    pub fn new(store: Store) -> PgEvents {
        PgEvents {
            store,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// Writes `rows` in one transaction, then removes the oldest records
    /// older than `cutoff` nanoseconds, and the oldest while the records
    /// kept pass `max_bytes` (at most `prune_most` of each).
    pub fn append(
        &self,
        rows: &[EventRow],
        cutoff: u64,
        max_bytes: u64,
        prune_most: usize,
    ) -> Result<(), Error> {
        let prune = i64::try_from(prune_most).unwrap_or(i64::MAX);
        self.runtime.block_on(async {
            let mut client = self.store.client().await?;
            let tx = client.transaction().await?;
            let mut added: i64 = 0;
            for row in rows {
                let size = i64::try_from(row.record.len()).unwrap_or(i64::MAX);
                let n = tx
                    .execute(
                        "INSERT INTO events (nanos, seq, db, device, process, message, request, size, record)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
                        &[
                            &key_to_sql(row.key.0),
                            &key_to_sql(row.key.1),
                            &row.names[0],
                            &row.names[1],
                            &row.names[2],
                            &row.names[3],
                            &row.names[4],
                            &size,
                            &row.record,
                        ],
                    )
                    .await?;
                if n > 0 {
                    added = added.saturating_add(size);
                }
            }
            let old: i64 = tx
                .query_one(
                    "WITH gone AS (DELETE FROM events WHERE (nanos, seq) IN (
                         SELECT nanos, seq FROM events WHERE nanos < $1
                         ORDER BY nanos, seq LIMIT $2) RETURNING size)
                     SELECT coalesce(sum(size), 0)::bigint FROM gone",
                    &[&key_to_sql(cutoff), &prune],
                )
                .await?
                .get(0);
            let kept: i64 = tx
                .query_one(
                    "UPDATE cluster_counters SET value = value + $1 - $2
                     WHERE name = 'event_bytes' RETURNING value",
                    &[&added, &old],
                )
                .await?
                .get(0);
            let excess = kept.saturating_sub(i64::try_from(max_bytes).unwrap_or(i64::MAX));
            if excess > 0 {
                let freed: i64 = tx
                    .query_one(
                        "WITH oldest AS (
                             SELECT nanos, seq, size,
                                    (sum(size) OVER (ORDER BY nanos, seq))::bigint AS running
                             FROM (SELECT nanos, seq, size FROM events
                                   ORDER BY nanos, seq LIMIT $2) first),
                         gone AS (DELETE FROM events e USING oldest o
                             WHERE e.nanos = o.nanos AND e.seq = o.seq
                               AND o.running - o.size < $1
                             RETURNING e.size)
                         SELECT coalesce(sum(size), 0)::bigint FROM gone",
                        &[&excess, &prune],
                    )
                    .await?
                    .get(0);
                tx.execute(
                    "UPDATE cluster_counters SET value = value - $1 WHERE name = 'event_bytes'",
                    &[&freed],
                )
                .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    /// How many records are kept, and their bytes.
    pub fn size(&self) -> Result<(u64, u64), Error> {
        self.runtime.block_on(async {
            let client = self.store.client().await?;
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM events),
                            (SELECT value FROM cluster_counters WHERE name = 'event_bytes')",
                    &[],
                )
                .await?;
            let (n, bytes): (i64, i64) = (row.get(0), row.get(1));
            Ok((
                u64::try_from(n).unwrap_or(0),
                u64::try_from(bytes).unwrap_or(0),
            ))
        })
    }

    /// Up to `limit` records with keys from `low` up to `high`, newest
    /// first, all of them or those naming `name` (a column of [`INDEXED`]
    /// and its value): one index range read backwards.
    pub fn page(
        &self,
        name: Option<(&str, &str)>,
        low: (u64, u64),
        high: Bound<(u64, u64)>,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, Error> {
        let column = match name {
            Some((column, _)) if !INDEXED.contains(&column) => {
                return Err(Error::Options(format!("no event index {column}")));
            }
            Some((column, _)) => Some(column),
            None => None,
        };
        let (high_key, op) = match high {
            Bound::Included(h) => (h, "<="),
            Bound::Excluded(h) => (h, "<"),
            Bound::Unbounded => ((u64::MAX, u64::MAX), "<="),
        };
        let filter = column.map_or(String::new(), |c| format!("{c} = $6 AND "));
        let sql = format!(
            "SELECT nanos, seq, record FROM events
             WHERE {filter}(nanos, seq) >= ($1, $2) AND (nanos, seq) {op} ($3, $4)
             ORDER BY {order} LIMIT $5",
            order = column.map_or("nanos DESC, seq DESC".to_owned(), |c| {
                format!("{c} DESC, nanos DESC, seq DESC")
            }),
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (l0, l1, h0, h1) = (
            key_to_sql(low.0),
            key_to_sql(low.1),
            key_to_sql(high_key.0),
            key_to_sql(high_key.1),
        );
        self.runtime.block_on(async {
            let client = self.store.client().await?;
            let rows = match name {
                Some((_, value)) => {
                    client
                        .query(&sql, &[&l0, &l1, &h0, &h1, &limit, &value])
                        .await?
                }
                None => client.query(&sql, &[&l0, &l1, &h0, &h1, &limit]).await?,
            };
            Ok(rows
                .iter()
                .map(|r| {
                    let key = (key_from_sql(r.get(0)), key_from_sql(r.get(1)));
                    (key, r.get::<_, Vec<u8>>(2))
                })
                .collect())
        })
    }
}
