//! What every shard of the cache shares (storage, clock, hooks, the writer
//! and the expiry manager's channels), and the steps of a session's life
//! that do not depend on where it is cached: loading, finalizing, recovery
//! on first load, saving, and lazy creation with its begin notification.

use crate::clock::{Clock, Timestamp};
use crate::config::Config;
use crate::data::SessionData;
use crate::data::State;
use crate::error::Error;
use crate::expiry::message::ExpiryMsg;
use crate::hooks::{Finalize, Hooks};
use crate::key::SessionKey;
use crate::record::{self, Record};
use crate::stats::Counters;
use crate::storage::{Step, Storage, StorageError, Write};
use crate::sync::AtomicBool;
use crate::writer::Writer;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

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
    /// The storage is shared with other engines ([`Storage::shared`]): every
    /// command runs in a [`Step`] and starts from the stored record.
    pub(crate) shared: bool,
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
    /// Commits the saves of commands not in a step ([`Writer`]).
    pub(crate) writer: Arc<Writer>,
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
    /// may see it (with a shared storage, always: it is read again in a
    /// step). Reads the clock only for a session with a deadline.
    pub(crate) fn needs_ready(&self, s: &SessionData<S>) -> bool {
        self.shared
            || s.expires_at.is_some_and(|t| t <= self.now())
            || (s.stored && s.generation < self.generation)
    }

    /// With a shared storage: hold `key` against every other engine, and its
    /// session as stored now.
    pub(crate) async fn begin(
        &self,
        key: &K,
    ) -> Result<(Box<dyn Step>, Option<SessionData<S>>), Error> {
        let kb = key.to_bytes();
        let step = match self.storage.shared() {
            Some(shared) => shared.begin(&kb).await,
            None => Err(StorageError::Conflict),
        }
        .map_err(Error::from)
        .inspect_err(|_| {
            Counters::add(&self.counters.storage_errors, 1);
        })?;
        let session = match step.record() {
            Some(bytes) => {
                Counters::add(&self.counters.loads, 1);
                Some(Self::decoded(record::decode::<S>(bytes).map_err(|e| {
                    Error::Storage(StorageError::Shared(Arc::new(std::io::Error::other(
                        format!("the stored session does not decode: {e}"),
                    ))))
                })?))
            }
            None => None,
        };
        Ok((step, session))
    }

    /// A new, empty session (the caller asked to create it).
    pub(crate) fn fresh(&self) -> SessionData<S> {
        SessionData::fresh(S::default(), self.now(), self.generation)
    }

    /// Finalize a session whose time has passed, and run the first-load hook
    /// on one saved by an earlier run. With a shared storage there is no
    /// earlier run to recover from (a record of an older generation may be
    /// another live engine's), so only deadlines apply; saves go through the
    /// held `step`. `Ok(None)`: the session ended.
    ///
    /// With a shared storage a failed save fails the command: the session
    /// the hook left is not the stored one, and the command no longer holds
    /// the key, so nothing may be read from it or done beside it (the next
    /// command starts from the stored record and finalizes it again). With
    /// a storage of this engine alone, memory is the truth: the session
    /// stays dirty, to be saved at its release.
    pub(crate) async fn ready(
        &self,
        key: &K,
        mut s: SessionData<S>,
        step: &mut Option<Box<dyn Step>>,
    ) -> Result<Option<SessionData<S>>, Error> {
        if s.expires_at.is_some_and(|t| t <= self.now()) {
            Counters::add(&self.counters.finalize_calls, 1);
            let held: Option<&mut dyn Step> = match step.as_deref_mut() {
                Some(held) if held.held() => Some(held),
                _ => None,
            };
            let verdict = self.hooks.finalize(key, &mut s, held).await;
            match self.settle(key, s, verdict, step).await? {
                Some(settled) => s = settled,
                None => return Ok(None),
            }
        }
        if !self.shared && s.stored && s.generation < self.generation {
            let verdict = self.hooks.first_load(key, &mut s).await;
            // Saved under the new generation, so the hook runs once per restart.
            s.dirty = true;
            return self.settle(key, s, verdict, step).await;
        }
        Ok(Some(s))
    }

    /// Carry out a hook's verdict (see [`ready`](Self::ready) for what a
    /// failed write does).
    async fn settle(
        &self,
        key: &K,
        mut s: SessionData<S>,
        verdict: Finalize,
        step: &mut Option<Box<dyn Step>>,
    ) -> Result<Option<SessionData<S>>, Error> {
        match verdict {
            Finalize::Keep => {
                if let Err(e) = self.save(key, &mut s, step).await {
                    if self.shared {
                        tracing::warn!(?key, error = %e, "saving a finalized session failed; its command fails");
                        return Err(e);
                    }
                    tracing::warn!(?key, error = %e, "saving a finalized session failed; it stays dirty");
                }
                Ok(Some(s))
            }
            Finalize::End => {
                if s.stored {
                    let write = Write::Delete {
                        key: key.to_bytes(),
                    };
                    let deleted = self.write(write, step).await;
                    if let Err(e) = deleted {
                        if self.shared {
                            tracing::warn!(?key, error = %e, "deleting an ended session failed; its command fails");
                            return Err(e);
                        }
                        tracing::warn!(?key, error = %e, "deleting an ended session failed; retrying later");
                        s.expires_at = Some(self.now().after(FINALIZE_RETRY));
                        return Ok(Some(s));
                    }
                }
                if s.begun || s.stored {
                    self.hooks.end(key, &s.state);
                }
                Counters::add(&self.counters.expiries, 1);
                let _ = self.expiry_tx.send(ExpiryMsg::Remove(key.clone()));
                Ok(None)
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
            Ok(r) => Ok(Some(Self::decoded(r))),
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

    /// A stored session, as read.
    fn decoded(r: Record<S>) -> SessionData<S> {
        SessionData {
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

    /// Save a session durably if it carries persistent changes: through the
    /// held `step` with a shared storage, through the writer otherwise.
    pub(crate) async fn save(
        &self,
        key: &K,
        s: &mut SessionData<S>,
        step: &mut Option<Box<dyn Step>>,
    ) -> Result<(), Error> {
        if !s.dirty {
            return Ok(());
        }
        let write = self.put(key, s)?;
        self.write(write, step).await?;
        s.dirty = false;
        s.stored = true;
        s.generation = self.generation;
        Ok(())
    }

    /// [`save`](Self::save) as a command's last change. With a shared
    /// storage the held `step` is finished with it (with nothing to write,
    /// it is finished all the same): the key is let go in the store by the
    /// same commit, and no new step begins. The command goes on holding the
    /// key in this engine until it releases the session, and can change it
    /// no more (a later save finds no step: [`StorageError::Conflict`]).
    pub(crate) async fn save_last(
        &self,
        key: &K,
        s: &mut SessionData<S>,
        step: &mut Option<Box<dyn Step>>,
    ) -> Result<(), Error> {
        if !self.shared {
            return self.save(key, s, step).await;
        }
        match step.take() {
            Some(held) => self.finish_step(key, Some(s), held).await,
            None if s.dirty => Err(Error::Storage(StorageError::Conflict)),
            None => Ok(()),
        }
    }

    /// Make one write durable: through the held `step` (a shared storage;
    /// without a step nothing may be written there), or group-committed by
    /// the writer.
    async fn write(&self, write: Write, step: &mut Option<Box<dyn Step>>) -> Result<(), Error> {
        if self.shared {
            let Some(mut held) = step.take() else {
                return Err(Error::Storage(StorageError::Conflict));
            };
            let result = held.save(&write).await;
            if result.is_err() {
                Counters::add(&self.counters.storage_errors, 1);
            } else {
                Counters::add(&self.counters.saves, 1);
            }
            // After a conflict the step is dropped: nothing more is written
            // from this session's stale state.
            *step = result.is_ok().then_some(held);
            return result.map_err(Error::from);
        }
        self.writer.save(&self.runtime, write).await
    }

    /// With a shared storage, a command is done: save the session if it
    /// carries persistent changes and let the key go (the step ends either
    /// way).
    pub(crate) async fn finish_step(
        &self,
        key: &K,
        s: Option<&mut SessionData<S>>,
        step: Box<dyn Step>,
    ) -> Result<(), Error> {
        let write = match s.as_ref().filter(|s| s.dirty) {
            Some(s) => Some(self.put(key, s)?),
            None => None,
        };
        let saving = write.is_some();
        let result = step.finish(write.as_ref()).await.map_err(Error::from);
        match &result {
            Err(_) => Counters::add(&self.counters.storage_errors, 1),
            Ok(()) if saving => {
                Counters::add(&self.counters.saves, 1);
                if let Some(s) = s {
                    s.dirty = false;
                    s.stored = true;
                    s.generation = self.generation;
                }
            }
            Ok(()) => {}
        }
        result
    }

    /// Lazy creation and the begin notification, at release: a new session
    /// its creating command left untouched is dropped (the cell keeps
    /// knowing that the key has no session).
    pub(crate) fn begin_if_kept(&self, key: &K, session: &mut Option<SessionData<S>>) {
        let Some(s) = session.as_mut() else {
            return;
        };
        if s.begun {
            return;
        }
        if !s.stored && !s.touched {
            *session = None;
            return;
        }
        if !s.begun {
            s.begun = true;
            self.hooks.begin(key, &s.state);
        }
    }
}
