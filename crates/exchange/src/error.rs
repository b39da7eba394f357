//! Typed errors of the exchange domain.
//!
//! Each module has its own error type so that callers match on exactly the
//! failures an operation can have; the server maps them to HTTP codes
//! (`IdError` → 400, `MailboxError::is_storage_full` → 503, and so on).
//! The errors of parsing ids and timestamps belong to the wire types and
//! are re-exported from `estafeta-wire`.

use std::io;
use std::path::PathBuf;

pub use estafeta_wire::error::{IdError, TimestampError, UlidError};

/// Why a file name is not a message file name made by this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileNameError {
    /// The name does not have the `<time>_<id>_<from>_<to>_<subsystem>.msg` shape.
    #[error("not a message file name: {0:?}")]
    Shape(String),
    /// The time part is not `YYYYMMDDTHHMMSSmmmZ`.
    #[error("bad time in message file name: {0:?}")]
    Time(String),
    /// The message id part is not a ULID.
    #[error(transparent)]
    MessageId(#[from] UlidError),
    /// A sender, recipient or subsystem part is not a valid id.
    #[error(transparent)]
    Id(#[from] IdError),
}

/// What went wrong with the storage under a mailbox operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageKind {
    /// The disk (or a quota) is full: the server answers 503 and retries later.
    Full,
    /// Any other I/O failure (EIO, a path whose parent is not a folder, ...).
    Io,
    /// The store cannot be reached now (a database server down, restarting
    /// or handing over to another): nothing was changed, and the same call
    /// may succeed when tried again.
    Unavailable,
}

impl std::fmt::Display for StorageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StorageKind::Full => "storage full",
            StorageKind::Io => "storage I/O failed",
            StorageKind::Unavailable => "store unavailable",
        })
    }
}

/// Failures of mailbox operations.
///
/// Every variant leaves nothing partial visible: a failed write has removed
/// its temporary file, a failed move left the file in one of its two places.
#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    /// The storage failed; `kind` tells a full disk and a store that
    /// cannot be reached from other I/O errors.
    #[error("{kind} at {path}: {source}")]
    Storage {
        /// Full disk, an unreachable store, or another I/O failure.
        kind: StorageKind,
        /// The path the failing operation touched (or, for a store that is
        /// not files, what it was doing).
        path: PathBuf,
        /// The operating system's error, or the store's wrapped in one.
        #[source]
        source: io::Error,
    },
    /// Neither the source nor the target of a move holds the file.
    #[error("message file {name} is in neither {from} nor {to}")]
    NotFound {
        /// The file name.
        name: String,
        /// The source folder.
        from: PathBuf,
        /// The target folder.
        to: PathBuf,
    },
    /// A message file does not look like a JSON object (it was damaged
    /// outside the server); it is not handed out.
    #[error("message file {0} is not a JSON object")]
    Corrupt(PathBuf),
    /// A message could not be serialized (cannot happen for well-formed
    /// [`Message`](crate::wire::Message) values; kept typed rather than panicking).
    #[error("cannot serialize message: {0}")]
    Serialize(#[source] serde_json::Error),
    /// The group-commit task has stopped (the runtime is shutting down).
    #[error("the mailbox sync task has stopped")]
    SyncStopped,
    /// A blocking task panicked or was cancelled.
    #[error("a blocking storage task failed: {0}")]
    Join(String),
    /// The mailbox was deleted: nothing is written into it any more.
    #[error("no mailbox {0}: it was deleted")]
    NoMailbox(crate::id::Id),
}

impl MailboxError {
    /// Wraps an I/O error with the path it happened at, classifying a full disk.
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        let kind = if is_full(&source) {
            StorageKind::Full
        } else {
            StorageKind::Io
        };
        Self::Storage {
            kind,
            path: path.into(),
            source,
        }
    }

    /// A failure of a store that is not files (a database server) while
    /// doing `what`: [`StorageKind::Unavailable`] when `unavailable` (it
    /// cannot be reached now; retry), else [`StorageKind::Io`].
    pub fn store(
        what: impl Into<PathBuf>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
        unavailable: bool,
    ) -> Self {
        Self::Storage {
            kind: match unavailable {
                true => StorageKind::Unavailable,
                false => StorageKind::Io,
            },
            path: what.into(),
            source: io::Error::other(source),
        }
    }

    /// True when the store cannot be reached now (HTTP 503 with
    /// `Retry-After`, like any storage failure; told apart in logs).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Storage {
                kind: StorageKind::Unavailable,
                ..
            }
        )
    }

    /// True when the failure is a full disk or quota (HTTP 503 with `Retry-After`).
    pub fn is_storage_full(&self) -> bool {
        matches!(
            self,
            Self::Storage {
                kind: StorageKind::Full,
                ..
            }
        )
    }
}

/// ENOSPC and EDQUOT both mean "no room"; std names them `StorageFull` and
/// `QuotaExceeded`.
fn is_full(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

/// Failures of the tenancy registry.
#[derive(Debug, thiserror::Error)]
pub enum TenancyError {
    /// The enterprise, subsystem, database or device already exists (409).
    #[error("{kind} {id} already exists")]
    AlreadyExists {
        /// What kind of thing ("enterprise", "subsystem", "database or device").
        kind: &'static str,
        /// Its id.
        id: String,
    },
    /// The enterprise does not exist (404).
    #[error("unknown enterprise {0}")]
    UnknownEnterprise(String),
    /// The subsystem does not exist in the enterprise (404).
    #[error("unknown subsystem {subsystem} in enterprise {enterprise}")]
    UnknownSubsystem {
        /// The enterprise.
        enterprise: String,
        /// The subsystem.
        subsystem: String,
    },
    /// No database or device of that kind has this id (404).
    #[error("no {kind} {id}")]
    Unknown {
        /// `"database"` or `"device"`.
        kind: &'static str,
        /// The id asked for.
        id: String,
    },
    /// The enterprise or subsystem is still used, so it is not deleted (409).
    #[error("{kind} {id} is in use: {reason}")]
    InUse {
        /// `"enterprise"` or `"subsystem"`.
        kind: &'static str,
        /// Its id.
        id: String,
        /// What still uses it.
        reason: String,
    },
    /// The admin token comes from `ESTAFETA_ADMIN_TOKEN`, which the server
    /// cannot change (409).
    #[error(
        "the admin token is pinned by ESTAFETA_ADMIN_TOKEN: set a new value there and restart the server"
    )]
    AdminTokenPinned,
    /// The configured admin token is empty or has surrounding whitespace.
    #[error("the admin token must be non-empty printable text without surrounding whitespace")]
    BadAdminToken,
    /// The registry database failed.
    #[error("registry storage: {0}")]
    Storage(#[from] redb::Error),
    /// A file under `.estafeta/` could not be read or written.
    #[error("registry file {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A stored record could not be decoded (the registry file was damaged).
    #[error("damaged registry record for {key}: {reason}")]
    Corrupt {
        /// The record's key.
        key: String,
        /// What was wrong.
        reason: String,
    },
    /// The operating system's random source failed.
    #[error("random source failed: {0}")]
    Random(String),
    /// A blocking task panicked or was cancelled.
    #[error("a blocking registry task failed: {0}")]
    Join(String),
    /// A shared registry store (a cluster's database) refused a statement
    /// or failed otherwise.
    #[error("registry store: {0}")]
    Shared(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A shared registry store cannot be reached now (its server down,
    /// restarting or handing over): the same call may succeed later.
    #[error("registry store unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl TenancyError {
    /// Wraps an I/O error with the path it happened at.
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

/// Why a caller's start limits (API_1 `max_files`, `max_mb`) are unusable (400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    /// `max_files` is 0.
    #[error("max_files must be at least 1")]
    NoFiles,
    /// `max_mb` is zero, negative or not a finite number.
    #[error("max_mb must be a positive number, got {0}")]
    BadMegabytes(f64),
}
