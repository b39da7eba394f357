//! Counters the engine keeps for the server to export.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters (monotonic, except the gauges).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) loads: AtomicU64,
    pub(crate) saves: AtomicU64,
    pub(crate) save_batches: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) expiries: AtomicU64,
    pub(crate) finalize_calls: AtomicU64,
    pub(crate) storage_errors: AtomicU64,
    pub(crate) quarantined: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// A snapshot of the engine's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Sessions held in memory now (free or locked).
    pub in_memory: u64,
    /// Commands waiting in some session's queue now.
    pub queued: u64,
    /// Sessions read from storage.
    pub loads: u64,
    /// Session records written to storage.
    pub saves: u64,
    /// Durable write transactions (each one fsync); `saves / save_batches`
    /// is the group-commit factor.
    pub save_batches: u64,
    /// Idle sessions flushed out of memory.
    pub flushes: u64,
    /// Sessions that ended.
    pub expiries: u64,
    /// Calls of the finalize hook.
    pub finalize_calls: u64,
    /// Storage operations that failed.
    pub storage_errors: u64,
    /// Records moved aside because they could not be decoded.
    pub quarantined: u64,
}

impl Counters {
    pub(crate) fn snapshot(&self, in_memory: u64, queued: u64) -> Stats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            in_memory,
            queued,
            loads: l(&self.loads),
            saves: l(&self.saves),
            save_batches: l(&self.save_batches),
            flushes: l(&self.flushes),
            expiries: l(&self.expiries),
            finalize_calls: l(&self.finalize_calls),
            storage_errors: l(&self.storage_errors),
            quarantined: l(&self.quarantined),
        }
    }
}
