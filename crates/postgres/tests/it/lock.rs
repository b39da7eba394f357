//! Cross-node exclusivity: two pools (two nodes) contend for one key.

use crate::common::{bounded, until_waiting_for_lock};
use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{Locked, Options, Store};
use std::time::Duration;

async fn node(pg: &Postgres, options: &Options) -> Store {
    let store = Store::connect_with(&pg.url(), options).unwrap();
    store.migrate().await.unwrap();
    store
}

/// A fresh instance and one node of it (the instance lives as long as the
/// pair is kept).
async fn one_node() -> (Postgres, Store) {
    let pg = Postgres::start().unwrap();
    let store = node(&pg, &Options::default()).await;
    (pg, store)
}

/// A statement of `step` fails and its error is overlooked: the server
/// rolls the step's transaction back, which its commit must reveal.
async fn overlook_a_failed_statement(step: &Locked) {
    let failed = step
        .client()
        .execute("SELECT no_such_column FROM sessions", &[])
        .await;
    assert!(failed.is_err());
}

async fn record(store: &Store, key: &[u8]) -> Option<Vec<u8>> {
    let step = bounded("the key", store.lock(key)).await.unwrap();
    let record = step.record().map(<[u8]>::to_vec);
    step.commit().await.unwrap();
    record
}

#[tokio::test]
async fn a_second_node_waits_and_then_sees_the_first_nodes_commit() {
    let (pg, a) = one_node().await;
    let b = node(&pg, &Options::default()).await;

    let mut held = a.lock(b"db-a").await.unwrap();
    let contender = tokio::spawn({
        let b = b.clone();
        async move {
            let mut step = b.lock(b"db-a").await.unwrap();
            let seen = step.record().map(<[u8]>::to_vec);
            step.save(b"second", None).await.unwrap();
            step.commit().await.unwrap();
            seen
        }
    });
    until_waiting_for_lock(&a, 1).await;
    assert!(!contender.is_finished());
    held.save(b"first", None).await.unwrap();
    held.commit().await.unwrap();

    assert_eq!(
        bounded("the contender", contender)
            .await
            .unwrap()
            .as_deref(),
        Some(&b"first"[..])
    );
    assert_eq!(record(&a, b"db-a").await.as_deref(), Some(&b"second"[..]));
}

#[tokio::test]
async fn other_keys_do_not_wait() {
    let (_pg, a) = one_node().await;
    let mut held = a.lock(b"db-a").await.unwrap();
    let mut other = bounded("another key", a.lock(b"db-b")).await.unwrap();
    other.save(b"free", None).await.unwrap();
    other.commit().await.unwrap();
    // The first key's holder was not cut off meanwhile (as it is after
    // sitting idle past its hold limit, which a lock waiting for its key
    // would have let pass).
    held.save(b"held", None).await.unwrap();
    held.commit().await.unwrap();
}

#[tokio::test]
async fn a_step_dropped_or_cut_off_leaves_nothing_and_frees_the_key() {
    let pg = Postgres::start().unwrap();
    // One connection: the next step of this node gets whatever connection
    // the dropped step left behind.
    let a = node(
        &pg,
        &Options {
            pool_size: 1,
            ..Options::default()
        },
    )
    .await;
    let b = node(&pg, &Options::default()).await;

    // Dropped without commit (the node's task failed or was cancelled).
    let mut step = a.lock(b"k").await.unwrap();
    step.save(b"uncommitted", None).await.unwrap();
    drop(step);
    assert_eq!(record(&a, b"k").await, None);
    assert_eq!(record(&b, b"k").await, None);

    // The holder's connection cut (the node died): the server ends its
    // transaction, the other node gets the key, the holder cannot commit.
    let mut step = a.lock(b"k").await.unwrap();
    step.save(b"from a dead node", None).await.unwrap();
    let pid: i32 = step
        .client()
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let admin = b.client().await.unwrap();
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    assert_eq!(record(&b, b"k").await, None);
    let err = step.commit().await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert_eq!(record(&b, b"k").await, None);
}

#[tokio::test]
async fn a_paused_holder_loses_the_key_and_cannot_overwrite_newer_state() {
    let pg = Postgres::start().unwrap();
    // The paused node: the server ends its session once it sits idle in
    // its transaction longer than its hold limit.
    let paused = node(
        &pg,
        &Options {
            hold_limit: Duration::from_millis(200),
            ..Options::default()
        },
    )
    .await;
    let live = node(&pg, &Options::default()).await;

    let mut stale = paused.lock(b"db-a").await.unwrap();
    stale.save(b"before the pause", None).await.unwrap();

    // The live node waits for the key only until the server ends the
    // paused session, then writes newer state.
    let mut step = bounded("the key of a paused holder", live.lock(b"db-a"))
        .await
        .unwrap();
    assert_eq!(step.record(), None);
    step.save(b"newer", None).await.unwrap();
    step.commit().await.unwrap();

    // The paused node resumes: neither its write nor its commit lands.
    assert!(
        stale
            .save(b"stale", None)
            .await
            .unwrap_err()
            .is_unavailable()
    );
    assert!(stale.commit().await.unwrap_err().is_unavailable());
    assert_eq!(record(&live, b"db-a").await.as_deref(), Some(&b"newer"[..]));
}

#[tokio::test]
async fn a_step_whose_statement_failed_does_not_commit() {
    let (_pg, a) = one_node().await;
    let mut step = a.lock(b"k").await.unwrap();
    step.save(b"half a step", None).await.unwrap();
    overlook_a_failed_statement(&step).await;
    assert!(
        step.commit().await.is_err(),
        "a silent rollback must not pass as a commit"
    );
    assert_eq!(record(&a, b"k").await, None);
}

#[tokio::test]
async fn a_save_after_a_failed_statement_does_not_commit() {
    let (_pg, a) = one_node().await;
    let mut step = a.lock(b"k").await.unwrap();
    step.save(b"first", None).await.unwrap();
    step.commit().await.unwrap();

    let step = a.lock(b"k").await.unwrap();
    // The save sent with the COMMIT (no probe beside it) is what reveals
    // the overlooked failure.
    overlook_a_failed_statement(&step).await;
    assert!(
        step.save_and_commit(Some(b"second"), None).await.is_err(),
        "a silent rollback must not pass as a commit"
    );
    assert_eq!(record(&a, b"k").await.as_deref(), Some(&b"first"[..]));
}

/// The answer to a step's `COMMIT` is lost (the server committed, the
/// connection then failed): the step finds out on another connection that
/// it committed, and says so, rather than reporting a failure a caller
/// would undo by hand. A step whose transaction the server rolled back
/// still fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_was_lost_is_found_out() {
    let pg = Postgres::start().unwrap();
    let proxy = estafeta_postgres::testing::CommitLoss::start(
        format!("127.0.0.1:{}", pg.port()).parse().unwrap(),
    )
    .await
    .unwrap();
    let through = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
        proxy.port()
    );
    let options = Options {
        application_name: Some("node".into()),
        ..Options::default()
    };
    let node = Store::connect_with(&through, &options).unwrap();
    node.migrate().await.unwrap();
    let direct = Store::connect(&pg.url()).unwrap();

    let step = node.lock(b"k").await.unwrap();
    proxy.arm("node", 1);
    step.save_and_commit(Some(b"made"), None).await.unwrap();
    assert_eq!(proxy.dropped(), 1, "the answer was lost");
    assert_eq!(record(&direct, b"k").await.as_deref(), Some(&b"made"[..]));

    // The key is free again, and the node goes on.
    let mut step = node.lock(b"k").await.unwrap();
    assert_eq!(step.record(), Some(&b"made"[..]));
    step.save(b"again", None).await.unwrap();
    step.commit().await.unwrap();
    assert_eq!(record(&direct, b"k").await.as_deref(), Some(&b"again"[..]));
}
