//! The cluster store's errors.

use deadpool_postgres::PoolError;

/// Why a cluster store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store URL is not a valid libpq URL or connection string.
    #[error("invalid store URL: {0}")]
    Url(#[source] tokio_postgres::Error),
    /// The store URL names no host to connect to.
    #[error("invalid store URL: it names no host")]
    NoHost,
    /// The URL's TLS settings (`sslmode`, `sslrootcert`, `sslcert`,
    /// `sslkey`) cannot be used: an unknown mode, a file that cannot be read.
    #[error("invalid store TLS settings: {0}")]
    Tls(String),
    /// The pool could not be built from the given options.
    #[error("invalid store options: {0}")]
    Options(String),
    /// No writable PostgreSQL server could be reached (all hosts down, a
    /// failover under way, the connection lost mid-call). Worth retrying:
    /// callers answer 503 with `Retry-After`.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    /// The server refused a statement (a bug, or a schema that does not
    /// match this build).
    #[error("store query failed: {}", with_causes(.0))]
    Query(#[source] tokio_postgres::Error),
    /// The schema migrations could not be applied (other than for a lost
    /// connection, which is [`Error::Unavailable`]).
    #[error("store schema migration failed: {0}")]
    Migration(#[source] refinery::Error),
}

impl Error {
    /// Whether the operation may succeed when tried again (the database is
    /// unreachable or switching primaries), as opposed to a refusal that
    /// will repeat.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }
}

/// SQLSTATE classes and codes that mean "this server cannot serve writes
/// now", not "this statement is wrong": connection exceptions (08…), an
/// administrator or crash shutdown (57P01, 57P02, 57P03), a read-only server
/// (25006: a demoted primary), the idle-in-transaction timeout that ended
/// the session (25P03), and a serialization or deadlock retry (40001, 40P01).
fn is_transient(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "25006" | "25P03" | "40001" | "40P01"
        )
}

/// Whether `e` is the server out of reach or switching, not a refusal.
fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
    e.is_closed() || io || e.code().is_some_and(|c| is_transient(c.code()))
}

/// An error's message followed by its causes' (a failed TLS handshake says
/// why: an unknown issuer, a certificate for another name), each once.
fn with_causes(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let line = c.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        cause = c.source();
    }
    text
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        if is_unavailable(&e) {
            Error::Unavailable(with_causes(&e))
        } else {
            Error::Query(e)
        }
    }
}

impl From<refinery::Error> for Error {
    /// A migration run whose connection failed under it (lost, or the
    /// server going away) is the store unavailable, worth trying again;
    /// any other failure is the migration's.
    fn from(e: refinery::Error) -> Self {
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            if let Some(pg) = c.downcast_ref::<tokio_postgres::Error>()
                && is_unavailable(pg)
            {
                return Error::Unavailable(format!("applying the schema migrations: {pg}"));
            }
            cause = c.source();
        }
        Error::Migration(e)
    }
}

impl From<PoolError> for Error {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Backend(e) => e.into(),
            other => Error::Unavailable(other.to_string()),
        }
    }
}
