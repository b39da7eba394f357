//! Guarantees the schema itself gives: uniqueness the protocol relies on is
//! an index, and due rows are claimed by one node each.

use estafeta_cluster::Store;
use estafeta_cluster::testing::Postgres;

const TENANCY: &str = "INSERT INTO enterprises VALUES ('acme', 0);
    INSERT INTO subsystems VALUES ('acme', 'sales', 0);
    INSERT INTO mailboxes (id, kind, enterprise_id, subsystem_id, token_hash, created_at)
      VALUES ('db-a', 'database', 'acme', NULL, '\\x01', 0),
             ('phone-1', 'device', 'acme', 'sales', '\\x02', 0);";

async fn store(pg: &Postgres) -> Store {
    let store = Store::connect(&pg.url()).unwrap();
    store.migrate().await.unwrap();
    store
        .client()
        .await
        .unwrap()
        .batch_execute(TENANCY)
        .await
        .unwrap();
    store
}

fn sqlstate(e: &tokio_postgres::Error) -> Option<&str> {
    e.code().map(|c| c.code())
}

#[tokio::test]
async fn one_live_process_per_database_and_one_message_per_idempotency_key() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;
    let client = store.client().await.unwrap();
    let start = "INSERT INTO processes (id, db_id, state, started_at, updated_at, deadline)
                 VALUES ($1, 'db-a', $2, 0, 0, 1000)";
    client.execute(start, &[&"p1", &"STARTED"]).await.unwrap();
    let busy = client
        .execute(start, &[&"p2", &"STARTED"])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&busy), Some("23505"), "{busy}");
    // An ended process does not count: the next one starts.
    client
        .execute(
            "UPDATE processes SET state = 'DONE', deadline = NULL WHERE id = 'p1'",
            &[],
        )
        .await
        .unwrap();
    client.execute(start, &[&"p2", &"STARTED"]).await.unwrap();

    let upload = "INSERT INTO idempotency_keys (device_id, key, name, at, expires_at)
                  VALUES ('phone-1', 'k1', $1, 0, 1000) ON CONFLICT DO NOTHING";
    assert_eq!(client.execute(upload, &[&"m1"]).await.unwrap(), 1);
    assert_eq!(client.execute(upload, &[&"m2"]).await.unwrap(), 0);
    let kept: String = client
        .query_one("SELECT name FROM idempotency_keys WHERE key = 'k1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, "m1");
}

/// Two nodes poll for due deadlines at the same moment: each due row goes
/// to exactly one of them, and a row whose claimer rolled back (died) is
/// due again.
#[tokio::test]
async fn due_deadlines_are_claimed_by_one_node_each() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;
    let setup = store.client().await.unwrap();
    setup
        .batch_execute(
            "INSERT INTO mailboxes (id, kind, enterprise_id, subsystem_id, token_hash, created_at)
               SELECT format('db-%s', i), 'database', 'acme', NULL, int4send(i), 0
               FROM generate_series(1, 10) AS i;
             INSERT INTO processes (id, db_id, state, started_at, updated_at, deadline)
               SELECT format('p%s', i), format('db-%s', i), 'STARTED', 0, 0, i * 10
               FROM generate_series(1, 10) AS i;",
        )
        .await
        .unwrap();
    let claim = "SELECT id FROM processes WHERE deadline <= $1
                 ORDER BY deadline LIMIT $2 FOR UPDATE SKIP LOCKED";
    let now: i64 = 100;
    let mut node_a = store.client().await.unwrap();
    let mut node_b = store.client().await.unwrap();
    let a = node_a.transaction().await.unwrap();
    let b = node_b.transaction().await.unwrap();
    let ids =
        |rows: Vec<tokio_postgres::Row>| -> Vec<String> { rows.iter().map(|r| r.get(0)).collect() };
    let claimed_a = ids(a.query(claim, &[&now, &6i64]).await.unwrap());
    let claimed_b = ids(b.query(claim, &[&now, &6i64]).await.unwrap());
    assert_eq!(claimed_a.len(), 6);
    assert_eq!(
        claimed_b.len(),
        4,
        "only the rows the first node did not take"
    );
    assert!(claimed_b.iter().all(|id| !claimed_a.contains(id)));

    // Node A does its work and clears the deadlines; node B dies mid-work.
    a.execute(
        "UPDATE processes SET state = 'TIMED_OUT', deadline = NULL, ended_at = $1 WHERE id = ANY($2)",
        &[&now, &claimed_a],
    )
    .await
    .unwrap();
    a.commit().await.unwrap();
    drop(b);

    let mut node_c = store.client().await.unwrap();
    let c = node_c.transaction().await.unwrap();
    let mut again = ids(c.query(claim, &[&now, &10i64]).await.unwrap());
    again.sort();
    let mut expected = claimed_b.clone();
    expected.sort();
    assert_eq!(
        again, expected,
        "the dead node's rows are due again, the done ones are not"
    );
}
