//! Why a string is not a valid id or timestamp: the errors of parsing.

/// Why a string is not a valid [`Id`](crate::Id).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The string is empty.
    #[error("an id must not be empty")]
    Empty,
    /// The string is longer than [`Id::MAX_LEN`](crate::Id::MAX_LEN) bytes.
    #[error("an id must be at most 64 characters long, got {0}")]
    TooLong(usize),
    /// The first character is not an ASCII letter or digit.
    #[error("an id must start with a letter or a digit")]
    BadStart,
    /// A character outside `A-Z a-z 0-9 . -`.
    #[error("an id may contain only A-Z a-z 0-9 . - (found {0:?})")]
    BadChar(char),
}

/// Why a string is not a valid message or process id (a ULID).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a valid ULID: {0:?}")]
pub struct UlidError(pub String);

/// Why a string is not a valid timestamp.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an RFC 3339 UTC timestamp: {0:?}")]
pub struct TimestampError(pub String);
