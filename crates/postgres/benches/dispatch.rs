//! The repeat scheduler over PostgreSQL, as cluster mode runs its
//! scheduled deliveries (a holding [`PgQueue`]: due rows locked with `FOR
//! UPDATE SKIP LOCKED` in a transaction left open while their handlers
//! run, their outcomes committed in it; up to 4 such holds at once),
//! against
//! the job-queue design users run on PostgreSQL (River, Oban,
//! graphile-worker) on the same instance: a jobs table with a partial index
//! on the available jobs, a producer per queue fetching due jobs in batches
//! (`UPDATE … WHERE id IN (SELECT … ORDER BY run_at LIMIT n FOR UPDATE SKIP
//! LOCKED) RETURNING`, as many as it has free workers), and completions
//! batched by one completer (`DELETE … WHERE id = ANY($1)`, as
//! graphile-worker removes done jobs; River's completer batches its updates
//! the same way).
//!
//! The scenario of the repeat crate's own bench: 1,000,000 entries over 16
//! sources (queues), 100,000 of them due in one second, the other 900,000
//! due later all along; a no-op handler; 256 workers. Each round writes its
//! 100,000 due entries two seconds ahead with one statement (not timed:
//! written as another node or an application would, found by polling),
//! then times from the due second until every one was handled and its
//! removal committed; the lag is each entry's hand-out time minus the due
//! second. The two sides take turns round by round.
//!
//! ```sh
//! cargo bench -p estafeta-postgres --bench dispatch
//! ```
//!
//! Needs Debian's `postgresql` (a throwaway instance is started, with
//! PostgreSQL's default `shared_buffers` of 128 MB); without it the bench
//! fails. `DISPATCH_ROUNDS` (default 5) sets the rounds per side,
//! `DISPATCH_LATER` (default 900,000) the entries scheduled for later.

/// The `estafeta` binary's allocator: the scheduler is measured as the
/// server runs it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{PgQueue, Store};
use estafeta_repeat::bench::{self, DUE, Round, SOURCES, WORKERS, lag_since, source};
use estafeta_repeat::{Clock, Options, Scheduler, SystemClock};
use tokio::sync::{Notify, mpsc};

/// How far ahead of now a round's entries fall due: time to write
/// 100,000 of them first (each side's timing starts at the due second).
const LEAD: u64 = 5;
/// How long a node holds an entry it claimed (the server's lease).
const LEASE: Duration = Duration::from_secs(30);
/// How many claims a node holds open at once (the server's).
const HOLDS: usize = 4;
/// How long a read waits for a hold to end before it leases (the server's).
const HOLD_WAIT: Duration = Duration::from_millis(50);
/// The most jobs the baseline's producer takes in one fetch.
const FETCH: i64 = 100;
/// The baseline's poll interval when a fetch found nothing (River's
/// default is 1 s, with a 100 ms cooldown; shorter favours the baseline).
const POLL: Duration = Duration::from_millis(100);

fn now_secs() -> u64 {
    SystemClock.now_secs()
}

/// A connection of the bench's own (set-up statements, the baseline).
async fn connect(pg: &Postgres) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// The scheduler of one cluster node over the store, with 16 sources.
struct Cluster {
    scheduler: Scheduler<PgQueue, SystemClock>,
    sql: tokio_postgres::Client,
    round: usize,
}

impl Cluster {
    async fn setup(pg: &Postgres) -> Cluster {
        let store = Store::connect(&pg.url()).unwrap();
        store.migrate().await.unwrap();
        let sql = connect(pg).await;
        let later = now_secs() + 3_600;
        let names: Vec<String> = (0..SOURCES).map(source).collect();
        sql.execute(
            "INSERT INTO repeat_sources (name) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
            &[&names],
        )
        .await
        .unwrap();
        Cluster::insert(&sql, "later", bench::later() as i64, later, 86_400).await;
        let sources: Vec<&str> = names.iter().map(String::as_str).collect();
        let queue = PgQueue::holding(store, &sources, LEASE, HOLDS, HOLD_WAIT);
        Cluster {
            scheduler: Scheduler::new(queue, SystemClock, Options::default()),
            sql,
            round: 0,
        }
    }

    /// `n` entries named `<prefix>-<i>` over the sources, due at `due` plus
    /// `i` modulo `spread`, with a 16-byte payload, in one statement.
    async fn insert(sql: &tokio_postgres::Client, prefix: &str, n: i64, due: u64, spread: i64) {
        sql.execute(
            "INSERT INTO repeat_entries (id, source, due, attempt, payload)
             SELECT $1 || '-' || i, 's' || lpad((i % $2)::text, 2, '0'), $3 + i % $4, 0,
                    '\\x00000000000000000000000000000000'::bytea
             FROM generate_series(0::bigint, $5::bigint - 1) AS i",
            &[&prefix, &(SOURCES as i64), &(due as i64), &spread, &n],
        )
        .await
        .unwrap();
    }

    async fn round(&mut self) -> Round {
        self.round += 1;
        let due = now_secs() + LEAD;
        Cluster::insert(&self.sql, &format!("r{}", self.round), DUE as i64, due, 1).await;
        assert!(
            now_secs() < due,
            "writing the round's entries took past the due second"
        );
        let round = bench::dispatch_round(&self.scheduler, due).await;
        let left: i64 = self
            .sql
            .query_one(
                "SELECT count(*) FROM repeat_entries WHERE id LIKE $1",
                &[&format!("r{}-%", self.round)],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(left, 0, "every handled entry is removed");
        round
    }
}

/// The job-queue baseline: its table on the same instance.
struct JobQueue {
    pg_url: String,
    sql: tokio_postgres::Client,
}

const FETCH_JOBS: &str = "WITH locked AS (
        SELECT id FROM jobs
        WHERE state = 'available' AND queue = $1 AND run_at <= $2
        ORDER BY run_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)
    UPDATE jobs SET state = 'running', attempt = jobs.attempt + 1
    FROM locked WHERE jobs.id = locked.id
    RETURNING jobs.id, jobs.run_at, jobs.payload";

impl JobQueue {
    async fn setup(pg: &Postgres) -> JobQueue {
        let sql = connect(pg).await;
        sql.batch_execute(
            "CREATE TABLE jobs (
                 id bigserial PRIMARY KEY,
                 queue text NOT NULL,
                 state text NOT NULL DEFAULT 'available',
                 run_at bigint NOT NULL,
                 attempt integer NOT NULL DEFAULT 0,
                 payload bytea NOT NULL);
             CREATE INDEX jobs_fetch ON jobs (queue, run_at, id) WHERE state = 'available';",
        )
        .await
        .unwrap();
        let q = JobQueue {
            pg_url: pg.url(),
            sql,
        };
        q.insert(bench::later() as i64, now_secs() + 3_600, 86_400)
            .await;
        q
    }

    async fn insert(&self, n: i64, due: u64, spread: i64) {
        self.sql
            .execute(
                "INSERT INTO jobs (queue, run_at, payload)
                 SELECT 's' || lpad((i % $1)::text, 2, '0'), $2 + i % $3,
                        '\\x00000000000000000000000000000000'::bytea
                 FROM generate_series(0::bigint, $4::bigint - 1) AS i",
                &[&(SOURCES as i64), &(due as i64), &spread, &n],
            )
            .await
            .unwrap();
        self.sql.execute("ANALYZE jobs", &[]).await.unwrap();
    }

    async fn round(&self) -> Round {
        let due = now_secs() + LEAD;
        self.insert(DUE as i64, due, 1).await;
        assert!(
            now_secs() < due,
            "writing the round's jobs took past the due second"
        );
        let lags = Arc::new(std::sync::Mutex::new(Vec::with_capacity(DUE)));
        let done = Arc::new(AtomicUsize::new(0));
        let all = Arc::new(Notify::new());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // The completer: deletes the done jobs, all that waited in one
        // statement, then counts them.
        let (finished, mut to_complete) = mpsc::unbounded_channel::<i64>();
        let completer = {
            let client = self.client().await;
            let (done, all) = (done.clone(), all.clone());
            tokio::spawn(async move {
                while let Some(first) = to_complete.recv().await {
                    let mut ids = vec![first];
                    while let Ok(id) = to_complete.try_recv() {
                        ids.push(id);
                    }
                    client
                        .execute("DELETE FROM jobs WHERE id = ANY($1)", &[&ids])
                        .await
                        .unwrap();
                    if done.fetch_add(ids.len(), Ordering::SeqCst) + ids.len() == DUE {
                        all.notify_one();
                    }
                }
            })
        };
        // A producer per queue, each with its share of the workers.
        let mut producers = Vec::new();
        for q in 0..SOURCES {
            let client = self.client().await;
            let workers = Arc::new(tokio::sync::Semaphore::new(WORKERS / SOURCES));
            let (lags, finished, stop) = (lags.clone(), finished.clone(), stop.clone());
            producers.push(tokio::spawn(async move {
                let queue = source(q);
                while !stop.load(Ordering::SeqCst) {
                    // Once a worker is free, as many jobs as are free.
                    let one = workers.clone().acquire_owned().await.unwrap();
                    let limit = (workers.available_permits() as i64 + 1).min(FETCH);
                    drop(one);
                    let now = now_secs() as i64;
                    let rows = client
                        .query(FETCH_JOBS, &[&queue, &now, &limit])
                        .await
                        .unwrap();
                    if rows.is_empty() {
                        tokio::time::sleep(POLL).await;
                        continue;
                    }
                    for row in rows {
                        let id: i64 = row.get(0);
                        let permit = workers.clone().acquire_owned().await.unwrap();
                        let (lags, finished) = (lags.clone(), finished.clone());
                        tokio::spawn(async move {
                            lags.lock().unwrap().push(lag_since(due));
                            let _ = finished.send(id);
                            drop(permit);
                        });
                    }
                }
            }));
        }
        drop(finished);
        all.notified().await;
        let elapsed = lag_since(due);
        stop.store(true, Ordering::SeqCst);
        for p in producers {
            p.await.unwrap();
        }
        completer.await.unwrap();
        let left: i64 = self
            .sql
            .query_one(
                "SELECT count(*) FROM jobs WHERE run_at = $1",
                &[&(due as i64)],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(left, 0, "every handled job is removed");
        let lags = std::mem::take(&mut *lags.lock().unwrap());
        (elapsed, lags)
    }

    async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.pg_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
    }
}

fn main() {
    let rounds: usize = std::env::var("DISPATCH_ROUNDS")
        .ok()
        .map_or(5, |n| n.parse().expect("DISPATCH_ROUNDS=N"));
    let pg = Postgres::start()
        .expect("PostgreSQL, both sides' store, must be installed (Debian's postgresql package)");
    pg.psql("ALTER SYSTEM SET shared_buffers = '128MB'")
        .unwrap();
    pg.stop().unwrap();
    pg.restart().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let began = Instant::now();
    let mut cluster = rt.block_on(Cluster::setup(&pg));
    let jobs = rt.block_on(JobQueue::setup(&pg));
    // Both sides' tables as a database that has held them a while, not as
    // a bulk load just left them: vacuumed and analyzed (as autovacuum
    // would have), their pages written out by a checkpoint, so that no
    // round meets the load's hint-bit writes or its checkpoint.
    rt.block_on(async {
        cluster
            .sql
            .batch_execute("VACUUM (ANALYZE) repeat_entries, jobs")
            .await
            .unwrap();
        cluster.sql.batch_execute("CHECKPOINT").await.unwrap();
    });
    println!(
        "set up in {:.1} s; load average {}",
        began.elapsed().as_secs_f64(),
        bench::load()
    );
    bench::alternate(
        rounds,
        [
            "estafeta-repeat over PostgreSQL (holding PgQueue)",
            "job queue (SKIP LOCKED, batch fetch)",
        ],
        |side| match side {
            0 => rt.block_on(cluster.round()),
            _ => rt.block_on(jobs.round()),
        },
    );
}
