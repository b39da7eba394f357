//! Costs as the data grows, measured on the real server (the `estafeta`
//! binary) over HTTP, with the data made directly through the stores:
//! 10 databases and `SCALE_DEVICES` devices (10,000) in the registry,
//! `SCALE_WAITING` messages (1,000,000) waiting in `db-big` and 1,000 in
//! `db-small`, `SCALE_KEYS` idempotency keys (100,000) for `phone-1` and
//! 100 for `phone-0`. Printed: the time to ready after a clean stop and
//! after `kill -9`, `start` latency (p50, p99) at both backlogs, keyed
//! upload latency at both key counts, a device's upload latency into
//! both backlogs, and the server's RSS and the data folder's size
//! (figures for `BENCHMARKS.md`).
//!
//! Two measurements, each against a baseline in the same run: `costs`
//! (the figures above, each growing size against its small one) and `idle`
//! (the RSS and disk of idle devices and databases against the bare test
//! tenancy).
//!
//! ```sh
//! cargo bench -p estafeta-server --bench scale            # both
//! cargo bench -p estafeta-server --bench scale -- idle    # one of them
//! # SCALE_DIR picks the disk (default: the system temp folder); the data
//! # is removed at the end unless SCALE_KEEP is set; ESTAFETA_TEST_BINARY
//! # names the server binary to run (e.g. target/release/estafeta);
//! # --profile dev for a debug build
//! ```

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use estafeta_client::Client;
use estafeta_exchange::keys::{KeyedUpload, RedbKeys, UploadKeys};
use estafeta_exchange::mailbox::FileName;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::{Body, Message, Version};
use estafeta_exchange::{DataLayout, Exchange, ExchangeConfig, MessageId, Sinks, Timestamp};
use estafeta_server_harness::api::{id, message, start_request};
use estafeta_server_harness::binary::{self, Program};
use estafeta_server_harness::measure::two_threads;
use redb::TableDefinition;

/// The `estafeta` binary built with this bench.
struct Estafeta;

impl Program for Estafeta {
    const BUILT: &'static str = env!("CARGO_BIN_EXE_estafeta");
}

/// The real binary, started by [`Binary::serve`].
type Binary = binary::Binary<Estafeta>;

const ADMIN: &str = "scale-admin-0123456789abcdef0123456789";
/// Messages waiting in `db-small`, and the real (non-empty) oldest files of
/// `db-big`: both backlogs hand out the same kind of messages.
const SMALL: usize = 1_000;
/// Keys of `phone-0`, the baseline of the upload figure.
const FEW_KEYS: usize = 100;
/// Calls timed per figure: enough that a p99 is the tenth slowest, not
/// the second.
const CALLS: usize = 1_000;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| v.replace(['_', ','], "").parse().unwrap())
        .unwrap_or(default)
}

/// Enterprise `acme` with subsystem `sales`, devices `phone-2`…
/// (`devices` in all with `phone-0` and `phone-1`) and `idle_dbs`
/// databases `idle-0`…, written straight into the registry's file in one
/// transaction (made through the exchange, each would be a durable commit
/// of its own). Their tokens are never used: the stored hashes are made up.
fn fill_registry(data: &Path, devices: usize, idle_dbs: usize) {
    let enterprises: TableDefinition<'_, &str, ()> = TableDefinition::new("enterprises");
    let subsystems: TableDefinition<'_, (&str, &str), ()> = TableDefinition::new("subsystems");
    let endpoints: TableDefinition<'_, &str, &str> = TableDefinition::new("endpoints");
    let db = redb::Database::create(DataLayout::new(data).registry()).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(enterprises)
        .unwrap()
        .insert("acme", ())
        .unwrap();
    txn.open_table(subsystems)
        .unwrap()
        .insert(("acme", "sales"), ())
        .unwrap();
    {
        let mut table = txn.open_table(endpoints).unwrap();
        for i in 2..devices {
            let record = format!(
                r#"{{"enterprise":"acme","device_subsystem":"sales","token_sha256":"{i:064x}"}}"#
            );
            table
                .insert(format!("phone-{i}").as_str(), record.as_str())
                .unwrap();
        }
        for i in 0..idle_dbs {
            let record = format!(
                r#"{{"enterprise":"acme","token_sha256":"{:064x}"}}"#,
                i + devices
            );
            table
                .insert(format!("idle-{i}").as_str(), record.as_str())
                .unwrap();
        }
    }
    txn.commit().unwrap();
}

/// The rest of the registry, made through the exchange: `db-big`,
/// `db-small`, `db-0`…`db-7`, `phone-0` and `phone-1`; the tokens of the
/// two databases with messages and of the two devices.
async fn provision(data: &Path) -> [String; 4] {
    let mut config = ExchangeConfig::new(data);
    config.admin_token = Some(ADMIN.to_owned());
    let clock = Arc::new(estafeta_session::SystemClock);
    let (ex, _) = Exchange::open_embedded(config, clock, Sinks::default())
        .await
        .unwrap();
    ex.recover().await.unwrap();
    let admin = Principal::Admin;
    let big = ex
        .create_database(&admin, id("acme"), id("db-big"))
        .await
        .unwrap();
    let small = ex
        .create_database(&admin, id("acme"), id("db-small"))
        .await
        .unwrap();
    for i in 0..8 {
        ex.create_database(&admin, id("acme"), id(&format!("db-{i}")))
            .await
            .unwrap();
    }
    let mut phones = Vec::new();
    for i in 0..2 {
        let token = ex
            .create_device(&admin, id("acme"), id(&format!("phone-{i}")), id("sales"))
            .await
            .unwrap();
        phones.push(token.expose().to_owned());
    }
    ex.shutdown().await.unwrap();
    [
        big.expose().to_owned(),
        small.expose().to_owned(),
        phones[0].clone(),
        phones[1].clone(),
    ]
}

/// `n` messages from `phone-0` waiting in `db`'s `Messages`, written
/// directly (no fsync; one `sync` at the end): the `real` oldest hold a
/// message, the others are empty files (names are what the index reads).
fn fill_messages(data: &Path, db: &str, n: usize, real: usize) {
    let dir = data.join(db).join("Messages");
    std::fs::create_dir_all(&dir).unwrap();
    let t0: u64 = 1_764_064_800_000;
    let body = Body::from_json(r#"{"order":{"lines":[{"sku":"A-1","qty":2}]}}"#).unwrap();
    for i in 0..n {
        let m = Message {
            version: Version,
            id: MessageId::from_parts(t0 + i as u64, i as u128),
            from: id("phone-0"),
            to: id(db),
            subsystem: id("sales"),
            created_at: Timestamp::from_millis((t0 + i as u64) as i64),
            body: body.clone(),
        };
        let path = dir.join(FileName::of(&m).to_string());
        if i < real {
            std::fs::write(path, m.to_file_bytes().unwrap()).unwrap();
        } else {
            std::fs::File::create(path).unwrap();
        }
    }
}

/// The server's state folder, private as the server makes it.
fn state_folder(data: &Path) {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(DataLayout::new(data).state_dir())
        .unwrap();
}

/// `n` keys of `device` in the key store, valid for a week.
fn fill_keys(data: &Path, device: &str, n: usize) {
    let keys = RedbKeys::open(DataLayout::new(data).keys()).unwrap();
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let week = 7 * 24 * 3_600_000;
    let device = id(device);
    let mut batch = Vec::new();
    for i in 0..n {
        batch.push((
            device.clone(),
            format!("filled-{i}"),
            KeyedUpload {
                name: format!("filled-{i}"),
                at: now,
                expires_at: Timestamp::from_millis(now.as_millis() + week),
            },
        ));
        if batch.len() == 50_000 || i + 1 == n {
            keys.put_all(&batch).unwrap();
            batch.clear();
        }
    }
}

/// Starts the binary on `data` and waits for `/readyz`; the server, its
/// admin client and the time from the spawn to ready.
async fn boot(dir: &Path, data: &Path) -> (Binary, Client, Duration) {
    let began = Instant::now();
    let server = Binary::serve(dir, data, &[], &[("ESTAFETA_ADMIN_TOKEN", ADMIN)]).await;
    let admin = Client::new(&server.base, ADMIN).unwrap();
    while !admin.readyz().await.unwrap() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (server, admin, began.elapsed())
}

/// p50 and p99 of `samples`.
fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.50), at(0.99))
}

/// Prints the p50 and p99 of `what` at a small and a large size, and
/// their ratios (large ÷ small).
fn ratio_line(
    what: &str,
    small: &str,
    (p50_small, p99_small): (Duration, Duration),
    large: &str,
    (p50_large, p99_large): (Duration, Duration),
) {
    println!("{what}, {small}: p50 {p50_small:.2?}, p99 {p99_small:.2?}");
    println!("{what}, {large}: p50 {p50_large:.2?}, p99 {p99_large:.2?}");
    println!(
        "{what} ratio: p50 {:.2}, p99 {:.2}",
        p50_large.as_secs_f64() / p50_small.as_secs_f64(),
        p99_large.as_secs_f64() / p99_small.as_secs_f64()
    );
}

/// A start on `db` by `processor`, rolled back (so the next start finds
/// the same backlog): its latency.
async fn start_once(processor: &Client, db: &str) -> Duration {
    let began = Instant::now();
    let started = processor.start(&start_request(db)).await.unwrap();
    let took = began.elapsed();
    assert_eq!(started.messages.as_ref().map(Vec::len), Some(10));
    processor
        .rollback(&started.process_id.unwrap(), "measured")
        .await
        .unwrap();
    took
}

/// An upload by `device` to `db` (with `key`, if any): its latency.
async fn upload_once(device: &Client, db: &str, key: Option<&str>) -> Duration {
    let began = Instant::now();
    device.send(&message(db, r#"{"n":1}"#, key)).await.unwrap();
    began.elapsed()
}

/// `CALLS` timed calls of `call` (given a side and the call's number) on
/// each of two sides, a client and its database, taking turns so that
/// both see the same machine (the background work start-up and a folder's
/// first use leave behind): the p50 and p99 of each side.
async fn in_turns<'a>(
    sides: [(&'a Client, &'a str); 2],
    call: impl AsyncFn(&'a Client, &'a str, usize) -> Duration,
) -> [(Duration, Duration); 2] {
    let mut samples = [Vec::new(), Vec::new()];
    for i in 0..CALLS {
        for ((client, db), taken) in sides.into_iter().zip(samples.iter_mut()) {
            taken.push(call(client, db, i).await);
        }
    }
    samples.map(percentiles)
}

/// Starts on each of two sides, a processor and its database: the first
/// start of each (the folder's first use), then `CALLS` more each, in
/// turns: the first's latency, the p50 and p99 of the others.
async fn starts(sides: [(&Client, &str); 2]) -> [(Duration, (Duration, Duration)); 2] {
    let mut first = [Duration::ZERO; 2];
    for ((processor, db), first) in sides.into_iter().zip(first.iter_mut()) {
        *first = start_once(processor, db).await;
    }
    let [small, big] = in_turns(sides, async |processor, db, _| {
        start_once(processor, db).await
    })
    .await;
    [(first[0], small), (first[1], big)]
}

/// `CALLS` uploads by each of two sides, a device and the database it
/// sends to (with a new idempotency key each upload if `keyed`), in
/// turns: the p50 and p99 of each.
async fn uploads(sides: [(&Client, &str); 2], keyed: bool) -> [(Duration, Duration); 2] {
    in_turns(sides, async |device, db, i| {
        let key = keyed.then(|| format!("upload-{i}"));
        upload_once(device, db, key.as_deref()).await
    })
    .await
}

fn rss_kib(server: &Binary) -> u64 {
    let pid = server.child.id().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn du_bytes(path: &Path) -> u64 {
    let out = std::process::Command::new("du")
        .args(["-s", "--block-size=1"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `start` and upload latency, time to ready, RSS and disk as the data
/// grows (minutes, GBs of disk at the default sizes).
async fn costs_stay_flat_as_the_data_grows() {
    let (devices, waiting, keys) = (
        setting("SCALE_DEVICES", 10_000),
        setting("SCALE_WAITING", 1_000_000),
        setting("SCALE_KEYS", 100_000),
    );
    let base = std::env::var_os("SCALE_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(base).unwrap();
    let data = dir.path().join("data");

    let began = Instant::now();
    state_folder(&data);
    fill_keys(&data, "phone-0", FEW_KEYS);
    fill_keys(&data, "phone-1", keys);
    fill_registry(&data, devices, 0);
    let [big, small, phone0, phone1] = provision(&data).await;
    let registry_done = began.elapsed();
    {
        let data = data.clone();
        let fill = [
            std::thread::spawn({
                let data = data.clone();
                move || fill_messages(&data, "db-big", waiting, SMALL)
            }),
            std::thread::spawn(move || fill_messages(&data, "db-small", SMALL, SMALL)),
        ];
        for f in fill {
            f.join().unwrap();
        }
    }
    assert!(
        std::process::Command::new("sync")
            .status()
            .unwrap()
            .success()
    );
    println!(
        "made: {devices} devices, 10 databases, {keys} keys ({registry_done:.1?}); \
         {waiting} + {SMALL} messages waiting (total {:.1?})",
        began.elapsed()
    );

    // The first start after the in-process server's clean stop.
    let (server, admin, clean) = boot(dir.path(), &data).await;
    println!("time to ready after a clean stop: {clean:.3?}");
    let rss_idle = rss_kib(&server);
    println!("RSS when ready: {rss_idle} KiB");

    let (small, big) = (admin.with_token(&small), admin.with_token(&big));
    let [(first_small, small_starts), (first_big, big_starts)] =
        starts([(&small, "db-small"), (&big, "db-big")]).await;
    println!("first start, {SMALL} waiting: {first_small:.2?}; {waiting} waiting: {first_big:.2?}");
    ratio_line(
        "start",
        &format!("{SMALL} waiting"),
        small_starts,
        &format!("{waiting} waiting"),
        big_starts,
    );

    let (phone0, phone1) = (admin.with_token(&phone0), admin.with_token(&phone1));
    let [few, many] = uploads([(&phone0, "db-0"), (&phone1, "db-0")], true).await;
    ratio_line(
        "upload",
        &format!("{FEW_KEYS} keys"),
        few,
        &format!("{keys} keys"),
        many,
    );
    let [small_queue, big_queue] =
        uploads([(&phone0, "db-small"), (&phone0, "db-big")], false).await;
    ratio_line(
        "upload into a queue",
        &format!("{SMALL} waiting"),
        small_queue,
        &format!("{waiting} waiting"),
        big_queue,
    );
    println!("RSS after the calls: {} KiB", rss_kib(&server));

    assert_eq!(server.terminate().await, Some(0));
    let (server, _admin, clean) = boot(dir.path(), &data).await;
    println!("time to ready after SIGTERM (clean stop): {clean:.3?}");
    server.kill9().await;
    let (server, _admin, killed) = boot(dir.path(), &data).await;
    println!("time to ready after kill -9: {killed:.3?}");
    assert_eq!(server.terminate().await, Some(0));
    for f in [
        "sessions.redb",
        "keys.redb",
        "registry.redb",
        "scheduled.redb",
    ] {
        let path = data.join(".estafeta").join(f);
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        println!("{f}: {size} bytes");
    }
    println!("data folder: {} bytes", du_bytes(&data));
    if std::env::var_os("SCALE_KEEP").is_some() {
        println!("kept: {}", dir.keep().display());
    }
}

/// The server's RSS and the data folder's size with only the test
/// tenancy, then with `SCALE_IDLE` (100,000) idle devices more, then with
/// `SCALE_IDLE_DBS` (10,000) idle databases more: the cost of each idle
/// device and database (goal: under 1 KB each in RSS and on disk). The RSS
/// is read once start-up's work after ready has had 3 s.
async fn idle_devices_and_databases_cost_little() {
    let (idle, idle_dbs) = (
        setting("SCALE_IDLE", 100_000),
        setting("SCALE_IDLE_DBS", 10_000),
    );
    let base = std::env::var_os("SCALE_DIR").map_or_else(std::env::temp_dir, Into::into);
    let mut figures = Vec::new();
    for (devices, dbs) in [(2, 0), (2 + idle, 0), (2, idle_dbs)] {
        let dir = tempfile::tempdir_in(&base).unwrap();
        let data = dir.path().join("data");
        state_folder(&data);
        fill_registry(&data, devices, dbs);
        provision(&data).await;
        let (server, admin, ready) = boot(dir.path(), &data).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(admin.readyz().await.unwrap());
        let (rss, disk) = (rss_kib(&server) * 1024, du_bytes(&data));
        println!(
            "{devices} devices, {} databases: ready in {ready:.3?}, RSS {rss} bytes, data folder {disk} bytes",
            dbs + 10
        );
        assert_eq!(server.terminate().await, Some(0));
        figures.push((rss as f64, disk as f64));
    }
    let per = |(rss, disk): (f64, f64), n: usize| {
        let (rss0, disk0) = figures[0];
        ((rss - rss0) / n as f64, (disk - disk0) / n as f64)
    };
    let (rss, disk) = per(figures[1], idle);
    println!("per idle device: RSS {rss:.0} bytes, disk {disk:.0} bytes");
    let (rss, disk) = per(figures[2], idle_dbs);
    println!("per idle database: RSS {rss:.0} bytes, disk {disk:.0} bytes");
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument picks a measurement.
    let picked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| picked.is_empty() || picked.iter().any(|p| p == name);
    let runtime = two_threads();
    if wanted("costs") {
        runtime.block_on(costs_stay_flat_as_the_data_grows());
    }
    if wanted("idle") {
        runtime.block_on(idle_devices_and_databases_cost_little());
    }
}
