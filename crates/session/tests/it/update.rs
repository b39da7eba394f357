//! Transactional updates: a change becomes the session only once it is
//! durably saved; a failed save or a refused change leaves the session as
//! it was, in memory and in storage.

use crate::common::*;
use estafeta_session::{Config, Error, Timestamp};
use std::time::Duration;

#[tokio::test]
async fn a_failed_save_leaves_the_old_state() {
    let (engine, storage, _) = memory_engine().await;
    bump(&engine, "a").await;
    let mut s = engine.get("a".to_string(), false).await.unwrap().unwrap();
    let deadline = s.expires_at();

    storage.fail_writes(true);
    let r = s
        .update(|s| {
            s.persistent_mut().n = 7;
            s.set_expires_at(Some(T0.after(Duration::from_secs(60))));
            Ok::<_, Error>("changed")
        })
        .await;
    assert!(matches!(r, Err(Error::Storage(_))), "{r:?}");
    assert_eq!(s.state().n, 1, "the old state stays");
    assert_eq!(s.expires_at(), deadline, "the old deadline stays");
    assert!(!s.is_dirty(), "nothing is left to save");
    storage.fail_writes(false);
    s.release().await.unwrap();

    assert_eq!(read(&engine, "a").await.unwrap().n, 1);
    engine.stop().await.unwrap();
    let reopened = engine_with(storage, Recorder::new(), Config::default()).await;
    assert_eq!(
        read(&reopened, "a").await.unwrap().n,
        1,
        "storage has the old state"
    );
}

#[tokio::test]
async fn a_saved_update_is_the_new_state_and_durable() {
    let (engine, storage, _) = memory_engine().await;
    bump(&engine, "a").await;
    let batches = storage.batches();
    let mut s = engine.get("a".to_string(), false).await.unwrap().unwrap();
    let at = Timestamp(T0.0 + 60_000);
    let n = s
        .update(|s| {
            s.persistent_mut().n += 1;
            s.set_expires_at(Some(at));
            Ok::<_, Error>(s.state().n)
        })
        .await
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(
        storage.batches(),
        batches + 1,
        "saved before update returned"
    );
    assert_eq!(s.state().n, 2);
    assert_eq!(s.expires_at(), Some(at));
    assert!(!s.is_dirty());
    drop(s);
    engine.stop().await.unwrap();
    let reopened = engine_with(storage, Recorder::new(), Config::default()).await;
    assert_eq!(read(&reopened, "a").await.unwrap().n, 2);
}

#[tokio::test]
async fn a_refused_change_saves_nothing() {
    let (engine, storage, _) = memory_engine().await;
    bump(&engine, "a").await;
    let batches = storage.batches();
    let mut s = engine.get("a".to_string(), false).await.unwrap().unwrap();
    let r: Result<(), Error> = s
        .update(|s| {
            s.persistent_mut().n = 9;
            Err(Error::Busy)
        })
        .await;
    assert!(matches!(r, Err(Error::Busy)));
    assert_eq!(s.state().n, 1);
    assert!(!s.is_dirty());
    s.release().await.unwrap();
    assert_eq!(storage.batches(), batches, "nothing was written");
}

#[tokio::test]
async fn a_dropped_transaction_changes_nothing() {
    let (engine, _, _) = memory_engine().await;
    bump(&engine, "a").await;
    let mut s = engine.get("a".to_string(), false).await.unwrap().unwrap();
    {
        let mut tx = s.begin();
        tx.persistent_mut().n = 5;
        assert_eq!(tx.state().n, 5);
    }
    assert_eq!(s.state().n, 1);
    let mut tx = s.begin();
    tx.persistent_mut().note = "kept".into();
    tx.commit().await.unwrap();
    assert_eq!(s.state().note, "kept");
    s.release().await.unwrap();
    engine.stop().await.unwrap();
}
