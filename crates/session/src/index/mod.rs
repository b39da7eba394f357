//! Expiry indexes: which sessions expire when, and which in-memory sessions
//! have been idle longest.
//!
//! The expiry manager owns one index and is its only user, so an index needs
//! no locking. [`BucketIndex`] (time slices, with a touched key copied
//! forward into its current slice and whole slices dropped at once) is the
//! engine's default ([`DefaultIndex`]). With the `list-map-index` feature,
//! `ListMapIndex` (a last-access list, a hash and an ordered map of
//! expirations) is there too, for `benches/expiry_index.rs` to measure the
//! two side by side.

mod bucket;
#[cfg(any(test, feature = "list-map-index"))]
// Without the feature only the model tests use it.
#[cfg_attr(not(feature = "list-map-index"), allow(unreachable_pub))]
mod list_map;

pub use bucket::BucketIndex;
#[cfg(feature = "list-map-index")]
pub use list_map::ListMapIndex;

use crate::clock::Timestamp;

/// The index the engine uses unless told otherwise (the faster one in
/// `BENCHMARKS.md`).
pub type DefaultIndex<K> = BucketIndex<K>;

/// What the expiry manager needs to know about sessions.
pub trait ExpiryIndex<K>: Send + 'static {
    /// Record a key's expiration and last access, replacing what was known.
    /// `last_access` is `None` for a session that is not in memory (flushed,
    /// or known only from storage after a restart).
    fn touch(&mut self, key: &K, expires_at: Option<Timestamp>, last_access: Option<Timestamp>);
    /// Forget a key.
    fn remove(&mut self, key: &K);
    /// Remove and append to `out` every key whose expiration is at or before
    /// `now`.
    fn take_expired(&mut self, now: Timestamp, out: &mut Vec<K>);
    /// The earliest expiration known.
    fn next_expiry(&mut self) -> Option<Timestamp>;
    /// The last access of the longest-idle session in memory.
    fn oldest_idle(&mut self) -> Option<Timestamp>;
    /// Take up to `max` in-memory keys, longest idle first, whose last access
    /// is before `idle_before` (any, if `None`); they are marked as no longer
    /// in memory (their expiration stays known) and appended to `out` with
    /// the last access they had.
    fn take_idle(
        &mut self,
        idle_before: Option<Timestamp>,
        max: usize,
        out: &mut Vec<(K, Timestamp)>,
    );
    /// How many keys are in memory.
    fn resident(&self) -> usize;
    /// How many keys the index knows.
    fn len(&self) -> usize;
    /// Whether the index knows no key.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod model_tests;
