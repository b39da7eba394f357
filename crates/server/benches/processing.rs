//! Messages per second through the processing phase alone, over real HTTP
//! with full durability: the messages are uploaded beforehand (not timed),
//! then the processor starts a process of 100, prepares it with one
//! PROCESSED verdict and one reply per message, and commits. The baseline
//! is the disk's limit for a batch (the ceiling, `estafeta_durable::limits`),
//! measured in the same run on the same disk, before and after: 100 files
//! created, written and fsynced at once, then their folder fsynced.
//!
//! `cargo bench -p estafeta-server --bench processing`; `BENCH_DIR` picks
//! the disk. Two more modes, chosen from the environment, print instead of
//! running criterion:
//!
//! - `PROCESSING_TRACE=N`: N rounds, each call timed, with the durable
//!   state commits per message read from `/metrics`; the timed part of each
//!   round lies between two `getpid` calls, so that
//!   `strace -f -y -e trace=fsync,fdatasync,getpid` counts the fsyncs of
//!   the processing phase alone. It prints the process's CPU time (all
//!   threads, client and server: user and system, from `/proc/self/stat`)
//!   per message over the timed parts. With `PROCESSING_PERF_CTL=FIFO`
//!   (and `PROCESSING_PERF_ACK=FIFO`) it writes `enable` before each timed
//!   part and `disable` after it to `perf`'s control FIFO (`perf record
//!   --control=fifo:CTL,ACK -D -1`, or `perf stat`), so that a profile
//!   covers the processing phase alone.
//! - `PROCESSING_BACKLOG=N`: N messages written straight into the
//!   database's `Messages` folder (not over HTTP, no fsync) before the
//!   server opens, then drained at batch 100, with the rate printed for
//!   each `PROCESSING_WINDOW` (default 10,000) messages drained, up to
//!   `PROCESSING_DRAIN` (default all).

/// The `estafeta` binary's allocator: the server is measured as it runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use estafeta_client::Client;
use estafeta_durable::limits::Probe;
use estafeta_exchange::mailbox::{FileName, Limits};
use estafeta_exchange::wire::{Body, CallStatus, Message, StartRequest, StartStatus, Version};
use estafeta_exchange::{ExchangeConfig, Id, MessageId, Timestamp};
use estafeta_server::notify::NotifySettings;
use estafeta_server::{HttpSettings, Server};
use estafeta_server_harness::api::{answer_each, id, message, provision_db_a, start_request};
use estafeta_server_harness::measure::{TICK, bench_dir, process_cpu_ticks};
use tokio_util::sync::CancellationToken;

/// About the size of a small order message.
const BODY: &str = r#"{"order":{"lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"note":"deliver before noon"}}"#;
/// Devices sending in parallel.
const DEVICES: usize = 10;
/// Messages per process.
const BATCH: usize = 100;

fn device(n: usize) -> Id {
    id(&format!("phone-{n}"))
}

struct World {
    admin: Client,
    /// The database's token and the devices', to open the server again.
    tokens: (String, Vec<String>),
    processor: Client,
    devices: Vec<Client>,
    stop: CancellationToken,
    running: tokio::task::JoinHandle<()>,
}

/// The server on `data`, running on a loopback port, and an admin client.
async fn serve(data: &Path) -> (Client, CancellationToken, tokio::task::JoinHandle<()>) {
    let mut config = ExchangeConfig::new(data);
    config.admin_token = Some("bench-admin".to_owned());
    config.limits = Limits::new(BATCH, 20.0).unwrap();
    let (server, _) = Server::open(
        config,
        Arc::new(estafeta_session::SystemClock),
        HttpSettings::default(),
        NotifySettings::log_only(data),
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let running = tokio::spawn({
        let stop = stop.clone();
        async move {
            server.run(listener, stop).await.unwrap();
        }
    });
    let admin = Client::new(&base, "bench-admin").unwrap();
    while !admin.readyz().await.unwrap() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (admin, stop, running)
}

/// A new server with one database and the devices, or the same tenancy
/// again when `tokens` are given (a server reopened on its data).
async fn world(data: &Path, tokens: Option<(String, Vec<String>)>) -> World {
    let (admin, stop, running) = serve(data).await;
    let (db, devices) = match tokens {
        Some(t) => t,
        None => {
            let names: Vec<Id> = (0..DEVICES).map(device).collect();
            provision_db_a(&admin, &names).await
        }
    };
    World {
        processor: admin.with_token(&db),
        devices: devices.iter().map(|t| admin.with_token(t)).collect(),
        tokens: (db, devices),
        admin,
        stop,
        running,
    }
}

impl World {
    async fn stop(self) {
        self.stop.cancel();
        self.running.await.unwrap();
    }

    /// Durable write transactions of the session engines so far.
    async fn state_commits(&self) -> u64 {
        let text = self.admin.metrics().await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("estafeta_session_save_batches_total "))
            .or_else(|| {
                text.lines()
                    .find_map(|l| l.strip_prefix("estafeta_session_save_batches "))
            })
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    }
}

/// Upload `BATCH` messages, spread over the devices (not timed).
async fn upload(w: &World) {
    let mut uploads = tokio::task::JoinSet::new();
    // DEVICES divides BATCH.
    let count = BATCH / DEVICES;
    for client in &w.devices {
        let client = client.clone();
        uploads.spawn(async move {
            for _ in 0..count {
                client.send(&message("db-a", BODY, None)).await.unwrap();
            }
        });
    }
    uploads.join_all().await;
}

/// The devices fetch and acknowledge their replies (not timed), so that
/// their folders stay small.
async fn fetch_replies(w: &World) {
    let mut fetches = tokio::task::JoinSet::new();
    for client in &w.devices {
        let client = client.clone();
        fetches.spawn(async move {
            loop {
                let inbox = client.inbox(Some(1000)).await.unwrap();
                if inbox.messages.is_empty() {
                    break;
                }
                let ids: Vec<_> = inbox.messages.iter().map(|m| m.id).collect();
                client.ack(&ids).await.unwrap();
            }
        });
    }
    fetches.join_all().await;
}

/// How long each call of one process took.
#[derive(Default, Clone, Copy)]
struct Timed {
    start: Duration,
    prepare: Duration,
    commit: Duration,
}

impl Timed {
    fn total(&self) -> Duration {
        self.start + self.prepare + self.commit
    }
}

/// One processing phase: start (up to `BATCH`), prepare with one PROCESSED
/// verdict and one reply per message, commit. Answers how many messages
/// it processed (0 when none waited) and how long each call took.
async fn process(w: &World) -> (usize, Timed) {
    let mut timed = Timed::default();
    let start = StartRequest {
        max_files: Some(BATCH as u64),
        ..start_request("db-a")
    };
    let t = Instant::now();
    let started = w.processor.start(&start).await.unwrap();
    timed.start = t.elapsed();
    if started.status == StartStatus::Idle {
        return (0, timed);
    }
    assert_eq!(started.status, StartStatus::Ok);
    let pid = started.process_id.unwrap();
    let messages = started.messages.unwrap();
    let prepare = answer_each(&messages, r#"{"accepted":true}"#);
    let t = Instant::now();
    let prepared = w.processor.prepare(&pid, &prepare).await.unwrap();
    timed.prepare = t.elapsed();
    assert_eq!(prepared.status, CallStatus::Ok);
    let t = Instant::now();
    let committed = w.processor.commit(&pid).await.unwrap();
    timed.commit = t.elapsed();
    assert_eq!(committed.status, CallStatus::Ok);
    (messages.len(), timed)
}

fn temp_root() -> tempfile::TempDir {
    tempfile::tempdir_in(bench_dir()).unwrap()
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// The batch ceiling for [`BATCH`] in files per second, over 10 batches.
fn ceiling_rate(probe: &Probe) -> f64 {
    let mut batch = probe.files_at_once(BATCH).unwrap();
    let t = Instant::now();
    for _ in 0..10 {
        batch.run().unwrap();
    }
    (10 * BATCH) as f64 / t.elapsed().as_secs_f64()
}

/// The process's CPU time so far, all threads, user and system.
fn cpu_time() -> Duration {
    TICK * u32::try_from(process_cpu_ticks("self")).unwrap_or(u32::MAX)
}

/// `perf`'s control FIFOs, to profile the timed parts alone.
struct PerfControl {
    ctl: std::fs::File,
    ack: Option<std::io::BufReader<std::fs::File>>,
}

impl PerfControl {
    fn from_env() -> Option<Self> {
        let ctl = std::env::var_os("PROCESSING_PERF_CTL")?;
        let ctl = std::fs::OpenOptions::new().write(true).open(ctl).unwrap();
        let ack = std::env::var_os("PROCESSING_PERF_ACK")
            .map(|a| std::io::BufReader::new(std::fs::File::open(a).unwrap()));
        Some(Self { ctl, ack })
    }

    fn send(&mut self, command: &str) {
        use std::io::BufRead;
        self.ctl.write_all(command.as_bytes()).unwrap();
        if let Some(ack) = self.ack.as_mut() {
            let mut line = String::new();
            ack.read_line(&mut line).unwrap();
        }
    }
}

/// `PROCESSING_TRACE=N`: timed calls, commits per message, CPU time per
/// message, `getpid` marks.
fn trace(rounds: usize) {
    let tmp = temp_root();
    let probe = Probe::new(tmp.path().join("probe"), 300).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let before = ceiling_rate(&probe);
    let w = rt.block_on(world(&tmp.path().join("data"), None));
    let mut perf = PerfControl::from_env();
    let mut all = Vec::new();
    let (mut commits, mut processed, mut cpu) = (0, 0, Duration::ZERO);
    for _ in 0..rounds {
        rt.block_on(upload(&w));
        let c0 = rt.block_on(w.state_commits());
        if let Some(p) = perf.as_mut() {
            p.send("enable\n");
        }
        let cpu0 = cpu_time();
        // Marks for strace: the processing phase lies between them.
        let _ = std::process::id();
        let (n, timed) = rt.block_on(process(&w));
        let _ = std::process::id();
        cpu += cpu_time().saturating_sub(cpu0);
        if let Some(p) = perf.as_mut() {
            p.send("disable\n");
        }
        commits += rt.block_on(w.state_commits()) - c0;
        processed += n;
        all.push(timed);
        rt.block_on(fetch_replies(&w));
    }
    let after = ceiling_rate(&probe);
    let pick = |f: fn(&Timed) -> Duration| median(all.iter().map(f).collect());
    let total = pick(Timed::total);
    println!(
        "rounds {rounds}: median start {:.1?}, prepare {:.1?}, commit {:.1?}, total {:.1?} \
         = {:.0} msgs/s; ceiling for {BATCH} {before:.0} / {after:.0} files/s (before / after); \
         durable state commits per message {:.3} ({commits} for {processed}); \
         CPU time (all threads) per message {:.1?}",
        pick(|t| t.start),
        pick(|t| t.prepare),
        pick(|t| t.commit),
        total,
        BATCH as f64 / total.as_secs_f64(),
        commits as f64 / processed.max(1) as f64,
        cpu / processed.max(1) as u32,
    );
    rt.block_on(w.stop());
}

/// `PROCESSING_BACKLOG=N`: drain N messages made straight into `Messages`.
fn backlog(n: usize) {
    let window = env_usize("PROCESSING_WINDOW").unwrap_or(10_000);
    let drain = env_usize("PROCESSING_DRAIN").unwrap_or(n);
    let tmp = temp_root();
    let data = tmp.path().join("data");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let w = rt.block_on(world(&data, None));
    let tokens = w.tokens.clone();
    rt.block_on(w.stop());
    let began = Instant::now();
    let queue = data.join("db-a").join("Messages");
    std::fs::create_dir_all(&queue).unwrap();
    // Test data: written by several threads at once, none fsynced.
    let writers = std::thread::available_parallelism().map_or(2, |n| n.get() * 2);
    std::thread::scope(|scope| {
        for part in 0..writers {
            let queue = &queue;
            scope.spawn(move || {
                let body = Body::from_json(BODY).unwrap();
                let first = Timestamp::from_millis(1_764_064_800_000);
                for seq in (part..n).step_by(writers) {
                    let m = Message {
                        version: Version,
                        id: MessageId::from_parts(
                            1_764_064_800_000 + seq as u64 / 1000,
                            seq as u128,
                        ),
                        from: device(seq % DEVICES),
                        to: id("db-a"),
                        subsystem: id("sales"),
                        created_at: first,
                        body: body.clone(),
                    };
                    let name = FileName::of(&m).to_string();
                    std::fs::write(queue.join(name), m.to_file_bytes().unwrap()).unwrap();
                }
            });
        }
    });
    println!("{n} waiting: files made in {:.1?}", began.elapsed());
    let began = Instant::now();
    let w = rt.block_on(world(&data, Some(tokens)));
    println!("{n} waiting: server ready in {:.1?}", began.elapsed());
    let (mut done, mut in_window) = (0, 0);
    let mut t = Instant::now();
    while done < drain {
        let (k, _) = rt.block_on(process(&w));
        if k == 0 {
            break;
        }
        done += k;
        in_window += k;
        if in_window >= window {
            println!(
                "{n} waiting: drained {done}: {:.0} msgs/s over the last {in_window}",
                in_window as f64 / t.elapsed().as_secs_f64()
            );
            rt.block_on(fetch_replies(&w));
            (in_window, t) = (0, Instant::now());
        }
    }
    rt.block_on(w.stop());
}

fn bench(c: &mut Criterion) {
    let tmp = temp_root();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let w = rt.block_on(world(&tmp.path().join("data"), None));
    let probe = Probe::new(tmp.path().join("probe"), 300).unwrap();
    let mut ceiling = probe.files_at_once(BATCH).unwrap();

    let mut group = c.benchmark_group("processing");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    // The ceiling before and after: on a shared machine the disk's speed
    // drifts, and the two bracket it.
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function(format!("ceiling_{BATCH}_files_at_once"), |b| {
        b.iter(|| ceiling.run().unwrap())
    });
    group.bench_function(format!("processing_batch_{BATCH}"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                rt.block_on(upload(&w));
                let (n, timed) = rt.block_on(process(&w));
                assert_eq!(n, BATCH);
                total += timed.total();
                rt.block_on(fetch_replies(&w));
            }
            total
        })
    });
    group.bench_function(format!("ceiling_{BATCH}_files_at_once_after"), |b| {
        b.iter(|| ceiling.run().unwrap())
    });
    group.finish();
}

fn main() {
    if let Some(rounds) = env_usize("PROCESSING_TRACE") {
        return trace(rounds);
    }
    if let Some(n) = env_usize("PROCESSING_BACKLOG") {
        return backlog(n);
    }
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
