//! The pause a backup makes (every durable write held back while the data
//! folder is copied), with 1,000 and 100,000 messages waiting, against
//! the backup an operator makes by hand on the same file system with the
//! server stopped: `cp -al` of the data folder (hard links), measured in
//! the same run on the same folder. The messages are written as the
//! message store's files while the exchange is closed (uploads would take
//! minutes); then the exchange opens on them and
//! `estafeta_server::backup::backup` copies the folder.
//!
//! ```sh
//! cargo bench -p estafeta-server --bench backup
//! # BACKUP_WAITING=1000,100000 picks the sizes; BENCH_DIR the disk
//! # (default: the system temp folder); --profile dev for a debug build
//! ```

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use estafeta_exchange::mailbox::FileName;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::{Body, Message, Version};
use estafeta_exchange::{Exchange, ExchangeConfig, Sinks, Timestamp, UlidGenerator};
use estafeta_server::events::{EventLogStore, EventStore, events_file};
use estafeta_server_harness::api::id;
use estafeta_server_harness::measure::{bench_dir, sizes, two_threads};

const ADMIN: &str = "backup-bench-admin-0123456789abcdef0123";

async fn open(data: &Path) -> Exchange {
    let mut config = ExchangeConfig::new(data);
    config.admin_token = Some(ADMIN.to_owned());
    let clock: Arc<dyn estafeta_session::Clock> = Arc::new(estafeta_session::SystemClock);
    let (exchange, _) = Exchange::open_embedded(config, clock, Sinks::default())
        .await
        .unwrap();
    exchange.recover().await.unwrap();
    exchange
}

/// A data folder with `db-a`, `phone-1` and `n` messages waiting in
/// `db-a/Messages`.
async fn data_with(data: &Path, n: usize) {
    let admin = Principal::Admin;
    let exchange = open(data).await;
    exchange
        .create_enterprise(&admin, id("acme"))
        .await
        .unwrap();
    exchange
        .create_subsystem(&admin, id("acme"), id("sales"))
        .await
        .unwrap();
    exchange
        .create_database(&admin, id("acme"), id("db-a"))
        .await
        .unwrap();
    exchange
        .create_device(&admin, id("acme"), id("phone-1"), id("sales"))
        .await
        .unwrap();
    exchange.shutdown().await.unwrap();
    drop(exchange);
    let queue = data.join("db-a").join("Messages");
    std::fs::create_dir_all(&queue).unwrap();
    let ids = UlidGenerator::new();
    for i in 0..n {
        let now = std::time::SystemTime::now();
        let m = Message {
            version: Version,
            id: ids.message_id(now),
            from: id("phone-1"),
            to: id("db-a"),
            subsystem: id("sales"),
            created_at: Timestamp::from_system_time(now),
            body: Body::from_json(format!(r#"{{"n":{i}}}"#)).unwrap(),
        };
        std::fs::write(
            queue.join(FileName::of(&m).to_string()),
            m.to_file_bytes().unwrap(),
        )
        .unwrap();
    }
}

fn main() {
    let runtime = two_threads();
    let base = bench_dir();
    for n in sizes("BACKUP_WAITING", &[1_000, 100_000]) {
        let n = usize::try_from(n).unwrap();
        let dir = tempfile::tempdir_in(&base).unwrap();
        let data = dir.path().join("data");
        runtime.block_on(data_with(&data, n));
        let report = runtime.block_on(async {
            let exchange = open(&data).await;
            // The server's event log, held back while its file is copied.
            let events: Arc<dyn EventLogStore> = EventStore::open(&events_file(&data)).unwrap();
            let report = estafeta_server::backup::backup(
                &exchange,
                &events,
                &Principal::Admin,
                &dir.path().join("copy"),
            )
            .await
            .unwrap();
            exchange.shutdown().await.unwrap();
            report
        });
        assert!(report.files as usize > n);
        // The baseline: the folder hard-linked by hand, the server stopped.
        let began = Instant::now();
        let ok = std::process::Command::new("cp")
            .arg("-al")
            .arg(&data)
            .arg(dir.path().join("by-hand"))
            .status()
            .unwrap();
        assert!(ok.success());
        let by_hand = began.elapsed().as_secs_f64();
        println!(
            "{n} messages waiting: {} files ({} linked, {} copied), writes paused {:.3} s; \
             cp -al {by_hand:.3} s; ratio {:.2}",
            report.files,
            report.linked,
            report.copied,
            report.paused_seconds,
            report.paused_seconds / by_hand
        );
    }
}
