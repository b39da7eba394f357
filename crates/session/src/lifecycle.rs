//! What every shard of the cache shares (storage, clock, hooks, the writer
//! and the expiry manager's channels), and the steps of a session's life
//! that do not depend on where it is cached: loading, finalizing, recovery
//! on first load, saving, and lazy creation with its begin notification.

use crate::clock::{Clock, Timestamp};
use crate::config::Config;
use crate::data::SessionData;
use crate::engine::State;
use crate::error::Error;
use crate::expiry::ExpiryMsg;
use crate::hooks::{Finalize, Hooks};
use crate::key::SessionKey;
use crate::record::{self, Record};
use crate::shard::Cell;
use crate::stats::Counters;
use crate::storage::{Storage, StorageError, Write};
use crate::sync::AtomicBool;
use crate::writer::SaveRequest;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};

/// How long before a retry when finalization left a session still due.
const FINALIZE_RETRY: Duration = Duration::from_secs(1);

/// The engine's parts that every shard and guard reaches. Only read on the
/// hot path (the counters and flags change rarely), so the cache lines stay
/// shared between cores.
pub(crate) struct Core<K: SessionKey, S: State> {
    /// One hash per operation: it picks the shard and finds the slot.
    pub(crate) hasher: foldhash::fast::RandomState,
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) hooks: Arc<dyn Hooks<K, S>>,
    pub(crate) config: Config,
    pub(crate) generation: u64,
    pub(crate) stopping: AtomicBool,
    /// Signalled, while stopping, whenever a slot stops being locked:
    /// `stop` waits on it.
    pub(crate) released: Notify,
    /// Wakes the expiry manager before its planned time (a release with an
    /// expiration earlier than `next_wake`).
    pub(crate) wake_expiry: Arc<Notify>,
    /// When the expiry manager plans to look next (ms since the epoch).
    pub(crate) next_wake: AtomicU64,
    pub(crate) expiry_tx: mpsc::UnboundedSender<ExpiryMsg<K>>,
    pub(crate) writer_tx: mpsc::UnboundedSender<SaveRequest>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) runtime: tokio::runtime::Handle,
}

/// Run a storage call on a blocking thread.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, Error> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Error::from),
        Err(_) => Err(Error::Storage(StorageError::Panicked)),
    }
}

impl<K: SessionKey, S: State> Core<K, S> {
    pub(crate) fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Whether a session must be finalized or recovered before a command
    /// may see it. Reads the clock only for a session with a deadline.
    pub(crate) fn needs_ready(&self, s: &SessionData<S>) -> bool {
        s.expires_at.is_some_and(|t| t <= self.now())
            || (s.stored && s.generation < self.generation)
    }

    /// A new, empty session (the caller asked to create it).
    pub(crate) fn fresh(&self) -> SessionData<S> {
        SessionData::fresh(S::default(), self.now(), self.generation)
    }

    /// Finalize a session whose time has passed, and run the first-load hook
    /// on one saved by an earlier run.
    pub(crate) async fn ready(&self, key: &K, mut s: SessionData<S>) -> Option<SessionData<S>> {
        if s.expires_at.is_some_and(|t| t <= self.now()) {
            Counters::add(&self.counters.finalize_calls, 1);
            let verdict = self.hooks.finalize(key, &mut s).await;
            s = self.settle(key, s, verdict).await?;
        }
        if s.stored && s.generation < self.generation {
            let verdict = self.hooks.first_load(key, &mut s).await;
            // Saved under the new generation, so the hook runs once per restart.
            s.dirty = true;
            s = self.settle(key, s, verdict).await?;
        }
        Some(s)
    }

    /// Carry out a hook's verdict.
    async fn settle(
        &self,
        key: &K,
        mut s: SessionData<S>,
        verdict: Finalize,
    ) -> Option<SessionData<S>> {
        match verdict {
            Finalize::Keep => {
                if let Err(e) = self.save(key, &mut s).await {
                    tracing::warn!(?key, error = %e, "saving a finalized session failed; it stays dirty");
                }
                Some(s)
            }
            Finalize::End => {
                if s.stored {
                    let (tx, rx) = oneshot::channel();
                    let write = Write::Delete {
                        key: key.to_bytes(),
                    };
                    let deleted = match self.writer_tx.send(SaveRequest { write, done: tx }) {
                        Ok(()) => rx
                            .await
                            .map_err(|_| Error::Stopping)
                            .and_then(|r| r.map_err(Error::from)),
                        Err(_) => Err(Error::Stopping),
                    };
                    if let Err(e) = deleted {
                        tracing::warn!(?key, error = %e, "deleting an ended session failed; retrying later");
                        s.expires_at = Some(self.now().after(FINALIZE_RETRY));
                        return Some(s);
                    }
                }
                if s.begun || s.stored {
                    self.hooks.end(key, &s.state);
                }
                Counters::add(&self.counters.expiries, 1);
                let _ = self.expiry_tx.send(ExpiryMsg::Remove(key.clone()));
                None
            }
        }
    }

    /// Read a session from storage; a record that does not decode is moved
    /// aside and reads as absent.
    pub(crate) async fn load(&self, key: &K) -> Result<Option<SessionData<S>>, Error> {
        let storage = self.storage.clone();
        let kb = key.to_bytes();
        let bytes = blocking(move || storage.load(&kb)).await.inspect_err(|_| {
            Counters::add(&self.counters.storage_errors, 1);
        })?;
        let Some(bytes) = bytes else { return Ok(None) };
        Counters::add(&self.counters.loads, 1);
        match record::decode::<S>(&bytes) {
            Ok(r) => Ok(Some(SessionData {
                state: r.state,
                created_at: r.created_at,
                last_access: r.last_access,
                expires_at: r.expires_at,
                stored: true,
                dirty: false,
                touched: true,
                begun: true,
                generation: r.generation,
                touch_pending: false,
                unstamped: false,
            })),
            Err(e) => {
                tracing::error!(?key, error = %e, "session record does not decode; moving it aside");
                let storage = self.storage.clone();
                let kb = key.to_bytes();
                let reason = e.to_string();
                blocking(move || storage.quarantine(&kb, &reason)).await?;
                Counters::add(&self.counters.quarantined, 1);
                Ok(None)
            }
        }
    }

    /// The write that stores a session as it is now.
    pub(crate) fn put(&self, key: &K, s: &SessionData<S>) -> Result<Write, Error> {
        let rec = Record {
            created_at: s.created_at,
            last_access: s.last_access,
            expires_at: s.expires_at,
            generation: self.generation,
            state: &s.state,
        };
        let bytes = record::encode(&rec).map_err(Error::Encode)?;
        Ok(Write::Put {
            key: key.to_bytes(),
            record: bytes,
            expires_at: s.expires_at,
        })
    }

    /// Save a session durably if it carries persistent changes.
    pub(crate) async fn save(&self, key: &K, s: &mut SessionData<S>) -> Result<(), Error> {
        if !s.dirty {
            return Ok(());
        }
        let write = self.put(key, s)?;
        let (tx, rx) = oneshot::channel();
        self.writer_tx
            .send(SaveRequest { write, done: tx })
            .map_err(|_| Error::Stopping)?;
        rx.await.map_err(|_| Error::Stopping)??;
        s.dirty = false;
        s.stored = true;
        s.generation = self.generation;
        Ok(())
    }

    /// Lazy creation and the begin notification, at release: a new session
    /// its creating command left untouched is dropped (the cell keeps
    /// knowing that the key has no session).
    pub(crate) fn begin_if_kept(&self, key: &K, cell: &mut Cell<K, S>) {
        let Some(s) = cell.session.as_mut() else {
            return;
        };
        if s.begun {
            return;
        }
        if !s.stored && !s.touched {
            cell.session = None;
            return;
        }
        if !s.begun {
            s.begun = true;
            self.hooks.begin(key, &s.state);
        }
    }
}
