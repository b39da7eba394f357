//! One command at a time per key, in arrival order; keys independent.

use crate::common::*;
use estafeta_session::{Config, Engine, Error, MemoryStorage};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;

/// Runs `task(engine, t)` for each `t` in `0..n`, each on its own task.
fn spawn_each<R, Fut>(
    engine: &Engine<String, Counter>,
    n: u64,
    task: impl Fn(Engine<String, Counter>, u64) -> Fut,
) -> Vec<JoinHandle<R>>
where
    Fut: Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    (0..n)
        .map(|t| tokio::spawn(task(engine.clone(), t)))
        .collect()
}

/// What the tasks returned, in order.
async fn joined<R>(tasks: Vec<JoinHandle<R>>) -> Vec<R> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Take `key`, hold it across a yield (so that others queue behind it),
/// then increment it in memory.
async fn bump_held_across_a_yield(engine: &Engine<String, Counter>, key: String) {
    let mut s = engine.get(key, true).await.unwrap().unwrap();
    tokio::task::yield_now().await;
    s.state_mut().n += 1;
}

/// The sum of the counters of keys `k0` … `k{keys-1}`.
async fn total(engine: &Engine<String, Counter>, keys: u64) -> u64 {
    let mut sum = 0;
    for k in 0..keys {
        sum += read(engine, &format!("k{k}")).await.unwrap().n;
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_increments_are_serialized() {
    let (engine, _, _) = memory_engine().await;
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let n = 400;
    let mut tasks = Vec::new();
    for _ in 0..n {
        let engine = engine.clone();
        let inside = inside.clone();
        let overlaps = overlaps.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = engine.get("k".to_string(), true).await.unwrap().unwrap();
            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            let before = s.state().n;
            tokio::task::yield_now().await;
            s.persistent_mut().n = before + 1;
            inside.fetch_sub(1, Ordering::SeqCst);
            s.release().await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert_eq!(read(&engine, "k").await.unwrap().n, n);
}

/// Acquires racing releases on two worker threads, through every way in: a
/// guard held across a yield and dropped (the release that reads no clock),
/// a submitted command, and `try_get` (which may answer busy). Every
/// increment that was made lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_acquires_and_releases_lose_no_increment() {
    const TASKS: u64 = 16;
    const OPS: u64 = 300;
    const KEYS: u64 = 3;
    let (engine, _, _) = memory_engine().await;
    let tasks = spawn_each(&engine, TASKS, |engine, t| async move {
        let (mut made, mut busy) = (0u64, 0u64);
        for i in 0..OPS {
            let key = format!("k{}", (t + i) % KEYS);
            match i % 3 {
                0 => {
                    bump_held_across_a_yield(&engine, key).await;
                    made += 1;
                }
                1 => {
                    engine
                        .submit(key, true, |mut s| async move {
                            s.state_mut().n += 1;
                        })
                        .await
                        .unwrap()
                        .unwrap();
                    made += 1;
                }
                _ => match engine.try_get(key, true).await {
                    Ok(Some(mut s)) => {
                        s.state_mut().n += 1;
                        made += 1;
                    }
                    Err(Error::Busy) => busy += 1,
                    other => panic!("try_get: {other:?}"),
                },
            }
        }
        (made, busy)
    });
    let (mut made, mut busy) = (0, 0);
    for (m, b) in joined(tasks).await {
        made += m;
        busy += b;
    }
    assert_eq!(total(&engine, KEYS).await, made);
    assert_eq!(made + busy, TASKS * OPS);
    assert_eq!(engine.stats().queued, 0);
}

/// The hand-over's corner cases racing on two worker threads: waiters that
/// give up after their first poll, sessions created and dropped untouched
/// at release (their entry leaves the table, possibly with a queue behind
/// it), absent keys asked for without `create`. No key is ever left held or
/// free with a waiter behind it: every task finishes, nothing stays queued,
/// and every increment made lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_ups_and_dropped_sessions_wedge_no_key() {
    const TASKS: u64 = 16;
    const OPS: u64 = 400;
    const KEYS: u64 = 3;
    let (engine, _, _) = memory_engine().await;
    let tasks = spawn_each(&engine, TASKS, |engine, t| async move {
        let mut made = 0u64;
        for i in 0..OPS {
            let key = format!("k{}", (t + i) % KEYS);
            let empty = format!("e{}", (t + i) % KEYS);
            match i % 4 {
                0 => {
                    bump_held_across_a_yield(&engine, key).await;
                    made += 1;
                }
                1 => {
                    // Polled once, then dropped if it had to queue.
                    tokio::select! {
                        biased;
                        s = engine.get(key, true) => {
                            s.unwrap().unwrap().state_mut().n += 1;
                            made += 1;
                        }
                        () = std::future::ready(()) => {}
                    }
                }
                2 => {
                    // Created, held across a yield, dropped untouched.
                    let s = engine.get(empty, true).await.unwrap().unwrap();
                    tokio::task::yield_now().await;
                    drop(s);
                }
                _ => assert!(engine.get(empty, false).await.unwrap().is_none()),
            }
        }
        made
    });
    let made: u64 = joined(tasks).await.into_iter().sum();
    for k in 0..KEYS {
        assert!(read(&engine, &format!("e{k}")).await.is_none());
    }
    assert_eq!(total(&engine, KEYS).await, made);
    assert_eq!(engine.stats().queued, 0);
    assert_eq!(engine.stats().in_memory, KEYS);
}

/// `stop` while commands run on two workers (persistent changes released
/// by dropping the guard, so each save runs in the background) ends, and
/// every change made before it answered `Stopping` is in storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_amid_running_commands_ends_and_saves_every_change() {
    const TASKS: u64 = 16;
    const KEYS: u64 = 5;
    let (engine, storage, hooks) = memory_engine().await;
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let tasks = spawn_each(&engine, TASKS, |engine, t| {
        let started_tx = started_tx.clone();
        async move {
            let mut made = 0u64;
            for i in 0.. {
                match engine.get(format!("k{}", (t + i) % KEYS), true).await {
                    Ok(Some(mut s)) => {
                        s.persistent_mut().n += 1;
                        made += 1;
                        if made == 20 {
                            let _ = started_tx.send(());
                        }
                    }
                    Err(Error::Stopping) => break,
                    other => panic!("get: {other:?}"),
                }
                tokio::task::yield_now().await;
            }
            made
        }
    });
    for _ in 0..TASKS {
        started.recv().await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(60), engine.stop())
        .await
        .expect("stop ended")
        .unwrap();
    let made: u64 = joined(tasks).await.into_iter().sum();
    let reopened = engine_with(storage, hooks, Config::default()).await;
    assert_eq!(total(&reopened, KEYS).await, made);
}

#[tokio::test(start_paused = true)]
async fn queued_commands_run_in_submission_order() {
    let (engine, _, _) = memory_engine().await;
    let held = engine.get("k".to_string(), true).await.unwrap().unwrap();
    let mut handles = Vec::new();
    for i in 0..5u64 {
        handles.push(
            engine.submit("k".to_string(), true, move |mut s| async move {
                let seen = s.state().note.clone();
                s.persistent_mut().note.push_str(&i.to_string());
                s.release().await.unwrap();
                seen
            }),
        );
    }
    settle().await;
    assert_eq!(engine.stats().queued, 5);
    drop(held);
    let mut seen = Vec::new();
    for h in handles {
        seen.push(h.await.unwrap().unwrap());
    }
    // Each command saw exactly the changes of those before it.
    assert_eq!(seen, vec!["", "0", "01", "012", "0123"]);
}

/// The command a key is handed to runs before the task that handed it
/// over takes another key: the key is the command's from the hand-over on,
/// so until it runs every other command for that key queues behind it.
#[tokio::test(start_paused = true)]
async fn a_handed_over_key_runs_before_its_giver_takes_another() {
    let (engine, _, _) = memory_engine().await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let held = engine.get("hot".to_string(), true).await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let (engine, order) = (engine.clone(), order.clone());
        async move {
            let _s = engine.get("hot".to_string(), true).await.unwrap().unwrap();
            order.lock().unwrap().push("waiter has hot");
        }
    });
    settle().await;
    assert_eq!(engine.stats().queued, 1);
    drop(held);
    let _other = engine
        .get("other".to_string(), true)
        .await
        .unwrap()
        .unwrap();
    order.lock().unwrap().push("giver has other");
    waiter.await.unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        ["waiter has hot", "giver has other"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_held_key_does_not_delay_another() {
    let (engine, _, _) = memory_engine().await;
    let _held = engine.get("slow".to_string(), true).await.unwrap().unwrap();
    // The other key completes although "slow" is never released.
    let n = tokio::time::timeout(Duration::from_secs(1), bump(&engine, "fast")).await;
    assert_eq!(n.ok(), Some(1));
}

#[tokio::test(start_paused = true)]
async fn absent_without_create_queues_nothing() {
    let (engine, storage, hooks) = memory_engine().await;
    assert!(
        engine
            .get("nobody".to_string(), false)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        engine
            .try_get("nobody".to_string(), false)
            .await
            .unwrap()
            .is_none()
    );
    let stats = engine.stats();
    assert_eq!((stats.in_memory, stats.queued), (0, 0));
    assert_eq!(storage.batches(), 0);
    assert!(hooks.begins().is_empty());
}

#[tokio::test(start_paused = true)]
async fn try_get_answers_busy_at_once() {
    let (engine, _, _) = memory_engine().await;
    let held = engine.get("k".to_string(), true).await.unwrap().unwrap();
    assert!(matches!(
        engine.try_get("k".to_string(), true).await,
        Err(Error::Busy)
    ));
    assert_eq!(engine.stats().queued, 0);
    drop(held);
    assert!(
        engine
            .try_get("k".to_string(), true)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(start_paused = true)]
async fn lazy_creation_keeps_nothing_untouched() {
    let (engine, storage, hooks) = memory_engine().await;
    let s = engine.get("k".to_string(), true).await.unwrap().unwrap();
    assert!(s.is_new());
    s.release().await.unwrap();
    assert!(hooks.begins().is_empty());
    assert_eq!(engine.stats().in_memory, 0);
    assert_eq!(storage.batches(), 0);
    assert!(read(&engine, "k").await.is_none());
    // A change makes it real: one begin, one save.
    bump(&engine, "k").await;
    assert_eq!(hooks.begins().len(), 1);
    assert_eq!(storage.batches(), 1);
}

#[tokio::test(start_paused = true)]
async fn dropped_guard_releases_and_saves() {
    let (engine, storage, _) = memory_engine().await;
    {
        let mut s = engine.get("k".to_string(), true).await.unwrap().unwrap();
        s.persistent_mut().n = 7;
    }
    assert_eq!(read(&engine, "k").await.unwrap().n, 7);
    settle().await;
    assert_eq!(storage.batches(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_does_not_lose_the_session() {
    let (engine, _, _) = memory_engine().await;
    bump(&engine, "k").await;
    let held = engine.get("k".to_string(), true).await.unwrap().unwrap();
    let waiter = engine.get("k".to_string(), true);
    // Poll the waiter once so it queues, then give up on it.
    let gave_up = tokio::time::timeout(Duration::from_millis(10), waiter).await;
    assert!(gave_up.is_err());
    drop(held);
    assert_eq!(bump(&engine, "k").await, 2);
}

#[tokio::test(start_paused = true)]
async fn stop_answers_queued_commands_and_saves_dirty_sessions() {
    let (engine, storage, _) = memory_engine().await;
    let mut held = engine.get("k".to_string(), true).await.unwrap().unwrap();
    let queued: Vec<_> = (0..3)
        .map(|_| engine.submit("k".to_string(), true, |_s| async {}))
        .collect();
    settle().await;
    let stopper = tokio::spawn({
        let engine = engine.clone();
        async move { engine.stop().await }
    });
    for q in queued {
        assert!(matches!(q.await, Err(Error::Stopping)));
    }
    assert!(matches!(
        engine.get("other".to_string(), true).await,
        Err(Error::Stopping)
    ));
    // The running command finishes; its non-awaited release is saved by stop.
    held.state_mut().n = 1;
    held.persistent_mut().note = "last".into();
    drop(held);
    stopper.await.unwrap().unwrap();
    assert!(storage.batches() >= 1);
}

/// A command that keeps its session past `Config::stop_wait`: `stop` gives
/// up with a typed error saying how many sessions are held, and stops once
/// the command lets go.
#[tokio::test(start_paused = true)]
async fn stop_gives_up_on_a_session_held_past_its_wait() {
    let config = Config {
        stop_wait: Duration::from_secs(5),
        ..Config::default()
    };
    let engine = engine_with(Arc::new(MemoryStorage::new()), Recorder::new(), config).await;
    let mut held = engine.get("k".to_string(), true).await.unwrap().unwrap();
    held.persistent_mut().n = 1;
    match engine.stop().await {
        Err(Error::StopTimedOut { held, waited }) => {
            assert_eq!((held, waited), (1, Duration::from_secs(5)));
        }
        other => panic!("expected StopTimedOut, got {other:?}"),
    }
    drop(held);
    engine.stop().await.unwrap();
}

proptest::proptest! {
    /// Per key, commands run exactly in submission order, whatever the
    /// interleaving of keys and whichever keys were held at the start.
    #[test]
    fn queue_order_matches_submission_order(
        ops in proptest::collection::vec(0u8..4, 1..60),
        held in proptest::collection::vec(proptest::bool::ANY, 4),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        rt.block_on(async {
            let (engine, _, _) = memory_engine().await;
            let mut guards = Vec::new();
            for (k, h) in held.iter().enumerate() {
                if *h {
                    guards.push(engine.get(format!("k{k}"), true).await.unwrap().unwrap());
                }
            }
            let mut handles = Vec::new();
            for (i, k) in ops.iter().enumerate() {
                handles.push(engine.submit(format!("k{k}"), true, move |mut s| async move {
                    s.persistent_mut().note.push_str(&format!("{i},"));
                    s.release().await.unwrap();
                }));
            }
            drop(guards);
            for h in handles {
                h.await.unwrap().unwrap();
            }
            for k in 0..4u8 {
                let want: String = ops.iter().enumerate().filter(|(_, o)| **o == k).map(|(i, _)| format!("{i},")).collect();
                let got = read(&engine, &format!("k{k}")).await.map(|c| c.note).unwrap_or_default();
                assert_eq!(got, want);
            }
        });
    }
}
