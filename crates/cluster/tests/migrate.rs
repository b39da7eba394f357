//! The schema: applied once by concurrent starts, and shaped so that hot
//! queries read only what they return.

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
    assert_eq!(applied, 1);
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

/// `start` reads the oldest waiting messages of one database: with 20,000
/// messages waiting (and as many for another database) the index scan reads
/// exactly as many rows as the call returns, as it would with 10 waiting.
#[tokio::test]
async fn start_reads_only_the_rows_it_returns_whatever_the_queue_length() {
    let pg = Postgres::start().unwrap();
    let store = Store::connect(&pg.url()).unwrap();
    store.migrate().await.unwrap();
    let client = store.client().await.unwrap();
    client
        .batch_execute(
            "INSERT INTO enterprises VALUES ('acme', 0);
             INSERT INTO subsystems VALUES ('acme', 'sales', 0);
             INSERT INTO mailboxes (id, kind, enterprise_id, subsystem_id, token_hash, created_at)
               VALUES ('db-a', 'database', 'acme', NULL, '\\x01', 0),
                      ('db-b', 'database', 'acme', NULL, '\\x02', 0),
                      ('phone-1', 'device', 'acme', 'sales', '\\x03', 0);
             INSERT INTO messages (id, owner, place, sender, recipient, subsystem, created_at, placed_at, size, body)
               SELECT format('m%s-%s', db, i), db, 'Messages', 'phone-1', db, 'sales', i, i, 100, '\\x7b7d'
               FROM generate_series(1, 20000) AS i, unnest(ARRAY['db-a', 'db-b']) AS db;
             ANALYZE messages;",
        )
        .await
        .unwrap();
    let rows = client
        .simple_query(
            "EXPLAIN (ANALYZE, FORMAT JSON)
             SELECT id, size FROM messages
             WHERE owner = 'db-a' AND place = 'Messages'
             ORDER BY created_at, id LIMIT 10",
        )
        .await
        .unwrap();
    let text = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap();
    let plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut nodes = Vec::new();
    collect_nodes(&plan[0]["Plan"], &mut nodes);
    let scan = nodes
        .iter()
        .find(|n| {
            n["Node Type"]
                .as_str()
                .is_some_and(|t| t.starts_with("Index"))
        })
        .unwrap_or_else(|| panic!("no index scan in {text}"));
    assert_eq!(scan["Index Name"], "messages_folder", "{text}");
    assert_eq!(scan["Actual Rows"], 10, "{text}");
    assert!(
        nodes
            .iter()
            .all(|n| n["Node Type"] != "Sort" && n["Node Type"] != "Seq Scan"),
        "{text}"
    );
}

/// Every node of an EXPLAIN plan, depth first.
fn collect_nodes<'a>(node: &'a serde_json::Value, into: &mut Vec<&'a serde_json::Value>) {
    into.push(node);
    for child in node["Plans"].as_array().into_iter().flatten() {
        collect_nodes(child, into);
    }
}
