//! Typed errors: why an entry was refused or how it failed.
//!
//! Every entry ends with either its transport's answer or one of these, so a
//! caller can tell "try again later" (`HostDown`, `Busy`) from "the remote side
//! said no" (`Transport`) without parsing strings.

use thiserror::Error;

/// How an entry failed, or why it was refused when added.
#[derive(Debug, Error)]
pub enum SendError {
    /// The host is down and the entry's type is not queueable while down.
    #[error("host is down")]
    HostDown,
    /// A prior one-shot entry (a health probe) for this host and type is still unanswered.
    #[error("a one-shot entry of this type is already in flight for this host")]
    Busy,
    /// The host went down while the entry was in its ready queue, or the
    /// transport gave up on the entry without answering.
    #[error("connection aborted")]
    ConnectionAborted,
    /// The entry was still queued when its deadline passed.
    #[error("deadline expired while queued")]
    Expired,
    /// The host was removed before the entry was sent.
    #[error("host removed")]
    HostRemoved,
    /// The transport failed to deliver the entry or the remote side refused it.
    #[error("transport: {0}")]
    Transport(#[from] TransportError),
    /// The request or the queue configuration is invalid.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// The queue is shutting down.
    #[error("send queue is shutting down")]
    ShuttingDown,
}

/// A configuration error: found when the queue or a transport is built, or
/// when an entry names something the configuration does not have.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// No request types were configured.
    #[error("at least one request type is required")]
    NoTypes,
    /// A type's window is 0, so nothing of it could ever be sent.
    #[error("request type {kind} ({name}) has a window of 0")]
    ZeroWindow {
        /// Index of the type.
        kind: usize,
        /// Name of the type.
        name: String,
    },
    /// The adaptive window bounds are not `1 <= min <= window <= max`.
    #[error(
        "request type {kind} ({name}) has adaptive bounds that do not hold 1 <= min <= window <= max"
    )]
    AdaptiveBounds {
        /// Index of the type.
        kind: usize,
        /// Name of the type.
        name: String,
    },
    /// A probe policy needs a failure threshold of at least 1.
    #[error("request type {kind} ({name}) has a probe failure threshold of 0")]
    ZeroProbeThreshold {
        /// Index of the type.
        kind: usize,
        /// Name of the type.
        name: String,
    },
    /// The send worker pool size is 0.
    #[error("the send worker pool needs at least one worker")]
    ZeroWorkers,
    /// The per-host send concurrency is 0.
    #[error("per-host send concurrency must be at least 1")]
    ZeroHostSends,
    /// An entry named a type that the queue does not have.
    #[error("unknown request type {0}")]
    UnknownKind(usize),
    /// A URL in a transport configuration or a payload does not parse.
    #[error("invalid URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// An e-mail address does not parse.
    #[error("invalid e-mail address {address:?}: {reason}")]
    InvalidAddress {
        /// The address as given.
        address: String,
        /// Why it was refused.
        reason: String,
    },
    /// A value given to a transport is invalid (an HTTP method, a header, a message).
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was invalid.
        what: &'static str,
        /// Why it was refused.
        reason: String,
    },
}

/// A failure reported by a transport.
#[derive(Debug, Error)]
pub enum TransportError {
    /// The HTTP request failed (connect, timeout, protocol).
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    /// The HTTP server answered with a status other than 2xx.
    #[error("http status {0}")]
    Status(u16),
    /// The SMTP conversation failed or the server refused the message.
    #[error("smtp: {0}")]
    Smtp(#[from] lettre::transport::smtp::Error),
    /// A transport-specific failure described in words (used by custom transports).
    #[error("{0}")]
    Other(String),
}
