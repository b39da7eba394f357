//! Durable storage of session records.
//!
//! The engine sees storage as a small synchronous trait and calls it from
//! blocking threads. Writes come in batches: the engine's writer task collects
//! the saves of many sessions and commits them as one durable transaction
//! (group commit), so that many releases share one fsync. A shared store's
//! steps ([`Shared`], [`Step`]) are asynchronous instead: they wait on a
//! database's answers, and the engine awaits them on the command's own task,
//! so a round trip to the database costs no hop to a blocking thread and
//! back.
//!
//! One trait serves two kinds of store:
//!
//! - A store only this engine uses (embedded: [`RedbStorage`], or
//!   [`MemoryStorage`]): [`Storage::shared`] is `None`. The engine's
//!   per-key queue is all the exclusivity needed, its memory is the truth
//!   between commands (a session is loaded once and saved by the writer),
//!   deadlines live in its in-memory expiry index (rebuilt from
//!   [`Storage::deadlines`] at start), and a record of an older
//!   [`Storage::generation`] is recovered by the first-load hook. Nothing of
//!   the shared path runs: the hot path pays one flag test.
//! - A store several engines share (a cluster's database): [`Shared`].
//!   Commands for one key still queue on the key's session within an engine
//!   (so a hot key waits in memory, not in the database's lock waits);
//!   across engines each command runs in a [`Step`] that holds the key in
//!   the store ([`Shared::begin`]) and starts from the record as stored then,
//!   replacing what memory held. Every save of the command goes through the
//!   step (durable when it returns; the step goes on holding the key), and
//!   the release's save finishes it; a step dropped unfinished lets the key
//!   go with nothing of it written. Deadlines are read from the store
//!   ([`Shared::due`]) by every engine's expiry manager, and each due key
//!   is finalized in a step: the first engine to hold it acts, and the
//!   others find it no longer due, so a deadline is acted on once, by a live
//!   engine, whichever engine set it. There is no first-load recovery (an
//!   older generation may be another live engine's record): an engine that
//!   died leaves only deadlines behind, which the others act on.

mod memory;
mod redb_store;
mod save_log;

pub use memory::MemoryStorage;
pub use redb_store::{RedbStorage, SaveLogState};

use crate::clock::Timestamp;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What the methods of [`Shared`] and [`Step`] return: the call's work as
/// a future, awaited on the engine's task. It must not block the thread
/// (a store that can only block runs that part on a blocking thread
/// itself).
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, StorageError>> + Send + 'a>>;

/// One change in a write batch.
#[derive(Clone, Debug)]
pub enum Write {
    /// Store (or replace) a session record.
    Put {
        /// The session key's bytes.
        key: Vec<u8>,
        /// The encoded record (see [`crate::record`]).
        record: Vec<u8>,
        /// The session's expiration, kept beside the record so that the
        /// expiry index can be rebuilt after a restart without decoding
        /// every record.
        expires_at: Option<Timestamp>,
    },
    /// Remove a session record.
    Delete {
        /// The session key's bytes.
        key: Vec<u8>,
    },
}

impl Write {
    /// The key this write is about.
    pub fn key(&self) -> &[u8] {
        match self {
            Write::Put { key, .. } | Write::Delete { key } => key,
        }
    }
}

/// Why storage failed. Cloned to every caller whose save was in the failed
/// batch.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StorageError {
    /// The embedded database reported an error (I/O, disk full, corruption).
    #[error("storage: {0}")]
    Backend(#[source] Arc<redb::Error>),
    /// The database could not be reopened after an earlier failure (it is
    /// tried again on the next operation).
    #[error("storage: the database is closed after a failure and could not be reopened yet")]
    Closed,
    /// The storage call panicked on its blocking thread.
    #[error("storage: the storage thread panicked")]
    Panicked,
    /// A failure injected by a test through [`MemoryStorage::fail_writes`].
    #[error("storage: injected write failure")]
    Injected,
    /// A shared store failed (it refused a statement, or failed otherwise).
    #[error("storage: {0}")]
    Shared(#[source] Arc<dyn std::error::Error + Send + Sync>),
    /// A shared store cannot be reached now (its server down, restarting
    /// or handing over to another): the same command may succeed later.
    #[error("storage unavailable: {0}")]
    Unavailable(#[source] Arc<dyn std::error::Error + Send + Sync>),
    /// A write to a shared store by a command that does not hold the key
    /// (it never took it, or lost it to another process after a save,
    /// [`Step::save`]): nothing was written, and the session in memory may
    /// not be the stored one any more.
    #[error("storage: the session is not held by this command; nothing written")]
    Conflict,
}

impl<E: Into<redb::Error>> From<E> for StorageError {
    fn from(e: E) -> Self {
        StorageError::Backend(Arc::new(e.into()))
    }
}

/// Durable storage of session records, keyed by the session key's bytes.
///
/// Every method may block on I/O; the engine calls them from blocking
/// threads, never from its async tasks.
pub trait Storage: Send + Sync + 'static {
    /// The record stored under `key`, if any.
    fn load(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;
    /// Apply a batch of writes atomically and durably: when this returns
    /// `Ok`, every write of the batch survives a crash.
    fn write(&self, batch: &[Write]) -> Result<(), StorageError>;
    /// Every stored session that has an expiration, with it: the engine
    /// rebuilds its expiry index from this at start.
    fn deadlines(&self) -> Result<Vec<(Vec<u8>, Timestamp)>, StorageError>;
    /// Move the record under `key` aside (it could not be decoded), so that
    /// it neither blocks its key nor is lost.
    fn quarantine(&self, key: &[u8], reason: &str) -> Result<(), StorageError>;
    /// The keys of records moved aside by [`Storage::quarantine`].
    fn quarantined(&self) -> Result<Vec<Vec<u8>>, StorageError>;
    /// A number that grows with every opening of the storage: records saved
    /// under an older generation were saved before the last restart.
    fn generation(&self) -> u64;

    /// For a store that several processes (engines) share: how one of them
    /// holds a key exclusively and finds the sessions that are due. `None`
    /// (the default) for a store only one engine uses: the engine's own
    /// per-key queue is then all the exclusivity there is, and its memory
    /// is the truth between two commands.
    fn shared(&self) -> Option<&dyn Shared> {
        None
    }
}

/// A store shared by several engines (in several processes): each command
/// runs inside a [`Step`] that holds the key against every other engine and
/// starts from the record as stored now.
pub trait Shared: Send + Sync {
    /// Wait until no other engine holds `key`, then hold it: the step
    /// carries the record stored now.
    fn begin<'a>(&'a self, key: &'a [u8]) -> Pending<'a, Box<dyn Step>>;
    /// Up to `limit` keys starting with `prefix` whose expiration is at or
    /// before `now`, soonest first, leaving out keys that a step holds now
    /// (its release settles the deadline).
    fn due<'a>(
        &'a self,
        prefix: &'a [u8],
        now: Timestamp,
        limit: usize,
    ) -> Pending<'a, Vec<Vec<u8>>>;
}

/// One key held exclusively across engines (see [`Shared::begin`]). Dropped
/// without [`Step::finish`], it lets the key go and nothing it did not save
/// remains.
pub trait Step: Send + Sync {
    /// The key's record as stored when the step began (or at its last
    /// [`Step::save`]).
    fn record(&self) -> Option<&[u8]>;
    /// Make `write` durable now and go on holding the key. Ok once the
    /// write is durable, even if the key could not be held again after it
    /// (another engine took it): then later writes through the step fail
    /// with [`StorageError::Conflict`] and write nothing. An error means
    /// the write was not made. Dropped before it answers (its command
    /// cancelled), the write is made or not, as after a crash, and the
    /// step is gone.
    fn save<'a>(&'a mut self, write: &'a Write) -> Pending<'a, ()>;
    /// Whether the step still holds the key: false once a
    /// [`save`](Step::save) could not take it again, when another engine
    /// may act on the key (a caller about to write beside the record, such
    /// as files the record names, must not).
    fn held(&self) -> bool;
    /// Make `write` (if any) durable and let the key go.
    fn finish<'a>(self: Box<Self>, write: Option<&'a Write>) -> Pending<'a, ()>;
    /// Lets the key go now, with nothing the step wrote since its last
    /// [`save`](Step::save) kept (a command that failed part-way must not
    /// have its partial writes committed by the release); later writes
    /// through the step fail ([`StorageError::Conflict`]).
    fn abandon(&mut self);
    /// Writes `write`, the record of another key, in this step's
    /// transaction: durable with the step's next [`save`](Step::save) or
    /// [`finish`](Step::finish), or not at all, and never once the step no
    /// longer holds its own key (the write is fenced by that hold). With
    /// `if_absent`, a record already stored under that key is kept. `false`:
    /// the store cannot (or the step lost its key); nothing was done.
    fn put_beside(&mut self, write: Write, if_absent: bool) -> bool;
    /// The store's own part of the step, for the store's other tables:
    /// writes it takes become durable with the step's next
    /// [`save`](Step::save) or [`finish`](Step::finish), in the same
    /// transaction, and vanish with the step if that fails or the step is
    /// dropped. The store that made the step knows its type (it downcasts
    /// it); `None` when the store offers none. No default: a wrapper
    /// around a step must pass it on, or the writes it carries would fall
    /// back to transactions of their own.
    fn joint(&mut self) -> Option<&mut (dyn std::any::Any + Send + Sync)>;
}
