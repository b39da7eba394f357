//! A durable session engine: keyed sessions, one command at a time per key,
//! a memory cache over durable storage, expiry with finalization, and flush
//! of idle sessions.
//!
//! It follows two designs: an SMS gateway's SessionStore/SessionManager
//! (queues of commands per session, a save before the next command runs,
//! one expiry thread that finalizes and flushes) and Zope's "faster" session
//! container (begin and end notifications, lazy creation, a time-bucket
//! expiry index).
//!
//! - Ask for a session by key: [`Engine::get`] waits its turn in the
//!   session's own FIFO queue (no thread blocks), [`Engine::try_get`]
//!   answers [`Error::Busy`] at once, [`Engine::submit`] hands a command to
//!   the engine's own tasks. `create = false` and no session anywhere gives
//!   `None`.
//! - Change it through the [`SessionGuard`]: [`SessionData::persistent_mut`]
//!   and [`SessionData::set_expires_at`] mark it persistent, and
//!   [`SessionGuard::release`] returns once that save is durable. Saves of
//!   many sessions share one durable transaction (group commit).
//!   [`SessionGuard::update`] (or [`SessionGuard::begin`]) stages a change
//!   that becomes the session only once it is durably saved: a failed save
//!   leaves the session as it was.
//! - One storage trait serves a store of this engine's own (embedded) and a
//!   store that several engines share (a cluster): with the latter each
//!   command runs in a step that holds its key in the store and starts from
//!   the stored record ([`storage`] says how).
//! - An expiry manager finalizes sessions whose time passed (the
//!   [`Hooks::finalize`] hook may keep them with a new deadline or end
//!   them) and flushes idle ones out of memory. After a restart, the
//!   [`Hooks::first_load`] hook sees each session saved by the earlier run
//!   before any command does.
//!
//! ```
//! use estafeta_session::{Engine, MemoryStorage};
//! use std::sync::Arc;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), estafeta_session::Error> {
//! let engine: Engine<String, u64> = Engine::builder(Arc::new(MemoryStorage::new())).open().await?;
//!
//! let mut counter = engine.get("alice".to_string(), true).await?.expect("created");
//! *counter.persistent_mut() += 1;
//! counter.release().await?; // durable before this returns
//!
//! let total = engine
//!     .submit("alice".to_string(), false, |mut s| async move {
//!         *s.persistent_mut() += 1;
//!         let n = *s.state();
//!         s.release().await.map(|_| n)
//!     })
//!     .await?;
//! assert_eq!(total.transpose()?, Some(2));
//!
//! assert!(engine.get("bob".to_string(), false).await?.is_none());
//! engine.stop().await?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod acquire;
pub mod clock;
mod config;
mod data;
mod engine;
mod error;
mod expiry;
mod guard;
mod hooks;
pub mod index;
mod key;
mod lifecycle;
mod lock;
#[cfg(all(test, loom))]
mod model;
pub mod record;
mod shard;
mod shared;
mod stats;
pub mod storage;
mod sync;
mod writer;

pub use acquire::Acquire;
pub use clock::{Clock, SystemClock, Timestamp, TokioClock};
pub use config::Config;
pub use data::{SessionData, State};
pub use engine::{Builder, Engine, Loaded, Submitted};
pub use error::Error;
pub use guard::{SessionGuard, Transaction};
pub use hooks::{BoxFuture, Finalize, Hooks};
pub use key::SessionKey;
pub use stats::Stats;
pub use storage::{MemoryStorage, RedbStorage, SaveLogState, Shared, Step, Storage, StorageError};
