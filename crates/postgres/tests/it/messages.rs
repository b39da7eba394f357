//! The exchange's message store over PostgreSQL: the same contract as the
//! embedded file store, a batch all or nothing, and `start`'s query one
//! index range scan that reads only what it returns.

use crate::common::id;
use estafeta_exchange::store::conformance::message_store_contract;
use estafeta_exchange::store::{
    FileName, Folder, Location, MessageReads, MessageSteps, MessageUpkeep, Op,
};
use estafeta_exchange::wire::{Body, Message, Version};
use estafeta_exchange::{Id, MessageId, Timestamp};
use estafeta_postgres::testing::{MESSAGES_MOVE, MESSAGES_SELECT, Postgres};
use estafeta_postgres::{PgMessages, PgSchedule, Store};
use std::sync::Arc;

/// The store migrated, with the mailboxes the tests write to made.
async fn store(pg: &Postgres) -> Store {
    let store = Store::connect(&pg.url()).unwrap();
    store.migrate().await.unwrap();
    let owners: Vec<Id> = ["db-a", "db-b"]
        .into_iter()
        .map(str::to_owned)
        .chain((0..10).map(|d| format!("phone-{d}")))
        .map(|o| id(&o))
        .collect();
    for made in PgMessages::new(store.clone())
        .create_mailboxes(&owners)
        .await
    {
        made.unwrap();
    }
    store
}

fn message(seq: u64, to: &str, subsystem: &str) -> Message {
    Message {
        version: Version,
        id: MessageId::from_parts(1_764_064_800_000 + seq, u128::from(seq)),
        from: id("phone-1"),
        to: id(to),
        subsystem: id(subsystem),
        created_at: Timestamp::from_millis(1_764_064_800_000),
        body: Body::from_json(r#"{"n":1}"#).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_messages_keep_the_message_store_contract() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;
    let kept = Arc::new(PgSchedule::new(store.clone()));
    message_store_contract(&PgMessages::new(store), kept).await;
}

/// A statement that fails half-way through a batch (here a constraint the
/// test adds) leaves every message of the batch where it was; `put_all`
/// likewise writes all of its messages or none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_and_a_put_all_are_all_or_nothing() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;
    store
        .client()
        .await
        .unwrap()
        .batch_execute(
            "ALTER TABLE messages ADD CONSTRAINT no_poison
               CHECK (owner <> 'poison' AND subsystem <> 'poison')",
        )
        .await
        .unwrap();
    let messages = PgMessages::new(store);
    messages.create_mailbox(&id("poison")).await.unwrap();
    let queue = Location::new(id("db-a"), Folder::Messages);
    let log = Location::new(id("db-a"), Folder::Log);
    let (a, b) = (message(1, "db-a", "sales"), message(2, "db-a", "sales"));
    messages
        .put_all(&queue, &[a.clone(), b.clone()], go())
        .await
        .unwrap();

    let applied = messages
        .apply(
            None,
            &[
                Op::Move {
                    name: FileName::of(&a),
                    from: queue.clone(),
                    to: log.clone(),
                },
                Op::Move {
                    name: FileName::of(&b),
                    from: queue.clone(),
                    to: Location::new(id("poison"), Folder::Messages),
                },
                Op::Delete {
                    name: FileName::of(&b),
                    at: queue.clone(),
                },
            ],
        )
        .await;
    assert_eq!(applied.results.len(), 3);
    assert!(applied.results.iter().all(Result::is_err), "{applied:?}");
    assert!(applied.arrivals.is_empty());
    assert_eq!(messages.count(&queue).await.unwrap(), 2);
    assert_eq!(messages.count(&log).await.unwrap(), 0);

    let fresh = [
        message(3, "db-a", "sales"),
        message(4, "db-a", "poison"),
        message(5, "db-a", "sales"),
    ];
    let inbox = Location::new(id("db-b"), Folder::Messages);
    assert!(messages.put_all(&inbox, &fresh, go()).await.is_err());
    assert_eq!(messages.count(&inbox).await.unwrap(), 0);
}

/// A batch handed over with a step that no longer holds its key (it lost
/// it, or its command gave it up) writes nothing, not even in a
/// transaction of its own: its command's view of the session may be stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_lost_its_key_moves_nothing() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;
    let sessions = estafeta_postgres::SessionStorage::open(store.clone())
        .await
        .unwrap();
    let messages = PgMessages::new(store);
    let queue = Location::new(id("db-a"), Folder::Messages);
    let log = Location::new(id("db-a"), Folder::Log);
    let a = message(1, "db-a", "sales");
    messages
        .put_all(&queue, std::slice::from_ref(&a), go())
        .await
        .unwrap();
    let mut step = estafeta_session::Storage::shared(&sessions)
        .unwrap()
        .begin(b"db/db-a")
        .await
        .unwrap();
    step.abandon();
    assert!(!step.held());

    let applied = messages
        .apply(
            Some(&mut *step),
            &[Op::Move {
                name: FileName::of(&a),
                from: queue.clone(),
                to: log.clone(),
            }],
        )
        .await;
    assert!(applied.results.iter().all(Result::is_err), "{applied:?}");
    assert_eq!(messages.count(&queue).await.unwrap(), 1);
    assert_eq!(messages.count(&log).await.unwrap(), 0);
}

/// Nothing is left half-done by a crash: no writes to recover. The
/// orphans of a database are the rows of its `Prepared` that are not
/// referenced, and no other place's or mailbox's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_the_unreferenced_rows_of_the_databases_prepared() {
    let pg = Postgres::start().unwrap();
    let messages = PgMessages::new(store(&pg).await);
    let prepared = Location::new(id("db-a"), Folder::Prepared);
    let (named, unnamed) = (
        message(1, "phone-1", "sales"),
        message(2, "phone-1", "sales"),
    );
    messages
        .put_all(&prepared, &[named.clone(), unnamed.clone()], go())
        .await
        .unwrap();
    let elsewhere = [
        (
            Location::new(id("db-a"), Folder::Messages),
            message(3, "db-a", "sales"),
        ),
        (
            Location::new(id("db-b"), Folder::Prepared),
            message(4, "phone-1", "sales"),
        ),
    ];
    for (at, m) in &elsewhere {
        messages.put(at, m).await.unwrap();
    }
    messages.recover_writes(&id("db-a")).await.unwrap();
    let referenced = std::collections::HashSet::from([named.id]);
    let orphans = messages.orphans(&id("db-a"), &referenced).await.unwrap();
    assert_eq!(orphans, vec![FileName::of(&unnamed)]);
    let none = std::collections::HashSet::new();
    let all = messages.orphans(&id("db-a"), &none).await.unwrap();
    assert_eq!(all, vec![FileName::of(&named), FileName::of(&unnamed)]);
    assert_eq!(messages.count(&prepared).await.unwrap(), 2);
}

/// `start`'s query (the one `PgMessages::select` runs), with 20,000
/// messages waiting in each of two databases, unfiltered and filtered by
/// subsystem: one range scan of `messages_folder` that reads exactly the
/// rows it returns, no sort, no table scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn select_reads_only_the_rows_it_returns_whatever_the_queue_length() {
    let pg = Postgres::start().unwrap();
    let client = with_waiting(&pg, "CASE WHEN i % 2 = 0 THEN 'sales' ELSE 'stock' END", "").await;
    // The very statement, its parameters bound as the store binds them.
    client
        .batch_execute(&format!(
            "PREPARE sel (text, text, text[], text[], bigint) AS {MESSAGES_SELECT}"
        ))
        .await
        .unwrap();
    for subsystems in ["NULL", "ARRAY['sales']"] {
        let explain = format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE sel ('db-a', 'Messages', {subsystems}, NULL, 10)"
        );
        let (text, plan) = explained(&client, &explain).await;
        let nodes = plan_nodes(&plan);
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
        // The filtered scan passes over the other subsystem's rows in
        // between (every other one), no more.
        let removed = scan["Rows Removed by Filter"].as_u64().unwrap_or(0);
        assert!(removed <= 10, "{text}");
        assert!(
            nodes
                .iter()
                .all(|n| n["Node Type"] != "Sort" && n["Node Type"] != "Seq Scan"),
            "{text}"
        );
    }
}

/// The statement that makes a batch's moves, with 20,000 messages waiting
/// in each of two databases, 20,000 in the first one's `Log` and 2,000 in
/// each of ten devices' `Messages`, and a batch of 200 moves (100 to that
/// `Log`, 100 to the devices' `Messages`), its generic plan (the one a
/// statement prepared once per connection settles on): the moved rows
/// found by their primary key, no table scan, and the pages read bounded
/// by the batch, not by the size of the folders it moves into (a check of
/// each move's target through the folder index walked the target folder:
/// about 100 pages a move here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_moves_reads_only_its_rows_whatever_the_table_size() {
    let pg = Postgres::start().unwrap();
    let client = with_waiting(
        &pg,
        "'sales'",
        "INSERT INTO messages (id, owner, place, sender, recipient, subsystem, created_at, size, body)
               SELECT format('l%s', lpad(i::text, 6, '0')), 'db-a', 'Log', 'phone-1', 'db-a',
                      'sales', i, 100, '\\x7b7d'
               FROM generate_series(1, 20000) AS i;
             INSERT INTO messages (id, owner, place, sender, recipient, subsystem, created_at, size, body)
               SELECT format('r%s-%s', d, lpad(i::text, 6, '0')), format('phone-%s', d), 'Messages',
                      'db-a', format('phone-%s', d), 'sales', i, 100, '\\x7b7d'
               FROM generate_series(1, 2000) AS i, generate_series(0, 9) AS d;
         SET plan_cache_mode = force_generic_plan;",
    )
    .await;
    client
        .batch_execute(&format!(
            "PREPARE mv (text[], text[], text[], text[], text[]) AS {MESSAGES_MOVE}"
        ))
        .await
        .unwrap();
    let array = |f: &dyn Fn(usize) -> String| {
        let items: Vec<String> = (1..=200).map(|i| format!("'{}'", f(i))).collect();
        format!("ARRAY[{}]", items.join(","))
    };
    let explain = format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE mv ({}, {}, {}, {}, {})",
        array(&|i| format!("mdb-a-{i:06}")),
        array(&|_| "db-a".to_owned()),
        array(&|_| "Messages".to_owned()),
        array(&|i| match i <= 100 {
            true => "db-a".to_owned(),
            false => format!("phone-{}", i % 10),
        }),
        array(&|i| match i <= 100 {
            true => "Log".to_owned(),
            false => "Messages".to_owned(),
        }),
    );
    let (text, plan) = explained(&client, &explain).await;
    let nodes = plan_nodes(&plan);
    assert!(nodes.iter().all(|n| n["Node Type"] != "Seq Scan"), "{text}");
    // About 3 pages per move by primary key, each read and the update's.
    let read =
        plan["Shared Hit Blocks"].as_u64().unwrap() + plan["Shared Read Blocks"].as_u64().unwrap();
    assert!(read < 8_000, "{read} pages read for 200 moves: {text}");
    let moved: i64 = client
        .query_one(
            "SELECT count(*) FROM messages
               WHERE id LIKE 'mdb-a-%' AND (owner <> 'db-a' OR place <> 'Messages')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(moved, 200);
}

/// A client of `pg`'s store, migrated, with 20,000 messages waiting in
/// each of `db-a` and `db-b` (their subsystem the SQL expression
/// `subsystem` of their number `i`), then `more` statements run, then the
/// table analyzed: the queue lengths the plan tests look at.
async fn with_waiting(pg: &Postgres, subsystem: &str, more: &str) -> deadpool_postgres::Object {
    let client = store(pg).await.client().await.unwrap();
    client
        .batch_execute(&format!(
            "INSERT INTO messages (id, owner, place, sender, recipient, subsystem, created_at, size, body)
               SELECT format('m%s-%s', db, lpad(i::text, 6, '0')), db, 'Messages', 'phone-1', db,
                      {subsystem}, i, 100, '\\x7b7d'
               FROM generate_series(1, 20000) AS i, unnest(ARRAY['db-a', 'db-b']) AS db;
             {more}
             ANALYZE messages;"
        ))
        .await
        .unwrap();
    client
}

/// What `explain` (an `EXPLAIN (…, FORMAT JSON)` statement) answers: its
/// text, to show in a failure, and the plan's top node.
async fn explained(client: &tokio_postgres::Client, explain: &str) -> (String, serde_json::Value) {
    let text = client
        .simple_query(explain)
        .await
        .unwrap()
        .into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap();
    let plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    (text, plan[0]["Plan"].clone())
}

/// Every node of an EXPLAIN plan, depth first.
fn plan_nodes(node: &serde_json::Value) -> Vec<&serde_json::Value> {
    let children = node["Plans"].as_array().into_iter().flatten();
    std::iter::once(node)
        .chain(children.flat_map(plan_nodes))
        .collect()
}

/// A go-ahead already given.
fn go() -> tokio::sync::oneshot::Receiver<bool> {
    let (go, when) = tokio::sync::oneshot::channel();
    let _ = go.send(true);
    when
}
