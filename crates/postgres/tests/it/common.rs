//! What the tests of several modules need: a store over a throwaway
//! PostgreSQL with the schema applied, storage calls run as the engines run
//! them, and builders of ids and scheduler entries.

use estafeta_exchange::Id;
use estafeta_postgres::Store;
use estafeta_postgres::testing::Postgres;

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
