//! One lock-protected part of the session cache, and how a key is held.
//!
//! A shard is a hash table of slots, found with the one hash the engine
//! computed for the key. A slot is `Free` (the session is stored in it,
//! inline: no pointer to chase) or `Locked` (a command owns the session,
//! and a FIFO of commands waits for it). Holding a key is owning its
//! session: acquiring moves it out of the slot into the guard, releasing
//! moves it back, or straight to the next waiter through a oneshot channel.
//! So an uncontended acquire and release each take the shard's lock once,
//! briefly, with no allocation, no clock read and no shared counter; no
//! thread blocks and nothing can observe two holders.
//!
//! A guard must keep the cache alive, so it holds an `Arc`. Were that one
//! `Arc`, every acquire and release on every core would change one
//! reference count on one cache line. So the engine keeps several
//! [`Handle`]s to the same cache, each on its own line, and a thread takes
//! the one numbered after it: the count a guard changes stays in that
//! core's cache.

use crate::clock::Timestamp;
use crate::data::SessionData;
use crate::engine::State;
use crate::error::Error;
use crate::expiry;
use crate::guard::SessionGuard;
use crate::key::SessionKey;
use crate::lifecycle::Core;
use crate::stats::Counters;
use crate::storage::Write;
use hashbrown::HashTable;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;

type Waiter<K, S> = oneshot::Sender<Result<Held<K, S>, Error>>;

enum Slot<K: SessionKey, S: State> {
    Free(SessionData<S>),
    Locked(VecDeque<Waiter<K, S>>),
}

/// A table entry. Aligned to a cache line so that finding a key and
/// taking its session touch one line (two for large keys or states).
#[repr(align(64))]
struct Entry<K: SessionKey, S: State> {
    key: K,
    slot: Slot<K, S>,
}

struct Table<K: SessionKey, S: State> {
    slots: HashTable<Entry<K, S>>,
    /// Keys released since the expiry manager last looked (each at most
    /// once: see `SessionData::touch_pending`). The manager reads their
    /// times from the slots, so a release costs no message and no wake-up.
    touched: Vec<K>,
}

/// One shard: its lock and table. Aligned so that shards share no cache
/// line.
#[repr(align(64))]
struct Shard<K: SessionKey, S: State> {
    table: Mutex<Table<K, S>>,
}

/// The cache: what every shard shares, and the shards.
pub(crate) struct Cache<K: SessionKey, S: State> {
    pub(crate) core: Core<K, S>,
    shards: Box<[Shard<K, S>]>,
}

impl<K: SessionKey, S: State> Cache<K, S> {
    pub(crate) fn new(core: Core<K, S>) -> Self {
        let shards = (0..core.config.shards.max(1))
            .map(|_| Shard {
                table: Mutex::new(Table {
                    slots: HashTable::new(),
                    touched: Vec::new(),
                }),
            })
            .collect();
        Cache { core, shards }
    }

    /// The table of the shard a key's hash falls in. The shard is picked
    /// from hash bits that the table does not use (it takes the low bits
    /// for the bucket and the top seven as a tag), so keys spread within a
    /// shard; by a multiply and shift rather than a division.
    fn table(&self, hash: u64) -> MutexGuard<'_, Table<K, S>> {
        let bits = u64::from((hash >> 25) as u32);
        let i = ((bits * self.shards.len() as u64) >> 32) as usize;
        lock(&self.shards[i].table)
    }

    fn tables(&self) -> impl Iterator<Item = MutexGuard<'_, Table<K, S>>> {
        self.shards.iter().map(|s| lock(&s.table))
    }
}

/// A way into the cache for guards, one of several (see the module
/// documentation). Aligned so that its reference count has a cache line
/// of its own.
#[repr(align(64))]
pub(crate) struct Handle<K: SessionKey, S: State> {
    pub(crate) cache: Arc<Cache<K, S>>,
}

/// The right to a key, as passed from one command to the next: the session
/// if there is one in memory, and whether storage was already asked.
pub(crate) struct Held<K: SessionKey, S: State> {
    handle: Arc<Handle<K, S>>,
    hash: u64,
    key: K,
    /// `None` once handed on (so that `Drop` does nothing).
    payload: Option<(Option<SessionData<S>>, bool)>,
}

impl<K: SessionKey, S: State> Held<K, S> {
    fn take(&mut self) -> (Option<SessionData<S>>, bool) {
        self.payload.take().unwrap_or((None, false))
    }
}

impl<K: SessionKey, S: State> Drop for Held<K, S> {
    fn drop(&mut self) {
        if let Some((session, loaded)) = self.payload.take() {
            self.handle
                .pass_on(self.hash, &self.key, session, loaded, false);
        }
    }
}

/// What taking a key gave.
pub(crate) enum Entered<K: SessionKey, S: State> {
    /// A free session, taken at once (the common case: no hand-over).
    Ready(SessionGuard<K, S>),
    /// The key, with nothing in memory yet.
    Held(Held<K, S>),
    /// A place in the key's queue.
    Queued(oneshot::Receiver<Result<Held<K, S>, Error>>),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoning only means a panic elsewhere; the table itself is consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<K: SessionKey, S: State> Handle<K, S> {
    pub(crate) fn core(&self) -> &Core<K, S> {
        &self.cache.core
    }

    /// Take the key if it is free, or queue for it (or answer busy).
    pub(crate) fn enter(
        self: &Arc<Self>,
        hash: u64,
        key: K,
        wait: bool,
    ) -> Result<Entered<K, S>, Error> {
        let core = self.core();
        let mut table = self.cache.table(hash);
        if core.stopping.load(Ordering::SeqCst) {
            return Err(Error::Stopping);
        }
        let Some(entry) = table.slots.find_mut(hash, |e| e.key == key) else {
            table.slots.insert_unique(
                hash,
                Entry {
                    key: key.clone(),
                    slot: Slot::Locked(VecDeque::new()),
                },
                |e| core.hash(&e.key),
            );
            drop(table);
            return Ok(Entered::Held(Held {
                handle: self.clone(),
                hash,
                key,
                payload: Some((None, false)),
            }));
        };
        if let Slot::Locked(queue) = &mut entry.slot {
            if !wait {
                return Err(Error::Busy);
            }
            let (tx, rx) = oneshot::channel();
            queue.push_back(tx);
            Counters::add(&core.counters.queued, 1);
            return Ok(Entered::Queued(rx));
        }
        let taken = std::mem::replace(&mut entry.slot, Slot::Locked(VecDeque::new()));
        drop(table);
        Ok(match taken {
            Slot::Free(session) => {
                Entered::Ready(SessionGuard::new(self.clone(), hash, key, session))
            }
            // Not reached (the slot was free); holding the key with nothing
            // loaded is still correct.
            Slot::Locked(_) => Entered::Held(Held {
                handle: self.clone(),
                hash,
                key,
                payload: Some((None, false)),
            }),
        })
    }

    /// Hand the key to the next waiter, or free it (`evict`: drop it from
    /// memory instead, when nobody waits).
    pub(crate) fn pass_on(
        self: &Arc<Self>,
        hash: u64,
        key: &K,
        session: Option<SessionData<S>>,
        loaded: bool,
        evict: bool,
    ) {
        let core = self.core();
        let mut guard = self.cache.table(hash);
        let table = &mut *guard;
        let Ok(mut entry) = table.slots.find_entry(hash, |e| e.key == *key) else {
            tracing::error!(?key, "a released session had no slot; dropped");
            return;
        };
        let mut payload = (session, loaded);
        if let Slot::Locked(queue) = &mut entry.get_mut().slot {
            while let Some(waiter) = queue.pop_front() {
                core.counters.queued.fetch_sub(1, Ordering::Relaxed);
                let held = Held {
                    handle: self.clone(),
                    hash,
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
                    table.touched.push(key.clone());
                }
                wake = s
                    .expires_at
                    .is_some_and(|t| t.0 < core.next_wake.load(Ordering::Relaxed));
                entry.get_mut().slot = Slot::Free(s);
            }
            _ => {
                entry.remove();
            }
        }
        drop(guard);
        if wake {
            core.wake_expiry.notify_one();
        }
        if core.stopping.load(Ordering::Relaxed) {
            core.released.notify_waiters();
        }
    }

    /// A guard was dropped without an awaited release.
    pub(crate) fn release_from_drop(self: &Arc<Self>, hash: u64, key: &K, mut s: SessionData<S>) {
        if s.dirty {
            let handle = self.clone();
            let key = key.clone();
            self.core().runtime.spawn(async move {
                if let Err(e) = handle.finish(hash, key, s).await {
                    tracing::warn!(error = %e, "background save after drop failed; the session stays dirty");
                }
            });
        } else {
            // No clock read here: the expiry manager stamps the release
            // time when it notes the key (within about a second).
            s.unstamped = true;
            let kept = self.core().begin_if_kept(key, s);
            self.pass_on(hash, key, kept, true, false);
        }
    }

    /// A command is done with the session: save it if needed, apply lazy
    /// creation, send the begin notification, hand it on.
    pub(crate) async fn finish(
        self: Arc<Self>,
        hash: u64,
        key: K,
        mut s: SessionData<S>,
    ) -> Result<(), Error> {
        let core = self.core();
        s.last_access = core.now();
        s.unstamped = false;
        let result = core.save(&key, &mut s).await;
        let kept = core.begin_if_kept(&key, s);
        self.pass_on(hash, &key, kept, true, false);
        result
    }
}

impl<K: SessionKey, S: State> Cache<K, S> {
    /// For the expiry manager: the keys released since it last looked,
    /// with their expiration and last access (a release not stamped yet is
    /// stamped `now`). Keys held by a command stay listed for next time.
    pub(crate) fn drain_touched(
        &self,
        now: Timestamp,
        out: &mut Vec<(K, Option<Timestamp>, Timestamp)>,
    ) {
        for mut guard in self.tables() {
            let table = &mut *guard;
            let keys = std::mem::take(&mut table.touched);
            for key in keys {
                let hash = self.core.hash(&key);
                match table.slots.find_mut(hash, |e| e.key == key) {
                    Some(Entry {
                        slot: Slot::Free(s),
                        ..
                    }) => {
                        s.touch_pending = false;
                        if s.unstamped {
                            s.unstamped = false;
                            s.last_access = s.last_access.max(now);
                        }
                        out.push((key, s.expires_at, s.last_access));
                    }
                    Some(Entry {
                        slot: Slot::Locked(_),
                        ..
                    }) => table.touched.push(key),
                    None => {}
                }
            }
        }
    }

    /// The synchronous part of a flush: drop a clean session at once, or
    /// lock a dirty one for saving (`Ok`).
    pub(crate) fn take_for_flush(
        &self,
        hash: u64,
        key: &K,
        last_access: Timestamp,
        now: Timestamp,
    ) -> Result<SessionData<S>, expiry::Flushed> {
        let mut table = self.table(hash);
        let Ok(mut entry) = table.slots.find_entry(hash, |e| e.key == *key) else {
            return Err(expiry::Flushed::Skipped);
        };
        let Slot::Free(s) = &entry.get().slot else {
            return Err(expiry::Flushed::Skipped);
        };
        if s.touch_pending || s.last_access > last_access {
            return Err(expiry::Flushed::Skipped); // touched since it was picked
        }
        if s.expires_at
            .is_some_and(|t| t <= now.after(Duration::from_secs(5)))
        {
            return Err(expiry::Flushed::KeepResident(s.expires_at));
        }
        if !s.dirty {
            let stored = s.stored;
            entry.remove();
            Counters::add(&self.core.counters.flushes, 1);
            return Err(if stored {
                expiry::Flushed::Done
            } else {
                expiry::Flushed::Forget
            });
        }
        match std::mem::replace(&mut entry.get_mut().slot, Slot::Locked(VecDeque::new())) {
            Slot::Free(s) => Ok(s),
            Slot::Locked(q) => {
                entry.get_mut().slot = Slot::Locked(q);
                Err(expiry::Flushed::Skipped)
            }
        }
    }

    /// How many sessions the cache holds (free or locked).
    pub(crate) fn len(&self) -> usize {
        self.tables().map(|t| t.slots.len()).sum()
    }

    /// Whether a command holds any key.
    pub(crate) fn any_locked(&self) -> bool {
        self.tables()
            .any(|t| t.slots.iter().any(|e| matches!(e.slot, Slot::Locked(_))))
    }

    /// Stopping: answer every queued command with [`Error::Stopping`].
    pub(crate) fn fail_waiters(&self) {
        for mut table in self.tables() {
            for entry in table.slots.iter_mut() {
                if let Slot::Locked(queue) = &mut entry.slot {
                    for waiter in queue.drain(..) {
                        self.core.counters.queued.fetch_sub(1, Ordering::Relaxed);
                        let _ = waiter.send(Err(Error::Stopping));
                    }
                }
            }
        }
    }

    /// The writes that save every dirty free session.
    pub(crate) fn dirty_writes(&self, out: &mut Vec<(K, Write)>) -> Result<(), Error> {
        for table in self.tables() {
            for entry in table.slots.iter() {
                if let Slot::Free(s) = &entry.slot
                    && s.dirty
                {
                    out.push((entry.key.clone(), self.core.put(&entry.key, s)?));
                }
            }
        }
        Ok(())
    }

    /// The session of `key` was saved by `stop`.
    pub(crate) fn mark_saved(&self, key: &K) {
        let hash = self.core.hash(key);
        if let Some(Entry {
            slot: Slot::Free(s),
            ..
        }) = self.table(hash).slots.find_mut(hash, |e| e.key == *key)
        {
            s.dirty = false;
            s.stored = true;
        }
    }
}

/// Wait for the key if queued, then make its session ready: loaded,
/// finalized if its time has passed, recovered on first load, created if
/// asked. `None`: no session and `create` was false.
pub(crate) async fn complete<K: SessionKey, S: State>(
    entered: Entered<K, S>,
    create: bool,
) -> Result<Option<SessionGuard<K, S>>, Error> {
    let mut held = match entered {
        Entered::Ready(guard) => {
            if !guard.handle().core().needs_ready(&guard) {
                return Ok(Some(guard));
            }
            let (handle, hash, key, session) = guard.into_parts();
            Held {
                handle,
                hash,
                key,
                payload: Some((Some(session), true)),
            }
        }
        Entered::Held(h) => h,
        Entered::Queued(rx) => rx.await.map_err(|_| Error::Stopping)??,
    };
    let (mut session, loaded) = held.take();
    // Until the session is handed to a guard, `held` still owns the key
    // with no session in it: if this future is dropped (its caller went
    // away) while loading or finalizing, the key is passed on and its next
    // holder reads the session from storage again.
    held.payload = Some((None, false));
    let core = held.handle.core();
    if !loaded {
        // On an error, `held` passes the key on unread: the next waiter
        // tries storage again.
        session = core.load(&held.key).await?;
    }
    if let Some(s) = session.take() {
        session = core.ready(&held.key, s).await;
    }
    if session.is_none() && create {
        session = Some(core.fresh());
    }
    match session {
        Some(s) => {
            held.payload = None;
            Ok(Some(SessionGuard::new(
                held.handle.clone(),
                held.hash,
                held.key.clone(),
                s,
            )))
        }
        None => {
            held.payload = Some((None, true));
            Ok(None)
        }
    }
}
