//! One part of the session cache, and how a key is held and passed on.
//!
//! Each key in memory has a cell: a small lock around its session (if one
//! is loaded) in its own allocation, found through its shard's hash table.
//! Holding a key is holding its cell's lock, through an owned guard, so a
//! `'static` session guard can keep it across awaits and threads. The cell
//! also points back to its cache, so a guard needs nothing else to find
//! its way back. The uncontended path writes nothing shared: the shard's
//! read lock is a slot of this thread's own, the key is found in the
//! table, and the cell's lock is taken with one atomic operation; the
//! release lets it go with another and then reads whether anyone waits
//! ([`crate::lock`]). The session stays in place in the cell: it is never
//! moved into the guard and back.
//!
//! Commands that find a key held queue in its table entry, in arrival
//! order, under the shard's write lock (the contended path only), and mark
//! the cell's lock. A release that sees the mark hands the cell, still
//! locked, to the first waiter through a oneshot channel, so nobody can
//! take the key ahead of the queue and nothing can observe two holders. A
//! waiter marks the lock and then tries it once more, and a release reads
//! the mark after letting go, on the same byte, so a key is never left free
//! with someone waiting for it. After a
//! hand-over, the releasing thread's next acquire yields first, so that the
//! new holder runs at once rather than keep a hot key while others queue.
//!
//! The expiry manager inspects cells only under a shard's lock and only
//! when nobody waits for them, so its brief look can neither race a
//! waiter's registration nor make one wait for nothing. `stop` looks under
//! the write lock, so such a look never passes for a holder, and it marks
//! every cell's lock so that each release tells it when it lets a key go.
//! A release that comes back for its key (to hand it on, or to tell
//! `stop`) and finds it taken again leaves that to whoever took it, so the
//! end of a brief look tells a stopping engine too: otherwise a look that
//! overlaps the last release would leave `stop` waiting for nobody.

use crate::clock::Timestamp;
use crate::data::SessionData;
use crate::data::State;
use crate::error::Error;
use crate::expiry::message::Flushed;
use crate::key::SessionKey;
use crate::lifecycle::Core;
use crate::lock::{self, ArcGuard, Mutex};
use crate::stats::Counters;
use crate::storage::Write;
use crate::sync::{self, ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use hashbrown::HashTable;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::oneshot;

type Waiter<K, S> = oneshot::Sender<Result<Held<K, S>, Error>>;

/// What a key has in memory.
pub(crate) struct Cell<K: SessionKey, S: State> {
    /// Its session, when one is loaded or created.
    pub(crate) session: Option<SessionData<S>>,
    /// Storage was already asked: no session here means none anywhere.
    pub(crate) loaded: bool,
    /// With a shared storage, while a command holds the key: the step that
    /// holds it against other engines.
    pub(crate) step: Option<Box<dyn crate::storage::Step>>,
    /// The cache it lives in: how a guard gets back without a reference
    /// count of its own to change on every acquire. (A cycle through the
    /// table, broken by [`Cache::clear`] when the engine goes away.)
    pub(crate) home: Arc<Cache<K, S>>,
}

type CellRef<K, S> = Arc<Mutex<Cell<K, S>>>;

/// A key, held: its cell's lock, owned.
pub(crate) type Owned<K, S> = ArcGuard<Cell<K, S>>;

/// A table entry: the key, its cell, and the commands waiting for it.
struct Entry<K: SessionKey, S: State> {
    key: K,
    cell: CellRef<K, S>,
    /// `Some` (and not empty) while commands wait. Boxed on purpose: one
    /// word in every entry instead of four, as few keys ever have waiters
    /// and a small table stays in cache.
    #[allow(clippy::box_collection)]
    waiters: Option<Box<VecDeque<Waiter<K, S>>>>,
}

/// A shard's table: its entries, and how many commands wait in them
/// (counted under the write lock that every queue change takes, so the
/// contended path writes no shared counter).
struct Table<K: SessionKey, S: State> {
    slots: HashTable<Entry<K, S>>,
    queued: usize,
}

/// One shard. Aligned so that shards share no cache line.
#[repr(align(64))]
struct Shard<K: SessionKey, S: State> {
    /// Read-locked by every acquire, so a sharded lock: each thread
    /// read-locks its own slot, on its own cache line, and acquires on two
    /// cores write no line in common (a plain reader count is one line that
    /// both cores write on every acquire). Writing (a new key, a queue, a
    /// flush, `stop`) locks every slot: the rare path pays.
    table: ShardedLock<Table<K, S>>,
    /// Keys released since the expiry manager last looked (each at most
    /// once: see `SessionData::touch_pending`). The manager reads their
    /// times from the cells, so a release costs no message and no wake-up.
    touched: sync::Mutex<Vec<K>>,
}

#[cfg(not(loom))]
thread_local! {
    /// This thread has just handed a key to a queued command. That command's
    /// task was woken onto this thread and holds the key until it runs; see
    /// [`handed_over`].
    static HANDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

// A model's threads share one operating-system thread.
#[cfg(loom)]
loom::thread_local! {
    static HANDED: std::cell::Cell<bool> = std::cell::Cell::new(false);
}

/// Whether this thread handed a key over since the last call (and forget
/// it). The next acquire on this thread yields first when it did, so that
/// the task that got the key runs now: otherwise it would wait until the
/// task that let the key go has spent its whole cooperative budget, holding
/// a hot key all that time while every other command for it queues behind
/// (a convoy that made a skewed mix 3× slower).
#[inline]
pub(crate) fn handed_over() -> bool {
    HANDED.with(|h| h.replace(false))
}

/// The cache: what every shard shares, and the shards. Aligned so that
/// its `Arc`'s reference count (changed when a cell is created or a key is
/// handed over) shares no cache line with what every operation reads.
#[repr(align(64))]
pub(crate) struct Cache<K: SessionKey, S: State> {
    pub(crate) core: Core<K, S>,
    shards: Box<[Shard<K, S>]>,
}

/// A held key whose session is not ready for a command yet (not loaded,
/// absent, or due for finalizing), as passed from one command to the next.
pub(crate) struct Held<K: SessionKey, S: State> {
    pub(crate) hash: u64,
    pub(crate) key: K,
    /// `None` once handed on (so that `Drop` does nothing).
    pub(crate) owned: Option<Owned<K, S>>,
}

impl<K: SessionKey, S: State> Held<K, S> {
    /// The session in the held cell, if there is one.
    pub(crate) fn session(&self) -> Option<&SessionData<S>> {
        self.owned.as_ref().and_then(|o| o.session.as_ref())
    }
}

impl<K: SessionKey, S: State> Drop for Held<K, S> {
    fn drop(&mut self) {
        if let Some(owned) = self.owned.take() {
            release(self.hash, &self.key, owned, false);
        }
    }
}

/// What taking a key gave.
pub(crate) enum Entered<K: SessionKey, S: State> {
    /// A free session, taken at once (the common case: no hand-over): the
    /// key with its session in memory, for a guard.
    Ready(Held<K, S>),
    /// The key, with nothing ready in memory.
    Held(Held<K, S>),
    /// A place in the key's queue.
    Queued(oneshot::Receiver<Result<Held<K, S>, Error>>),
}

fn lock<T>(m: &sync::Mutex<T>) -> impl std::ops::DerefMut<Target = T> + '_ {
    // Poisoning only means a panic elsewhere; a list of keys stays usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The key is ours: a guard if its session is in memory.
fn entered<K: SessionKey, S: State>(hash: u64, key: K, owned: Owned<K, S>) -> Entered<K, S> {
    let ready = owned.session.is_some();
    let held = Held {
        hash,
        key,
        owned: Some(owned),
    };
    match ready {
        true => Entered::Ready(held),
        false => Entered::Held(held),
    }
}

impl<K: SessionKey, S: State> Shard<K, S> {
    // Only a key's own `Hash` or `Eq` could panic under the lock, and the
    // table stays sound if one does: a poisoned lock is used as it is.
    fn read(&self) -> ShardedLockReadGuard<'_, Table<K, S>> {
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> ShardedLockWriteGuard<'_, Table<K, S>> {
        self.table
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<K: SessionKey, S: State> Cache<K, S> {
    pub(crate) fn new(core: Core<K, S>) -> Self {
        let shards = (0..core.config.shards.max(1))
            .map(|_| Shard {
                table: ShardedLock::new(Table {
                    slots: HashTable::new(),
                    queued: 0,
                }),
                touched: sync::Mutex::new(Vec::new()),
            })
            .collect();
        Cache { core, shards }
    }

    /// The shard a key's hash falls in. Picked from hash bits that the
    /// table does not use (it takes the low bits for the bucket and the top
    /// seven as a tag), so keys spread within a shard; by a multiply and
    /// shift rather than a division.
    fn shard(&self, hash: u64) -> &Shard<K, S> {
        let bits = u64::from((hash >> 25) as u32);
        let i = ((bits * self.shards.len() as u64) >> 32) as usize;
        &self.shards[i]
    }

    /// Take the key if it is free, or queue for it (or answer busy).
    #[inline]
    pub(crate) fn enter(
        self: &Arc<Self>,
        hash: u64,
        key: K,
        wait: bool,
    ) -> Result<Entered<K, S>, Error> {
        let shard = self.shard(hash);
        {
            let table = shard.read();
            // Under the lock that `stop` takes to see which keys are held:
            // either it sees this key held, or this sees it stopping.
            if self.core.stopping.load(Ordering::SeqCst) {
                return Err(Error::Stopping);
            }
            if let Some(entry) = table.slots.find(hash, |e| e.key == key)
                && entry.waiters.is_none()
                && let Some(owned) = entry.cell.try_lock_arc()
            {
                drop(table);
                return Ok(entered(hash, key, owned));
            }
        }
        self.enter_contended(shard, hash, key, wait)
    }

    /// The key is new, held, or has a queue (or the expiry manager is
    /// looking at it): decide under the write lock.
    #[cold]
    #[inline(never)]
    fn enter_contended(
        self: &Arc<Self>,
        shard: &Shard<K, S>,
        hash: u64,
        key: K,
        wait: bool,
    ) -> Result<Entered<K, S>, Error> {
        let mut guard = shard.write();
        let table = &mut *guard;
        // Checked under the lock: `stop` fails the waiters of each shard
        // under it, so no waiter can join after that unanswered.
        if self.core.stopping.load(Ordering::SeqCst) {
            return Err(Error::Stopping);
        }
        let Some(entry) = table.slots.find_mut(hash, |e| e.key == key) else {
            let cell = Arc::new(lock::new(Cell {
                session: None,
                loaded: false,
                step: None,
                home: self.clone(),
            }));
            // A new lock: taken at once.
            let owned = cell.lock_arc();
            table.slots.insert_unique(
                hash,
                Entry {
                    key: key.clone(),
                    cell,
                    waiters: None,
                },
                |e| self.core.hash(&e.key),
            );
            drop(guard);
            return Ok(entered(hash, key, owned));
        };
        if entry.waiters.is_none()
            && let Some(owned) = entry.cell.try_lock_arc()
        {
            drop(guard);
            return Ok(entered(hash, key, owned));
        }
        if !wait {
            return Err(Error::Busy);
        }
        let (tx, rx) = oneshot::channel();
        entry.waiters.get_or_insert_default().push_back(tx);
        table.queued += 1;
        // Either the holder's release sees this, or it let go before: then
        // the key is free now, and goes to the first in line.
        lock::set_notify(&entry.cell);
        if let Some(owned) = entry.cell.try_lock_arc() {
            self.give(table, hash, &key, owned, false);
        }
        Ok(Entered::Queued(rx))
    }

    /// Under the shard's write lock, with the key held: hand it to the
    /// first waiter still there; if there is none, let it go (and drop the
    /// entry when the cell is empty or `evict` asks for it). A cell that is
    /// no longer the key's (it left the table while nobody held it) is
    /// just let go.
    fn give(
        &self,
        table: &mut Table<K, S>,
        hash: u64,
        key: &K,
        mut owned: Owned<K, S>,
        evict: bool,
    ) {
        let Ok(mut slot) = table.slots.find_entry(hash, |e| e.key == *key) else {
            return;
        };
        if !Arc::ptr_eq(&slot.get().cell, ArcGuard::mutex(&owned)) {
            return;
        }
        let entry = slot.get_mut();
        while let Some(queue) = entry.waiters.as_mut() {
            let next = queue.pop_front();
            if queue.is_empty() {
                entry.waiters = None;
                // Nobody else to tell, unless the engine is stopping (then
                // every release reports to `stop`).
                if !self.core.stopping.load(Ordering::SeqCst) {
                    lock::clear_notify(&entry.cell);
                }
            }
            let Some(waiter) = next else { break };
            table.queued -= 1;
            let held = Held {
                hash,
                key: key.clone(),
                owned: Some(owned),
            };
            match waiter.send(Ok(held)) {
                Ok(()) => {
                    HANDED.with(|h| h.set(true));
                    return;
                }
                // That waiter gave up; take the key back and try the next.
                Err(Ok(mut held)) => match held.owned.take() {
                    Some(o) => owned = o,
                    None => return,
                },
                Err(Err(_)) => return,
            }
        }
        if evict || owned.session.is_none() {
            slot.remove();
        }
        drop(owned);
    }

    /// [`Cache::give`] under the key's shard's write lock.
    fn hand_over(&self, hash: u64, key: &K, owned: Owned<K, S>, evict: bool) {
        let mut table = self.shard(hash).write();
        self.give(&mut table, hash, key, owned, evict);
    }

    /// The engine is gone: drop every cell (each points back here, so
    /// the cache and its cells would otherwise keep each other alive).
    /// Waiters are answered by their channel closing; guards still out
    /// keep their own cell, and their release finds no entry.
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            let entries = {
                let mut table = shard.write();
                table.queued = 0;
                std::mem::take(&mut table.slots)
            };
            // Dropped outside the lock: a waiter's end may release a key.
            drop(entries);
        }
    }
}

/// Let a held key go: to the next waiter, or free (`evict`: out of memory,
/// when nobody waits). The common case (a session kept in memory, nobody
/// waiting) is inlined; everything else is out of line.
#[inline]
pub(crate) fn release<K: SessionKey, S: State>(
    hash: u64,
    key: &K,
    mut owned: Owned<K, S>,
    evict: bool,
) {
    if owned.step.is_some() {
        // A step not finished: dropped, it lets the key go unchanged.
        owned.step = None;
    }
    let Some(s) = owned.session.as_mut().filter(|_| !evict) else {
        return release_out(hash, key, owned);
    };
    let first = !s.touch_pending;
    if first {
        s.touch_pending = true;
    }
    let expires_at = s.expires_at;
    let core = &owned.home.core;
    let wake = expires_at.is_some_and(|t| t.0 < core.next_wake.load(Ordering::Relaxed));
    if first || wake || core.stopping.load(Ordering::Relaxed) {
        return release_noting(hash, key, owned, first, wake);
    }
    let cell = ArcGuard::into_arc(owned);
    // Someone queued, or `stop` waits for this key (see `crate::lock`).
    if lock::must_notify(&cell) {
        settle_after(hash, key, &cell);
    }
}

/// A release with something for the expiry manager or `stop`: list the
/// key, wake the manager if the deadline comes before its plan, tell
/// `stop` that one more key is free.
#[cold]
#[inline(never)]
fn release_noting<K: SessionKey, S: State>(
    hash: u64,
    key: &K,
    owned: Owned<K, S>,
    first: bool,
    wake: bool,
) {
    let home = owned.home.clone();
    let core = &home.core;
    if first {
        lock(&home.shard(hash).touched).push(key.clone());
    }
    let cell = ArcGuard::into_arc(owned);
    if lock::must_notify(&cell) {
        settle_after(hash, key, &cell);
    }
    if wake {
        core.wake_expiry.notify_one();
    }
    if core.stopping.load(Ordering::SeqCst) {
        core.released.notify_waiters();
    }
}

/// After letting a key go, someone waits for it, or an engine is
/// stopping: take the key back if it is still free, hand it to its first
/// waiter, and tell a stopping engine. If someone else took it meanwhile,
/// their release does this: a command's, or the end of a brief look
/// ([`Cache::looked`]).
#[cold]
#[inline(never)]
fn settle_after<K: SessionKey, S: State>(hash: u64, key: &K, cell: &CellRef<K, S>) {
    if let Some(owned) = cell.try_lock_arc() {
        let home = owned.home.clone();
        home.hand_over(hash, key, owned, false);
        if home.core.stopping.load(Ordering::SeqCst) {
            home.core.released.notify_waiters();
        }
    }
}

/// A release that leaves no session in memory unless someone waits.
#[cold]
#[inline(never)]
fn release_out<K: SessionKey, S: State>(hash: u64, key: &K, owned: Owned<K, S>) {
    let home = owned.home.clone();
    home.hand_over(hash, key, owned, true);
    if home.core.stopping.load(Ordering::Relaxed) {
        home.core.released.notify_waiters();
    }
}

/// A guard was dropped without an awaited release.
#[inline]
pub(crate) fn release_from_drop<K: SessionKey, S: State>(
    hash: u64,
    key: &K,
    mut owned: Owned<K, S>,
) {
    if owned.step.is_some() {
        return save_in_background(hash, key, owned);
    }
    match owned.session.as_mut() {
        Some(s) if s.dirty => return save_in_background(hash, key, owned),
        Some(s) => {
            if !s.unstamped {
                // No clock read here: the expiry manager stamps the release
                // time when it notes the key (within about a second).
                s.unstamped = true;
            }
            if !s.begun {
                let home = owned.home.clone();
                home.core.begin_if_kept(key, &mut owned.session);
            }
        }
        None => {}
    }
    release(hash, key, owned, false);
}

/// A guard with a persistent change was dropped: its save goes on in the
/// background, and the key is released after it.
#[cold]
#[inline(never)]
fn save_in_background<K: SessionKey, S: State>(hash: u64, key: &K, owned: Owned<K, S>) {
    let key = key.clone();
    let runtime = owned.home.core.runtime.clone();
    runtime.spawn(async move {
        if let Err(e) = finish(hash, key, owned).await {
            tracing::warn!(error = %e, "background save after drop failed; the session stays dirty");
        }
    });
}

/// A command is done with the session: save it if needed, apply lazy
/// creation, send the begin notification, hand it on.
pub(crate) async fn finish<K: SessionKey, S: State>(
    hash: u64,
    key: K,
    mut owned: Owned<K, S>,
) -> Result<(), Error> {
    let cell = &mut *owned;
    if let Some(s) = cell.session.as_mut() {
        s.last_access = cell.home.core.now();
        s.unstamped = false;
    }
    let result = match (cell.step.take(), cell.session.as_mut()) {
        (Some(step), s) => cell.home.core.finish_step(&key, s, step).await,
        (None, Some(s)) => cell.home.core.save(&key, s, &mut cell.step).await,
        (None, None) => Ok(()),
    };
    let home = owned.home.clone();
    home.core.begin_if_kept(&key, &mut owned.session);
    release(hash, &key, owned, false);
    result
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
        for shard in self.shards.iter() {
            let keys = std::mem::take(&mut *lock(&shard.touched));
            if keys.is_empty() {
                continue;
            }
            let mut held = Vec::new();
            let table = shard.read();
            for key in keys {
                let hash = self.core.hash(&key);
                let Some(entry) = table.slots.find(hash, |e| e.key == key) else {
                    continue;
                };
                let cell = match entry.waiters {
                    None => entry.cell.try_lock(),
                    Some(_) => None,
                };
                match cell {
                    Some(mut cell) => {
                        if let Some(s) = cell.session.as_mut() {
                            s.touch_pending = false;
                            if s.unstamped {
                                s.unstamped = false;
                                s.last_access = s.last_access.max(now);
                            }
                            out.push((key, s.expires_at, s.last_access));
                        }
                    }
                    None => held.push(key),
                }
            }
            drop(table);
            if !held.is_empty() {
                lock(&shard.touched).extend(held);
            }
        }
        self.looked();
    }

    /// After brief looks at cells (the expiry manager's, which take a cell
    /// only when nobody waits for it and let it go plainly): tell a
    /// stopping engine. A release whose retry found the cell taken by such
    /// a look leaves the telling to it, and `stop` may be waiting for that
    /// very release.
    fn looked(&self) {
        if self.core.stopping.load(Ordering::SeqCst) {
            self.core.released.notify_waiters();
        }
    }

    /// The synchronous part of a flush: drop a clean session at once, or
    /// hold a dirty one's key for saving (`Ok`, let go by a release).
    pub(crate) fn take_for_flush(
        &self,
        hash: u64,
        key: &K,
        last_access: Timestamp,
        now: Timestamp,
    ) -> Result<Owned<K, S>, Flushed> {
        let taken = self.look_for_flush(hash, key, last_access, now);
        if taken.is_err() {
            self.looked();
        }
        taken
    }

    /// [`Cache::take_for_flush`]'s look, which lets the cell go again
    /// unless it is taken.
    fn look_for_flush(
        &self,
        hash: u64,
        key: &K,
        last_access: Timestamp,
        now: Timestamp,
    ) -> Result<Owned<K, S>, Flushed> {
        let mut table = self.shard(hash).write();
        let Ok(slot) = table.slots.find_entry(hash, |e| e.key == *key) else {
            return Err(Flushed::Skipped);
        };
        if slot.get().waiters.is_some() {
            return Err(Flushed::Skipped);
        }
        let Some(owned) = slot.get().cell.try_lock_arc() else {
            return Err(Flushed::Skipped);
        };
        let Some(s) = owned.session.as_ref() else {
            return Err(Flushed::Skipped);
        };
        if s.touch_pending || s.last_access > last_access {
            return Err(Flushed::Skipped); // touched since it was picked
        }
        if s.expires_at
            .is_some_and(|t| t <= now.after(Duration::from_secs(5)))
        {
            return Err(Flushed::KeepResident(s.expires_at));
        }
        if s.dirty {
            return Ok(owned);
        }
        let stored = s.stored;
        slot.remove();
        drop(owned);
        Counters::add(&self.core.counters.flushes, 1);
        Err(if stored {
            Flushed::Done
        } else {
            Flushed::Forget
        })
    }

    /// How many sessions the cache holds (free or held).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().slots.len()).sum()
    }

    /// How many commands wait in queues.
    pub(crate) fn queued(&self) -> usize {
        self.shards.iter().map(|s| s.read().queued).sum()
    }

    /// How many keys commands hold. Under each shard's write lock, so that
    /// the brief looks the expiry manager takes under the read lock are not
    /// mistaken for holders.
    pub(crate) fn locked(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let table = s.write();
                table.slots.iter().filter(|e| e.cell.is_locked()).count()
            })
            .sum()
    }

    /// Stopping: from now on every release of a key in memory tells
    /// `stop` (which waits for the last held key), and so does the end of
    /// every brief look ([`Cache::looked`]). Under each shard's write lock,
    /// so no key can be taken unseen: a command that took it before holds
    /// it now (and its release sees the mark), and one that comes after
    /// sees the engine stopping.
    pub(crate) fn watch_releases(&self) {
        for shard in self.shards.iter() {
            for entry in shard.write().slots.iter() {
                lock::set_notify(&entry.cell);
            }
        }
    }

    /// Stopping: answer every queued command with [`Error::Stopping`].
    pub(crate) fn fail_waiters(&self) {
        for shard in self.shards.iter() {
            let mut guard = shard.write();
            let table = &mut *guard;
            for entry in table.slots.iter_mut() {
                if let Some(queue) = entry.waiters.take() {
                    for waiter in *queue {
                        table.queued -= 1;
                        let _ = waiter.send(Err(Error::Stopping));
                    }
                }
            }
        }
    }

    /// Stopping, with no key held: the writes that save every dirty
    /// session. `Ok(false)`: a key was busy for a moment (a release making
    /// sure nobody waits for it); the caller asks again.
    pub(crate) fn dirty_writes(&self, out: &mut Vec<(K, Write)>) -> Result<bool, Error> {
        out.clear();
        for shard in self.shards.iter() {
            let table = shard.write();
            for entry in table.slots.iter() {
                let Some(cell) = entry.cell.try_lock() else {
                    return Ok(false);
                };
                if let Some(s) = cell.session.as_ref()
                    && s.dirty
                {
                    out.push((entry.key.clone(), self.core.put(&entry.key, s)?));
                }
            }
        }
        Ok(true)
    }

    /// The session of `key` was saved by `stop`.
    pub(crate) fn mark_saved(&self, key: &K) {
        let hash = self.core.hash(key);
        let table = self.shard(hash).write();
        if let Some(entry) = table.slots.find(hash, |e| e.key == *key)
            && entry.waiters.is_none()
            && let Some(mut cell) = entry.cell.try_lock()
            && let Some(s) = cell.session.as_mut()
        {
            s.dirty = false;
            s.stored = true;
        }
    }
}
