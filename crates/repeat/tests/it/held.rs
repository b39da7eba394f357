//! A store that holds what it reads ([`Store::hold_sources`]): the
//! handed-out entries' outcomes are settled through their hold, never
//! through the writer, and a hold that fails to settle hands its entries
//! out again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use estafeta_repeat::store::{Applied, Held, Holding, Op, Read, Scan, Skip, SourceCount};
use estafeta_repeat::{
    Delivery, MemoryStore, Options, Outcome, Position, Scheduler, Store, StoreError, TestClock,
};

use crate::common::{Probe, T0};

/// What a [`HoldingStore`] saw.
#[derive(Debug, Default)]
struct Seen {
    /// Holds handed to the dispatcher.
    holds: AtomicUsize,
    /// The ops settled through holds, one list per settle.
    settled: Mutex<Vec<Vec<Op>>>,
    /// Removals and moves applied through the writer.
    applied_outcomes: AtomicUsize,
    /// Fail the next settle.
    fail_next: AtomicBool,
}

/// A memory store whose dispatching reads hold what they return.
#[derive(Clone)]
struct HoldingStore {
    inner: MemoryStore,
    seen: Arc<Seen>,
}

#[derive(Debug)]
struct MemoryHold {
    inner: MemoryStore,
    seen: Arc<Seen>,
}

impl Held for MemoryHold {
    fn settle(self: Box<Self>, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        if self.seen.fail_next.swap(false, Ordering::SeqCst) {
            return Err(StoreError::Backend("connection lost".into()));
        }
        self.seen.settled.lock().unwrap().push(ops.to_vec());
        self.inner.apply(ops)
    }
}

impl Store for HoldingStore {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        let outcomes = ops
            .iter()
            .filter(|op| matches!(op, Op::Remove(_) | Op::Move { .. }))
            .count();
        self.seen
            .applied_outcomes
            .fetch_add(outcomes, Ordering::SeqCst);
        self.inner.apply(ops)
    }

    fn sources(&self) -> Result<Vec<String>, StoreError> {
        self.inner.sources()
    }

    fn scan(&self, read: Read<'_>, now: u64, skip: Skip<'_>) -> Result<Scan, StoreError> {
        self.inner.scan(read, now, skip)
    }

    fn hold_sources(
        &self,
        reads: &[Read<'_>],
        now: u64,
        skip: &dyn Fn(&str, &Position) -> bool,
    ) -> Holding {
        let scans = self.inner.scan_sources(reads, now, skip);
        let any = scans
            .iter()
            .any(|s| s.as_ref().is_ok_and(|s| !s.entries.is_empty()));
        let held: Option<Box<dyn Held>> = any.then(|| {
            self.seen.holds.fetch_add(1, Ordering::SeqCst);
            Box::new(MemoryHold {
                inner: self.inner.clone(),
                seen: Arc::clone(&self.seen),
            }) as Box<dyn Held>
        });
        Holding { scans, held }
    }

    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        self.inner.count(source, now)
    }

    fn contains(&self, id: &str) -> Result<bool, StoreError> {
        self.inner.contains(id)
    }
}

fn holding(delivery: Delivery) -> (TestClock, Scheduler<HoldingStore, TestClock>, Arc<Seen>) {
    let clock = TestClock::new(T0);
    let seen = Arc::new(Seen::default());
    let store = HoldingStore {
        inner: MemoryStore::new(),
        seen: Arc::clone(&seen),
    };
    let options = Options {
        delivery,
        ..Options::default()
    };
    (clock.clone(), Scheduler::new(store, clock, options), seen)
}

#[tokio::test(start_paused = true)]
async fn outcomes_of_held_entries_are_settled_through_their_hold() {
    let (clock, s, seen) = holding(Delivery::AtLeastOnce);
    for i in 0..20 {
        let source = if i % 2 == 0 { "a" } else { "b" };
        s.schedule(source, T0, &format!("e{i:02}"), b"")
            .await
            .unwrap();
    }
    // Even ids are done; odd ones come back a minute later.
    let (probe, running) = Probe::start(&s, &clock, 4, Duration::from_millis(10), |e| {
        match e.id[1..].parse::<u32>().unwrap() % 2 {
            0 => Outcome::Done,
            _ => Outcome::Reschedule(T0 + 60),
        }
    });
    probe.wait_for(20).await;
    running.stop().await;

    assert!(probe.per_id().values().all(|n| *n == 1), "each once");
    let settled = seen.settled.lock().unwrap().clone();
    assert_eq!(settled.len(), seen.holds.load(Ordering::SeqCst));
    assert!(
        settled.len() >= 2,
        "4 workers taking up to 16 a pass, 20 entries: {}",
        settled.len()
    );
    let ops: Vec<&Op> = settled.iter().flatten().collect();
    assert_eq!(ops.len(), 20, "every outcome through its hold");
    assert_eq!(
        seen.applied_outcomes.load(Ordering::SeqCst),
        0,
        "no outcome through the writer"
    );
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.done, stats.rescheduled), (10, 10));
    assert_eq!(stats.sources["a"].entries + stats.sources["b"].entries, 10);
    assert_eq!(stats.in_flight, 0);
}

/// At shutdown, entries taken but still waiting for a worker are not
/// started: their hold settles the outcome it has, and they stay stored
/// for the next run.
#[tokio::test(start_paused = true)]
async fn at_shutdown_a_hold_settles_without_its_entries_still_waiting_for_a_worker() {
    let (clock, s, seen) = holding(Delivery::AtLeastOnce);
    for id in ["x", "y", "z"] {
        s.schedule("a", T0, id, b"").await.unwrap();
    }
    let (probe, running) = Probe::start(&s, &clock, 1, Duration::from_secs(10), |_| Outcome::Done);
    probe.wait_for(1).await;
    running.stop().await;

    let started: Vec<String> = probe.log().into_iter().map(|f| f.id).collect();
    assert_eq!(
        started,
        ["x"],
        "y and z were taken (prefetch) but not started"
    );
    assert_eq!(seen.holds.load(Ordering::SeqCst), 1);
    let settled = seen.settled.lock().unwrap().clone();
    assert_eq!(settled.len(), 1, "the hold settled");
    assert!(
        matches!(settled[0].as_slice(), [Op::Remove(e)] if e.id == "x"),
        "with x's outcome alone: {settled:?}"
    );
    let stats = s.stats().await.unwrap();
    assert_eq!((stats.done, stats.in_flight), (1, 0));
    assert_eq!(stats.sources["a"].entries, 2, "y and z still stored");

    let (probe, running) = Probe::start(&s, &clock, 1, Duration::ZERO, |_| Outcome::Done);
    probe.wait_for(2).await;
    running.stop().await;
    let started: Vec<String> = probe.log().into_iter().map(|f| f.id).collect();
    assert_eq!(started, ["y", "z"], "handed out by the next run");
    assert_eq!(s.stats().await.unwrap().sources["a"].entries, 0);
}

#[tokio::test(start_paused = true)]
async fn a_hold_that_fails_to_settle_hands_its_entries_out_again() {
    let (clock, s, seen) = holding(Delivery::AtLeastOnce);
    s.schedule("a", T0, "x", b"").await.unwrap();
    s.schedule("a", T0, "y", b"").await.unwrap();
    seen.fail_next.store(true, Ordering::SeqCst);
    let (probe, running) = Probe::start(&s, &clock, 2, Duration::ZERO, |_| Outcome::Done);
    probe.wait_for(4).await;
    running.stop().await;

    let per_id = probe.per_id();
    assert_eq!((per_id["x"], per_id["y"]), (2, 2), "handed out again");
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.write_errors, 1);
    assert_eq!(stats.sources["a"].entries, 0, "removed by the second hold");
}

#[tokio::test(start_paused = true)]
async fn at_most_once_delivery_holds_nothing() {
    let (clock, s, seen) = holding(Delivery::AtMostOnce);
    for i in 0..6 {
        s.schedule("a", T0, &format!("e{i}"), b"").await.unwrap();
    }
    let (probe, running) = Probe::start(&s, &clock, 2, Duration::ZERO, |_| Outcome::Done);
    probe.wait_for(6).await;
    running.stop().await;
    assert_eq!(seen.holds.load(Ordering::SeqCst), 0);
    assert_eq!(s.stats().await.unwrap().sources["a"].entries, 0);
}
