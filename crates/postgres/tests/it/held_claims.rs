//! A holding queue (`PgQueue::holding`): its dispatching read locks what
//! it returns in a transaction left open, other nodes pass over those
//! entries, the outcomes commit in that transaction; a hold that ends
//! without them (its node died, or it sat idle past the store's hold
//! limit) leaves the entries due again as they were.

use crate::common::{blocking, bounded, entries_left, entry, store};
use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{Options as StoreOptions, PgQueue, Store};
use estafeta_repeat::store::{Applied, Holding, Op, Read};
use estafeta_repeat::{Entry, Options, Outcome, Scheduler, Store as _, TestClock, WorkerPool};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(60);
/// How long a holding read waits for a hold to end before it leases.
const WAIT: Duration = Duration::from_millis(100);

/// A store with `n` entries of source `a` due at second 10.
async fn with_entries(pg: &Postgres, n: usize) -> Store {
    let db = store(pg).await;
    let queue = PgQueue::new(db.clone(), &["a"]);
    blocking(move || {
        let ops: Vec<Op> = (0..n)
            .map(|i| Op::Put(entry("a", 10, &format!("e{i:03}"))))
            .collect();
        queue.apply(&ops).unwrap();
    })
    .await;
    db
}

/// What a dispatching read of the first `limit` due entries of `a` at
/// second 100 returns.
async fn hold(queue: &Arc<PgQueue>, limit: usize) -> (Vec<Entry>, Holding) {
    hold_at(queue, limit, 100).await
}

/// What a dispatching read of up to `limit` due entries of `a` at second
/// `now` returns.
async fn hold_at(queue: &Arc<PgQueue>, limit: usize, now: u64) -> (Vec<Entry>, Holding) {
    let queue = Arc::clone(queue);
    blocking(move || {
        let mut holding = queue.hold_sources(&[Read::first("a", limit)], now, &|_, _| false);
        let entries = match holding.scans.pop() {
            Some(Ok(scan)) => scan.entries,
            other => panic!("the read failed: {other:?}"),
        };
        (entries, holding)
    })
    .await
}

/// The ids another node's claiming read of `a` at second 100 takes.
async fn claim_elsewhere(db: &Store) -> Vec<String> {
    let queue = PgQueue::claiming(db.clone(), &["a"], LEASE);
    blocking(move || {
        let scan = queue.scan(Read::first("a", 100), 100, &|_| false).unwrap();
        scan.entries.into_iter().map(|e| e.id).collect()
    })
    .await
}

/// Reads with another node until it takes something, within the tests'
/// patience: a hold the database ends (a closed connection, a timeout)
/// is let go on the server's own time.
async fn claim_elsewhere_once_free(db: &Store) -> Vec<String> {
    bounded("the hold's end", async {
        loop {
            let got = claim_elsewhere(db).await;
            if !got.is_empty() {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

fn ids(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(|e| e.id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_keeps_its_entries_from_other_nodes_and_commits_their_outcomes() {
    let pg = Postgres::start().unwrap();
    let db = with_entries(&pg, 5).await;
    let queue = Arc::new(PgQueue::holding(db.clone(), &["a"], LEASE, 2, WAIT));
    let (held, holding) = hold(&queue, 3).await;
    assert_eq!(ids(&held), ["e000", "e001", "e002"]);
    assert!(
        held.iter().all(|e| e.due == 10),
        "handed out as stored, no lease written"
    );
    let held_by = holding.held.expect("a hold");

    assert_eq!(
        claim_elsewhere(&db).await,
        ["e003", "e004"],
        "the other node passes over the held entries"
    );

    // Each outcome's result in its place, removals and moves mixed.
    let ops = vec![
        Op::Remove(held[0].clone()),
        Op::Move {
            entry: held[2].clone(),
            due: 500,
            attempt: 1,
        },
        Op::Remove(held[1].clone()),
    ];
    let applied = blocking(move || held_by.settle(&ops).unwrap()).await;
    assert_eq!(applied[0], Applied::Removed);
    assert!(matches!(&applied[1], Applied::Placed { at, .. } if at.due == 500));
    assert_eq!(applied[2], Applied::Removed);

    let client = db.client().await.unwrap();
    let rows = client
        .query("SELECT id, due FROM repeat_entries ORDER BY id", &[])
        .await
        .unwrap();
    let left: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let lease_end = 100 + i64::try_from(LEASE.as_secs()).unwrap();
    assert_eq!(
        left,
        [
            ("e002".to_owned(), 500),
            ("e003".to_owned(), lease_end),
            ("e004".to_owned(), lease_end)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_dropped_with_its_node_leaves_its_entries_due_at_once() {
    let pg = Postgres::start().unwrap();
    let db = with_entries(&pg, 3).await;
    let queue = Arc::new(PgQueue::holding(db.clone(), &["a"], LEASE, 2, WAIT));
    let (held, holding) = hold(&queue, 3).await;
    assert_eq!(held.len(), 3);
    assert!(claim_elsewhere(&db).await.is_empty(), "all held");
    drop(holding);
    assert_eq!(
        claim_elsewhere_once_free(&db).await,
        ["e000", "e001", "e002"],
        "due again without waiting out a lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_idle_past_the_hold_limit_is_cut_off_and_its_outcomes_fail() {
    let pg = Postgres::start().unwrap();
    let db = with_entries(&pg, 2).await;
    let paused = Store::connect_with(
        &pg.url(),
        &StoreOptions {
            hold_limit: Duration::from_secs(1),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let queue = Arc::new(PgQueue::holding(paused, &["a"], LEASE, 2, WAIT));
    let (held, holding) = hold(&queue, 2).await;
    let held_by = holding.held.expect("a hold");
    assert_eq!(claim_elsewhere_once_free(&db).await, ["e000", "e001"]);
    let ops: Vec<Op> = held.into_iter().map(Op::Remove).collect();
    let late = blocking(move || held_by.settle(&ops)).await;
    assert!(late.is_err(), "a late outcome is refused: {late:?}");
    assert_eq!(
        entries_left(&db).await,
        2,
        "both still there, with the node that took them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_hold_in_use_a_read_claims_with_a_lease() {
    let pg = Postgres::start().unwrap();
    let db = with_entries(&pg, 4).await;
    let queue = Arc::new(PgQueue::holding(db.clone(), &["a"], LEASE, 1, WAIT));
    let (first, holding) = hold(&queue, 2).await;
    assert!(holding.held.is_some());
    let (second, leased) = hold(&queue, 2).await;
    assert!(leased.held.is_none(), "no hold left: a lease");
    assert_eq!(ids(&first), ["e000", "e001"]);
    assert_eq!(ids(&second), ["e002", "e003"]);
    assert!(second.iter().all(|e| e.due == 100 + LEASE.as_secs()));
    // Ended by its commit (a dropped hold ends when the database notices
    // its connection closed, in its own time).
    let held = holding.held.expect("a hold");
    blocking(move || held.settle(&[]).unwrap()).await;
    let (_, again) = hold(&queue, 2).await;
    assert!(again.held.is_some(), "the hold is free again");
}

/// A read that finds every hold in use waits for one to end and holds
/// what it takes then, rather than leasing it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_finds_every_hold_in_use_waits_for_one_to_end() {
    let pg = Postgres::start().unwrap();
    let db = with_entries(&pg, 4).await;
    let patient = Duration::from_secs(600);
    let queue = Arc::new(PgQueue::holding(db.clone(), &["a"], LEASE, 1, patient));
    let (first, holding) = hold(&queue, 2).await;
    let held_by = holding.held.expect("a hold");
    let waiting = {
        let queue = Arc::clone(&queue);
        tokio::spawn(async move { hold(&queue, 2).await })
    };
    // Orders the read before the settle; without the wait the read leases
    // at once, whenever it runs before the settle.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "the read waits while the hold is open"
    );
    let ops: Vec<Op> = first.iter().cloned().map(Op::Remove).collect();
    blocking(move || held_by.settle(&ops).unwrap()).await;
    let (second, holding) = bounded("the waiting read", waiting).await.unwrap();
    assert!(holding.held.is_some(), "held once the first hold ended");
    assert_eq!(ids(&second), ["e002", "e003"]);
    assert!(second.iter().all(|e| e.due == 10), "as stored, no lease");
}

/// Two nodes' schedulers over holding queues of one table dispatch 300
/// due entries: each handed out once, and the table left empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_holding_what_they_dispatch_hand_each_entry_out_once() {
    let pg = Postgres::start().unwrap();
    let db = with_entries(&pg, 300).await;
    let handed: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let (all_in, mut all) = tokio::sync::watch::channel(0usize);
    let all_in = Arc::new(all_in);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let scheduler = Scheduler::new(
            PgQueue::holding(db.clone(), &["a"], LEASE, 4, WAIT),
            TestClock::new(100),
            Options::default(),
        );
        let (handed, all_in, mut stopped) =
            (Arc::clone(&handed), Arc::clone(&all_in), stopped.clone());
        nodes.push(tokio::spawn(async move {
            let handler = move |entry: Entry| {
                let (handed, all_in) = (Arc::clone(&handed), Arc::clone(&all_in));
                async move {
                    let mut handed = handed.lock().unwrap();
                    *handed.entry(entry.id).or_insert(0) += 1;
                    all_in.send_replace(handed.len());
                    Outcome::Done
                }
            };
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            scheduler.run(WorkerPool::new(16), handler, shutdown).await
        }));
    }
    all.wait_for(|n| *n == 300).await.unwrap();
    stop.send_replace(true);
    for node in nodes {
        node.await.unwrap().unwrap();
    }
    let handed = handed.lock().unwrap().clone();
    assert_eq!(handed.len(), 300);
    assert!(handed.values().all(|n| *n == 1), "none twice");
    assert_eq!(
        entries_left(&db).await,
        0,
        "every outcome committed in its hold"
    );
}

/// A node's scheduler holds due entries and dies with them in hand (its
/// run dropped, their handlers never done): another node's scheduler
/// takes them at the same second, without a lease to wait out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_held_by_a_node_that_died_go_to_another_node_at_once() {
    let pg = Postgres::start().unwrap();
    let db = with_entries(&pg, 3).await;
    let clock = TestClock::new(100);
    let (handed, mut handouts) = tokio::sync::mpsc::unbounded_channel();
    let node = |handed: tokio::sync::mpsc::UnboundedSender<(&'static str, String)>,
                name: &'static str,
                finish: bool| {
        let scheduler = Scheduler::new(
            PgQueue::holding(db.clone(), &["a"], LEASE, 4, WAIT),
            clock.clone(),
            Options::default(),
        );
        tokio::spawn(async move {
            let handler = move |entry: Entry| {
                let handed = handed.clone();
                async move {
                    let _ = handed.send((name, entry.id));
                    if !finish {
                        std::future::pending::<()>().await;
                    }
                    Outcome::Done
                }
            };
            scheduler
                .run(WorkerPool::new(8), handler, std::future::pending())
                .await
        })
    };
    let dying = node(handed.clone(), "a", false);
    for _ in 0..3 {
        assert_eq!(handouts.recv().await.unwrap().0, "a");
    }
    dying.abort();
    assert!(dying.await.unwrap_err().is_cancelled());

    let live = node(handed, "b", true);
    let mut taken = Vec::new();
    for _ in 0..3 {
        let (name, id) = handouts.recv().await.unwrap();
        assert_eq!(name, "b");
        taken.push(id);
    }
    taken.sort();
    assert_eq!(taken, ["e000", "e001", "e002"]);
    bounded("the removals", async {
        while entries_left(&db).await > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    live.abort();
}

/// Within a second, a holding read starts where the queue's last one
/// ended, not stepping again over what its holds took; the first read of
/// the next second starts from the first entry, so entries a hold left
/// due behind the cursor are handed out again then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_reads_on_from_the_last_within_a_second_and_from_the_first_in_the_next() {
    let pg = Postgres::start().unwrap();
    let db = with_entries(&pg, 6).await;
    let queue = Arc::new(PgQueue::holding(db.clone(), &["a"], LEASE, 4, WAIT));
    let (first, settled) = hold_at(&queue, 2, 100).await;
    assert_eq!(ids(&first), ["e000", "e001"]);
    let (second, _open) = hold_at(&queue, 2, 100).await;
    assert_eq!(ids(&second), ["e002", "e003"]);
    // Ended without outcomes: e000 and e001 are due again, behind the cursor.
    let settled = settled.held.expect("a hold");
    blocking(move || settled.settle(&[]).unwrap()).await;

    let (same_second, _third) = hold_at(&queue, 4, 100).await;
    assert_eq!(ids(&same_second), ["e004", "e005"]);
    let (next_second, _fourth) = hold_at(&queue, 4, 101).await;
    assert_eq!(
        ids(&next_second),
        ["e000", "e001"],
        "read from the first entry again, passing over the held ones"
    );
}

/// A holding read runs its statement with the generic plan, planned once
/// for every read (PostgreSQL plans a statement's first five runs anew
/// each time, and this one's every run if its custom plans look cheaper),
/// while the statements of the hold's outcomes are planned as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holding_read_runs_a_generic_plan_and_its_outcomes_as_usual() {
    let pg = Postgres::start().unwrap();
    with_entries(&pg, 8).await;
    // One connection: every read and outcome below runs on it, and its
    // prepared statements say how each was planned.
    let one = Store::connect_with(
        &pg.url(),
        &StoreOptions {
            pool_size: 1,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let queue = Arc::new(PgQueue::holding(one.clone(), &["a"], LEASE, 1, WAIT));
    for _ in 0..4 {
        let (held, holding) = hold(&queue, 2).await;
        assert_eq!(held.len(), 2);
        let ops = vec![
            Op::Remove(held[0].clone()),
            Op::Move {
                entry: held[1].clone(),
                due: 500,
                attempt: 1,
            },
        ];
        let held_by = holding.held.expect("a hold");
        blocking(move || held_by.settle(&ops).unwrap()).await;
    }
    let client = one.client().await.unwrap();
    let plans = |marker: &'static str| {
        let client = &client;
        async move {
            let row = client
                .query_one(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements
                     WHERE statement LIKE '%' || $1 || '%'",
                    &[&marker],
                )
                .await
                .unwrap();
            (row.get::<_, i64>(0), row.get::<_, i64>(1))
        }
    };
    assert_eq!(
        plans("FOR UPDATE SKIP LOCKED").await,
        (4, 0),
        "each read ran the generic plan"
    );
    assert_eq!(
        plans("to_attempt").await,
        (0, 4),
        "each move was planned as usual (its first runs: a custom plan)"
    );
}
