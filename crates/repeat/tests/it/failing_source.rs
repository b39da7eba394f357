//! A source whose reads fail does not stop the others; it is retried with
//! backoff and reported in the stats.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::{BreakableStore, Breaks, Probe, T0, entry};
use estafeta_repeat::{Options, Outcome, Scheduler, TestClock};

#[tokio::test(start_paused = true)]
async fn a_failing_source_is_retried_with_backoff_and_the_others_go_on() {
    let store = BreakableStore::new(Breaks::Reads("bad"));
    let clock = TestClock::new(T0);
    let s = Scheduler::new(store.clone(), clock.clone(), Options::default());
    let mut entries: Vec<_> = (0..5)
        .map(|i| entry("good", T0 + i, &format!("g{i}")))
        .collect();
    entries.extend((0..5).map(|i| entry("bad", T0, &format!("b{i}"))));
    s.schedule_all(entries).await.unwrap();

    let (probe, running) = Probe::start(&s, &clock, 2, Duration::ZERO, |_| Outcome::Done);
    probe.wait_for(5).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(probe.log().iter().all(|f| f.source == "good"));
    let stats = s.stats().await.unwrap();
    let bad = &stats.sources["bad"];
    assert!(bad.failures >= 5, "{bad:?}");
    assert!(
        bad.last_error
            .as_deref()
            .unwrap_or("")
            .contains("disk on fire")
    );
    let reads = store.reads.load(Ordering::SeqCst);
    // Backoff 0.1 s doubling to 30 s: about ten reads in a minute, not one per wake-up.
    assert!(
        reads <= 12,
        "{reads} reads of the failing source in a minute"
    );

    store.broken.store(false, Ordering::SeqCst);
    probe.wait_for(10).await;
    running.stop().await;
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.sources["bad"].failures, 0, "healed: {stats:?}");
    assert_eq!(stats.sources["bad"].entries, 0);
}
