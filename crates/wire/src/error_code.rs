//! [`ErrorCode`]: every machine-readable code an error answer carries.

use std::fmt;
use std::str::FromStr;

/// Declares the codes once: each variant, its wire spelling and what it
/// means; `as_str`, `FromStr` and `ALL` are derived from that one list.
macro_rules! error_codes {
    ($( $(#[doc = $doc:literal])* $variant:ident = $text:literal, )*) => {
        /// The `code` of an error answer (`{"version":1,"error":{"code":…}}`).
        ///
        /// The server sends only these. [`crate::ErrorDetail::code`] stays a
        /// string so that a client built against an older list still reads
        /// an answer carrying a newer code; parse it with
        /// [`str::parse::<ErrorCode>`] to match on it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The code as written on the wire.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( ErrorCode::$variant => $text, )*
                }
            }
        }

        impl FromStr for ErrorCode {
            type Err = UnknownErrorCode;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $text => Ok(ErrorCode::$variant), )*
                    _ => Err(UnknownErrorCode(s.to_owned())),
                }
            }
        }
    };
}

error_codes! {
    /// The request is malformed in a way no more specific code names.
    BadRequest = "bad_request",
    /// The body is not the JSON the route expects (syntax, a missing or
    /// mistyped field, the wrong version, nested too deeply).
    BadJson = "bad_json",
    /// The body is not sent as `application/json`.
    BadContentType = "bad_content_type",
    /// An upload's idempotency key is empty or too long.
    BadIdempotencyKey = "bad_idempotency_key",
    /// An id in the path or body is not a valid id.
    BadId = "bad_id",
    /// A folder name in the path is not one of the five folders.
    BadFolder = "bad_folder",
    /// A path parameter cannot be read.
    BadPath = "bad_path",
    /// A query parameter cannot be read.
    BadQuery = "bad_query",
    /// `start`'s `max_files` or `max_mb` is out of the server's range.
    BadLimits = "bad_limits",
    /// A list's page `limit` is out of its allowed range.
    BadLimit = "bad_limit",
    /// A webhook URL is malformed or names a refused host.
    BadWebhookUrl = "bad_webhook_url",
    /// A new admin token is too short or malformed.
    BadAdminToken = "bad_admin_token",
    /// `prepare`'s results do not match the process's list.
    ResultsMismatch = "results_mismatch",
    /// A reply is addressed to no device of the enterprise.
    UnknownRecipient = "unknown_recipient",
    /// No token, or one the server does not know.
    Unauthorized = "unauthorized",
    /// The caller may not do this.
    Forbidden = "forbidden",
    /// The thing asked for, or the route, does not exist.
    NotFound = "not_found",
    /// The route exists; the method does not.
    MethodNotAllowed = "method_not_allowed",
    /// The request body did not arrive in time.
    RequestTimeout = "request_timeout",
    /// It exists already.
    AlreadyExists = "already_exists",
    /// Something else still refers to it (a subsystem with devices, …).
    InUse = "in_use",
    /// Messages wait or a process is open; delete with `force`.
    NotEmpty = "not_empty",
    /// The admin token is pinned by the server's configuration.
    AdminTokenPinned = "admin_token_pinned",
    /// The request body is over the route's size limit.
    BodyTooLarge = "body_too_large",
    /// The call does not fit the process's state.
    NotInProcess = "not_in_process",
    /// The process is not in doubt, so there is nothing to settle.
    NotInDoubt = "not_in_doubt",
    /// The message belongs to a live process and cannot be moved now.
    HeldByProcess = "held_by_process",
    /// Storage failed; nothing was changed, retry later.
    StorageError = "storage_error",
    /// The disk is full; nothing was changed, retry later.
    StorageFull = "storage_full",
    /// Start-up processing is not done yet; retry later.
    NotReady = "not_ready",
    /// The server is stopping; retry (on another node or after restart).
    Stopping = "stopping",
    /// Too many wrong tokens came from the caller's address: retry after
    /// the wait `Retry-After` gives.
    TooManyAttempts = "too_many_attempts",
    /// The server serves as many connections as it may, and this one only
    /// the operator's routes; retry later.
    TooBusy = "too_busy",
    /// The server failed in a way it did not expect; retry later.
    Internal = "internal",
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A code that is not in [`ErrorCode`] (sent by a newer server).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown error code {0:?}")]
pub struct UnknownErrorCode(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_parses_back() {
        for code in ErrorCode::ALL {
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(*code));
        }
        assert_eq!(
            "no_such_code".parse::<ErrorCode>(),
            Err(UnknownErrorCode("no_such_code".into()))
        );
    }

    #[test]
    fn codes_are_distinct_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            let s = code.as_str();
            assert!(seen.insert(s), "{s} twice");
            assert!(
                s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{s}"
            );
        }
    }
}
