//! [`ClientError`]: why a call did not give its typed answer.

use reqwest::StatusCode;

/// A failed call: the request did not get through, or the server answered
/// with an HTTP error (and its error JSON), or with a body that does not
/// parse. Status words such as `BUSY` or `CANCELLED` are not errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The base URL given to [`Client::new`](crate::Client::new) is not a URL.
    #[error("invalid base URL {url:?}: {reason}")]
    BadUrl {
        /// The text given.
        url: String,
        /// Why it does not parse.
        reason: String,
    },
    /// Connecting, sending or receiving failed (no HTTP answer).
    #[error("HTTP transport failed: {0}")]
    Transport(#[from] reqwest::Error),
    /// The server answered with an HTTP error status.
    #[error("server answered {status}: {code}: {message}")]
    Api {
        /// The HTTP status (400, 401, 403, 404, 409, 413, 422, 503, …).
        status: StatusCode,
        /// The server's error code (`forbidden`, `bad_request`, …), or
        /// `http_<status>` when the answer was not the error JSON.
        code: String,
        /// The server's message (or the body, when it was not the error JSON).
        message: String,
        /// Seconds from the `Retry-After` header (503 answers).
        retry_after: Option<u64>,
    },
    /// A success status whose body is not the expected JSON.
    #[error("unexpected answer body ({status}): {reason}")]
    BadAnswer {
        /// The HTTP status.
        status: StatusCode,
        /// Why the body does not parse.
        reason: String,
    },
}

impl ClientError {
    /// The HTTP status of an answer, if there was one.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } | ClientError::BadAnswer { status, .. } => {
                Some(*status)
            }
            ClientError::Transport(e) => e.status(),
            ClientError::BadUrl { .. } => None,
        }
    }

    /// Whether the same call may succeed later unchanged: the request did
    /// not get an answer (network, timeout), or the server answered 503
    /// (recovering, stopping, disk full). A 4xx answer will not change.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Transport(_) => true,
            ClientError::Api { status, .. } => *status == StatusCode::SERVICE_UNAVAILABLE,
            ClientError::BadUrl { .. } | ClientError::BadAnswer { .. } => false,
        }
    }

    /// The server's error code, for an HTTP error answer, as sent (a newer
    /// server may send a code this client does not know).
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The server's error code, for an HTTP error answer whose code this
    /// client knows: what to match on.
    pub fn error_code(&self) -> Option<estafeta_wire::ErrorCode> {
        self.code()?.parse().ok()
    }
}
