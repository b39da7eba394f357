//! Entries per second through the send queue against what a user would write
//! instead: a `tokio::sync::Semaphore` per host and type in front of a task
//! per request. 100 hosts × 3 types, a no-op transport that answers at once,
//! 1,000 and 1,000,000 entries added at once (so the cost per entry can be
//! seen to stay flat as the backlog grows); both sides count entries in
//! flight per host and type and the run fails if a window is ever exceeded.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use estafeta_sendq::{
    Completion, Done, Kind, QueueConfig, Reply, Request, SendError, SendQueue, Transport,
    TypeConfig,
};
use tokio::sync::{Notify, Semaphore};

const HOSTS: usize = 100;
const TYPES: usize = 3;
const WINDOWS: [usize; TYPES] = [1, 4, 8];
/// Entries added at once in one iteration: the backlog sizes measured.
const SIZES: [usize; 2] = [1_000, 1_000_000];

/// In-flight counters per host and type, with the highest count seen.
struct Counters {
    now: Vec<AtomicUsize>,
    exceeded: AtomicUsize,
    reached: AtomicUsize,
}

impl Counters {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            now: (0..HOSTS * TYPES).map(|_| AtomicUsize::new(0)).collect(),
            exceeded: AtomicUsize::new(0),
            reached: AtomicUsize::new(0),
        })
    }

    fn enter(&self, host: usize, kind: usize) {
        let n = self.now[host * TYPES + kind].fetch_add(1, Ordering::SeqCst) + 1;
        if n > WINDOWS[kind] {
            self.exceeded.fetch_add(1, Ordering::SeqCst);
        }
        if n == WINDOWS[kind] {
            self.reached.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn leave(&self, host: usize, kind: usize) {
        self.now[host * TYPES + kind].fetch_sub(1, Ordering::SeqCst);
    }
}

/// Answers at once, counting the entry in flight while it does.
struct NoOp(Arc<Counters>);

impl Transport<usize, ()> for NoOp {
    type Answer = ();
    async fn send(
        &self,
        request: Request<'_, usize, ()>,
        reply: Reply<()>,
    ) -> Result<(), SendError> {
        self.0.enter(*request.host, request.kind.0);
        self.0.leave(*request.host, request.kind.0);
        reply.answer(Ok(()));
        Ok(())
    }
}

/// Counts completions and wakes the bench when all are in.
struct Finish {
    left: AtomicUsize,
    all: Notify,
}

impl Finish {
    fn new(entries: usize) -> Arc<Self> {
        Arc::new(Self {
            left: AtomicUsize::new(entries),
            all: Notify::new(),
        })
    }

    fn one(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.all.notify_one();
        }
    }
}

/// The queue side's completion: checks the outcome and counts it, as a
/// callback would, stored inline in the entry.
struct Counted(Arc<Finish>);

impl Completion<usize, (), ()> for Counted {
    fn complete(self, done: Done<usize, (), ()>) {
        assert!(done.result.is_ok());
        self.0.one();
    }
}

/// `entries` (host, type) pairs, round-robin over every host and type.
fn order(entries: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..entries).map(|i| ((i / TYPES) % HOSTS, i % TYPES))
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("sendq_100_hosts_x_3_types");
    group.sample_size(10);

    let queue_counters = Counters::new();
    let queue = rt.block_on(async {
        let types = WINDOWS
            .iter()
            .enumerate()
            .map(|(k, w)| TypeConfig::new(format!("type{k}"), *w))
            .collect();
        let mut config = QueueConfig::new(types);
        config.workers = 2;
        SendQueue::<usize, (), NoOp, Counted>::with_completion(
            config,
            NoOp(Arc::clone(&queue_counters)),
        )
        .unwrap()
    });
    let base_counters = Counters::new();
    let semaphores: Arc<Vec<Arc<Semaphore>>> = Arc::new(
        (0..HOSTS * TYPES)
            .map(|i| Arc::new(Semaphore::new(WINDOWS[i % TYPES])))
            .collect(),
    );
    for entries in SIZES {
        group.throughput(Throughput::Elements(entries as u64));
        group.bench_with_input(
            BenchmarkId::new("send_queue", entries),
            &entries,
            |b, &entries| {
                b.to_async(&rt).iter(|| async {
                    let queue = queue.clone();
                    // The adding code runs on the runtime, as it does in the server.
                    let run = tokio::spawn(async move {
                        let finish = Finish::new(entries);
                        for (host, kind) in order(entries) {
                            queue
                                .add_with(host, Kind(kind), (), Counted(Arc::clone(&finish)))
                                .unwrap();
                        }
                        finish.all.notified().await;
                    });
                    run.await.unwrap();
                });
            },
        );

        group.bench_with_input(
            BenchmarkId::new("semaphore_baseline", entries),
            &entries,
            |b, &entries| {
                b.to_async(&rt).iter(|| async {
                    let (semaphores, base_counters) =
                        (Arc::clone(&semaphores), Arc::clone(&base_counters));
                    let run = tokio::spawn(async move {
                        let finish = Finish::new(entries);
                        for (host, kind) in order(entries) {
                            let finish = Arc::clone(&finish);
                            let counters = Arc::clone(&base_counters);
                            let permit = Arc::clone(&semaphores[host * TYPES + kind]);
                            tokio::spawn(async move {
                                let Ok(_permit) = permit.acquire_owned().await else {
                                    return;
                                };
                                counters.enter(host, kind);
                                counters.leave(host, kind);
                                finish.one();
                            });
                        }
                        finish.all.notified().await;
                    });
                    run.await.unwrap();
                });
            },
        );
    }
    group.finish();

    rt.block_on(queue.shutdown());
    for (name, counters) in [
        ("send queue", &queue_counters),
        ("baseline", &base_counters),
    ] {
        let exceeded = counters.exceeded.load(Ordering::SeqCst);
        println!(
            "{name}: window exceeded {exceeded} times; window reached {} times",
            counters.reached.load(Ordering::Relaxed)
        );
        assert_eq!(exceeded, 0, "{name} exceeded a window");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
