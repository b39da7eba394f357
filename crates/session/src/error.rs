//! What can go wrong when asking for, saving or releasing a session.

use crate::storage::StorageError;
use std::time::Duration;

/// An engine operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The engine is stopping or stopped: no new commands are taken, and
    /// commands that were queued are answered with this.
    #[error("the session engine is stopping")]
    Stopping,
    /// [`crate::Engine::stop`] gave up: commands still held sessions after
    /// [`crate::Config::stop_wait`]. Nothing was saved; the engine takes no
    /// new commands, and `stop` can be called again.
    #[error(
        "the session engine did not stop: {held} session(s) still held by commands after {waited:?}"
    )]
    StopTimedOut {
        /// How many sessions were still held.
        held: usize,
        /// How long `stop` waited for them.
        waited: Duration,
    },
    /// The session is held by another command (only from the non-waiting
    /// [`crate::Engine::try_get`]).
    #[error("the session is busy")]
    Busy,
    /// Storage failed; a session that could not be saved stays in memory,
    /// marked dirty, and is saved on a later attempt.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The session state could not be serialized.
    #[error("session state does not serialize: {0}")]
    Encode(#[source] serde_json::Error),
    /// The engine's background task that ran a submitted command ended
    /// without an answer (it panicked), or an [`crate::Acquire`] was polled
    /// again after it finished.
    #[error("the submitted command did not complete")]
    Lost,
}
