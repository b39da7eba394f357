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
//!
//! A holding queue ([`PgQueue::holding`]) writes no lease: its dispatching
//! read locks the due rows and leaves its transaction open while their
//! handlers run, and their outcomes are applied and committed in that same
//! transaction ([`Held`]); a removal removes the row where the read found
//! it, sent with the `COMMIT`. Other nodes pass over the locked rows. A node
//! that dies loses its connection, its transaction aborts and the rows are
//! due again at once; one paused past the store's hold limit
//! ([`Options::hold_limit`](crate::Options::hold_limit)) is cut off by the
//! database, its late outcomes fail and the entries are handed out again.
//! A hold settles when the last of its entries' handlers returns (those
//! its pass took ahead of the free workers wait for one within it), so it
//! suits handlers that take well under the hold limit (one slow handler
//! keeps its pass's other entries locked). Each hold keeps a pooled
//! connection; a read that finds all of a queue's holds in use waits a
//! moment for one to end, then claims with a lease. Within a second, a
//! holding read starts where the queue's last one ended (`Cursor`); the
//! first read of each second starts from the first entry.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use estafeta_repeat::store::{Applied, Held, Holding, Op, Read, Scan, Skip, SourceCount, Store};
use estafeta_repeat::{Entry, Position, StoreError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::types::ToSql;

use crate::Error;
use crate::Store as Db;
use crate::closing::Closing;
use crate::schedule::{PgSchedule, apply_run, runs, to_sql};

/// Up to `$2` due entries of each source `$1` (with its place `ord` in
/// the arrays) at or after its position (`$4` due, `$5` id), locked,
/// passing over those other transactions hold, each with its row's place
/// in the table (`ctid`). The position is a bound of the index scan, so
/// rows before it are not visited.
const DUE: &str = "SELECT s.ord, e.due, e.id, e.attempt, e.payload, e.ctid::text
    FROM unnest($1::text[], $2::bigint[], $4::bigint[], $5::text[])
        WITH ORDINALITY AS s(source, n, from_due, from_id, ord)
    CROSS JOIN LATERAL (SELECT due, id, attempt, payload, ctid FROM repeat_entries
        WHERE source = s.source AND (due, id) >= (s.from_due, s.from_id COLLATE \"C\")
            AND due <= $3
        ORDER BY due, id LIMIT s.n
        FOR UPDATE SKIP LOCKED) AS e
    ORDER BY s.ord, e.due, e.id";
const CLAIM: &str = "UPDATE repeat_entries SET due = $2 WHERE id = ANY($1)";
/// Removes the rows at these places (`ctid`s as text); returns their ids.
const REMOVE_HELD: &str =
    "DELETE FROM repeat_entries WHERE ctid = ANY($1::text[]::tid[]) RETURNING id";
/// A holding claim's transaction. `DUE` runs with its generic plan, made
/// once per connection: the plan is the same whatever the sources and
/// positions, and PostgreSQL would otherwise plan it again at each read
/// (0.17 ms a read, beside about 1 ms to run it).
const BEGIN_HOLD: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan";
/// A leasing claim's transaction, as a holding one, committed without
/// waiting for its log's flush.
const BEGIN_LEASE: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan;
    SET LOCAL synchronous_commit = off";
/// Sent after `DUE`, in its round trip: the claim's later statements (a
/// hold's outcomes) are planned as usual.
const AFTER_DUE: &str = "SET LOCAL plan_cache_mode TO DEFAULT";
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
    /// A holding queue's holds (see the module's doc).
    holds: Option<Holds>,
}

/// A holding queue's holds and where its holding reads start.
struct Holds {
    /// One permit per hold that may be open at once.
    slots: Arc<Semaphore>,
    /// How long a read that finds every hold in use waits for one to end
    /// before it claims with a lease: a hold ends within milliseconds of
    /// its handlers, and a leasing claim costs more than that wait (it
    /// writes every row it takes, and its outcomes commit apart).
    wait: Duration,
    /// Where each source's next holding read starts.
    cursors: std::sync::Mutex<HashMap<String, Cursor>>,
}

/// Where a holding read of a source starts: at the last entry a holding
/// read of this queue took in the same second. So a read does not step
/// again over the rows its queue's open holds lock, nor over those its
/// settled holds removed (their index entries stay until vacuumed, and
/// are stepped over one by one), which slowed each read as a second's
/// deliveries went on. The first read of a new second starts from the
/// source's first entry: within a second it finds what a hold that ended
/// unsettled, or another node, left due behind the cursor.
struct Cursor {
    /// The second of the read that last started from the first entry.
    second: u64,
    /// The last entry taken since.
    at: Position,
}

impl Holds {
    /// Where a holding read of `source` at `now` starts: the first read of
    /// a second starts from the first entry.
    fn cursor(&self, source: &str, now: u64) -> Position {
        let mut cursors = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
        match cursors.get(source) {
            Some(c) if c.second == now => c.at.clone(),
            _ => {
                let rewound = Cursor {
                    second: now,
                    at: first(),
                };
                cursors.insert(source.to_owned(), rewound);
                first()
            }
        }
    }

    /// A holding read of `source` at `now` took entries up to `last`.
    fn advance(&self, source: &str, now: u64, last: Position) {
        let mut cursors = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cursors.get_mut(source)
            && c.second == now
            && last > c.at
        {
            c.at = last;
        }
    }
}

/// The position before every entry.
fn first() -> Position {
    Position {
        due: 0,
        id: String::new(),
    }
}

/// How a read takes what it returns.
#[derive(Clone, Copy)]
enum Take {
    /// Moved ahead to this second, committed at once.
    Lease(u64),
    /// Locked by a transaction left open.
    Hold,
}

/// A holding queue's open claim ([`Held`]).
struct PgHold {
    rows: HeldRows,
    runtime: tokio::runtime::Handle,
    /// One of the queue's holds, given back when this ends.
    _slot: OwnedSemaphorePermit,
}

/// The transaction of a hold and where the rows it locked are.
struct HeldRows {
    tx: Closing,
    /// Each held entry's row, by id: its `ctid`, which stays while the
    /// lock is held (every other writer waits on it, and vacuum does not
    /// move a live row).
    places: HashMap<String, String>,
}

impl std::fmt::Debug for PgHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgHold").finish_non_exhaustive()
    }
}

impl Held for PgHold {
    fn settle(self: Box<Self>, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        let PgHold {
            rows: HeldRows { tx, places },
            runtime,
            _slot,
        } = *self;
        // A held row is as it was read, where it was read: a removal
        // removes the row at its place, with no lookup by id and without
        // sending its payload back. Other outcomes apply as `apply` does.
        let (mut removals, mut removed_at) = (Vec::new(), Vec::new());
        let (mut others, mut others_at) = (Vec::new(), Vec::new());
        for (i, op) in ops.iter().enumerate() {
            let place = match op {
                Op::Remove(entry) => places.get(&entry.id).map(|p| (p, entry.id.as_str())),
                _ => None,
            };
            match place {
                Some((place, id)) => {
                    removals.push(place.as_str());
                    removed_at.push((i, id));
                }
                None => {
                    others.push(op.clone());
                    others_at.push(i);
                }
            }
        }
        runtime
            .block_on(async {
                let client = tx.get();
                let mut applied = vec![Applied::Unchanged; ops.len()];
                let mut at = others_at.into_iter();
                for run in runs(&others) {
                    for (done, i) in apply_run(client, run).await?.into_iter().zip(&mut at) {
                        applied[i] = done;
                    }
                }
                // The removal goes out with the `COMMIT`, in one round trip
                // (sent in the order the two are first polled). A failed
                // removal aborts the transaction, whose `COMMIT` then rolls
                // it back, and fails the settle.
                let remove = client.prepare_cached(REMOVE_HELD).await?;
                let (removed, ()) = tokio::try_join!(
                    async {
                        match removals.is_empty() {
                            true => Ok(Vec::new()),
                            false => client.query(&remove, &[&removals]).await,
                        }
                    },
                    client.batch_execute("COMMIT"),
                )?;
                let removed: std::collections::HashSet<String> =
                    removed.iter().map(|r| r.get(0)).collect();
                for (i, id) in removed_at {
                    if removed.contains(id) {
                        applied[i] = Applied::Removed;
                    }
                }
                tx.keep();
                Ok::<_, Error>(applied)
            })
            .map_err(|e| StoreError::Backend(Box::new(e)))
    }
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
            holds: None,
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

    /// The entries of `sources`, each due entry handed to one node by a
    /// dispatching read that holds it (see the module's doc), with at most
    /// `holds` held at once; a read that finds them all in use waits up to
    /// `wait` for one to end, then claims for `lease`.
    pub fn holding(
        db: Db,
        sources: &[&str],
        lease: Duration,
        holds: usize,
        wait: Duration,
    ) -> PgQueue {
        PgQueue {
            holds: Some(Holds {
                slots: Arc::new(Semaphore::new(holds)),
                wait,
                cursors: std::sync::Mutex::new(HashMap::new()),
            }),
            ..PgQueue::claiming(db, sources, lease)
        }
    }

    /// Takes up to its limit of due entries of each read's source, all in
    /// one transaction; one scan per read, in order, and the transaction if
    /// it holds what it took.
    fn claim(
        &self,
        reads: &[Read<'_>],
        now: u64,
        take: Take,
        skip: &dyn Fn(&str, &Position) -> bool,
    ) -> Result<(Vec<Scan>, Option<HeldRows>), StoreError> {
        let sources: Vec<&str> = reads.iter().map(|r| r.source).collect();
        // A lease asks one more than the limit: the first one left says when
        // to read again (its lock ends with the claim's commit). A hold asks
        // no more than it hands out, or it would keep the one left from
        // every reader while it is open.
        let extra = match take {
            Take::Lease(_) => 1,
            Take::Hold => 0,
        };
        let asks: Vec<i64> = reads
            .iter()
            .map(|r| match r.limit {
                0 => 0,
                n => i64::try_from(n.saturating_add(extra)).unwrap_or(i64::MAX),
            })
            .collect();
        let froms: Vec<Position> = reads
            .iter()
            .map(|r| match (take, &self.holds) {
                (Take::Hold, Some(holds)) => holds.cursor(r.source, now),
                _ => first(),
            })
            .collect();
        let from_dues: Vec<i64> = froms.iter().map(|p| to_sql(p.due)).collect();
        let from_ids: Vec<&str> = froms.iter().map(|p| p.id.as_str()).collect();
        self.plain
            .run(async {
                let tx = Closing::new(self.plain.db().client().await?);
                let client = tx.get();
                let (due, claim, head) = tokio::try_join!(
                    client.prepare_cached(DUE),
                    client.prepare_cached(CLAIM),
                    client.prepare_cached(HEAD),
                )?;
                let mut scans = vec![Scan::default(); reads.len()];
                let mut ids = Vec::new();
                let mut places = HashMap::new();
                // A leasing claim is not waited for on disk: one lost in a
                // crash of the database leaves its entries due again, handed
                // out again as when a claimer dies (see the module's doc); the
                // outcomes' commits are durable, and with them what the log
                // holds before them.
                let begin = match take {
                    Take::Lease(_) => BEGIN_LEASE,
                    Take::Hold => BEGIN_HOLD,
                };
                let at = to_sql(now);
                let params: [&(dyn ToSql + Sync); 5] =
                    [&sources, &asks, &at, &from_dues, &from_ids];
                let (_, rows, ()) = tokio::try_join!(
                    client.batch_execute(begin),
                    client.query(&due, &params),
                    client.batch_execute(AFTER_DUE),
                )?;
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
                    if let Take::Hold = take {
                        places.insert(entry.id.clone(), row.get::<_, String>(5));
                    }
                    scan.entries.push(match take {
                        Take::Lease(until) => Entry {
                            due: until,
                            ..entry
                        },
                        Take::Hold => entry,
                    });
                }
                // A full hold may have left more due: read again at once,
                // after what it took.
                if let (Take::Hold, Some(holds)) = (take, &self.holds) {
                    for (read, scan) in reads.iter().zip(&mut scans) {
                        if read.limit > 0 && scan.entries.len() >= read.limit {
                            scan.next_due.get_or_insert(now);
                        }
                        if let Some(last) = scan.entries.last() {
                            holds.advance(read.source, now, last.position());
                        }
                    }
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
                    match (take, ids.is_empty()) {
                        (Take::Lease(until), false) => {
                            client.execute(&claim, &[&ids, &to_sql(until)]).await
                        }
                        _ => Ok(0),
                    }
                };
                let next = async {
                    match heads.is_empty() {
                        true => Ok(Vec::new()),
                        false => client.query(&head, &[&heads, &afters]).await,
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
                match take {
                    Take::Hold if !ids.is_empty() => Ok((scans, Some(HeldRows { tx, places }))),
                    _ => {
                        tx.commit().await?;
                        Ok((scans, None))
                    }
                }
            })
            .map(|(scans, held)| {
                // Entries of other nodes (and lapsed leases) are found by
                // looking again at the next second.
                let poll = now.saturating_add(1);
                let scans = scans
                    .into_iter()
                    .map(|mut scan| {
                        scan.next_due = Some(scan.next_due.map_or(poll, |d| d.min(poll)));
                        scan
                    })
                    .collect();
                (scans, held)
            })
    }

    /// Claims for every read of this queue's sources in one transaction
    /// (other sources are read as empty), as `take` says.
    fn claim_sources(
        &self,
        reads: &[Read<'_>],
        now: u64,
        take: Take,
        skip: &dyn Fn(&str, &Position) -> bool,
    ) -> (Vec<Result<Scan, StoreError>>, Option<HeldRows>) {
        let ours: Vec<Read<'_>> = reads
            .iter()
            .filter(|r| self.sources.iter().any(|s| s == r.source))
            .copied()
            .collect();
        match self.claim(&ours, now, take, skip) {
            Ok((scans, held)) => {
                let mut scans = ours.iter().map(|r| r.source).zip(scans);
                let mut next = scans.next();
                let scans = reads
                    .iter()
                    .map(|r| match &next {
                        Some((source, _)) if *source == r.source => {
                            let scan = next.take().map(|(_, scan)| scan).unwrap_or_default();
                            next = scans.next();
                            Ok(scan)
                        }
                        _ => Ok(Scan::default()),
                    })
                    .collect();
                (scans, held)
            }
            Err(e) => {
                let text = e.to_string();
                let scans = reads
                    .iter()
                    .map(|_| Err(StoreError::Backend(text.clone().into())))
                    .collect();
                (scans, None)
            }
        }
    }
}

/// A leasing claim at `now`.
fn lease_until(now: u64, lease: Duration) -> Take {
    Take::Lease(now.saturating_add(lease.as_secs()))
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
                .claim(&[read], now, lease_until(now, lease), &|_, at| skip(at))
                .map(|(mut scans, _)| scans.pop().unwrap_or_default()),
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
        self.claim_sources(reads, now, lease_until(now, lease), skip)
            .0
    }

    /// A holding queue holds what it reads while one of its holds is free.
    fn hold_sources(
        &self,
        reads: &[Read<'_>],
        now: u64,
        skip: &dyn Fn(&str, &Position) -> bool,
    ) -> Holding {
        let (Some(holds), false) = (&self.holds, reads.is_empty()) else {
            return Holding::unheld(self.scan_sources(reads, now, skip));
        };
        // A free hold is taken at once (the timeout polls first).
        let slot = self.plain.runtime().block_on(tokio::time::timeout(
            holds.wait,
            Arc::clone(&holds.slots).acquire_owned(),
        ));
        let Ok(Ok(slot)) = slot else {
            return Holding::unheld(self.scan_sources(reads, now, skip));
        };
        let (scans, rows) = self.claim_sources(reads, now, Take::Hold, skip);
        let held = rows.map(|rows| {
            Box::new(PgHold {
                rows,
                runtime: self.plain.runtime().clone(),
                _slot: slot,
            }) as Box<dyn Held>
        });
        Holding { scans, held }
    }

    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        self.plain.count(source, now)
    }

    fn contains(&self, id: &str) -> Result<bool, StoreError> {
        self.plain.contains(id)
    }
}
