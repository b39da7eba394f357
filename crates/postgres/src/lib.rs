//! Estafeta's cluster store: the state of every node in one PostgreSQL
//! database, so that any number of stateless `estafeta` nodes serve the same
//! tenants and a node or the database primary can die without loss.
//!
//! - [`Store::connect`] opens a connection pool from a libpq URL
//!   (`postgres://…`). A URL with several hosts and
//!   `target_session_attrs=read-write` finds the primary among them, so a
//!   failover needs no reconfiguration: broken connections are dropped and
//!   new ones go to the promoted host.
//! - [`Store::migrate`] creates or updates the schema (the SQL files under
//!   `migrations/`); several nodes starting at once apply it exactly once.
//! - [`Store::lock`] makes a key's step exclusive across the cluster: it
//!   opens a transaction and locks the key's row until [`Locked::commit`];
//!   a holder that dies, or drops its [`Locked`] without committing, releases
//!   the lock and leaves nothing behind.
//! - [`SessionStorage`] keeps the session engine's records in the store
//!   (`estafeta_session::Storage`); [`PgRegistry`] the exchange's registry
//!   (`estafeta_exchange::store::RegistryStore`), shared by every node.
//! - The exchange's data: [`PgMessages`] (its message store: every message
//!   and its place, a step's batch in one transaction), [`PgKeys`] (upload
//!   idempotency keys) and [`PgSchedule`] (the repeat scheduler's entries:
//!   messages scheduled for their `deliver_at`). An upload's message and
//!   key are rows of the device's session step (`Step::joint`), written by
//!   the step's commit with the device's record: one commit per upload.
//! - [`PgQueue`]: the repeat scheduler's store limited to some sources,
//!   each due entry claimed by one node (messages scheduled for their
//!   `deliver_at`, alert deliveries, push notifications).
//! - What a node of the embedded store keeps in its data folder, shared
//!   here by every node: [`PgAlerts`] (alerts raised to the administrators,
//!   once per event), [`PgLogins`] (dashboard login sessions) and
//!   [`PgEvents`] (the event log).
//! - [`PgAuthFailures`]: wrong tokens by client address, which every node
//!   counts in memory and swaps with the others now and then, so that an
//!   address one node makes wait waits on all of them.
//! - [`Store::takes_writes`]: whether the database takes a write now (a
//!   node's `/readyz`).
//! - [`DatabaseClock`]: the database server's time, which every node runs
//!   on, so that deadlines and leases one node sets mean the same to all.
//! - With the `test-support` feature, the `testing` module starts throwaway
//!   PostgreSQL instances (crash, standby and failover included) for tests.
//!
//! ```no_run
//! use estafeta_postgres::Store;
//!
//! # async fn run() -> Result<(), estafeta_postgres::Error> {
//! let store = Store::connect("postgres://estafeta@db1,db2/estafeta?target_session_attrs=read-write")?;
//! store.migrate().await?;
//!
//! let mut step = store.lock(b"db-a").await?;
//! let count = step.record().map_or(0, |r| r.len());
//! step.save(&vec![0; count + 1], None).await?;
//! step.commit().await?; // durable (and on the synchronous standby) here
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod alerts;
mod auth_failures;
mod clock;
mod closing;
mod error;
mod events;
mod joint;
mod keys;
mod lock;
mod logins;
mod messages;
mod migrate;
mod outcome;
pub use migrate::{Durability, SchemaVersion};
mod queue;
mod registry;
mod schedule;
mod session_storage;
mod store;
#[cfg(feature = "test-support")]
pub mod testing;
mod tls;
mod write_probe;

pub use alerts::{PgAlerts, StoredAlert};
pub use auth_failures::{Known, Learned, PgAuthFailures, Reported};
pub use clock::{DatabaseClock, SKEW_WARNING};
pub use error::Error;
pub use events::{EventRow, INDEXED as EVENT_INDEXES, PgEvents, StoredEvent};
pub use keys::PgKeys;
pub use lock::Locked;
pub use logins::PgLogins;
pub use messages::PgMessages;
pub use queue::PgQueue;
pub use registry::PgRegistry;
pub use schedule::PgSchedule;
pub use session_storage::SessionStorage;
pub use store::{Options, Store};
