//! What one record costs the event log's writer (CPU and wall time a
//! record, in the batches the writer makes), with 1,000 and 1,000,000
//! records kept and the log at its size limit, so that each batch removes
//! as many old records as it adds, as a server's log does once full:
//! against the same log kept as an application would keep it in SQLite
//! (`rusqlite`, WAL, `synchronous=FULL` so that a batch is on disk once
//! written as redb's is, one table with an index per name a filter reads,
//! each partial (no entry for a record without that name), one
//! transaction a batch with its oldest rows deleted in it), in the same
//! run on the same disk.
//!
//! The records are an upload's (`message received`: its database, device,
//! message and request id), their request ids made by the server
//! (time-ordered), or random, as a client's own may be.
//!
//! ```sh
//! cargo bench -p estafeta-server --bench event_log
//! # EVENTS_KEPT=1000,1000000 picks the sizes, EVENTS_BATCH=2500 the records
//! # a batch (the writer's second at 2,500 uploads/s), EVENTS_APPENDED=100000
//! # the records measured; BENCH_DIR the disk
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use estafeta_server::events::{EventRecord, EventStore, Retention};
use estafeta_server_harness::measure::{TICK, bench_dir, load_average, process_cpu_ticks, sizes};
use upload_record::upload_record;

#[path = "shared/upload_record.rs"]
mod upload_record;

/// 2026-12-01T00:00:00Z in nanoseconds.
const T0: u64 = 1_795_996_800_000_000_000;
/// The records of an upload a second at 2,500 uploads/s: 400 µs apart.
const APART: u64 = 400_000;
/// The records a batch holds while a log is filled.
const FILL_BATCH: usize = 5_000;

/// How a record's request id is made.
#[derive(Clone, Copy, PartialEq)]
enum RequestIds {
    /// By the server: a UUID of version 7, time-ordered.
    TimeOrdered,
    /// Random (a UUID of version 4), as a client may send its own.
    Random,
}

/// Upload `i`'s record.
fn record(i: u64, ids: RequestIds) -> EventRecord {
    let request = match ids {
        RequestIds::TimeOrdered => uuid::Uuid::now_v7(),
        RequestIds::Random => uuid::Uuid::new_v4(),
    };
    upload_record(i, T0 + i * APART, request)
}

/// What `append` cost a record.
struct Cost {
    cpu: Duration,
    wall: Duration,
}

impl Cost {
    fn per(cpu_ticks: u64, wall: Duration, records: u64) -> Cost {
        let n = u32::try_from(records).unwrap();
        Cost {
            cpu: TICK * u32::try_from(cpu_ticks).unwrap() / n,
            wall: wall / n,
        }
    }
}

/// Where records are appended: the event log's store, or the baseline.
trait Log {
    /// Appends `records` in one transaction, then removes the oldest while
    /// more than `limit` bytes of JSON are kept.
    fn append(&mut self, records: &[EventRecord], limit: u64);
    /// The bytes of JSON kept.
    fn bytes(&self) -> u64;
}

struct Redb(std::sync::Arc<EventStore>);

impl Log for Redb {
    fn append(&mut self, records: &[EventRecord], limit: u64) {
        let retention = Retention {
            max_age: Duration::from_secs(1 << 40),
            max_bytes: limit,
        };
        let last = records.last().map_or(T0, |r| {
            estafeta_server::events::store::parse_key(&r.id).unwrap().0
        });
        self.0.append(records, &retention, last).unwrap();
    }

    fn bytes(&self) -> u64 {
        self.0.size().unwrap().1
    }
}

/// The baseline: one SQLite table, an index per name a filter reads.
struct Sqlite {
    conn: rusqlite::Connection,
    bytes: u64,
}

impl Sqlite {
    fn open(path: &Path) -> Sqlite {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=FULL;
             CREATE TABLE events (
                 nanos INTEGER NOT NULL, seq INTEGER NOT NULL,
                 db TEXT, device TEXT, process TEXT, message TEXT, request TEXT,
                 json BLOB NOT NULL,
                 PRIMARY KEY (nanos, seq));
             CREATE INDEX events_db ON events (db, nanos, seq) WHERE db IS NOT NULL;
             CREATE INDEX events_device ON events (device, nanos, seq) WHERE device IS NOT NULL;
             CREATE INDEX events_process ON events (process, nanos, seq) WHERE process IS NOT NULL;
             CREATE INDEX events_message ON events (message, nanos, seq) WHERE message IS NOT NULL;
             CREATE INDEX events_request ON events (request, nanos, seq) WHERE request IS NOT NULL;
             CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);",
        )
        .unwrap();
        Sqlite { conn, bytes: 0 }
    }
}

impl Log for Sqlite {
    fn append(&mut self, records: &[EventRecord], limit: u64) {
        let tx = self.conn.transaction().unwrap();
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO events (nanos, seq, db, device, process, message, request, json)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )
                .unwrap();
            for r in records {
                let (nanos, seq) = estafeta_server::events::store::parse_key(&r.id).unwrap();
                let json = serde_json::to_vec(r).unwrap();
                self.bytes += json.len() as u64;
                insert
                    .execute(rusqlite::params![
                        nanos as i64,
                        seq as i64,
                        r.db,
                        r.device,
                        r.process,
                        r.message,
                        r.request,
                        json
                    ])
                    .unwrap();
            }
            let mut oldest = tx
                .prepare_cached("SELECT nanos, seq, length(json) FROM events ORDER BY nanos, seq")
                .unwrap();
            let mut rows = oldest.query([]).unwrap();
            let mut cut = None;
            while self.bytes > limit {
                let Some(row) = rows.next().unwrap() else {
                    break;
                };
                let key: (i64, i64) = (row.get(0).unwrap(), row.get(1).unwrap());
                self.bytes -= row.get::<_, i64>(2).unwrap() as u64;
                cut = Some(key);
            }
            drop(rows);
            if let Some((nanos, seq)) = cut {
                tx.execute(
                    "DELETE FROM events WHERE (nanos, seq) <= (?1, ?2)",
                    rusqlite::params![nanos, seq],
                )
                .unwrap();
            }
            tx.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('bytes', ?1)",
                [self.bytes as i64],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Fills `log` with `kept` records under a size limit of about as many,
/// as a server's log fills under its limit, then measures `appended` more
/// in batches of `batch` with the log at that limit.
fn measure(log: &mut dyn Log, ids: RequestIds, kept: u64, batch: usize, appended: u64) -> Cost {
    let end = kept + appended;
    let limit = kept * serde_json::to_vec(&record(end, ids)).unwrap().len() as u64;
    let mut i = 0;
    while i < kept {
        let n = FILL_BATCH.min(usize::try_from(kept - i).unwrap());
        let records: Vec<_> = (i..i + n as u64).map(|i| record(i, ids)).collect();
        log.append(&records, limit);
        i += n as u64;
    }
    assert!(
        log.bytes() <= limit,
        "{} bytes kept over a limit of {limit}",
        log.bytes()
    );
    let (started, ticks) = (Instant::now(), process_cpu_ticks("self"));
    while i < end {
        let n = batch.min(usize::try_from(end - i).unwrap());
        let records: Vec<_> = (i..i + n as u64).map(|i| record(i, ids)).collect();
        log.append(&records, limit);
        i += n as u64;
    }
    Cost::per(
        process_cpu_ticks("self") - ticks,
        started.elapsed(),
        appended,
    )
}

fn main() {
    let batch = sizes("EVENTS_BATCH", &[2500])[0] as usize;
    let appended = sizes("EVENTS_APPENDED", &[100_000])[0];
    println!(
        "event log, {appended} records appended in batches of {batch}, the log at its size limit"
    );
    for kept in sizes("EVENTS_KEPT", &[1_000, 1_000_000]) {
        println!(
            "{kept} records kept (load average {:.2} before)",
            load_average()
        );
        let mut costs = Vec::new();
        for (name, ids) in [
            (
                "the event log, request ids made by the server",
                RequestIds::TimeOrdered,
            ),
            ("the event log, random request ids", RequestIds::Random),
            ("SQLite (WAL, synchronous=FULL)", RequestIds::TimeOrdered),
        ] {
            let dir = tempfile::tempdir_in(bench_dir()).unwrap();
            let cost = if name.starts_with("SQLite") {
                let mut log = Sqlite::open(&dir.path().join("events.sqlite"));
                measure(&mut log, ids, kept, batch, appended)
            } else {
                let store = EventStore::open(&dir.path().join("events.redb")).unwrap();
                measure(&mut Redb(store), ids, kept, batch, appended)
            };
            println!(
                "  {name}: {:.1} µs of CPU, {:.1} µs of wall time a record",
                cost.cpu.as_secs_f64() * 1e6,
                cost.wall.as_secs_f64() * 1e6
            );
            costs.push(cost);
        }
        let ratio = |a: Duration, b: Duration| b.as_secs_f64() / a.as_secs_f64();
        println!(
            "  SQLite ÷ the event log (server's ids): CPU {:.2}, wall {:.2}",
            ratio(costs[0].cpu, costs[2].cpu),
            ratio(costs[0].wall, costs[2].wall)
        );
    }
}
