//! Wall-clock steps: a step back must not stall the loop or fire anything
//! early; a step forward fires only what the wall clock now says is due.

use std::time::Duration;

use crate::common::{Probe, T0, entry, memory_scheduler};
use estafeta_repeat::{Clock, Options, Outcome};

#[tokio::test(start_paused = true)]
async fn a_backward_step_neither_fires_early_nor_stalls() {
    let started = tokio::time::Instant::now();
    let (clock, s) = memory_scheduler(Options::default());
    s.schedule("a", T0 + 5, "five", b"").await.unwrap();
    let (probe, running) = Probe::start(&s, &clock, 2, Duration::ZERO, |_| Outcome::Done);

    tokio::time::sleep(Duration::from_millis(2_500)).await;
    clock.step_secs(-100);
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert!(
        probe.log().is_empty(),
        "nothing fires while the wall clock is before the due time"
    );
    let wakeups = s.stats().await.unwrap().wakeups;
    assert!(
        wakeups >= 50,
        "the loop kept re-reading the wall clock: {wakeups}"
    );

    probe.wait_for(1).await;
    running.stop().await;
    let fired = &probe.log()[0];
    assert!(
        fired.at >= Duration::from_secs(T0 + 5),
        "not early: {:?}",
        fired.at
    );
    assert!(
        fired.at < Duration::from_secs(T0 + 6),
        "not stalled: {:?}",
        fired.at
    );
    assert!(started.elapsed() >= Duration::from_secs(105));
}

#[tokio::test(start_paused = true)]
async fn a_step_back_then_forward_again_fires_within_a_second() {
    let (clock, s) = memory_scheduler(Options::default());
    s.schedule("a", T0 + 5, "five", b"").await.unwrap();
    let (probe, running) = Probe::start(&s, &clock, 2, Duration::ZERO, |_| Outcome::Done);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    clock.step_secs(-3_600);
    tokio::time::sleep(Duration::from_secs(60)).await;
    clock.step_secs(3_600);
    let stepped = clock.now();
    probe.wait_for(1).await;
    running.stop().await;
    assert!(probe.log()[0].at - stepped < Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_forward_step_fires_only_what_the_wall_clock_says_is_due() {
    let (clock, s) = memory_scheduler(Options::default());
    let dues = [10, 600, 1_000, 4_000];
    let entries = dues
        .iter()
        .map(|d| entry("a", T0 + d, &format!("{d:04}")))
        .collect();
    s.schedule_all(entries).await.unwrap();
    let (probe, running) = Probe::start(&s, &clock, 2, Duration::ZERO, |_| Outcome::Done);

    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(probe.log().is_empty());
    clock.step_secs(1_000);
    let stepped = clock.now();
    probe.wait_for(3).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    running.stop().await;

    let log = probe.log();
    let fired: Vec<_> = log.iter().map(|f| f.due - T0).collect();
    assert_eq!(
        fired,
        vec![10, 600, 1_000],
        "the entry after the new wall time stays put"
    );
    for f in &log {
        assert!(
            f.at >= Duration::from_secs(f.due),
            "never before the wall clock says"
        );
        assert!(
            f.at - stepped < Duration::from_secs(1),
            "promptly after the step"
        );
    }
}
