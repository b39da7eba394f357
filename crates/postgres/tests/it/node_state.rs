//! What a node of the embedded store keeps in its data folder, shared here
//! by every node: alert deliveries and push notifications claimed by one
//! node each ([`PgQueue`]), alerts recorded once per event ([`PgAlerts`]),
//! dashboard logins valid on every node ([`PgLogins`]).

use estafeta_repeat::store::Read;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{blocking, entry, store};
use estafeta_exchange::{Alert, AlertKind, Timestamp};
use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{PgAlerts, PgLogins, PgQueue};
use estafeta_repeat::store::Op;
use estafeta_repeat::{Entry, Store as _};

fn claim(queue: &Arc<PgQueue>, source: &str, now: u64, limit: usize) -> Vec<Entry> {
    queue
        .scan(Read::first(source, limit), now, &|_| false)
        .unwrap()
        .entries
}

/// Two nodes' claiming reads at once take disjoint entries, together all
/// that is due; a claimed entry is handed out at the end of its lease, its
/// removal applies to that version, and an entry whose claimer died is
/// due again for any node when the lease ends. A queue reads only its own
/// sources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_due_entry_is_claimed_by_one_node_until_its_lease_ends() {
    let pg = Postgres::start().unwrap();
    let db = store(&pg).await;
    let lease = Duration::from_secs(60);
    let a = Arc::new(PgQueue::claiming(db.clone(), &["alerts"], lease));
    let b = Arc::new(PgQueue::claiming(db.clone(), &["alerts"], lease));
    let plain = Arc::new(PgQueue::new(db.clone(), &["alerts"]));
    let mut ops: Vec<Op> = (0..40)
        .map(|i| Op::Put(entry("alerts", 100, &format!("e{i:02}"))))
        .collect();
    ops.push(Op::Put(entry("alerts", 500, "later")));
    ops.push(Op::Put(entry("push", 100, "other-source")));
    {
        let a = a.clone();
        blocking(move || a.apply(&ops).unwrap()).await;
    }
    assert_eq!(a.sources().unwrap(), ["alerts"]);

    let (got_a, got_b) = {
        let (a, b) = (a.clone(), b.clone());
        let ta = tokio::task::spawn_blocking(move || {
            let mut got = Vec::new();
            for _ in 0..10 {
                got.extend(claim(&a, "alerts", 200, 3));
            }
            got
        });
        let tb = tokio::task::spawn_blocking(move || {
            let mut got = Vec::new();
            for _ in 0..10 {
                got.extend(claim(&b, "alerts", 200, 3));
            }
            got
        });
        (ta.await.unwrap(), tb.await.unwrap())
    };
    let mut all: Vec<String> = got_a.iter().chain(&got_b).map(|e| e.id.clone()).collect();
    all.sort();
    let expected: Vec<String> = (0..40).map(|i| format!("e{i:02}")).collect();
    assert_eq!(all, expected, "every due entry once, none twice");
    assert!(got_a.iter().chain(&got_b).all(|e| e.due == 260));
    // Nothing more due for anyone until the lease ends; the other source
    // and the later entry are not read.
    {
        let b = b.clone();
        assert!(
            blocking(move || claim(&b, "alerts", 259, 100))
                .await
                .is_empty()
        );
    }
    {
        let b = b.clone();
        let scan =
            blocking(move || b.scan(Read::first("push", 10), 1_000, &|_| false).unwrap()).await;
        assert!(scan.entries.is_empty());
    }

    // A's handlers finish: removed as handed out. B died with its entries:
    // they are due again when the lease ends, for A.
    {
        let (a, done) = (a.clone(), got_a.clone());
        blocking(move || {
            a.apply(&done.into_iter().map(Op::Remove).collect::<Vec<_>>())
                .unwrap()
        })
        .await;
    }
    let again = {
        let a = a.clone();
        blocking(move || claim(&a, "alerts", 260, 100)).await
    };
    let mut again: Vec<String> = again.into_iter().map(|e| e.id).collect();
    again.sort();
    let mut of_b: Vec<String> = got_b.iter().map(|e| e.id.clone()).collect();
    of_b.sort();
    assert_eq!(again, of_b);
    // A handler that outlived its lease: its outcome finds the entry taken
    // by another node and changes nothing.
    let stale = got_b[0].clone();
    {
        let a = a.clone();
        let applied = blocking(move || a.apply(&[Op::Remove(stale)]).unwrap()).await;
        assert_eq!(applied, [estafeta_repeat::store::Applied::Unchanged]);
    }
    // Listing through a plain queue claims nothing.
    let listed = {
        let plain = plain.clone();
        blocking(move || {
            plain
                .scan(Read::all("alerts"), u64::MAX, &|_| false)
                .unwrap()
                .entries
        })
        .await
    };
    assert_eq!(listed.len(), got_b.len() + 1);
    assert!(listed.iter().any(|e| e.id == "later" && e.due == 500));
}

/// One condition is one alert while it lasts, however many nodes raise it
/// at once, and its deliveries are written only with the alert that
/// recorded it; ended, the same condition is a new alert; acknowledgements
/// keep their first time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_is_recorded_once_per_condition_with_its_deliveries() {
    let pg = Postgres::start().unwrap();
    let db = store(&pg).await;
    let t = Timestamp::from_millis;
    let alert = Alert::new(AlertKind::InDoubt, "p1", "in doubt", t(1));
    let deliveries = [entry("alerts", 1, "Email/in_doubt:p1")];
    let nodes: Vec<PgAlerts> = (0..4).map(|_| PgAlerts::new(db.clone())).collect();
    let mut raising = tokio::task::JoinSet::new();
    for node in &nodes {
        let (node, alert, deliveries) = (node.clone(), alert.clone(), deliveries.clone());
        raising.spawn(async move { node.raise(&alert, &deliveries).await.unwrap() });
    }
    let recorded: Vec<u64> = raising.join_all().await.into_iter().flatten().collect();
    assert_eq!(recorded.len(), 1, "one of four nodes records it");
    let alerts = &nodes[0];
    assert!(alerts.is_open(&alert.key).await.unwrap());
    let queue = Arc::new(PgQueue::new(db.clone(), &["alerts"]));
    let count = blocking(move || queue.count("alerts", 10).unwrap()).await;
    assert_eq!(count.entries, 1);

    let id = recorded[0];
    assert!(alerts.acknowledge(id, t(5)).await.unwrap());
    assert!(alerts.acknowledge(id, t(6)).await.unwrap());
    assert!(!alerts.acknowledge(id + 100, t(6)).await.unwrap());
    assert_eq!(alerts.unacknowledged().await.unwrap(), 0);
    assert_eq!(nodes[1].raise(&alert, &deliveries).await.unwrap(), None);
    assert!(nodes[2].close(&alert.key, t(7)).await.unwrap());
    assert!(!nodes[3].close(&alert.key, t(8)).await.unwrap());
    let second = nodes[1].raise(&alert, &deliveries).await.unwrap();
    assert!(second.is_some_and(|s| s > id));
    let list = alerts.list(10).await.unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!((list[0].ended_at, list[0].acked_at), (None, None));
    assert_eq!(list[0].alert, alert);
    assert_eq!(
        (list[1].ended_at, list[1].acked_at),
        (Some(t(7)), Some(t(5)))
    );
    assert_eq!(alerts.unacknowledged().await.unwrap(), 1);
}

/// A login made through one node is found through another, moves its idle
/// deadline with each use, and ends everywhere when removed or unused for
/// its idle time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_through_one_node_holds_on_another() {
    let pg = Postgres::start().unwrap();
    let db = store(&pg).await;
    let (a, b) = (PgLogins::new(db.clone()), PgLogins::new(db.clone()));
    let hour = Duration::from_secs(3600);
    a.create(b"secret-hash", "csrf-1", hour).await.unwrap();
    assert_eq!(
        b.touch(b"secret-hash", hour).await.unwrap().as_deref(),
        Some("csrf-1")
    );
    assert_eq!(b.touch(b"other", hour).await.unwrap(), None);
    b.remove(b"secret-hash").await.unwrap();
    assert_eq!(a.touch(b"secret-hash", hour).await.unwrap(), None);
    // An idle time of zero has passed by the next use.
    a.create(b"brief", "csrf-2", Duration::ZERO).await.unwrap();
    assert_eq!(b.touch(b"brief", hour).await.unwrap(), None);
}
