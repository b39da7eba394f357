//! The cost of a process start's selection, the inbox listing and the
//! dashboard's count with 1,000 and with 1,000,000 messages waiting in one
//! mailbox: it should not grow with the backlog.
//!
//! `cargo bench -p estafeta-exchange --bench mailbox_select`; the ratios
//! (1,000,000 ÷ 1,000) go to BENCHMARKS.md. The files are made directly
//! (no fsync): the 1,000 oldest hold real messages, the others are empty
//! and newer, so that both backlogs hand out the same messages. Set
//! `BENCH_DIR` to pick the disk (default: the system temp folder).

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use estafeta_exchange::mailbox::{
    FileName, Filter, Folder, Limits, Location, Mailboxes, SyncConfig,
};
use estafeta_exchange::wire::{Body, Message, Version};
use estafeta_exchange::{Id, MessageId, Timestamp};

/// About the size of a small order message.
const BODY: &str = r#"{"order":{"lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"note":"deliver before noon"}}"#;

/// How many of the oldest files hold a real message.
const REAL: u64 = 1_000;

fn message(seq: u64) -> Message {
    Message {
        version: Version,
        id: MessageId::from_parts(1_764_064_800_000 + seq, u128::from(seq)),
        from: Id::new("phone-1").unwrap(),
        to: Id::new("db-a").unwrap(),
        subsystem: Id::new("sales").unwrap(),
        created_at: Timestamp::from_millis(1_764_064_800_000 + seq as i64),
        body: Body::from_json(BODY).unwrap(),
    }
}

/// Fills `dir` with `n` message files, the oldest [`REAL`] with content.
fn fill(dir: &Path, n: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let template = message(0);
    for seq in 0..n {
        if seq < REAL {
            let m = message(seq);
            std::fs::write(
                dir.join(FileName::of(&m).to_string()),
                m.to_file_bytes().unwrap(),
            )
            .unwrap();
        } else {
            let name = FileName {
                created_at: Timestamp::from_millis(1_764_064_800_000 + seq as i64),
                id: MessageId::from_parts(1_764_064_800_000 + seq, u128::from(seq)),
                ..FileName::of(&template)
            };
            std::fs::File::create(dir.join(name.to_string())).unwrap();
        }
    }
}

/// The resident memory of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn bench(c: &mut Criterion) {
    let tmp = tempfile::tempdir_in(
        std::env::var_os("BENCH_DIR").unwrap_or_else(|| std::env::temp_dir().into()),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let queue = Location::new(Id::new("db-a").unwrap(), Folder::Messages);
    let mut group = c.benchmark_group("waiting");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for n in [1_000u64, 1_000_000] {
        let root = tmp.path().join(format!("data-{n}"));
        let began = Instant::now();
        fill(&root.join("db-a").join("Messages"), n);
        println!("{n} waiting: files made in {:.1?}", began.elapsed());
        // The background check is timed on its own below, not left to fall
        // into the measurements at random.
        let config = SyncConfig {
            verify_every: Duration::from_secs(3_600),
            ..SyncConfig::default()
        };
        let mailboxes = rt.block_on(Mailboxes::open(&root, config)).unwrap();
        let (before, began) = (rss(), Instant::now());
        let count = rt.block_on(mailboxes.count(&queue)).unwrap();
        assert_eq!(count as u64, n);
        println!(
            "{n} waiting: first use (index built) in {:.1?}, resident memory +{} KB",
            began.elapsed(),
            rss().saturating_sub(before) / 1024
        );
        // Read since its first use: the next check looks at it.
        rt.block_on(mailboxes.count(&queue)).unwrap();
        let began = Instant::now();
        assert_eq!(rt.block_on(mailboxes.verify()).unwrap(), 1);
        println!(
            "{n} waiting: a check against the directory in {:.1?}",
            began.elapsed()
        );

        let filter = Filter::default();
        group.bench_function(BenchmarkId::new("select", n), |b| {
            b.to_async(&rt).iter(|| async {
                let chosen = mailboxes
                    .select(&queue, &filter, Limits::default())
                    .await
                    .unwrap();
                assert_eq!(chosen.len(), 10);
            })
        });
        group.bench_function(BenchmarkId::new("start_select_and_read", n), |b| {
            b.to_async(&rt).iter(|| async {
                let chosen = mailboxes
                    .select(&queue, &filter, Limits::default())
                    .await
                    .unwrap();
                let names: Vec<_> = chosen.into_iter().map(|e| e.name).collect();
                let raw = mailboxes.read_array(&queue, &names).await.unwrap();
                assert_eq!(raw.names.len(), 10);
            })
        });
        group.bench_function(BenchmarkId::new("inbox_oldest_1000", n), |b| {
            b.to_async(&rt).iter(|| async {
                assert_eq!(mailboxes.oldest(&queue, 1_000).await.unwrap().len(), 1_000);
            })
        });
        group.bench_function(BenchmarkId::new("count", n), |b| {
            b.to_async(&rt).iter(|| async {
                assert_eq!(mailboxes.count(&queue).await.unwrap() as u64, n);
            })
        });
        drop(mailboxes);
        let began = Instant::now();
        std::fs::remove_dir_all(&root).unwrap();
        println!("{n} waiting: files removed in {:.1?}", began.elapsed());
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
