//! What the tests of more than one Estafeta crate need, kept once here
//! rather than reached into across crates: a dev-dependency of the crates
//! whose tests use it, never published.
//!
//! - `smtp_server` (feature `smtp-server`): an SMTP server on loopback that
//!   speaks the real protocol (STARTTLS, smtps, AUTH) and hands each
//!   accepted message to the test; the send queue's SMTP transport and the
//!   server's mailed alerts are tested against it.
//! - [`tmpfs`]: a real full disk, a small tmpfs the test mounts (as root)
//!   and fills; the session storage's and the server's full-disk tests run
//!   on it.
#![deny(missing_docs)]

#[cfg(feature = "smtp-server")]
pub mod smtp_server;
pub mod tmpfs;
