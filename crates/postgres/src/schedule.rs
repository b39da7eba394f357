//! The repeat scheduler's store (`estafeta_repeat::store::Store`) over the
//! `repeat_entries` and `repeat_sources` tables, so that the exchange's
//! scheduled deliveries (and any other repeat source) are kept in the
//! cluster store and dispatched by whichever nodes run a scheduler on it.
//!
//! The trait is synchronous and the scheduler calls it from blocking
//! threads; each call runs on the pool through the runtime handle taken at
//! [`PgSchedule::new`]. [`Store::apply`] is one transaction.
//!
//! Several nodes share the table, and a node's scheduler is told only of
//! the entries it writes itself. So that every node sees entries written by
//! others (another node's scheduler, a message batch that scheduled a
//! message), a read ignores the scheduler's read cursor and starts at the
//! source's first entry (passing over the entries this node has in flight),
//! and a read that finds nothing more due reports the next second as the
//! source's next due time: each node looks at the table once a second.
//! Two nodes may hand out the same due entry; its handler must be
//! idempotent (the exchange's delivery is: one message per id), and the
//! entry is removed once, by whichever outcome comes first. A node hands
//! each due entry to one node by reading through [`crate::PgQueue::claiming`].

use std::collections::{HashMap, HashSet};

use deadpool_postgres::GenericClient;
use estafeta_repeat::store::{Applied, Op, Read, Scan, Skip, SourceCount, Store};
use estafeta_repeat::{Entry, Position, StoreError};
use tokio_postgres::types::ToSql;

use crate::Error;

/// Inserts an entry, replacing any entry with its id, and notes its source.
pub(crate) const PUT_ENTRY: &str = "WITH source AS (
        INSERT INTO repeat_sources (name) VALUES ($2) ON CONFLICT DO NOTHING)
    INSERT INTO repeat_entries (id, source, due, attempt, payload) VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (id) DO UPDATE SET source = EXCLUDED.source, due = EXCLUDED.due,
        attempt = EXCLUDED.attempt, payload = EXCLUDED.payload";

// The statements below each apply a run of ops of one kind on distinct
// ids, their entries as one array per column: `$1` ids, `$2` sources,
// `$3` due seconds, `$4` attempts, `$5` payloads.

/// `PUT_ENTRY` for a run of entries.
const PUT_RUN: &str = "WITH t AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[],
        $4::integer[], $5::bytea[]) AS t(id, source, due, attempt, payload)),
    source AS (INSERT INTO repeat_sources (name) SELECT DISTINCT source FROM t
        ON CONFLICT DO NOTHING)
    INSERT INTO repeat_entries (id, source, due, attempt, payload)
    SELECT id, source, due, attempt, payload FROM t
    ON CONFLICT (id) DO UPDATE SET source = EXCLUDED.source, due = EXCLUDED.due,
        attempt = EXCLUDED.attempt, payload = EXCLUDED.payload";
/// Inserts each entry whose id is free; returns the ids inserted.
const RESTORE_RUN: &str = "WITH t AS (SELECT * FROM unnest($1::text[], $2::text[],
        $3::bigint[], $4::integer[], $5::bytea[]) AS t(id, source, due, attempt, payload)),
    source AS (INSERT INTO repeat_sources (name) SELECT DISTINCT source FROM t
        ON CONFLICT DO NOTHING)
    INSERT INTO repeat_entries (id, source, due, attempt, payload)
    SELECT id, source, due, attempt, payload FROM t
    ON CONFLICT (id) DO NOTHING RETURNING id";
/// Removes the entries with these ids; returns the ids removed.
const CANCEL_RUN: &str = "DELETE FROM repeat_entries WHERE id = ANY($1) RETURNING id";
/// Moves each id to its due second (`$2`), attempts back to 0; returns
/// the ids moved and their sources.
const RESCHEDULE_RUN: &str = "UPDATE repeat_entries r SET due = t.due, attempt = 0
    FROM unnest($1::text[], $2::bigint[]) AS t(id, due)
    WHERE r.id = t.id RETURNING r.id, r.source";
/// Removes each entry exactly as read (place, attempt and payload);
/// returns the ids removed.
const REMOVE_RUN: &str = "DELETE FROM repeat_entries r
    USING unnest($1::text[], $2::text[], $3::bigint[], $4::integer[], $5::bytea[])
        AS t(id, source, due, attempt, payload)
    WHERE r.id = t.id AND r.source = t.source AND r.due = t.due
        AND r.attempt = t.attempt AND r.payload = t.payload
    RETURNING r.id";
/// Moves each entry exactly as read to its new due second (`$6`) and
/// attempt (`$7`); returns the ids moved.
const MOVE_RUN: &str = "UPDATE repeat_entries r SET due = t.to_due, attempt = t.to_attempt
    FROM unnest($1::text[], $2::text[], $3::bigint[], $4::integer[], $5::bytea[],
        $6::bigint[], $7::integer[])
        AS t(id, source, due, attempt, payload, to_due, to_attempt)
    WHERE r.id = t.id AND r.source = t.source AND r.due = t.due
        AND r.attempt = t.attempt AND r.payload = t.payload
    RETURNING r.id";
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
    /// The database the entries are in.
    pub(crate) fn db(&self) -> &crate::Store {
        &self.store
    }

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

    /// The runtime taken at [`PgSchedule::new`].
    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// Runs `f` on the runtime taken at [`PgSchedule::new`], from the
    /// blocking thread the scheduler calls a store from.
    pub(crate) fn run<T>(
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

/// The kind of an [`Op`]: consecutive ops of one kind are one statement.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Put,
    Cancel,
    Reschedule,
    Remove,
    Move,
    Restore,
}

fn kind_and_id(op: &Op) -> (Kind, &str) {
    match op {
        Op::Put(e) => (Kind::Put, &e.id),
        Op::Cancel { id } => (Kind::Cancel, id),
        Op::Reschedule { id, .. } => (Kind::Reschedule, id),
        Op::Remove(e) => (Kind::Remove, &e.id),
        Op::Move { entry, .. } => (Kind::Move, &entry.id),
        Op::Restore(e) => (Kind::Restore, &e.id),
    }
}

/// Splits `ops` into runs of one kind, each id at most once in a run, so
/// that a run is one statement and an op on an id sees what the ops
/// before it did (a run ends where its id comes again).
pub(crate) fn runs(ops: &[Op]) -> Vec<&[Op]> {
    let mut runs = Vec::new();
    let mut start = 0;
    let mut ids = HashSet::new();
    for (i, op) in ops.iter().enumerate() {
        let (kind, id) = kind_and_id(op);
        let same = i > start && kind_and_id(&ops[start]).0 == kind;
        if !same || !ids.insert(id) {
            if i > start {
                runs.push(&ops[start..i]);
            }
            start = i;
            ids.clear();
            ids.insert(id);
        }
    }
    if start < ops.len() {
        runs.push(&ops[start..]);
    }
    runs
}

/// A run's entries as the statements take them: one array per column.
#[derive(Default)]
struct Columns<'a> {
    ids: Vec<&'a str>,
    sources: Vec<&'a str>,
    dues: Vec<i64>,
    attempts: Vec<i32>,
    payloads: Vec<&'a [u8]>,
}

impl<'a> Columns<'a> {
    fn of(entries: impl Iterator<Item = &'a Entry>) -> Columns<'a> {
        let mut columns = Columns::default();
        for e in entries {
            columns.ids.push(&e.id);
            columns.sources.push(&e.source);
            columns.dues.push(to_sql(e.due));
            columns.attempts.push(attempt_to_sql(e.attempt));
            columns.payloads.push(&e.payload);
        }
        columns
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.ids,
            &self.sources,
            &self.dues,
            &self.attempts,
            &self.payloads,
        ]
    }
}

/// The entries of a run of `Put`, `Remove`, `Restore` or `Move` ops.
fn entries(run: &[Op]) -> impl Iterator<Item = &Entry> {
    run.iter().filter_map(|op| match op {
        Op::Put(e) | Op::Remove(e) | Op::Restore(e) | Op::Move { entry: e, .. } => Some(e),
        Op::Cancel { .. } | Op::Reschedule { .. } => None,
    })
}

/// Applies one run (see [`runs`]) with one statement, prepared once per
/// connection.
pub(crate) async fn apply_run(tx: &impl GenericClient, run: &[Op]) -> Result<Vec<Applied>, Error> {
    let Some(first) = run.first() else {
        return Ok(Vec::new());
    };
    /// The ids a statement's rows name first.
    async fn touched(
        tx: &impl GenericClient,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<HashSet<String>, Error> {
        let statement = tx.prepare_cached(sql).await?;
        let rows = tx.query(&statement, params).await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
    let ids = || -> Vec<&str> { run.iter().map(|op| kind_and_id(op).1).collect() };
    let was =
        |done: &HashSet<String>, op: &Op, then: Applied| match done.contains(kind_and_id(op).1) {
            true => then,
            false => Applied::Unchanged,
        };
    Ok(match kind_and_id(first).0 {
        Kind::Put => {
            let columns = Columns::of(entries(run));
            let statement = tx.prepare_cached(PUT_RUN).await?;
            tx.execute(&statement, &columns.params()).await?;
            entries(run)
                .map(|e| placed(e.source.clone(), e.due, &e.id))
                .collect()
        }
        Kind::Restore => {
            let columns = Columns::of(entries(run));
            let done = touched(tx, RESTORE_RUN, &columns.params()).await?;
            entries(run)
                .map(|e| match done.contains(&e.id) {
                    true => placed(e.source.clone(), e.due, &e.id),
                    false => Applied::Unchanged,
                })
                .collect()
        }
        Kind::Remove => {
            let columns = Columns::of(entries(run));
            let done = touched(tx, REMOVE_RUN, &columns.params()).await?;
            run.iter()
                .map(|op| was(&done, op, Applied::Removed))
                .collect()
        }
        Kind::Cancel => {
            let done = touched(tx, CANCEL_RUN, &[&ids()]).await?;
            run.iter()
                .map(|op| was(&done, op, Applied::Removed))
                .collect()
        }
        Kind::Move => {
            let columns = Columns::of(entries(run));
            let (mut to_dues, mut to_attempts) = (Vec::new(), Vec::new());
            for op in run {
                if let Op::Move { due, attempt, .. } = op {
                    to_dues.push(to_sql(*due));
                    to_attempts.push(attempt_to_sql(*attempt));
                }
            }
            let [a, b, c, d, e] = columns.params();
            let done = touched(tx, MOVE_RUN, &[a, b, c, d, e, &to_dues, &to_attempts]).await?;
            run.iter()
                .map(|op| match op {
                    Op::Move { entry, due, .. } if done.contains(&entry.id) => {
                        placed(entry.source.clone(), *due, &entry.id)
                    }
                    _ => Applied::Unchanged,
                })
                .collect()
        }
        Kind::Reschedule => {
            let dues: Vec<i64> = run
                .iter()
                .filter_map(|op| match op {
                    Op::Reschedule { due, .. } => Some(to_sql(*due)),
                    _ => None,
                })
                .collect();
            let statement = tx.prepare_cached(RESCHEDULE_RUN).await?;
            let sources: HashMap<String, String> = tx
                .query(&statement, &[&ids(), &dues])
                .await?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            run.iter()
                .map(|op| match op {
                    Op::Reschedule { id, due } => match sources.get(id) {
                        Some(source) => placed(source.clone(), *due, id),
                        None => Applied::Unchanged,
                    },
                    _ => Applied::Unchanged,
                })
                .collect()
        }
    })
}

impl Store for PgSchedule {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        self.run(async {
            let mut client = self.store.client().await?;
            let tx = client.transaction().await?;
            let mut applied = Vec::with_capacity(ops.len());
            for run in runs(ops) {
                applied.extend(apply_run(&tx, run).await?);
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
    fn scan(&self, read: Read<'_>, now: u64, skip: Skip<'_>) -> Result<Scan, StoreError> {
        let source = read.source;
        let page = i64::try_from(read.limit.saturating_add(1).clamp(16, 1024)).unwrap_or(1024);
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
                    if !scan.offer(entry, now, read.limit, skip) {
                        return Ok(scan);
                    }
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

    fn contains(&self, id: &str) -> Result<bool, StoreError> {
        self.run(async {
            let client = self.store.client().await?;
            let row = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM repeat_entries WHERE id = $1)",
                    &[&id],
                )
                .await?;
            Ok(row.get(0))
        })
    }
}
