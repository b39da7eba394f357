//! A real full disk: the session storage on a small tmpfs (mounted by the
//! test, which needs root, as CI runs; elsewhere it fails), filled up by a
//! ballast file, then freed. Saves fail while it is full and succeed again
//! once it is not, without reopening anything by hand.

use crate::common::*;
use estafeta_session::{Config, Engine, Error, RedbStorage};
use estafeta_test_support::tmpfs::{Tmpfs, fill};
use std::sync::Arc;

/// An engine whose storage is on an 8 MB tmpfs that the test can fill.
struct FullDisk {
    engine: Engine<String, Counter>,
    mnt: std::path::PathBuf,
    _unmount: Tmpfs,
    _dir: tempfile::TempDir,
}

impl FullDisk {
    async fn new() -> FullDisk {
        let dir = tempfile::tempdir().unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let unmount = Tmpfs::mount(&mnt, "8m");
        let storage = Arc::new(RedbStorage::open(mnt.join("sessions.redb")).unwrap());
        let engine = engine_with(storage, Recorder::new(), Config::default()).await;
        FullDisk {
            engine,
            mnt,
            _unmount: unmount,
            _dir: dir,
        }
    }
}

#[tokio::test]
async fn a_full_disk_that_clears_does_not_poison_the_storage() {
    let full = FullDisk::new().await;
    let (engine, mnt) = (&full.engine, &full.mnt);
    bump(engine, "before").await;

    let ballast = mnt.join("ballast");
    fill(&ballast);
    let mut s = engine.get("big".to_string(), true).await.unwrap().unwrap();
    s.persistent_mut().note = "x".repeat(2 * 1024 * 1024);
    assert!(
        matches!(s.release().await, Err(Error::Storage(_))),
        "a save on a full disk fails"
    );

    std::fs::remove_file(&ballast).unwrap();
    // The same dirty session is saved on the next attempt, and others too.
    let s = engine.get("big".to_string(), false).await.unwrap().unwrap();
    assert!(s.is_dirty());
    s.release()
        .await
        .expect("saves work again once the disk has room");
    assert_eq!(bump(engine, "after").await, 1);
    engine.stop().await.unwrap();
}

#[tokio::test]
async fn an_update_on_a_full_disk_leaves_the_old_state() {
    let full = FullDisk::new().await;
    let (engine, mnt) = (&full.engine, &full.mnt);
    bump(engine, "a").await;

    let ballast = mnt.join("ballast");
    fill(&ballast);
    let mut s = engine.get("a".to_string(), false).await.unwrap().unwrap();
    let r = s
        .update(|s| {
            s.persistent_mut().note = "x".repeat(2 * 1024 * 1024);
            Ok::<_, Error>(())
        })
        .await;
    assert!(
        matches!(r, Err(Error::Storage(_))),
        "a save on a full disk fails"
    );
    assert_eq!(s.state().note, "", "the old state stays");
    assert!(!s.is_dirty());
    s.release().await.unwrap();

    std::fs::remove_file(&ballast).unwrap();
    assert_eq!(
        bump(engine, "a").await,
        2,
        "saves work again; the old state went on"
    );
    engine.stop().await.unwrap();
}
