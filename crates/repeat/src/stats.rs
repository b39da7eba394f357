//! What the scheduler reports about itself: counts per source, work in
//! flight, outcomes, and dispatch lag.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the lag histogram's buckets, in milliseconds; the last
/// bucket holds everything above the last bound.
pub const LAG_BOUNDS_MS: [u64; 14] = [
    10, 50, 100, 250, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 300_000, 3_600_000,
    86_400_000,
];

/// Dispatch lag (wall-clock time of hand-out minus due time) as a histogram.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LagHistogram {
    /// `counts[i]` entries had a lag of at most `LAG_BOUNDS_MS[i]` (and more
    /// than the bound before); the last element counts lags above all bounds.
    pub counts: [u64; LAG_BOUNDS_MS.len() + 1],
}

impl LagHistogram {
    /// Records one lag.
    pub fn record(&mut self, lag: Duration) {
        let ms = u64::try_from(lag.as_millis()).unwrap_or(u64::MAX);
        let bucket = LAG_BOUNDS_MS.partition_point(|&bound| bound < ms);
        self.counts[bucket] += 1;
    }

    /// Number of lags recorded.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The bucket bound at or below which a fraction `q` (0..=1) of the lags
    /// fall; `None` when empty, `u64::MAX` for the overflow bucket.
    pub fn quantile_ms(&self, q: f64) -> Option<u64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        // Rank of the q-th lag, 1-based; float to int conversion saturates.
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(LAG_BOUNDS_MS.get(i).copied().unwrap_or(u64::MAX));
            }
        }
        Some(u64::MAX)
    }
}

/// Counts for one source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Entries stored in the source.
    pub entries: u64,
    /// Entries due now or earlier (the due backlog), including those in flight.
    pub due: u64,
    /// Failed reads of this source since its last good one.
    pub failures: u32,
    /// The last read error, while the source is failing.
    pub last_error: Option<String>,
}

/// A snapshot of the scheduler, from [`Scheduler::stats`](crate::Scheduler::stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Per source, by name.
    pub sources: BTreeMap<String, SourceStats>,
    /// Entries taken and not yet finished: handlers running now, and
    /// entries waiting for a worker ([`Options::prefetch`](crate::Options::prefetch)).
    pub in_flight: u64,
    /// Entries taken for handlers so far, those waiting for a worker
    /// included.
    pub dispatched: u64,
    /// Handler outcomes: done.
    pub done: u64,
    /// Handler outcomes: rescheduled.
    pub rescheduled: u64,
    /// Handler outcomes: failed (including panics), to be retried.
    pub failed: u64,
    /// Late entries removed by [`Misfire::Skip`](crate::Misfire::Skip).
    pub skipped: u64,
    /// Times the dispatcher loop woke up; it stays flat while the loop sleeps.
    pub wakeups: u64,
    /// Failed background writes (finished deliveries), retried until they
    /// succeed or the scheduler closes.
    pub write_errors: u64,
    /// Entries lost: with [`Delivery::AtMostOnce`](crate::Delivery::AtMostOnce),
    /// a `Failed` or `Reschedule` outcome whose entry could not be put back
    /// by the time the scheduler closed (the entry was removed before its
    /// handler ran, as a crash would leave it).
    pub lost: u64,
    /// Dispatch lag.
    pub lag: LagHistogram,
}

/// Live counters shared by the dispatcher, the writer and [`Stats`] snapshots.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) in_flight: AtomicU64,
    pub(crate) dispatched: AtomicU64,
    pub(crate) done: AtomicU64,
    pub(crate) rescheduled: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    pub(crate) write_errors: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) lag: Mutex<LagHistogram>,
    /// Failing sources: name → (failures, last error).
    pub(crate) health: Mutex<BTreeMap<String, (u32, String)>>,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }

    /// Fills the counter part of a snapshot.
    pub(crate) fn snapshot(&self, stats: &mut Stats) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        stats.in_flight = get(&self.in_flight);
        stats.dispatched = get(&self.dispatched);
        stats.done = get(&self.done);
        stats.rescheduled = get(&self.rescheduled);
        stats.failed = get(&self.failed);
        stats.skipped = get(&self.skipped);
        stats.wakeups = get(&self.wakeups);
        stats.write_errors = get(&self.write_errors);
        stats.lost = get(&self.lost);
        stats.lag = self.lag.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        for (name, (failures, error)) in health.iter() {
            let source = stats.sources.entry(name.clone()).or_default();
            source.failures = *failures;
            source.last_error = Some(error.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_histogram_buckets_and_quantiles() {
        let mut h = LagHistogram::default();
        assert_eq!(h.quantile_ms(0.5), None);
        for ms in [0, 5, 10, 11, 700, 900] {
            h.record(Duration::from_millis(ms));
        }
        h.record(Duration::from_secs(100_000));
        assert_eq!(h.counts[0], 3);
        assert_eq!(h.counts[1], 1);
        assert_eq!(h.counts[5], 2);
        assert_eq!(h.counts[LAG_BOUNDS_MS.len()], 1);
        assert_eq!(h.total(), 7);
        assert_eq!(h.quantile_ms(0.4), Some(10));
        assert_eq!(h.quantile_ms(0.8), Some(1_000));
        assert_eq!(h.quantile_ms(1.0), Some(u64::MAX));
    }
}
