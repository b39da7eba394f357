//! Upload idempotency keys over PostgreSQL: the same contract as the
//! embedded key store, and one row when two nodes write one key at once.

use crate::common::store;
use estafeta_exchange::keys::{KeyedUpload, UploadKeys};
use estafeta_exchange::store::conformance::upload_keys_contract;
use estafeta_exchange::{Id, Timestamp};
use estafeta_postgres::PgKeys;
use estafeta_postgres::testing::Postgres;
use std::sync::{Arc, Barrier};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_keys_keep_the_upload_keys_contract() {
    let pg = Postgres::start().unwrap();
    let keys = PgKeys::new(store(&pg).await);
    tokio::task::spawn_blocking(move || upload_keys_contract(&keys))
        .await
        .unwrap();
}

/// Two nodes (two pools) write the same key at the same moment, many times
/// over: each time one row, and both nodes then read the same upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_writing_one_key_leave_one_upload_both_read() {
    let pg = Postgres::start().unwrap();
    let nodes = [
        Arc::new(PgKeys::new(store(&pg).await)),
        Arc::new(PgKeys::new(store(&pg).await)),
    ];
    let phone = Id::new("phone-1").unwrap();
    let upload = |node: i64| KeyedUpload {
        name: format!("upload-by-node-{node}"),
        at: Timestamp::from_millis(node),
        expires_at: Timestamp::from_millis(1_000_000),
    };
    for round in 0..20 {
        let key = format!("k{round}");
        let start = Arc::new(Barrier::new(2));
        let writers: Vec<_> = nodes
            .iter()
            .enumerate()
            .map(|(n, keys)| {
                let (keys, start, phone, key) =
                    (keys.clone(), start.clone(), phone.clone(), key.clone());
                let mine = upload(n as i64);
                tokio::task::spawn_blocking(move || {
                    start.wait();
                    keys.put(&phone, &key, &mine).unwrap();
                })
            })
            .collect();
        for w in writers {
            w.await.unwrap();
        }
        let seen: Vec<Option<KeyedUpload>> = {
            let (nodes, phone, key) = (nodes.clone(), phone.clone(), key.clone());
            tokio::task::spawn_blocking(move || {
                nodes
                    .iter()
                    .map(|k| k.get(&phone, &key, Timestamp::from_millis(0)).unwrap())
                    .collect()
            })
            .await
            .unwrap()
        };
        assert!(
            seen[0] == Some(upload(0)) || seen[0] == Some(upload(1)),
            "{seen:?}"
        );
        assert_eq!(seen[0], seen[1]);
    }
    let keys = nodes[0].clone();
    let count = tokio::task::spawn_blocking(move || keys.len().unwrap())
        .await
        .unwrap();
    assert_eq!(count, 20);
}
