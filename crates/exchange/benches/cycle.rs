//! Messages per second through the whole cycle with full durability —
//! device upload → start → prepare with one reply each → commit → the
//! device fetches and acknowledges the reply — at batch sizes 10 and 100,
//! against the floor measured in the same run on the same disk: one file
//! at a time created, fsynced, and its folder fsynced.
//!
//! It drives the exchange service directly (the server's HTTP layer adds
//! parsing but no I/O). Four databases, each with its own device, run their
//! cycles side by side, as processors of several databases do.
//!
//! `cargo bench -p estafeta-exchange --bench cycle`; ratios in BENCHMARKS.md.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::*;
use estafeta_exchange::{Exchange, ExchangeConfig, Id, mailbox::Limits};
use estafeta_session::SystemClock;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const BODY: &str = r#"{"order":{"lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"note":"deliver before noon"}}"#;
const LANES: usize = 4;

static SEQ: AtomicU64 = AtomicU64::new(0);

fn floor_write(dir: &Path) {
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let mut f = std::fs::File::create(dir.join(format!("floor-{seq}.msg"))).unwrap();
    f.write_all(BODY.as_bytes()).unwrap();
    f.sync_all().unwrap();
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
}

struct Lane {
    db: Principal,
    device: Principal,
    db_id: Id,
}

async fn setup(dir: &Path, batch: usize) -> (Exchange, Vec<Lane>) {
    let mut config = ExchangeConfig::new(dir.join("data"));
    config.admin_token = Some("b".repeat(64));
    config.limits = Limits::new(batch, 100.0).unwrap();
    let (ex, _) = Exchange::open(config, Arc::new(SystemClock)).await.unwrap();
    ex.recover().await.unwrap();
    let admin = Principal::Admin;
    let ent: Id = "acme".parse().unwrap();
    ex.create_enterprise(&admin, ent.clone()).await.unwrap();
    ex.create_subsystem(&admin, ent.clone(), "sales".parse().unwrap())
        .await
        .unwrap();
    let mut lanes = Vec::new();
    for i in 0..LANES {
        let db_id: Id = format!("db-{i}").parse().unwrap();
        let dev_id: Id = format!("phone-{i}").parse().unwrap();
        let t = ex
            .create_database(&admin, ent.clone(), db_id.clone())
            .await
            .unwrap();
        let d = ex
            .create_device(&admin, ent.clone(), dev_id, "sales".parse().unwrap())
            .await
            .unwrap();
        lanes.push(Lane {
            db: ex.authenticate(t.expose()).unwrap(),
            device: ex.authenticate(d.expose()).unwrap(),
            db_id,
        });
    }
    (ex, lanes)
}

/// One full cycle of `batch` messages on one lane.
async fn cycle(ex: &Exchange, lane: &Lane, batch: usize) {
    let mut uploads = tokio::task::JoinSet::new();
    for i in 0..batch {
        let req = SendMessage {
            version: Version,
            to: lane.db_id.clone(),
            body: Body::from_json(BODY).unwrap(),
            created_at: None,
            idempotency_key: Some(format!("k{}-{i}", SEQ.fetch_add(1, Ordering::Relaxed))),
        };
        let (ex, device) = (ex.clone(), lane.device.clone());
        uploads.spawn(async move { ex.send(&device, req).await.map(|_| ()) });
    }
    while let Some(r) = uploads.join_next().await {
        r.unwrap().unwrap();
    }
    let start = StartRequest {
        version: Version,
        db_id: lane.db_id.clone(),
        subsystems: None,
        senders: None,
        max_files: None,
        max_mb: None,
    };
    let s: StartResponse =
        serde_json::from_slice(&ex.start(&lane.db, start).await.unwrap()).unwrap();
    let messages = s.messages.unwrap_or_default();
    let pid = s.process_id.unwrap().to_string();
    let results = messages
        .iter()
        .map(|m| MessageResult {
            message_id: m.id,
            status: ResultStatus::Processed,
            error_code: None,
            error_text: None,
        })
        .collect();
    let replies = messages
        .iter()
        .map(|m| Reply {
            to: m.from.clone(),
            body: Body::from_json(BODY).unwrap(),
            created_at: None,
        })
        .collect();
    let r = ex
        .prepare(
            &lane.db,
            &pid,
            PrepareRequest {
                version: Version,
                results,
                replies,
            },
        )
        .await
        .unwrap();
    assert_eq!(r.status, CallStatus::Ok);
    let r = ex
        .commit(&lane.db, &pid, CommitRequest { version: Version })
        .await
        .unwrap();
    assert_eq!(r.status, CallStatus::Ok);
    let inbox: Inbox =
        serde_json::from_slice(&ex.inbox(&lane.device, None).await.unwrap()).unwrap();
    let ids = inbox.messages.iter().map(|m| m.id).collect();
    let acked = ex
        .ack(
            &lane.device,
            AckRequest {
                version: Version,
                ids,
            },
        )
        .await
        .unwrap();
    assert_eq!(acked.acked as usize, messages.len());
}

fn bench(c: &mut Criterion) {
    let base = std::env::var_os("BENCH_DIR").unwrap_or_else(|| std::env::temp_dir().into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("cycle");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(15));
    let floor_dir = tempfile::tempdir_in(&base).unwrap();
    group.throughput(Throughput::Elements(1));
    group.bench_function("floor_file_fsync_dirfsync", |b| {
        b.iter(|| floor_write(floor_dir.path()))
    });
    for batch in [10usize, 100] {
        let dir = tempfile::tempdir_in(&base).unwrap();
        let (ex, lanes) = rt.block_on(setup(dir.path(), batch));
        let lanes = Arc::new(lanes);
        group.throughput(Throughput::Elements((batch * LANES) as u64));
        group.bench_function(format!("batch_{batch}"), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let ex = ex.clone();
                let lanes = lanes.clone();
                async move {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let handles: Vec<_> = (0..LANES)
                            .map(|i| {
                                let ex = ex.clone();
                                let lanes = lanes.clone();
                                tokio::spawn(async move { cycle(&ex, &lanes[i], batch).await })
                            })
                            .collect();
                        for h in handles {
                            h.await.unwrap();
                        }
                    }
                    start.elapsed()
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
