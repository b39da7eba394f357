//! Choices a caller makes about dispatching: source order, delivery
//! guarantee, misfire handling and retry backoff.

use std::time::Duration;

/// In which order due entries are taken from several sources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SourceOrder {
    /// Round-robin with equal shares: each pass splits the entries it may
    /// take evenly over the sources that have due entries (the first ones
    /// taking one more each while some are left over), starting one source
    /// further each pass, and gives what a source cannot use to the others
    /// (deficit round-robin with unit cost). A source that always has due
    /// entries cannot starve another.
    #[default]
    Fair,
    /// Nearest first: the source with the nearest due entry is drained
    /// first (ties broken by source name), then the next. A busy source can
    /// starve the others.
    NearestFirst,
}

/// When an entry is removed from the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Delivery {
    /// Removed only after its handler finished (or it was rescheduled): an
    /// entry in flight when the process dies is handed out again after restart.
    #[default]
    AtLeastOnce,
    /// Removed (durably) before it is handed out: a crash
    /// while its handler runs loses it, but it never runs twice. A `Failed`
    /// or `Reschedule` outcome puts it back; if that write still fails when
    /// the scheduler closes, the entry is lost the same way and counted in
    /// [`Stats::lost`](crate::Stats::lost).
    AtMostOnce,
}

/// What happens to entries found late, for example after a downtime or a
/// forward step of the wall clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Misfire {
    /// Hand every late entry out as soon as a worker is free.
    #[default]
    FireNow,
    /// Hand a late entry out once; if its handler reschedules it to a time
    /// that is still in the past, the new due time is moved forward by whole
    /// periods (period = new due − old due) to the first second after now,
    /// so a periodic entry that missed many periods fires once, not once per
    /// missed period.
    Coalesce,
    /// Remove, without calling the handler, entries that are more than
    /// `threshold` late; hand out the others.
    Skip {
        /// The largest lateness still handed out.
        threshold: Duration,
    },
}

/// Backoff for entries whose handler failed: the entry is moved to
/// `now + min(first × 2^(attempt − 1), max)`, rounded up to whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The delay after the first failure.
    pub first: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            first: Duration::from_secs(1),
            max: Duration::from_secs(3600),
        }
    }
}

impl RetryPolicy {
    /// Whole seconds to wait after failure number `attempt` (1-based); at least 1.
    pub fn delay_secs(&self, attempt: u32) -> u64 {
        let doublings = attempt.saturating_sub(1).min(63);
        let delay = self
            .first
            .checked_mul(1u32.checked_shl(doublings).unwrap_or(u32::MAX))
            .unwrap_or(self.max)
            .min(self.max);
        let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        secs.max(1)
    }
}

/// Everything configurable about a [`Scheduler`](crate::Scheduler).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Order between sources.
    pub order: SourceOrder,
    /// Delivery guarantee.
    pub delivery: Delivery,
    /// Policy for late entries.
    pub misfire: Misfire,
    /// Backoff for failed handlers.
    pub retry: RetryPolicy,
    /// The most entries taken in one pass over the sources.
    pub max_batch: usize,
    /// How many entries per worker of the pool may be handed out at once,
    /// running or waiting for a worker (at least 1): a pass takes entries
    /// for its free workers and, beyond them, up to `prefetch` × the pool's
    /// size in all, those beyond waiting for a worker in the order taken.
    /// Each pass is a store read (over a database, a round trip and a
    /// commit), so fewer, larger passes hand out more entries a second when
    /// handlers are short. An entry waits for its worker within its hold,
    /// which settles only when its last entry's handler returns; on
    /// shutdown, entries still waiting are not started and stay stored. With
    /// [`Delivery::AtMostOnce`] a pass takes entries only for its free
    /// workers: a taken entry is already removed, and one waiting for a
    /// worker would be lost in a crash.
    pub prefetch: usize,
    /// The first delay before a failing source is read again; it doubles on
    /// each further failure up to `source_backoff_max`.
    pub source_backoff: Duration,
    /// The longest delay before a failing source is read again.
    pub source_backoff_max: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            order: SourceOrder::default(),
            delivery: Delivery::default(),
            misfire: Misfire::default(),
            retry: RetryPolicy::default(),
            max_batch: 1024,
            prefetch: 4,
            source_backoff: Duration::from_millis(100),
            source_backoff_max: Duration::from_secs(30),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_doubles_up_to_max() {
        let policy = RetryPolicy {
            first: Duration::from_millis(1500),
            max: Duration::from_secs(10),
        };
        assert_eq!(policy.delay_secs(1), 2);
        assert_eq!(policy.delay_secs(2), 3);
        assert_eq!(policy.delay_secs(3), 6);
        assert_eq!(policy.delay_secs(4), 10);
        assert_eq!(policy.delay_secs(u32::MAX), 10);
    }
}
