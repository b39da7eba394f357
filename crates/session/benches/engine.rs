//! Engine throughput against what a user would write instead, measured in
//! the same run (see BENCHMARKS.md):
//!
//! - `in_memory/*`: acquire + change + release on 10,000 keys (uniform and
//!   Zipf-skewed), engine vs `DashMap<Key, Arc<tokio::sync::Mutex<State>>>`;
//!   `in_memory_one_worker/*`: the same on a one-worker runtime.
//! - `paired`: the same comparison, both sides alternately round after
//!   round (printed: median ratio and range).
//! - `durable/*`: releases that each carry a persistent change, engine on
//!   redb (group commit) vs one durable redb transaction per release.
//! - `memory`: resident bytes per idle session (printed, from /proc).

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

/// Baseline: one durable redb transaction per release.
#[derive(Clone)]
struct FsyncEachOp(Arc<redb::Database>);
impl Op for FsyncEachOp {
    async fn run(&self, key: u64) {
        use redb::ReadableTable;
        let db = self.0.clone();
        tokio::task::spawn_blocking(move || {
            let table: redb::TableDefinition<'_, u64, u64> = redb::TableDefinition::new("t");
            let mut tx = db.begin_write().unwrap();
            tx.set_durability(redb::Durability::Immediate).unwrap();
            {
                let mut t = tx.open_table(table).unwrap();
                let v = t.get(key).unwrap().map(|g| g.value()).unwrap_or(0);
                t.insert(key, v + 1).unwrap();
            }
            tx.commit().unwrap();
        })
        .await
        .unwrap();
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

fn durable(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("durable");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    let storage = Arc::new(RedbStorage::open(dir.path().join("engine.redb")).unwrap());
    let engine: Engine<u64, u64> = rt
        .block_on(Engine::builder(storage).config(Config::default()).open())
        .unwrap();
    group.bench_function("engine_group_commit", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| run_tasks(iters, false, DurableEngineOp(engine.clone())))
    });
    let db = Arc::new(redb::Database::create(dir.path().join("plain.redb")).unwrap());
    group.bench_function("fsync_per_release", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| run_tasks(iters, false, FsyncEachOp(db.clone())))
    });
    group.finish();
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Whether criterion's command line names a filter that leaves the step
/// `name` out (criterion only filters what runs through it; the `paired`
/// and `memory` steps do not).
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

/// Not a timing: prints resident bytes per idle in-memory session.
fn memory(_c: &mut Criterion) {
    if filtered_out("memory") {
        return;
    }
    let rt = runtime();
    let n = 1_000_000u64;
    let before = resident_bytes();
    let engine: Engine<u64, u64> = rt
        .block_on(Engine::builder(Arc::new(MemoryStorage::new())).open())
        .unwrap();
    rt.block_on(async {
        for k in 0..n {
            let mut s = engine.get(k, true).await.unwrap().unwrap();
            *s.state_mut() = k;
        }
        // Let the expiry manager index them all.
        tokio::time::sleep(Duration::from_millis(500)).await;
    });
    let after = resident_bytes();
    let per = (after.saturating_sub(before)) as f64 / n as f64;
    println!(
        "memory: {n} idle sessions (u64 key, u64 state): resident +{:.1} MiB, {per:.0} bytes per session (state itself: 8)",
        (after - before) as f64 / (1 << 20) as f64
    );
    assert_eq!(engine.stats().in_memory, n);
}

criterion_group!(benches, in_memory, paired, durable, memory);
criterion_main!(benches);
