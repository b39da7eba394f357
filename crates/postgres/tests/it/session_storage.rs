//! The session engine over the cluster store: its storage trait against a
//! real PostgreSQL, and a session saved by one node's engine loaded by
//! another's.

use crate::common::{blocking, store};
use estafeta_postgres::SessionStorage;
use estafeta_postgres::testing::Postgres;
use estafeta_session::clock::Timestamp;
use estafeta_session::storage::Write;
use estafeta_session::{Engine, Storage};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_storage_trait_over_postgres() {
    let pg = Postgres::start().unwrap();
    let storage = Arc::new(SessionStorage::open(store(&pg).await).await.unwrap());
    let s = storage.clone();
    blocking(move || {
        s.write(&[
            Write::Put {
                key: b"a".to_vec(),
                record: b"ra".to_vec(),
                expires_at: Some(Timestamp(5_000)),
            },
            Write::Put {
                key: b"b".to_vec(),
                record: b"rb".to_vec(),
                expires_at: None,
            },
            Write::Put {
                key: b"c".to_vec(),
                record: b"rc".to_vec(),
                expires_at: Some(Timestamp(7_000)),
            },
        ])
        .unwrap();
        s.write(&[
            Write::Delete { key: b"c".to_vec() },
            Write::Put {
                key: b"b".to_vec(),
                record: b"rb2".to_vec(),
                expires_at: None,
            },
        ])
        .unwrap();
        assert_eq!(s.load(b"a").unwrap().as_deref(), Some(&b"ra"[..]));
        assert_eq!(s.load(b"b").unwrap().as_deref(), Some(&b"rb2"[..]));
        assert_eq!(s.load(b"c").unwrap(), None);
        assert_eq!(
            s.deadlines().unwrap(),
            vec![(b"a".to_vec(), Timestamp(5_000))]
        );

        s.quarantine(b"a", "undecodable").unwrap();
        assert_eq!(s.load(b"a").unwrap(), None);
        assert_eq!(s.quarantined().unwrap(), vec![b"a".to_vec()]);
        assert!(s.deadlines().unwrap().is_empty());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_saved_by_one_node_loads_on_another() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;

    let first = SessionStorage::open(store.clone()).await.unwrap();
    let first_generation = first.generation();
    let engine: Engine<String, u64> = Engine::builder(Arc::new(first)).open().await.unwrap();
    let mut counter = engine
        .get("alice".to_string(), true)
        .await
        .unwrap()
        .unwrap();
    *counter.persistent_mut() += 41;
    counter.release().await.unwrap();
    engine.stop().await.unwrap();

    let second = SessionStorage::open(store).await.unwrap();
    assert!(second.generation() > first_generation);
    let engine: Engine<String, u64> = Engine::builder(Arc::new(second)).open().await.unwrap();
    let counter = engine
        .get("alice".to_string(), false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*counter.state(), 41);
    counter.release().await.unwrap();
    engine.stop().await.unwrap();
}

/// A save whose commit went through is done, even when another node takes
/// the key before the step can lock it again: answering it as failed would
/// make the caller undo (and its client retry) a change that was made. The
/// step then holds the key no more. Node B waits for the key while A
/// saves; PostgreSQL wakes both A's new lock and B's wait when A commits,
/// and either may get the row, so the case is tried until B wins it (the
/// other case is checked on the way: A holds the key, B sees A's second
/// save).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_save_is_ok_when_another_node_takes_the_key_right_after() {
    let pg = Postgres::start().unwrap();
    let a = Arc::new(SessionStorage::open(store(&pg).await).await.unwrap());
    for attempt in 0..20 {
        if another_node_took_the_key(&pg, &a, format!("k{attempt}").into_bytes()).await {
            return;
        }
    }
    panic!("the other node never took the key between a save and its lock");
}

/// One try of [`a_committed_save_is_ok_when_another_node_takes_the_key_right_after`]
/// on `key`: whether B took the key between A's save and A's lock.
async fn another_node_took_the_key(pg: &Postgres, a: &Arc<SessionStorage>, key: Vec<u8>) -> bool {
    let b = store(pg).await;
    let mut step = a.shared().unwrap().begin(&key).await.unwrap();
    let k = key.clone();
    let waiter = tokio::spawn(async move {
        let mut locked = b.lock(&k).await.unwrap();
        let seen = locked.record().map(<[u8]>::to_vec);
        locked.save(b"from-b", None).await.unwrap();
        locked.commit().await.unwrap();
        seen
    });
    let began = std::time::Instant::now();
    while pg
        .psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        .unwrap()
        .trim()
        != "1"
    {
        assert!(
            began.elapsed() < std::time::Duration::from_secs(20),
            "B never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let put = |record: &[u8]| Write::Put {
        key: key.clone(),
        record: record.to_vec(),
        expires_at: None,
    };
    step.save(&put(b"from-a")).await.unwrap();
    let held = step.held();
    let second = step.save(&put(b"from-a-again")).await;
    step.finish(None).await.unwrap();
    let seen = waiter.await.unwrap();
    let (a3, k) = (a.clone(), key.clone());
    let stored = blocking(move || a3.load(&k).unwrap()).await;
    assert_eq!(stored.as_deref(), Some(&b"from-b"[..]));
    if seen.as_deref() == Some(&b"from-a"[..]) {
        // B took the key between A's commit and its lock: nothing more is
        // written through A's step, and letting it go without a write is
        // fine.
        assert!(!held);
        assert!(second.is_err());
        true
    } else {
        assert!(held);
        second.unwrap();
        assert_eq!(seen.as_deref(), Some(&b"from-a-again"[..]));
        false
    }
}
