//! The dashboard at scale: `ESTAFETA_SCALE_DEVICES` devices (default
//! 1,000), a tenth as many databases and `ESTAFETA_SCALE_MESSAGES`
//! messages waiting (default 10,000) spread over the databases, made
//! directly through the exchange and the data folder; every page (and the
//! later pages and searches of the lists) answers in under 200 KB, the
//! overview counts every waiting message, and the time of each page over
//! `ESTAFETA_SCALE_ROUNDS` rounds (default 5) is printed, p50 and p99.
//!
//! The full size of the issue, measured for the benchmarks:
//! `ESTAFETA_SCALE_DEVICES=10000 ESTAFETA_SCALE_MESSAGES=1000000
//! ESTAFETA_SCALE_ROUNDS=20 cargo test --release -p estafeta-server --test it
//! -- dashboard_scale:: --nocapture`.

use std::time::{Duration, Instant};

use crate::common::{ADMIN_TOKEN, TestServer, dashboard_session, http, id};
use estafeta_exchange::mailbox::FileName;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::{MessageId, Timestamp};
use reqwest::StatusCode;
use reqwest::header::COOKIE;

/// The most bytes of any dashboard page.
const MOST_BYTES: usize = 200 * 1024;

/// Messages put into `Error` (over the first databases): more than one
/// page of the browser.
const IN_ERROR: usize = 120;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Logs in; the session's cookie header.
async fn login(server: &TestServer) -> String {
    dashboard_session(&server.url("/admin"), ADMIN_TOKEN).await
}

/// How a file gets its content.
enum Body<'a> {
    /// Written with these bytes.
    Bytes(&'a [u8]),
    /// A hard link to this (empty) file: one system call and no inode per
    /// file, so a million waiting messages are made in seconds. The pages
    /// read only the names of the waiting messages.
    LinkTo(&'a std::path::Path),
}

/// Writes `n` message files named for `db` into `<data>/<db>/<folder>`,
/// created one millisecond apart from `t0`, with `body` (no fsync: the
/// test reads them back from the page cache).
fn write_files(
    data: &std::path::Path,
    db: &str,
    folder: &str,
    n: usize,
    t0: i64,
    seq: u128,
    body: Body<'_>,
) {
    let dir = data.join(db).join(folder);
    std::fs::create_dir_all(&dir).unwrap();
    for j in 0..n {
        let created = t0 + j as i64;
        let name = FileName {
            created_at: Timestamp::from_millis(created),
            id: MessageId::from_parts(created as u64, seq * 1_000_000 + j as u128),
            from: id("bdev-00000"),
            to: id(db),
            subsystem: id("app"),
        };
        let path = dir.join(name.to_string());
        match body {
            Body::Bytes(bytes) => std::fs::write(path, bytes).unwrap(),
            Body::LinkTo(seed) => std::fs::hard_link(seed, path).unwrap(),
        }
    }
}

/// The `q`-th quantile of sorted durations.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[at]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_stays_small_at_scale() {
    let devices = setting("ESTAFETA_SCALE_DEVICES", 1000);
    let databases = devices / 10;
    let messages = setting("ESTAFETA_SCALE_MESSAGES", 10_000);
    let rounds = setting("ESTAFETA_SCALE_ROUNDS", 5).max(1);
    let server = TestServer::start().await;
    let ex = &server.exchange;
    let admin = Principal::Admin;
    let made = Instant::now();
    ex.create_enterprise(&admin, id("big")).await.unwrap();
    ex.create_subsystem(&admin, id("big"), id("app"))
        .await
        .unwrap();
    let dbs: Vec<String> = (0..databases).map(|i| format!("bdb-{i:04}")).collect();
    for db in &dbs {
        ex.create_database(&admin, id("big"), id(db)).await.unwrap();
    }
    for i in 0..devices {
        ex.create_device(&admin, id("big"), id(&format!("bdev-{i:05}")), id("app"))
            .await
            .unwrap();
    }
    let registered = made.elapsed();
    let data = server.data.path().to_path_buf();
    let t0 = Timestamp::from_system_time(std::time::SystemTime::now()).as_millis() - 3_600_000;
    let per_db = messages / databases;
    // The empty file each database's waiting messages link to, on the data
    // folder's file system (a file takes at most 65,000 links).
    let seeds = tempfile::tempdir_in(data.parent().unwrap()).unwrap();
    assert!(per_db < 65_000, "{per_db} links to one file");
    let written = Instant::now();
    let writers: Vec<_> = dbs
        .chunks(dbs.len().div_ceil(4))
        .map(|chunk| {
            let (chunk, data) = (chunk.to_vec(), data.clone());
            let seeds = seeds.path().to_path_buf();
            std::thread::spawn(move || {
                for db in chunk {
                    let seq: u128 = db[4..].parse().unwrap();
                    let seed = seeds.join(&db);
                    std::fs::write(&seed, b"").unwrap();
                    let body = Body::LinkTo(&seed);
                    write_files(&data, &db, "Messages", per_db, t0, seq, body);
                    if (seq as usize) < IN_ERROR / 2 {
                        let body = Body::Bytes(b"{}");
                        write_files(&data, &db, "Error", 2, t0, seq + 100_000, body);
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let written = written.elapsed();
    println!(
        "{devices} devices and {databases} databases registered in {registered:.1?}; \
         {} messages written in {written:.1?}",
        per_db * databases
    );

    let session = login(&server).await;
    let pages = [
        "/admin".to_owned(),
        "/admin/processes".to_owned(),
        "/admin/databases".to_owned(),
        format!("/admin/databases?after={}", dbs[databases / 2]),
        "/admin/databases?q=bdb-00".to_owned(),
        "/admin/devices".to_owned(),
        format!("/admin/devices?after=bdev-{:05}", devices / 2),
        "/admin/devices?q=bdev-0001".to_owned(),
        "/admin/browse/Unknown".to_owned(),
        "/admin/browse/Error".to_owned(),
        "/admin/browse/Error?page=1".to_owned(),
        "/admin/browse/Error?q=bdb-0001".to_owned(),
        "/admin/alerts".to_owned(),
        "/admin/events".to_owned(),
        "/admin/queues".to_owned(),
        "/admin/deliveries".to_owned(),
        "/metrics".to_owned(),
    ];
    let get = |path: String| {
        let req = http().get(server.url(&path)).header(COOKIE, &session);
        async move {
            let started = Instant::now();
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            let body = r.text().await.unwrap();
            (started.elapsed(), body)
        }
    };
    // The first view builds the folder indexes; then the steady state.
    let (first, overview) = get("/admin".to_owned()).await;
    println!("first overview (folder indexes built): {first:.1?}");
    let waiting = format!("id=\"waiting\">{}<", per_db * databases);
    assert!(overview.contains(&waiting), "{waiting} not in the overview");
    let error = format!("id=\"folder-total\">{IN_ERROR}<");
    let (_, browser) = get("/admin/browse/Error".to_owned()).await;
    assert!(browser.contains(&error), "{error} not in the Error browser");
    assert!(browser.contains("id=\"next-page\""));
    let (_, found) = get("/admin/devices?q=bdev-00012".to_owned()).await;
    assert!(found.contains("id=\"device-bdev-00012\""));
    assert!(!found.contains("id=\"device-bdev-00013\""));

    println!("| page | bytes | p50 | p99 |\n|---|---|---|---|");
    for path in pages {
        let mut times = Vec::with_capacity(rounds);
        let mut bytes = 0;
        for _ in 0..rounds {
            let (took, body) = get(path.clone()).await;
            bytes = body.len();
            times.push(took);
        }
        times.sort();
        assert!(bytes < MOST_BYTES, "{path}: {bytes} bytes");
        println!(
            "| `{path}` | {bytes} | {:.1?} | {:.1?} |",
            quantile(&times, 0.5),
            quantile(&times, 0.99)
        );
    }
    server.stop().await.unwrap();
}
