//! Two session engines (two nodes, each with its own connection pool) over
//! one PostgreSQL: a key's commands are exclusive across both, each starts
//! from the stored record, a holder whose connection dies lets the key go
//! without writing afterwards, a command's last commit lets the key go at
//! once, a deadline is acted on once, and a command whose deadline's save
//! let the key go to another node goes on from the stored record.

use crate::common::store;
use estafeta_postgres::SessionStorage;
use estafeta_postgres::testing::Postgres;
use estafeta_session::{
    BoxFuture, Clock, Engine, Finalize, Hooks, SessionData, SystemClock, Timestamp,
};
use std::sync::Arc;

/// A node's engine over the shared store.
async fn node(pg: &Postgres, hooks: Arc<dyn Hooks<String, u64>>) -> Engine<String, u64> {
    node_on(pg, hooks, Arc::new(SystemClock)).await
}

async fn node_on(
    pg: &Postgres,
    hooks: Arc<dyn Hooks<String, u64>>,
    clock: Arc<dyn Clock>,
) -> Engine<String, u64> {
    let storage = SessionStorage::open(store(pg).await).await.unwrap();
    Engine::builder(Arc::new(storage))
        .hooks(hooks)
        .clock(clock)
        .open()
        .await
        .unwrap()
}

/// A clock stopped at the epoch: no deadline is ever due on it.
struct Epoch;

impl Clock for Epoch {
    fn now(&self) -> Timestamp {
        Timestamp(0)
    }
}

/// Adds one to the counter under `key`, through `engine`.
async fn increment(engine: Engine<String, u64>, key: &str) {
    let mut g = engine.get(key.to_owned(), true).await.unwrap().unwrap();
    *g.persistent_mut() += 1;
    g.release().await.unwrap();
}

/// Two nodes without hooks over `pg`'s store.
async fn two_nodes(pg: &Postgres) -> (Engine<String, u64>, Engine<String, u64>) {
    (node(pg, Arc::new(())).await, node(pg, Arc::new(())).await)
}

/// The counter under `key`, read through `engine`, which holds the key
/// meanwhile.
async fn counter(engine: &Engine<String, u64>, key: &str) -> u64 {
    let g = engine.get(key.to_owned(), false).await.unwrap().unwrap();
    let n = *g.state();
    g.release().await.unwrap();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_commands_on_one_key_from_two_nodes_lose_no_update() {
    let pg = Postgres::start().unwrap();
    let (a, b) = two_nodes(&pg).await;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let engine = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(increment(engine, "counter"))
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    for engine in [&a, &b] {
        assert_eq!(counter(engine, "counter").await, 200);
    }
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_connection_dies_lets_the_key_go_and_writes_nothing() {
    let pg = Postgres::start().unwrap();
    let (a, b) = two_nodes(&pg).await;
    increment(a.clone(), "k").await;

    // A holds the key mid-command; B's command waits for it.
    let mut held = a.get("k".to_owned(), false).await.unwrap().unwrap();
    *held.persistent_mut() += 100;
    let waiting = tokio::spawn(increment(b.clone(), "k"));
    // A's node dies: its connection is gone (as with SIGKILL), the server
    // rolls its step back and B's command goes on from the stored record.
    pg.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE state LIKE 'idle in transaction%'",
    )
    .unwrap();
    waiting.await.unwrap();
    // A's late release cannot overwrite what B saved.
    assert!(held.release().await.is_err());
    assert_eq!(counter(&b, "k").await, 2);
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_commit_lets_the_key_go_and_the_command_changes_it_no_more() {
    let pg = Postgres::start().unwrap();
    let (a, b) = two_nodes(&pg).await;
    increment(a.clone(), "k").await;

    let mut held = a.get("k".to_owned(), false).await.unwrap().unwrap();
    let mut tx = held.begin();
    *tx.persistent_mut() += 1;
    tx.commit_last().await.unwrap();
    assert_eq!(*held.state(), 2);
    assert!(!held.holds());
    // Durable and let go by that commit: B's command goes on while A has
    // not released its session yet, from what A committed.
    let through_b = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        increment(b.clone(), "k"),
    );
    through_b.await.expect("B waited for a key A let go");
    // A cannot change the session any more; its release writes nothing.
    let changed = held
        .update(|s| {
            *s.persistent_mut() += 100;
            Ok::<_, estafeta_session::Error>(())
        })
        .await;
    assert!(changed.is_err());
    held.release().await.unwrap();
    assert_eq!(counter(&b, "k").await, 3);
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// Tells each finalization, by key.
struct Finalized(tokio::sync::mpsc::UnboundedSender<String>);

impl Hooks<String, u64> for Finalized {
    fn finalize<'a>(
        &'a self,
        key: &'a String,
        _session: &'a mut SessionData<u64>,
        _step: Option<&'a mut dyn estafeta_session::Step>,
    ) -> BoxFuture<'a, Finalize> {
        let _ = self.0.send(key.clone());
        Box::pin(async { Finalize::End })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_is_acted_on_once_by_one_of_the_nodes() {
    let pg = Postgres::start().unwrap();
    let (tx, mut finalized) = tokio::sync::mpsc::unbounded_channel();
    // Deadlines set through a node that then dies (its engine gone without
    // a stop): only the store knows them. Its clock never reaches them, so
    // it does not act on them itself before it goes.
    let c = node_on(&pg, Arc::new(()), Arc::new(Epoch)).await;
    let keys: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
    let now = SystemClock.now();
    for key in &keys {
        let mut g = c.get(key.clone(), true).await.unwrap().unwrap();
        *g.persistent_mut() = 1;
        g.set_expires_at(Some(now));
        g.release().await.unwrap();
    }
    drop(c);
    // Two live nodes, whose pollers race for the due keys.
    let a = node(&pg, Arc::new(Finalized(tx.clone()))).await;
    let b = node(&pg, Arc::new(Finalized(tx))).await;

    let mut seen = Vec::new();
    while seen.len() < keys.len() {
        seen.push(finalized.recv().await.unwrap());
    }
    // A finalization still running finishes before stop returns; none may
    // follow the twenty.
    a.stop().await.unwrap();
    b.stop().await.unwrap();
    while let Ok(again) = finalized.try_recv() {
        seen.push(again);
    }
    seen.sort();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(seen, expected, "each deadline acted on exactly once");
    // An ended session leaves no row behind (not even its key's lock row):
    // the table holds what lives.
    assert_eq!(
        pg.psql("SELECT count(*) FROM sessions").unwrap().trim(),
        "0"
    );
}

/// A node on the stopped clock ([`Epoch`]) that stored 1 under `key`, due
/// now: the node never acts on the deadline itself.
async fn stored_due(pg: &Postgres, key: &str) -> Engine<String, u64> {
    let c = node_on(pg, Arc::new(()), Arc::new(Epoch)).await;
    let mut g = c.get(key.to_owned(), true).await.unwrap().unwrap();
    *g.persistent_mut() = 1;
    g.set_expires_at(Some(SystemClock.now()));
    g.release().await.unwrap();
    c
}

/// Changes the session and, before its save, ends the connection of every
/// step that holds a key (as when the node's connection to the server
/// drops mid-step).
struct LosesItsConnection(Arc<Postgres>);

impl Hooks<String, u64> for LosesItsConnection {
    fn finalize<'a>(
        &'a self,
        _key: &'a String,
        session: &'a mut SessionData<u64>,
        _step: Option<&'a mut dyn estafeta_session::Step>,
    ) -> BoxFuture<'a, Finalize> {
        *session.persistent_mut() = 99;
        session.set_expires_at(None);
        let pg = self.0.clone();
        Box::pin(async move {
            crate::common::blocking(move || {
                pg.psql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE state LIKE 'idle in transaction%'",
                )
                .unwrap()
            })
            .await;
            Finalize::Keep
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalization_that_could_not_save_fails_its_command() {
    let pg = Arc::new(Postgres::start().unwrap());
    let c = stored_due(&pg, "k").await;

    // The deadline is due: the command's finalization changes the session,
    // then its save finds the connection gone. The command must not go on
    // from a session that is not the stored one, without the key.
    let a = node(&pg, Arc::new(LosesItsConnection(pg.clone()))).await;
    let got = a.get("k".to_owned(), false).await;
    assert!(
        got.is_err(),
        "a command went on from an unsaved finalization: {:?}",
        got.map(|g| g.map(|g| (*g.state(), g.holds())))
    );
    // Nothing was written: the stored session is as it was.
    assert_eq!(counter(&c, "k").await, 1);
    a.stop().await.unwrap();
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_finds_its_session_ended_gets_none() {
    let pg = Postgres::start().unwrap();
    let c = stored_due(&pg, "k").await;

    // The deadline is due and the default hooks end the session: its
    // record and its key's row go with the step's commit.
    let a = node(&pg, Arc::new(())).await;
    assert!(a.get("k".to_owned(), false).await.unwrap().is_none());
    a.stop().await.unwrap();
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_makes_a_session_whose_old_one_ended_holds_its_key() {
    let pg = Postgres::start().unwrap();
    let c = stored_due(&pg, "k").await;

    // The old session ends on the command's way in (its row goes with the
    // step); the command makes a new one and saves it.
    let a = node(&pg, Arc::new(())).await;
    let mut g = a.get("k".to_owned(), true).await.unwrap().unwrap();
    assert_eq!(*g.state(), 0, "a new session");
    assert!(g.holds());
    *g.persistent_mut() = 5;
    g.release().await.unwrap();
    assert_eq!(counter(&c, "k").await, 5);
    a.stop().await.unwrap();
    c.stop().await.unwrap();
}

/// Changes the session to 2, with no deadline any more, and keeps it.
struct KeepsTwo;

impl Hooks<String, u64> for KeepsTwo {
    fn finalize<'a>(
        &'a self,
        _key: &'a String,
        session: &'a mut SessionData<u64>,
        _step: Option<&'a mut dyn estafeta_session::Step>,
    ) -> BoxFuture<'a, Finalize> {
        *session.persistent_mut() = 2;
        session.set_expires_at(None);
        Box::pin(async { Finalize::Keep })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_finalization_lost_the_key_goes_on_from_the_stored_record() {
    let pg = Postgres::start().unwrap();
    let c = stored_due(&pg, "k").await;
    let mut g = c.get("other".to_owned(), true).await.unwrap().unwrap();
    *g.persistent_mut() = 3;
    g.release().await.unwrap();
    // What another node does between a save's commit and the saver's hold
    // of the key again, made certain: a save of `k` stores `other`'s
    // record (3), so the saver finds the record changed when it holds the
    // key again, as when another node took the key at that commit and
    // changed it.
    pg.psql(
        "CREATE FUNCTION as_other() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN
             NEW.record := (SELECT record FROM sessions WHERE position('other'::bytea in key) > 0);
             RETURN NEW;
           END $$;
         CREATE TRIGGER as_other BEFORE INSERT OR UPDATE ON sessions FOR EACH ROW
           WHEN (position('k'::bytea in NEW.key) > 0 AND NEW.record IS NOT NULL)
           EXECUTE FUNCTION as_other()",
    )
    .unwrap();

    // The deadline is due: the command's finalization saves 2, and then
    // finds 3 stored. It holds the key again and goes on from what is
    // stored (a read of a process beside the node acting on its deadline
    // must not fail for it).
    let a = node(&pg, Arc::new(KeepsTwo)).await;
    let g = a.get("k".to_owned(), false).await.unwrap().unwrap();
    assert_eq!(*g.state(), 3, "the record as stored");
    assert!(g.holds());
    g.release().await.unwrap();
    assert_eq!(counter(&c, "k").await, 3);
    a.stop().await.unwrap();
    c.stop().await.unwrap();
}
