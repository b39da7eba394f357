//! Durable message writes per second through the mailboxes' group commit,
//! against the floor measured in the same run on the same disk: one file at
//! a time created, written, fsynced, and its folder fsynced.
//!
//! `cargo bench -p estafeta-exchange --bench mailbox_write`; the ratio
//! (mailbox messages/s ÷ floor files/s) goes to BENCHMARKS.md.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use estafeta_exchange::mailbox::{Folder, Location, Mailboxes, SyncConfig};
use estafeta_exchange::wire::{Body, Message, Version};
use estafeta_exchange::{Id, MessageId, Timestamp};

/// About the size of a small order message.
const BODY: &str = r#"{"order":{"lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"note":"deliver before noon"}}"#;

static SEQ: AtomicU64 = AtomicU64::new(0);

fn next_message() -> Message {
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    Message {
        version: Version,
        id: MessageId::from_parts(1_764_064_800_000 + seq, u128::from(seq)),
        from: Id::new("phone-1").unwrap(),
        to: Id::new("db-a").unwrap(),
        subsystem: Id::new("sales").unwrap(),
        created_at: Timestamp::from_millis(1_764_064_800_000),
        body: Body::from_json(BODY).unwrap(),
    }
}

/// The floor: one durable file at a time.
fn floor_write(dir: &Path, bytes: &[u8]) {
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let mut f = std::fs::File::create(dir.join(format!("floor-{seq}.msg"))).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
}

fn bench(c: &mut Criterion) {
    // BENCH_DIR picks the disk to measure; the system's temporary folder otherwise.
    let tmp = tempfile::tempdir_in(
        std::env::var_os("BENCH_DIR").unwrap_or_else(|| std::env::temp_dir().into()),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mailboxes = rt
        .block_on(Mailboxes::open(
            tmp.path().join("data"),
            SyncConfig::default(),
        ))
        .unwrap();
    let db = Id::new("db-a").unwrap();
    rt.block_on(mailboxes.create_mailbox(&db)).unwrap();
    let queue = Location::new(db, Folder::Messages);
    let floor_dir = tmp.path().join("floor");
    std::fs::create_dir(&floor_dir).unwrap();
    let bytes = next_message().to_file_bytes().unwrap();

    let mut group = c.benchmark_group("durable_writes");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(1));
    group.bench_function("floor_one_file_at_a_time", |b| {
        b.iter(|| floor_write(&floor_dir, &bytes))
    });
    for batch in [1u64, 10, 100] {
        group.throughput(Throughput::Elements(batch));
        group.bench_function(format!("mailbox_concurrent_{batch}"), |b| {
            b.to_async(&rt).iter(|| {
                let mut writes = tokio::task::JoinSet::new();
                for _ in 0..batch {
                    let (mailboxes, queue) = (mailboxes.clone(), queue.clone());
                    writes.spawn(async move { mailboxes.write(&queue, &next_message()).await });
                }
                async move {
                    while let Some(done) = writes.join_next().await {
                        done.unwrap().unwrap();
                    }
                }
            })
        });
    }
    group.finish();
    let stats = mailboxes.stats();
    println!(
        "group commit: {} changes in {} batches, {} directory fsyncs, {} file fsyncs",
        stats.changes, stats.batches, stats.dir_fsyncs, stats.file_fsyncs
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
