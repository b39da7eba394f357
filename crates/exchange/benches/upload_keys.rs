//! Keyed uploads as a device's idempotency keys pile up: the cost of an
//! upload with a new key, and of looking a key up, with 1,000 and with
//! 1,000,000 keys already stored for the same device. The baseline is the
//! same call at 1,000 keys in the same run; the ratio (1,000,000 ÷ 1,000)
//! goes to BENCHMARKS.md, with the key store's bytes per key.
//!
//! `cargo bench -p estafeta-exchange --bench upload_keys`
//! (`KEY_COUNTS=1000,100000` picks other sizes; `BENCH_DIR` the disk).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use estafeta_exchange::keys::{KeyedUpload, RedbKeys, UploadKeys};
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::{Body, SendMessage};
use estafeta_exchange::{DataLayout, Exchange, ExchangeConfig, Id, Sinks, Stores, Timestamp};
use estafeta_session::SystemClock;

const BODY: &str = r#"{"order":{"lines":[{"sku":"A-1","qty":2}],"note":"deliver before noon"}}"#;
/// Keys written per transaction while filling the store.
const FILL_BATCH: usize = 50_000;

static SEQ: AtomicU64 = AtomicU64::new(0);

fn counts() -> Vec<usize> {
    std::env::var("KEY_COUNTS")
        .ok()
        .map(|v| v.split(',').map(|n| n.trim().parse().unwrap()).collect())
        .unwrap_or_else(|| vec![1_000, 1_000_000])
}

/// `n` keys of `phone-1`, each naming a message file, valid for a week.
fn fill(keys: &RedbKeys, n: usize) {
    let phone = Id::new("phone-1").unwrap();
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let week = 7 * 24 * 3_600_000;
    let mut batch = Vec::with_capacity(FILL_BATCH);
    for i in 0..n {
        batch.push((
            phone.clone(),
            format!("filled-{i}"),
            KeyedUpload {
                name: format!("01JD6Y{:020}~phone-1~db-a~sales~1764064800000.json", i),
                at: now,
                expires_at: Timestamp::from_millis(now.as_millis() + week),
            },
        ));
        if batch.len() == FILL_BATCH {
            keys.put_all(&batch).unwrap();
            batch.clear();
        }
    }
    keys.put_all(&batch).unwrap();
}

/// An exchange on `data` with one enterprise, database and device; the
/// device's principal.
async fn exchange(data: &std::path::Path) -> (Exchange, Principal) {
    let mut config = ExchangeConfig::new(data);
    config.admin_token = Some("a".repeat(64));
    let clock: Arc<dyn estafeta_session::Clock> = Arc::new(SystemClock);
    let stores = Stores::embedded(data, clock.clone(), &Default::default())
        .await
        .unwrap();
    let (ex, _) = Exchange::open(config, clock, Sinks::default(), stores)
        .await
        .unwrap();
    ex.recover().await.unwrap();
    let admin = Principal::Admin;
    let id = |s: &str| Id::new(s).unwrap();
    ex.create_enterprise(&admin, id("acme")).await.unwrap();
    ex.create_subsystem(&admin, id("acme"), id("sales"))
        .await
        .unwrap();
    ex.create_database(&admin, id("acme"), id("db-a"))
        .await
        .unwrap();
    let token = ex
        .create_device(&admin, id("acme"), id("phone-1"), id("sales"))
        .await
        .unwrap();
    let phone = ex.authenticate(token.expose()).await.unwrap().unwrap();
    (ex, phone)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut group = c.benchmark_group("upload_keys");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(10));
    for n in counts() {
        let tmp = tempfile::tempdir_in(
            std::env::var_os("BENCH_DIR").unwrap_or_else(|| std::env::temp_dir().into()),
        )
        .unwrap();
        let data = tmp.path().join("data");
        let layout = DataLayout::new(&data);
        std::fs::create_dir_all(layout.state_dir()).unwrap();
        {
            let keys = RedbKeys::open(layout.keys()).unwrap();
            let filled = std::time::Instant::now();
            fill(&keys, n);
            let bytes = std::fs::metadata(layout.keys()).unwrap().len();
            eprintln!(
                "{n} keys: filled in {:.1?}, keys.redb {bytes} bytes ({} per key)",
                filled.elapsed(),
                bytes / n as u64
            );
            let phone = Id::new("phone-1").unwrap();
            let now = Timestamp::from_system_time(std::time::SystemTime::now());
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new("get", n), |b| {
                b.iter(|| {
                    i = (i + 7_919) % n;
                    keys.get(&phone, &format!("filled-{i}"), now).unwrap()
                })
            });
        }
        let (ex, phone) = rt.block_on(exchange(&data));
        group.bench_function(BenchmarkId::new("send_new_key", n), |b| {
            b.to_async(&rt).iter(|| async {
                let seq = SEQ.fetch_add(1, Ordering::Relaxed);
                let req =
                    SendMessage::new(Id::new("db-a").unwrap(), Body::from_json(BODY).unwrap())
                        .with_key(format!("bench-{seq}"));
                ex.send(&phone, req).await.unwrap()
            })
        });
        rt.block_on(ex.shutdown()).unwrap();
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
