//! A key's lock: one byte that says whether a command holds the key, and
//! whether whoever lets it go must look at the key's queue.
//!
//! Holding alone is what any mutex does. The second bit is why this one
//! exists: commands that find a key held queue for it, raise the bit
//! (under their shard's write lock) and try the lock once more; a release
//! clears the holding bit with one atomic operation and then reads the
//! other bit with a separate Acquire load of the same byte. Every change of
//! the byte is in one modification order, so either the raise comes before
//! the clear, and the release's later load sees it, or after, and the
//! waiter's own retry finds the key free: letting go and learning that
//! someone waits cannot miss each other, with no fence and no second
//! memory location on the common path (one atomic instruction and one load
//! on the line the command already owns). A stopping engine raises the bit
//! on every cell, so that each release tells it.
//!
//! Used through [`lock_api::Mutex`], whose owned guards (`lock_arc`) a
//! `'static` session guard holds; the bit is read and changed only through
//! the functions here.

#![allow(unsafe_code)]

use crate::sync::AtomicU8;
use lock_api::{GuardSend, RawMutex};
use std::sync::atomic::Ordering;

/// A command holds the key.
const HELD: u8 = 1;
/// Someone must be told when the key is let go: commands wait for it, or
/// the engine is stopping.
const NOTIFY: u8 = 2;

/// The raw lock of a key's cell.
pub(crate) struct CellLock(AtomicU8);

/// A cell's data behind its lock.
pub(crate) type Mutex<T> = lock_api::Mutex<CellLock, T>;

/// An owned hold on a cell (keeps the cell alive and locked).
pub(crate) type ArcGuard<T> = lock_api::ArcMutexGuard<CellLock, T>;

/// A new, free lock around `value`. (Not `Mutex::new`: a model's atomics
/// cannot be made in a constant.)
pub(crate) fn new<T>(value: T) -> Mutex<T> {
    Mutex::from_raw(CellLock(AtomicU8::new(0)), value)
}

// SAFETY: `try_lock` and `lock` succeed only by changing HELD from clear to
// set in one atomic operation (Acquire), and `unlock` clears it (Release):
// one holder at a time, and each holder sees the previous one's writes. The
// NOTIFY bit never affects who holds the lock.
unsafe impl RawMutex for CellLock {
    #[cfg(not(loom))]
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: CellLock = CellLock(AtomicU8::new(0));
    // Every lock is made by `new`; this is never evaluated.
    #[cfg(loom)]
    const INIT: CellLock = panic!("a model's lock is made by `lock::new`");

    // A held key is passed between tasks and threads (see `shard`).
    type GuardMarker = GuardSend;

    fn lock(&self) {
        // Only ever called on a cell nobody else can see yet; spinning is
        // still correct if that changes.
        while !self.try_lock() {
            crate::sync::spin();
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        self.0.fetch_or(HELD, Ordering::Acquire) & HELD == 0
    }

    #[inline]
    unsafe fn unlock(&self) {
        self.0.fetch_and(!HELD, Ordering::Release);
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.0.load(Ordering::Relaxed) & HELD != 0
    }
}

/// The raw lock of `m`, for its NOTIFY bit.
#[inline]
fn raw<T>(m: &Mutex<T>) -> &CellLock {
    // SAFETY: `raw` is unsafe because the caller could unlock the mutex
    // behind a guard's back. The reference stays in this module, which
    // only reads the state and changes the NOTIFY bit.
    unsafe { m.raw() }
}

/// Whether whoever lets `m` go must look at its queue. After a release
/// this is exact for that release: the bit raised before it let go is
/// seen, and one raised after belongs to a command that tries the lock
/// itself after raising it.
#[inline]
pub(crate) fn must_notify<T>(m: &Mutex<T>) -> bool {
    raw(m).0.load(Ordering::Acquire) & NOTIFY != 0
}

/// Ask the next release of `m` to look at its queue.
#[inline]
pub(crate) fn set_notify<T>(m: &Mutex<T>) {
    raw(m).0.fetch_or(NOTIFY, Ordering::AcqRel);
}

/// The queue of `m` is empty again and nobody else must be told.
#[inline]
pub(crate) fn clear_notify<T>(m: &Mutex<T>) {
    raw(m).0.fetch_and(!NOTIFY, Ordering::AcqRel);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn holding_and_the_notify_bit_are_independent() {
        let m = Arc::new(new(0u32));
        let g = m.try_lock_arc().expect("free");
        assert!(m.try_lock_arc().is_none(), "one holder at a time");
        set_notify(&m);
        assert!(m.is_locked());
        drop(g);
        assert!(!m.is_locked());
        assert!(must_notify(&m), "the release leaves the bit for its reader");
        let g = m.try_lock_arc().expect("the bit does not hold the lock");
        clear_notify(&m);
        drop(g);
        assert!(!must_notify(&m));
    }

    #[test]
    fn holders_see_each_others_writes() {
        let m = Arc::new(new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *m.lock_arc() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock(), 40_000);
    }
}
