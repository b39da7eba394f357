//! What the engine's handles and its expiry manager share: the cache, and
//! the ways into it that the expiry manager takes (the keys touched, those
//! due in a shared store, expiring and flushing one key).

use crate::clock::Timestamp;
use crate::data::State;
use crate::error::Error;
use crate::expiry::message::Flushed;
use crate::guard::complete;
use crate::key::SessionKey;
use crate::lifecycle::Core;
use crate::shard::{self, Cache, Entered};
use crate::stats::Counters;
use std::sync::Arc;

/// The most due keys read from a shared store at one look.
const DUE_BATCH: usize = 100;

/// State shared by the engine handle and the expiry manager: the cache.
/// Dropping it (the last handle went) breaks the cache's cycle with its
/// cells.
pub(crate) struct Shared<K: SessionKey, S: State> {
    pub(crate) cache: Arc<Cache<K, S>>,
}

impl<K: SessionKey, S: State> Drop for Shared<K, S> {
    fn drop(&mut self) {
        self.cache.clear();
    }
}

impl<K: SessionKey, S: State> Shared<K, S> {
    pub(crate) fn core(&self) -> &Core<K, S> {
        &self.cache.core
    }

    /// Take the key if it is free, or queue for it (or answer busy).
    #[inline]
    pub(crate) fn enter(&self, key: K, wait: bool) -> Result<Entered<K, S>, Error> {
        let hash = self.core().hash(&key);
        self.cache.enter(hash, key, wait)
    }

    /// For the expiry manager: the keys released since it last looked.
    pub(crate) fn drain_touched(
        &self,
        now: Timestamp,
        out: &mut Vec<(K, Option<Timestamp>, Timestamp)>,
    ) {
        self.cache.drain_touched(now, out);
    }

    /// The expiry manager found the key due: finalize it unless a command
    /// holds it (its release puts it back in the index).
    pub(crate) async fn expire_key(&self, key: K) {
        let Ok(entered) = self.enter(key, false) else {
            return;
        };
        match complete(entered, false).await {
            Ok(Some(guard)) => {
                let _ = guard.release().await;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "expiring a session failed; it will be retried"),
        }
    }

    /// With a shared storage: the keys due by `now` in the store, whichever
    /// engine set their deadlines (one that died included), leaving out
    /// those a step holds. Each is then expired as usual: its step reads
    /// the record as stored, so a key another engine already finalized is
    /// no longer due and nothing happens twice.
    pub(crate) async fn due_in_store(&self, now: Timestamp) -> Vec<K> {
        let due = match self.core().storage.shared() {
            Some(shared) => shared.due(b"", now, DUE_BATCH).await,
            None => Ok(Vec::new()),
        };
        match due {
            Ok(keys) => keys.iter().filter_map(|k| K::from_bytes(k)).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "reading due sessions from the shared store failed; retrying");
                Vec::new()
            }
        }
    }

    /// Flush an idle session out of memory, if it is still idle since
    /// `last_access` and does not expire within five seconds.
    pub(crate) async fn flush_key(
        &self,
        key: K,
        last_access: Timestamp,
        now: Timestamp,
    ) -> Flushed {
        let hash = self.core().hash(&key);
        let mut owned = match self.cache.take_for_flush(hash, &key, last_access, now) {
            Ok(owned) => owned,
            Err(outcome) => return outcome,
        };
        // With a shared storage memory is not the truth: nothing to save.
        let cell = &mut *owned;
        let ok = match cell.session.as_mut() {
            Some(s) if !self.core().shared => {
                self.core().save(&key, s, &mut cell.step).await.is_ok()
            }
            _ => true,
        };
        shard::release(hash, &key, owned, ok);
        if ok {
            Counters::add(&self.core().counters.flushes, 1);
        }
        Flushed::Done
    }
}
