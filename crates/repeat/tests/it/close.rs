//! Outcomes whose write still fails when the scheduler closes: with
//! at-least-once delivery the entry stays stored and is handed out again;
//! with at-most-once delivery it was removed before its handler ran, so it
//! is lost, and reported as lost.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::common::{Probe, Running, T0};
use estafeta_repeat::store::{Applied, Op, Scan, SourceCount};
use estafeta_repeat::{
    Delivery, MemoryStore, Options, Outcome, Position, Scheduler, Store, StoreError, TestClock,
};

/// A memory store that refuses every write recording a handler's outcome
/// (a move, or putting an entry back) while `broken` is set.
#[derive(Clone, Default)]
struct OutcomesFail {
    inner: MemoryStore,
    broken: Arc<AtomicBool>,
}

impl Store for OutcomesFail {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        let outcome = ops
            .iter()
            .any(|op| matches!(op, Op::Move { .. } | Op::Restore(_)));
        if outcome && self.broken.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("disk full".into()));
        }
        self.inner.apply(ops)
    }

    fn sources(&self) -> Result<Vec<String>, StoreError> {
        self.inner.sources()
    }

    fn scan(
        &self,
        source: &str,
        from: Bound<&Position>,
        now: u64,
        limit: usize,
        skip: &dyn Fn(&Position) -> bool,
    ) -> Result<Scan, StoreError> {
        self.inner.scan(source, from, now, limit, skip)
    }

    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        self.inner.count(source, now)
    }
}

/// Hands out one entry whose handler fails, closes the scheduler while
/// recording that outcome fails, and returns what a scheduler reopened on
/// the same data holds, with the first scheduler's lost count.
async fn close_while_an_outcome_fails(delivery: Delivery) -> (u64, u64) {
    let store = OutcomesFail::default();
    store.broken.store(true, Ordering::SeqCst);
    let clock = TestClock::new(T0);
    let options = Options {
        delivery,
        ..Options::default()
    };
    let s = Scheduler::new(store.clone(), clock.clone(), options);
    s.schedule("a", T0, "x", b"x").await.unwrap();
    let probe = Probe::new(clock.clone());
    let running = Running::start(
        &s,
        1,
        probe.handler(Duration::ZERO, |_| Outcome::Failed("busy".into())),
    );
    probe.wait_for(1).await;
    // Some retries of the outcome fail while the scheduler is open.
    tokio::time::sleep(Duration::from_secs(5)).await;
    running.stop().await;
    s.close().await;
    let stats = s.stats().await.unwrap();
    assert!(stats.write_errors > 1, "{stats:?}");
    store.broken.store(false, Ordering::SeqCst);
    let reopened = Scheduler::new(store.inner.clone(), clock, Options::default());
    let stored = reopened.stats().await.unwrap().sources["a"].entries;
    (stored, stats.lost)
}

#[tokio::test(start_paused = true)]
async fn at_least_once_an_outcome_unwritten_at_close_leaves_the_entry_stored() {
    let (stored, lost) = close_while_an_outcome_fails(Delivery::AtLeastOnce).await;
    assert_eq!((stored, lost), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn at_most_once_an_outcome_unwritten_at_close_is_reported_lost() {
    let (stored, lost) = close_while_an_outcome_fails(Delivery::AtMostOnce).await;
    assert_eq!((stored, lost), (0, 1));
}
