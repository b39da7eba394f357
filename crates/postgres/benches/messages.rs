//! The exchange's message store over PostgreSQL (`PgMessages`) against the
//! embedded one (`FileStore`: one file per message, group-committed
//! fsyncs), on the same disk:
//!
//! - `put`: one message into a database's queue, durable when it returns;
//! - `select`: a process start's choice (the 10 oldest, 20 MB) from a queue
//!   of 1,000 and of 1,000,000 waiting messages (the file store: 1,000 and
//!   10,000, since a million files would take 4 GB of blocks on the shared
//!   disk; its selection is answered from an in-memory index either way):
//!   the cost must not grow with the queue;
//! - `apply_100`: a commit's batch, 100 messages moved from `Messages` to
//!   `Log` (the 100 uploads are put before each timed batch, untimed).
//!
//! PostgreSQL is a throwaway instance of the `testing` harness on loopback
//! TCP, default settings (`fsync` and `synchronous_commit` on).

use criterion::{Criterion, criterion_group, criterion_main};
use estafeta_exchange::store::conformance::file_store;
use estafeta_exchange::store::{FileName, Filter, Folder, Limits, Location, MessageStore, Op};
use estafeta_exchange::wire::{Body, Message, Version};
use estafeta_exchange::{Id, MessageId, Timestamp};
use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{PgMessages, Store};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// 2025-11-25T10:00:00Z.
const T0: u64 = 1_764_064_800_000;

fn message(seq: u64, to: &str) -> Message {
    Message {
        version: Version,
        id: MessageId::from_parts(T0 + seq, u128::from(seq)),
        from: Id::new("phone-1").unwrap(),
        to: Id::new(to).unwrap(),
        subsystem: Id::new("sales").unwrap(),
        created_at: Timestamp::from_millis(i64::try_from(T0 + seq).unwrap()),
        body: Body::from_json(r#"{"order":17,"lines":[{"sku":"A-1","qty":3}]}"#).unwrap(),
    }
}

fn at(mailbox: &str, folder: Folder) -> Location {
    Location::new(Id::new(mailbox).unwrap(), folder)
}

/// `n` messages waiting in `mailbox`'s queue, made in one statement: ids
/// are valid ULIDs (a fixed time part, `first` and on as the random part).
async fn fill_postgres(store: &Store, mailbox: &str, first: i64, n: i64) {
    let prefix = &MessageId::from_parts(T0, 0).to_string()[..10];
    let client = store.client().await.unwrap();
    client
        .execute(
            "INSERT INTO messages (id, owner, place, sender, recipient, subsystem, created_at, size, body)
             SELECT $1 || lpad((i + $4)::text, 16, '0'), $2, 'Messages', 'phone-1', $2, 'sales', i, 47,
                    convert_to('{\"order\":17,\"lines\":[{\"sku\":\"A-1\",\"qty\":3}]}', 'UTF8')
             FROM generate_series(1, $3::bigint) AS i",
            &[&prefix, &mailbox, &n, &first],
        )
        .await
        .unwrap();
    client
        .batch_execute("VACUUM ANALYZE messages")
        .await
        .unwrap();
}

async fn fill_files(store: &dyn MessageStore, mailbox: &str, n: u64) {
    let queue = at(mailbox, Folder::Messages);
    for start in (0..n).step_by(500) {
        let batch: Vec<Message> = (start..(start + 500).min(n))
            .map(|i| message(1_000_000 + i, mailbox))
            .collect();
        store.put_all(&queue, &batch, go()).await.unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (postgres, files) = runtime.block_on(async {
        let store = Store::connect(&pg.url()).unwrap();
        store.migrate().await.unwrap();
        let postgres: Arc<dyn MessageStore> = Arc::new(PgMessages::new(store.clone()));
        let (files, _) = file_store(dir.path()).await;
        // Every mailbox exists before its first message, as in the server.
        let owners: Vec<Id> = ["sel-1000", "sel-10000", "sel-1000000", "put-db", "apply-db"]
            .into_iter()
            .map(|o| Id::new(o).unwrap())
            .collect();
        for made in [&postgres, &files] {
            for result in made.create_mailboxes(&owners).await {
                result.unwrap();
            }
        }
        fill_postgres(&store, "sel-1000", 0, 1_000).await;
        fill_postgres(&store, "sel-1000000", 1_000_000, 1_000_000).await;
        fill_files(&*files, "sel-1000", 1_000).await;
        fill_files(&*files, "sel-10000", 10_000).await;
        (postgres, files)
    });
    let stores = [("files", files), ("postgres", postgres)];
    let seq = Arc::new(AtomicU64::new(10_000_000));

    let mut group = c.benchmark_group("put");
    for (label, store) in &stores {
        let queue = at("put-db", Folder::Messages);
        group.bench_function(*label, |b| {
            b.to_async(&runtime).iter(|| {
                let m = message(seq.fetch_add(1, Ordering::Relaxed), "put-db");
                let (store, queue) = (store.clone(), queue.clone());
                async move { store.put(&queue, &m).await.unwrap() }
            });
        });
    }
    group.finish();

    let mut group = c.benchmark_group("select");
    let sizes = [("files", [1_000, 10_000]), ("postgres", [1_000, 1_000_000])];
    for ((label, store), (_, waiting)) in stores.iter().zip(sizes) {
        for n in waiting {
            let queue = at(&format!("sel-{n}"), Folder::Messages);
            group.bench_function(format!("{label}/{n}"), |b| {
                b.to_async(&runtime).iter(|| {
                    let (store, queue) = (store.clone(), queue.clone());
                    async move {
                        let chosen = store
                            .select(&queue, &Filter::default(), Limits::default())
                            .await
                            .unwrap();
                        assert_eq!(chosen.len(), 10);
                    }
                });
            });
        }
    }
    group.finish();

    let mut group = c.benchmark_group("apply_100");
    for (label, store) in &stores {
        let (queue, log) = (
            at("apply-db", Folder::Messages),
            at("apply-db", Folder::Log),
        );
        group.bench_function(*label, |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let (store, queue, log, seq) =
                    (store.clone(), queue.clone(), log.clone(), seq.clone());
                async move {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        let first = seq.fetch_add(100, Ordering::Relaxed);
                        let batch: Vec<Message> = (first..first + 100)
                            .map(|i| message(i, "apply-db"))
                            .collect();
                        store.put_all(&queue, &batch, go()).await.unwrap();
                        let ops: Vec<Op> = batch
                            .iter()
                            .map(|m| Op::Move {
                                name: FileName::of(m),
                                from: queue.clone(),
                                to: log.clone(),
                            })
                            .collect();
                        let started = Instant::now();
                        let applied = store.apply(None, &ops).await;
                        spent += started.elapsed();
                        assert!(applied.results.iter().all(Result::is_ok));
                    }
                    spent
                }
            });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);

/// A go-ahead already given.
fn go() -> tokio::sync::oneshot::Receiver<bool> {
    let (go, when) = tokio::sync::oneshot::channel();
    let _ = go.send(true);
    when
}
