//! A source whose reads fail does not stop the others; it is retried with
//! backoff and reported in the stats.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::{Probe, Running, T0, entry};
use estafeta_repeat::store::{Applied, Op, Scan, SourceCount};
use estafeta_repeat::{
    MemoryStore, Options, Outcome, Position, Scheduler, Store, StoreError, TestClock,
};

/// A memory store whose source "bad" fails to read while `broken` is set.
#[derive(Clone, Default)]
struct FlakyStore {
    inner: MemoryStore,
    broken: Arc<AtomicBool>,
    bad_reads: Arc<AtomicUsize>,
}

impl Store for FlakyStore {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
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
        if source == "bad" {
            self.bad_reads.fetch_add(1, Ordering::SeqCst);
            if self.broken.load(Ordering::SeqCst) {
                return Err(StoreError::Backend("disk on fire".into()));
            }
        }
        self.inner.scan(source, from, now, limit, skip)
    }

    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        self.inner.count(source, now)
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_source_is_retried_with_backoff_and_the_others_go_on() {
    let store = FlakyStore::default();
    store.broken.store(true, Ordering::SeqCst);
    let clock = TestClock::new(T0);
    let s = Scheduler::new(store.clone(), clock.clone(), Options::default());
    let mut entries: Vec<_> = (0..5)
        .map(|i| entry("good", T0 + i, &format!("g{i}")))
        .collect();
    entries.extend((0..5).map(|i| entry("bad", T0, &format!("b{i}"))));
    s.schedule_all(entries).await.unwrap();

    let probe = Probe::new(clock.clone());
    let running = Running::start(&s, 2, probe.handler(Duration::ZERO, |_| Outcome::Done));
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
    let reads = store.bad_reads.load(Ordering::SeqCst);
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
