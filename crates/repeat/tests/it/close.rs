//! Outcomes whose write still fails when the scheduler closes: with
//! at-least-once delivery the entry stays stored and is handed out again;
//! with at-most-once delivery it was removed before its handler ran, so it
//! is lost, and reported as lost.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::{BreakableStore, Breaks, Probe, T0};
use estafeta_repeat::{Delivery, Options, Outcome, Scheduler, TestClock};

/// Hands out one entry whose handler fails, closes the scheduler while
/// recording that outcome fails, and returns what a scheduler reopened on
/// the same data holds, with the first scheduler's lost count.
async fn close_while_an_outcome_fails(delivery: Delivery) -> (u64, u64) {
    let store = BreakableStore::new(Breaks::Outcomes);
    let clock = TestClock::new(T0);
    let options = Options {
        delivery,
        ..Options::default()
    };
    let s = Scheduler::new(store.clone(), clock.clone(), options);
    s.schedule("a", T0, "x", b"x").await.unwrap();
    let (probe, running) = Probe::start(&s, &clock, 1, Duration::ZERO, |_| {
        Outcome::Failed("busy".into())
    });
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
