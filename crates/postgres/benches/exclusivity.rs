//! The cost of one exclusive step (read a key's record, write it back)
//! under the two ways to make steps exclusive across nodes:
//!
//! - `row_lock`: the crate's primitive ([`Store::lock`]): the step's own
//!   transaction locks the key's row (`SELECT … FOR UPDATE`, pipelined with
//!   `BEGIN`), writes, commits. 3 round trips; `row_lock_pipelined` sends
//!   the write with the commit, as a session step's last save does: 2.
//! - `lease_fencing`: a lease row with an expiry and a fencing token, taken
//!   in its own transaction before the step and given back after it; the
//!   step's transaction checks the token (pipelined with `BEGIN`) so that a
//!   holder whose lease expired cannot write. 5 round trips.
//!
//! Both against a throwaway PostgreSQL on loopback, one client at a time,
//! so the figure is commits, round trips and server work, not contention:
//! once with durable commits (the row lock commits once per step, the
//! lease three times: take, step, give back) and once without waiting for
//! the WAL flush (round trips and server work alone).

use criterion::{Criterion, criterion_group, criterion_main};
use estafeta_postgres::Store;
use estafeta_postgres::testing::Postgres;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio_postgres::types::ToSql;

/// The lease table of the alternative (not part of the schema).
const LEASES: &str = "CREATE TABLE IF NOT EXISTS leases (
    key bytea PRIMARY KEY, holder text, token bigint NOT NULL, expires_at bigint NOT NULL)";
const ACQUIRE: &str =
    "INSERT INTO leases AS l (key, holder, token, expires_at) VALUES ($1, $2, 1, $3)
    ON CONFLICT (key) DO UPDATE SET holder = $2, token = l.token + 1, expires_at = $3
    WHERE l.holder IS NULL OR l.expires_at < $4
    RETURNING token";
const FENCE: &str = "SELECT 1 FROM leases WHERE key = $1 AND token = $2 FOR SHARE";
const READ: &str = "SELECT record FROM sessions WHERE key = $1";
const WRITE: &str = "UPDATE sessions SET record = $2 WHERE key = $1";
const RELEASE: &str = "UPDATE leases SET holder = NULL WHERE key = $1 AND token = $2";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

async fn row_lock(store: &Store, key: &[u8]) {
    let mut step = store.lock(key).await.unwrap();
    let next = step.record().map_or(0, |r| r[0].wrapping_add(1));
    step.save(&[next], None).await.unwrap();
    step.commit().await.unwrap();
}

/// `row_lock` with the save, the probe and the `COMMIT` sent together
/// ([`estafeta_postgres::Locked::save_and_commit`]): 2 round trips.
async fn row_lock_pipelined(store: &Store, key: &[u8]) {
    let step = store.lock(key).await.unwrap();
    let next = step.record().map_or(0, |r| r[0].wrapping_add(1));
    step.save_and_commit(Some(&[next]), None).await.unwrap();
}

async fn lease_fencing(store: &Store, key: &[u8]) {
    let client = store.client().await.unwrap();
    let (acquire, fence, read, write, release) = (
        client.prepare_cached(ACQUIRE).await.unwrap(),
        client.prepare_cached(FENCE).await.unwrap(),
        client.prepare_cached(READ).await.unwrap(),
        client.prepare_cached(WRITE).await.unwrap(),
        client.prepare_cached(RELEASE).await.unwrap(),
    );
    let now = now_ms();
    let token: i64 = client
        .query_one(&acquire, &[&key, &"bench", &(now + 10_000), &now])
        .await
        .unwrap()
        .get(0);
    let fence_params: [&(dyn ToSql + Sync); 2] = [&key, &token];
    let read_params: [&(dyn ToSql + Sync); 1] = [&key];
    let (begun, fenced, row) = tokio::join!(
        client.batch_execute("BEGIN"),
        client.query_one(&fence, &fence_params),
        client.query_one(&read, &read_params)
    );
    begun.unwrap();
    fenced.unwrap();
    let record: Option<Vec<u8>> = row.unwrap().get(0);
    let next = record.map_or(0, |r| r[0].wrapping_add(1));
    client.execute(&write, &[&key, &vec![next]]).await.unwrap();
    client.batch_execute("COMMIT").await.unwrap();
    client.execute(&release, &[&key, &token]).await.unwrap();
}

fn exclusivity(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Durable commits (as in production: each commit waits for its WAL
    // flush), and the same without waiting for the flush, which leaves the
    // round trips and the server's work. Each mode on a fresh instance, so
    // that neither inherits the other's table bloat or pending WAL.
    for (mode, settings) in [
        ("durable", ""),
        ("no_flush_wait", "?options=-c%20synchronous_commit%3Doff"),
    ] {
        let pg = Postgres::start().unwrap();
        let store = Store::connect(&format!("{}{settings}", pg.url())).unwrap();
        runtime.block_on(async {
            store.migrate().await.unwrap();
            let client = store.client().await.unwrap();
            client.batch_execute(LEASES).await.unwrap();
            // Both keys exist before measuring: neither pays a first insert.
            row_lock(&store, b"row").await;
            row_lock(&store, b"lease").await;
            lease_fencing(&store, b"lease").await;
        });
        let mut group = c.benchmark_group(format!("exclusive_step/{mode}"));
        group.bench_function("row_lock", |b| {
            b.to_async(&runtime).iter(|| row_lock(&store, b"row"))
        });
        group.bench_function("row_lock_pipelined", |b| {
            b.to_async(&runtime)
                .iter(|| row_lock_pipelined(&store, b"row"))
        });
        group.bench_function("lease_fencing", |b| {
            b.to_async(&runtime)
                .iter(|| lease_fencing(&store, b"lease"))
        });
        group.finish();
    }
}

criterion_group!(benches, exclusivity);
criterion_main!(benches);
