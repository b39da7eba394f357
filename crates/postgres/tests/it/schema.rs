//! Guarantees the schema itself gives: uniqueness the protocol relies on is
//! an index, a removed mailbox takes its messages along and refuses new
//! ones, and due rows are claimed by one node each.

use estafeta_postgres::Store;
use estafeta_postgres::testing::Postgres;

const TENANCY: &str = "INSERT INTO enterprises VALUES ('acme', 0);
    INSERT INTO subsystems VALUES ('acme', 'sales', 0);
    INSERT INTO mailboxes (id, kind, enterprise_id, subsystem_id, token_hash, created_at)
      VALUES ('db-a', 'database', 'acme', NULL, '\\x01', 0),
             ('phone-1', 'device', 'acme', 'sales', '\\x02', 0);
    INSERT INTO message_owners VALUES ('db-a'), ('phone-1');";

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
async fn one_message_per_idempotency_key_and_none_for_a_removed_mailbox() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;
    let client = store.client().await.unwrap();
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

    // A message and a scheduled message reference their mailbox: removed,
    // it takes them along, and a later one for it is refused.
    let message = "INSERT INTO messages (id, owner, place, sender, recipient, subsystem,
                     created_at, size, body)
                   VALUES ($1, 'db-a', 'Messages', 'phone-1', 'db-a', 'sales', 0, 2, '\\x7b7d')";
    let scheduled = "INSERT INTO repeat_entries (id, source, due, attempt, payload, owner)
                      VALUES ($1, 'deliver_at', 0, 0, '\\x7b7d', 'db-a')";
    client.execute(message, &[&"m1"]).await.unwrap();
    client.execute(scheduled, &[&"e1"]).await.unwrap();
    client
        .execute("DELETE FROM message_owners WHERE id = 'db-a'", &[])
        .await
        .unwrap();
    let left: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM messages) + (SELECT count(*) FROM repeat_entries)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    let refused = client.execute(message, &[&"m2"]).await.unwrap_err();
    assert_eq!(sqlstate(&refused), Some("23503"), "{refused}");
    let refused = client.execute(scheduled, &[&"e2"]).await.unwrap_err();
    assert_eq!(sqlstate(&refused), Some("23503"), "{refused}");
}

/// Two nodes poll for due session deadlines at the same moment (the
/// session storage's claim): each due key goes to exactly one of them,
/// and a key whose claimer rolled back (died) is due again.
#[tokio::test]
async fn due_deadlines_are_claimed_by_one_node_each() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;
    let setup = store.client().await.unwrap();
    setup
        .batch_execute(
            "INSERT INTO sessions (key, record, expires_at)
               SELECT convert_to(format('db/db-%s', i), 'UTF8'), '\\x00', i * 10
               FROM generate_series(1, 10) AS i;",
        )
        .await
        .unwrap();
    let claim = "SELECT key FROM sessions WHERE expires_at <= $1 AND record IS NOT NULL
                 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED";
    let now: i64 = 100;
    let mut node_a = store.client().await.unwrap();
    let mut node_b = store.client().await.unwrap();
    let a = node_a.transaction().await.unwrap();
    let b = node_b.transaction().await.unwrap();
    let keys = |rows: Vec<tokio_postgres::Row>| -> Vec<Vec<u8>> {
        rows.iter().map(|r| r.get(0)).collect()
    };
    let claimed_a = keys(a.query(claim, &[&now, &6i64]).await.unwrap());
    let claimed_b = keys(b.query(claim, &[&now, &6i64]).await.unwrap());
    assert_eq!(claimed_a.len(), 6);
    assert_eq!(
        claimed_b.len(),
        4,
        "only the rows the first node did not take"
    );
    assert!(claimed_b.iter().all(|k| !claimed_a.contains(k)));

    // Node A does its work and clears the deadlines; node B dies mid-work.
    a.execute(
        "UPDATE sessions SET expires_at = NULL WHERE key = ANY($1)",
        &[&claimed_a],
    )
    .await
    .unwrap();
    a.commit().await.unwrap();
    // Its transaction ends as a dead node's does, by the server rolling it
    // back; awaited, so the next claim does not race the rollback (a
    // dropped transaction sends its `ROLLBACK` without waiting for it).
    b.rollback().await.unwrap();

    let mut node_c = store.client().await.unwrap();
    let c = node_c.transaction().await.unwrap();
    let mut again = keys(c.query(claim, &[&now, &10i64]).await.unwrap());
    again.sort();
    let mut expected = claimed_b.clone();
    expected.sort();
    assert_eq!(
        again, expected,
        "the dead node's rows are due again, the done ones are not"
    );
}
