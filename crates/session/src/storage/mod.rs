//! Durable storage of session records.
//!
//! The engine sees storage as a small synchronous trait and calls it from
//! blocking threads. Writes come in batches: the engine's writer task collects
//! the saves of many sessions and commits them as one durable transaction
//! (group commit), so that many releases share one fsync.

mod memory;
mod redb_store;

pub use memory::MemoryStorage;
pub use redb_store::RedbStorage;

use crate::clock::Timestamp;
use std::sync::Arc;

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
}
