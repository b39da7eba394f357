//! Durable message writes per second through the mailboxes' group commit,
//! N at a time, against the disk's batch ceiling for the same N measured in
//! the same run on the same disk (`estafeta_durable::limits`: N files
//! created, written and fsynced at once, then their folder fsynced; for
//! N = 1, one file at a time). The two take turns, round by round; the
//! ratio is taken within each round and its median printed.
//!
//! `cargo bench -p estafeta-exchange --bench mailbox_write`; `BENCH_DIR`
//! picks the disk, `MAILBOX_SECONDS` (default 3) each run's length,
//! `MAILBOX_ROUNDS` (default 5) the rounds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use estafeta_durable::limits::Probe;
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

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

/// The load average over the last minute.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

/// Messages per second of `n` writes at a time, each round of `n`
/// awaited before the next, for `time`.
fn mailbox_rate(
    rt: &tokio::runtime::Runtime,
    mailboxes: &Mailboxes,
    queue: &Location,
    n: usize,
    time: Duration,
) -> f64 {
    rt.block_on(async {
        let began = Instant::now();
        let mut written = 0u64;
        while began.elapsed() < time {
            let mut writes = tokio::task::JoinSet::new();
            for _ in 0..n {
                let (mailboxes, queue) = (mailboxes.clone(), queue.clone());
                writes.spawn(async move { mailboxes.write(&queue, &next_message()).await });
            }
            while let Some(done) = writes.join_next().await {
                done.unwrap().unwrap();
                written += 1;
            }
        }
        written as f64 / began.elapsed().as_secs_f64()
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let time = Duration::from_secs(env_number("MAILBOX_SECONDS", 3));
    let rounds = env_number("MAILBOX_ROUNDS", 5) as usize;
    let base = std::env::var_os("BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let tmp = tempfile::tempdir_in(base).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mailboxes = rt
        .block_on(Mailboxes::open(
            tmp.path().join("data"),
            SyncConfig::default(),
        ))
        .unwrap();
    let queue = Location::new(Id::new("db-a").unwrap(), Folder::Messages);
    let bytes = next_message().to_file_bytes().unwrap();
    let probe = Probe::new(tmp.path().join("probe"), bytes.len()).unwrap();
    println!("load average {} before", load());
    for n in [1usize, 10, 100] {
        let mut batch = probe.files_at_once(n).unwrap();
        let (mut ours, mut ceilings, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let ceiling = match n {
                1 => probe.measure(|| probe.one_file(), 1, time),
                _ => probe.measure(|| batch.run(), n, time),
            }
            .unwrap()
            .files_per_second();
            let rate = mailbox_rate(&rt, &mailboxes, &queue, n, time);
            ours.push(rate);
            ceilings.push(ceiling);
            ratios.push(rate / ceiling);
        }
        let range = (
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(0.0, f64::max),
        );
        println!(
            "{n} at a time: mailbox {:.0} msgs/s, ceiling {:.0} files/s (medians of {rounds} rounds); \
             ratio median {:.2}, range {:.2}-{:.2}; load average {}",
            median(ours),
            median(ceilings),
            median(ratios),
            range.0,
            range.1,
            load()
        );
    }
    let stats = mailboxes.stats();
    println!(
        "group commit: {} changes in {} batches, {} directory fsyncs, {} file fsyncs",
        stats.changes, stats.batches, stats.dir_fsyncs, stats.file_fsyncs
    );
}
