//! What the tests of several modules need: a store over a throwaway
//! PostgreSQL with the schema applied, storage calls run as the engines run
//! them, and builders of ids and scheduler entries.

use estafeta_exchange::Id;
use estafeta_postgres::Store;
use estafeta_postgres::testing::Postgres;
use std::time::Duration;

/// A store over `pg`, its schema migrated.
pub(crate) async fn store(pg: &Postgres) -> Store {
    let store = Store::connect(&pg.url()).unwrap();
    store.migrate().await.unwrap();
    store
}

/// Run a storage call as the engine does: on a blocking thread.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// A validated id from a literal.
pub(crate) fn id(s: &str) -> Id {
    Id::new(s).unwrap()
}

pub(crate) use estafeta_repeat::store::conformance::entry;

/// The longest a wait of these tests may take: a lock that never comes
/// fails the test instead of hanging it.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// `wait`, which must end within [`PATIENCE`].
pub(crate) async fn bounded<T>(what: &str, wait: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("{what} did not come within {PATIENCE:?}"))
}

/// Wait until `n` sessions of the instance wait for a lock (the state the
/// test needs, observed, not slept for).
pub(crate) async fn until_waiting_for_lock(observer: &Store, n: i64) {
    bounded(
        "a session waiting for the lock",
        waiting_for_lock(observer, n),
    )
    .await;
}

async fn waiting_for_lock(observer: &Store, n: i64) {
    let client = observer.client().await.unwrap();
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting >= n {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// How many scheduler entries the table holds.
pub(crate) async fn entries_left(db: &Store) -> i64 {
    let client = db.client().await.unwrap();
    client
        .query_one("SELECT count(*) FROM repeat_entries", &[])
        .await
        .unwrap()
        .get(0)
}
