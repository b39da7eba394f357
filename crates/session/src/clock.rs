//! Where the engine gets the time from.
//!
//! Session lifetimes survive restarts, so they are wall-clock instants
//! ([`Timestamp`], milliseconds since the Unix epoch). The caller chooses the
//! clock: [`SystemClock`] in production, [`TokioClock`] in tests, where a
//! paused tokio runtime (`tokio::time::pause()`) moves it forward.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A wall-clock instant in milliseconds since the Unix epoch.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// This instant moved forward by `d` (saturating).
    pub fn after(self, d: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_add(d.as_millis().try_into().unwrap_or(u64::MAX)),
        )
    }

    /// This instant moved back by `d` (saturating at the epoch).
    pub fn before(self, d: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_sub(d.as_millis().try_into().unwrap_or(u64::MAX)),
        )
    }

    /// How long from `earlier` to this instant; zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// The same instant as a [`SystemTime`].
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.0)
    }

    /// A [`SystemTime`] as a timestamp (times before the epoch become the epoch).
    pub fn from_system_time(t: SystemTime) -> Timestamp {
        let ms = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
        Timestamp(ms.try_into().unwrap_or(u64::MAX))
    }
}

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Timestamp;

    /// Whether this is the operating system's wall clock, which may be set
    /// or stepped under the process: a user that must count time steadily
    /// (a clock that keeps another machine's time) counts with the
    /// monotonic clock instead of following it. Any other clock (a test's)
    /// is the time to follow.
    fn is_system(&self) -> bool {
        false
    }
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_system_time(SystemTime::now())
    }

    fn is_system(&self) -> bool {
        true
    }
}

/// A wall clock that advances with tokio's clock, so a test that pauses
/// tokio's time (`tokio::time::pause()`, `advance`) controls it exactly.
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    start_wall: Timestamp,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads `start_wall` now and moves with tokio's time.
    pub fn starting_at(start_wall: Timestamp) -> TokioClock {
        TokioClock {
            start_wall,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.start_wall.after(self.start.elapsed())
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }

    fn is_system(&self) -> bool {
        (**self).is_system()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_system_clock_says_so_behind_an_arc_and_no_other_does() {
        let system: Arc<dyn Clock> = Arc::new(SystemClock);
        assert!(system.is_system());
        assert!(Arc::new(system).is_system());
        let tokio: Arc<dyn Clock> = Arc::new(TokioClock {
            start_wall: Timestamp(0),
            start: tokio::time::Instant::now(),
        });
        assert!(!tokio.is_system());
    }
}
