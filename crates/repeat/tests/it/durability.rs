//! With the redb store, schedule, cancel, reschedule and handler outcomes
//! are durable: a new scheduler on the reopened file sees them.

use std::time::Duration;

use crate::common::{Probe, Running, T0};
use estafeta_repeat::{Options, Outcome, RedbStore, Scheduler, TestClock};

#[tokio::test(start_paused = true)]
async fn cancel_reschedule_and_outcomes_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("repeat.redb");

    let clock = TestClock::new(T0);
    let s = Scheduler::new(
        RedbStore::open(&path).unwrap(),
        clock.clone(),
        Options::default(),
    );
    for id in ["done", "again", "cancelled", "moved", "kept"] {
        s.schedule("a", T0 + 10, id, id.as_bytes()).await.unwrap();
    }
    assert!(s.cancel("cancelled").await.unwrap());
    assert!(s.reschedule("moved", T0 + 500).await.unwrap());
    let probe = Probe::new(clock.clone());
    let handler = probe.handler(Duration::ZERO, |e| match e.id.as_str() {
        "again" => Outcome::Reschedule(T0 + 400),
        _ => Outcome::Done,
    });
    // Only "done" and "again" are due before the restart; "kept" is moved
    // away first so it stays.
    assert!(s.reschedule("kept", T0 + 300).await.unwrap());
    let running = Running::start(&s, 2, handler);
    probe.wait_for(2).await;
    running.stop().await;
    s.close().await;
    drop(s);

    let clock = TestClock::new(T0 + 1_000);
    let s = Scheduler::new(
        RedbStore::open(&path).unwrap(),
        clock.clone(),
        Options::default(),
    );
    let stats = s.stats().await.unwrap();
    assert_eq!(
        stats.sources["a"].entries, 3,
        "again, moved, kept: {stats:?}"
    );
    let probe2 = Probe::new(clock.clone());
    let running = Running::start(&s, 2, probe2.handler(Duration::ZERO, |_| Outcome::Done));
    probe2.wait_for(3).await;
    running.stop().await;
    let fired: Vec<_> = probe2
        .log()
        .iter()
        .map(|f| (f.id.clone(), f.due - T0))
        .collect();
    assert_eq!(
        fired,
        vec![
            ("kept".to_owned(), 300),
            ("again".to_owned(), 400),
            ("moved".to_owned(), 500)
        ]
    );
    assert_eq!(s.stats().await.unwrap().sources["a"].entries, 0);
}
