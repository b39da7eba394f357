//! What the expiry manager is told, and what a flush it asked for became:
//! the words between the manager and the parts it drives.

use crate::clock::Timestamp;

/// What the manager is told besides releases.
pub(crate) enum ExpiryMsg<K> {
    /// A session ended.
    Remove(K),
    /// The engine stopped.
    Stop,
}

/// What became of a flush attempt.
pub(crate) enum Flushed {
    /// Flushed, or not needed any more (touched or locked meanwhile; its
    /// release lists it again).
    Done,
    /// Nothing to flush or it changed meanwhile.
    Skipped,
    /// It expires soon: stays in memory with this expiration.
    KeepResident(Option<Timestamp>),
    /// It was never stored and is gone now: forget it.
    Forget,
}
