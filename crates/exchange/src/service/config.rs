//! Settings of the exchange domain (the server fills them from its
//! configuration file and environment).

use super::snapshot::Quiesce;
use crate::store::Limits;
use std::path::PathBuf;
use std::time::Duration;

/// Everything the exchange needs to know at start.
#[derive(Clone, Debug)]
pub struct ExchangeConfig {
    /// The data folder: mailboxes, and `.estafeta/` for the server's own state.
    pub data_dir: PathBuf,
    /// The admin token from the environment; made and kept on disk if unset.
    pub admin_token: Option<String>,
    /// The server's limits for a process start (10 files, 20 MB by default).
    pub limits: Limits,
    /// A STARTED process older than this is removed (TIMED_OUT).
    pub started_timeout: Duration,
    /// A READY_TO_COMMIT process older than this is in doubt.
    pub ready_timeout: Duration,
    /// Files in `Log`, `Prepared`, `Unknown`, `Error` older than this are
    /// removed; ended processes are remembered this long.
    pub retention: Duration,
    /// How long a device's idempotency keys are remembered.
    pub idempotency_ttl: Duration,
    /// The pause that online backups take; the server's own stores of the
    /// same data folder are given it too.
    pub quiesce: Quiesce,
}

impl ExchangeConfig {
    /// The protocol's default timeouts and limits (`docs/protocol.md`), on
    /// `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        ExchangeConfig {
            data_dir: data_dir.into(),
            admin_token: None,
            limits: Limits::default(),
            started_timeout: Duration::from_secs(600),
            ready_timeout: Duration::from_secs(300),
            retention: Duration::from_secs(90 * 24 * 3600),
            idempotency_ttl: Duration::from_secs(7 * 24 * 3600),
            quiesce: Quiesce::default(),
        }
    }
}
