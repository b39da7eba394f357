//! A wall clock the test moves by hand, for the exchange (and through it
//! the schedulers), so time-dependent behaviour is tested without waiting.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use estafeta_session::{Clock, Timestamp};

/// Stands still until [`ManualClock::advance`].
#[derive(Clone, Debug)]
pub(crate) struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading the current real time, frozen.
    pub(crate) fn now() -> Self {
        ManualClock(Arc::new(AtomicU64::new(
            Timestamp::from_system_time(SystemTime::now()).0,
        )))
    }

    /// Moves the clock forward.
    pub(crate) fn advance(&self, d: Duration) {
        self.0
            .fetch_add(u64::try_from(d.as_millis()).unwrap(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}
