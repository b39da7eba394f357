//! Scheduling an id again while a handler runs for it replaces the entry:
//! the running handler's outcome applies only to the version it was given,
//! and the replacement is handed out in its turn, on both stores and in both
//! delivery modes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{Running, T0};
use estafeta_repeat::{
    Delivery, Entry, Handler, MemoryStore, Options, Outcome, RedbStore, RetryPolicy, Scheduler,
    Store, TestClock,
};
use tokio::sync::{Notify, watch};

/// One hand-out: payload, attempt and due second (relative to `T0`).
type Seen = (String, u32, u64);

/// A handler that records every hand-out; the first hand-out (payload
/// `old`) waits for `release` and then returns `outcome`, any later one
/// returns `Done` at once.
struct Holder {
    seen: Mutex<Vec<Seen>>,
    count: watch::Sender<usize>,
    release: Notify,
}

impl Holder {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            seen: Mutex::new(Vec::new()),
            count: watch::channel(0).0,
            release: Notify::new(),
        })
    }

    fn handler(self: &Arc<Self>, outcome: Outcome) -> impl Handler {
        let holder = Arc::clone(self);
        move |entry: Entry| {
            let holder = Arc::clone(&holder);
            let outcome = outcome.clone();
            async move {
                let payload = String::from_utf8(entry.payload).unwrap();
                let first = {
                    let mut seen = holder.seen.lock().unwrap();
                    seen.push((payload, entry.attempt, entry.due - T0));
                    holder.count.send_replace(seen.len());
                    seen.len() == 1
                };
                if first {
                    holder.release.notified().await;
                    outcome
                } else {
                    Outcome::Done
                }
            }
        }
    }

    /// Waits (in virtual time, bounded) until `n` hand-outs happened.
    async fn wait_for(&self, n: usize) {
        let mut count = self.count.subscribe();
        let waited =
            tokio::time::timeout(Duration::from_secs(600), count.wait_for(|c| *c >= n)).await;
        assert!(
            waited.is_ok(),
            "only {:?} handed out within 600 s",
            self.seen()
        );
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Schedules `id` due at `T0` with payload "old", lets its handler start,
/// schedules the same id, source and second with payload "new", then lets
/// the old handler return `outcome`. Returns the hand-outs and what stays
/// stored once everything settled.
async fn replace_while_running<S: Store>(
    store: S,
    delivery: Delivery,
    outcome: Outcome,
) -> (Vec<Seen>, u64) {
    let clock = TestClock::new(T0);
    let options = Options {
        delivery,
        retry: RetryPolicy {
            first: Duration::from_secs(30),
            max: Duration::from_secs(30),
        },
        ..Options::default()
    };
    let s = Scheduler::new(store, clock, options);
    s.schedule("a", T0, "x", b"old").await.unwrap();
    let holder = Holder::new();
    let running = Running::start(&s, 4, holder.handler(outcome));
    holder.wait_for(1).await;
    s.schedule("a", T0, "x", b"new").await.unwrap();
    holder.release.notify_one();
    holder.wait_for(2).await;
    // Nothing else comes due within the retry delay.
    tokio::time::sleep(Duration::from_secs(60)).await;
    running.stop().await;
    let stored = s.stats().await.unwrap().sources["a"].entries;
    s.close().await;
    (holder.seen(), stored)
}

fn old_then_new() -> Vec<Seen> {
    vec![("old".into(), 0, 0), ("new".into(), 0, 0)]
}

#[tokio::test(start_paused = true)]
async fn done_for_the_old_version_leaves_the_replacement_to_be_handed_out() {
    for delivery in [Delivery::AtLeastOnce, Delivery::AtMostOnce] {
        let (seen, stored) =
            replace_while_running(MemoryStore::new(), delivery, Outcome::Done).await;
        assert_eq!((seen, stored), (old_then_new(), 0), "{delivery:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_old_version_does_not_retry_the_replacement() {
    for delivery in [Delivery::AtLeastOnce, Delivery::AtMostOnce] {
        let (seen, stored) =
            replace_while_running(MemoryStore::new(), delivery, Outcome::Failed("old".into()))
                .await;
        assert_eq!((seen, stored), (old_then_new(), 0), "{delivery:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_rescheduled_old_version_does_not_move_the_replacement() {
    for delivery in [Delivery::AtLeastOnce, Delivery::AtMostOnce] {
        let (seen, stored) = replace_while_running(
            MemoryStore::new(),
            delivery,
            Outcome::Reschedule(T0 + 3_600),
        )
        .await;
        assert_eq!((seen, stored), (old_then_new(), 0), "{delivery:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_redb_store_applies_outcomes_only_to_the_version_handed_out() {
    for delivery in [Delivery::AtLeastOnce, Delivery::AtMostOnce] {
        for outcome in [Outcome::Done, Outcome::Failed("old".into())] {
            let dir = tempfile::tempdir().unwrap();
            let store = RedbStore::open(dir.path().join("repeat.redb")).unwrap();
            let (seen, stored) = replace_while_running(store, delivery, outcome.clone()).await;
            assert_eq!(
                (seen, stored),
                (old_then_new(), 0),
                "{delivery:?} {outcome:?}"
            );
        }
    }
}
