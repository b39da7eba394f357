//! Engine settings.

use std::time::Duration;

/// How the engine manages memory and batches writes.
#[derive(Clone, Debug)]
pub struct Config {
    /// Flush idle sessions out of memory when more than this many are held;
    /// flushing goes down to about 90% of it.
    pub flush_count_limit: usize,
    /// Flush a session that has been idle this long.
    pub flush_time_limit: Duration,
    /// At most this many saves go into one durable transaction.
    pub max_batch: usize,
    /// The cache is split into this many independently locked shards, so
    /// commands on different keys rarely contend.
    pub shards: usize,
    /// How long [`crate::Engine::stop`] waits for running commands to let
    /// their sessions go before it gives up with
    /// [`crate::Error::StopTimedOut`].
    pub stop_wait: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            flush_count_limit: 1_000_000,
            flush_time_limit: Duration::from_secs(600),
            max_batch: 1024,
            shards: 64,
            stop_wait: Duration::from_secs(30),
        }
    }
}
