//! The engine: the sharded cache of sessions, their command queues, loading,
//! saving, finalization and stop.
//!
//! Every key in the cache has a slot: `Free` (in memory, nobody holds it) or
//! `Locked` (a command holds it, possibly still loading it, with a FIFO of
//! waiting commands). Holding a slot is represented by owning the session's
//! data (in a [`SessionGuard`] or, while loading, in the engine's own code);
//! passing it on hands that ownership to the next waiter through a oneshot
//! channel, so no thread ever blocks and nothing can observe two holders.

use crate::clock::{Clock, Timestamp};
use crate::config::Config;
use crate::data::SessionData;
use crate::error::Error;
use crate::expiry::{self, ExpiryMsg};
use crate::guard::SessionGuard;
use crate::hooks::{Finalize, Hooks};
use crate::index::{DefaultIndex, ExpiryIndex};
use crate::key::SessionKey;
use crate::record::{self, Record};
use crate::stats::{Counters, Stats};
use crate::storage::{Storage, Write};
use crate::writer::{self, SaveRequest};
use serde::{Serialize, de::DeserializeOwned};
use std::collections::VecDeque;
use std::collections::hash_map::{Entry, HashMap};
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};

/// What a session's state must be: stored as JSON, created empty.
pub trait State: Serialize + DeserializeOwned + Default + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Default + Send + 'static> State for T {}

/// How long before a retry when finalization left a session still due.
const FINALIZE_RETRY: Duration = Duration::from_secs(1);

/// One lock-protected part of the cache.
pub(crate) struct Shard<K: SessionKey, S: State> {
    slots: HashMap<K, Slot<K, S>>,
    /// Keys released since the expiry manager last looked (each at most
    /// once: see `SessionData::touch_pending`). The manager reads their
    /// times from the slots, so a release costs no message and no wake-up.
    touched: Vec<K>,
}

type Waiter<K, S> = oneshot::Sender<Result<Held<K, S>, Error>>;

enum Slot<K: SessionKey, S: State> {
    Free(Box<SessionData<S>>),
    Locked(VecDeque<Waiter<K, S>>),
}

/// The right to a key, as passed from one command to the next: the session
/// if there is one in memory, and whether storage was already asked.
pub(crate) struct Held<K: SessionKey, S: State> {
    shared: Arc<Shared<K, S>>,
    key: K,
    /// `None` once handed on (so that `Drop` does nothing).
    payload: Option<(Option<Box<SessionData<S>>>, bool)>,
}

impl<K: SessionKey, S: State> Held<K, S> {
    fn take(&mut self) -> (Option<Box<SessionData<S>>>, bool) {
        self.payload.take().unwrap_or((None, false))
    }
}

impl<K: SessionKey, S: State> Drop for Held<K, S> {
    fn drop(&mut self) {
        if let Some((session, loaded)) = self.payload.take() {
            self.shared
                .pass_on(self.key.clone(), session, loaded, false);
        }
    }
}

enum Entered<K: SessionKey, S: State> {
    /// A free session, taken at once (the common case: no hand-over).
    Ready(SessionGuard<K, S>),
    Held(Held<K, S>),
    Queued(oneshot::Receiver<Result<Held<K, S>, Error>>),
}

/// State shared by the engine handle, guards and background tasks.
pub(crate) struct Shared<K: SessionKey, S: State> {
    shards: Box<[Mutex<Shard<K, S>>]>,
    hasher: RandomState,
    storage: Arc<dyn Storage>,
    pub(crate) clock: Arc<dyn Clock>,
    hooks: Arc<dyn Hooks<K, S>>,
    pub(crate) config: Config,
    generation: u64,
    pub(crate) stopping: AtomicBool,
    /// Signalled, while stopping, whenever a slot stops being locked:
    /// `stop` waits on it.
    released: Notify,
    /// Wakes the expiry manager before its planned time (a release with an
    /// expiration earlier than `next_wake`).
    pub(crate) wake_expiry: Arc<Notify>,
    /// When the expiry manager plans to look next (ms since the epoch).
    pub(crate) next_wake: AtomicU64,
    expiry_tx: mpsc::UnboundedSender<ExpiryMsg<K>>,
    writer_tx: mpsc::UnboundedSender<SaveRequest>,
    pub(crate) counters: Arc<Counters>,
    runtime: tokio::runtime::Handle,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoning only means a panic elsewhere; the map itself is consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<K: SessionKey, S: State> Shared<K, S> {
    fn shard(&self, key: &K) -> &Mutex<Shard<K, S>> {
        let i = (self.hasher.hash_one(key) as usize) % self.shards.len();
        &self.shards[i]
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Take the key if it is free, or queue for it (or answer busy).
    fn enter(self: &Arc<Self>, key: K, wait: bool) -> Result<Entered<K, S>, Error> {
        let mut shard = lock(self.shard(&key));
        if self.stopping.load(Ordering::SeqCst) {
            return Err(Error::Stopping);
        }
        let payload = match shard.slots.entry(key.clone()) {
            Entry::Vacant(v) => {
                v.insert(Slot::Locked(VecDeque::new()));
                (None, false)
            }
            Entry::Occupied(mut o) => match o.get_mut() {
                Slot::Locked(queue) => {
                    if !wait {
                        return Err(Error::Busy);
                    }
                    let (tx, rx) = oneshot::channel();
                    queue.push_back(tx);
                    Counters::add(&self.counters.queued, 1);
                    return Ok(Entered::Queued(rx));
                }
                Slot::Free(_) => match o.insert(Slot::Locked(VecDeque::new())) {
                    Slot::Free(session) => {
                        drop(shard);
                        return Ok(Entered::Ready(SessionGuard::new(
                            self.clone(),
                            key,
                            session,
                        )));
                    }
                    Slot::Locked(_) => (None, false),
                },
            },
        };
        drop(shard);
        Ok(Entered::Held(Held {
            shared: self.clone(),
            key,
            payload: Some(payload),
        }))
    }

    /// Wait for the key if queued, then make its session ready: loaded,
    /// finalized if its time has passed, recovered on first load, created if
    /// asked. `None`: no session and `create` was false.
    async fn complete(
        self: &Arc<Self>,
        entered: Entered<K, S>,
        create: bool,
    ) -> Result<Option<SessionGuard<K, S>>, Error> {
        let mut held = match entered {
            Entered::Ready(guard) => {
                if !self.needs_ready(&guard) {
                    return Ok(Some(guard));
                }
                let (key, session) = guard.into_parts();
                Held {
                    shared: self.clone(),
                    key,
                    payload: Some((Some(session), true)),
                }
            }
            Entered::Held(h) => h,
            Entered::Queued(rx) => rx.await.map_err(|_| Error::Stopping)??,
        };
        let key = held.key.clone();
        let (mut session, loaded) = held.take();
        // Until the session is handed to a guard, `held` still owns the key
        // with no session in it: if this future is dropped (its caller
        // went away) while loading or finalizing, the key is passed on and
        // its next holder reads the session from storage again.
        held.payload = Some((None, false));
        if !loaded {
            // On an error, `held` passes the key on unread: the next waiter
            // tries storage again.
            session = self.load(&key).await?;
        }
        if let Some(s) = session.take() {
            session = self.ready(&key, s).await;
        }
        if session.is_none() && create {
            session = Some(Box::new(SessionData::fresh(
                S::default(),
                self.now(),
                self.generation,
            )));
        }
        match session {
            Some(s) => {
                held.payload = None;
                Ok(Some(SessionGuard::new(self.clone(), key, s)))
            }
            None => {
                held.payload = Some((None, true));
                Ok(None)
            }
        }
    }

    /// Whether a session must be finalized or recovered before a command
    /// may see it.
    fn needs_ready(&self, s: &SessionData<S>) -> bool {
        s.expires_at.is_some_and(|t| t <= self.now())
            || (s.stored && s.generation < self.generation)
    }

    /// Finalize a session whose time has passed, and run the first-load hook
    /// on one saved by an earlier run.
    async fn ready(
        self: &Arc<Self>,
        key: &K,
        mut s: Box<SessionData<S>>,
    ) -> Option<Box<SessionData<S>>> {
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
        self: &Arc<Self>,
        key: &K,
        mut s: Box<SessionData<S>>,
        verdict: Finalize,
    ) -> Option<Box<SessionData<S>>> {
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

    async fn load(self: &Arc<Self>, key: &K) -> Result<Option<Box<SessionData<S>>>, Error> {
        let storage = self.storage.clone();
        let kb = key.to_bytes();
        let bytes = blocking(move || storage.load(&kb)).await.inspect_err(|_| {
            Counters::add(&self.counters.storage_errors, 1);
        })?;
        let Some(bytes) = bytes else { return Ok(None) };
        Counters::add(&self.counters.loads, 1);
        match record::decode::<S>(&bytes) {
            Ok(r) => Ok(Some(Box::new(SessionData {
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
            }))),
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
    fn put(&self, key: &K, s: &SessionData<S>) -> Result<Write, Error> {
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

    /// A command is done with the session: save it if needed, apply lazy
    /// creation, send the begin notification, hand it on.
    pub(crate) async fn finish(
        self: Arc<Self>,
        key: K,
        mut s: Box<SessionData<S>>,
    ) -> Result<(), Error> {
        s.last_access = self.now();
        let result = self.save(&key, &mut s).await;
        let kept = self.begin_if_kept(&key, s);
        self.pass_on(key, kept, true, false);
        result
    }

    fn begin_if_kept(&self, key: &K, mut s: Box<SessionData<S>>) -> Option<Box<SessionData<S>>> {
        if !s.stored && !s.touched {
            return None; // lazy creation: the creating command changed nothing
        }
        if !s.begun {
            s.begun = true;
            self.hooks.begin(key, &s.state);
        }
        Some(s)
    }

    /// A guard was dropped without an awaited release.
    pub(crate) fn release_from_drop(self: &Arc<Self>, key: K, mut s: Box<SessionData<S>>) {
        if s.dirty {
            let shared = self.clone();
            self.runtime.spawn(async move {
                if let Err(e) = shared.finish(key, s).await {
                    tracing::warn!(error = %e, "background save after drop failed; the session stays dirty");
                }
            });
        } else {
            s.last_access = self.now();
            let kept = self.begin_if_kept(&key, s);
            self.pass_on(key, kept, true, false);
        }
    }

    /// Hand the key to the next waiter, or free it (`evict`: drop it from
    /// memory instead, when nobody waits).
    pub(crate) fn pass_on(
        self: &Arc<Self>,
        key: K,
        session: Option<Box<SessionData<S>>>,
        loaded: bool,
        evict: bool,
    ) {
        let mut guard = lock(self.shard(&key));
        let shard = &mut *guard;
        let mut payload = (session, loaded);
        let Some(slot) = shard.slots.get_mut(&key) else {
            tracing::error!(?key, "a released session had no slot; dropped");
            return;
        };
        if let Slot::Locked(queue) = slot {
            while let Some(waiter) = queue.pop_front() {
                self.counters.queued.fetch_sub(1, Ordering::Relaxed);
                let held = Held {
                    shared: self.clone(),
                    key: key.clone(),
                    payload: Some(payload),
                };
                match waiter.send(Ok(held)) {
                    Ok(()) => return,
                    // That waiter gave up; take the key back and try the next.
                    Err(Ok(mut held)) => payload = held.take(),
                    Err(Err(_)) => return,
                }
            }
        }
        let mut wake = false;
        match payload.0 {
            Some(mut s) if !evict => {
                if !s.touch_pending {
                    s.touch_pending = true;
                    shard.touched.push(key);
                }
                wake = s
                    .expires_at
                    .is_some_and(|t| t.0 < self.next_wake.load(Ordering::Relaxed));
                *slot = Slot::Free(s);
            }
            _ => {
                shard.slots.remove(&key);
            }
        }
        drop(guard);
        if wake {
            self.wake_expiry.notify_one();
        }
        if self.stopping.load(Ordering::Relaxed) {
            self.released.notify_waiters();
        }
    }

    /// For the expiry manager: the keys released since it last looked,
    /// with their expiration and last access. Keys held by a command stay
    /// listed for next time.
    pub(crate) fn drain_touched(&self, out: &mut Vec<(K, Option<Timestamp>, Timestamp)>) {
        for shard in self.shards.iter() {
            let mut guard = lock(shard);
            let shard = &mut *guard;
            let keys = std::mem::take(&mut shard.touched);
            for key in keys {
                match shard.slots.get_mut(&key) {
                    Some(Slot::Free(s)) => {
                        s.touch_pending = false;
                        out.push((key, s.expires_at, s.last_access));
                    }
                    Some(Slot::Locked(_)) => shard.touched.push(key),
                    None => {}
                }
            }
        }
    }

    /// The expiry manager found the key due: finalize it unless a command
    /// holds it (its release puts it back in the index).
    pub(crate) async fn expire_key(self: &Arc<Self>, key: K) {
        let Ok(entered) = self.enter(key, false) else {
            return;
        };
        match self.complete(entered, false).await {
            Ok(Some(guard)) => {
                let _ = guard.release().await;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "expiring a session failed; it will be retried"),
        }
    }

    /// Flush an idle session out of memory, if it is still idle since
    /// `last_access` and does not expire within five seconds.
    pub(crate) async fn flush_key(
        self: &Arc<Self>,
        key: K,
        last_access: Timestamp,
        now: Timestamp,
    ) -> expiry::Flushed {
        let mut s = match self.take_for_flush(&key, last_access, now) {
            Ok(s) => s,
            Err(outcome) => return outcome,
        };
        let saved = self.save(&key, &mut s).await;
        let ok = saved.is_ok();
        self.pass_on(key, Some(s), true, ok);
        if ok {
            Counters::add(&self.counters.flushes, 1);
        }
        expiry::Flushed::Done
    }

    /// The synchronous part of a flush: drop a clean session at once, or
    /// lock a dirty one for saving (`Ok`).
    fn take_for_flush(
        &self,
        key: &K,
        last_access: Timestamp,
        now: Timestamp,
    ) -> Result<Box<SessionData<S>>, expiry::Flushed> {
        let mut shard = lock(self.shard(key));
        let Some(Slot::Free(s)) = shard.slots.get(key) else {
            return Err(expiry::Flushed::Skipped);
        };
        if s.last_access > last_access {
            return Err(expiry::Flushed::Skipped); // touched since it was picked
        }
        if s.expires_at
            .is_some_and(|t| t <= now.after(Duration::from_secs(5)))
        {
            return Err(expiry::Flushed::KeepResident(s.expires_at));
        }
        if !s.dirty {
            let stored = s.stored;
            shard.slots.remove(key);
            Counters::add(&self.counters.flushes, 1);
            return Err(if stored {
                expiry::Flushed::Done
            } else {
                expiry::Flushed::Forget
            });
        }
        match shard
            .slots
            .insert(key.clone(), Slot::Locked(VecDeque::new()))
        {
            Some(Slot::Free(s)) => Ok(s),
            _ => Err(expiry::Flushed::Skipped),
        }
    }

    fn in_memory(&self) -> u64 {
        self.shards.iter().map(|s| lock(s).slots.len() as u64).sum()
    }

    fn any_locked(&self) -> bool {
        self.shards.iter().any(|s| {
            lock(s)
                .slots
                .values()
                .any(|slot| matches!(slot, Slot::Locked(_)))
        })
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::storage::StorageError> + Send + 'static,
) -> Result<T, Error> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Error::from),
        Err(_) => Err(Error::Storage(crate::storage::StorageError::Panicked)),
    }
}

/// The session engine: a handle that is cheap to clone.
///
/// Sessions are asked for by key. [`Engine::get`] waits its turn and gives a
/// [`SessionGuard`]; [`Engine::try_get`] answers [`Error::Busy`] at once
/// instead of waiting; [`Engine::submit`] hands a command to the engine,
/// which runs it when the session is free and delivers its result.
pub struct Engine<K: SessionKey, S: State> {
    shared: Arc<Shared<K, S>>,
}

impl<K: SessionKey, S: State> Clone for Engine<K, S> {
    fn clone(&self) -> Self {
        Engine {
            shared: self.shared.clone(),
        }
    }
}

impl<K: SessionKey, S: State> Engine<K, S> {
    /// Start configuring an engine over `storage`.
    pub fn builder(storage: Arc<dyn Storage>) -> Builder<K, S, DefaultIndex<K>> {
        Builder {
            storage,
            clock: Arc::new(crate::clock::SystemClock),
            hooks: Arc::new(()),
            config: Config::default(),
            index: DefaultIndex::default(),
        }
    }

    /// Exclusive access to the session of `key`, waiting in its queue while
    /// another command holds it. `Ok(None)`: the session exists nowhere and
    /// `create` is false (nothing is queued then).
    pub async fn get(&self, key: K, create: bool) -> Result<Option<SessionGuard<K, S>>, Error> {
        match self.shared.enter(key, true)? {
            // The common case stays a small future; the slow path (loading,
            // finalizing, waiting in the queue) is boxed.
            Entered::Ready(guard) if !self.shared.needs_ready(&guard) => Ok(Some(guard)),
            entered => Box::pin(self.shared.complete(entered, create)).await,
        }
    }

    /// Like [`Engine::get`], but answers [`Error::Busy`] at once when
    /// another command holds the session.
    pub async fn try_get(&self, key: K, create: bool) -> Result<Option<SessionGuard<K, S>>, Error> {
        match self.shared.enter(key, false)? {
            Entered::Ready(guard) if !self.shared.needs_ready(&guard) => Ok(Some(guard)),
            entered => Box::pin(self.shared.complete(entered, create)).await,
        }
    }

    /// Hand a command to the engine. Its place in the session's queue is
    /// taken now; the engine runs it on its own task when the session is
    /// free (even if the returned handle is dropped) and delivers its result
    /// through the handle. `Ok(None)`: no session and `create` is false.
    pub fn submit<F, Fut, R>(&self, key: K, create: bool, command: F) -> Submitted<R>
    where
        F: FnOnce(SessionGuard<K, S>) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: Send + 'static,
    {
        let entered = self.shared.enter(key, true);
        let shared = self.shared.clone();
        let (tx, rx) = oneshot::channel();
        self.shared.runtime.spawn(async move {
            let result = match entered {
                Err(e) => Err(e),
                Ok(entered) => match shared.complete(entered, create).await {
                    Ok(Some(guard)) => Ok(Some(command(guard).await)),
                    Ok(None) => Ok(None),
                    Err(e) => Err(e),
                },
            };
            let _ = tx.send(result);
        });
        Submitted { rx }
    }

    /// The engine's figures now.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot(self.shared.in_memory())
    }

    /// The clock the engine runs on.
    pub fn now(&self) -> Timestamp {
        self.shared.now()
    }

    /// Stop: new requests and queued commands get [`Error::Stopping`],
    /// running commands finish, then every dirty session is saved in one
    /// durable batch. An error means some sessions could not be saved.
    pub async fn stop(&self) -> Result<(), Error> {
        let shared = &self.shared;
        shared.stopping.store(true, Ordering::SeqCst);
        for shard in shared.shards.iter() {
            for slot in lock(shard).slots.values_mut() {
                if let Slot::Locked(queue) = slot {
                    for waiter in queue.drain(..) {
                        shared.counters.queued.fetch_sub(1, Ordering::Relaxed);
                        let _ = waiter.send(Err(Error::Stopping));
                    }
                }
            }
        }
        loop {
            let notified = shared.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !shared.any_locked() {
                break;
            }
            notified.await;
        }
        let mut writes = Vec::new();
        for shard in shared.shards.iter() {
            for (key, slot) in lock(shard).slots.iter() {
                if let Slot::Free(s) = slot
                    && s.dirty
                {
                    writes.push((key.clone(), shared.put(key, s)?));
                }
            }
        }
        let _ = shared.expiry_tx.send(ExpiryMsg::Stop);
        if writes.is_empty() {
            return Ok(());
        }
        let storage = shared.storage.clone();
        let batch: Vec<Write> = writes.iter().map(|(_, w)| w.clone()).collect();
        let n = batch.len() as u64;
        blocking(move || storage.write(&batch))
            .await
            .inspect_err(|_| {
                Counters::add(&shared.counters.storage_errors, 1);
            })?;
        Counters::add(&shared.counters.saves, n);
        Counters::add(&shared.counters.save_batches, 1);
        for (key, _) in writes {
            if let Some(Slot::Free(s)) = lock(shared.shard(&key)).slots.get_mut(&key) {
                s.dirty = false;
                s.stored = true;
            }
        }
        Ok(())
    }
}

/// The result of [`Engine::submit`]: resolves to the command's output.
pub struct Submitted<R> {
    rx: oneshot::Receiver<Result<Option<R>, Error>>,
}

impl<R> Future for Submitted<R> {
    type Output = Result<Option<R>, Error>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(Error::Lost)))
    }
}

/// Configures and opens an [`Engine`].
pub struct Builder<K: SessionKey, S: State, I> {
    storage: Arc<dyn Storage>,
    clock: Arc<dyn Clock>,
    hooks: Arc<dyn Hooks<K, S>>,
    config: Config,
    index: I,
}

impl<K: SessionKey, S: State, I: ExpiryIndex<K>> Builder<K, S, I> {
    /// The clock (default: the system's wall clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The application's hooks (default: none; expired sessions end).
    pub fn hooks(mut self, hooks: Arc<dyn Hooks<K, S>>) -> Self {
        self.hooks = hooks;
        self
    }

    /// Limits and batching (default: [`Config::default`]).
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The expiry index (default: [`DefaultIndex`]).
    pub fn index<J: ExpiryIndex<K>>(self, index: J) -> Builder<K, S, J> {
        Builder {
            storage: self.storage,
            clock: self.clock,
            hooks: self.hooks,
            config: self.config,
            index,
        }
    }

    /// Open the engine: rebuild the expiry index from storage and start the
    /// writer and the expiry manager on the current tokio runtime.
    pub async fn open(self) -> Result<Engine<K, S>, Error> {
        let mut index = self.index;
        let storage = self.storage.clone();
        let deadlines = blocking(move || storage.deadlines()).await?;
        for (kb, t) in deadlines {
            match K::from_bytes(&kb) {
                Some(k) => index.touch(&k, Some(t), None),
                None => tracing::warn!(key = ?kb, "stored session key does not decode; ignored"),
            }
        }
        let (expiry_tx, expiry_rx) = mpsc::unbounded_channel();
        let (writer_tx, writer_rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let shards = (0..self.config.shards.max(1))
            .map(|_| {
                Mutex::new(Shard {
                    slots: HashMap::new(),
                    touched: Vec::new(),
                })
            })
            .collect();
        let runtime = tokio::runtime::Handle::current();
        let shared = Arc::new(Shared {
            shards,
            hasher: RandomState::new(),
            generation: self.storage.generation(),
            storage: self.storage.clone(),
            clock: self.clock,
            hooks: self.hooks,
            config: self.config,
            stopping: AtomicBool::new(false),
            released: Notify::new(),
            wake_expiry: Arc::new(Notify::new()),
            next_wake: AtomicU64::new(0),
            expiry_tx,
            writer_tx,
            counters: counters.clone(),
            runtime: runtime.clone(),
        });
        runtime.spawn(writer::run(
            self.storage,
            counters,
            shared.config.max_batch,
            writer_rx,
        ));
        runtime.spawn(expiry::run(Arc::downgrade(&shared), index, expiry_rx));
        Ok(Engine { shared })
    }
}
