//! The schema: applied once by concurrent starts.

use estafeta_postgres::Store;
use estafeta_postgres::testing::Postgres;

#[tokio::test]
async fn nodes_starting_at_once_apply_the_schema_exactly_once() {
    let pg = Postgres::start().unwrap();
    // Separate pools, as separate nodes would have.
    let nodes: Vec<Store> = (0..6).map(|_| Store::connect(&pg.url()).unwrap()).collect();
    let runs: Vec<_> = nodes
        .iter()
        .map(|n| {
            let n = n.clone();
            tokio::spawn(async move { n.migrate().await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    let client = nodes[0].client().await.unwrap();
    let applied: i64 = client
        .query_one("SELECT count(*) FROM refinery_schema_history", &[])
        .await
        .unwrap()
        .get(0);
    // Each migration once.
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .count();
    assert_eq!(applied, i64::try_from(files).unwrap());
    // And again later (a node restarting): nothing to do.
    nodes[1].migrate().await.unwrap();
    let generation: i64 = client
        .query_one(
            "SELECT value FROM cluster_counters WHERE name = 'generation'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(generation, 0, "the seed row was inserted once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_run_whose_connection_is_lost_is_an_unavailable_store() {
    let pg = Postgres::start().unwrap();
    let first = Store::connect(&pg.url()).unwrap();
    first.migrate().await.unwrap();
    // The migrations' history locked by another session: the next run
    // waits inside the migration runner, where its connection is then
    // ended (as a failover or a network fault would end it).
    let mut holder = first.client().await.unwrap();
    let locking = holder.transaction().await.unwrap();
    locking
        .batch_execute("LOCK TABLE refinery_schema_history IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let node = Store::connect(&pg.url()).unwrap();
    let run = tokio::spawn(async move { node.migrate().await });
    let admin = Store::connect(&pg.url()).unwrap();
    let admin = admin.client().await.unwrap();
    let waiting = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
        WHERE wait_event_type = 'Lock' AND query LIKE '%refinery_schema_history%'";
    let began = std::time::Instant::now();
    while admin.query(waiting, &[]).await.unwrap().is_empty() {
        assert!(
            began.elapsed() < std::time::Duration::from_secs(60),
            "the migration never waited for the lock"
        );
        tokio::task::yield_now().await;
    }
    let lost = run.await.unwrap().unwrap_err();
    assert!(lost.is_unavailable(), "{lost}");
    locking.rollback().await.unwrap();
}
