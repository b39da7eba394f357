//! Uploads per second and their latency, over real HTTP with full
//! durability, against the disk's own limits measured in the same run on
//! the same disk (`estafeta_durable::limits`).
//!
//! The workload: 16 devices of one enterprise (8 sending to each of two
//! databases), each uploading 1 KB JSON bodies one after another on its own
//! keep-alive connection, without and then with an idempotency key (a new
//! key each upload); then one device uploading alone. The server is the
//! `estafeta` binary of this build (`estafeta serve`, default settings: its
//! event log and its info log lines included), started by the bench on a
//! loopback port in a folder of `BENCH_DIR`; the bench is its only client.
//!
//! Each round measures, in turn: the batch ceiling for 16 (16 durable files
//! at once, then their folder: the most uploads per second 16 devices can
//! get durable, one file each), the floor (one file created, written,
//! fsynced and its folder fsynced), the syncs of one upload on their own
//! (one such file fsynced and, at the same time, a record appended to a log
//! and fdatasynced, as an upload's message and its device's record are),
//! then the uploads. Figures: uploads/s with 16 devices ÷ the ceiling's
//! files/s; one device's median latency ÷ the floor's, and ÷ its syncs'
//! (the part of it that is not the disk's). Beside them, where the time goes: the CPU time each upload
//! took in the server (and how much of it in the kernel) and in the
//! clients, each ceiling's and floor's file in the probe's threads, and
//! how busy the machine's cores were (from `/proc`): when the cores are
//! busy, the CPU an upload takes, not the disk, is what bounds uploads per
//! second.
//!
//! ```sh
//! cargo bench -p estafeta-server --bench uploads
//! ```
//!
//! Settings, from the environment:
//! - `BENCH_DIR`: the disk (default: the system's temporary folder);
//! - `UPLOADS_SECONDS` (default 5): each measured run's length (one device's
//!   runs last half as long); `UPLOADS_ROUNDS` (default 3);
//! - `UPLOADS_BEFORE=PATH`: also run, in turn with this build, the
//!   `estafeta` binary at `PATH` (another build), and print the ratios;
//! - `UPLOADS_EVENTS_KEPT=N`: also run, in turn with the others, this
//!   build's server with its event log filled first with N upload records
//!   (up to the log's default size limit, about a million: a server's log
//!   once it has run a while), and print the ratios to the first server's,
//!   whose log starts empty;
//! - `UPLOADS_TRACE=N`: instead, N uploads of one device (`UPLOADS_KEYED=1`:
//!   with keys) and nothing else after the set-up, for a profile of one
//!   upload: `UPLOADS_WRAP="strace -f -c -o FILE"` (or `valgrind
//!   --tool=callgrind …`, `perf record …`) runs the server under that
//!   command; `UPLOADS_SERVER=PATH` picks another build's binary. Run
//!   once with N = 0 and subtract, for what one upload costs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use estafeta_client::Client;
use estafeta_durable::limits::{Measured, Probe};
use estafeta_exchange::Id;
use estafeta_exchange::wire::{Body, SendMessage};
use estafeta_server::events::{EventStore, Retention, events_file};
use estafeta_server_harness::api::id;
use estafeta_server_harness::measure::{
    ProcessCpu, TICK, bench_dir, load_average, machine_ticks, process_cpu, process_cpu_ticks,
};

#[path = "shared/upload_record.rs"]
mod upload_record;
use upload_record::upload_record;

/// The admin token the servers are started with (32 random hex digits, as
/// the server's check of a token's length and strength wants).
const ADMIN: &str = "5c1e9a7f03b8d264e1f7a9c35b08d2e6";
/// Devices uploading at once.
const DEVICES: usize = 16;
/// Databases they send to (devices take them in turn).
const DATABASES: usize = 2;
/// The size of a body, in bytes.
const BODY_BYTES: usize = 1024;
/// About a device's record appended to the session engine's save log by
/// an upload (249 bytes, traced).
const RECORD_BYTES: usize = 250;
/// How long a started server may take to be ready.
const READY_WITHIN: Duration = Duration::from_secs(120);

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// A server process under test, killed when dropped.
struct Served {
    child: Child,
    /// Its data folder.
    data: PathBuf,
    admin: Client,
}

impl Drop for Served {
    /// Stops the server as an operator would (SIGTERM), so that a command
    /// it runs under (a profiler) sees it exit and writes its report; it is
    /// killed if it has not exited within a minute.
    fn drop(&mut self) {
        let pid = self.child.id();
        // Under a command of its own, the server is that command's child.
        let server = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()
            .and_then(|c| c.split_whitespace().next()?.parse().ok())
            .unwrap_or(pid);
        if let Some(server) = rustix::process::Pid::from_raw(server as i32) {
            let _ = rustix::process::kill_process(server, rustix::process::Signal::TERM);
        }
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(60) {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `bin serve` on a free loopback port with its data in `data` (under
/// `wrap`, a command line the server runs under, if not empty), once
/// ready.
async fn serve(bin: &Path, data: &Path, wrap: &[String]) -> Served {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut command = match wrap.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let child = command
        .arg("serve")
        .env("ESTAFETA_DATA_DIR", data)
        .env("ESTAFETA_LISTEN", format!("127.0.0.1:{port}"))
        .env("ESTAFETA_ADMIN_TOKEN", ADMIN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let mut served = Served {
        child,
        data: data.to_owned(),
        admin: Client::new(&format!("http://127.0.0.1:{port}"), ADMIN).unwrap(),
    };
    let began = Instant::now();
    loop {
        if let Some(status) = served.child.try_wait().unwrap() {
            panic!(
                "{} serve exited before it was ready: {status}",
                bin.display()
            );
        }
        if served.admin.readyz().await.unwrap_or(false) {
            return served;
        }
        assert!(
            began.elapsed() < READY_WITHIN,
            "{} not ready within {READY_WITHIN:?}",
            bin.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Fills the event log in the data folder `data` (its server stopped) with
/// `kept` upload records, 400 µs apart (2,500 uploads/s) up to now, under
/// the server's default retention, as a server's log is once it has run a
/// while.
fn fill_event_log(data: &Path, kept: u64) {
    /// Records a transaction.
    const BATCH: u64 = 5_000;
    const APART: u64 = 400_000;
    let store = EventStore::open(&events_file(data)).unwrap();
    let now = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap();
    let first = now - kept * APART;
    let mut i = 0;
    while i < kept {
        let end = kept.min(i + BATCH);
        let records: Vec<_> = (i..end)
            .map(|i| upload_record(i, first + i * APART, uuid::Uuid::now_v7()))
            .collect();
        store
            .append(&records, &Retention::default(), first + end * APART)
            .unwrap();
        i = end;
    }
    let (records, bytes) = store.size().unwrap();
    println!("  its event log: {records} records kept, {bytes} bytes of JSON");
}

/// A device's client and the database it sends to.
#[derive(Clone)]
struct Device {
    client: Client,
    to: Id,
}

/// One enterprise with the databases and the devices.
async fn provision(admin: &Client) -> Vec<Device> {
    let acme = id("acme");
    admin.create_enterprise(&acme).await.unwrap();
    admin.create_subsystem(&acme, &id("sales")).await.unwrap();
    for d in 0..DATABASES {
        admin
            .create_database(&acme, &id(&format!("db-{d}")))
            .await
            .unwrap();
    }
    let mut devices = Vec::new();
    for n in 0..DEVICES {
        let made = admin
            .create_device(&acme, &id(&format!("phone-{n}")), &id("sales"))
            .await
            .unwrap();
        devices.push(Device {
            client: admin.with_token(&made.token),
            to: id(&format!("db-{}", n % DATABASES)),
        });
    }
    devices
}

/// A 1 KB body carrying `nonce`.
fn body(nonce: u64) -> Body {
    let head = format!(r#"{{"nonce":{nonce},"order":{{"lines":[{{"sku":"A-1","qty":2}}],"note":""#);
    let pad = BODY_BYTES - head.len() - 3;
    Body::from_json(format!(r#"{head}{}"}}}}"#, "x".repeat(pad))).unwrap()
}

/// CPU time used so far, in [`TICK`]s of `/proc`: where a run's time goes when the machine's cores,
/// not its disk, are what bounds it.
#[derive(Clone, Copy)]
struct CpuTime {
    /// By the server process, all its threads, in its own code and in the
    /// kernel's (its system calls: on this kind of machine, most of it).
    server: ProcessCpu,
    /// By this process: the clients during uploads, the probe's threads
    /// during the ceiling.
    bench: u64,
    /// By the whole machine, every core: what ran on it (not idle, not
    /// waiting for I/O, not taken by the host).
    busy: u64,
    /// Taken from the machine's cores by its host (`steal`): a virtual
    /// machine's neighbours at work.
    stolen: u64,
    /// Every core's time, idle included.
    all: u64,
}

impl CpuTime {
    fn now(server: u32) -> CpuTime {
        let machine = machine_ticks();
        CpuTime {
            server: process_cpu(&server.to_string()),
            bench: process_cpu_ticks("self"),
            busy: machine.busy,
            stolen: machine.stolen,
            all: machine.all,
        }
    }

    fn since(self, before: CpuTime) -> CpuTime {
        CpuTime {
            server: self.server.since(before.server),
            bench: self.bench - before.bench,
            busy: self.busy - before.busy,
            stolen: self.stolen - before.stolen,
            all: self.all - before.all,
        }
    }

    /// Microseconds of `ticks` per one of `n`.
    fn micros_each(ticks: u64, n: u64) -> f64 {
        ticks as f64 * TICK.as_secs_f64() * 1e6 / n.max(1) as f64
    }

    /// How busy the machine's cores were: "62% busy" or, when the host
    /// took some of their time, "62% busy, 9% taken by the host".
    fn busy(&self) -> String {
        let share = |ticks: u64| ticks as f64 * 100.0 / self.all.max(1) as f64;
        match share(self.stolen) {
            stolen if stolen >= 0.5 => {
                format!(
                    "{:.0}% busy, {stolen:.0}% taken by the host",
                    share(self.busy)
                )
            }
            _ => format!("{:.0}% busy", share(self.busy)),
        }
    }
}

/// What a run of uploads measured.
struct Run {
    uploads: u64,
    elapsed: Duration,
    /// Each upload's time, sorted.
    latencies: Vec<Duration>,
    /// The CPU time the run took.
    cpu: CpuTime,
}

impl Run {
    fn per_second(&self) -> f64 {
        self.uploads as f64 / self.elapsed.as_secs_f64()
    }

    /// The latency at quantile `q`.
    fn quantile(&self, q: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies.get(i).copied().unwrap_or_default()
    }

    fn ms(&self, q: f64) -> f64 {
        self.quantile(q).as_secs_f64() * 1e3
    }
}

/// Every device of `devices` uploads, one upload after another, until
/// `time` has passed (with a new idempotency key each upload if `keyed`);
/// every upload must be answered 201. `server` is the server's process id,
/// whose CPU time is counted.
async fn uploads(
    devices: &[Device],
    keyed: bool,
    time: Duration,
    nonce: &Arc<AtomicU64>,
    server: u32,
) -> Run {
    let cpu = CpuTime::now(server);
    let began = Instant::now();
    let deadline = began + time;
    let mut tasks = tokio::task::JoinSet::new();
    for device in devices.iter().cloned() {
        let nonce = Arc::clone(nonce);
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let n = nonce.fetch_add(1, Ordering::Relaxed);
                let message = SendMessage {
                    idempotency_key: keyed.then(|| format!("key-{n}")),
                    ..SendMessage::new(device.to.clone(), body(n))
                };
                let t = Instant::now();
                let sent = device.client.send(&message).await.unwrap();
                latencies.push(t.elapsed());
                assert_eq!(sent.upload, estafeta_client::Upload::Created);
            }
            latencies
        });
    }
    let mut latencies: Vec<Duration> = tasks.join_all().await.into_iter().flatten().collect();
    let elapsed = began.elapsed();
    let cpu = CpuTime::now(server).since(cpu);
    latencies.sort();
    Run {
        uploads: latencies.len() as u64,
        elapsed,
        latencies,
        cpu,
    }
}

/// The message files in the databases' queues of `served`: what the
/// uploads answered 201 must have left there.
fn files_waiting(served: &Served) -> u64 {
    (0..DATABASES)
        .map(|d| {
            let dir = served.data.join(format!("db-{d}")).join("Messages");
            std::fs::read_dir(&dir)
                .map(|entries| {
                    entries
                        .filter(|e| {
                            e.as_ref()
                                .is_ok_and(|e| !e.file_name().as_encoded_bytes().starts_with(b"."))
                        })
                        .count() as u64
                })
                .unwrap_or(0)
        })
        .sum()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Which server a target runs.
#[derive(Clone, Copy)]
enum Kind {
    /// This build's, its event log empty at first.
    ThisBuild,
    /// Another build's (`UPLOADS_BEFORE`).
    Before,
    /// This build's, its event log filled first with this many records
    /// (`UPLOADS_EVENTS_KEPT`).
    EventsKept(u64),
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::ThisBuild => "this build".to_owned(),
            Kind::Before => "before".to_owned(),
            Kind::EventsKept(n) => format!("this build, {n} events kept"),
        }
    }
}

/// A build under test: its binary, its server, its devices, and its
/// figures round by round.
struct Target {
    kind: Kind,
    served: Served,
    devices: Vec<Device>,
    /// Uploads answered 201 so far.
    uploaded: u64,
    /// Per round: 16 devices plain, 16 keyed, one plain, one keyed.
    runs: Vec<[Run; 4]>,
}

fn main() {
    let tmp = tempfile::tempdir_in(bench_dir()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let this = PathBuf::from(env!("CARGO_BIN_EXE_estafeta"));
    let nonce = Arc::new(AtomicU64::new(0));

    if let Ok(n) = std::env::var("UPLOADS_TRACE") {
        let n: u64 = n.parse().expect("UPLOADS_TRACE=N");
        let bin = std::env::var_os("UPLOADS_SERVER").map_or(this, PathBuf::from);
        let wrap: Vec<String> = std::env::var("UPLOADS_WRAP")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let keyed = std::env::var_os("UPLOADS_KEYED").is_some();
        rt.block_on(async {
            let served = serve(&bin, &tmp.path().join("data"), &wrap).await;
            let devices = provision(&served.admin).await;
            let one = &devices[..1];
            for i in 0..n {
                let message = SendMessage {
                    idempotency_key: keyed.then(|| format!("key-{i}")),
                    ..SendMessage::new(one[0].to.clone(), body(i))
                };
                one[0].client.send(&message).await.unwrap();
            }
            assert_eq!(files_waiting(&served), n);
            println!(
                "{n} uploads of one device (keyed: {keyed}) by {}",
                bin.display()
            );
        });
        return;
    }

    let time = Duration::from_secs(env_number("UPLOADS_SECONDS", 5));
    let rounds = env_number("UPLOADS_ROUNDS", 3) as usize;
    let events_kept = env_number("UPLOADS_EVENTS_KEPT", 0);
    let mut builds = vec![(Kind::ThisBuild, this.clone())];
    if let Some(before) = std::env::var_os("UPLOADS_BEFORE") {
        builds.push((Kind::Before, PathBuf::from(before)));
    }
    if events_kept > 0 {
        builds.push((Kind::EventsKept(events_kept), this));
    }
    let mut targets: Vec<Target> = builds
        .into_iter()
        .enumerate()
        .map(|(i, (kind, bin))| {
            rt.block_on(async {
                println!("{}: {}", kind.name(), bin.display());
                let data = tmp.path().join(format!("data-{i}"));
                if let Kind::EventsKept(kept) = kind {
                    drop(serve(&bin, &data, &[]).await);
                    fill_event_log(&data, kept);
                }
                let served = serve(&bin, &data, &[]).await;
                let devices = provision(&served.admin).await;
                Target {
                    kind,
                    served,
                    devices,
                    uploaded: 0,
                    runs: Vec::new(),
                }
            })
        })
        .collect();
    let probe = Probe::new(tmp.path().join("probe"), BODY_BYTES).unwrap();
    let mut batch = probe.files_at_once(DEVICES).unwrap();
    let mut ceilings: Vec<Measured> = Vec::new();
    let mut floors: Vec<Measured> = Vec::new();
    let mut pair = probe.file_beside_record(RECORD_BYTES).unwrap();
    let mut syncs_each: Vec<Measured> = Vec::new();
    for round in 0..rounds {
        let load_before = load_average();
        let cpu = CpuTime::now(std::process::id());
        let ceiling = probe.measure(|| batch.run(), DEVICES, time).unwrap();
        let at_ceiling = CpuTime::now(std::process::id()).since(cpu);
        let cpu = CpuTime::now(std::process::id());
        let floor = probe.measure(|| probe.one_file(), 1, time / 2).unwrap();
        let at_floor = CpuTime::now(std::process::id()).since(cpu);
        let syncs = probe.measure(|| pair.run(), 1, time / 2).unwrap();
        println!(
            "round {}: ceiling for {DEVICES}: {:.0} files/s ({:.0} µs of CPU a file, the machine {}); floor: {:.0} files/s, median {:.3} ms ({:.0} µs of CPU a file); an upload's syncs side by side: median {:.3} ms",
            round + 1,
            ceiling.files_per_second(),
            CpuTime::micros_each(at_ceiling.bench, ceiling.files),
            at_ceiling.busy(),
            floor.files_per_second(),
            floor.median_round().as_secs_f64() * 1e3,
            CpuTime::micros_each(at_floor.bench, floor.files),
            syncs.median_round().as_secs_f64() * 1e3,
        );
        // Each round begins with another build, so that none always
        // follows the same work.
        let count = targets.len();
        for k in 0..count {
            let t = &mut targets[(round + k) % count];
            let runs = rt.block_on(async {
                let all = &t.devices[..];
                let one = &t.devices[..1];
                let pid = t.served.child.id();
                [
                    uploads(all, false, time, &nonce, pid).await,
                    uploads(all, true, time, &nonce, pid).await,
                    uploads(one, false, time / 2, &nonce, pid).await,
                    uploads(one, true, time / 2, &nonce, pid).await,
                ]
            });
            t.uploaded += runs.iter().map(|r| r.uploads).sum::<u64>();
            let c = ceiling.files_per_second();
            let f = floor.median_round().as_secs_f64() * 1e3;
            let y = syncs.median_round().as_secs_f64() * 1e3;
            for (what, run, of_ceiling) in [
                ("16 devices", &runs[0], true),
                ("16 devices, keyed", &runs[1], true),
                ("1 device", &runs[2], false),
                ("1 device, keyed", &runs[3], false),
            ] {
                let ratio = match of_ceiling {
                    true => format!("{:.2} of the ceiling", run.per_second() / c),
                    false => format!(
                        "p50 {:.2} × the floor's, {:.2} × its syncs'",
                        run.ms(0.5) / f,
                        run.ms(0.5) / y
                    ),
                };
                println!(
                    "  {}, {what}: {:.0} uploads/s, p50 {:.2} ms, p99 {:.2} ms: {ratio}; µs of CPU an upload: server {:.0} ({:.0} in the kernel), clients {:.0}; the machine {}",
                    t.kind.name(),
                    run.per_second(),
                    run.ms(0.5),
                    run.ms(0.99),
                    CpuTime::micros_each(run.cpu.server.total(), run.uploads),
                    CpuTime::micros_each(run.cpu.server.kernel, run.uploads),
                    CpuTime::micros_each(run.cpu.bench, run.uploads),
                    run.cpu.busy()
                );
            }
            t.runs.push(runs);
        }
        println!(
            "  load average {load_before:.2} before the round, {:.2} after",
            load_average()
        );
        ceilings.push(ceiling);
        floors.push(floor);
        syncs_each.push(syncs);
    }
    for t in &targets {
        assert_eq!(
            files_waiting(&t.served),
            t.uploaded,
            "{}: every upload answered 201 is a file in its database's queue",
            t.kind.name()
        );
    }
    println!("medians over {rounds} rounds (each ratio taken within its round):");
    let ceiling = |r: usize| ceilings[r].files_per_second();
    let floor = |r: usize| floors[r].median_round().as_secs_f64() * 1e3;
    let syncs = |r: usize| syncs_each[r].median_round().as_secs_f64() * 1e3;
    for t in &targets {
        let of_ceiling = |i: usize| {
            median(
                (0..rounds)
                    .map(|r| t.runs[r][i].per_second() / ceiling(r))
                    .collect(),
            )
        };
        let of = |i: usize, base: &dyn Fn(usize) -> f64| {
            median(
                (0..rounds)
                    .map(|r| t.runs[r][i].ms(0.5) / base(r))
                    .collect(),
            )
        };
        println!(
            "  {}: 16 devices {:.2} / keyed {:.2} of the ceiling; 1 device p50 {:.2} / keyed {:.2} × the floor's, {:.2} / keyed {:.2} × its syncs'",
            t.kind.name(),
            of_ceiling(0),
            of_ceiling(1),
            of(2, &floor),
            of(3, &floor),
            of(2, &syncs),
            of(3, &syncs)
        );
    }
    let (this, others) = targets.split_first().unwrap();
    for other in others {
        // Another build is held against this one; this build with its log
        // full, against its log empty.
        let (after, before) = match other.kind {
            Kind::Before => (this, other),
            Kind::ThisBuild | Kind::EventsKept(_) => (other, this),
        };
        let ratio = |i: usize, f: &dyn Fn(&Run) -> f64| {
            median(
                (0..rounds)
                    .map(|r| f(&after.runs[r][i]) / f(&before.runs[r][i]))
                    .collect(),
            )
        };
        let rate = |r: &Run| r.per_second();
        let p50 = |r: &Run| r.ms(0.5);
        println!(
            "  {} ÷ {}, uploads/s: 16 devices {:.2}, keyed {:.2}; 1 device {:.2}, keyed {:.2}; p50 1 device {:.2}, keyed {:.2}",
            after.kind.name(),
            before.kind.name(),
            ratio(0, &rate),
            ratio(1, &rate),
            ratio(2, &rate),
            ratio(3, &rate),
            ratio(2, &p50),
            ratio(3, &p50)
        );
    }
}
