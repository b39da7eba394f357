//! The one error type of the exchange's operations, with the class of
//! failure the server turns into an HTTP status.

use crate::wire::ErrorCode;

/// What kind of failure an [`ExchangeError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or names something invalid (400).
    BadRequest,
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
}

impl ExchangeError {
    /// An error of `kind` with a stable machine-readable `code`.
    pub fn new(kind: ErrorKind, code: ErrorCode, message: impl Into<String>) -> Self {
        ExchangeError {
            kind,
            code,
            message: message.into(),
        }
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
            other => {
                tracing::error!(error = %other, "registry operation failed");
                ExchangeError::unavailable(ErrorCode::StorageError, other.to_string())
            }
        }
    }
}
