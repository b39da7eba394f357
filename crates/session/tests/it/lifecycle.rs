//! Expiry, finalization, flush, restart, storage failures and corrupt
//! records, on a controlled clock.

use crate::common::*;
use estafeta_session::{Config, Error, MemoryStorage, RedbStorage, Storage, Timestamp};
use std::sync::Arc;
use std::time::Duration;

const LIFE: Duration = Duration::from_secs(60);

async fn create_expiring(engine: &estafeta_session::Engine<String, Counter>, key: &str, n: u64) {
    let mut s = engine.get(key.to_string(), true).await.unwrap().unwrap();
    s.persistent_mut().n = n;
    let at = engine.now().after(LIFE);
    s.set_expires_at(Some(at));
    s.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn end_notification_once_then_a_fresh_session() {
    let (engine, storage, hooks) = memory_engine().await;
    create_expiring(&engine, "k", 5).await;
    assert_eq!(hooks.begins().len(), 1);
    tokio::time::sleep(LIFE * 3).await;
    assert_eq!(
        hooks.ends(),
        vec![(
            "k".to_string(),
            Counter {
                n: 5,
                note: String::new()
            }
        )]
    );
    assert!(
        storage.load(b"k").unwrap().is_none(),
        "ended session is deleted from storage"
    );
    assert!(read(&engine, "k").await.is_none());
    assert_eq!(bump(&engine, "k").await, 1);
    assert_eq!(hooks.begins().len(), 2);
    tokio::time::sleep(LIFE * 3).await;
    assert_eq!(
        hooks.ends().len(),
        1,
        "no expiry set on the new one: no second end"
    );
    assert_eq!(engine.stats().expiries, 1);
}

#[tokio::test(start_paused = true)]
async fn touching_every_half_timeout_keeps_it_alive() {
    let (engine, _, hooks) = memory_engine().await;
    create_expiring(&engine, "k", 0).await;
    for _ in 0..7 {
        tokio::time::sleep(LIFE / 2).await;
        let mut s = engine
            .get("k".to_string(), false)
            .await
            .unwrap()
            .expect("still alive");
        let at = engine.now().after(LIFE);
        s.set_expires_at(Some(at));
        s.release().await.unwrap();
    }
    // 3.5 timeouts have passed since creation.
    assert!(hooks.ends().is_empty());
    tokio::time::sleep(LIFE * 2).await;
    assert_eq!(hooks.ends().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn finalize_may_keep_with_a_new_deadline() {
    let (engine, _, hooks) = memory_engine().await;
    *hooks.on_expire.lock().unwrap() = OnExpire::Extend(LIFE);
    create_expiring(&engine, "k", 1).await;
    tokio::time::sleep(LIFE + Duration::from_secs(1)).await;
    assert_eq!(hooks.finalized.lock().unwrap().len(), 1);
    let c = read(&engine, "k").await.unwrap();
    assert_eq!(c.note, "finalized");
    *hooks.on_expire.lock().unwrap() = OnExpire::End;
    tokio::time::sleep(LIFE * 2).await;
    assert_eq!(hooks.ends().len(), 1);
    assert_eq!(hooks.ends()[0].1.note, "finalized");
}

#[tokio::test(start_paused = true)]
async fn a_command_during_finalization_runs_on_what_it_left() {
    let (engine, _, hooks) = memory_engine().await;
    *hooks.on_expire.lock().unwrap() = OnExpire::Extend(LIFE);
    create_expiring(&engine, "k", 1).await;
    // The command arrives after the deadline: finalization runs first.
    tokio::time::advance(LIFE + Duration::from_millis(1)).await;
    let c = read(&engine, "k").await.unwrap();
    assert_eq!(c.note, "finalized");
    assert_eq!(hooks.finalized.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_locked_session_is_not_finalized_until_released() {
    let (engine, _, hooks) = memory_engine().await;
    create_expiring(&engine, "k", 1).await;
    let held = engine.get("k".to_string(), false).await.unwrap().unwrap();
    tokio::time::sleep(LIFE * 2).await;
    assert!(hooks.ends().is_empty(), "held sessions are never finalized");
    drop(held);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(hooks.ends().len(), 1, "looked at again after its release");
}

#[tokio::test(start_paused = true)]
async fn flush_by_count_keeps_data_and_deadlines() {
    let storage = Arc::new(MemoryStorage::new());
    let hooks = Recorder::new();
    let config = Config {
        flush_count_limit: 100,
        ..Config::default()
    };
    let engine = engine_with(storage.clone(), hooks.clone(), config).await;
    for i in 0..150u64 {
        create_expiring(&engine, &format!("k{i}"), i).await;
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = engine.stats();
    assert!(stats.in_memory <= 100, "in memory: {}", stats.in_memory);
    assert!(stats.flushes >= 50);
    for i in 0..150u64 {
        let mut s = engine
            .get(format!("k{i}"), false)
            .await
            .unwrap()
            .expect("flushed session reads back");
        assert_eq!(s.state().n, i);
        assert!(s.expires_at().is_some());
        s.state_mut();
        drop(s);
    }
    // Deadlines were kept: every session still ends on time.
    tokio::time::sleep(LIFE * 2).await;
    assert_eq!(hooks.ends().len(), 150);
}

#[tokio::test(start_paused = true)]
async fn flush_by_idle_time_and_non_persistent_changes_are_dropped() {
    let storage = Arc::new(MemoryStorage::new());
    let hooks = Recorder::new();
    let config = Config {
        flush_time_limit: Duration::from_secs(30),
        ..Config::default()
    };
    let engine = engine_with(storage.clone(), hooks.clone(), config).await;
    bump(&engine, "k").await;
    let mut s = engine.get("k".to_string(), false).await.unwrap().unwrap();
    s.state_mut().note = "memory only".into();
    s.release().await.unwrap();
    assert_eq!(engine.stats().in_memory, 1);
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(engine.stats().in_memory, 0);
    assert_eq!(engine.stats().flushes, 1);
    assert_eq!(
        read(&engine, "k").await.unwrap(),
        Counter {
            n: 1,
            note: String::new()
        }
    );
}

/// A guard dropped without a save reads no clock; the expiry manager
/// stamps its release when it notes it, so the session is flushed no
/// earlier than the idle limit after the release, and not much later.
#[tokio::test(start_paused = true)]
async fn a_dropped_guard_is_stamped_by_the_expiry_manager() {
    let storage = Arc::new(MemoryStorage::new());
    let config = Config {
        flush_time_limit: Duration::from_secs(30),
        ..Config::default()
    };
    let engine = engine_with(storage, Recorder::new(), config).await;
    bump(&engine, "k").await;
    tokio::time::sleep(Duration::from_secs(100)).await;
    let released = engine.now();
    let mut s = engine.get("k".to_string(), false).await.unwrap().unwrap();
    s.state_mut().note = "memory only".into();
    drop(s);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = engine.get("k".to_string(), false).await.unwrap().unwrap();
    let stamped = s.last_access();
    assert!(
        stamped >= released && stamped <= released.after(Duration::from_secs(1)),
        "stamped {stamped:?}, released {released:?}"
    );
    assert_eq!(s.state().note, "memory only");
    drop(s);
    tokio::time::sleep(Duration::from_secs(27)).await;
    assert_eq!(engine.stats().in_memory, 1, "idle for less than 30 s");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(engine.stats().in_memory, 0, "flushed");
    assert_eq!(read(&engine, "k").await.unwrap().note, "");
}

#[tokio::test(start_paused = true)]
async fn a_session_expiring_within_five_seconds_is_not_flushed() {
    let storage = Arc::new(MemoryStorage::new());
    let hooks = Recorder::new();
    let config = Config {
        flush_time_limit: Duration::from_secs(10),
        ..Config::default()
    };
    let engine = engine_with(storage, hooks.clone(), config).await;
    let mut s = engine.get("k".to_string(), true).await.unwrap().unwrap();
    s.persistent_mut().n = 1;
    let at = engine.now().after(Duration::from_secs(13));
    s.set_expires_at(Some(at));
    s.release().await.unwrap();
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(engine.stats().in_memory, 1, "expires in 2 s: stays");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(hooks.ends().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_write_failure_loses_nothing() {
    let (engine, storage, _) = memory_engine().await;
    bump(&engine, "other").await;
    storage.fail_writes(true);
    let mut s = engine.get("k".to_string(), true).await.unwrap().unwrap();
    s.persistent_mut().n = 42;
    assert!(matches!(s.release().await, Err(Error::Storage(_))));
    // Still in memory with the change (every release retries the save and
    // reports the failure); other keys still read.
    let s = engine.get("k".to_string(), false).await.unwrap().unwrap();
    assert_eq!(s.state().n, 42);
    assert!(s.is_dirty());
    assert!(s.release().await.is_err());
    assert_eq!(read(&engine, "other").await.unwrap().n, 1);
    assert!(engine.stats().storage_errors >= 1);
    storage.fail_writes(false);
    // Saved on the next attempt (stop saves every dirty session).
    engine.stop().await.unwrap();
    assert!(storage.load(b"k").unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_record_is_quarantined() {
    let (engine, storage, _) = memory_engine().await;
    storage.put_raw(b"bad", b"\x01{not json");
    storage.put_raw(b"future", b"\x09{}");
    bump(&engine, "good").await;
    assert!(read(&engine, "bad").await.is_none());
    assert!(read(&engine, "future").await.is_none());
    assert_eq!(read(&engine, "good").await.unwrap().n, 1);
    assert_eq!(
        storage.quarantined().unwrap(),
        vec![b"bad".to_vec(), b"future".to_vec()]
    );
    assert_eq!(engine.stats().quarantined, 2);
    // The key works again afterwards.
    assert_eq!(bump(&engine, "bad").await, 1);
}

#[tokio::test(start_paused = true)]
async fn restart_rebuilds_expiry_and_runs_first_load_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.redb");
    {
        let storage = Arc::new(RedbStorage::open(&path).unwrap());
        let engine = engine_with(storage, Recorder::new(), Config::default()).await;
        create_expiring(&engine, "expiring", 1).await;
        bump(&engine, "forever").await;
        engine.stop().await.unwrap();
    }
    // Down for longer than the session's life.
    tokio::time::advance(LIFE * 2).await;
    let storage = Arc::new(RedbStorage::open(&path).unwrap());
    let hooks = Recorder::new();
    let _engine = {
        // A clock that starts where the first run's clock left off.
        let engine = estafeta_session::Engine::<String, Counter>::builder(storage.clone())
            .clock(Arc::new(estafeta_session::TokioClock::starting_at(
                T0.after(LIFE * 2),
            )))
            .hooks(hooks.clone())
            .open()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            hooks.ends().len(),
            1,
            "finalized without anyone touching it"
        );
        assert_eq!(hooks.ends()[0].0, "expiring");
        assert_eq!(read(&engine, "forever").await.unwrap().n, 1);
        assert_eq!(hooks.first_loads.lock().unwrap().len(), 1);
        engine
    };
    let _ = Timestamp(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_share_fsyncs_through_group_commit() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(RedbStorage::open(dir.path().join("s.redb")).unwrap());
    let engine = engine_with(storage, Recorder::new(), Config::default()).await;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move { bump(&engine, &format!("k{i}")).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let stats = engine.stats();
    assert_eq!(stats.saves, 200);
    assert!(stats.save_batches < 200, "batches: {}", stats.save_batches);
}

/// Hooks whose finalization never finishes the first time.
struct HangOnce(std::sync::atomic::AtomicBool);

impl estafeta_session::Hooks<String, Counter> for HangOnce {
    fn finalize<'a>(
        &'a self,
        _key: &'a String,
        s: &'a mut estafeta_session::SessionData<Counter>,
        _step: Option<&'a mut dyn estafeta_session::Step>,
    ) -> estafeta_session::BoxFuture<'a, estafeta_session::Finalize> {
        Box::pin(async move {
            if !self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            s.set_expires_at(None);
            estafeta_session::Finalize::Keep
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_goes_away_midway_does_not_wedge_the_key() {
    let storage = Arc::new(MemoryStorage::new());
    let engine = estafeta_session::Engine::<String, Counter>::builder(storage)
        .clock(Arc::new(estafeta_session::TokioClock::starting_at(T0)))
        .hooks(Arc::new(HangOnce(Default::default())))
        .config(Config {
            flush_time_limit: Duration::from_secs(3600 * 24),
            ..Config::default()
        })
        .open()
        .await
        .unwrap();
    create_expiring(&engine, "k", 7).await;
    tokio::time::advance(LIFE + Duration::from_millis(1)).await;
    // This caller's acquire runs the (hanging) finalization, then gives up.
    let gave_up =
        tokio::time::timeout(Duration::from_secs(1), engine.get("k".to_string(), false)).await;
    assert!(gave_up.is_err());
    // The key is free again: the next caller reads the session from storage.
    let s = tokio::time::timeout(Duration::from_secs(1), engine.get("k".to_string(), false))
        .await
        .expect("not wedged")
        .unwrap()
        .expect("still stored");
    assert_eq!(s.state().n, 7);
}

/// Live instances of [`Tracked`] (only the test below makes any).
static LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

/// A state that counts its live instances.
#[derive(serde::Serialize, serde::Deserialize)]
struct Tracked {
    n: u64,
}

impl Default for Tracked {
    fn default() -> Self {
        LIVE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Tracked { n: 0 }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Each cached session points back to its cache; the cycle is broken when
/// the last engine handle goes, so the sessions it held are freed then.
#[tokio::test(start_paused = true)]
async fn dropping_the_engine_frees_its_sessions() {
    let live = || LIVE.load(std::sync::atomic::Ordering::SeqCst);
    let engine =
        estafeta_session::Engine::<String, Tracked>::builder(Arc::new(MemoryStorage::new()))
            .open()
            .await
            .unwrap();
    for k in 0..100 {
        let mut s = engine.get(format!("k{k}"), true).await.unwrap().unwrap();
        s.state_mut().n += 1;
    }
    assert_eq!(live(), 100);
    let kept = engine.get("k0".to_string(), false).await.unwrap().unwrap();
    drop(engine);
    // Every session but the one a guard still holds is gone at once.
    assert_eq!(live(), 1);
    assert_eq!(kept.state().n, 1);
    drop(kept);
    assert_eq!(live(), 0);
}
