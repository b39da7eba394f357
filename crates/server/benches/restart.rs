//! Time to ready after a `kill -9` as the process records in
//! `sessions.redb` grow (1,000 and 100,000: one real process's record
//! copied under new ids), against a start of the same data after a clean
//! stop, in the same run: redb repairs a file not closed cleanly at the
//! next open, which walks it. Also the time of `estafeta check` on the
//! crashed folder. The real binary (`estafeta serve`) over loopback HTTP.
//!
//! ```sh
//! cargo bench -p estafeta-server --bench restart
//! # RESTART_RECORDS=1000,100000 picks the sizes; BENCH_DIR the disk
//! # (default: the system temp folder); --profile dev for a debug build;
//! # ESTAFETA_TEST_BINARY names another server binary
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use estafeta_client::Client;
use estafeta_exchange::wire::ResultStatus;
use estafeta_exchange::{DataLayout, ProcessId};
use estafeta_server_harness::api::{Tenancy, committed_process, wait_ready};
use estafeta_server_harness::binary::{self, Program};
use estafeta_server_harness::measure::{bench_dir, sizes, two_threads};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

/// The `estafeta` binary built with this bench.
struct Estafeta;

impl Program for Estafeta {
    const BUILT: &'static str = env!("CARGO_BIN_EXE_estafeta");
}

/// The real binary, started by [`Binary::serve`].
type Binary = binary::Binary<Estafeta>;

const TOKEN: &str = "restart-bench-admin-0123456789abcdef012";
const SESSIONS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("sessions");
const DEADLINES: TableDefinition<'_, &[u8], u64> = TableDefinition::new("deadlines");

/// A start of the binary on `data` until `/readyz`: how long it took.
async fn start(dir: &Path, data: &Path) -> (Binary, Duration) {
    let began = Instant::now();
    let server = Binary::serve(dir, data, &[], &[("ESTAFETA_ADMIN_TOKEN", TOKEN)]).await;
    wait_ready(&Client::new(&server.base, TOKEN).unwrap()).await;
    (server, began.elapsed())
}

/// A data folder whose `sessions.redb` holds `records` process records
/// (one committed process's, copied under new ids), left by a clean stop.
async fn data_with(dir: &Path, data: &Path, records: u64) -> u64 {
    let (server, _) = start(dir, data).await;
    let admin = Client::new(&server.base, TOKEN).unwrap();
    let tenancy = Tenancy::provision(&admin).await;
    let (pid, _) = committed_process(&tenancy, ResultStatus::Processed).await;
    assert_eq!(server.terminate().await, Some(0));

    let sessions = DataLayout::new(data).sessions();
    let db = redb::Database::create(&sessions).unwrap();
    let (key, record, deadline) = {
        let read = db.begin_read().unwrap();
        let table = read.open_table(SESSIONS).unwrap();
        let pid = pid.to_string();
        let (key, record) = table
            .iter()
            .unwrap()
            .map(Result::unwrap)
            .map(|(k, v)| (k.value().to_vec(), v.value().to_vec()))
            .find(|(k, _)| k.ends_with(pid.as_bytes()))
            .expect("the process's record");
        let deadline = read
            .open_table(DEADLINES)
            .unwrap()
            .get(key.as_slice())
            .unwrap()
            .map(|d| d.value());
        (key, record, deadline)
    };
    let prefix = &key[..key.len() - pid.to_string().len()];
    let write = db.begin_write().unwrap();
    {
        let mut table = write.open_table(SESSIONS).unwrap();
        let mut deadlines = write.open_table(DEADLINES).unwrap();
        for i in 0..records {
            let id = ProcessId::from_parts(1_800_000_000_000 + i, u128::from(i));
            let mut k = prefix.to_vec();
            k.extend_from_slice(id.to_string().as_bytes());
            table.insert(k.as_slice(), record.as_slice()).unwrap();
            if let Some(d) = deadline {
                deadlines.insert(k.as_slice(), d).unwrap();
            }
        }
    }
    write.commit().unwrap();
    drop(db);
    std::fs::metadata(&sessions).unwrap().len()
}

async fn measure(base: &Path, records: u64) {
    let dir = tempfile::tempdir_in(base).unwrap();
    let data = dir.path().join("data");
    let size = data_with(dir.path(), &data, records).await;

    // The baseline: a start after a clean stop.
    let (server, clean) = start(dir.path(), &data).await;
    assert_eq!(server.terminate().await, Some(0));
    // A start killed: redb repairs the file at the next open, timed.
    let (server, _) = start(dir.path(), &data).await;
    server.kill9().await;
    let (server, killed) = start(dir.path(), &data).await;
    server.kill9().await;
    // `estafeta check` on the crashed folder (it repairs too).
    let began = Instant::now();
    let out = Binary::command(dir.path())
        .arg("check")
        .env("ESTAFETA_DATA_DIR", &data)
        .output()
        .await
        .unwrap();
    let check = began.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    println!(
        "{records} process records, sessions.redb {:.1} MiB: ready after kill -9 in {:.3} s, \
         after a clean stop in {:.3} s, ratio {:.2}; estafeta check {:.3} s",
        size as f64 / f64::from(1 << 20),
        killed.as_secs_f64(),
        clean.as_secs_f64(),
        killed.as_secs_f64() / clean.as_secs_f64(),
        check.as_secs_f64()
    );
}

fn main() {
    let runtime = two_threads();
    let base = bench_dir();
    for records in sizes("RESTART_RECORDS", &[1_000, 100_000]) {
        runtime.block_on(measure(Path::new(&base), records));
    }
}
