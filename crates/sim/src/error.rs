//! [`SimError`]: why a simulator step failed.

use estafeta_client::ClientError;

/// A simulator step failed: its own database, or a call the simulator
/// could not complete.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The processor's SQLite database failed.
    #[error("processor database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A call to the server failed (after the retries the simulator makes).
    #[error("call failed: {0}")]
    Client(#[from] ClientError),
    /// A body could not be built or read.
    #[error("message body: {0}")]
    Body(#[from] serde_json::Error),
}
