//! Engine throughput against what a user would write instead, measured in
//! the same run (see BENCHMARKS.md):
//!
//! - `in_memory/*`: acquire + change + release on 10,000 keys (uniform and
//!   Zipf-skewed), engine vs `DashMap<Key, Arc<tokio::sync::Mutex<State>>>`;
//!   `in_memory_one_worker/*`: the same on a one-worker runtime.
//! - `paired`: the same comparison, both sides alternately round after
//!   round (printed: median ratio and range).
//! - `durable`: releases that each carry a persistent change (a counter
//!   per key, durable before the release returns), the engine on redb
//!   (group commit) against what a user would run instead, alternately
//!   round after round: Redis with `appendfsync always` through the `redis`
//!   crate (`INCR`, one multiplexed connection that pipelines every task's
//!   commands), and SQLite in WAL mode with `synchronous=FULL`, its updates
//!   batched into transactions by one writer thread (printed: rates and
//!   median ratios). Needs `redis-server`; without it the bench fails.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dashmap::DashMap;
use estafeta_session::{Config, Engine, MemoryStorage, RedbStorage};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEYS: u64 = 10_000;
const TASKS: u64 = 64;

/// A small deterministic generator, so both sides see the same key sequence.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Key sequences: uniform, or Zipf (s = 1) over the key space.
fn keys(zipf: bool, n: usize, seed: u64) -> Vec<u64> {
    let mut rng = XorShift(seed | 1);
    if !zipf {
        return (0..n).map(|_| rng.next() % KEYS).collect();
    }
    let mut cdf = Vec::with_capacity(KEYS as usize);
    let mut total = 0.0;
    for k in 1..=KEYS {
        total += 1.0 / k as f64;
        cdf.push(total);
    }
    (0..n)
        .map(|_| {
            let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
            cdf.partition_point(|&c| c < u) as u64
        })
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    runtime_with(2)
}

fn runtime_with(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// One operation on one key, as each side does it.
trait Op: Clone + Send + Sync + 'static {
    fn run(&self, key: u64) -> impl std::future::Future<Output = ()> + Send;
}

/// Engine: acquire, change in memory, release (drop).
#[derive(Clone)]
struct EngineOp(Engine<u64, u64>);
impl Op for EngineOp {
    async fn run(&self, key: u64) {
        let mut s = self.0.get(key, true).await.unwrap().unwrap();
        *s.state_mut() += 1;
    }
}

/// Baseline: a DashMap of tokio mutexes.
#[derive(Clone)]
struct DashMapOp(Arc<DashMap<u64, Arc<tokio::sync::Mutex<u64>>>>);
impl Op for DashMapOp {
    async fn run(&self, key: u64) {
        let m = self.0.entry(key).or_default().clone();
        *m.lock().await += 1;
    }
}

/// Engine: a durable release per operation.
#[derive(Clone)]
struct DurableEngineOp(Engine<u64, u64>);
impl Op for DurableEngineOp {
    async fn run(&self, key: u64) {
        let mut s = self.0.get(key, true).await.unwrap().unwrap();
        *s.persistent_mut() += 1;
        s.release().await.unwrap();
    }
}

/// Baseline: Redis with `appendfsync always` (every write in the
/// append-only file, fsynced before the answer), `INCR` per release.
#[derive(Clone)]
struct RedisOp(redis::aio::MultiplexedConnection);
impl Op for RedisOp {
    async fn run(&self, key: u64) {
        let mut conn = self.0.clone();
        redis::cmd("INCR")
            .arg(key)
            .query_async::<u64>(&mut conn)
            .await
            .unwrap();
    }
}

/// A `redis-server` with `appendfsync always` in `dir`, on a free port,
/// killed when dropped.
struct RedisServer(std::process::Child);

impl RedisServer {
    /// Started and answering, and a connection to it; panics (failing the
    /// bench) when it cannot run.
    fn start(
        rt: &tokio::runtime::Runtime,
        dir: &std::path::Path,
    ) -> (RedisServer, redis::aio::MultiplexedConnection) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server, the baseline, must be installed (apt-get install redis-server)");
        let server = RedisServer(child);
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
        let began = Instant::now();
        loop {
            if let Ok(conn) = rt.block_on(client.get_multiplexed_async_connection()) {
                return (server, conn);
            }
            assert!(
                began.elapsed() < Duration::from_secs(30),
                "redis-server did not answer"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Baseline: SQLite in WAL mode with `synchronous=FULL` (the WAL fsynced at
/// every commit), one writer thread that takes every update waiting and
/// commits them in one transaction (up to [`SQLITE_BATCH`]): the group
/// commit a user of SQLite would write for many concurrent tasks.
#[derive(Clone)]
struct SqliteOp(std::sync::mpsc::Sender<(u64, tokio::sync::oneshot::Sender<()>)>);
impl Op for SqliteOp {
    async fn run(&self, key: u64) {
        let (done, wait) = tokio::sync::oneshot::channel();
        self.0.send((key, done)).unwrap();
        wait.await.unwrap();
    }
}

/// The most updates in one SQLite transaction.
const SQLITE_BATCH: usize = 1024;

impl SqliteOp {
    /// The database at `path` and its writer thread (ending when every
    /// sender is dropped).
    fn open(path: &std::path::Path) -> SqliteOp {
        let db = rusqlite::Connection::open(path).unwrap();
        let mode: String = db
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        db.execute_batch(
            "PRAGMA synchronous=FULL;
             CREATE TABLE sessions (key INTEGER PRIMARY KEY, value INTEGER NOT NULL);",
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<(u64, tokio::sync::oneshot::Sender<()>)>();
        std::thread::spawn(move || {
            let mut db = db;
            while let Ok(first) = rx.recv() {
                let mut batch = vec![first];
                while batch.len() < SQLITE_BATCH {
                    match rx.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let t = db.transaction().unwrap();
                {
                    let mut update = t
                        .prepare_cached(
                            "INSERT INTO sessions (key, value) VALUES (?1, 1)
                             ON CONFLICT (key) DO UPDATE SET value = value + 1",
                        )
                        .unwrap();
                    for (key, _) in &batch {
                        update.execute([*key as i64]).unwrap();
                    }
                }
                t.commit().unwrap();
                for (_, done) in batch {
                    let _ = done.send(());
                }
            }
        });
        SqliteOp(tx)
    }
}

/// Run `iters` operations spread over TASKS tasks; the elapsed time.
async fn run_tasks<O: Op>(iters: u64, zipf: bool, op: O) -> Duration {
    let per_task = (iters / TASKS).max(1) as usize;
    let seqs: Vec<Vec<u64>> = (0..TASKS).map(|t| keys(zipf, per_task, t + 1)).collect();
    let start = Instant::now();
    let handles: Vec<_> = seqs
        .into_iter()
        .map(|seq| {
            let op = op.clone();
            tokio::spawn(async move {
                for k in seq {
                    op.run(k).await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    start.elapsed()
}

fn in_memory(c: &mut Criterion) {
    in_memory_on(c, "in_memory", 2);
    // The same on one worker thread: no cache line travels between cores,
    // so this compares the work each side does per operation.
    in_memory_on(c, "in_memory_one_worker", 1);
}

fn in_memory_on(c: &mut Criterion, prefix: &str, workers: usize) {
    let rt = runtime_with(workers);
    for zipf in [false, true] {
        let name = format!("{prefix}/{}", if zipf { "zipf" } else { "uniform" });
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(1));
        group.measurement_time(Duration::from_secs(5));
        let engine: Engine<u64, u64> = rt
            .block_on(Engine::builder(Arc::new(MemoryStorage::new())).open())
            .unwrap();
        group.bench_function("engine", |b| {
            b.to_async(&rt)
                .iter_custom(|iters| run_tasks(iters, zipf, EngineOp(engine.clone())))
        });
        let map: Arc<DashMap<u64, Arc<tokio::sync::Mutex<u64>>>> = Arc::new(DashMap::new());
        group.bench_function("dashmap_mutex", |b| {
            b.to_async(&rt)
                .iter_custom(|iters| run_tasks(iters, zipf, DashMapOp(map.clone())))
        });
        group.finish();
    }
}

/// The load average over the last minute.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

/// Not a criterion timing: the engine's durable releases and each
/// baseline's, alternately round after round (each round starting with
/// another side), on one disk (`BENCH_DIR`); prints each side's median
/// rate and the median of the rounds' ratios with their range.
fn durable(_c: &mut Criterion) {
    if filtered_out("durable") {
        return;
    }
    const ROUNDS: usize = 9;
    const OPS: u64 = TASKS * 500;
    let rt = runtime();
    let base =
        std::env::var_os("BENCH_DIR").map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let dir = tempfile::tempdir_in(base).unwrap();
    let storage = Arc::new(RedbStorage::open(dir.path().join("engine.redb")).unwrap());
    let engine: Engine<u64, u64> = rt
        .block_on(Engine::builder(storage).config(Config::default()).open())
        .unwrap();
    let redis_dir = dir.path().join("redis");
    std::fs::create_dir(&redis_dir).unwrap();
    let (_redis, conn) = RedisServer::start(&rt, &redis_dir);
    let sqlite = SqliteOp::open(&dir.path().join("sqlite.db"));
    let names = [
        "engine (redb, group commit)",
        "Redis, appendfsync always",
        "SQLite, WAL, synchronous=FULL, batched",
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    println!("durable: load average {} before", load());
    for round in 0..ROUNDS {
        let mut took = [Duration::ZERO; 3];
        for k in 0..names.len() {
            let side = (round + k) % names.len();
            took[side] = rt.block_on(match side {
                0 => Box::pin(run_tasks(OPS, false, DurableEngineOp(engine.clone())))
                    as std::pin::Pin<Box<dyn std::future::Future<Output = Duration>>>,
                1 => Box::pin(run_tasks(OPS, false, RedisOp(conn.clone()))),
                _ => Box::pin(run_tasks(OPS, false, sqlite.clone())),
            });
        }
        for side in 0..names.len() {
            rates[side].push(OPS as f64 / took[side].as_secs_f64());
            ratios[side].push(took[side].as_secs_f64() / took[0].as_secs_f64());
        }
    }
    println!("durable: load average {} after", load());
    for v in rates.iter_mut().chain(ratios.iter_mut()) {
        v.sort_by(f64::total_cmp);
    }
    let mid = ROUNDS / 2;
    for (side, name) in names.iter().enumerate() {
        let mut line = format!(
            "durable/{name}: {:.0} releases/s (median of {ROUNDS} rounds)",
            rates[side][mid]
        );
        if side > 0 {
            line += &format!(
                "; engine ÷ this: median {:.2}x, range {:.2}x-{:.2}x",
                ratios[side][mid],
                ratios[side][0],
                ratios[side][ROUNDS - 1]
            );
        }
        println!("{line}");
    }
}

/// Whether criterion's command line names a filter that leaves the step
/// `name` out (criterion only filters what runs through it; the `paired`
/// and `durable` steps do not).
fn filtered_out(name: &str) -> bool {
    const WITH_VALUE: &[&str] = &[
        "-s",
        "--save-baseline",
        "-b",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "-c",
        "--color",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--profile-time",
        "--plotting-backend",
        "--output-format",
        "--format",
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filters: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| {
            !a.starts_with('-') && (*i == 0 || !WITH_VALUE.contains(&args[i - 1].as_str()))
        })
        .map(|(_, a)| a)
        .collect();
    !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str()))
}

/// Not a criterion timing: engine and DashMap + Mutex alternately, round
/// after round, each round's ratio from two back-to-back runs. On a shared
/// machine whose speed changes from one second to the next this is the
/// steadier comparison; it prints the median ratio and its range.
fn paired(_c: &mut Criterion) {
    if filtered_out("paired") {
        return;
    }
    const ROUNDS: usize = 15;
    const OPS: u64 = TASKS * 50_000;
    for workers in [2, 1] {
        let rt = runtime_with(workers);
        for zipf in [false, true] {
            let engine: Engine<u64, u64> = rt
                .block_on(Engine::builder(Arc::new(MemoryStorage::new())).open())
                .unwrap();
            let map: Arc<DashMap<u64, Arc<tokio::sync::Mutex<u64>>>> = Arc::new(DashMap::new());
            let (mut ratios, mut ours, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                let e = rt.block_on(run_tasks(OPS, zipf, EngineOp(engine.clone())));
                let d = rt.block_on(run_tasks(OPS, zipf, DashMapOp(map.clone())));
                let rate = |t: Duration| OPS as f64 / t.as_secs_f64() / 1e6;
                ours.push(rate(e));
                theirs.push(rate(d));
                ratios.push(d.as_secs_f64() / e.as_secs_f64());
            }
            for v in [&mut ratios, &mut ours, &mut theirs] {
                v.sort_by(f64::total_cmp);
            }
            let mid = ROUNDS / 2;
            println!(
                "paired/{}/{workers}_workers: engine {:.2} M/s, dashmap_mutex {:.2} M/s (medians); \
                 ratio median {:.2}x, range {:.2}x-{:.2}x over {ROUNDS} rounds",
                if zipf { "zipf" } else { "uniform" },
                ours[mid],
                theirs[mid],
                ratios[mid],
                ratios[0],
                ratios[ROUNDS - 1],
            );
        }
    }
}

criterion_group!(benches, in_memory, paired, durable);
criterion_main!(benches);
