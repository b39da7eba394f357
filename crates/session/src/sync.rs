//! The atomics and locks of the key-holding protocol (each key's lock
//! byte, the shards' tables, the lists for the expiry manager, the
//! stopping flag), and its one spin. Built with `--cfg loom`, they are
//! loom's, so that the model checks in `crate::model` explore every
//! interleaving of the real code; otherwise the usual ones.

#[cfg(not(loom))]
pub(crate) use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8};
#[cfg(loom)]
pub(crate) use loom::sync::{
    Mutex, RwLock as ShardedLock, RwLockReadGuard as ShardedLockReadGuard,
    RwLockWriteGuard as ShardedLockWriteGuard,
};

/// Let other threads run while spinning on a lock.
#[inline]
pub(crate) fn spin() {
    #[cfg(not(loom))]
    {
        std::hint::spin_loop();
        std::thread::yield_now();
    }
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Let other tasks run once (a thread, in a model).
pub(crate) async fn yield_now() {
    #[cfg(not(loom))]
    tokio::task::yield_now().await;
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// `f`'s output, or `None` if `deadline` passes first. A model has no
/// clock (and no timer outside a runtime): there it is `f`'s output.
pub(crate) async fn before<F: std::future::Future>(
    deadline: tokio::time::Instant,
    f: F,
) -> Option<F::Output> {
    #[cfg(not(loom))]
    return tokio::time::timeout_at(deadline, f).await.ok();
    #[cfg(loom)]
    {
        let _ = deadline;
        Some(f.await)
    }
}
