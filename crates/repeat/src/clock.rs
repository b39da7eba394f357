//! Where the scheduler gets the wall-clock time from.
//!
//! Due times are wall-clock seconds, but the dispatcher sleeps on Tokio's
//! monotonic timer; see the crate docs for how the two are combined.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

/// A source of wall-clock time, injected so tests can control it.
pub trait Clock: Send + Sync + 'static {
    /// Wall-clock time since the UNIX epoch.
    fn now(&self) -> Duration;

    /// Wall-clock whole seconds since the UNIX epoch.
    fn now_secs(&self) -> u64 {
        self.now().as_secs()
    }
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        // A system clock set before 1970 reads as the epoch rather than failing.
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
    }
}

/// A wall clock for tests: it advances with Tokio's (pausable) monotonic time
/// from a chosen start, and can be stepped forwards or backwards the way an
/// operator changing the system time would.
///
/// With `tokio::time::pause()` the whole scheduler runs on virtual time, so
/// tests of an hour of downtime take milliseconds.
#[derive(Debug, Clone)]
pub struct TestClock {
    inner: Arc<TestClockInner>,
}

#[derive(Debug)]
struct TestClockInner {
    start_wall: Duration,
    start: tokio::time::Instant,
    step_millis: AtomicI64,
}

impl TestClock {
    /// A clock that reads `start_secs` (UNIX seconds) now.
    pub fn new(start_secs: u64) -> Self {
        Self {
            inner: Arc::new(TestClockInner {
                start_wall: Duration::from_secs(start_secs),
                start: tokio::time::Instant::now(),
                step_millis: AtomicI64::new(0),
            }),
        }
    }

    /// Steps the wall clock by `millis` (negative: backwards) without any
    /// monotonic time passing.
    pub fn step_millis(&self, millis: i64) {
        self.inner.step_millis.fetch_add(millis, Ordering::SeqCst);
    }

    /// Steps the wall clock by whole seconds (negative: backwards).
    pub fn step_secs(&self, secs: i64) {
        self.step_millis(secs.saturating_mul(1000));
    }
}

impl Clock for TestClock {
    fn now(&self) -> Duration {
        let base = self.inner.start_wall + self.inner.start.elapsed();
        let step = self.inner.step_millis.load(Ordering::SeqCst);
        let magnitude = Duration::from_millis(step.unsigned_abs());
        if step >= 0 {
            base + magnitude
        } else {
            base.saturating_sub(magnitude)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn test_clock_follows_tokio_time_and_steps() {
        let clock = TestClock::new(1_000);
        assert_eq!(clock.now_secs(), 1_000);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(clock.now(), Duration::from_millis(1_001_500));
        clock.step_secs(-100);
        assert_eq!(clock.now_secs(), 901);
        clock.step_secs(3_600);
        assert_eq!(clock.now_secs(), 4_501);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_secs() > 1_577_836_800);
    }
}
