//! What the caller plugs in to process due entries.

use std::future::Future;

use crate::Entry;

/// What a handler decided about an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Finished: the entry is removed.
    Done,
    /// Run again at this wall-clock second (attempts restart at 0); this is
    /// how periodic entries are kept going.
    Reschedule(u64),
    /// Failed: the entry is retried after the [`RetryPolicy`](crate::RetryPolicy)
    /// backoff, with its attempt count raised. A handler that wants to give
    /// up after some attempts returns `Done` for them.
    Failed(String),
}

/// Processes one due entry on a worker of the pool.
///
/// Closures `Fn(Entry) -> impl Future<Output = Outcome>` are handlers. A
/// handler that panics counts as [`Outcome::Failed`].
pub trait Handler: Send + Sync + 'static {
    /// Handles `entry`; the worker is busy until the returned future finishes.
    fn handle(&self, entry: Entry) -> impl Future<Output = Outcome> + Send;
}

impl<F, Fut> Handler for F
where
    F: Fn(Entry) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send,
{
    fn handle(&self, entry: Entry) -> impl Future<Output = Outcome> + Send {
        self(entry)
    }
}
