//! Error types: what a caller of the scheduler and what a store can report.

/// Why a store could not serve a request.
///
/// A store error never leaves partial state behind: every [`Store`](crate::Store)
/// method is one transaction that either commits durably or changes nothing.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The redb database reported an error (I/O, corruption, a full disk).
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    /// A stored record could not be decoded.
    #[error("malformed stored record: {0}")]
    Malformed(String),
    /// An error from a store implementation outside this crate.
    #[error("store backend: {0}")]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

impl StoreError {
    /// Wraps any redb error type (they all convert into [`redb::Error`]).
    pub(crate) fn redb(err: impl Into<redb::Error>) -> Self {
        Self::Redb(err.into())
    }
}

/// Why a scheduler call failed. A failed call changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A source name is empty, too long or has characters outside `[A-Za-z0-9_.-]`.
    #[error("invalid source name {0:?}: 1 to 128 characters of [A-Za-z0-9_.-]")]
    InvalidSource(String),
    /// An entry id is empty or longer than 1024 bytes.
    #[error("invalid entry id (length {0}): 1 to 1024 bytes")]
    InvalidId(usize),
    /// The payload is larger than [`MAX_PAYLOAD`](crate::MAX_PAYLOAD).
    #[error("payload of {0} bytes is larger than the limit")]
    PayloadTooLarge(usize),
    /// The store failed; nothing was changed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another dispatcher is already running on this scheduler.
    #[error("a dispatcher is already running on this scheduler")]
    AlreadyRunning,
    /// The scheduler was closed with [`Scheduler::close`](crate::Scheduler::close).
    #[error("the scheduler is closed")]
    Closed,
}
