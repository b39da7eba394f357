//! The schema: applied once by concurrent starts.

use estafeta_cluster::Store;
use estafeta_cluster::testing::Postgres;

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
