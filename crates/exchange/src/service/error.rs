//! The one error type of the exchange's operations, with the class of
//! failure the server turns into an HTTP status.

use crate::wire::ErrorCode;

/// What kind of failure an [`ExchangeError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or names something invalid (400).
    BadRequest,
    /// The caller's token is not (or no longer) known (401).
    Unauthorized,
    /// The caller may not do this (403).
    Forbidden,
    /// The thing asked for does not exist (404).
    NotFound,
    /// It exists already (409).
    Conflict,
    /// Well-formed but does not fit the state (422).
    Unprocessable,
    /// Storage is failing or full, or the server is stopping or recovering
    /// (503): retry later; nothing was changed.
    Unavailable,
}

/// An exchange operation failed; nothing it would have changed is visible.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ExchangeError {
    kind: ErrorKind,
    code: ErrorCode,
    message: String,
    /// The cause is a store that cannot be reached now.
    store_unavailable: bool,
}

impl ExchangeError {
    /// An error of `kind` with a stable machine-readable `code`.
    pub fn new(kind: ErrorKind, code: ErrorCode, message: impl Into<String>) -> Self {
        ExchangeError {
            kind,
            code,
            message: message.into(),
            store_unavailable: false,
        }
    }
    /// A store that cannot be reached now (a database server down,
    /// restarting or handing over to another): 503 `storage_error`, as a
    /// failing disk is; retry later.
    pub fn store_unavailable(m: impl Into<String>) -> Self {
        ExchangeError {
            store_unavailable: true,
            ..Self::unavailable(ErrorCode::StorageError, m)
        }
    }
    /// Whether the cause is a store that cannot be reached now, as opposed
    /// to a failing disk or a store refusing a statement (the answer is
    /// the same 503 `storage_error`; logs and callers tell them apart).
    pub fn is_store_unavailable(&self) -> bool {
        self.store_unavailable
    }
    /// The class of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// The stable code of the error JSON.
    pub fn code(&self) -> ErrorCode {
        self.code
    }
    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }
    pub(crate) fn bad_request(code: ErrorCode, m: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadRequest, code, m)
    }
    pub(crate) fn unauthorized(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthorized, ErrorCode::Unauthorized, m)
    }
    pub(crate) fn forbidden(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, ErrorCode::Forbidden, m)
    }
    pub(crate) fn not_found(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, ErrorCode::NotFound, m)
    }
    pub(crate) fn unprocessable(code: ErrorCode, m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unprocessable, code, m)
    }
    pub(crate) fn unavailable(code: ErrorCode, m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, code, m)
    }
}

impl From<crate::error::MailboxError> for ExchangeError {
    fn from(e: crate::error::MailboxError) -> Self {
        if let crate::error::MailboxError::NoMailbox(id) = &e {
            return ExchangeError::forbidden(format!("{id} is not a mailbox: it was deleted"));
        }
        if e.is_unavailable() {
            tracing::error!(error = %e, "mailbox operation failed: the store is unavailable; retry later");
            return ExchangeError::store_unavailable(e.to_string());
        }
        let code = if e.is_storage_full() {
            ErrorCode::StorageFull
        } else {
            ErrorCode::StorageError
        };
        tracing::error!(error = %e, "mailbox operation failed");
        ExchangeError::unavailable(code, e.to_string())
    }
}

impl From<crate::keys::KeysError> for ExchangeError {
    fn from(e: crate::keys::KeysError) -> Self {
        if let crate::keys::KeysError::Unavailable(_) = e {
            tracing::error!(error = %e, "idempotency key store failed: the store is unavailable; retry later");
            return ExchangeError::store_unavailable(e.to_string());
        }
        let code = if e.is_storage_full() {
            ErrorCode::StorageFull
        } else {
            ErrorCode::StorageError
        };
        tracing::error!(error = %e, "idempotency key store failed");
        ExchangeError::unavailable(code, e.to_string())
    }
}

impl From<estafeta_session::Error> for ExchangeError {
    fn from(e: estafeta_session::Error) -> Self {
        match e {
            estafeta_session::Error::Stopping => {
                ExchangeError::unavailable(ErrorCode::Stopping, "the server is stopping")
            }
            estafeta_session::Error::Storage(estafeta_session::StorageError::Unavailable(_)) => {
                tracing::error!(error = %e, "session operation failed: the store is unavailable; retry later");
                ExchangeError::store_unavailable(e.to_string())
            }
            other => {
                tracing::error!(error = %other, "session operation failed");
                ExchangeError::unavailable(ErrorCode::StorageError, other.to_string())
            }
        }
    }
}

impl From<crate::error::TenancyError> for ExchangeError {
    fn from(e: crate::error::TenancyError) -> Self {
        use crate::error::TenancyError as T;
        match e {
            T::AlreadyExists { .. } => {
                ExchangeError::new(ErrorKind::Conflict, ErrorCode::AlreadyExists, e.to_string())
            }
            T::InUse { .. } => {
                ExchangeError::new(ErrorKind::Conflict, ErrorCode::InUse, e.to_string())
            }
            T::AdminTokenPinned => ExchangeError::new(
                ErrorKind::Conflict,
                ErrorCode::AdminTokenPinned,
                e.to_string(),
            ),
            T::UnknownEnterprise(_) | T::UnknownSubsystem { .. } | T::Unknown { .. } => {
                ExchangeError::not_found(e.to_string())
            }
            T::BadAdminToken => ExchangeError::bad_request(ErrorCode::BadAdminToken, e.to_string()),
            T::Unavailable(_) => {
                tracing::error!(error = %e, "registry operation failed: the store is unavailable; retry later");
                ExchangeError::store_unavailable(e.to_string())
            }
            other => {
                tracing::error!(error = %other, "registry operation failed");
                ExchangeError::unavailable(ErrorCode::StorageError, other.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{MailboxError, TenancyError};
    use crate::keys::KeysError;

    /// A store that cannot be reached and a failing disk both answer 503
    /// `storage_error`; only the first says the store is unavailable.
    #[test]
    fn an_unavailable_store_is_told_apart_from_failed_io() {
        let down = MailboxError::store("db:put", "connection refused", true);
        assert!(down.is_unavailable() && !down.is_storage_full());
        assert!(
            down.to_string().starts_with("store unavailable at db:put"),
            "{down}"
        );
        let refused = MailboxError::store("db:put", "syntax error", false);
        assert!(!refused.is_unavailable());
        assert!(
            refused.to_string().starts_with("storage I/O failed"),
            "{refused}"
        );
        let disk = MailboxError::io("/x", std::io::Error::other("EIO"));
        let full = MailboxError::io("/x", std::io::ErrorKind::StorageFull.into());
        assert!(!disk.is_unavailable() && !full.is_unavailable());

        let session = |e: estafeta_session::StorageError| estafeta_session::Error::Storage(e);
        let cases: [(ExchangeError, bool, ErrorCode); 9] = [
            (down.into(), true, ErrorCode::StorageError),
            (refused.into(), false, ErrorCode::StorageError),
            (disk.into(), false, ErrorCode::StorageError),
            (full.into(), false, ErrorCode::StorageFull),
            (
                KeysError::Unavailable("connection refused".into()).into(),
                true,
                ErrorCode::StorageError,
            ),
            (
                KeysError::Backend("syntax error".into()).into(),
                false,
                ErrorCode::StorageError,
            ),
            (
                TenancyError::Unavailable("connection refused".into()).into(),
                true,
                ErrorCode::StorageError,
            ),
            (
                session(estafeta_session::StorageError::Unavailable(
                    std::sync::Arc::new(std::io::Error::other("connection refused")),
                ))
                .into(),
                true,
                ErrorCode::StorageError,
            ),
            (
                session(estafeta_session::StorageError::Shared(std::sync::Arc::new(
                    std::io::Error::other("syntax error"),
                )))
                .into(),
                false,
                ErrorCode::StorageError,
            ),
        ];
        for (e, unavailable, code) in cases {
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
            assert_eq!(e.code(), code, "{e}");
            assert_eq!(e.is_store_unavailable(), unavailable, "{e}");
        }
        let refused = ExchangeError::from(TenancyError::Shared("syntax error".into()));
        assert!(!refused.is_store_unavailable());
        assert_eq!(refused.code(), ErrorCode::StorageError);
    }
}
